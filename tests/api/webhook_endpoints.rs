//! The merchant's webhook endpoints and events over HTTP: the secret shown once, lists
//! without secrets, rotation, merchant scoping, bad input as problem+json that stores
//! nothing, and the events list with its cursor.

use crate::helpers::{API_KEY, Backend, Charge, OTHER_API_KEY, Spawn, TestApp, json, payment_body};
use crate::on_both_databases;
use chrono::{DateTime, Utc};
use sea_orm::EntityTrait;
use serde_json::{Value, json};

on_both_databases!(
    a_registered_endpoint_shows_its_secret_once_and_is_listed_without_it,
    an_endpoint_is_invisible_to_another_merchant,
    rotating_gives_a_new_secret_and_keeps_the_old_one_for_24_hours,
    rotating_again_within_24_hours_shows_the_last_rotations_end_and_keeps_the_first_secrets,
    bad_endpoints_are_refused_with_a_problem_and_nothing_is_stored,
    events_are_listed_oldest_first_with_a_cursor_and_only_to_their_merchant,
    an_event_committed_after_a_later_numbered_one_is_not_passed_over_by_a_cursor,
    a_url_longer_than_2048_characters_once_normalised_is_refused,
    a_merchant_has_at_most_16_endpoints,
    an_endpoints_attempts_are_read_and_removed_by_index,
    an_endpoint_body_of_another_shape_is_a_422_listing_every_field_and_stores_nothing,
    a_reactivation_body_of_another_shape_is_a_422_and_changes_nothing,
    a_name_refused_for_its_addresses_tells_the_merchant_no_address,
);

#[tokio::test]
async fn the_openapi_document_lists_endpoints_events_and_the_payment_search() {
    let app = Spawn::new(Backend::Sqlite).start().await;
    let doc = app.openapi().await;
    let paths = &doc["paths"];
    for (path, method) in [
        ("/v1/webhook-endpoints", "post"),
        ("/v1/webhook-endpoints", "get"),
        ("/v1/webhook-endpoints/{id}", "delete"),
        ("/v1/webhook-endpoints/{id}/rotar-secreto", "post"),
        ("/v1/webhook-endpoints/{id}/reactivar", "post"),
        ("/v1/eventos", "get"),
        ("/v1/eventos/{id}", "get"),
        ("/v1/pagos", "get"),
        ("/v1/pagos", "post"),
    ] {
        assert!(paths[path][method].is_object(), "{method} {path}");
    }
}

impl TestApp {
    /// Registers `url` for every event type as the first merchant; the answer's body.
    pub async fn register_endpoint(&self, url: &str) -> Value {
        self.register_endpoint_as(API_KEY, &json!({ "url": url }))
            .await
    }

    /// Registers the endpoint `body` describes as the merchant of `key`; the answer's body.
    pub async fn register_endpoint_as(&self, key: &str, body: &Value) -> Value {
        let made = self.post_as(key, "/v1/webhook-endpoints", body).await;
        assert_eq!(made.status(), 201);
        json(made).await
    }

    /// The endpoints the merchant of `key` sees listed.
    pub async fn endpoints_of(&self, key: &str) -> Vec<Value> {
        let listed = json(self.get_as(key, "/v1/webhook-endpoints").await).await;
        listed["endpoints"].as_array().expect("list").clone()
    }

    /// Rotates endpoint `id`'s secret as the first merchant; the answer's body.
    pub async fn rotate_secret(&self, id: &str) -> Value {
        self.endpoint_action(id, "rotar-secreto").await
    }

    /// `POST /v1/webhook-endpoints/{id}/{action}` with no options, as the first merchant,
    /// answered 200; the answer's body.
    pub async fn endpoint_action(&self, id: &str, action: &str) -> Value {
        let answer = self
            .post_as(
                API_KEY,
                &format!("/v1/webhook-endpoints/{id}/{action}"),
                &json!({}),
            )
            .await;
        assert_eq!(answer.status(), 200, "{action}");
        json(answer).await
    }

    /// The status of deleting endpoint `id` as the merchant of `key`.
    pub async fn delete_endpoint(&self, key: &str, id: &str) -> u16 {
        self.delete_as(key, &format!("/v1/webhook-endpoints/{id}"))
            .await
            .status()
            .as_u16()
    }
}

async fn a_registered_endpoint_shows_its_secret_once_and_is_listed_without_it(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    let made = app
        .post_as(
            API_KEY,
            "/v1/webhook-endpoints",
            &json!({"url": "https://93.184.215.14/hooks", "eventos": ["pago.completado", "pago.fallido"]}),
        )
        .await;
    assert_eq!(made.status(), 201);
    let location = crate::helpers::location_of(&made);
    let body = json(made).await;
    let id = body["id"].as_str().expect("id");
    assert_eq!(location, format!("/v1/webhook-endpoints/{id}"));
    assert_eq!(body["url"], "https://93.184.215.14/hooks");
    assert_eq!(body["estado"], "ACTIVO");
    assert_eq!(body["eventos"], json!(["pago.completado", "pago.fallido"]));
    let secret = body["secreto"].as_str().expect("secret");
    assert!(secret.starts_with("whsec_"));
    pagos::delivery::Secret::parse(secret).expect("a Standard Webhooks secret");

    let all = app.endpoints_of(API_KEY).await;
    assert_eq!(all.len(), 1);
    assert_eq!(all[0]["id"], id);
    assert!(all[0].get("secreto").is_none(), "no secret in the list");
    assert!(!json!(all).to_string().contains(secret));

    let all_types = app
        .register_endpoint("https://93.184.215.14/everything")
        .await;
    assert_eq!(all_types["eventos"].as_array().expect("types").len(), 6);

    assert_eq!(app.delete_endpoint(API_KEY, id).await, 204);
    assert_eq!(app.delete_endpoint(API_KEY, id).await, 404, "deleted twice");
    assert_eq!(app.endpoints_of(API_KEY).await.len(), 1);
}

async fn an_endpoint_is_invisible_to_another_merchant(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    let made = app.register_endpoint("https://93.184.215.14/acme").await;
    let id = made["id"].as_str().expect("id");
    assert_eq!(app.endpoints_of(OTHER_API_KEY).await, Vec::<Value>::new());
    for path in [
        format!("/v1/webhook-endpoints/{id}/rotar-secreto"),
        format!("/v1/webhook-endpoints/{id}/reactivar"),
    ] {
        let answer = app.post_as(OTHER_API_KEY, &path, &json!({})).await;
        crate::helpers::problem(answer, 404, &path).await;
    }
    assert_eq!(app.delete_endpoint(OTHER_API_KEY, id).await, 404);
    assert_eq!(app.endpoints_of(API_KEY).await.len(), 1);
}

async fn rotating_gives_a_new_secret_and_keeps_the_old_one_for_24_hours(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    let made = app.register_endpoint("https://93.184.215.14/rot").await;
    let id = made["id"].as_str().expect("id");
    let rotated = app.rotate_secret(id).await;
    let new_secret = rotated["secreto"].as_str().expect("new secret");
    assert_ne!(new_secret, made["secreto"].as_str().expect("old"));
    let until: DateTime<Utc> = rotated["secretoAnteriorHasta"]
        .as_str()
        .expect("overlap")
        .parse()
        .expect("RFC 3339");
    let hours = (until - Utc::now()).num_minutes() as f64 / 60.0;
    assert!((23.9..=24.0).contains(&hours), "{hours} h");
    assert!(
        !json!(app.endpoints_of(API_KEY).await)
            .to_string()
            .contains(new_secret)
    );
}

async fn rotating_again_within_24_hours_shows_the_last_rotations_end_and_keeps_the_first_secrets(
    backend: Backend,
) {
    let app = Spawn::new(backend).start().await;
    let made = app.register_endpoint("https://93.184.215.14/rot2").await;
    let id = made["id"].as_str().expect("id");
    let answers = [app.rotate_secret(id).await, app.rotate_secret(id).await];
    let until = |answer: &Value| -> DateTime<Utc> {
        answer["secretoAnteriorHasta"]
            .as_str()
            .expect("overlap")
            .parse()
            .expect("RFC 3339")
    };
    assert!(until(&answers[1]) >= until(&answers[0]));
    assert_ne!(answers[0]["secreto"], answers[1]["secreto"]);

    // The first secret was not overwritten: it keeps the end of the first rotation.
    let stored = pagos::entities::webhook_endpoint::Entity::find()
        .one(&app.db)
        .await
        .expect("read")
        .expect("the endpoint");
    assert_eq!(stored.older_secret.as_deref(), made["secreto"].as_str());
    assert_eq!(
        stored.older_secret_until.map(|t| t.timestamp_millis()),
        Some(until(&answers[0]).timestamp_millis())
    );
    assert_eq!(
        stored.previous_secret.as_deref(),
        answers[0]["secreto"].as_str()
    );
    assert_eq!(
        stored.previous_secret_until.map(|t| t.timestamp_millis()),
        Some(until(&answers[1]).timestamp_millis())
    );
    let listed = app.endpoints_of(API_KEY).await;
    assert_eq!(
        listed[0]["secretoAnteriorHasta"],
        answers[1]["secretoAnteriorHasta"]
    );
    let shown = json!(listed).to_string();
    for secret in [&made, &answers[0], &answers[1]].map(|a| a["secreto"].as_str().expect("secret"))
    {
        assert!(!shown.contains(secret), "no secret in the list");
    }
}

async fn bad_endpoints_are_refused_with_a_problem_and_nothing_is_stored(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    let cases = [
        (json!({"url": "http://93.184.215.14/hooks"}), 422, "url"),
        (json!({"url": "https://127.0.0.1/hooks"}), 422, "url"),
        (json!({"url": "https://10.1.2.3/hooks"}), 422, "url"),
        (json!({"url": "https://user:pw@93.184.215.14/"}), 422, "url"),
        (json!({"url": "no es una url"}), 422, "url"),
        (
            json!({"url": "https://93.184.215.14/", "eventos": ["pago.enviado"]}),
            422,
            "eventos",
        ),
        (
            json!({"url": "https://93.184.215.14/", "eventos": []}),
            422,
            "eventos",
        ),
        (json!({"eventos": ["pago.completado"]}), 422, "url"),
        (
            json!({"url": "https://93.184.215.14/", "otro": 1}),
            422,
            "otro",
        ),
    ];
    for (body, status, field) in cases {
        let answer = app.post_as(API_KEY, "/v1/webhook-endpoints", &body).await;
        let problem = crate::helpers::problem(answer, status, &body.to_string()).await;
        if status == 422 {
            assert!(
                problem["type"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("validation-failed"))
            );
            assert_eq!(problem["errores"][0]["campo"], field, "{problem}");
        }
    }
    let not_json = app
        .post_raw(
            API_KEY,
            "/v1/webhook-endpoints",
            &[("content-type", "text/plain")],
            "url=https://93.184.215.14",
        )
        .await;
    assert_eq!(not_json.status(), 415);
    // A JSON body sent without saying so is refused as `POST /v1/pagos` refuses it.
    let undeclared = app
        .post_raw(
            API_KEY,
            "/v1/webhook-endpoints",
            &[],
            r#"{"url": "https://93.184.215.14/hooks"}"#,
        )
        .await;
    let problem = crate::helpers::problem(undeclared, 415, "no Content-Type").await;
    assert_eq!(problem["type"], "/problems/unsupported-media-type");
    assert_eq!(
        app.endpoints_of(API_KEY).await,
        Vec::<Value>::new(),
        "nothing stored"
    );

    let made = app.register_endpoint("https://93.184.215.14/x").await;
    let id = made["id"].as_str().expect("id");
    let bad_time = app
        .post_as(
            API_KEY,
            &format!("/v1/webhook-endpoints/{id}/reactivar"),
            &json!({"reenviarDesde": "ayer"}),
        )
        .await;
    assert_eq!(bad_time.status(), 422);
    let unauthenticated = app.get("/v1/webhook-endpoints").await;
    assert_eq!(unauthenticated.status(), 401);
}

async fn events_are_listed_oldest_first_with_a_cursor_and_only_to_their_merchant(backend: Backend) {
    let app = crate::helpers::charging(backend, Charge::succeeded()).await;
    let mut paid = Vec::new();
    for n in 0..5 {
        let answer = app.pay(&format!("k-{n}"), &payment_body()).await;
        assert_eq!(answer.status(), 201);
        paid.push(json(answer).await["id"].as_str().expect("id").to_owned());
    }
    let mut seen = Vec::new();
    let mut path = "/v1/eventos?limite=2".to_owned();
    loop {
        let page = json(app.get_as(API_KEY, &path).await).await;
        for e in page["eventos"].as_array().expect("events") {
            assert_eq!(e["tipo"], "pago.completado");
            seen.push(e["datos"]["id"].as_str().expect("payment").to_owned());
        }
        match page["siguiente"].as_str() {
            Some(cursor) => path = format!("/v1/eventos?limite=2&desde={cursor}"),
            None => break,
        }
    }
    assert_eq!(seen, paid, "every event once, oldest first");

    let first = json(app.get_as(API_KEY, "/v1/eventos?limite=1").await).await;
    let id = first["eventos"][0]["id"].as_str().expect("id");
    let one = app.get_as(API_KEY, &format!("/v1/eventos/{id}")).await;
    assert_eq!(one.status(), 200);
    let one = json(one).await;
    assert_eq!(one["id"], id);
    assert_eq!(one["secuencia"], first["eventos"][0]["secuencia"]);
    assert_eq!(one["entregas"], json!([]));
    assert_eq!(one["intentos"], json!([]));

    let other = json(app.get_as(OTHER_API_KEY, "/v1/eventos").await).await;
    assert_eq!(other["eventos"], json!([]));
    let other_one = app
        .get_as(OTHER_API_KEY, &format!("/v1/eventos/{id}"))
        .await;
    assert_eq!(other_one.status(), 404);
    for bad in [
        "/v1/eventos?limite=0",
        "/v1/eventos?limite=abc",
        "/v1/eventos?desde=x",
        // Well formed, but no event of this merchant's.
        "/v1/eventos?desde=evt_0190d3a5f6c07e3a9b1c2d3e4f5a6b7c",
        "/v1/eventos?pendientes=si",
        "/v1/eventos?otro=1",
    ] {
        crate::helpers::problem(app.get_as(API_KEY, bad).await, 422, bad).await;
    }
}

/// The ids of the events of `page`.
fn event_ids(page: &Value) -> Vec<String> {
    crate::helpers::listed(page, "eventos", "id")
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// The ids of the first merchant's events listed after `cursor`, in order.
async fn events_after(app: &TestApp, cursor: &str) -> Vec<String> {
    let page = app
        .get_as(API_KEY, &format!("/v1/eventos?desde={cursor}"))
        .await;
    event_ids(&json(page).await)
}

/// The ids `path` lists once `want` holds of them, read again for up to 5 s. The list
/// holds back, for one read, the events after any transaction its snapshot saw running
/// that has ended before the read could tell which database it was in (another test's,
/// on a busy server): a read may list less than is there, never more.
async fn listed_until(
    app: &TestApp,
    path: &str,
    what: &str,
    want: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..100 {
        ids = event_ids(&json(app.get_as(API_KEY, path).await).await);
        if want(&ids) {
            return ids;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{path} never listed {what}: {ids:?}");
}

/// An event made for the first merchant now (its id made now) and written when the caller
/// records it.
async fn made_now(app: &TestApp) -> pagos::entities::event::Model {
    pagos::outbox::event(
        crate::helpers::acme(&app.db).await,
        pagos::entities::event::EventType::PagoCompletado,
        uuid::Uuid::now_v7(),
        1,
        "{}",
        pagos::db::now(),
    )
}

/// An event's id is made before its write waits for a connection or a lock, so a write
/// can commit after one whose id is later. A merchant who read up to the later one must
/// still get it: paged by id, the cursor passed over it for good.
async fn an_event_committed_after_a_later_numbered_one_is_not_passed_over_by_a_cursor(
    backend: Backend,
) {
    let app = crate::helpers::charging(backend, Charge::succeeded()).await;
    assert_eq!(app.pay("k-1", &payment_body()).await.status(), 201);
    let early = made_now(&app).await;
    assert_eq!(app.pay("k-2", &payment_body()).await.status(), 201);
    let page = json(app.get_as(API_KEY, "/v1/eventos?limite=2").await).await;
    let read = event_ids(&page);
    assert_eq!(read.len(), 2, "{page}");
    assert!(
        early.id < read[1],
        "the early event's id sorts before the cursor"
    );
    let cursor = page["siguiente"]
        .as_str()
        .expect("a full page has a cursor");
    assert_eq!(cursor, read[1]);

    pagos::outbox::record(&app.db, &early)
        .await
        .expect("written after the later one");
    let next = json(
        app.get_as(API_KEY, &format!("/v1/eventos?desde={cursor}"))
            .await,
    )
    .await;
    assert_eq!(event_ids(&next), vec![early.id.clone()], "{next}");
    let all = json(app.get_as(API_KEY, "/v1/eventos").await).await;
    assert_eq!(
        event_ids(&all),
        vec![read[0].clone(), read[1].clone(), early.id],
        "in the order they were committed"
    );
}

/// PostgreSQL: while a write that began before an event's is still running, the list
/// stops before that event, so a cursor handed out then cannot pass over what the older
/// write commits. (SQLite's writers take turns: a later write cannot commit first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_is_listed_only_once_every_write_begun_before_it_has_ended() {
    use sea_orm::TransactionTrait;
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let app = crate::helpers::charging(backend, Charge::succeeded()).await;
    assert_eq!(app.pay("k-1", &payment_body()).await.status(), 201);
    let first = listed_until(&app, "/v1/eventos", "k-1's event", |ids| ids.len() == 1).await;

    let held = app.db.begin().await.expect("begin");
    let early = made_now(&app).await;
    pagos::outbox::record(&held, &early)
        .await
        .expect("written, not committed");
    assert_eq!(app.pay("k-2", &payment_body()).await.status(), 201);
    // k-2's event waits for the write begun before it.
    listed_until(&app, "/v1/eventos", "k-1's event alone", |ids| ids == first).await;
    let meanwhile = json(app.get_as(API_KEY, "/v1/eventos").await).await;
    assert!(meanwhile["siguiente"].is_null());
    // k-2's event, known from elsewhere (a webhook, its own URL), is no cursor yet: resuming
    // after it would pass over the older write's event.
    let k2 = pagos::entities::event::Entity::find()
        .all(&app.db)
        .await
        .expect("events")
        .into_iter()
        .map(|e| e.id)
        .find(|id| *id != first[0])
        .expect("k-2's event, committed");
    crate::helpers::problem(
        app.get_as(API_KEY, &format!("/v1/eventos?desde={k2}"))
            .await,
        422,
        "an event not listed yet as a cursor",
    )
    .await;

    held.commit().await.expect("commit");
    assert_eq!(
        events_after(&app, &k2).await,
        Vec::<String>::new(),
        "listed now: a cursor"
    );
    let after = listed_until(
        &app,
        &format!("/v1/eventos?desde={}", first[0]),
        "both events after k-1's",
        |ids| ids.len() == 2,
    )
    .await;
    assert_eq!(after[0], early.id, "the older write's event first");

    // A write running in another database of the same server holds nothing back.
    let admin_url = std::env::var("PAGOS_TEST_POSTGRES_URL").expect("PostgreSQL's URL");
    let elsewhere = sea_orm::Database::connect(admin_url)
        .await
        .expect("the server's own database");
    let running = elsewhere.begin().await.expect("begin");
    sea_orm::ConnectionTrait::execute_unprepared(&running, "SELECT pg_current_xact_id()")
        .await
        .expect("a transaction id, as a write takes");
    assert_eq!(app.pay("k-3", &payment_body()).await.status(), 201);
    listed_until(
        &app,
        &format!("/v1/eventos?desde={}", after[1]),
        "k-3's event, not held back by another database's write",
        |ids| ids.len() == 1,
    )
    .await;
    running.rollback().await.expect("rollback");
}

/// The limit of 2048 characters is the stored URL's, as it is normalised: a non-ASCII
/// character is percent-encoded into three times its bytes. Such a URL is a 422 naming the
/// field (PostgreSQL's `varchar(2048)` refused it: a 503), and nothing is stored.
/// A merchant registering a URL whose host name resolves to an internal address, or does
/// not resolve, is told the same thing, naming neither the address nor the resolver's
/// words. Before, the 422 said `localhost resolves to 127.0.0.1, not a public address
/// (loopback)` and passed on the resolver's error: any merchant could map the names and
/// addresses of the network pagos runs in. Nothing is stored.
async fn a_name_refused_for_its_addresses_tells_the_merchant_no_address(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    let mut told = Vec::new();
    for host in ["localhost", "no-such-host.invalid"] {
        let body = json!({ "url": format!("https://{host}/hooks") });
        let answer = app.post_as(API_KEY, "/v1/webhook-endpoints", &body).await;
        let problem = crate::helpers::problem(answer, 422, host).await;
        assert_eq!(problem["errores"][0]["campo"], "url", "{problem}");
        let detail = problem["errores"][0]["detalle"].as_str().expect("detalle");
        assert!(
            detail.starts_with(&format!("{host} does not resolve to a public address")),
            "{detail}"
        );
        for inside in ["127.0.0.1", "::1", "loopback", "lookup", "known"] {
            assert!(!detail.contains(inside), "{inside} told: {detail}");
        }
        told.push(detail.replace(host, "HOST"));
    }
    assert_eq!(told[0], told[1], "one text for both");
    assert!(app.endpoints_of(API_KEY).await.is_empty(), "nothing stored");
}

async fn a_url_longer_than_2048_characters_once_normalised_is_refused(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    let url = format!("https://93.184.215.14/{}", "\u{e9}".repeat(1000));
    assert!(url.len() <= 2048, "{} bytes as sent", url.len());
    let answer = app
        .post_as(API_KEY, "/v1/webhook-endpoints", &json!({ "url": url }))
        .await;
    let problem = crate::helpers::problem(answer, 422, "a URL too long once normalised").await;
    assert_eq!(problem["errores"][0]["campo"], "url", "{problem}");
    assert!(
        crate::helpers::text_has(&problem["errores"][0], "detalle", "2048"),
        "{problem}"
    );
    assert!(app.endpoints_of(API_KEY).await.is_empty());
}

/// A fan-out round makes one row per event and endpoint of its merchant: a merchant has at
/// most 16 endpoints (a 17th is a 422 naming the limit); removing one makes room, and
/// another merchant has its own 16.
async fn a_merchant_has_at_most_16_endpoints(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    let mut made = Vec::new();
    for n in 0..16 {
        made.push(
            app.register_endpoint(&format!("https://93.184.215.14/hooks/{n}"))
                .await,
        );
    }
    let answer = app
        .post_as(
            API_KEY,
            "/v1/webhook-endpoints",
            &json!({"url": "https://93.184.215.14/hooks/17"}),
        )
        .await;
    let problem = crate::helpers::problem(answer, 422, "a 17th endpoint").await;
    assert_eq!(problem["limite"], 16, "{problem}");
    assert!(
        crate::helpers::text_has(&problem, "detail", "16"),
        "{problem}"
    );
    assert_eq!(app.endpoints_of(API_KEY).await.len(), 16, "nothing stored");

    app.register_endpoint_as(
        OTHER_API_KEY,
        &json!({"url": "https://93.184.215.14/globex"}),
    )
    .await;
    let first = made[0]["id"].as_str().expect("id");
    assert_eq!(app.delete_endpoint(API_KEY, first).await, 204);
    app.register_endpoint("https://93.184.215.14/hooks/again")
        .await;
    assert_eq!(app.endpoints_of(API_KEY).await.len(), 16);
}

/// Attempts are never purged: the console's last attempts of an endpoint (newest first)
/// and removing an endpoint find its attempts by the index `(endpoint_id, attempted_at)`,
/// not by reading every attempt stored.
async fn an_endpoints_attempts_are_read_and_removed_by_index(backend: Backend) {
    use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};
    let (_database, db) = crate::helpers::TestDatabase::with_acme(&backend).await;
    let id = uuid::Uuid::now_v7();
    let statements = [
        format!(
            r#"SELECT * FROM "webhook_attempts" WHERE "endpoint_id" = '{id}' ORDER BY "attempted_at" DESC LIMIT 5"#
        ),
        format!(r#"DELETE FROM "webhook_attempts" WHERE "endpoint_id" = '{id}'"#),
    ];
    for sql in statements {
        let tx = db.begin().await.expect("begin");
        let (explain, column, dialect) = match backend {
            Backend::Sqlite => ("EXPLAIN QUERY PLAN", "detail", DbBackend::Sqlite),
            Backend::Postgres(_) => {
                // The table is empty: only a plan that may not scan it shows what an index
                // offers.
                tx.execute_unprepared("SET LOCAL enable_seqscan = off")
                    .await
                    .expect("set");
                ("EXPLAIN", "QUERY PLAN", DbBackend::Postgres)
            }
        };
        let plan: Vec<String> = tx
            .query_all_raw(Statement::from_string(dialect, format!("{explain} {sql}")))
            .await
            .expect("explain")
            .iter()
            .map(|row| row.try_get::<String>("", column).expect("plan line"))
            .collect();
        tx.rollback().await.expect("rollback");
        let plan = plan.join("\n");
        assert!(
            plan.contains("webhook_attempts_endpoint_idx"),
            "{sql}:\n{plan}"
        );
        assert!(
            !plan.contains("TEMP B-TREE") && !plan.contains("Sort"),
            "read in order: {plan}"
        );
    }
}

/// The `campo`s a 422 `validation-failed` lists, in order.
fn fields_listed(problem: &Value) -> Vec<&str> {
    assert_eq!(problem["type"], "/problems/validation-failed", "{problem}");
    crate::helpers::listed(problem, "errores", "campo")
}

/// A body that is JSON but not the object `POST /v1/webhook-endpoints` reads is answered
/// as `POST /v1/pagos` answers one: 422 `validation-failed` listing every field at fault
/// (the body itself, `(cuerpo)`, when it is not an object), never read as a struct's
/// fields in order (a JSON array) nor a 400 that names none. A body that is not JSON at
/// all is the 400. Nothing is stored.
async fn an_endpoint_body_of_another_shape_is_a_422_listing_every_field_and_stores_nothing(
    backend: Backend,
) {
    let app = Spawn::new(backend).start().await;
    let url = "https://93.184.215.14/hooks";
    let cases: [(Value, &[&str]); 9] = [
        // Read as `url` then `eventos` in order, before: registered for every type.
        (json!([url, null]), &["(cuerpo)"]),
        (json!([url, ["pago.completado"]]), &["(cuerpo)"]),
        (json!([]), &["(cuerpo)"]),
        (json!(url), &["(cuerpo)"]),
        (json!({"url": 123}), &["url"]),
        (json!({}), &["url"]),
        (
            json!({"url": url, "eventos": "pago.completado"}),
            &["eventos"],
        ),
        (json!({"url": url, "eventos": [1]}), &["eventos"]),
        // Every fault at once: the unknown member first, then the fields.
        (
            json!({"url": 1, "eventos": "pago.completado", "otro": true}),
            &["otro", "url", "eventos"],
        ),
    ];
    for (body, fields) in cases {
        let answer = app.post_as(API_KEY, "/v1/webhook-endpoints", &body).await;
        let problem = crate::helpers::problem(answer, 422, &body.to_string()).await;
        assert_eq!(fields_listed(&problem), fields, "{body}: {problem}");
    }
    let repeated = app
        .post_raw(
            API_KEY,
            "/v1/webhook-endpoints",
            &[("content-type", "application/json")],
            r#"{"url":"https://10.0.0.1/","url":"https://93.184.215.14/hooks"}"#,
        )
        .await;
    let problem = crate::helpers::problem(repeated, 422, "url written twice").await;
    assert_eq!(fields_listed(&problem), ["url"], "{problem}");
    for not_json in [r#"{"url": "#, r#"["https://93.184.215.14/hooks""#] {
        let answer = app
            .post_raw(
                API_KEY,
                "/v1/webhook-endpoints",
                &[("content-type", "application/json")],
                not_json,
            )
            .await;
        let problem = crate::helpers::problem(answer, 400, not_json).await;
        assert_eq!(problem["type"], "/problems/malformed-json", "{problem}");
    }
    assert_eq!(
        app.endpoints_of(API_KEY).await,
        Vec::<Value>::new(),
        "nothing stored"
    );
}

/// `POST /v1/webhook-endpoints/{id}/reactivar` reads its body as the registration does: a
/// JSON array (before: read as `reenviarDesde`, the endpoint reactivated and every event
/// since redelivered), a member of another type or unknown, is a 422 listing it, and the
/// endpoint stays as it was. No body at all is still `{}`.
async fn a_reactivation_body_of_another_shape_is_a_422_and_changes_nothing(backend: Backend) {
    use sea_orm::{ActiveModelTrait, ActiveValue::Set};
    let app = Spawn::new(backend).start().await;
    let made = app.register_endpoint("https://93.184.215.14/down").await;
    let id = made["id"].as_str().expect("id").to_owned();
    let endpoint = pagos::entities::webhook_endpoint::Entity::find_by_id(
        uuid::Uuid::parse_str(&id).expect("uuid"),
    )
    .one(&app.db)
    .await
    .expect("read")
    .expect("the endpoint");
    let mut down: pagos::entities::webhook_endpoint::ActiveModel = endpoint.into();
    down.state = Set(pagos::entities::webhook_endpoint::EndpointState::Desactivado);
    down.disabled_reason = Set(Some("answered 410".to_owned()));
    down.update(&app.db).await.expect("deactivated");
    let path = format!("/v1/webhook-endpoints/{id}/reactivar");

    let cases: [(Value, &[&str]); 5] = [
        (json!(["2026-01-01T00:00:00Z"]), &["(cuerpo)"]),
        (json!(null), &["(cuerpo)"]),
        (json!({"reenviarDesde": 1}), &["reenviarDesde"]),
        (json!({"reenviarDesde": "ayer"}), &["reenviarDesde"]),
        (json!({"reenviar": "2026-01-01T00:00:00Z"}), &["reenviar"]),
    ];
    for (body, fields) in cases {
        let answer = app.post_as(API_KEY, &path, &body).await;
        let problem = crate::helpers::problem(answer, 422, &body.to_string()).await;
        assert_eq!(fields_listed(&problem), fields, "{body}: {problem}");
        assert_eq!(
            app.endpoints_of(API_KEY).await[0]["estado"],
            "DESACTIVADO",
            "{body}: nothing changed"
        );
    }
    let not_json = app
        .post_raw(
            API_KEY,
            &path,
            &[("content-type", "application/json")],
            "[\"2026",
        )
        .await;
    let problem = crate::helpers::problem(not_json, 400, "not JSON").await;
    assert_eq!(problem["type"], "/problems/malformed-json", "{problem}");
    assert_eq!(app.endpoints_of(API_KEY).await[0]["estado"], "DESACTIVADO");

    let empty = app.post_raw(API_KEY, &path, &[], "").await;
    assert_eq!(empty.status(), 200, "no body is `{{}}`");
    assert_eq!(app.endpoints_of(API_KEY).await[0]["estado"], "ACTIVO");
}
