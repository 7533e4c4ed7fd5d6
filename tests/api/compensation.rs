//! Compensation of orphan charges (contract section 6): a charge that turns out to exist
//! for a payment answered `FALLIDA` is refunded in full through the refund saga
//! (`PAGOS_ORPHAN_CHARGES=refund`, the default), so the answer stays true; with `review`
//! the payment goes to on-call, who can resolve it `FALLIDA` with `reembolsar`.

use crate::helpers::{
    API_KEY, Backend, Charge, TestApp, json, listed, payment_body, post_webhook, resultado,
    timestamped_signature,
};
use crate::on_both_databases;
use crate::refunds::FakeRefunds;
use serde_json::{Value, json};
use wiremock::{Mock, ResponseTemplate};

on_both_databases!(
    a_charge_an_overruling_resolution_saw_pending_is_not_left_final_by_the_migrations,
    a_charge_found_after_a_fallida_answer_is_refunded_in_full_and_the_answer_stays,
    in_review_mode_the_payment_goes_to_on_call_who_resolves_it_failed_and_refunded,
    a_charge_reported_by_a_webhook_that_the_search_does_not_show_yet_is_refunded_by_the_resolution,
    a_partly_refunded_payment_resolved_fallida_with_reembolsar_refunds_what_is_left_of_the_charge,
    a_resolution_with_reembolsar_is_refused_and_writes_nothing_while_a_refund_of_the_charge_is_unsettled,
    a_charge_found_after_a_partly_refunded_payment_failed_is_compensated_for_what_is_left,
    a_compensation_refund_that_fails_sends_its_payment_to_review_with_its_event_and_why,
    a_compensation_refund_a_gateway_event_reports_failed_sends_its_payment_to_review,
    after_a_failed_compensation_on_call_resolves_fallida_with_reembolsar_and_the_charge_is_refunded_again,
    a_charge_in_another_currency_is_never_refunded_in_the_payments_and_goes_to_on_call,
    a_charge_on_call_kept_by_overruling_is_neither_refunded_nor_reviewed_again_by_a_later_report,
    a_charge_returned_outside_pagos_after_a_failed_compensation_is_not_refunded_again_by_a_later_report,
    a_charge_seen_only_in_the_providers_search_and_returned_outside_pagos_is_not_refunded_by_a_later_report,
    a_refund_counted_as_giving_back_a_failed_payments_charge_resolved_fallido_sends_the_payment_to_review,
    a_charge_reported_pending_when_on_call_overruled_is_not_refunded_by_its_later_events,
    the_migration_makes_earlier_resolution_records_final,
    reembolsar_is_refused_for_a_charge_an_earlier_resolution_settled_outside_pagos,
    after_a_counted_refund_failed_on_calls_reembolsar_refunds_what_it_had_counted,
);

pub const SECRET: &str = "whsec_test";
const ADMIN: &str = "adm_test_token_0001";
/// The declined fixture's charge id: the payment's `gateway_ref`.
const CHARGE_ID: &str = "ch_3Pq8sTQ2xY7wZ2";

async fn spawn(backend: Backend, mode: &'static str) -> (TestApp, FakeRefunds) {
    let app = crate::webhooks::spawn_with(backend, &["--orphan-charges", mode]).await;
    app.answer_charges(Charge::declined()).await;
    let fake = FakeRefunds::default();
    fake.mount_refunds(app.gateway()).await;
    (app, fake)
}

/// A payment answered 402 FALLIDA; its id.
async fn declined(app: &TestApp) -> String {
    let answer = app.pay("pay-1", &payment_body()).await;
    assert_eq!(answer.status(), 402);
    json(answer).await["pago"]["id"]
        .as_str()
        .expect("id")
        .to_owned()
}

fn succeeded(reference: &str) -> Value {
    json!({"id": CHARGE_ID, "status": "succeeded", "amount": 250000, "currency": "COP",
           "reference": reference, "declineCode": null})
}

async fn deliver(app: &TestApp, id: &str, sequence: i64, data: Value) -> String {
    deliver_event(app, id, "charge.updated", sequence, data).await
}

/// A signed reference-protocol event of `kind`, delivered; the word of the 200 answer.
pub async fn deliver_event(
    app: &TestApp,
    id: &str,
    kind: &str,
    sequence: i64,
    data: Value,
) -> String {
    let body =
        serde_json::to_vec(&json!({"id": id, "type": kind, "sequence": sequence, "data": data}))
            .expect("JSON");
    let signature = timestamped_signature(SECRET, chrono::Utc::now().timestamp(), &body);
    resultado(
        post_webhook(
            app,
            "/v1/webhooks/http",
            &[("Gateway-Signature", &signature)],
            &body,
        )
        .await,
    )
    .await
}

async fn admin(app: &TestApp, path: &str, body: Option<Value>) -> Value {
    let request = match body {
        Some(body) => app.http.post(app.url(path)).json(&body),
        None => app.http.get(app.url(path)),
    };
    let answer = request.bearer_auth(ADMIN).send().await.expect("sent");
    assert_eq!(answer.status(), 200);
    json(answer).await
}

/// With `--orphan-charges mode`, a payment answered FALLIDA whose charge a webhook then
/// reports succeeded (`outcome`, its answer): the app, the refunds fake and the payment.
async fn charge_found_after_a_decline(
    backend: Backend,
    mode: &'static str,
    outcome: &str,
) -> (TestApp, FakeRefunds, String) {
    let (app, fake) = spawn(backend, mode).await;
    let payment = declined(&app).await;
    assert_eq!(
        deliver(&app, "evt_1", 2, succeeded(&payment)).await,
        outcome
    );
    (app, fake, payment)
}

/// A payment answered 402 whose charge a webhook then reported succeeded (refund mode,
/// `charge_found_after_a_decline`), and whose compensation refund the provider refused
/// on the next pass: the payment went to REVISION_MANUAL (nothing told before). The app,
/// the refunds fake (refunding again) and the payment.
async fn compensation_refused(backend: Backend) -> (TestApp, FakeRefunds, String) {
    let (app, fake, payment) =
        charge_found_after_a_decline(backend, "refund", "reembolsando").await;
    assert!(revision_events(&app, &payment).await.is_empty());
    fake.refunding("failed");
    let report = admin(&app, "/admin/reconciliaciones", Some(json!({}))).await;
    assert_eq!(report["reembolsos"]["fallidos"], 1, "{report}");
    assert_eq!(fake.made().len(), 1);
    assert_eq!(app.payment(&payment).await.state, "REVISION_MANUAL");
    fake.refunding("succeeded");
    (app, fake, payment)
}

async fn a_charge_found_after_a_fallida_answer_is_refunded_in_full_and_the_answer_stays(
    backend: Backend,
) {
    let (app, fake, payment) =
        charge_found_after_a_decline(backend, "refund", "reembolsando").await;
    assert_eq!(app.payment(&payment).await.state, "FALLIDA");
    // The same charge reported again is not refunded twice.
    assert_eq!(
        deliver(&app, "evt_2", 3, succeeded(&payment)).await,
        "sin_cambios"
    );

    let report = admin(&app, "/admin/reconciliaciones", Some(json!({}))).await;
    assert_eq!(report["reembolsos"]["completados"], 1, "{report}");
    let made = fake.made();
    assert_eq!(made.len(), 1);
    assert_eq!(made[0]["charge"], CHARGE_ID);
    assert_eq!(made[0]["amount"], 250000);

    // What the merchant was told stays what its retries are told, and is true.
    let replay = app.pay("pay-1", &payment_body()).await;
    assert_eq!(replay.status(), 402);
    let detail = admin(&app, &format!("/admin/pagos/{payment}"), None).await;
    assert_eq!(detail["pago"]["estado"], "FALLIDA");
    assert_eq!(detail["reembolsos"][0]["estado"], "COMPLETADO");
    assert!(
        detail["reembolsos"][0]["motivo"]
            .as_str()
            .is_some_and(|m| m.contains(CHARGE_ID)),
        "{detail}"
    );
    let why = listed(&detail, "transiciones", "motivo")
        .into_iter()
        .find(|m| m.contains("refunded in full"));
    assert!(why.is_some_and(|w| w.contains("evt_1")), "{detail}");
}

async fn in_review_mode_the_payment_goes_to_on_call_who_resolves_it_failed_and_refunded(
    backend: Backend,
) {
    let (app, fake, payment) =
        charge_found_after_a_decline(backend, "review", "revision_manual").await;
    assert_eq!(app.payment(&payment).await.state, "REVISION_MANUAL");
    assert!(fake.made().is_empty(), "nothing refunded without on-call");

    // reembolsar only goes with FALLIDA.
    let wrong = app
        .resolve_as(
            ADMIN,
            &payment,
            &json!({"estado": "COMPLETADA", "reembolsar": true, "motivo": "x"}),
        )
        .await;
    assert_eq!(wrong.status(), 422);

    // The merchant was told the payment failed (its key answers 402, "no money taken",
    // and may already have charged again under a new key): COMPLETADA would make that
    // answer false for good. Refused, nothing changed, though the provider shows the
    // charge succeeded.
    let told = app
        .resolve_as(
            ADMIN,
            &payment,
            &json!({"estado": "COMPLETADA", "motivo": "the charge stands"}),
        )
        .await;
    assert_eq!(told.status(), 409);
    let problem = json(told).await;
    assert_eq!(
        problem["type"], "/problems/payment-told-failed",
        "{problem}"
    );
    assert_eq!(app.payment(&payment).await.state, "REVISION_MANUAL");
    assert_eq!(app.pay("pay-1", &payment_body()).await.status(), 402);

    // On-call asks what the provider charged: the one charge.
    let detail =
        resolve_fallida_refunding(&app, &payment, "ticket 77: the customer was charged").await;
    assert_eq!(detail["pago"]["estado"], "FALLIDA");
    assert_eq!(detail["reembolsos"][0]["estado"], "COMPLETADO", "{detail}");
    assert_eq!(detail["reembolsos"][0]["monto"], 250000);
    let made = fake.made();
    assert_eq!(made.len(), 1);
    assert_eq!(made[0]["charge"], CHARGE_ID);
    let trail = listed(&detail, "transiciones", "motivo");
    assert!(
        trail
            .iter()
            .any(|m| m.contains("ticket 77") && m.contains("refunded in full")),
        "{trail:?}"
    );

    // The merchant reads the refund and its event: what it is, never on-call's name or
    // note (before: its `motivo` was `compensation: resolved by admin (on-call): …
    // (ticket 77: …)`). On-call's own view of the refund keeps them.
    let refunds = json(
        app.get_as(API_KEY, &format!("/v1/pagos/{payment}/reembolsos"))
            .await,
    )
    .await;
    let events = json(app.get_as(API_KEY, "/v1/eventos?limite=50").await).await;
    let told = events["eventos"]
        .as_array()
        .expect("eventos")
        .iter()
        .find(|e| e["tipo"] == "reembolso.completado")
        .expect("reembolso.completado")
        .clone();
    for read in [&refunds["reembolsos"][0], &told["datos"]] {
        let motivo = read["motivo"].as_str().expect("motivo");
        assert!(motivo.contains(CHARGE_ID), "{read}");
        for private in ["ticket 77", "resolved by", "on-call"] {
            assert!(!motivo.contains(private), "{private} in {read}");
        }
    }
    let id = refunds["reembolsos"][0]["id"].as_str().expect("id");
    let refund_trail = crate::refund_resolution::trail(&app, id).await;
    assert!(
        refund_trail
            .iter()
            .any(|m| m.contains("ticket 77") && m.contains("resolved by admin")),
        "{refund_trail:?}"
    );
}

/// In review mode a webhook reports the charge; on-call resolves the payment FALLIDA with
/// `reembolsar` while the provider's search does not show the charge yet (searches lag
/// behind events). The charge the webhook reported is refunded all the same: a FALLIDA
/// answer with the customer's money still taken, and nothing left to find it, is what a
/// search-only resolution wrote.
async fn a_charge_reported_by_a_webhook_that_the_search_does_not_show_yet_is_refunded_by_the_resolution(
    backend: Backend,
) {
    let (app, fake, payment) =
        charge_found_after_a_decline(backend, "review", "revision_manual").await;
    assert_eq!(app.payment(&payment).await.state, "REVISION_MANUAL");
    Mock::given(wiremock::matchers::method("GET"))
        .and(wiremock::matchers::path("/v1/charges"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": []})))
        .mount(app.gateway())
        .await;
    let detail = admin(
        &app,
        &format!("/admin/pagos/{payment}/resolucion"),
        Some(json!({"estado": "FALLIDA", "reembolsar": true, "motivo": "ticket 78"})),
    )
    .await;
    assert_eq!(detail["pago"]["estado"], "FALLIDA");
    assert_eq!(detail["reembolsos"][0]["monto"], 250000, "{detail}");
    let made = fake.made();
    assert_eq!(made.len(), 1, "the reported charge refunded once");
    assert_eq!(made[0]["charge"], CHARGE_ID);
}

/// The succeeded fixture's charge id: a paid payment's `gateway_ref`.
const PAID_CHARGE_ID: &str = "ch_3Pq8sTQ2xY7wZ1";

fn paid_charge(reference: &str, status: &str) -> Value {
    let code = if status == "declined" {
        Value::from("card_declined")
    } else {
        Value::Null
    };
    json!({"id": PAID_CHARGE_ID, "status": status, "amount": 250000, "currency": "COP",
           "reference": reference, "declineCode": code})
}

/// A payment answered 201 COMPLETADA of 250000 COP, with a merchant refund of 100000
/// (answered `refund_status`, 201 COMPLETADO or 202 ENVIADO), then sent to
/// REVISION_MANUAL by a gateway event contradicting it: the app, the refunds fake, the
/// payment and the merchant's refund.
async fn partly_refunded_then_under_review(
    backend: Backend,
    refund_status: &'static str,
) -> (TestApp, FakeRefunds, String, Value) {
    let app = crate::webhooks::spawn_with(backend, &[]).await;
    app.answer_charges(Charge::succeeded()).await;
    let fake = FakeRefunds::default();
    fake.mount_refunds(app.gateway()).await;
    Mock::given(wiremock::matchers::method("GET"))
        .and(wiremock::matchers::path("/v1/charges"))
        .respond_with(PaidCharges)
        .mount(app.gateway())
        .await;
    let answer = app.pay("pay-1", &payment_body()).await;
    assert_eq!(answer.status(), 201);
    let payment = json(answer).await["id"].as_str().expect("id").to_owned();

    fake.refunding(refund_status);
    let answer = crate::refunds::refund(&app, &payment, "ref-40", &json!({"monto": 100000})).await;
    let expected = if refund_status == "succeeded" {
        201
    } else {
        202
    };
    assert_eq!(answer.status(), expected);
    let refund = json(answer).await;
    fake.refunding("succeeded");

    assert_eq!(
        deliver(&app, "evt_r1", 2, paid_charge(&payment, "declined")).await,
        "revision_manual"
    );
    assert_eq!(app.payment(&payment).await.state, "REVISION_MANUAL");
    (app, fake, payment, refund)
}

/// What the provider says it charged for a payment: the one succeeded charge.
struct PaidCharges;

impl wiremock::Respond for PaidCharges {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        let reference = crate::helpers::query_param(request, "reference");
        ResponseTemplate::new(200)
            .set_body_json(json!({"data": [paid_charge(&reference, "succeeded")]}))
    }
}

async fn a_partly_refunded_payment_resolved_fallida_with_reembolsar_refunds_what_is_left_of_the_charge(
    backend: Backend,
) {
    let (app, fake, payment, _) = partly_refunded_then_under_review(backend, "succeeded").await;
    let detail = admin(
        &app,
        &format!("/admin/pagos/{payment}/resolucion"),
        Some(json!({"estado": "FALLIDA", "reembolsar": true, "motivo": "ticket 78: the payment does not stand"})),
    )
    .await;
    assert_eq!(detail["pago"]["estado"], "FALLIDA");
    let refunds = detail["reembolsos"].as_array().expect("refunds");
    assert_eq!(refunds.len(), 2, "{detail}");
    assert_eq!(refunds[1]["monto"], 150000, "what is left of the charge");
    assert_eq!(refunds[1]["estado"], "COMPLETADO", "{detail}");
    let made = fake.made();
    assert_eq!(made.len(), 2, "the merchant's refund and the rest, no more");
    assert_eq!(made[1]["charge"], PAID_CHARGE_ID);
    assert_eq!(made[1]["amount"], 150000);
    assert!(
        listed(&detail, "transiciones", "motivo")
            .iter()
            .any(|m| m.contains("ticket 78") && m.contains("150000 COP of 250000 COP")),
        "{detail}"
    );
    let merchant_view = app
        .http
        .get(app.url(&format!("/v1/pagos/{payment}")))
        .bearer_auth(crate::helpers::API_KEY)
        .send()
        .await
        .expect("sent");
    assert_eq!(json(merchant_view).await["montoReembolsado"], 250000);
}

/// A refund counted as giving its charge back when on-call answered the payment FALLIDA
/// (here the merchant's refund, COMPLETADO), reported failed by the provider since and
/// resolved FALLIDO by on-call, gives nothing back: the payment, FALLIDA, goes back to
/// on-call in the same write, told that the customer may still be charged.
async fn a_refund_counted_as_giving_back_a_failed_payments_charge_resolved_fallido_sends_the_payment_to_review(
    backend: Backend,
) {
    counted_refund_resolved_fallido(backend).await;
}

/// The payment of `a_refund_counted_as_giving_back_…` back under review: on-call's
/// `FALLIDA` with `reembolsar` refunds what the failed refund had counted (before: the
/// compensation that had completed was taken for the charge's whole compensation, nothing
/// was refunded, the payment was FALLIDA again with the customer still charged 100000 COP,
/// and no resolution could refund it any more).
async fn after_a_counted_refund_failed_on_calls_reembolsar_refunds_what_it_had_counted(
    backend: Backend,
) {
    let (app, fake, payment) = counted_refund_resolved_fallido(backend).await;
    let detail = admin(
        &app,
        &format!("/admin/pagos/{payment}/resolucion"),
        Some(json!({"estado": "FALLIDA", "reembolsar": true, "motivo": "ticket 81"})),
    )
    .await;
    assert_eq!(detail["pago"]["estado"], "FALLIDA", "{detail}");
    let made = fake.made();
    assert_eq!(
        made.len(),
        3,
        "the merchant's refund, the rest, then what it had counted"
    );
    assert_eq!(made[2]["charge"], PAID_CHARGE_ID);
    assert_eq!(made[2]["amount"], 100000);
    let refunds = detail["reembolsos"].as_array().expect("refunds");
    assert!(
        refunds
            .iter()
            .any(|r| r["monto"] == 100000 && r["estado"] == "COMPLETADO"),
        "{detail}"
    );
    assert!(
        listed(&detail, "transiciones", "motivo")
            .iter()
            .any(|m| m.contains("ticket 81") && m.contains("100000 COP of 250000 COP")),
        "{detail}"
    );
}

/// `partly_refunded_then_under_review`, resolved `FALLIDA` with `reembolsar` (the merchant's
/// refund counted, the rest refunded), then the merchant's refund reported failed and
/// resolved `FALLIDO`: the payment is back under review. The app, the refunds fake and
/// the payment.
async fn counted_refund_resolved_fallido(backend: Backend) -> (TestApp, FakeRefunds, String) {
    let (app, fake, payment, merchants) =
        partly_refunded_then_under_review(backend, "succeeded").await;
    let detail = admin(
        &app,
        &format!("/admin/pagos/{payment}/resolucion"),
        Some(json!({"estado": "FALLIDA", "reembolsar": true, "motivo": "ticket 80"})),
    )
    .await;
    assert_eq!(detail["pago"]["estado"], "FALLIDA", "{detail}");
    let made = fake.made();
    assert_eq!(made.len(), 2, "the merchant's refund, then what was left");

    let mut failed = made[0].clone();
    failed["status"] = Value::from("failed");
    failed["failureCode"] = Value::from("expired_or_canceled_card");
    let said = deliver_event(&app, "evt_re_back", "refund.updated", 5, failed).await;
    let id = merchants["id"].as_str().expect("id");
    let refund = json(app.get_as(API_KEY, &format!("/v1/reembolsos/{id}")).await).await;
    assert_eq!(refund["estado"], "REVISION_MANUAL", "{said}: {refund}");
    assert_eq!(app.payment(&payment).await.state, "FALLIDA");
    let told_before = revision_events(&app, &payment).await.len();

    admin(
        &app,
        &format!("/admin/reembolsos/{id}/resolucion"),
        Some(
            json!({"estado": "FALLIDO", "motivo": "ticket 80: the card was closed",
                    "contraProveedor": "its event said failed; its search still says succeeded"}),
        ),
    )
    .await;
    assert_eq!(app.payment(&payment).await.state, "REVISION_MANUAL");
    assert_eq!(
        revision_events(&app, &payment).await.len(),
        told_before + 1,
        "the merchant is told pago.revision_manual"
    );
    let detail = admin(&app, &format!("/admin/pagos/{payment}"), None).await;
    assert!(
        listed(&detail, "transiciones", "motivo")
            .iter()
            .any(|m| m.contains(id)
                && m.contains(PAID_CHARGE_ID)
                && m.contains("may still be charged")),
        "{detail}"
    );
    assert_eq!(fake.made().len(), 2, "nothing refunded by itself");
    (app, fake, payment)
}

async fn a_resolution_with_reembolsar_is_refused_and_writes_nothing_while_a_refund_of_the_charge_is_unsettled(
    backend: Backend,
) {
    let (app, fake, payment, refund) = partly_refunded_then_under_review(backend, "pending").await;
    assert_eq!(refund["estado"], "ENVIADO");
    let before = admin(&app, &format!("/admin/pagos/{payment}"), None).await;

    let answer = app
        .resolve_as(
            ADMIN,
            &payment,
            &json!({"estado": "FALLIDA", "reembolsar": true, "motivo": "ticket 79"}),
        )
        .await;
    let problem = crate::helpers::problem(answer, 409, "an unsettled refund of the charge").await;
    assert_eq!(problem["type"], "/problems/payment-not-refundable");
    assert_eq!(problem["cargo"], PAID_CHARGE_ID);
    assert_eq!(problem["reembolsoId"], refund["id"]);
    assert!(
        crate::helpers::text_has(&problem, "detail", "ENVIADO"),
        "{problem}"
    );
    assert_eq!(app.payment(&payment).await.state, "REVISION_MANUAL");
    assert_eq!(fake.made().len(), 1, "no refund sent");
    let after = admin(&app, &format!("/admin/pagos/{payment}"), None).await;
    assert_eq!(
        after["transiciones"], before["transiciones"],
        "nothing written"
    );
    assert_eq!(after["reembolsos"], before["reembolsos"], "nothing written");
}

async fn a_charge_found_after_a_partly_refunded_payment_failed_is_compensated_for_what_is_left(
    backend: Backend,
) {
    let (app, fake, payment, _) = partly_refunded_then_under_review(backend, "succeeded").await;
    // The provider shows the charge declined, as its event said: on-call settles it failed
    // without refunding; the charge is reported succeeded later.
    Mock::given(wiremock::matchers::method("GET"))
        .and(wiremock::matchers::path("/v1/charges"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"data": [paid_charge(&payment, "declined")]})),
        )
        .with_priority(1)
        .mount(app.gateway())
        .await;
    let detail = admin(
        &app,
        &format!("/admin/pagos/{payment}/resolucion"),
        Some(json!({"estado": "FALLIDA", "motivo": "ticket 80: declined at the provider"})),
    )
    .await;
    assert_eq!(detail["pago"]["estado"], "FALLIDA");
    assert_eq!(
        deliver(&app, "evt_r2", 3, paid_charge(&payment, "succeeded")).await,
        "reembolsando"
    );
    assert_eq!(app.payment(&payment).await.state, "FALLIDA");
    let report = admin(&app, "/admin/reconciliaciones", Some(json!({}))).await;
    assert_eq!(report["reembolsos"]["completados"], 1, "{report}");
    let made = fake.made();
    assert_eq!(made.len(), 2);
    assert_eq!(made[1]["amount"], 150000, "what is left of the charge");
}

/// The `pago.revision_manual` events told about payment `id`: their bodies.
pub(crate) async fn revision_events(app: &TestApp, id: &str) -> Vec<Value> {
    use pagos::entities::event;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    event::Entity::find()
        .filter(event::Column::SubjectId.eq(uuid::Uuid::parse_str(id).expect("uuid")))
        .filter(event::Column::EventType.eq(event::EventType::PagoRevisionManual))
        .all(&app.db)
        .await
        .expect("events")
        .into_iter()
        .map(|e| serde_json::from_str(&e.body).expect("JSON"))
        .collect()
}

/// The compensation of an orphan charge fails at the provider: the customer is still
/// charged under a FALLIDA answer, and pagos will not try again by itself. The payment
/// goes to REVISION_MANUAL in the refund's own write, with its event and an audit row
/// that says why, so on-call finds it in the list of payments under review.
async fn a_compensation_refund_that_fails_sends_its_payment_to_review_with_its_event_and_why(
    backend: Backend,
) {
    let (app, _fake, payment) = compensation_refused(backend).await;

    let detail = admin(&app, &format!("/admin/pagos/{payment}"), None).await;
    assert_eq!(detail["pago"]["estado"], "REVISION_MANUAL");
    let refund = &detail["reembolsos"][0];
    assert_eq!(refund["estado"], "FALLIDO", "{detail}");
    let refund_id = refund["id"].as_str().expect("refund id");
    let last = detail["transiciones"]
        .as_array()
        .and_then(|t| t.last())
        .expect("a transition");
    assert_eq!(last["desde"], "FALLIDA", "{detail}");
    assert_eq!(last["hacia"], "REVISION_MANUAL", "{detail}");
    let why = last["motivo"].as_str().expect("motivo");
    for said in [
        CHARGE_ID,
        refund_id,
        "expired_or_canceled_card",
        "still charged",
    ] {
        assert!(why.contains(said), "{said} in {why}");
    }

    let told = revision_events(&app, &payment).await;
    assert_eq!(told.len(), 1, "one pago.revision_manual");
    assert_eq!(told[0]["datos"]["estado"], "REVISION_MANUAL", "{}", told[0]);
    assert_eq!(told[0]["datos"]["id"], payment.as_str());

    let under_review = admin(&app, "/admin/pagos?estado=REVISION_MANUAL", None).await;
    assert!(
        under_review["pagos"]
            .as_array()
            .expect("pagos")
            .iter()
            .any(|p| p["id"] == payment.as_str()),
        "on-call's list shows it: {under_review}"
    );
    // The merchant's retries still replay the first answer; a read shows the review.
    assert_eq!(app.pay("pay-1", &payment_body()).await.status(), 402);
}

/// The same, told by the provider's event about the refund (applied in the event's own
/// transaction) after the send left it pending.
async fn a_compensation_refund_a_gateway_event_reports_failed_sends_its_payment_to_review(
    backend: Backend,
) {
    let (app, fake, payment) =
        charge_found_after_a_decline(backend, "refund", "reembolsando").await;
    fake.refunding("pending");
    let report = admin(&app, "/admin/reconciliaciones", Some(json!({}))).await;
    assert_eq!(report["reembolsos"]["reenviados"], 1, "{report}");
    let made = fake.made();
    assert_eq!(made.len(), 1);
    assert_eq!(app.payment(&payment).await.state, "FALLIDA");

    let mut failed = made[0].clone();
    failed["status"] = Value::from("failed");
    failed["failureCode"] = Value::from("expired_or_canceled_card");
    assert_eq!(
        deliver_event(&app, "evt_re_1", "refund.updated", 1, failed).await,
        "aplicado"
    );
    assert_eq!(app.payment(&payment).await.state, "REVISION_MANUAL");
    let told = revision_events(&app, &payment).await;
    assert_eq!(told.len(), 1, "one pago.revision_manual");
    let detail = admin(&app, &format!("/admin/pagos/{payment}"), None).await;
    assert_eq!(detail["reembolsos"][0]["estado"], "FALLIDO", "{detail}");
    assert!(
        listed(&detail, "transiciones", "motivo")
            .iter()
            .any(|m| m.contains(CHARGE_ID) && m.contains("still charged")),
        "{detail}"
    );
}

/// Once a compensation refund failed and took its payment to review, on-call reads why
/// (the provider can refund now) and resolves it FALLIDA with `reembolsar`: a new refund
/// of the charge, with a key of its own, gives the money back; the failed one is never
/// sent again.
async fn after_a_failed_compensation_on_call_resolves_fallida_with_reembolsar_and_the_charge_is_refunded_again(
    backend: Backend,
) {
    let (app, fake, payment) = compensation_refused(backend).await;
    let detail =
        resolve_fallida_refunding(&app, &payment, "ticket 81: the provider can refund now").await;
    assert_eq!(detail["pago"]["estado"], "FALLIDA", "{detail}");
    let refunds = detail["reembolsos"].as_array().expect("refunds");
    assert_eq!(refunds.len(), 2, "{detail}");
    assert_eq!(refunds[0]["estado"], "FALLIDO");
    assert_eq!(refunds[1]["estado"], "COMPLETADO", "{detail}");
    assert_eq!(refunds[1]["monto"], 250000);
    let made = fake.made();
    assert_eq!(made.len(), 2, "the failed refund and the new one, no more");
    assert_eq!(made[1]["charge"], CHARGE_ID);
    assert_eq!(made[1]["amount"], 250000);
    assert_eq!(made[1]["reference"], refunds[1]["id"]);
    assert_ne!(
        made[1]["reference"], made[0]["reference"],
        "a refund of its own"
    );
    assert!(
        listed(&detail, "transiciones", "motivo")
            .iter()
            .any(|m| m.contains("ticket 81")
                && m.contains("refunded again")
                && m.contains(refunds[0]["id"].as_str().expect("id"))),
        "{detail}"
    );
    assert_eq!(revision_events(&app, &payment).await.len(), 1);

    // The charge reported once more changes nothing: its compensation gave it back, and
    // the resolution's record of it is final (stale).
    assert_eq!(
        deliver(&app, "evt_3", 4, succeeded(&payment)).await,
        "obsoleto"
    );
    assert_eq!(app.payment(&payment).await.state, "FALLIDA");
    assert_eq!(fake.made().len(), 2);
}

/// The provider's search shows `payment`'s one charge, succeeded.
async fn provider_shows_its_charge(app: &TestApp, payment: &str) {
    Mock::given(wiremock::matchers::method("GET"))
        .and(wiremock::matchers::path("/v1/charges"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"data": [succeeded(payment)]})),
        )
        .mount(app.gateway())
        .await;
}

/// On-call resolves `payment` FALLIDA with `reembolsar`, the provider showing its one
/// charge, succeeded; the resolution's answer.
async fn resolve_fallida_refunding(app: &TestApp, payment: &str, motivo: &str) -> Value {
    provider_shows_its_charge(app, payment).await;
    admin(
        app,
        &format!("/admin/pagos/{payment}/resolucion"),
        Some(json!({"estado": "FALLIDA", "reembolsar": true, "motivo": motivo})),
    )
    .await
}

/// A charge for a FALLIDA payment, in another currency than the payment's. pagos refunds
/// a payment's charges in the payment's currency: a compensation of this one would ask
/// the provider for 250,000 COP back on a USD charge — refused every time (its failure,
/// then on-call's `reembolsar`, then again). It is not compensated: the payment goes to
/// on-call with the real cause (the currency), and on-call's `reembolsar` is refused
/// (409, saying why), writing nothing.
async fn a_charge_in_another_currency_is_never_refunded_in_the_payments_and_goes_to_on_call(
    backend: Backend,
) {
    let (app, fake) = spawn(backend, "refund").await;
    let payment = declined(&app).await;
    let mut usd = succeeded(&payment);
    usd["amount"] = 1000.into();
    usd["currency"] = "USD".into();
    deliver(&app, "evt_usd", 2, usd.clone()).await;
    let detail = admin(&app, &format!("/admin/pagos/{payment}"), None).await;
    assert_eq!(detail["pago"]["estado"], "REVISION_MANUAL", "{detail}");
    assert_eq!(
        detail["reembolsos"].as_array().map_or(0, Vec::len),
        0,
        "nothing refunded: {detail}"
    );
    let why = listed(&detail, "transiciones", "motivo")
        .into_iter()
        .last()
        .expect("a transition");
    assert!(why.contains("USD"), "{why}");

    // On-call asks to refund it: refused, saying why; nothing written, nothing sent.
    Mock::given(wiremock::matchers::method("GET"))
        .and(wiremock::matchers::path("/v1/charges"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [usd]})))
        .mount(app.gateway())
        .await;
    let refused = app
        .resolve_as(
            ADMIN,
            &payment,
            &json!({"estado": "FALLIDA", "motivo": "refund it", "reembolsar": true}),
        )
        .await;
    assert_eq!(refused.status(), 409);
    let problem = json(refused).await;
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("USD")),
        "{problem}"
    );
    assert_eq!(app.payment(&payment).await.state, "REVISION_MANUAL");
    assert!(fake.made().is_empty(), "no refund asked of the provider");
}

/// PostgreSQL: a gateway event about a compensation refund takes its locks in the order
/// every other writer of the two rows does, the payment, then the refund (a compensation
/// that fails moves its payment in the refund's write, which locks the payment first).
/// Before, the event locked the refund and then waited for the payment: against a
/// reconciliation pass writing the same refund (the payment held, the refund awaited),
/// a deadlock. Here the test holds the payment; while the event waits for it, the refund
/// must still be free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_compensation_refund_event_locks_its_payment_before_its_refund() {
    use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};
    let Some(backend) = crate::helpers::Backend::postgres() else {
        return;
    };
    let (app, fake, payment) =
        charge_found_after_a_decline(backend, "refund", "reembolsando").await;
    fake.refunding("pending");
    let report = admin(&app, "/admin/reconciliaciones", Some(json!({}))).await;
    assert_eq!(report["reembolsos"]["reenviados"], 1, "{report}");
    let mut failed = fake.made()[0].clone();
    let refund = failed["reference"].as_str().expect("reference").to_owned();
    failed["status"] = Value::from("failed");
    failed["failureCode"] = Value::from("expired_or_canceled_card");

    let held = app.db.begin().await.expect("begin");
    held.execute_raw(Statement::from_string(
        DbBackend::Postgres,
        format!("SELECT 1 FROM payments WHERE id = '{payment}' FOR UPDATE"),
    ))
    .await
    .expect("the payment held");
    let check = async {
        // Until the event's transaction waits for a lock (the payment's, held here).
        for _ in 0..200 {
            let waiting = app
                .db
                .query_one_raw(Statement::from_string(
                    DbBackend::Postgres,
                    "SELECT count(*) AS n FROM pg_stat_activity \
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                ))
                .await
                .expect("pg_stat_activity")
                .and_then(|row| row.try_get::<i64>("", "n").ok())
                .unwrap_or(0);
            if waiting > 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        let probe = app.db.begin().await.expect("begin");
        let refund_free = probe
            .execute_raw(Statement::from_string(
                DbBackend::Postgres,
                format!("SELECT 1 FROM refunds WHERE id = '{refund}' FOR UPDATE NOWAIT"),
            ))
            .await
            .map(|_| ());
        probe.rollback().await.ok();
        held.commit().await.expect("released");
        refund_free
    };
    let (word, refund_free) = tokio::join!(
        deliver_event(&app, "evt_re_lock", "refund.updated", 1, failed),
        check
    );
    assert!(
        refund_free.is_ok(),
        "the event locked the refund before its payment: {refund_free:?}"
    );
    assert_eq!(word, "aplicado");
    assert_eq!(app.payment(&payment).await.state, "REVISION_MANUAL");
}

/// On-call settles `payment` (under review, its charge succeeded at the provider) `FALLIDA`
/// overruling the provider with `why`; then the provider reports that charge succeeded
/// again (a later update of it): nothing new, nothing done. Before: the report was taken
/// for a new orphan charge, the payment sent to review again (`review`) or the charge
/// refunded in full by a compensation (`refund`).
async fn overruled_then_reported_again(
    app: &TestApp,
    fake: &FakeRefunds,
    payment: &str,
    why: &str,
) {
    provider_shows_its_charge(app, payment).await;
    let made_before = fake.made().len();
    let done = admin(
        app,
        &format!("/admin/pagos/{payment}/resolucion"),
        Some(json!({"estado": "FALLIDA", "motivo": "INC-9", "contraProveedor": why})),
    )
    .await;
    assert_eq!(done["pago"]["estado"], "FALLIDA", "{done}");
    reported_again_long_after(app, payment, succeeded(payment), || {
        fake.made().len() == made_before
    })
    .await;
    assert_eq!(app.payment(payment).await.state, "FALLIDA");
    assert_eq!(app.pay("pay-1", &payment_body()).await.status(), 402);
}

/// The provider reports `charge`, a succeeded charge of `payment` (which on-call resolved
/// `FALLIDA` knowing of it), again, past the reports' retention (the reaper's purge runs
/// first): it changes nothing, neither refunding it (`nothing_refunded` holds) nor
/// sending the payment to review again.
async fn reported_again_long_after(
    app: &TestApp,
    payment: &str,
    charge: Value,
    nothing_refunded: impl Fn() -> bool,
) {
    let told_before = revision_events(app, payment).await.len();
    let a_week_later = pagos::db::now() + chrono::TimeDelta::days(8);
    pagos::webhooks::purge_charge_reports(&app.db, a_week_later, 1000)
        .await
        .expect("purge");
    // Stale: the resolution's record of the charge is final.
    assert_eq!(deliver(app, "evt_later", 100, charge).await, "obsoleto");
    assert_eq!(app.payment(payment).await.state, "FALLIDA");
    assert!(nothing_refunded(), "nothing refunded");
    assert_eq!(
        revision_events(app, payment).await.len(),
        told_before,
        "no pago.revision_manual again"
    );
}

/// An app with `--orphan-charges mode` that gives a payment up after 1 s, its refunds
/// fake, and payment `key` under review there (`payment_under_review`), its charge
/// succeeded at the provider: the app, the refunds fake, the payment, its gateway and the
/// charge's report as a reference-protocol event carries it, with `status`.
async fn given_up_and_charged(
    backend: Backend,
    key: &str,
    mode: &str,
) -> GivenUp<impl Fn(&str) -> Value> {
    let given_up = given_up(backend, key, mode).await;
    given_up.3.settle(&given_up.2, "succeeded");
    given_up
}

/// The app, the refunds fake, the payment, its gateway and its charge's report.
type GivenUp<R> = (TestApp, FakeRefunds, String, crate::helpers::FakeGateway, R);

/// As `given_up_and_charged`, the charge still pending at the provider.
async fn given_up(backend: Backend, key: &str, mode: &str) -> GivenUp<impl Fn(&str) -> Value> {
    let app = crate::helpers::started(
        backend,
        &[
            "--webhook-secret",
            SECRET,
            "--give-up-after",
            "1s",
            "--stale-after",
            "1s",
            "--orphan-charges",
            mode,
        ],
    )
    .await;
    let refunds = FakeRefunds::default();
    refunds.mount_refunds(app.gateway()).await;
    let (payment, fake) = crate::operators::payment_under_review(&app, key).await;
    let charge = fake.charge_ids(&payment).remove(0);
    let reference = payment.clone();
    let report = move |status: &str| {
        json!({"id": charge, "status": status, "amount": 250000, "currency": "COP",
               "reference": reference, "declineCode": null})
    };
    (app, refunds, payment, fake, report)
}

/// `payment` has no refund, not even one registered and never sent (`context` says when).
async fn no_refund_of(app: &TestApp, payment: &str, context: &str) {
    let listed = json(
        app.get_as(API_KEY, &format!("/v1/pagos/{payment}/reembolsos"))
            .await,
    )
    .await;
    assert_eq!(listed["reembolsos"], json!([]), "{context}: {listed}");
}

/// On-call resolves `payment` `FALLIDA` overruling the provider: the money went back by
/// bank transfer (runbook case 9).
async fn returned_by_bank_transfer(app: &TestApp, payment: &str) {
    let body = json!({"estado": "FALLIDA", "motivo": "INC-12",
                      "contraProveedor": "returned by bank transfer TR-991"});
    let done = app
        .resolved_as(crate::helpers::ADMIN_TOKEN, payment, &body)
        .await;
    assert_eq!(done["pago"]["estado"], "FALLIDA", "{done}");
}

/// Case 9 of the runbook for a payment no webhook had reported: given up on while the
/// provider could not be asked, its charge then seen succeeded only in the provider's
/// search, the money returned by bank transfer, and on-call saying so overruling the
/// provider. The provider's later report of the charge must not refund it a second time.
async fn a_charge_seen_only_in_the_providers_search_and_returned_outside_pagos_is_not_refunded_by_a_later_report(
    backend: Backend,
) {
    let (app, refunds, payment, _, report) =
        given_up_and_charged(backend, "k-returned", "refund").await;
    returned_by_bank_transfer(&app, &payment).await;

    // On-call's page of the payment shows the charge as the resolution recorded it.
    let charge = report("succeeded")["id"].as_str().expect("id").to_owned();
    let session = crate::console::log_in(&app, crate::helpers::ADMIN_TOKEN).await;
    let page = crate::console::get_page(
        &app,
        Some(&crate::console::session_cookie(&session)),
        &format!("/consola/pagos/{payment}"),
    )
    .await
    .text()
    .await
    .expect("page");
    assert!(
        page.contains(&format!("<code>{charge}</code>"))
            && page.contains(
                "recorded succeeded by on-call's FALLIDA resolution, which overruled the provider: settled outside pagos"
            ),
        "{page}"
    );

    reported_again_long_after(&app, &payment, report("succeeded"), || {
        refunds.made().is_empty()
    })
    .await;
    no_refund_of(&app, &payment, "").await;
}

/// Case 9 again, for a charge the provider's webhooks had reported `pending` when on-call
/// resolved (an asynchronous payment method), whose events then go on: a late `pending`
/// one, then `succeeded`. The resolution's record is final: neither moves it, nothing is
/// refunded, the payment is not reopened. Before: the resolution left the `pending`
/// report as it was (or a late `pending` event overtook its record), and the `succeeded`
/// event was taken for a new orphan charge and refunded in full — a second refund of
/// money returned by bank transfer.
async fn a_charge_reported_pending_when_on_call_overruled_is_not_refunded_by_its_later_events(
    backend: Backend,
) {
    let (app, refunds, payment, _, report) =
        given_up_and_charged(backend, "k-async", "refund").await;
    deliver(&app, "evt_pending_1", 1, report("pending")).await;
    returned_by_bank_transfer(&app, &payment).await;
    let told_before = revision_events(&app, &payment).await.len();

    let late = deliver(&app, "evt_pending_2", 2, report("pending")).await;
    let then = deliver(&app, "evt_succeeded", 3, report("succeeded")).await;
    assert_eq!(
        app.payment(&payment).await.state,
        "FALLIDA",
        "{late}, {then}"
    );
    no_refund_of(&app, &payment, &format!("{late}, {then}")).await;
    assert!(refunds.made().is_empty(), "nothing refunded");
    assert_eq!(revision_events(&app, &payment).await.len(), told_before);
    assert_eq!([late, then], ["obsoleto", "obsoleto"]);
    reported_again_long_after(&app, &payment, report("succeeded"), || {
        refunds.made().is_empty()
    })
    .await;
}

/// Case 5b of the runbook: a charge found after a 402, kept by agreement with the merchant
/// (`FALLIDA` overruling the provider, `COMPLETADA` being refused), in review mode.
async fn a_charge_on_call_kept_by_overruling_is_neither_refunded_nor_reviewed_again_by_a_later_report(
    backend: Backend,
) {
    let (app, fake, payment) =
        charge_found_after_a_decline(backend, "review", "revision_manual").await;
    overruled_then_reported_again(
        &app,
        &fake,
        &payment,
        "ticket 9: kept by agreement with the merchant",
    )
    .await;
}

/// Case 9 of the runbook: the compensation refund failed, the money went back by bank
/// transfer, on-call says so overruling the provider (which still shows the charge
/// succeeded). A later report of the charge must not refund it a second time.
async fn a_charge_returned_outside_pagos_after_a_failed_compensation_is_not_refunded_again_by_a_later_report(
    backend: Backend,
) {
    let (app, fake, payment) = compensation_refused(backend).await;
    overruled_then_reported_again(
        &app,
        &fake,
        &payment,
        "returned by bank transfer TR-991; the provider still shows the charge succeeded",
    )
    .await;
}

/// Migration `m20261214_000028`: what an older pagos left of a resolution that overruled
/// the provider — its charge's `pending` report kept, then moved by a late `pending`
/// event — becomes the final record pagos writes now, so the charge's `succeeded` event
/// changes nothing; a record at sequence 0 of another resolution becomes final; an
/// event's report stays as it is.
async fn the_migration_makes_earlier_resolution_records_final(backend: Backend) {
    use migration::{Migrator, MigratorTrait};
    use pagos::entities::webhook_charge::{self as charges, ReportedStatus};
    use sea_orm::{ActiveValue::Set, ConnectionTrait, EntityTrait};
    let (app, refunds, payment, _, report) =
        given_up_and_charged(backend, "k-older", "refund").await;
    deliver(&app, "evt_pending_1", 1, report("pending")).await;
    returned_by_bank_transfer(&app, &payment).await;

    // As an older pagos left the database.
    const MIGRATION: &str = "m20261214_000028_resolution_reports_final";
    for sql in [
        r#"UPDATE "webhook_charges" SET "status" = 'pending', "last_sequence" = 2, "last_event_id" = 'evt_pending_2'"#.to_owned(),
        format!(r#"DELETE FROM "seaql_migrations" WHERE "version" = '{MIGRATION}'"#),
    ] {
        app.db.execute_unprepared(&sql).await.expect("older");
    }
    let at = pagos::db::now();
    for (id, sequence, event) in [("ch_resolved", 0, "resolution"), ("ch_evented", 7, "evt_7")] {
        charges::Entity::insert(charges::ActiveModel {
            source: Set("http".to_owned()),
            charge_id: Set(id.to_owned()),
            reference: Set(uuid::Uuid::now_v7().to_string()),
            payment_id: Set(None),
            status: Set(ReportedStatus::Succeeded),
            amount: Set(250000),
            currency: Set("COP".to_owned()),
            decline_code: Set(None),
            last_sequence: Set(sequence),
            last_event_id: Set(event.to_owned()),
            first_seen_at: Set(at),
            updated_at: Set(at),
        })
        .exec_without_returning(&app.db)
        .await
        .expect("seeded");
    }

    Migrator::up(&app.db, None).await.expect("migrated");
    let sequence = |id: String| {
        let db = app.db.clone();
        async move {
            charges::Entity::find_by_id(("http".to_owned(), id))
                .one(&db)
                .await
                .expect("read")
                .expect("kept")
                .last_sequence
        }
    };
    let final_sequence = pagos::webhooks::consumer::RESOLVED_SEQUENCE;
    assert_eq!(sequence("ch_resolved".into()).await, final_sequence);
    assert_eq!(sequence("ch_evented".into()).await, 7);
    let charge = report("succeeded")["id"].as_str().expect("id").to_owned();
    assert_eq!(sequence(charge).await, final_sequence);

    assert_eq!(
        deliver(&app, "evt_succeeded", 3, report("succeeded")).await,
        "obsoleto"
    );
    assert_eq!(app.payment(&payment).await.state, "FALLIDA");
    no_refund_of(&app, &payment, "").await;
    assert!(refunds.made().is_empty());
}

/// Migration `m20261214_000028`'s first version matched a charge's id anywhere in an
/// overruling resolution's audit row, which lists every charge the provider showed: a
/// charge shown pending (a voucher not paid yet) was made final as succeeded, settled
/// outside pagos, and once the customer paid it, its `succeeded` event was stale — the
/// customer charged, the merchant told 402, nothing refunded. Here the database is as that
/// version left it; the migrations that run now (m28 as it is, m29) give the report back as
/// the provider showed it, and the charge's `succeeded` event is an orphan charge,
/// refunded.
async fn a_charge_an_overruling_resolution_saw_pending_is_not_left_final_by_the_migrations(
    backend: Backend,
) {
    use migration::{Migrator, MigratorTrait};
    use pagos::entities::webhook_charge::{self as charges, ReportedStatus};
    use sea_orm::{ConnectionTrait, EntityTrait};
    let (app, _refunds, payment, fake, report) = given_up(backend, "k-voucher", "refund").await;
    let charge = report("pending")["id"].as_str().expect("id").to_owned();
    assert_eq!(
        deliver(&app, "evt_pending", 1, report("pending")).await,
        "sin_cambios"
    );
    // The provider shows the charge pending; on-call overrules it.
    returned_by_bank_transfer(&app, &payment).await;

    // As the first version of m28 left it.
    for sql in [
        format!(
            r#"UPDATE "webhook_charges" SET "status" = 'succeeded', "last_sequence" = {}, "last_event_id" = 'resolution-overruled' WHERE "charge_id" = '{charge}'"#,
            i64::MAX
        ),
        r#"DELETE FROM "seaql_migrations" WHERE "version" IN ('m20261214_000028_resolution_reports_final', 'm20261215_000029_overruled_reports_shown_otherwise')"#.to_owned(),
    ] {
        app.db.execute_unprepared(&sql).await.expect("older");
    }
    Migrator::up(&app.db, None).await.expect("migrated");
    let kept = charges::Entity::find_by_id(("http".to_owned(), charge.clone()))
        .one(&app.db)
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(kept.status, ReportedStatus::Pending, "{kept:?}");
    assert_eq!(kept.last_sequence, 0, "{kept:?}");
    // Whatever its age, the reaper leaves it: it is on on-call's list to check by hand
    // after the upgrade (runbooks/refunds.md), and an older mark's dates are the
    // resolution's, long past the reports' retention.
    let a_month_later = pagos::db::now() + chrono::TimeDelta::days(30);
    pagos::webhooks::purge_charge_reports(&app.db, a_month_later, 1000)
        .await
        .expect("purge");
    assert!(
        charges::Entity::find_by_id(("http".to_owned(), charge.clone()))
            .one(&app.db)
            .await
            .expect("read")
            .is_some(),
        "still listed for on-call"
    );

    // The customer pays the voucher: an orphan charge of a failed payment, refunded.
    fake.settle(&payment, "succeeded");
    assert_eq!(
        deliver(&app, "evt_paid", 2, report("succeeded")).await,
        "reembolsando"
    );
    assert_eq!(app.payment(&payment).await.state, "FALLIDA");
}

/// A charge an earlier resolution settled outside pagos (overruling the provider: money
/// returned by bank transfer), its payment back under review for a second charge: on-call's
/// `FALLIDA` with `reembolsar` is refused (409, naming the first charge), writing nothing,
/// since pagos does not know how much of that charge went back; `FALLIDA` overruling the
/// provider again settles it. Before: both charges were refunded in full, the first a
/// second time.
async fn reembolsar_is_refused_for_a_charge_an_earlier_resolution_settled_outside_pagos(
    backend: Backend,
) {
    let (app, refunds, payment, fake, report) =
        given_up_and_charged(backend, "k-twice", "review").await;
    returned_by_bank_transfer(&app, &payment).await;
    let first = report("succeeded")["id"].as_str().expect("id").to_owned();
    let second = fake.preload_for(&payment, "succeeded", 50_000);
    let charge = json!({"id": second, "status": "succeeded", "amount": 50000, "currency": "COP",
                        "reference": payment, "declineCode": null});
    assert_eq!(
        deliver(&app, "evt_second", 1, charge).await,
        "revision_manual"
    );

    let answer = app
        .resolve_as(
            crate::helpers::ADMIN_TOKEN,
            &payment,
            &json!({"estado": "FALLIDA", "reembolsar": true, "motivo": "INC-13"}),
        )
        .await;
    assert_eq!(answer.status(), 409);
    let problem = json(answer).await;
    assert_eq!(problem["cargo"], first.as_str(), "{problem}");
    assert!(
        problem["type"]
            .as_str()
            .is_some_and(|t| t.ends_with("payment-not-refundable")),
        "{problem}"
    );
    assert_eq!(app.payment(&payment).await.state, "REVISION_MANUAL");
    no_refund_of(&app, &payment, "nothing registered").await;
    assert!(refunds.made().is_empty());

    let body = json!({"estado": "FALLIDA", "motivo": "INC-13",
                      "contraProveedor": "both returned by bank transfer TR-995"});
    let done = app
        .resolved_as(crate::helpers::ADMIN_TOKEN, &payment, &body)
        .await;
    assert_eq!(done["pago"]["estado"], "FALLIDA", "{done}");
}
