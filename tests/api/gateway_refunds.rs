//! Refunds through each gateway adapter, against wiremock serving the providers' documented
//! bodies (`fixtures/`): the request each one sends, one key per refund however often it
//! is sent, timeouts and 5xx left unknown and retried with the same key, an over-refund
//! read as a refusal, a refused resend left unknown, and the look-ups. Gateway-level only:
//! no database, no pagos HTTP surface.

use pagos::gateway::http::HttpGateway;
use pagos::gateway::mercadopago::MercadoPagoGateway;
use pagos::gateway::retry::{self, RefundOutcome, RetryPolicy};
use pagos::gateway::sandbox::{Outcomes, SandboxGateway};
use pagos::gateway::stripe::StripeGateway;
use pagos::gateway::{
    ChargeRequest, Gateway, GatewayError, RefundLookup, RefundRequest, RefundStatus, RejectReason,
};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;
use wiremock::matchers::{header, method, path, query_param};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

const SECRET: &str = "gw-secret";
const REFERENCE: &str = "7f3c2a10-5b6e-4d8f-9a1c-2e4b6d8f0a12";
const PAYMENT_INTENT: &str = "pi_3MtwBwLkdIwHu7ix28a3tqPa";
const MP_PAYMENT: &str = "1234567890";

fn fixture(text: &str) -> Value {
    serde_json::from_str(text).expect("fixture is JSON")
}

#[derive(Clone, Copy, Debug)]
enum Adapter {
    Reference,
    Stripe,
    MercadoPago,
}

const ADAPTERS: [Adapter; 3] = [Adapter::Reference, Adapter::Stripe, Adapter::MercadoPago];

impl Adapter {
    fn gateway(self, base: &str, timeout: Duration) -> Arc<dyn Gateway> {
        match self {
            Adapter::Reference => {
                Arc::new(HttpGateway::new(base, SECRET, timeout).expect("client"))
            }
            Adapter::Stripe => Arc::new(StripeGateway::new(base, SECRET, timeout).expect("client")),
            Adapter::MercadoPago => {
                Arc::new(MercadoPagoGateway::new(base, SECRET, timeout).expect("client"))
            }
        }
    }

    fn request(self) -> RefundRequest {
        RefundRequest {
            gateway_key: "pagos-refund-0193d2e4c0a87d6f".into(),
            charge: match self {
                Adapter::Reference => "ch_3Pq8sTQ2xY7wZ1".into(),
                Adapter::Stripe => PAYMENT_INTENT.into(),
                Adapter::MercadoPago => MP_PAYMENT.into(),
            },
            amount: 50_000,
            currency: "COP".into(),
            reference: Uuid::parse_str(REFERENCE).expect("uuid"),
            reason: Some("solicitud del cliente".into()),
            whole: false,
        }
    }

    fn create_path(self) -> String {
        match self {
            Adapter::Reference | Adapter::Stripe => "/v1/refunds".into(),
            Adapter::MercadoPago => format!("/v1/payments/{MP_PAYMENT}/refunds"),
        }
    }

    fn key_header(self) -> &'static str {
        match self {
            Adapter::Reference | Adapter::Stripe => "idempotency-key",
            Adapter::MercadoPago => "x-idempotency-key",
        }
    }

    /// The provider's answer for a refund that succeeded.
    fn succeeded(self) -> ResponseTemplate {
        match self {
            Adapter::Reference => ResponseTemplate::new(201).set_body_json(fixture(include_str!(
                "../../fixtures/reference-gateway/refund_succeeded.json"
            ))),
            Adapter::Stripe => ResponseTemplate::new(200).set_body_json(fixture(include_str!(
                "../../fixtures/stripe/refund_succeeded.json"
            ))),
            Adapter::MercadoPago => ResponseTemplate::new(201).set_body_json(fixture(
                include_str!("../../fixtures/mercadopago/refund_approved.json"),
            )),
        }
    }

    fn server_error(self) -> ResponseTemplate {
        match self {
            Adapter::Reference => ResponseTemplate::new(503).set_body_json(fixture(include_str!(
                "../../fixtures/reference-gateway/error_unavailable.json"
            ))),
            Adapter::Stripe => ResponseTemplate::new(500).set_body_json(fixture(include_str!(
                "../../fixtures/stripe/error_api.json"
            ))),
            Adapter::MercadoPago => ResponseTemplate::new(500).set_body_json(fixture(
                include_str!("../../fixtures/mercadopago/error_internal.json"),
            )),
        }
    }

    /// The provider's refusal of a refund over what is left of the payment, and how pagos
    /// reads it: Mercado Pago documents no error of its own for it.
    fn over_refund(self) -> (ResponseTemplate, RejectReason) {
        match self {
            Adapter::Reference => (
                ResponseTemplate::new(400).set_body_json(fixture(include_str!(
                    "../../fixtures/reference-gateway/error_amount_exceeds_remaining.json"
                ))),
                RejectReason::ExceedsRemaining,
            ),
            Adapter::Stripe => (
                ResponseTemplate::new(400).set_body_json(fixture(include_str!(
                    "../../fixtures/stripe/error_charge_already_refunded.json"
                ))),
                RejectReason::ExceedsRemaining,
            ),
            Adapter::MercadoPago => (
                ResponseTemplate::new(400).set_body_json(fixture(include_str!(
                    "../../fixtures/mercadopago/error_refund_payment_state.json"
                ))),
                RejectReason::Other,
            ),
        }
    }

    /// The provider's answer for "this key was used with another request".
    fn key_reused(self) -> ResponseTemplate {
        match self {
            Adapter::Reference => ResponseTemplate::new(422)
                .set_body_json(json!({"error": "this key was used with another body"})),
            Adapter::Stripe => ResponseTemplate::new(400).set_body_json(fixture(include_str!(
                "../../fixtures/stripe/error_idempotency_key_reused.json"
            ))),
            Adapter::MercadoPago => ResponseTemplate::new(409).set_body_json(json!({
                "error": "conflict", "status": 409,
                "message": "the idempotency process has not been completed yet"
            })),
        }
    }
}

fn policy(retries: usize) -> RetryPolicy {
    RetryPolicy {
        retries,
        min_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(10),
    }
}

async fn created(server: &MockServer, adapter: Adapter) -> Vec<Request> {
    crate::helpers::received(server, "POST", |p| p == adapter.create_path()).await
}

fn key_of(request: &Request, adapter: Adapter) -> String {
    request
        .headers
        .get(adapter.key_header())
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

async fn mount(server: &MockServer, adapter: Adapter, answer: ResponseTemplate) {
    Mock::given(method("POST"))
        .and(path(adapter.create_path()))
        .respond_with(answer)
        .mount(server)
        .await;
}

#[tokio::test]
async fn every_adapter_sends_the_same_key_and_body_on_every_send_and_reads_a_replay_as_the_refund()
{
    for adapter in ADAPTERS {
        let server = MockServer::start().await;
        mount(&server, adapter, adapter.succeeded()).await;
        let gateway = adapter.gateway(&server.uri(), Duration::from_secs(5));
        let req = adapter.request();
        let first = retry::refund(gateway.as_ref(), &req, policy(2), false).await;
        let again = retry::refund(gateway.as_ref(), &req, policy(2), true).await;
        let RefundOutcome::Succeeded(refund) = &first else {
            panic!("{adapter:?}: {first:?}");
        };
        assert_eq!(again, first, "{adapter:?}: the replay is the same refund");
        assert_eq!(refund.amount, 50_000, "{adapter:?}");
        assert_eq!(refund.currency, "COP", "{adapter:?}");
        assert_eq!(refund.reference, REFERENCE, "{adapter:?}");
        let sent = created(&server, adapter).await;
        assert_eq!(sent.len(), 2, "{adapter:?}");
        assert_eq!(key_of(&sent[0], adapter), req.gateway_key, "{adapter:?}");
        assert_eq!(key_of(&sent[1], adapter), req.gateway_key, "{adapter:?}");
        assert_eq!(sent[0].body, sent[1].body, "{adapter:?}: the same body");
        assert_eq!(
            sent[0]
                .headers
                .get("authorization")
                .and_then(|v| v.to_str().ok()),
            Some("Bearer gw-secret"),
            "{adapter:?}"
        );
    }
}

#[tokio::test]
async fn a_timeout_leaves_every_adapters_refund_unknown_after_retries_with_the_same_key() {
    for adapter in ADAPTERS {
        let server = MockServer::start().await;
        mount(
            &server,
            adapter,
            adapter.succeeded().set_delay(Duration::from_secs(3)),
        )
        .await;
        let gateway = adapter.gateway(&server.uri(), Duration::from_millis(200));
        let req = adapter.request();
        let outcome = retry::refund(gateway.as_ref(), &req, policy(1), false).await;
        assert!(
            matches!(outcome, RefundOutcome::Unknown(_)),
            "{adapter:?}: {outcome:?}"
        );
        let sent = created(&server, adapter).await;
        assert_eq!(sent.len(), 2, "{adapter:?}: one try and one retry");
        assert!(
            sent.iter().all(|r| key_of(r, adapter) == req.gateway_key),
            "{adapter:?}"
        );
    }
}

#[tokio::test]
async fn a_server_error_is_unknown_and_retried_with_the_same_key_until_an_answer_comes() {
    for adapter in ADAPTERS {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path(adapter.create_path()))
            .respond_with(adapter.server_error())
            .up_to_n_times(2)
            .with_priority(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path(adapter.create_path()))
            .respond_with(adapter.succeeded())
            .with_priority(2)
            .mount(&server)
            .await;
        let gateway = adapter.gateway(&server.uri(), Duration::from_secs(5));
        let req = adapter.request();
        let outcome = retry::refund(gateway.as_ref(), &req, policy(3), false).await;
        assert!(
            matches!(outcome, RefundOutcome::Succeeded(_)),
            "{adapter:?}: {outcome:?}"
        );
        assert_eq!(created(&server, adapter).await.len(), 3, "{adapter:?}");

        let down = MockServer::start().await;
        mount(&down, adapter, adapter.server_error()).await;
        let gateway = adapter.gateway(&down.uri(), Duration::from_secs(5));
        let outcome = retry::refund(gateway.as_ref(), &req, policy(1), false).await;
        assert!(
            matches!(outcome, RefundOutcome::Unknown(_)),
            "{adapter:?}: {outcome:?}"
        );
    }
}

#[tokio::test]
async fn an_over_refund_on_the_first_send_is_a_refusal_and_is_not_retried() {
    for adapter in ADAPTERS {
        let server = MockServer::start().await;
        let (answer, reason) = adapter.over_refund();
        mount(&server, adapter, answer).await;
        let gateway = adapter.gateway(&server.uri(), Duration::from_secs(5));
        let outcome = retry::refund(gateway.as_ref(), &adapter.request(), policy(3), false).await;
        match outcome {
            RefundOutcome::Rejected {
                status: 400,
                reason: read,
                ..
            } => assert_eq!(read, reason, "{adapter:?}"),
            other => panic!("{adapter:?}: {other:?}"),
        }
        assert_eq!(created(&server, adapter).await.len(), 1, "{adapter:?}");
    }
}

#[tokio::test]
async fn a_refusal_of_a_resend_or_after_a_timeout_stays_unknown() {
    for adapter in ADAPTERS {
        let (answer, _) = adapter.over_refund();
        // A resend: an earlier send of the refund may have reached the gateway.
        let server = MockServer::start().await;
        mount(&server, adapter, answer.clone()).await;
        let gateway = adapter.gateway(&server.uri(), Duration::from_secs(5));
        let outcome = retry::refund(gateway.as_ref(), &adapter.request(), policy(3), true).await;
        assert!(
            matches!(outcome, RefundOutcome::Unknown(_)),
            "{adapter:?}: {outcome:?}"
        );
        assert_eq!(created(&server, adapter).await.len(), 1, "not retried");

        // The first try timed out (it may have refunded), the retry is refused.
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path(adapter.create_path()))
            .respond_with(adapter.succeeded().set_delay(Duration::from_secs(3)))
            .up_to_n_times(1)
            .with_priority(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path(adapter.create_path()))
            .respond_with(answer)
            .with_priority(2)
            .mount(&server)
            .await;
        let gateway = adapter.gateway(&server.uri(), Duration::from_millis(200));
        let outcome = retry::refund(gateway.as_ref(), &adapter.request(), policy(3), false).await;
        assert!(
            matches!(outcome, RefundOutcome::Unknown(_)),
            "{adapter:?}: {outcome:?}"
        );
    }
}

#[tokio::test]
async fn a_key_used_with_another_request_leaves_the_refund_unknown() {
    for adapter in ADAPTERS {
        let server = MockServer::start().await;
        mount(&server, adapter, adapter.key_reused()).await;
        let gateway = adapter.gateway(&server.uri(), Duration::from_secs(5));
        let outcome = retry::refund(gateway.as_ref(), &adapter.request(), policy(0), false).await;
        assert!(
            matches!(outcome, RefundOutcome::Unknown(_)),
            "{adapter:?}: {outcome:?}"
        );
    }
}

#[tokio::test]
async fn the_reference_refund_is_the_contracts_json_and_its_statuses_are_read() {
    let server = MockServer::start().await;
    let gateway = Adapter::Reference.gateway(&server.uri(), Duration::from_secs(5));
    for (file, status) in [
        (
            include_str!("../../fixtures/reference-gateway/refund_pending.json"),
            RefundStatus::Pending,
        ),
        (
            include_str!("../../fixtures/reference-gateway/refund_failed.json"),
            RefundStatus::Failed,
        ),
    ] {
        server.reset().await;
        mount(
            &server,
            Adapter::Reference,
            ResponseTemplate::new(201).set_body_json(fixture(file)),
        )
        .await;
        let refund = gateway
            .refund(&Adapter::Reference.request())
            .await
            .expect("answered");
        assert_eq!(refund.status, status);
    }
    let sent = created(&server, Adapter::Reference).await;
    let body: Value = serde_json::from_slice(&sent[0].body).expect("JSON");
    assert_eq!(
        body,
        fixture(include_str!(
            "../../fixtures/reference-gateway/refund_request.json"
        )),
        "charge, amount, currency and reference: no more"
    );
}

#[tokio::test]
async fn the_stripe_refund_is_form_encoded_with_the_payment_intent_and_the_reference() {
    let server = MockServer::start().await;
    mount(
        &server,
        Adapter::Stripe,
        ResponseTemplate::new(200).set_body_json(fixture(include_str!(
            "../../fixtures/stripe/refund_requires_action.json"
        ))),
    )
    .await;
    let gateway = Adapter::Stripe.gateway(&server.uri(), Duration::from_secs(5));
    let outcome = retry::refund(
        gateway.as_ref(),
        &Adapter::Stripe.request(),
        policy(0),
        false,
    )
    .await;
    assert!(
        matches!(&outcome, RefundOutcome::Pending(r) if r.charge == PAYMENT_INTENT),
        "requires_action waits: {outcome:?}"
    );
    let sent = created(&server, Adapter::Stripe).await;
    assert_eq!(
        sent[0]
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/x-www-form-urlencoded")
    );
    let form: HashMap<String, String> = url::form_urlencoded::parse(&sent[0].body)
        .into_owned()
        .collect();
    assert_eq!(
        form.get("payment_intent").map(String::as_str),
        Some(PAYMENT_INTENT)
    );
    assert_eq!(form.get("amount").map(String::as_str), Some("50000"));
    assert_eq!(
        form.get("metadata[pagos_reference]").map(String::as_str),
        Some(REFERENCE)
    );
    assert_eq!(
        form.get("metadata[pagos_reason]").map(String::as_str),
        Some("solicitud del cliente")
    );

    // Refused without a code, "greater than unrefunded amount": over what is left too.
    server.reset().await;
    mount(
        &server,
        Adapter::Stripe,
        ResponseTemplate::new(400).set_body_json(fixture(include_str!(
            "../../fixtures/stripe/error_refund_exceeds_unrefunded.json"
        ))),
    )
    .await;
    let refused = gateway
        .refund(&Adapter::Stripe.request())
        .await
        .expect_err("refused");
    assert!(
        matches!(
            refused,
            GatewayError::Rejected {
                reason: RejectReason::ExceedsRemaining,
                ..
            }
        ),
        "{refused:?}"
    );
}

/// A whole refund reads its charge before it is sent: the read and the send of one try
/// take no longer than one request may (`PAGOS_GATEWAY_TIMEOUT`), which the retries'
/// and the hold's arithmetic count on. A read that took most of it sends nothing: an
/// unknown outcome, tried again, the charge not read again.
#[tokio::test]
async fn a_whole_mercadopago_refund_whose_charge_read_took_its_time_is_not_sent_in_that_try() {
    let server = MockServer::start().await;
    mount(
        &server,
        Adapter::MercadoPago,
        ResponseTemplate::new(201).set_body_json(fixture(include_str!(
            "../../fixtures/mercadopago/refund_in_process.json"
        ))),
    )
    .await;
    let mut charge = fixture(include_str!(
        "../../fixtures/mercadopago/payment_approved.json"
    ));
    charge["transaction_amount"] = json!(500);
    Mock::given(method("GET"))
        .and(path(format!("/v1/payments/{MP_PAYMENT}")))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(charge)
                .set_delay(Duration::from_millis(850)),
        )
        .mount(&server)
        .await;
    let gateway = Adapter::MercadoPago.gateway(&server.uri(), Duration::from_secs(1));
    let whole = RefundRequest {
        whole: true,
        ..Adapter::MercadoPago.request()
    };
    let late = gateway.refund(&whole).await.expect_err("not sent");
    assert!(matches!(late, GatewayError::Unknown(_)), "{late:?}");
    assert!(created(&server, Adapter::MercadoPago).await.is_empty());
    gateway
        .refund(&whole)
        .await
        .expect("sent, the charge known");
    let sent = created(&server, Adapter::MercadoPago).await;
    assert_eq!(sent.len(), 1);
    assert_eq!(
        serde_json::from_slice::<Value>(&sent[0].body).expect("JSON"),
        json!({})
    );
}

#[tokio::test]
async fn the_mercadopago_refund_names_the_payment_renders_refunds_in_process_and_sends_exact_decimals()
 {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(Adapter::MercadoPago.create_path()))
        .and(header("x-render-in-process-refunds", "true"))
        .respond_with(
            ResponseTemplate::new(201).set_body_json(fixture(include_str!(
                "../../fixtures/mercadopago/refund_in_process.json"
            ))),
        )
        .mount(&server)
        .await;
    let gateway = Adapter::MercadoPago.gateway(&server.uri(), Duration::from_secs(5));
    let req = Adapter::MercadoPago.request();
    let pending = gateway.refund(&req).await.expect("answered");
    assert_eq!(pending.status, RefundStatus::Pending, "in_process waits");
    assert_eq!(pending.id, "1009042016");
    assert_eq!(pending.charge, MP_PAYMENT);
    let whole = RefundRequest {
        whole: true,
        ..req.clone()
    };
    // Mercado Pago has no such payment: the whole payment's refund is not sent.
    let unknown = gateway.refund(&whole).await.expect_err("not sent");
    assert!(matches!(unknown, GatewayError::Unknown(_)), "{unknown:?}");
    assert_eq!(created(&server, Adapter::MercadoPago).await.len(), 1);
    // The charge is of the payment's amount: Mercado Pago's total refund, `{}`.
    let mut charge = fixture(include_str!(
        "../../fixtures/mercadopago/payment_approved.json"
    ));
    charge["transaction_amount"] = json!(500);
    let fetched = Mock::given(method("GET"))
        .and(path(format!("/v1/payments/{MP_PAYMENT}")))
        .respond_with(ResponseTemplate::new(200).set_body_json(charge.clone()))
        .mount_as_scoped(&server)
        .await;
    gateway.refund(&whole).await.expect("answered");
    drop(fetched);
    // On-call kept the payment on a charge of another amount (2,500 COP for a payment of
    // 500): its whole refund gives back the payment's 500, never the charge's 2,500. (A
    // charge's amount never changes, and an adapter reads it once: another adapter.)
    charge["transaction_amount"] = json!(2500);
    Mock::given(method("GET"))
        .and(path(format!("/v1/payments/{MP_PAYMENT}")))
        .respond_with(ResponseTemplate::new(200).set_body_json(charge))
        .mount(&server)
        .await;
    let another = Adapter::MercadoPago.gateway(&server.uri(), Duration::from_secs(5));
    another.refund(&whole).await.expect("answered");
    another.refund(&whole).await.expect("sent again");
    let read = crate::helpers::received(&server, "GET", |p| p.ends_with(MP_PAYMENT)).await;
    assert_eq!(
        read.len(),
        3,
        "the charge is read once an adapter, and not for a partial refund"
    );
    let sent = created(&server, Adapter::MercadoPago).await;
    let bodies: Vec<Value> = sent
        .iter()
        .map(|r| serde_json::from_slice(&r.body).expect("JSON"))
        .collect();
    let partial = fixture(include_str!(
        "../../fixtures/mercadopago/refund_request.json"
    ));
    assert_eq!(
        bodies,
        vec![partial.clone(), json!({}), partial.clone(), partial],
        "500.0 COP for 50000 cents; an empty body for the whole payment only when the charge is of its amount"
    );

    // An id that cannot be Mercado Pago's is never sent.
    let stray = RefundRequest {
        charge: "ch_not_mercadopago".into(),
        ..req
    };
    let refused = gateway.refund(&stray).await.expect_err("not sent");
    assert!(
        matches!(refused, GatewayError::Rejected { status: 422, .. }),
        "{refused:?}"
    );
    assert_eq!(created(&server, Adapter::MercadoPago).await.len(), 4);
}

#[tokio::test]
async fn the_reference_lookup_asks_by_reference_and_keeps_only_that_refund() {
    let server = MockServer::start().await;
    let mine = fixture(include_str!(
        "../../fixtures/reference-gateway/refund_succeeded.json"
    ));
    let mut another = mine.clone();
    another["reference"] = json!("another");
    Mock::given(method("GET"))
        .and(path("/v1/refunds"))
        .and(query_param("reference", REFERENCE))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [mine, another]})))
        .mount(&server)
        .await;
    let gateway = Adapter::Reference.gateway(&server.uri(), Duration::from_secs(5));
    let found = gateway
        .lookup_refunds(&Adapter::Reference.request().lookup(None))
        .await
        .expect("found");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].reference, REFERENCE);
    let none = RefundLookup {
        reference: Uuid::nil(),
        ..Adapter::Reference.request().lookup(None)
    };
    assert!(
        matches!(
            gateway.lookup_refunds(&none).await,
            Err(GatewayError::Unknown(_))
        ),
        "a look-up answered 404 says nothing: unknown, never a refusal"
    );
}

#[tokio::test]
async fn the_stripe_lookup_lists_the_payment_intents_refunds_and_keeps_those_carrying_the_reference()
 {
    let server = MockServer::start().await;
    let list = fixture(include_str!("../../fixtures/stripe/refund_list.json"));
    // Page one: only another refund of the PaymentIntent, and more to come.
    let mut first = list.clone();
    first["data"] = json!([list["data"][1].clone()]);
    first["has_more"] = json!(true);
    let mut second = list.clone();
    second["data"] = json!([list["data"][0].clone()]);
    Mock::given(method("GET"))
        .and(path("/v1/refunds"))
        .and(query_param("payment_intent", PAYMENT_INTENT))
        .and(query_param("starting_after", "re_3MtwBwLkdIwHu7ix0Zz1Aa9B"))
        .respond_with(ResponseTemplate::new(200).set_body_json(second))
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/refunds"))
        .and(query_param("payment_intent", PAYMENT_INTENT))
        .respond_with(ResponseTemplate::new(200).set_body_json(first))
        .with_priority(2)
        .mount(&server)
        .await;
    let gateway = Adapter::Stripe.gateway(&server.uri(), Duration::from_secs(5));
    let lookup = Adapter::Stripe.request().lookup(None);
    let found = gateway.lookup_refunds(&lookup).await.expect("found");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].id, "re_3MtwBwLkdIwHu7ix0bD8Lq2Q");
    assert_eq!(found[0].status, RefundStatus::Succeeded);

    // The id an answer gave finds the refund too; nothing else is ours.
    let by_id = RefundLookup {
        reference: Uuid::nil(),
        gateway_ref: Some("re_3MtwBwLkdIwHu7ix0bD8Lq2Q".into()),
        ..lookup.clone()
    };
    assert_eq!(
        gateway.lookup_refunds(&by_id).await.expect("found").len(),
        1
    );
    let nobody = RefundLookup {
        reference: Uuid::nil(),
        ..lookup
    };
    assert!(
        gateway
            .lookup_refunds(&nobody)
            .await
            .expect("listed")
            .is_empty()
    );

    server.reset().await;
    Mock::given(method("GET"))
        .and(path("/v1/refunds"))
        .respond_with(Adapter::Stripe.server_error())
        .mount(&server)
        .await;
    assert!(matches!(
        gateway
            .lookup_refunds(&Adapter::Stripe.request().lookup(None))
            .await,
        Err(GatewayError::Unknown(_))
    ));
}

#[tokio::test]
async fn the_mercadopago_lookup_finds_a_refund_only_by_the_id_an_answer_gave() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(format!("/v1/payments/{MP_PAYMENT}/refunds")))
        .and(header("x-render-in-process-refunds", "true"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(fixture(include_str!(
                "../../fixtures/mercadopago/refund_list.json"
            ))),
        )
        .mount(&server)
        .await;
    let gateway = Adapter::MercadoPago.gateway(&server.uri(), Duration::from_secs(5));
    let req = Adapter::MercadoPago.request();
    let found = gateway
        .lookup_refunds(&req.lookup(Some("1009042016".into())))
        .await
        .expect("found");
    assert_eq!(found.len(), 1);
    assert_eq!(
        (
            found[0].status,
            found[0].amount,
            found[0].reference.as_str()
        ),
        (RefundStatus::Pending, 50_000, REFERENCE)
    );
    // Nothing on a Mercado Pago refund names the pagos refund: without its id, the other
    // refund of the payment is never taken for it.
    let unknown = gateway
        .lookup_refunds(&req.lookup(None))
        .await
        .expect("answered");
    assert!(unknown.is_empty(), "{unknown:?}");
    let gets = crate::helpers::received(&server, "GET", |_| true)
        .await
        .len();
    assert_eq!(gets, 1, "nothing to ask without the refund's id");
}

#[tokio::test]
async fn the_in_process_sandbox_refuses_an_over_refund_replays_per_key_and_keeps_a_resend_unknown()
{
    let sandbox = SandboxGateway::new(Outcomes::default());
    let charge = sandbox
        .charge(&ChargeRequest {
            gateway_key: "charge-key".into(),
            amount: 100_000,
            currency: "COP".into(),
            reference: Uuid::nil(),
            description: None,
            payment_method: None,
        })
        .await
        .expect("charged");
    let refund = |key: &str, amount: i64, n: u128| RefundRequest {
        gateway_key: key.into(),
        charge: charge.id.clone(),
        amount,
        currency: "COP".into(),
        reference: Uuid::from_u128(n),
        reason: None,
        whole: false,
    };
    let first = retry::refund(&sandbox, &refund("r1", 60_000, 1), policy(0), false).await;
    let again = retry::refund(&sandbox, &refund("r1", 60_000, 1), policy(0), true).await;
    assert!(matches!(first, RefundOutcome::Succeeded(_)), "{first:?}");
    assert_eq!(again, first, "one key, one refund");
    let over = retry::refund(&sandbox, &refund("r2", 40_001, 2), policy(3), false).await;
    assert!(
        matches!(
            over,
            RefundOutcome::Rejected {
                reason: RejectReason::ExceedsRemaining,
                ..
            }
        ),
        "{over:?}"
    );
    let resent = retry::refund(&sandbox, &refund("r2", 40_001, 2), policy(3), true).await;
    assert!(matches!(resent, RefundOutcome::Unknown(_)), "{resent:?}");
    let totals = sandbox.core().refund_totals();
    assert_eq!((totals.made, totals.refunded_amount), (1, 60_000));
}
