//! Refunds through the Stripe adapter, end to end: the refund pagos sends (`POST
//! /v1/refunds`, the PaymentIntent and the refund's reference), a pending refund answered
//! 202, then settled by Stripe's signed `refund.*` / `charge.refund.updated` events, and a
//! refund that turns `failed` after `succeeded` sent to on-call. Fixtures: fixtures/stripe.

use crate::helpers::{
    API_KEY, Backend, Spawn, TestApp, json, post_webhook, resultado, timestamped_signature,
};
use crate::on_both_databases;
use serde_json::{Value, json};
use std::collections::HashMap;
use wiremock::{Mock, Request, Respond, ResponseTemplate};

on_both_databases!(a_stripe_refund_left_pending_is_settled_by_its_events);

const WEBHOOK_SECRET: &str = "whsec_test_stripe";

fn form(request: &Request) -> HashMap<String, String> {
    url::form_urlencoded::parse(&request.body)
        .into_owned()
        .collect()
}

/// A PaymentIntent, succeeded, about the payment that asked.
struct Intents;

impl Respond for Intents {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let form = form(request);
        let mut pi: Value = serde_json::from_str(include_str!(
            "../../fixtures/stripe/payment_intent_succeeded.json"
        ))
        .expect("fixture");
        pi["id"] = json!("pi_test_refunds");
        pi["amount"] = json!(form.get("amount").and_then(|a| a.parse::<i64>().ok()));
        pi["currency"] = json!(form.get("currency"));
        pi["metadata"]["pagos_reference"] = json!(form.get("metadata[pagos_reference]"));
        ResponseTemplate::new(200).set_body_json(pi)
    }
}

/// A Refund, pending, about the refund that asked.
struct Refunds;

impl Respond for Refunds {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let form = form(request);
        let mut refund: Value =
            serde_json::from_str(include_str!("../../fixtures/stripe/refund_pending.json"))
                .expect("fixture");
        refund["id"] = json!("re_test_1");
        refund["amount"] = json!(form.get("amount").and_then(|a| a.parse::<i64>().ok()));
        refund["payment_intent"] = json!(form.get("payment_intent"));
        refund["metadata"]["pagos_reference"] = json!(form.get("metadata[pagos_reference]"));
        ResponseTemplate::new(200).set_body_json(refund)
    }
}

/// Stripe's fixture event `text`, about refund `reference`, created at `created`.
fn event(text: &str, event_id: &str, reference: &str, created: i64) -> Vec<u8> {
    let mut event: Value = serde_json::from_str(text).expect("fixture");
    event["id"] = json!(event_id);
    event["created"] = json!(created);
    let object = &mut event["data"]["object"];
    object["id"] = json!("re_test_1");
    object["payment_intent"] = json!("pi_test_refunds");
    object["metadata"]["pagos_reference"] = json!(reference);
    serde_json::to_vec(&event).expect("JSON")
}

async fn deliver(app: &TestApp, body: &[u8]) -> String {
    let signature = timestamped_signature(WEBHOOK_SECRET, chrono::Utc::now().timestamp(), body);
    resultado(
        post_webhook(
            app,
            "/v1/webhooks/stripe",
            &[("Stripe-Signature", &signature)],
            body,
        )
        .await,
    )
    .await
}

async fn a_stripe_refund_left_pending_is_settled_by_its_events(backend: Backend) {
    let app = Spawn::new(backend)
        .provider("stripe")
        .flags(&["--stripe-webhook-secret", WEBHOOK_SECRET])
        .start()
        .await;
    Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::path("/v1/payment_intents"))
        .respond_with(Intents)
        .mount(app.gateway())
        .await;
    Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::path("/v1/refunds"))
        .respond_with(Refunds)
        .mount(app.gateway())
        .await;
    let paid = app
        .pay(
            "pay-1",
            &json!({"creditoId": "42", "monto": 250000, "moneda": "COP",
                    "medioPago": {"id": "pm_1Q0PsIJvEtkwdCNYMSaVuRz6", "cliente": "cus_NffrFeUfNV2Hib"}}),
        )
        .await;
    assert_eq!(paid.status(), 201);
    let payment = json(paid).await["id"].as_str().expect("id").to_owned();

    let answer = app
        .http
        .post(app.url(&format!("/v1/pagos/{payment}/reembolsos")))
        .bearer_auth(API_KEY)
        .header("Idempotency-Key", "ref-1")
        .json(&json!({"monto": 50000, "motivo": "solicitud del cliente"}))
        .send()
        .await
        .expect("sent");
    assert_eq!(answer.status(), 202, "Stripe answered pending");
    let refund = json(answer).await;
    assert_eq!(refund["estado"], "ENVIADO");
    assert_eq!(refund["gatewayRef"], "re_test_1");
    let id = refund["id"].as_str().expect("id").to_owned();
    let sent: Vec<HashMap<String, String>> = app
        .gateway_requests_to("/v1/refunds")
        .await
        .iter()
        .map(form)
        .collect();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["payment_intent"], "pi_test_refunds");
    assert_eq!(sent[0]["metadata[pagos_reference]"], id);

    let t = chrono::Utc::now().timestamp();
    // An event whose refund id holds a NUL, which PostgreSQL's text refuses (before: a 503
    // at every delivery): signed, but not an event pagos can store, 400, nothing recorded.
    let mut unstorable: Value = serde_json::from_slice(&event(
        include_str!("../../fixtures/stripe/event_refund_created.json"),
        "evt_r0",
        &id,
        t,
    ))
    .expect("JSON");
    unstorable["data"]["object"]["id"] = json!("re_\u{0}1");
    let unstorable = serde_json::to_vec(&unstorable).expect("JSON");
    let signature = timestamped_signature(WEBHOOK_SECRET, t, &unstorable);
    let answer = post_webhook(
        &app,
        "/v1/webhooks/stripe",
        &[("Stripe-Signature", &signature)],
        &unstorable,
    )
    .await;
    assert_eq!(answer.status(), 400);
    assert_eq!(app.recorded().await, (0, 0), "nothing recorded");

    let created = event(
        include_str!("../../fixtures/stripe/event_refund_created.json"),
        "evt_r1",
        &id,
        t,
    );
    assert_eq!(deliver(&app, &created).await, "aplicado");
    assert_eq!(deliver(&app, &created).await, "duplicado");
    let read = app.get_as(API_KEY, &format!("/v1/reembolsos/{id}")).await;
    assert_eq!(json(read).await["estado"], "COMPLETADO");

    // The same refund failing later (charge.refund.updated): never silently.
    let failed = event(
        include_str!("../../fixtures/stripe/event_charge_refund_updated.json"),
        "evt_r2",
        &id,
        t + 60,
    );
    assert_eq!(deliver(&app, &failed).await, "revision_manual");
}
