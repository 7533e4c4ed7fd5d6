//! `GET /v1/pagos`: the merchant's payments, newest first, filtered and a page at a time.

use crate::helpers::{API_KEY, Backend, FakeGateway, OTHER_API_KEY, Spawn, TestDatabase, json};
use crate::on_both_databases;
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use serde_json::json;

on_both_databases!(
    payments_are_searched_newest_first_a_page_at_a_time_and_only_the_merchants,
    bad_search_parameters_are_refused_with_a_problem,
    each_payment_a_search_finds_is_shown_as_its_read_shows_it_with_its_refunded_amount,
);

async fn payments_are_searched_newest_first_a_page_at_a_time_and_only_the_merchants(
    backend: Backend,
) {
    let app = Spawn::new(backend).start().await;
    let fake = app.with_fake(FakeGateway::charging("succeeded")).await;
    let mut made = Vec::new();
    let before = chrono::Utc::now() - chrono::TimeDelta::seconds(1);
    for n in 0..5 {
        if n == 3 {
            fake.set_new_status("declined");
        }
        let credit = if n % 2 == 0 { "42" } else { "77" };
        let answer = app
            .pay(
                &format!("k-{n}"),
                &json!({"creditoId": credit, "monto": 1000 + n, "moneda": "COP"}),
            )
            .await;
        let body = json(answer).await;
        let id = body["id"]
            .as_str()
            .or(body["pago"]["id"].as_str())
            .expect("id")
            .to_owned();
        made.push(id);
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let newest_first: Vec<String> = made.iter().rev().cloned().collect();

    let mut seen = Vec::new();
    let mut path = "/v1/pagos?limite=2".to_owned();
    loop {
        let page = json(app.get_as(API_KEY, &path).await).await;
        for p in page["pagos"].as_array().expect("pagos") {
            seen.push(p["id"].as_str().expect("id").to_owned());
        }
        match page["siguiente"].as_str() {
            Some(cursor) => path = format!("/v1/pagos?limite=2&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(seen, newest_first);

    let credit = json(app.get_as(API_KEY, "/v1/pagos?creditoId=77").await).await;
    let ids: Vec<&str> = credit["pagos"]
        .as_array()
        .expect("pagos")
        .iter()
        .map(|p| p["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, [made[3].as_str(), made[1].as_str()]);
    let failed = json(app.get_as(API_KEY, "/v1/pagos?estado=FALLIDA").await).await;
    assert_eq!(failed["pagos"].as_array().expect("pagos").len(), 2);
    assert!(
        failed["pagos"]
            .as_array()
            .expect("pagos")
            .iter()
            .all(|p| p["estado"] == "FALLIDA")
    );
    let window = format!(
        "/v1/pagos?desde={}&hasta={}",
        urlencode(&before.to_rfc3339()),
        urlencode(&(chrono::Utc::now() + chrono::TimeDelta::seconds(1)).to_rfc3339())
    );
    let within = json(app.get_as(API_KEY, &window).await).await;
    assert_eq!(within["pagos"].as_array().expect("pagos").len(), 5);
    let future = format!(
        "/v1/pagos?desde={}",
        urlencode(&(chrono::Utc::now() + chrono::TimeDelta::hours(1)).to_rfc3339())
    );
    let none = json(app.get_as(API_KEY, &future).await).await;
    assert_eq!(none["pagos"], json!([]));
    assert_eq!(none["siguiente"], serde_json::Value::Null);

    let theirs = json(app.get_as(OTHER_API_KEY, "/v1/pagos").await).await;
    assert_eq!(theirs["pagos"], json!([]));
    let cursor_of_another = app
        .get_as(OTHER_API_KEY, &format!("/v1/pagos?cursor={}", made[0]))
        .await;
    assert_eq!(
        cursor_of_another.status(),
        422,
        "another merchant's id is no cursor"
    );
}

fn urlencode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

async fn each_payment_a_search_finds_is_shown_as_its_read_shows_it_with_its_refunded_amount(
    backend: Backend,
) {
    use crate::refunds::{app_with, paid, refund};
    let (app, fake) = app_with(backend, &[]).await;
    let refunded = paid(&app, "pay-1").await;
    let untouched = paid(&app, "pay-2").await;
    for (key, monto) in [("ref-1", 30000), ("ref-2", 20000)] {
        let answer = refund(&app, &refunded, key, &json!({"monto": monto})).await;
        assert_eq!(answer.status(), 201, "{key}");
    }
    // A refund the gateway refused gives nothing back, and is not counted.
    fake.refunding("failed");
    let refused = refund(&app, &refunded, "ref-3", &json!({"monto": 10000})).await;
    assert_eq!(refused.status(), 422);

    let page = json(app.get_as(API_KEY, "/v1/pagos").await).await;
    let found = page["pagos"].as_array().expect("pagos");
    assert_eq!(found.len(), 2);
    for p in found {
        let id = p["id"].as_str().expect("id");
        let read = json(app.get_as(API_KEY, &format!("/v1/pagos/{id}")).await).await;
        assert_eq!(*p, read, "the search shows {id} as its read does");
        let expected = if id == refunded { 50000 } else { 0 };
        assert_eq!(p["montoReembolsado"], expected, "{id}");
    }
    assert!(found.iter().any(|p| p["id"] == untouched.as_str()));

    // And the document says so: the search's payments are `Pago`, which has it.
    let doc = app.openapi().await;
    let ok = &doc["paths"]["/v1/pagos"]["get"]["responses"]["200"]["content"]["application/json"]["schema"];
    let list = ok["$ref"].as_str().expect("a named list");
    let list = &doc["components"]["schemas"][list.rsplit('/').next().expect("name")];
    assert_eq!(
        list["properties"]["pagos"]["items"]["$ref"], "#/components/schemas/Pago",
        "{list}"
    );
    let monto = &doc["components"]["schemas"]["Pago"]["properties"]["montoReembolsado"];
    assert!(
        monto["description"]
            .as_str()
            .is_some_and(|d| d.contains("GET /v1/pagos`")),
        "{monto}"
    );
}

async fn bad_search_parameters_are_refused_with_a_problem(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    for bad in [
        "/v1/pagos?estado=PAGADA",
        "/v1/pagos?limite=0",
        "/v1/pagos?limite=501",
        "/v1/pagos?desde=ayer",
        "/v1/pagos?hasta=2026-13-01",
        "/v1/pagos?cursor=abc",
        "/v1/pagos?creditoId=",
        "/v1/pagos?orden=asc",
    ] {
        let problem = crate::helpers::problem(app.get_as(API_KEY, bad).await, 422, bad).await;
        assert!(problem["errores"][0]["campo"].is_string(), "{problem}");
    }
    let unauthenticated = app.get("/v1/pagos").await;
    assert_eq!(unauthenticated.status(), 401);
}

/// Registering a payment asks whether its key has a payment of this generation or a later
/// one (`payments_merchant_key_idx`, one probe). An index that serves `merchant_id = …`
/// alone is a candidate for that look-up too, and before the table's first `ANALYZE` the
/// planner may take it: every create then reads all the merchant's payments. So the only
/// index of `payments` led by `merchant_id` that any statement may use is the key's; the
/// search's own is partial, usable only by the search that states its condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_index_led_by_the_merchant_competes_with_the_key_look_up_of_a_create() {
    let Some(backend) = Backend::postgres() else {
        return;
    };
    let database = TestDatabase::create(&backend).await;
    let db = database.migrated().await;
    let rows = db
        .query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'payments' ORDER BY indexname",
        ))
        .await
        .expect("pg_indexes");
    let mut led_by_merchant = Vec::new();
    let mut search = None;
    for row in rows {
        let name: String = row.try_get("", "indexname").expect("indexname");
        let def: String = row.try_get("", "indexdef").expect("indexdef");
        if name == "payments_search_idx" {
            search = Some(def.clone());
        }
        if def.contains("(merchant_id") && !def.contains(" WHERE ") {
            led_by_merchant.push(name);
        }
    }
    assert_eq!(
        led_by_merchant,
        vec!["payments_merchant_key_idx".to_owned()]
    );
    let search = search.expect("the search index exists");
    assert!(
        search.contains("(merchant_id, created_at, id) WHERE (version >= 0)"),
        "{search}"
    );
}
