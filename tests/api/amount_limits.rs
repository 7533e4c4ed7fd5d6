//! Amounts no client or gateway can carry: above 2^53 − 1, above `PAGOS_MAX_MONTO`, above
//! the configured gateway's maximum for the currency. Each is refused with 422 listing
//! `monto` before anything is stored or sent, and the same key then works with a
//! corrected amount.

use crate::helpers::{Backend, Spawn, TestApp};
use crate::on_both_databases;
use serde_json::{Value, json};
use wiremock::{Request, Respond, ResponseTemplate};

on_both_databases!(
    an_amount_above_two_to_the_53_minus_one_is_refused_whatever_the_settings,
    an_amount_above_pagos_max_monto_is_refused_and_the_default_is_twelve_digits,
    stripe_refuses_more_than_eight_digits_and_more_than_ten_in_cop,
    mercadopago_has_only_the_general_limits_and_its_exact_decimals,
    a_retry_where_the_limit_is_now_lower_gets_its_payments_answer_not_a_refusal,
    a_retry_written_otherwise_gets_its_payments_answer_from_the_stored_key,
);

/// Asserts a 422 `validation-failed` listing `monto` alone, whose detail names `limit`,
/// and that nothing was stored.
async fn refused(app: &TestApp, key: &str, body: &Value, limit: &str) {
    let (status, problem) = app.pay_read(key, body).await;
    assert_eq!(status, 422, "{body}: {problem}");
    assert_eq!(problem["type"], "/problems/validation-failed", "{problem}");
    let errors = problem["errores"].as_array().expect("errores");
    assert_eq!(errors.len(), 1, "{problem}");
    assert_eq!(errors[0]["campo"], "monto", "{problem}");
    let detail = errors[0]["detalle"].as_str().expect("detalle");
    assert!(detail.contains(limit), "names {limit}: {detail}");
    assert_eq!(app.count_rows().await, (0, 0), "{body}: nothing stored");
}

fn sandbox_body(monto: Value) -> Value {
    json!({"creditoId": "42", "monto": monto, "moneda": "CLP"})
}

/// A payment charged under one limit, retried at a process whose `PAGOS_MAX_MONTO` is now
/// lower (a settings change, a rolling deploy): the retry is the request its key was
/// taken with and gets the payment's answer; "nothing was stored" would be false, and a
/// client told so would pay again under a new key. A new key with the same body is
/// still refused there, and the key with another body is a reused key.
async fn a_retry_where_the_limit_is_now_lower_gets_its_payments_answer_not_a_refusal(
    backend: Backend,
) {
    let app = Spawn::new(backend).sandbox().start().await;
    let body = sandbox_body(json!(5_000_001));
    let first = app.pay("k-limit", &body).await;
    assert_eq!(first.status(), 201);
    let first = first.text().await.expect("body");

    let lower = app.other_process(&["--max-monto", "5000000"]).await;
    let (status, replayed, again) = app.pay_at(&lower, "k-limit", &body).await;
    assert_eq!(
        (status, replayed.as_deref()),
        (201, Some("true")),
        "the charged payment's answer: {again}"
    );
    assert_eq!(again, first, "the frozen answer, byte for byte");

    let (status, _, problem) = app.pay_at(&lower, "k-limit-new", &body).await;
    assert_eq!(status, 422, "{problem}");
    assert!(problem.contains("/problems/validation-failed"), "{problem}");
    let (status, _, problem) = app
        .pay_at(&lower, "k-limit", &sandbox_body(json!(5_000_002)))
        .await;
    assert_eq!(status, 422, "{problem}");
    assert!(
        problem.contains("/problems/idempotency-key-reused"),
        "{problem}"
    );
    assert_eq!(app.count_rows().await, (1, 1), "one key, one payment");
}

/// The same request written otherwise (`250000.0` for `250000`: the same RFC 8785 form,
/// so the same fingerprint) retried at a process that does not hold the answer in memory:
/// the stored answer, not a refusal of the number's form.
async fn a_retry_written_otherwise_gets_its_payments_answer_from_the_stored_key(backend: Backend) {
    let app = Spawn::new(backend).sandbox().start().await;
    let first = app.pay("k-form", &sandbox_body(json!(250_000))).await;
    assert_eq!(first.status(), 201);
    let first = first.text().await.expect("body");

    let other = app.other_process(&["--replay-cache-mib", "0"]).await;
    let (status, replayed, again) = app
        .pay_at(&other, "k-form", &sandbox_body(json!(250_000.0)))
        .await;
    assert_eq!(
        (status, replayed.as_deref()),
        (201, Some("true")),
        "the payment's answer: {again}"
    );
    assert_eq!(again, first, "the frozen answer, byte for byte");
    // A new key written so is still refused, for its form (not its size), nothing stored.
    let (status, _, problem) = app
        .pay_at(&other, "k-form-new", &sandbox_body(json!(250_000.0)))
        .await;
    assert_eq!(status, 422, "{problem}");
    assert!(
        problem.contains("without a decimal point or exponent"),
        "{problem}"
    );
    assert_eq!(app.count_rows().await, (1, 1), "one key, one payment");
}

async fn an_amount_above_two_to_the_53_minus_one_is_refused_whatever_the_settings(
    backend: Backend,
) {
    let app = crate::helpers::started_sandbox(backend, &["--max-monto", "9007199254740991"]).await;
    // The example, then the first number JavaScript cannot tell from its neighbour.
    for monto in [
        json!(9_223_372_036_854_775_807_i64),
        json!(9_007_199_254_740_992_i64),
    ] {
        refused(&app, "k-js", &sandbox_body(monto), "9007199254740991").await;
    }
    let (status, pago) = app
        .pay_read("k-js", &sandbox_body(json!(9_007_199_254_740_991_i64)))
        .await;
    assert_eq!(status, 201, "the same key, 2^53 − 1 itself: {pago}");
    assert_eq!(pago["monto"], json!(9_007_199_254_740_991_i64));
}

async fn an_amount_above_pagos_max_monto_is_refused_and_the_default_is_twelve_digits(
    backend: Backend,
) {
    let app = Spawn::new(backend.clone()).sandbox().start().await;
    refused(
        &app,
        "k-default",
        &sandbox_body(json!(1_000_000_000_000_i64)),
        "999999999999",
    )
    .await;
    let (status, _) = app
        .pay_read("k-default", &sandbox_body(json!(999_999_999_999_i64)))
        .await;
    assert_eq!(status, 201, "the default's own value is accepted");

    let app = crate::helpers::started_sandbox(backend, &["--max-monto", "5000000"]).await;
    refused(&app, "k-max", &sandbox_body(json!(5_000_001)), "5000000").await;
    let (status, pago) = app.pay_read("k-max", &sandbox_body(json!(5_000_000))).await;
    assert_eq!(status, 201, "{pago}");
    assert_eq!(pago["monto"], 5_000_000);
}

/// pagos speaking `provider` with `--max-monto max_monto`, whose gateway answers every
/// `POST gateway_path` with `answer`.
async fn on_provider(
    backend: Backend,
    provider: &'static str,
    max_monto: &'static str,
    gateway_path: &str,
    answer: impl Respond + 'static,
) -> TestApp {
    let app = Spawn::new(backend)
        .provider(provider)
        .flags(&["--max-monto", max_monto])
        .start()
        .await;
    crate::helpers::mount_route(app.gateway(), "POST", gateway_path, answer).await;
    app
}

async fn sent_to(app: &TestApp, gateway_path: &str) -> Vec<Request> {
    crate::helpers::received(app.gateway(), "POST", |p| p == gateway_path).await
}

fn stripe_body(monto: i64, moneda: &str) -> Value {
    json!({"creditoId": "42", "monto": monto, "moneda": moneda,
           "medioPago": {"id": "pm_1Q0PsIJvEtkwdCNYMSaVuRz6"}})
}

async fn stripe_refuses_more_than_eight_digits_and_more_than_ten_in_cop(backend: Backend) {
    let app = on_provider(
        backend,
        "stripe",
        "9007199254740991",
        "/v1/payment_intents",
        crate::stripe_fake::StripeSucceeds,
    )
    .await;

    refused(&app, "k-usd", &stripe_body(100_000_000, "USD"), "99999999").await;
    refused(
        &app,
        "k-cop",
        &stripe_body(10_000_000_000, "COP"),
        "9999999999",
    )
    .await;
    assert!(
        sent_to(&app, "/v1/payment_intents").await.is_empty(),
        "nothing refused reached Stripe"
    );

    for (key, monto, moneda) in [
        ("k-usd", 99_999_999, "USD"),
        ("k-cop", 9_999_999_999, "COP"),
    ] {
        let (status, pago) = app.pay_read(key, &stripe_body(monto, moneda)).await;
        assert_eq!(status, 201, "{moneda} {monto}, the same key: {pago}");
    }
    let amounts: Vec<String> = sent_to(&app, "/v1/payment_intents")
        .await
        .iter()
        .map(|r| {
            url::form_urlencoded::parse(&r.body)
                .find(|(k, _)| k == "amount")
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(amounts, vec!["99999999", "9999999999"]);
}

/// Mercado Pago answering every new payment `approved`, about the request that asked.
struct MercadoPagoApproves;

impl Respond for MercadoPagoApproves {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&request.body).expect("JSON body");
        let mut payment: Value = serde_json::from_str(include_str!(
            "../../fixtures/mercadopago/payment_approved.json"
        ))
        .expect("fixture");
        payment["id"] = Value::from(1_234_567_890_u64);
        payment["transaction_amount"] = body["transaction_amount"].clone();
        payment["external_reference"] = body["external_reference"].clone();
        ResponseTemplate::new(201).set_body_json(payment)
    }
}

fn mercadopago_body(monto: i64) -> Value {
    json!({"creditoId": "42", "monto": monto, "moneda": "COP",
           "medioPago": {"id": "efecty", "email": "payer@example.com"}})
}

async fn mercadopago_has_only_the_general_limits_and_its_exact_decimals(backend: Backend) {
    let app = on_provider(
        backend.clone(),
        "mercadopago",
        "9007199254740991",
        "/v1/payments",
        MercadoPagoApproves,
    )
    .await;
    // Past what a decimal `transaction_amount` carries exactly: never sent.
    refused(
        &app,
        "k-mp",
        &mercadopago_body(1_000_000_000_000_000),
        "999999999999999",
    )
    .await;
    assert!(sent_to(&app, "/v1/payments").await.is_empty());
    // Stripe's COP maximum is not Mercado Pago's: COP 200,000,000.00 goes through.
    let (status, pago) = app
        .pay_read("k-mp", &mercadopago_body(20_000_000_000))
        .await;
    assert_eq!(status, 201, "{pago}");
    let sent: Value =
        serde_json::from_slice(&sent_to(&app, "/v1/payments").await[0].body).expect("JSON");
    assert_eq!(sent["transaction_amount"].as_f64(), Some(200_000_000.0));

    let app = on_provider(
        backend,
        "mercadopago",
        "50000000000",
        "/v1/payments",
        MercadoPagoApproves,
    )
    .await;
    refused(
        &app,
        "k-mp-max",
        &mercadopago_body(50_000_000_001),
        "50000000000",
    )
    .await;
    assert!(sent_to(&app, "/v1/payments").await.is_empty());
    let (status, _) = app
        .pay_read("k-mp-max", &mercadopago_body(50_000_000_000))
        .await;
    assert_eq!(status, 201);
}
