//! What the gateway does to a payment: fails, declines, hangs, drops the connection.
//! Every retry carries the same gateway key; the merchant gets a clear answer each time.

use crate::helpers::{
    Backend, Charge, FakeGateway, Spawn, charges, idempotency_key, json, payment_body,
};
use crate::on_both_databases;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wiremock::ResponseTemplate;

on_both_databases!(
    gateway_503_twice_then_201_completes_with_three_calls_and_one_key,
    a_declined_payment_is_402_stored_and_replayed,
    a_gateway_that_hangs_past_the_timeout_leaves_the_payment_enviada_with_202,
    a_reset_connection_is_retried_with_the_same_key,
    a_gateway_refusal_is_not_retried_and_fails_the_payment,
    a_pending_charge_answers_202_and_its_retry_gets_the_current_state,
    refused_credentials_leave_the_payment_to_the_reconciler_instead_of_failing_it,
    a_charge_for_another_amount_goes_to_review_instead_of_settling,
    a_charge_answer_naming_another_payment_or_none_is_not_believed_by_any_provider,
    a_refund_answer_about_another_refund_is_not_believed_by_any_provider,
    a_provider_string_longer_than_pagos_stores_never_fails_the_write,
    a_redirect_after_a_charge_is_an_unknown_outcome_never_a_refusal,
    a_nul_in_what_the_provider_says_never_fails_the_write,
    a_refusal_whose_body_breaks_off_is_an_unknown_outcome_for_every_provider,
);

/// A succeeded charge about each request (its reference, amount and currency), changed by
/// `change`.
struct ChargeAbout(fn(&mut serde_json::Value));

impl wiremock::Respond for ChargeAbout {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        let body: serde_json::Value =
            serde_json::from_slice(&request.body).unwrap_or(serde_json::Value::Null);
        let mut charge = Charge::succeeded().about(&body);
        (self.0)(&mut charge);
        ResponseTemplate::new(201).set_body_json(charge)
    }
}

/// A gateway that makes the charge and answers `303 See Other` with its `Location`, the
/// usual answer to a POST that created something: one charge per key, every send of the
/// key answered the same.
struct ChargesThenSeeOther {
    fake: FakeGateway,
    made: Mutex<std::collections::HashMap<String, String>>,
}

impl wiremock::Respond for ChargesThenSeeOther {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        let body: serde_json::Value =
            serde_json::from_slice(&request.body).unwrap_or(serde_json::Value::Null);
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        let id = made
            .entry(idempotency_key(request))
            .or_insert_with(|| {
                self.fake.preload_for(
                    body["reference"].as_str().unwrap_or(""),
                    "succeeded",
                    body["amount"].as_i64().unwrap_or(0),
                )
            })
            .clone();
        ResponseTemplate::new(303).insert_header("Location", format!("/v1/charges/{id}"))
    }
}

/// The gateway charged and answered 303 pointing at the charge; the reference protocol
/// has no `GET /v1/charges/{id}`, so a client that follows the redirect gets a 404 for a
/// charge that exists. A 3xx says nothing of the charge (`classify::refusal`): the
/// outcome is unknown, the merchant is answered 202 ENVIADA, and the reconciler's look-up
/// settles it COMPLETADA. Never 402 "no money was taken" for money the gateway took.
async fn a_redirect_after_a_charge_is_an_unknown_outcome_never_a_refusal(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    // Look-ups tell the truth about what was charged.
    let fake = FakeGateway::charging("succeeded");
    fake.mount(app.gateway()).await;
    charges()
        .respond_with(ChargesThenSeeOther {
            fake: fake.clone(),
            made: Mutex::default(),
        })
        .with_priority(1)
        .mount(app.gateway())
        .await;

    let answer = app.pay("k-303", &payment_body()).await;
    let status = answer.status();
    let body = json(answer).await;
    assert_eq!(fake.total_charges(), 1, "the gateway charged the customer");
    assert_eq!(
        status, 202,
        "a redirect is no refusal: the merchant must not be told no money was taken: {body}"
    );
    assert_eq!(body["estado"], "ENVIADA", "{body}");
    let id = body["id"].as_str().expect("id").to_owned();
    let report = app.reconcile(&id).await;
    assert_eq!(report["completados"], 1, "{report}");
    assert_eq!(app.payment(&id).await.state, "COMPLETADA");
    assert_eq!(fake.total_charges(), 1, "charged once");
}

async fn a_charge_for_another_amount_goes_to_review_instead_of_settling(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    // This payment's charge (its reference), for another amount.
    app.answer_charges(ChargeAbout(|charge| charge["amount"] = 1.into()))
        .await;
    let answer = app.pay("k-amount", &payment_body()).await;
    assert_eq!(answer.status(), 202);
    let body = json(answer).await;
    assert_eq!(
        body["estado"], "REVISION_MANUAL",
        "money that does not match is never COMPLETADA"
    );
    // Nobody works on it until on-call decides: a retry is answered its state, not told
    // for what is left of the first request's lease that it is still in flight (409).
    let retry = app.pay("k-amount", &payment_body()).await;
    assert_eq!(retry.status(), 202);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let again = json(retry).await;
    assert_eq!(again["id"], body["id"]);
    assert_eq!(again["estado"], "REVISION_MANUAL");
    assert_eq!(app.charges_seen().await.len(), 1);
}

/// The answer to a charge names another payment's charge (a gateway bug, a proxy or cache
/// replaying another request's answer: same amount, same currency), or none: it says
/// nothing of this payment, so it is never believed — not 201 COMPLETADA on someone
/// else's money, not 402 on someone else's decline. It is an unknown outcome: retried with
/// the same key, whose answer (the provider's replay of this payment's own charge) settles
/// it at once; with no retry left, answered 202 ENVIADA, and the reconciler, whose search
/// keeps this payment's own charges, settles it on its own charge. Charged once either way.
/// Every provider echoes the reference it was sent (the reference protocol's `reference`,
/// Stripe's `metadata.pagos_reference`, Mercado Pago's `external_reference`): an answer
/// without one is not believed either.
async fn a_charge_answer_naming_another_payment_or_none_is_not_believed_by_any_provider(
    backend: Backend,
) {
    use crate::providers::Next;
    for (provider, naming, retries) in foreign_answers() {
        let case = format!("{provider:?} answering about {naming:?}, {retries} retries");
        let (app, fake) = provider
            .spawn(backend.clone(), &["--gateway-retries", retries])
            .await;
        fake.next([Next::AnswerNaming(naming.clone())]);
        let answer = app.pay("k-foreign", &provider.payment(250_000)).await;
        let (status, pago, id) = answered(answer).await;
        if retries == "0" {
            handed_over(status, &pago, "ENVIADA", &case);
            let report = app.reconcile(&id).await;
            assert_eq!(report["completados"], 1, "{case}: {report}");
            assert_eq!(fake.searches(), std::slice::from_ref(&id), "{case}");
        } else {
            assert_eq!(status, 201, "{case}: {pago}");
            assert_eq!(fake.creates().len(), 2, "{case}: the retry, same key");
        }
        let payment = app.payment(&id).await;
        assert_eq!(payment.state, "COMPLETADA", "{case}");
        assert_eq!(
            payment.gateway_ref.as_deref(),
            Some(provider.charge_id(1).as_str()),
            "{case}: settled on its own charge, not the one answered"
        );
        assert_eq!(fake.charges(), 1, "{case}: charged once");
    }
}

/// The answer to a refund is another refund's (a gateway bug, a proxy or cache replaying
/// another request's answer: same amount): it says nothing of this refund, so it is never
/// believed — not 201 COMPLETADO on money someone else's refund returned, not 422 FALLIDO
/// on someone else's failure. It is an unknown outcome: retried with the same key, whose
/// answer (the provider's replay of this refund) settles it at once; with no retry left,
/// answered 202 ENVIADO, and the reconciler, whose look-up keeps this refund's own, settles
/// it on its own refund. Refunded once either way.
///
/// What tells another refund apart is what each provider's refund carries: the reference
/// protocol's `reference` and Stripe's `metadata.pagos_reference` echo the pagos refund id
/// (an answer naming another, or none, is not believed); a Mercado Pago refund carries no
/// reference of pagos', so one of another payment (`payment_id`) or of another amount is
/// not this refund (`Provider::another_refund`).
async fn a_refund_answer_about_another_refund_is_not_believed_by_any_provider(backend: Backend) {
    use crate::providers::Next;
    for (provider, naming, retries) in foreign_answers() {
        let case = format!("{provider:?} answering about {naming:?}, {retries} retries");
        let (app, fake) = provider
            .spawn(backend.clone(), &["--gateway-retries", retries])
            .await;
        let paid = app.pay("k-pay", &provider.payment(250_000)).await;
        assert_eq!(paid.status(), 201, "{case}");
        let payment = json(paid).await["id"].as_str().expect("id").to_owned();
        fake.next_refunds([Next::AnswerNaming(naming.clone())]);
        let answer = crate::refunds::refund(
            &app,
            &payment,
            "k-refund",
            &serde_json::json!({"monto": 50000}),
        )
        .await;
        let (status, reembolso, id) = answered(answer).await;
        if retries == "0" {
            handed_over(status, &reembolso, "ENVIADO", &case);
            let report = app
                .admin_post(
                    "/admin/reconciliaciones",
                    &serde_json::json!({ "reembolsoId": id }),
                )
                .await;
            let report = json(report).await;
            assert_eq!(report["reembolsos"]["completados"], 1, "{case}: {report}");
        } else {
            assert_eq!(status, 201, "{case}: {reembolso}");
            assert_eq!(fake.refund_keys().len(), 2, "{case}: the retry");
        }
        let keys = fake.refund_keys();
        assert!(keys.iter().all(|k| *k == keys[0]), "{case}: one key");
        let read = json(
            app.get_as(crate::helpers::API_KEY, &format!("/v1/reembolsos/{id}"))
                .await,
        )
        .await;
        assert_eq!(read["estado"], "COMPLETADO", "{case}: {read}");
        assert_eq!(
            read["gatewayRef"],
            provider.refund_id(1).as_str(),
            "{case}: settled on its own refund, not the one answered"
        );
        assert_eq!(fake.refunds_made(), 1, "{case}: refunded once");
    }
}

async fn refused_credentials_leave_the_payment_to_the_reconciler_instead_of_failing_it(
    backend: Backend,
) {
    let app = crate::helpers::started(backend, &["--gateway-retries", "1"]).await;
    app.answer_charges(ResponseTemplate::new(401).set_body_string(r#"{"error":"bad secret"}"#))
        .await;
    let answer = app.pay("k-401", &payment_body()).await;
    assert_eq!(
        answer.status(),
        202,
        "no charge was made, but the payment is not failed either"
    );
    assert_eq!(json(answer).await["estado"], "ENVIADA");
}

async fn gateway_503_twice_then_201_completes_with_three_calls_and_one_key(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    charges()
        .respond_with(ResponseTemplate::new(503).set_body_string(include_str!(
            "../../fixtures/reference-gateway/error_unavailable.json"
        )))
        .up_to_n_times(2)
        .with_priority(1)
        .mount(app.gateway())
        .await;
    charges()
        .respond_with(Charge::succeeded())
        .with_priority(2)
        .mount(app.gateway())
        .await;

    let answer = app.pay("k-503", &payment_body()).await;
    assert_eq!(answer.status(), 201);
    assert_eq!(json(answer).await["estado"], "COMPLETADA");
    let seen = app.charges_seen().await;
    assert_eq!(seen.len(), 3);
    let keys: Vec<_> = seen
        .iter()
        .map(|r| r.headers["idempotency-key"].clone())
        .collect();
    assert!(
        keys.windows(2).all(|w| w[0] == w[1]),
        "one gateway key on every try: {keys:?}"
    );
    assert!(
        keys[0]
            .to_str()
            .is_ok_and(|k| k.len() <= 255 && k != "k-503")
    );
    assert_eq!(seen[0].headers["authorization"], "Bearer gw_secret");
}

async fn a_declined_payment_is_402_stored_and_replayed(backend: Backend) {
    let app = crate::helpers::charging(backend, Charge::declined()).await;

    let first = app.pay("k-decline", &payment_body()).await;
    assert_eq!(first.status(), 402);
    assert_eq!(first.headers()["content-type"], "application/problem+json");
    let first_body = first.bytes().await.expect("body");
    let problem: serde_json::Value = serde_json::from_slice(&first_body).expect("JSON");
    assert_eq!(problem["type"], "/problems/payment-declined");
    assert_eq!(problem["pago"]["estado"], "FALLIDA");
    assert_eq!(problem["declineCode"], "insufficient_funds");

    let replay = app.pay("k-decline", &payment_body()).await;
    assert_eq!(replay.status(), 402);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.bytes().await.expect("body"), first_body);
    assert_eq!(app.charges_seen().await.len(), 1);
}

async fn a_gateway_that_hangs_past_the_timeout_leaves_the_payment_enviada_with_202(
    backend: Backend,
) {
    let app = crate::helpers::started(
        backend,
        &["--gateway-timeout", "200ms", "--gateway-retries", "2"],
    )
    .await;
    app.answer_charges(Charge::succeeded().respond_later(Duration::from_secs(5)))
        .await;

    let answer = app.pay("k-hang", &payment_body()).await;
    assert_eq!(answer.status(), 202);
    let location = crate::helpers::location_of(&answer);
    let body = json(answer).await;
    assert_eq!(body["estado"], "ENVIADA");
    assert!(location.ends_with(body["id"].as_str().expect("id")));
    let seen = app.charges_seen().await;
    assert_eq!(seen.len(), 3, "first try and two retries");
    let stored = app.payment(body["id"].as_str().expect("id")).await;
    assert_eq!(stored.state, "ENVIADA");
}

async fn a_gateway_refusal_is_not_retried_and_fails_the_payment(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    charges()
        .respond_with(
            ResponseTemplate::new(400).set_body_string(r#"{"error":"currency not enabled"}"#),
        )
        .mount(app.gateway())
        .await;

    let answer = app.pay("k-refused", &payment_body()).await;
    assert_eq!(answer.status(), 402);
    let problem = json(answer).await;
    assert_eq!(problem["type"], "/problems/gateway-rejected");
    assert_eq!(problem["pago"]["estado"], "FALLIDA");
    assert_eq!(app.charges_seen().await.len(), 1, "a 4xx is never retried");
}

async fn a_pending_charge_answers_202_and_its_retry_gets_the_current_state(backend: Backend) {
    let app = crate::helpers::charging(backend, Charge::pending()).await;

    let first = app.pay("k-pending", &payment_body()).await;
    assert_eq!(first.status(), 202);
    let first = json(first).await;
    assert_eq!(first["estado"], "ENVIADA");
    assert!(first["gatewayRef"].as_str().is_some());

    // Nobody is working on it any more: the retry is answered, not told to wait.
    let retry = app.pay("k-pending", &payment_body()).await;
    assert_eq!(retry.status(), 202);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(json(retry).await["id"], first["id"]);
    assert_eq!(app.charges_seen().await.len(), 1);
}

async fn a_reset_connection_is_retried_with_the_same_key(backend: Backend) {
    let gateway = ResettingGateway::start().await;
    let app = Spawn::new(backend)
        .gateway_url(gateway.url.clone())
        .start()
        .await;

    let answer = app.pay("k-reset", &payment_body()).await;
    assert_eq!(answer.status(), 201);
    assert_eq!(json(answer).await["estado"], "COMPLETADA");
    let keys = gateway.keys.lock().expect("lock").clone();
    assert_eq!(keys.len(), 2, "the reset request and its retry");
    assert_eq!(keys[0], keys[1], "the retry carries the same gateway key");
}

trait Later {
    fn respond_later(self, delay: Duration) -> Delayed;
}

impl Later for Charge {
    fn respond_later(self, delay: Duration) -> Delayed {
        Delayed(self, delay)
    }
}

struct Delayed(Charge, Duration);

impl wiremock::Respond for Delayed {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        self.0.respond(request).set_delay(self.1)
    }
}

/// A gateway that reads the first charge request and resets the connection (RST) without
/// answering; later requests get a succeeded charge. wiremock cannot reset a connection.
struct ResettingGateway {
    url: String,
    keys: Arc<Mutex<Vec<String>>>,
}

impl ResettingGateway {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let keys = Arc::new(Mutex::new(Vec::new()));
        let seen = keys.clone();
        tokio::spawn(async move {
            let mut connections = 0;
            while let Ok((mut socket, _)) = listener.accept().await {
                connections += 1;
                let seen = seen.clone();
                let reset = connections == 1;
                tokio::spawn(async move {
                    let Some((head, body)) = read_request(&mut socket).await else {
                        return;
                    };
                    let key = head
                        .lines()
                        .find_map(|l| {
                            l.strip_prefix("idempotency-key: ")
                                .or_else(|| l.strip_prefix("Idempotency-Key: "))
                        })
                        .unwrap_or("")
                        .trim()
                        .to_owned();
                    seen.lock().expect("lock").push(key);
                    if reset {
                        let _ = socket.set_zero_linger();
                        drop(socket);
                        return;
                    }
                    let request: serde_json::Value =
                        serde_json::from_slice(&body).unwrap_or_default();
                    let charge = Charge::succeeded().about(&request).to_string();
                    let response = format!(
                        "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{charge}",
                        charge.len()
                    );
                    let _ = socket.write_all(response.as_bytes()).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        ResettingGateway { url, keys }
    }
}

async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_owned)
                })
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            while buffer.len() < end + 4 + length {
                let n = socket.read(&mut chunk).await.ok()?;
                if n == 0 {
                    break;
                }
                buffer.extend_from_slice(&chunk[..n]);
            }
            return Some((head, buffer[end + 4..].to_vec()));
        }
    }
}

/// A provider's decline code or charge id longer than pagos stores (`decline_code`: 100,
/// `gateway_ref`: 255). The write failed on PostgreSQL (a 500 to the merchant, then the
/// same failure at every retry and reconciliation pass: the payment `ENVIADA` for good). A
/// code is only a reason: cut, and the payment is declined with it. An id is what refunds
/// and look-ups name the charge by: one pagos cannot store is not believed — 202, handed
/// over, never 500 and never `COMPLETADA` on an id cut short.
async fn a_provider_string_longer_than_pagos_stores_never_fails_the_write(backend: Backend) {
    let app = crate::helpers::started(backend, &["--gateway-retries", "0"]).await;
    app.answer_charges(ChargeAbout(|charge| {
        charge["status"] = "declined".into();
        charge["declineCode"] = "d".repeat(300).into();
    }))
    .await;
    let declined = app.pay("k-long-code", &payment_body()).await;
    assert_eq!(declined.status(), 402);
    let problem = json(declined).await;
    assert_eq!(problem["declineCode"], "d".repeat(100), "{problem}");
    let id = problem["pago"]["id"].as_str().expect("id").to_owned();
    let stored = app.payment(&id).await;
    assert_eq!(stored.state, "FALLIDA");
    assert_eq!(
        stored.decline_code.as_deref(),
        Some("d".repeat(100).as_str())
    );

    app.gateway().reset().await;
    app.answer_charges(ChargeAbout(|charge| charge["id"] = "c".repeat(256).into()))
        .await;
    not_believed(&app, "k-long-id", "a charge id of 256 characters").await;
}

/// A payment whose charge, answered with an id pagos cannot store, is not believed: 202,
/// handed over, and so is its retry (never a 500 or 503); it stays `ENVIADA` with no
/// charge. The payment as stored, and its id.
async fn not_believed(
    app: &crate::helpers::TestApp,
    key: &str,
    case: &str,
) -> (pagos::entities::payment::Model, String) {
    let answer = app.pay(key, &payment_body()).await;
    let (status, body, id) = answered(answer).await;
    handed_over(status, &body, "ENVIADA", case);
    let again = app.pay(key, &payment_body()).await;
    assert_eq!(again.status(), 202, "{case}: a retry is answered");
    let stored = app.payment(&id).await;
    assert_eq!(stored.state, "ENVIADA", "{case}");
    assert!(stored.gateway_ref.is_none(), "{case}");
    (stored, id)
}

/// A NUL (`\u0000`) in what a provider says: PostgreSQL's text refuses it, so a decision
/// written with it failed there (a 503 to the merchant, then the same failure at every
/// retry and reconciliation pass: a charged payment `ENVIADA` for good, a declined one
/// never told). A code and an error's words keep it as U+FFFD; an id with it is not
/// believed (what refunds and look-ups name the charge by), as an id too long is.
async fn a_nul_in_what_the_provider_says_never_fails_the_write(backend: Backend) {
    let app = crate::helpers::started(backend, &["--gateway-retries", "0"]).await;
    app.answer_charges(ChargeAbout(|charge| {
        charge["status"] = "declined".into();
        charge["declineCode"] = "do_not\u{0}honor".into();
    }))
    .await;
    let declined = app.pay("k-nul-code", &payment_body()).await;
    assert_eq!(declined.status(), 402, "a decline whose code has a NUL");
    let problem = json(declined).await;
    assert_eq!(problem["declineCode"], "do_not\u{FFFD}honor", "{problem}");
    let id = problem["pago"]["id"].as_str().expect("id").to_owned();
    assert_eq!(app.payment(&id).await.state, "FALLIDA");

    app.gateway().reset().await;
    app.answer_charges(ChargeAbout(|charge| charge["id"] = "ch_\u{0}1".into()))
        .await;
    let (stored, id) = not_believed(&app, "k-nul-id", "a charge id with a NUL").await;
    // The reconciler's look-up finds the charge under the same id: still not believed,
    // and the pass writes why; a look-up that fails with a NUL in its words too.
    let charge = serde_json::json!({"data": [{
        "id": "ch_\u{0}1", "status": "succeeded", "amount": stored.amount,
        "currency": stored.currency, "reference": id,
    }]});
    for (lookup, case) in [
        (
            ResponseTemplate::new(200).set_body_json(charge),
            "a charge id with a NUL",
        ),
        (
            ResponseTemplate::new(503).set_body_json(serde_json::json!({"error": "down\u{0}"})),
            "a failed look-up whose words have a NUL",
        ),
    ] {
        app.gateway().reset().await;
        crate::helpers::mount_route(app.gateway(), "GET", "/v1/charges", lookup).await;
        let report = app.reconcile(&id).await;
        assert_eq!(report["errores"], 0, "{case}: {report}");
        assert_eq!(report["pendientes"], 1, "{case}: {report}");
        let stored = app.payment(&id).await;
        assert_eq!(stored.state, "ENVIADA", "{case}");
        assert!(stored.gateway_ref.is_none(), "{case}");
    }

    // A currency with a NUL is not the payment's: to review, never a write that fails; a
    // reference with one names no payment: not believed.
    app.gateway().reset().await;
    app.answer_charges(ChargeAbout(|charge| charge["currency"] = "COP\u{0}".into()))
        .await;
    let answer = app.pay("k-nul-currency", &payment_body()).await;
    assert_eq!(answer.status(), 202, "a charge whose currency has a NUL");
    let body = json(answer).await;
    assert_eq!(body["estado"], "REVISION_MANUAL", "{body}");
    app.gateway().reset().await;
    app.answer_charges(ChargeAbout(|charge| charge["reference"] = "x\u{0}".into()))
        .await;
    not_believed(
        &app,
        "k-nul-reference",
        "a charge whose reference has a NUL",
    )
    .await;

    app.gateway().reset().await;
    for (status, case, estado) in [
        (400, "a refusal", "FALLIDA"),
        (503, "an unknown outcome", "ENVIADA"),
    ] {
        app.gateway().reset().await;
        app.answer_charges(
            ResponseTemplate::new(status)
                .set_body_json(serde_json::json!({"error": "bad\u{0}thing"})),
        )
        .await;
        let key = format!("k-nul-body-{status}");
        let answer = app.pay(&key, &payment_body()).await;
        let code = answer.status().as_u16();
        let body = json(answer).await;
        let id = body["id"]
            .as_str()
            .or(body["pago"]["id"].as_str())
            .unwrap_or_else(|| panic!("{case} whose body has a NUL: {code} {body}"))
            .to_owned();
        assert_eq!(
            app.payment(&id).await.state,
            estado,
            "{case}: {code} {body}"
        );
        assert_ne!(code / 100, 5, "{case}: {body}");
    }
}

/// A refusal (4xx) whose body breaks off before its end: what the body said may have
/// been "this key was used with another request" (Stripe's `idempotency_error`, Mercado
/// Pago's key error): something may exist under the key. Before, the half body was read
/// as a plain refusal: the payment `FALLIDA`, 402, for a charge that may exist (the
/// refund `FALLIDO`). Now it is an unknown outcome, sent again with the same key.
async fn a_refusal_whose_body_breaks_off_is_an_unknown_outcome_for_every_provider(
    backend: Backend,
) {
    use crate::providers::{FakeProvider, Next};
    for provider in crate::providers::ALL {
        let case = format!("{provider:?}");
        let upstream = wiremock::MockServer::start().await;
        let fake = FakeProvider::new(provider);
        fake.mount(&upstream).await;
        let relay = BreakingRelay::start(upstream.uri()).await;
        let app = crate::helpers::Spawn::new(backend.clone())
            .provider(provider.gateway())
            .gateway_url(relay.url.clone())
            .flags(&["--gateway-retries", "1"])
            .start()
            .await;

        fake.next([Next::Refuse(400)]);
        let paid = app.pay("k-broken", &provider.payment(250_000)).await;
        let status = paid.status();
        let body = json(paid).await;
        assert_eq!(status, 201, "{case}: {body}");
        let payment = body["id"].as_str().expect("id").to_owned();
        assert_eq!(body["estado"], "COMPLETADA", "{case}");
        assert_eq!(relay.cut(), 1, "{case}: the refusal's body was cut");
        assert_eq!(fake.charges(), 1, "{case}: charged once");
        let keys: Vec<String> = fake.creates().iter().map(|m| m.key.clone()).collect();
        assert!(
            keys.len() == 2 && keys[0] == keys[1],
            "{case}: sent again with the same key: {keys:?}"
        );

        fake.next_refunds([Next::Refuse(400)]);
        let answer = crate::refunds::refund(
            &app,
            &payment,
            "k-broken-refund",
            &serde_json::json!({"monto": 50000}),
        )
        .await;
        let status = answer.status();
        let reembolso = json(answer).await;
        assert_eq!(status, 201, "{case}: {reembolso}");
        assert_eq!(reembolso["estado"], "COMPLETADO", "{case}");
        assert_eq!(relay.cut(), 2, "{case}: the refund refusal's body was cut");
        assert_eq!(fake.refunds_made(), 1, "{case}: refunded once");
        let keys = fake.refund_keys();
        assert!(
            keys.len() == 2 && keys[0] == keys[1],
            "{case}: one refund key: {keys:?}"
        );
    }
}

/// A relay in front of a provider's fake that cuts the body of the first 4xx answer to a
/// create request (a charge, then a refund) to its first half and drops the connection;
/// every other answer passes whole. wiremock cannot break a body off.
struct BreakingRelay {
    url: String,
    cut: Arc<Mutex<usize>>,
}

impl BreakingRelay {
    async fn start(upstream: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let cut = Arc::new(Mutex::new(0));
        let counted = cut.clone();
        let client = reqwest::Client::new();
        tokio::spawn(async move {
            // The kind of request ("charge" or "refund") whose refusal was cut already.
            let cut_kinds = Arc::new(Mutex::new(std::collections::HashSet::new()));
            while let Ok((mut socket, _)) = listener.accept().await {
                let (upstream, client) = (upstream.clone(), client.clone());
                let (counted, cut_kinds) = (counted.clone(), cut_kinds.clone());
                tokio::spawn(async move {
                    let Some((head, body)) = read_request(&mut socket).await else {
                        return;
                    };
                    let mut lines = head.lines();
                    let mut start = lines.next().unwrap_or("").split(' ');
                    let method = start.next().unwrap_or("GET").to_owned();
                    let path = start.next().unwrap_or("/").to_owned();
                    let mut request = client
                        .request(method.parse().expect("method"), format!("{upstream}{path}"));
                    for line in lines {
                        if let Some((name, value)) = line.split_once(':') {
                            let lower = name.trim().to_ascii_lowercase();
                            if !["host", "content-length", "connection"].contains(&lower.as_str()) {
                                request = request.header(name.trim(), value.trim());
                            }
                        }
                    }
                    let answer = request.body(body).send().await.expect("upstream");
                    let status = answer.status();
                    let kind = if path.contains("refund") {
                        "refund"
                    } else {
                        "charge"
                    };
                    let bytes = answer.bytes().await.expect("upstream body");
                    let first_refusal = method == "POST"
                        && status.is_client_error()
                        && cut_kinds.lock().expect("lock").insert(kind);
                    let sent = if first_refusal {
                        *counted.lock().expect("lock") += 1;
                        &bytes[..bytes.len() / 2]
                    } else {
                        &bytes[..]
                    };
                    let response = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        bytes.len()
                    );
                    let _ = socket.write_all(response.as_bytes()).await;
                    let _ = socket.write_all(sent).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        BreakingRelay { url, cut }
    }

    /// How many answers it cut.
    fn cut(&self) -> usize {
        *self.cut.lock().expect("lock")
    }
}

/// An answer's status, body and the `id` it names.
async fn answered(answer: reqwest::Response) -> (u16, serde_json::Value, String) {
    let status = answer.status().as_u16();
    let body = json(answer).await;
    let id = body["id"].as_str().expect("id").to_owned();
    (status, body, id)
}

/// A 202 that hands the payment (or refund) over to the reconciler in `estado`, with no
/// `gatewayRef`: nothing the gateway answered was believed.
fn handed_over(status: u16, body: &serde_json::Value, estado: &str, case: &str) {
    assert_eq!(status, 202, "{case}: {body}");
    assert_eq!(body["estado"], estado, "{case}");
    assert!(body["gatewayRef"].is_null(), "{case}: {body}");
}

/// Each provider, answering about another payment (or refund) or about none, with no retry
/// and with one.
fn foreign_answers() -> Vec<(crate::providers::Provider, Option<String>, &'static str)> {
    let mut cases = Vec::new();
    for provider in crate::providers::ALL {
        for naming in [Some(uuid::Uuid::new_v4().to_string()), None] {
            for retries in ["0", "1"] {
                cases.push((provider, naming.clone(), retries));
            }
        }
    }
    cases
}
