//! Bad requests: each gets the contract's status as problem+json and leaves nothing
//! behind, so the same key works afterwards with a corrected request.

use crate::helpers::{ADMIN_TOKEN, API_KEY, Backend, Charge, json, payment_body, problem, send};
use crate::on_both_databases;
use serde_json::Value;

on_both_databases!(
    every_bad_request_is_a_problem_that_stores_nothing,
    a_key_rejected_for_a_bad_body_can_be_used_again,
    a_request_whose_path_query_or_body_cannot_be_read_is_a_problem_never_plain_text,
    every_endpoint_that_reads_a_body_documents_its_413_with_its_own_limit,
    a_method_a_path_does_not_take_is_a_405_problem_that_says_which_it_takes,
    on_call_bodies_of_another_shape_are_422s_listing_every_field_and_do_nothing,
    on_call_bodies_not_json_or_not_said_json_are_400_and_415_as_the_merchant_api_answers,
    fields_a_resolution_refuses_are_all_listed_in_errores,
    a_query_parameter_that_cannot_be_stored_misspelt_or_repeated_is_a_422_naming_it,
);

/// The limit of the endpoints that read their body whole as raw bytes (axum's default,
/// which pagos states as its own: `http::extract::RAW_BODY_LIMIT`).
const RAW_BODY_LIMIT: usize = 2 * 1024 * 1024;

/// The four endpoints that read their body whole as raw bytes (`method`, path, token).
fn raw_body_endpoints() -> [(&'static str, String, &'static str); 4] {
    let id = uuid::Uuid::new_v4();
    [
        ("post", "/v1/webhook-endpoints".to_owned(), API_KEY),
        (
            "post",
            format!("/v1/webhook-endpoints/{id}/reactivar"),
            API_KEY,
        ),
        ("post", "/admin/reconciliaciones".to_owned(), ADMIN_TOKEN),
        ("post", format!("/admin/pagos/{id}/resolucion"), ADMIN_TOKEN),
    ]
}

struct Case {
    name: &'static str,
    key: Option<Vec<u8>>,
    api_key: Option<&'static str>,
    content_type: &'static str,
    body: Vec<u8>,
    status: u16,
    problem_type: &'static str,
    /// The field a 422 must list, where the case is about one.
    listed: Option<&'static str>,
}

fn case(name: &'static str, body: &str, status: u16, problem_type: &'static str) -> Case {
    Case {
        name,
        key: Some(b"k-bad".to_vec()),
        api_key: Some(API_KEY),
        content_type: "application/json",
        body: body.as_bytes().to_vec(),
        status,
        problem_type,
        listed: None,
    }
}

fn cases() -> Vec<Case> {
    let good = payment_body().to_string();
    vec![
        Case {
            key: None,
            ..case("missing key", &good, 400, "idempotency-key-missing")
        },
        Case {
            key: Some(vec![b'k'; 256]),
            ..case("key of 256 chars", &good, 400, "idempotency-key-malformed")
        },
        Case {
            key: Some("clavé".as_bytes().to_vec()),
            ..case("non-ASCII key", &good, 400, "idempotency-key-malformed")
        },
        // The quoted form with a parameter: taken as a key of its own, it was another key
        // than the same key resent without it ("k1"), another payment.
        Case {
            key: Some(br#""k1";a=1"#.to_vec()),
            ..case(
                "quoted key with a parameter",
                &good,
                400,
                "idempotency-key-malformed",
            )
        },
        case("not JSON", "{\"creditoId\": ", 400, "malformed-json"),
        case("JSON array", "[1,2,3]", 422, "validation-failed"),
        case(
            "missing field",
            r#"{"creditoId":"42","moneda":"COP"}"#,
            422,
            "validation-failed",
        ),
        case(
            "monto 0",
            r#"{"creditoId":"42","monto":0,"moneda":"COP"}"#,
            422,
            "validation-failed",
        ),
        case(
            "monto negative",
            r#"{"creditoId":"42","monto":-100,"moneda":"COP"}"#,
            422,
            "validation-failed",
        ),
        case(
            "monto not integer",
            r#"{"creditoId":"42","monto":10.5,"moneda":"COP"}"#,
            422,
            "validation-failed",
        ),
        case(
            "monto string",
            r#"{"creditoId":"42","monto":"250000","moneda":"COP"}"#,
            422,
            "validation-failed",
        ),
        // PostgreSQL cannot store a NUL in text: refused as a field, never a 503 to retry.
        Case {
            listed: Some("descripcion"),
            ..case(
                "descripcion holding NUL",
                r#"{"creditoId":"42","monto":1,"moneda":"COP","descripcion":"cuota\u00001"}"#,
                422,
                "validation-failed",
            )
        },
        // A credit id shown as another's (`42` and a zero-width space) in the console.
        Case {
            listed: Some("creditoId"),
            ..case(
                "creditoId holding a zero-width space",
                r#"{"creditoId":"42\u200b","monto":1,"moneda":"COP"}"#,
                422,
                "validation-failed",
            )
        },
        // One body, two amounts: refused rather than charge the last one.
        Case {
            listed: Some("monto"),
            ..case(
                "monto written twice",
                r#"{"creditoId":"42","monto":1,"moneda":"COP","monto":250000}"#,
                422,
                "validation-failed",
            )
        },
        Case {
            listed: Some("medioPago.id"),
            ..case(
                "medioPago.id written twice",
                r#"{"creditoId":"42","monto":1,"moneda":"COP","medioPago":{"id":"pm_card_visa","id":"pm_other"}}"#,
                422,
                "validation-failed",
            )
        },
        // serde_json's own reader takes this one member for the JSON text it holds.
        Case {
            listed: Some("$serde_json::private::RawValue"),
            ..case(
                "serde_json's private raw-value member",
                r#"{"$serde_json::private::RawValue":"{\"creditoId\":\"42\",\"monto\":250000,\"moneda\":\"COP\"}"}"#,
                422,
                "validation-failed",
            )
        },
        case(
            "unknown currency",
            r#"{"creditoId":"42","monto":1,"moneda":"XAU"}"#,
            422,
            "validation-failed",
        ),
        case(
            "body over 64 KiB",
            &format!(
                r#"{{"creditoId":"42","monto":1,"moneda":"COP","descripcion":"{}"}}"#,
                "x".repeat(70_000)
            ),
            413,
            "body-too-large",
        ),
        Case {
            content_type: "text/plain",
            ..case("wrong content type", &good, 415, "unsupported-media-type")
        },
        Case {
            api_key: None,
            ..case("missing API key", &good, 401, "unauthorized")
        },
        // One request, several faults: the content type first, then the size, then the
        // key, then the JSON.
        Case {
            key: None,
            ..case(
                "not JSON and no key",
                "{\"creditoId\": ",
                400,
                "idempotency-key-missing",
            )
        },
        Case {
            key: None,
            content_type: "text/plain",
            ..case(
                "wrong content type and no key",
                "not json",
                415,
                "unsupported-media-type",
            )
        },
        Case {
            key: None,
            ..case(
                "body over 64 KiB and no key",
                &"x".repeat(70_000),
                413,
                "body-too-large",
            )
        },
        Case {
            content_type: "text/plain",
            ..case(
                "wrong content type and over 64 KiB",
                &"x".repeat(70_000),
                415,
                "unsupported-media-type",
            )
        },
        Case {
            api_key: Some("sk_wrong"),
            ..case("wrong API key", &good, 401, "unauthorized")
        },
    ]
}

async fn every_bad_request_is_a_problem_that_stores_nothing(backend: Backend) {
    let app = crate::helpers::charging(backend, Charge::succeeded()).await;

    for case in cases() {
        let mut request = app
            .http
            .post(app.url("/v1/pagos"))
            .header("Content-Type", case.content_type)
            .body(case.body.clone());
        if let Some(key) = &case.key {
            request = request.header(
                "Idempotency-Key",
                reqwest::header::HeaderValue::from_bytes(key).expect("header bytes"),
            );
        }
        if let Some(api_key) = case.api_key {
            request = request.bearer_auth(api_key);
        }
        let answer = request.send().await.expect("sent");
        assert_eq!(answer.status().as_u16(), case.status, "{}", case.name);
        assert_eq!(
            answer.headers()["content-type"],
            "application/problem+json",
            "{}",
            case.name
        );
        let problem = json(answer).await;
        assert_eq!(
            problem["type"],
            format!("/problems/{}", case.problem_type),
            "{}",
            case.name
        );
        assert_eq!(problem["status"], case.status, "{}", case.name);
        assert!(
            problem["title"].as_str().is_some_and(|t| !t.is_empty()),
            "{}",
            case.name
        );
        if case.problem_type == "validation-failed" {
            assert!(
                problem["errores"].as_array().is_some_and(|e| !e.is_empty()),
                "{}: lists the fields",
                case.name
            );
        }
        if let Some(campo) = case.listed {
            assert!(
                crate::helpers::lists_field(&problem, campo),
                "{}: lists {campo}: {problem}",
                case.name
            );
        }
        assert_eq!(
            app.count_rows().await,
            (0, 0),
            "{}: nothing stored",
            case.name
        );
    }
    assert!(
        app.charges_seen().await.is_empty(),
        "no bad request reached the gateway"
    );
}

async fn a_key_rejected_for_a_bad_body_can_be_used_again(backend: Backend) {
    let app = crate::helpers::charging(backend, Charge::succeeded()).await;

    let bad = serde_json::json!({"creditoId": "42", "monto": -1, "moneda": "COP"});
    let rejected = app.pay("k-fix", &bad).await;
    assert_eq!(rejected.status(), 422);
    let problem = json(rejected).await;
    assert_eq!(problem["errores"][0]["campo"], "monto");

    let fixed = app.pay("k-fix", &payment_body()).await;
    assert_eq!(fixed.status(), 201);
    assert!(fixed.headers().get("idempotent-replayed").is_none());
}

async fn a_request_whose_path_query_or_body_cannot_be_read_is_a_problem_never_plain_text(
    backend: Backend,
) {
    let app = crate::helpers::charging(backend, Charge::succeeded()).await;

    // An admin list's parameter given twice: answered as the other admin list answers it.
    let orphans = problem(
        app.admin_get("/admin/cargos-huerfanos?limite=1&limite=2")
            .await,
        422,
        "orphan charges, limite twice",
    )
    .await;
    let payments = problem(
        app.admin_get("/admin/pagos?estado=ENVIADA&limite=1&limite=2")
            .await,
        422,
        "payments, limite twice",
    )
    .await;
    for body in [&orphans, &payments] {
        assert_eq!(body["type"], "/problems/validation-failed", "{body}");
        assert_eq!(body["status"], 422, "{body}");
    }
    assert_eq!(orphans["errores"][0]["campo"], "limite", "{orphans}");

    // An id that is not UTF-8 once percent-decoded: the route's own 404, as for any id it
    // does not know.
    let not_text = "%FF";
    let reads = [
        (API_KEY, format!("/v1/pagos/{not_text}")),
        (API_KEY, format!("/v1/pagos/{not_text}/reembolsos")),
        (API_KEY, format!("/v1/reembolsos/{not_text}")),
        (API_KEY, format!("/v1/eventos/{not_text}")),
        (ADMIN_TOKEN, format!("/admin/pagos/{not_text}")),
    ];
    for (token, path) in &reads {
        let body = problem(app.get_as(token, path).await, 404, path).await;
        assert_eq!(body["type"], "/problems/not-found", "{path}");
    }
    let refund = format!("/v1/pagos/{not_text}/reembolsos");
    let refused = app
        .post_keyed(API_KEY, &refund, "k-refund", &serde_json::json!({}))
        .await;
    problem(refused, 404, &refund).await;
    let endpoint = format!("/v1/webhook-endpoints/{not_text}");
    problem(app.delete_as(API_KEY, &endpoint).await, 404, &endpoint).await;
    let resolution = format!("/admin/pagos/{not_text}/resolucion");
    let body = serde_json::json!({"estado": "FALLIDA", "motivo": "x"});
    problem(app.admin_post(&resolution, &body).await, 404, &resolution).await;

    // A body over the limit of an endpoint that reads it whole: one byte over is refused,
    // as its OpenAPI operation says (below); the limit itself is taken.
    let big = vec![b' '; RAW_BODY_LIMIT + 1];
    for (_, path, token) in raw_body_endpoints() {
        let request = app
            .http
            .post(app.url(&path))
            .bearer_auth(token)
            .header("Content-Type", "application/json")
            .body(big.clone());
        let body = problem(send(request).await, 413, &path).await;
        assert_eq!(body["type"], "/problems/body-too-large", "{path}");
    }
    // On-call's refund resolution reads its body whole under the refunds' 64 KiB.
    let resolution = format!("/admin/reembolsos/{}/resolucion", uuid::Uuid::now_v7());
    let request = app
        .http
        .post(app.url(&resolution))
        .bearer_auth(ADMIN_TOKEN)
        .header("Content-Type", "application/json")
        .body(vec![b' '; 64 * 1024 + 1]);
    let body = problem(send(request).await, 413, &resolution).await;
    assert_eq!(body["type"], "/problems/body-too-large");
    let at_the_limit = app
        .http
        .post(app.url("/admin/reconciliaciones"))
        .bearer_auth(ADMIN_TOKEN)
        .header("Content-Type", "application/json")
        .body(vec![b' '; RAW_BODY_LIMIT]);
    assert_eq!(
        send(at_the_limit).await.status(),
        200,
        "white space up to the limit is `{{}}`"
    );
}

/// Each endpoint that can answer 413 lists it in its OpenAPI operation, with the limit it
/// enforces: 64 KiB for the JSON bodies of payments, refunds and provider webhooks, 2 MiB
/// for the bodies read whole (webhook endpoints, their reactivation, on-call's
/// reconciliation and resolution).
async fn every_endpoint_that_reads_a_body_documents_its_413_with_its_own_limit(backend: Backend) {
    let app = crate::helpers::charging(backend, Charge::succeeded()).await;
    let doc = app.openapi().await;
    let documented = |method: &str, path: &str| {
        let template = path
            .split('/')
            .map(|segment| {
                if uuid::Uuid::parse_str(segment).is_ok() {
                    "{id}"
                } else {
                    segment
                }
            })
            .collect::<Vec<_>>()
            .join("/");
        let answer = &doc["paths"][&template][method]["responses"]["413"];
        assert!(answer.is_object(), "{method} {template} lists its 413");
        assert!(
            answer["content"]["application/problem+json"].is_object(),
            "{method} {template}: {answer}"
        );
        answer["description"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    for (method, path, _) in raw_body_endpoints() {
        assert_eq!(documented(method, &path), "Body over 2 MiB", "{path}");
    }
    for path in ["/v1/pagos", "/v1/pagos/{id}/reembolsos"] {
        assert_eq!(documented("post", path), "Body over 64 KiB", "{path}");
    }
}

/// A path pagos serves, asked with a method it does not take there, is answered as every
/// other refusal: problem+json, with axum's `Allow` naming the methods it takes.
async fn a_method_a_path_does_not_take_is_a_405_problem_that_says_which_it_takes(backend: Backend) {
    let app = crate::helpers::charging(backend, Charge::succeeded()).await;
    for (method, path, token, allowed) in [
        (reqwest::Method::PUT, "/v1/pagos", API_KEY, "POST"),
        (
            reqwest::Method::DELETE,
            "/admin/reconciliaciones",
            ADMIN_TOKEN,
            "POST",
        ),
    ] {
        let what = format!("{method} {path}");
        let answer = send(
            app.http
                .request(method.clone(), app.url(path))
                .bearer_auth(token)
                .json(&payment_body()),
        )
        .await;
        let allow = answer
            .headers()
            .get("allow")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = problem(answer, 405, &what).await;
        assert_eq!(body["type"], "/problems/method-not-allowed", "{what}");
        assert_eq!(body["status"], 405, "{what}");
        assert!(
            allow.split(',').any(|m| m.trim() == allowed),
            "{what}: Allow {allow:?}"
        );
    }
}

// On-call's bodies: `POST /admin/reconciliaciones`, `POST /admin/pagos/{id}/resolucion`
// and `POST /admin/reembolsos/{id}/resolucion` are read as the merchant API reads its
// own: 415 for a body that does not say it is JSON, 400 for one that is not JSON, 422
// `validation-failed` listing every field at fault (`(cuerpo)` for JSON that is not an
// object). A refusal of the body does nothing and records nothing.

/// An app whose gateway charges and refunds, with a COMPLETADA payment of 250000 COP and a
/// COMPLETADO refund of 1000 of it: the paths of a pass, of the payment's resolution and of
/// the refund's, and the two ids.
async fn on_call_app(backend: Backend) -> (crate::helpers::TestApp, [String; 3], String, String) {
    let (app, _fake) = crate::refunds::app_with(backend, &[]).await;
    let payment = crate::refunds::paid(&app, "k-on-call").await;
    let answer = crate::refunds::refund(
        &app,
        &payment,
        "r-on-call",
        &serde_json::json!({"monto": 1000}),
    )
    .await;
    assert_eq!(answer.status(), 201);
    let refund = json(answer).await["id"]
        .as_str()
        .expect("refund id")
        .to_owned();
    let paths = [
        "/admin/reconciliaciones".to_owned(),
        format!("/admin/pagos/{payment}/resolucion"),
        format!("/admin/reembolsos/{refund}/resolucion"),
    ];
    (app, paths, payment, refund)
}

/// Nothing was done: no action recorded, the payment and the refund as they were.
async fn nothing_done(app: &crate::helpers::TestApp, payment: &str, refund: &str) {
    assert_eq!(
        crate::operator_actions::actions_as(app, ADMIN_TOKEN, "").await,
        Vec::<serde_json::Value>::new(),
        "nothing recorded"
    );
    assert_eq!(app.payment(payment).await.state, "COMPLETADA");
    let read = json(
        app.get_as(API_KEY, &format!("/v1/reembolsos/{refund}"))
            .await,
    )
    .await;
    assert_eq!(read["estado"], "COMPLETADO", "{read}");
}

/// The `campo`s of a 422 `validation-failed`, in order.
fn listed_fields(problem: &serde_json::Value) -> Vec<&str> {
    assert_eq!(problem["type"], "/problems/validation-failed", "{problem}");
    crate::helpers::listed(problem, "errores", "campo")
}

/// JSON that is not the object an on-call endpoint reads. Before, a JSON array was read as
/// the struct's fields in order (`[null,null]` ran a pass; `["FALLIDA","x",null,false,null]`
/// was a resolution), and a field of another type was a 422 without `errores`.
async fn on_call_bodies_of_another_shape_are_422s_listing_every_field_and_do_nothing(
    backend: Backend,
) {
    use serde_json::json;
    let (app, [reconcile, resolve, resolve_refund], payment, refund) = on_call_app(backend).await;
    let cases: [(&str, serde_json::Value, &[&str]); 15] = [
        (&reconcile, json!([null, null]), &["(cuerpo)"]),
        // A script's unset variable: before, a pass over every due payment and refund.
        (&reconcile, json!({"pagoId": null}), &["pagoId"]),
        // Before, the refund reconciled and the payment dropped without a word.
        (
            &reconcile,
            json!({"pagoId": payment, "reembolsoId": refund}),
            &["reembolsoId"],
        ),
        (&reconcile, json!([]), &["(cuerpo)"]),
        (&reconcile, json!(null), &["(cuerpo)"]),
        (&reconcile, json!({"pagoId": 1}), &["pagoId"]),
        (
            &reconcile,
            json!({"pagoId": "no-es-un-id", "otro": 1}),
            &["otro", "pagoId"],
        ),
        (
            &resolve,
            json!(["FALLIDA", "x", null, false, null]),
            &["(cuerpo)"],
        ),
        (&resolve, json!({}), &["estado", "motivo"]),
        (
            &resolve,
            json!({"estado": 1, "motivo": "x", "reembolsar": "si"}),
            &["estado", "reembolsar"],
        ),
        (
            &resolve,
            json!({"estado": "FALLIDA", "motivo": "x", "reembolso": true}),
            &["reembolso"],
        ),
        (
            &resolve_refund,
            json!(["FALLIDO", "x", null, null]),
            &["(cuerpo)"],
        ),
        (&resolve_refund, json!({"estado": "FALLIDO"}), &["motivo"]),
        (
            &resolve_refund,
            json!({"estado": "FALLIDO", "motivo": "x", "gatewayRef": 5}),
            &["gatewayRef"],
        ),
        (
            &resolve_refund,
            json!({"estado": "FALLIDO", "motivo": "x", "contraProveedor": ["y"], "reembolsar": true}),
            &["reembolsar", "contraProveedor"],
        ),
    ];
    for (path, body, fields) in cases {
        let what = format!("{path} {body}");
        let problem = problem(app.admin_post(path, &body).await, 422, &what).await;
        assert_eq!(listed_fields(&problem), fields, "{what}: {problem}");
    }
    // A member written twice, as `POST /v1/pagos` refuses it.
    let twice = app
        .post_raw(
            ADMIN_TOKEN,
            &resolve,
            &[("content-type", "application/json")],
            r#"{"estado":"COMPLETADA","estado":"FALLIDA","motivo":"x"}"#,
        )
        .await;
    let problem = problem(twice, 422, "estado written twice").await;
    assert_eq!(listed_fields(&problem), ["estado"], "{problem}");
    nothing_done(&app, &payment, &refund).await;

    // No body at all is still `{}`: a pass.
    let empty = app.post_raw(ADMIN_TOKEN, &reconcile, &[], "").await;
    assert_eq!(empty.status(), 200, "no body runs a pass");
}

/// A body that is not JSON is a 400 `malformed-json` (before: a 422), and one that does not
/// say it is JSON a 415 `unsupported-media-type` (before: read as JSON, and done), as
/// `POST /v1/pagos` answers them; nothing is done.
async fn on_call_bodies_not_json_or_not_said_json_are_400_and_415_as_the_merchant_api_answers(
    backend: Backend,
) {
    let (app, paths, payment, refund) = on_call_app(backend).await;
    for path in &paths {
        let not_json = app
            .post_raw(
                ADMIN_TOKEN,
                path,
                &[("content-type", "application/json")],
                r#"{"estado": "#,
            )
            .await;
        let body = problem(not_json, 400, path).await;
        assert_eq!(body["type"], "/problems/malformed-json", "{path}: {body}");
        for headers in [&[("content-type", "text/plain")][..], &[]] {
            let answer = app
                .post_raw(
                    ADMIN_TOKEN,
                    path,
                    headers,
                    r#"{"estado":"FALLIDO","motivo":"visto en el panel"}"#,
                )
                .await;
            let body = problem(answer, 415, path).await;
            assert_eq!(
                body["type"], "/problems/unsupported-media-type",
                "{path} {headers:?}: {body}"
            );
        }
    }
    let plain = app
        .post_raw(
            ADMIN_TOKEN,
            &paths[0],
            &[("content-type", "text/plain")],
            "{}",
        )
        .await;
    problem(plain, 415, "a pass asked in text/plain").await;
    nothing_done(&app, &payment, &refund).await;
}

/// What a resolution's own rules refuse (an `estado` it does not know, a blank `motivo`,
/// `gatewayRef` or `contraProveedor`) is listed in `errores`, every field at once, as the
/// merchant API lists them (before: the first alone, in `detail`, with no `errores`); the
/// detail, which the refusal's audit row keeps, still says each.
async fn fields_a_resolution_refuses_are_all_listed_in_errores(backend: Backend) {
    use serde_json::json;
    let (app, [_, resolve, resolve_refund], payment, refund) = on_call_app(backend).await;
    let cases: [(&str, serde_json::Value, &[&str]); 3] = [
        (
            &resolve,
            json!({"estado": "PAGADA", "motivo": "  ", "gatewayRef": " "}),
            &["estado", "motivo", "gatewayRef"],
        ),
        (
            &resolve,
            json!({"estado": "COMPLETADA", "motivo": "x", "reembolsar": true, "contraProveedor": ""}),
            &["reembolsar", "contraProveedor"],
        ),
        (
            &resolve_refund,
            json!({"estado": "DEVUELTO", "motivo": "", "contraProveedor": " "}),
            &["estado", "motivo", "contraProveedor"],
        ),
    ];
    for (path, body, fields) in cases {
        let what = format!("{path} {body}");
        let problem = problem(app.admin_post(path, &body).await, 422, &what).await;
        assert_eq!(listed_fields(&problem), fields, "{what}: {problem}");
        for campo in fields {
            assert!(
                crate::helpers::text_has(&problem, "detail", &format!("{campo} ")),
                "{what}: the detail says {campo}: {problem}"
            );
        }
    }
    assert_eq!(app.payment(&payment).await.state, "COMPLETADA");
    let read = json(
        app.get_as(API_KEY, &format!("/v1/reembolsos/{refund}"))
            .await,
    )
    .await;
    assert_eq!(read["estado"], "COMPLETADO", "{read}");
}

/// A list's query parameter that no stored value could hold (a NUL: PostgreSQL refused it,
/// and the merchant got a 503 to retry for ever, on-call a 5xx alert), misspelt (the
/// orphan list ignored `limit=5` and listed 100), or given twice (the payment and event
/// lists kept the last one): each a 422 naming it, as the other lists answer.
async fn a_query_parameter_that_cannot_be_stored_misspelt_or_repeated_is_a_422_naming_it(
    backend: Backend,
) {
    let app = crate::helpers::charging(backend, Charge::succeeded()).await;
    let paid = app.pay("k-listed", &payment_body()).await;
    assert_eq!(paid.status(), 201);

    for (token, path, campo) in [
        (API_KEY, "/v1/pagos?creditoId=%00", "creditoId"),
        (API_KEY, "/v1/pagos?creditoId=4%002", "creditoId"),
        (
            API_KEY,
            "/v1/pagos?estado=ENVIADA&estado=COMPLETADA",
            "estado",
        ),
        (API_KEY, "/v1/pagos?limite=1&limite=1", "limite"),
        (API_KEY, "/v1/eventos?limite=1&limite=2", "limite"),
        (ADMIN_TOKEN, "/admin/acciones?operador=eva%00", "operador"),
        (ADMIN_TOKEN, "/admin/cargos-huerfanos?limit=5", "limit"),
        (
            ADMIN_TOKEN,
            "/admin/cargos-huerfanos?limite=0&limite=5",
            "limite",
        ),
    ] {
        let body = problem(app.get_as(token, path).await, 422, path).await;
        assert_eq!(
            body["type"], "/problems/validation-failed",
            "{path}: {body}"
        );
        let named: Vec<&Value> = body["errores"]
            .as_array()
            .map(|e| e.iter().map(|e| &e["campo"]).collect())
            .unwrap_or_default();
        assert!(named.iter().any(|c| *c == campo), "{path}: {body}");
    }

    // An offset's `+` not escaped reads as a space: the answer says how to send it.
    let body = problem(
        app.get_as(API_KEY, "/v1/pagos?desde=2026-01-01T00:00:00+02:00")
            .await,
        422,
        "desde with a bare +",
    )
    .await;
    assert!(
        body["errores"][0]["detalle"]
            .as_str()
            .is_some_and(|d| d.contains("%2B")),
        "{body}"
    );
    let listed = json(
        app.get_as(API_KEY, "/v1/pagos?desde=2026-01-01T00:00:00%2B02:00")
            .await,
    )
    .await;
    assert_eq!(
        listed["pagos"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
}
