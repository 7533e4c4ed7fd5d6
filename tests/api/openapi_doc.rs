//! The OpenAPI document (`/openapi.json`) against the server's real requests and answers:
//! a body the server takes is one the document's schema takes (and one it refuses, the
//! schema refuses); every answer the server gives is declared for its operation, with
//! each header pagos sets on it, and its body is valid against the declared schema (JSON
//! Schema 2020-12, formats checked), a problem's every member named.

use crate::helpers::{
    ADMIN_TOKEN, API_KEY, Backend, FakeGateway, Spawn, TestApp, json, lists_field, payment_body,
    post_webhook, timestamped_signature,
};
use crate::on_both_databases;
use serde_json::{Value, json};
use std::time::Duration;

on_both_databases!(
    a_payment_body_the_server_takes_is_one_the_document_takes_and_one_it_refuses_is_not,
    on_calls_refund_requires_motivo_in_the_document_as_on_the_server,
    a_declined_or_pending_payment_sends_only_headers_the_document_declares,
    a_refused_or_pending_refund_sends_only_headers_the_document_declares,
    every_operation_that_takes_credentials_declares_the_401_and_the_429_it_answers,
    every_limited_operation_declares_the_503_and_retry_after_of_an_overloaded_door,
    every_limite_the_document_gives_is_the_range_the_server_takes,
    a_gateway_webhooks_acknowledgement_is_one_the_document_and_the_runbook_list,
    the_document_lists_the_currencies_event_types_and_resolution_states_the_server_takes,
);

const PROBLEM_JSON: &str = "application/problem+json";
const WEBHOOK_SECRET: &str = "whsec_openapi";

/// `schema` of the document `doc`, as a validator: its `$ref`s resolve within the
/// document's components; `format` (date-time, uuid) is checked.
fn validator(doc: &Value, schema: &Value) -> jsonschema::Validator {
    let mut root = schema.clone();
    root["components"] = doc["components"].clone();
    jsonschema::draft202012::options()
        .should_validate_formats(true)
        .build(&root)
        .expect("the document's schema is valid JSON Schema")
}

/// Why `validator` refuses `instance`, for a failed assertion.
fn why(validator: &jsonschema::Validator, instance: &Value) -> String {
    validator
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The schema `schema` points to (itself when it is not a `$ref`).
fn resolved<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(reference) => {
            let name = reference
                .strip_prefix("#/components/schemas/")
                .expect("a component's $ref");
            resolved(doc, &doc["components"]["schemas"][name])
        }
        None => schema,
    }
}

/// The request body schema of `method path`.
fn request_schema<'a>(doc: &'a Value, method: &str, path: &str) -> &'a Value {
    let schema =
        &doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"];
    assert!(schema.is_object(), "{method} {path} declares a JSON body");
    schema
}

/// Property `name` of component `component` (in the component itself or in one of the
/// schemas it is all of), resolved.
fn property<'a>(doc: &'a Value, component: &str, name: &str) -> &'a Value {
    let schema = &doc["components"]["schemas"][component];
    let mut parts = vec![schema];
    parts.extend(schema["allOf"].as_array().into_iter().flatten());
    parts
        .into_iter()
        .map(|part| &resolved(doc, part)["properties"][name])
        .find(|p| p.is_object())
        .unwrap_or_else(|| panic!("{component}.{name} is in the document"))
}

/// The values an enum schema (or the schema its `$ref`, or one of its `oneOf`, names)
/// lists.
fn enum_of(doc: &Value, schema: &Value) -> Vec<String> {
    let schema = resolved(doc, schema);
    let mut values: Vec<String> = schema["enum"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    for one in schema["oneOf"].as_array().into_iter().flatten() {
        values.extend(enum_of(doc, one));
    }
    values
}

/// `answer` (to `method path`, the path as the document writes it) checked against the
/// document: its status is declared for the operation; each header pagos sets on it
/// (`Location`, `Retry-After`, `Idempotent-Replayed`, `WWW-Authenticate`) is declared
/// for that status; its body is of a declared content type and valid against the
/// declared schema; a problem's every member is a property the `Problem` schema names.
/// The status and the body (null when empty).
async fn documented(
    doc: &Value,
    method: &str,
    path: &str,
    answer: reqwest::Response,
) -> (u16, Value) {
    let status = answer.status().as_u16();
    let what = format!("{} {path} answered {status}", method.to_uppercase());
    let declared = &doc["paths"][path][method]["responses"][status.to_string()];
    assert!(
        declared.is_object(),
        "{what}: the document does not declare it"
    );
    for header in [
        "location",
        "retry-after",
        "idempotent-replayed",
        "www-authenticate",
    ] {
        if answer.headers().contains_key(header) {
            let listed = declared["headers"]
                .as_object()
                .is_some_and(|h| h.keys().any(|k| k.eq_ignore_ascii_case(header)));
            assert!(listed, "{what} with {header}, which it does not declare");
        }
    }
    let content_type = answer
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or_default().trim().to_owned());
    let bytes = answer.bytes().await.expect("body");
    if bytes.is_empty() {
        return (status, Value::Null);
    }
    let content_type = content_type.expect("a body says its content type");
    let schema = &declared["content"][&content_type]["schema"];
    assert!(
        schema.is_object(),
        "{what}: a {content_type} body, which it does not declare"
    );
    let body: Value = serde_json::from_slice(&bytes).expect("a JSON body");
    let takes = validator(doc, schema);
    assert!(
        takes.is_valid(&body),
        "{what}: the body is not what the document says: {}; {body}",
        why(&takes, &body)
    );
    if content_type == PROBLEM_JSON {
        let named = &doc["components"]["schemas"]["Problem"]["properties"];
        for member in body.as_object().expect("a problem is an object").keys() {
            assert!(
                named[member].is_object(),
                "{what}: the problem's member `{member}` is not named by the Problem schema"
            );
        }
    }
    (status, body)
}

/// A signed reference-protocol webhook carrying `body`.
async fn webhook(app: &TestApp, body: &Value) -> reqwest::Response {
    let bytes = serde_json::to_vec(body).expect("JSON");
    let signature = timestamped_signature(WEBHOOK_SECRET, chrono::Utc::now().timestamp(), &bytes);
    post_webhook(
        app,
        "/v1/webhooks/http",
        &[("Gateway-Signature", &signature)],
        &bytes,
    )
    .await
}

async fn a_payment_body_the_server_takes_is_one_the_document_takes_and_one_it_refuses_is_not(
    backend: Backend,
) {
    let app = Spawn::new(backend).sandbox().start().await;
    let doc = app.openapi().await;
    let takes = validator(&doc, request_schema(&doc, "post", "/v1/pagos"));
    let with = |member: &str, value: Value| {
        let mut body = payment_body();
        body[member] = value;
        body
    };
    // The contract's own request, and `medioPago` in each form the server reads.
    let taken = [
        payment_body(),
        with("medioPago", json!("pm_123")),
        with("medioPago", json!({"id": "pm_123", "cliente": "cus_1"})),
        with("medioPago", Value::Null),
        with("descripcion", json!("cuota 3 de 12")),
    ];
    for (n, body) in taken.iter().enumerate() {
        assert!(
            takes.is_valid(body),
            "the document refuses {body}: {}",
            why(&takes, body)
        );
        let answer = app.pay(&format!("taken-{n}"), body).await;
        let (status, _) = documented(&doc, "post", "/v1/pagos", answer).await;
        assert_eq!(status, 201, "the server takes {body}");
    }
    let refused = [
        with("moneda", json!("XXX")),
        with("creditoId", json!("   ")),
        with("creditoId", json!("9".repeat(65))),
        with("monto", json!(0)),
        with("medioPago", json!(5)),
        with("medioPago", json!({"cliente": "cus_1"})),
        with("extra", json!(1)),
    ];
    for (n, body) in refused.iter().enumerate() {
        assert!(!takes.is_valid(body), "the document takes {body}");
        let answer = app.pay(&format!("refused-{n}"), body).await;
        let (status, problem) = documented(&doc, "post", "/v1/pagos", answer).await;
        assert_eq!(status, 422, "the server refuses {body}");
        assert!(problem["errores"].is_array(), "{problem}");
    }
    // The probes' bodies are declared too.
    for probe in ["/healthz", "/readyz"] {
        let (status, body) = documented(&doc, "get", probe, app.get(probe).await).await;
        assert_eq!((status, body.is_object()), (200, true), "{probe}");
    }
}

async fn on_calls_refund_requires_motivo_in_the_document_as_on_the_server(backend: Backend) {
    const PATH: &str = "/admin/pagos/{id}/reembolsos";
    let app = Spawn::new(backend).sandbox().start().await;
    let doc = app.openapi().await;
    let on_call = validator(&doc, request_schema(&doc, "post", PATH));
    let merchant = validator(
        &doc,
        request_schema(&doc, "post", "/v1/pagos/{id}/reembolsos"),
    );
    let paid = app.pay("pay-1", &payment_body()).await;
    assert_eq!(paid.status(), 201);
    let payment = json(paid).await["id"].as_str().expect("id").to_owned();
    let path = format!("/admin/pagos/{payment}/reembolsos");

    for (n, body) in [json!({}), json!({"monto": 1000}), json!({"motivo": "   "})]
        .iter()
        .enumerate()
    {
        assert!(!on_call.is_valid(body), "the document takes {body}");
        let answer = app
            .post_keyed(ADMIN_TOKEN, &path, &format!("no-motivo-{n}"), body)
            .await;
        let (status, problem) = documented(&doc, "post", PATH, answer).await;
        assert_eq!(status, 422, "{body}");
        assert!(lists_field(&problem, "motivo"), "{problem}");
    }
    assert!(
        merchant.is_valid(&json!({})),
        "a merchant's refund needs no motivo"
    );
    // No Idempotency-Key: 400, before anything is done.
    let unkeyed = app
        .post_as(ADMIN_TOKEN, &path, &json!({"motivo": "x"}))
        .await;
    let (status, problem) = documented(&doc, "post", PATH, unkeyed).await;
    assert_eq!(status, 400);
    assert_eq!(problem["type"], "/problems/idempotency-key-missing");

    let body = json!({"monto": 1000, "motivo": "cobro duplicado, ticket 4821"});
    assert!(on_call.is_valid(&body), "{}", why(&on_call, &body));
    for attempt in ["first", "replay"] {
        let answer = app.post_keyed(ADMIN_TOKEN, &path, "refund-1", &body).await;
        let replayed = answer.headers().contains_key("idempotent-replayed");
        assert_eq!(replayed, attempt == "replay");
        assert!(answer.headers().contains_key("location"), "{attempt}");
        let (status, refund) = documented(&doc, "post", PATH, answer).await;
        assert_eq!((status, &refund["monto"]), (201, &json!(1000)), "{attempt}");
    }
}

async fn a_declined_or_pending_payment_sends_only_headers_the_document_declares(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    let doc = app.openapi().await;
    let fake = app.with_fake(FakeGateway::charging("declined")).await;
    for attempt in ["first", "replay"] {
        let answer = app.pay("declined", &payment_body()).await;
        assert!(answer.headers().contains_key("location"), "{attempt}");
        let (status, problem) = documented(&doc, "post", "/v1/pagos", answer).await;
        assert_eq!(status, 402, "{attempt}");
        assert_eq!(problem["pago"]["estado"], "FALLIDA");
        assert!(problem["declineCode"].is_string(), "{problem}");
    }
    fake.set_new_status("pending");
    let first = app.pay("pending", &payment_body()).await;
    let (status, _) = documented(&doc, "post", "/v1/pagos", first).await;
    assert_eq!(status, 202);
    // A retry of a payment nobody is working on: its state, replayed, and when to ask
    // again.
    let retry = app.pay("pending", &payment_body()).await;
    assert!(retry.headers().contains_key("idempotent-replayed"));
    assert!(retry.headers().contains_key("retry-after"));
    let (status, payment) = documented(&doc, "post", "/v1/pagos", retry).await;
    assert_eq!((status, &payment["estado"]), (202, &json!("ENVIADA")));
}

async fn a_refused_or_pending_refund_sends_only_headers_the_document_declares(backend: Backend) {
    const PATH: &str = "/v1/pagos/{id}/reembolsos";
    let (app, fake) = crate::refunds::app_with(backend, &[]).await;
    let doc = app.openapi().await;
    let payment = crate::refunds::paid(&app, "pay-1").await;
    fake.refunding("failed");
    for attempt in ["first", "replay"] {
        let answer =
            crate::refunds::refund(&app, &payment, "refused", &json!({"monto": 1000})).await;
        assert!(answer.headers().contains_key("location"), "{attempt}");
        let (status, problem) = documented(&doc, "post", PATH, answer).await;
        assert_eq!(status, 422, "{attempt}");
        assert_eq!(problem["type"], "/problems/refund-refused");
        assert_eq!(problem["reembolso"]["estado"], "FALLIDO");
        assert!(problem["failureCode"].is_string(), "{problem}");
    }
    fake.refunding("pending");
    let first = crate::refunds::refund(&app, &payment, "pending", &json!({"monto": 1000})).await;
    let (status, _) = documented(&doc, "post", PATH, first).await;
    assert_eq!(status, 202);
    let retry = crate::refunds::refund(&app, &payment, "pending", &json!({"monto": 1000})).await;
    assert!(retry.headers().contains_key("idempotent-replayed"));
    assert!(retry.headers().contains_key("retry-after"));
    let (status, _) = documented(&doc, "post", PATH, retry).await;
    assert_eq!(status, 202);
    // More than is left: `restante`, named by the Problem schema.
    let over = crate::refunds::refund(&app, &payment, "over", &json!({"monto": 10_000_000})).await;
    let (status, problem) = documented(&doc, "post", PATH, over).await;
    assert_eq!(status, 422);
    assert!(problem["restante"].is_number(), "{problem}");
}

async fn every_operation_that_takes_credentials_declares_the_401_and_the_429_it_answers(
    backend: Backend,
) {
    let app = crate::helpers::started(backend, &["--auth-failures-per-minute", "2"]).await;
    let doc = app.openapi().await;
    let mut authenticated = 0;
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("operations") {
            if operation["security"].as_array().is_none_or(Vec::is_empty) {
                continue;
            }
            authenticated += 1;
            let responses = &operation["responses"];
            assert!(responses["401"].is_object(), "{method} {path}: 401");
            assert!(
                responses["429"]["headers"]["Retry-After"].is_object(),
                "{method} {path}: 429 with Retry-After"
            );
        }
    }
    assert!(
        authenticated >= 20,
        "{authenticated} operations take credentials"
    );
    // Wrong keys from one address: 401s, then 429 for every request from it, whatever
    // its credentials, each as the document declares it.
    let payment = format!("/v1/pagos/{}", uuid::Uuid::new_v4());
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let answer = app.get_as("sk_wrong", &payment).await;
        statuses.push(documented(&doc, "get", "/v1/pagos/{id}", answer).await.0);
    }
    assert_eq!(statuses.first(), Some(&401), "{statuses:?}");
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    let admin = app.admin_get("/admin/pagos?estado=ENVIADA").await;
    assert!(admin.headers().contains_key("retry-after"));
    let (status, problem) = documented(&doc, "get", "/admin/pagos", admin).await;
    assert_eq!(status, 429);
    assert_eq!(problem["type"], "/problems/too-many-failed-authentications");
}

async fn every_limited_operation_declares_the_503_and_retry_after_of_an_overloaded_door(
    backend: Backend,
) {
    let app = crate::helpers::started(
        backend,
        &[
            "--max-in-flight",
            "1",
            "--gateway-timeout",
            "10s",
            "--gateway-retries",
            "0",
        ],
    )
    .await;
    let doc = app.openapi().await;
    // Every route but the light ones (answered from memory, never shed) is limited.
    for (path, item) in doc["paths"].as_object().expect("paths") {
        if ["/healthz", "/metrics"].contains(&path.as_str()) {
            continue;
        }
        for (method, operation) in item.as_object().expect("operations") {
            let unavailable = &operation["responses"]["503"];
            assert!(
                unavailable["headers"]["Retry-After"].is_object(),
                "{method} {path}: 503 with Retry-After"
            );
            assert!(
                unavailable["description"]
                    .as_str()
                    .is_some_and(|d| d.contains("overloaded")),
                "{method} {path}: 503 says `overloaded`"
            );
        }
    }
    let gateway_delay = Duration::from_secs(3);
    let fake = app
        .with_fake(FakeGateway::charging("succeeded").with_delay(gateway_delay))
        .await;
    let body = payment_body();
    let in_flight = app.pay("slow", &body);
    let shed = async {
        for _ in 0..500 {
            if fake.total_charges() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(fake.total_charges(), 1, "the first payment at the gateway");
        (
            app.get_as(API_KEY, "/v1/pagos").await,
            app.admin_get("/admin/pagos?estado=ENVIADA").await,
        )
    };
    let (first, (search, listed)) = tokio::join!(in_flight, shed);
    assert_eq!(first.status(), 201);
    for (path, answer) in [("/v1/pagos", search), ("/admin/pagos", listed)] {
        assert!(answer.headers().contains_key("retry-after"), "{path}");
        let (status, problem) = documented(&doc, "get", path, answer).await;
        assert_eq!(status, 503, "{path}");
        assert_eq!(problem["type"], "/problems/overloaded");
    }
}

async fn every_limite_the_document_gives_is_the_range_the_server_takes(backend: Backend) {
    let app = Spawn::new(backend).sandbox().start().await;
    let doc = app.openapi().await;
    for (path, token, query) in [
        ("/v1/pagos", API_KEY, ""),
        ("/v1/eventos", API_KEY, ""),
        ("/admin/acciones", ADMIN_TOKEN, ""),
        ("/admin/pagos", ADMIN_TOKEN, "estado=ENVIADA&"),
        ("/admin/cargos-huerfanos", ADMIN_TOKEN, ""),
    ] {
        let parameter = doc["paths"][path]["get"]["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == "limite")
            .unwrap_or_else(|| panic!("{path} documents `limite`"));
        let schema = &parameter["schema"];
        let types = match &schema["type"] {
            Value::Array(types) => types.clone(),
            one => vec![one.clone()],
        };
        assert!(types.contains(&json!("integer")), "{path}: {schema}");
        let (min, max) = (
            schema["minimum"].as_u64().expect("a minimum"),
            schema["maximum"].as_u64().expect("a maximum"),
        );
        for (limite, taken) in [(min, true), (max, true), (min - 1, false), (max + 1, false)] {
            let answer = app
                .get_as(token, &format!("{path}?{query}limite={limite}"))
                .await;
            let (status, body) = documented(&doc, "get", path, answer).await;
            assert_eq!(status == 200, taken, "{path}?limite={limite}: {body}");
            if !taken {
                assert!(lists_field(&body, "limite"), "{path}: {body}");
            }
        }
    }
    // Times are RFC 3339 date-times, where the document says so.
    for (component, field) in [
        ("Pago", "creadoEn"),
        ("Pago", "actualizadoEn"),
        ("Reembolso", "creadoEn"),
        ("Reembolso", "actualizadoEn"),
        ("PagoAdmin", "proximoIntento"),
        ("Entrega", "proximoIntento"),
        ("Evento", "creadoEn"),
        ("WebhookEndpoint", "creadoEn"),
    ] {
        assert_eq!(
            property(&doc, component, field)["format"],
            "date-time",
            "{component}.{field}"
        );
    }
    for name in ["desde", "hasta"] {
        let parameter = doc["paths"]["/v1/pagos"]["get"]["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == name)
            .expect("documented");
        assert_eq!(parameter["schema"]["format"], "date-time", "{name}");
    }
    // The optional bodies are not required.
    for (path, method) in [
        ("/admin/reconciliaciones", "post"),
        ("/v1/webhook-endpoints/{id}/reactivar", "post"),
    ] {
        let body = &doc["paths"][path][method]["requestBody"];
        assert!(body.is_object(), "{path}");
        assert_ne!(body["required"], true, "{path}: its body is optional");
    }
    let taken = app
        .admin_post("/admin/reconciliaciones", &Value::Null)
        .await;
    let bare = app
        .http
        .post(app.url("/admin/reconciliaciones"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("sent");
    assert_eq!(taken.status(), 422, "null is not an object");
    assert_eq!(bare.status(), 200, "no body at all is taken");
}

async fn a_gateway_webhooks_acknowledgement_is_one_the_document_and_the_runbook_list(
    backend: Backend,
) {
    let app = crate::helpers::started(backend, &["--webhook-secret", WEBHOOK_SECRET]).await;
    let doc = app.openapi().await;
    let outcomes = enum_of(&doc, property(&doc, "Acuse", "resultado"));
    let event = |id: &str, kind: &str, data: Value| json!({"id": id, "type": kind, "sequence": 1, "data": data});
    let reference = uuid::Uuid::new_v4().to_string();
    let sent = [
        // A refund made in the gateway's dashboard: no refund of pagos has its reference.
        event(
            "evt_r",
            "refund.updated",
            json!({"id": "re_dashboard", "status": "succeeded", "charge": "ch_1",
                   "amount": 1000, "currency": "COP", "reference": reference}),
        ),
        event(
            "evt_c",
            "charge.updated",
            json!({"id": "ch_orphan", "status": "succeeded", "amount": 1000,
                   "currency": "COP", "reference": reference, "declineCode": null}),
        ),
        event("evt_o", "payout.paid", json!({})),
    ];
    let mut seen = Vec::new();
    for body in &sent {
        let (status, acuse) =
            documented(&doc, "post", "/v1/webhooks/http", webhook(&app, body).await).await;
        assert_eq!(status, 200, "{acuse}");
        seen.push(acuse["resultado"].as_str().expect("resultado").to_owned());
    }
    assert_eq!(seen, ["desconocido", "huerfano", "ignorado"]);
    for outcome in &seen {
        assert!(
            outcomes.contains(outcome),
            "Acuse lists `{outcome}`: {outcomes:?}"
        );
    }
    assert!(
        outcomes.iter().any(|o| o == "reembolsando"),
        "Acuse lists `reembolsando` (an orphan charge refunded): {outcomes:?}"
    );
    let runbook = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("runbooks/webhooks.md"),
    )
    .expect("runbooks/webhooks.md");
    let table: Vec<&str> = runbook
        .lines()
        .filter(|l| l.starts_with("| 200 "))
        .collect();
    for outcome in &outcomes {
        assert!(
            table.iter().any(|row| row.contains(&format!("`{outcome}`"))
                || row.contains(&format!("\"{outcome}\""))),
            "runbooks/webhooks.md's answer table says what `{outcome}` means"
        );
    }
    let described = doc["components"]["schemas"]["EventoPasarela"].to_string();
    assert!(described.contains("refund.updated"), "{described}");
}

async fn the_document_lists_the_currencies_event_types_and_resolution_states_the_server_takes(
    backend: Backend,
) {
    let app = Spawn::new(backend).sandbox().start().await;
    let doc = app.openapi().await;
    let currencies = enum_of(&doc, property(&doc, "PagoRequest", "moneda"));
    let supported: Vec<&str> = pagos::domain::CURRENCIES.iter().map(|(c, _)| *c).collect();
    assert_eq!(currencies, supported);
    let eventos = property(&doc, "NuevoEndpoint", "eventos");
    let items = resolved(&doc, &eventos["items"]);
    let types: Vec<&str> = pagos_types::EventType::ALL
        .iter()
        .map(|t| t.as_str())
        .collect();
    assert_eq!(enum_of(&doc, items), types);
    assert_eq!(eventos["minItems"], 1);

    // A payment that is not under review: a resolution's `estado` is checked first, so
    // the 422 names it only when it is not one the document lists.
    let paid = app.pay("pay-1", &payment_body()).await;
    let payment = json(paid).await["id"].as_str().expect("id").to_owned();
    let refunded = app
        .post_keyed(
            API_KEY,
            &format!("/v1/pagos/{payment}/reembolsos"),
            "refund-1",
            &json!({"monto": 1000}),
        )
        .await;
    let refund = json(refunded).await["id"].as_str().expect("id").to_owned();
    for (path, id, component) in [
        ("/admin/pagos/{id}/resolucion", &payment, "Resolucion"),
        (
            "/admin/reembolsos/{id}/resolucion",
            &refund,
            "ResolucionReembolso",
        ),
    ] {
        let states = enum_of(&doc, property(&doc, component, "estado"));
        assert_eq!(states.len(), 2, "{component}: {states:?}");
        let motivo = property(&doc, component, "motivo");
        assert_eq!(
            (&motivo["minLength"], &motivo["maxLength"]),
            (&json!(1), &json!(1000))
        );
        let url = path.replace("{id}", id);
        for estado in states.iter().map(String::as_str).chain(["PENDIENTE"]) {
            let answer = app
                .admin_post(&url, &json!({"estado": estado, "motivo": "revisado"}))
                .await;
            let (status, problem) = documented(&doc, "post", path, answer).await;
            let refused = status == 422 && lists_field(&problem, "estado");
            assert_eq!(refused, estado == "PENDIENTE", "{path} {estado}: {problem}");
        }
    }
    // A method a path does not take: 405 with `Allow`, the document's reusable answer.
    let wrong = app.delete_as(API_KEY, "/v1/pagos").await;
    assert_eq!(wrong.status(), 405);
    assert!(wrong.headers().contains_key("allow"));
    let declared = &doc["components"]["responses"]["MethodNotAllowed"];
    assert!(declared["headers"]["Allow"].is_object(), "{declared}");
    assert!(declared["content"][PROBLEM_JSON].is_object(), "{declared}");
}
