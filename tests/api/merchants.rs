//! Merchant scoping: a key or a payment id of another merchant is never shared or shown.

use crate::helpers::{API_KEY, Backend, Charge, OTHER_API_KEY, Spawn, charges, json, payment_body};
use crate::on_both_databases;

on_both_databases!(
    two_merchants_with_one_key_make_two_payments_with_two_gateway_keys,
    a_merchant_cannot_read_another_merchants_payment,
);

async fn two_merchants_with_one_key_make_two_payments_with_two_gateway_keys(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    charges()
        .respond_with(Charge::succeeded())
        .mount(app.gateway())
        .await;

    let a = app.pay_as(API_KEY, "shared-key", &payment_body()).await;
    let b = app
        .pay_as(OTHER_API_KEY, "shared-key", &payment_body())
        .await;
    assert_eq!(a.status(), 201);
    assert_eq!(b.status(), 201);
    assert!(b.headers().get("idempotent-replayed").is_none());
    let (a, b) = (json(a).await, json(b).await);
    assert_ne!(a["id"], b["id"]);

    let seen = app.charges_seen().await;
    assert_eq!(seen.len(), 2);
    assert_ne!(
        seen[0].headers["idempotency-key"],
        seen[1].headers["idempotency-key"]
    );
    assert_eq!(app.count_rows().await, (2, 2));
}

async fn a_merchant_cannot_read_another_merchants_payment(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    charges()
        .respond_with(Charge::succeeded())
        .mount(app.gateway())
        .await;
    let created = json(app.pay_as(API_KEY, "k-a", &payment_body()).await).await;
    let path = format!("/v1/pagos/{}", created["id"].as_str().expect("id"));

    let as_owner = app
        .http
        .get(app.url(&path))
        .bearer_auth(API_KEY)
        .send()
        .await
        .expect("sent");
    assert_eq!(as_owner.status(), 200);
    let as_other = app
        .http
        .get(app.url(&path))
        .bearer_auth(OTHER_API_KEY)
        .send()
        .await
        .expect("sent");
    assert_eq!(as_other.status(), 404);
    assert_eq!(
        as_other.headers()["content-type"],
        "application/problem+json"
    );
    let not_a_uuid = app
        .http
        .get(app.url("/v1/pagos/nope"))
        .bearer_auth(API_KEY)
        .send()
        .await
        .expect("sent");
    assert_eq!(not_a_uuid.status(), 404);
}
