//! On-call's resolution of a refund under review is checked against the provider first, as
//! a payment's is: what the provider holds for the refund (its look-up by the refund's
//! reference, or by its provider id once known). `COMPLETADO` needs a succeeded refund of
//! the refund's amount and currency, and a `gatewayRef` must be one of them; `FALLIDO` is
//! refused while the provider shows the refund succeeded (or still pending): it frees what
//! is left to refund, and the merchant, told `reembolso.fallido`, refunds again. A refusal
//! is `409 provider-disagrees` listing the refunds found and changes nothing; a look-up that
//! fails is a 503 that changes nothing. On-call overrules the provider only by saying why
//! (`contraProveedor`), kept in the refund's audit row — also when it cannot be asked.

use crate::compensation::{SECRET, deliver_event};
use crate::helpers::{ADMIN_TOKEN, API_KEY, Backend, TestApp, json, problem};
use crate::on_both_databases;
use crate::refunds::{FakeRefunds, app_with, paid, refund};
use serde_json::{Value, json};
use std::time::Duration;

on_both_databases!(
    fallido_is_refused_while_the_provider_shows_the_refund_succeeded_and_nothing_is_freed,
    completado_is_refused_while_the_provider_shows_no_succeeded_refund,
    completado_naming_another_refunds_provider_id_is_refused,
    a_look_up_that_fails_refuses_the_resolution_with_503_and_changes_nothing,
    on_call_overrules_the_provider_with_a_reason_the_refunds_audit_row_keeps,
    fallido_is_refused_while_the_providers_webhook_reported_the_refund_its_search_does_not_show,
    a_stale_or_repeated_refund_event_never_overwrites_what_the_newest_one_reported,
    a_refund_a_webhook_reports_succeeded_while_fallido_is_being_written_refuses_it,
    completado_is_refused_while_the_providers_webhooks_report_the_refund_failed,
);

/// The reference gateway keeping refunds, and pagos giving up on a refund after 1 s.
async fn app(backend: Backend) -> (TestApp, FakeRefunds) {
    app_with(backend, &["--give-up-after", "1s", "--stale-after", "1s"]).await
}

fn path(id: &str) -> String {
    format!("/admin/reembolsos/{id}/resolucion")
}

/// On-call reconciles refund `id` now; the report's `reembolsos`.
async fn reconcile(app: &TestApp, id: &str) -> Value {
    let answer = app
        .admin_post("/admin/reconciliaciones", &json!({ "reembolsoId": id }))
        .await;
    assert_eq!(answer.status(), 200);
    json(answer).await["reembolsos"].clone()
}

/// The reasons of refund `id`'s audit trail, oldest first.
pub(crate) async fn trail(app: &TestApp, id: &str) -> Vec<String> {
    pagos::saga::refund::store::trail(&app.db, uuid::Uuid::parse_str(id).expect("uuid"))
        .await
        .expect("trail")
        .into_iter()
        .map(|t| t.reason)
        .collect()
}

/// Refund `id` as its merchant reads it.
async fn read(app: &TestApp, id: &str) -> Value {
    json(app.get_as(API_KEY, &format!("/v1/reembolsos/{id}")).await).await
}

/// A refund of `monto` of `payment` the provider holds pending, past PAGOS_GIVE_UP_AFTER:
/// the reconciler sent it to REVISION_MANUAL ("still pending after …"). Its id.
pub(crate) async fn pending_under_review(
    app: &TestApp,
    fake: &FakeRefunds,
    payment: &str,
    key: &str,
    monto: i64,
) -> String {
    fake.refunding("pending");
    let answer = refund(app, payment, key, &json!({ "monto": monto })).await;
    assert_eq!(answer.status(), 202);
    let id = json(answer).await["id"].as_str().expect("id").to_owned();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let report = reconcile(app, &id).await;
    assert_eq!(report["revisionManual"], 1, "{report}");
    assert_eq!(read(app, &id).await["estado"], "REVISION_MANUAL");
    id
}

/// A refund of `monto` of `payment` the provider made (`status`) while its answer was lost
/// and its search lagged, past PAGOS_GIVE_UP_AFTER: the reconciler sent it to
/// REVISION_MANUAL ("no refund at the provider after … of sends with the same key"),
/// holding its amount. The provider's search still lags. Its id.
async fn made_unseen(
    app: &TestApp,
    fake: &FakeRefunds,
    payment: &str,
    key: &str,
    monto: i64,
    status: &'static str,
) -> String {
    fake.refunding(status);
    fake.search_lags(true);
    fake.delay(Duration::from_secs(2));
    let answer = refund(app, payment, key, &json!({ "monto": monto })).await;
    assert_eq!(answer.status(), 202);
    let id = json(answer).await["id"].as_str().expect("id").to_owned();
    fake.delay(Duration::ZERO);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let report = reconcile(app, &id).await;
    assert_eq!(report["revisionManual"], 1, "{report}");
    let why = trail(app, &id).await.pop().expect("a row");
    assert!(why.contains("no refund at the provider after"), "{why}");
    assert!(read(app, &id).await["gatewayRef"].is_null());
    id
}

/// On-call's resolution `body` of refund `id`, accepted; the refund and its trail.
async fn resolved(app: &TestApp, id: &str, body: &Value) -> Value {
    let answer = app.admin_post(&path(id), body).await;
    assert_eq!(answer.status(), 200, "{body}");
    json(answer).await
}

/// On-call's resolution `body` of refund `id` is refused with `409 provider-disagrees`,
/// and the refund and its audit trail are as they were; the problem.
async fn disagreed(app: &TestApp, id: &str, body: &Value) -> Value {
    let (before, trail_before) = (read(app, id).await, trail(app, id).await);
    let answer = app.admin_post(&path(id), body).await;
    let problem = problem(answer, 409, &body.to_string()).await;
    assert_eq!(problem["type"], "/problems/provider-disagrees", "{problem}");
    assert!(
        problem["reembolsos"].is_array(),
        "the refunds found: {problem}"
    );
    assert!(
        crate::helpers::text_has(&problem, "detail", "Nothing was changed"),
        "{problem}"
    );
    assert_eq!(read(app, id).await, before, "nothing changed: {body}");
    assert_eq!(trail(app, id).await, trail_before, "{body}");
    problem
}

fn ids_in(problem: &Value) -> Vec<String> {
    crate::helpers::listed(problem, "reembolsos", "id")
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// The types of the merchant's refund events, oldest first.
pub(crate) async fn refund_events(app: &TestApp) -> Vec<String> {
    let page = json(app.get_as(API_KEY, "/v1/eventos?limite=50").await).await;
    crate::helpers::listed(&page, "eventos", "tipo")
        .into_iter()
        .filter(|t| t.starts_with("reembolso."))
        .map(str::to_owned)
        .collect()
}

/// What is left to refund of `payment`, as a refund over it is told (nothing stored).
async fn restante(app: &TestApp, payment: &str) -> i64 {
    let over = refund(app, payment, "probe-over", &json!({ "monto": 250001 })).await;
    let problem = problem(over, 422, "over everything").await;
    assert_eq!(problem["type"], "/problems/refund-exceeds-remaining");
    problem["restante"].as_i64().expect("restante")
}

/// Scenario A: a partial refund the provider made, whose answer was lost and whose search
/// lagged, went to review ("no refund at the provider after … of sends with the same
/// key"). FALLIDO would free its amount and tell the merchant `reembolso.fallido`: asked
/// again with a new key, the customer would get it twice.
async fn fallido_is_refused_while_the_provider_shows_the_refund_succeeded_and_nothing_is_freed(
    backend: Backend,
) {
    let (app, fake) = app(backend).await;
    let payment = paid(&app, "pay-1").await;
    let id = made_unseen(&app, &fake, &payment, "ref-1", 50000, "succeeded").await;
    assert_eq!(restante(&app, &payment).await, 200000);

    // The provider's search caught up: it shows the refund succeeded.
    fake.search_lags(false);
    let problem = disagreed(
        &app,
        &id,
        &json!({"estado": "FALLIDO", "motivo": "no refund in the provider's search"}),
    )
    .await;
    assert_eq!(ids_in(&problem), ["re_fake_1"], "{problem}");
    assert_eq!(problem["reembolsos"][0]["status"], "succeeded", "{problem}");
    assert_eq!(problem["reembolsos"][0]["amount"], 50000, "{problem}");
    assert!(
        crate::helpers::text_has(&problem, "detail", "COMPLETADO"),
        "tells on-call the way: {problem}"
    );
    // Nothing freed, nobody told.
    assert_eq!(restante(&app, &payment).await, 200000);
    assert_eq!(
        refund_events(&app).await,
        ["reembolso.revision_manual"],
        "no reembolso.fallido"
    );

    // COMPLETADO is what the provider shows: its refund becomes the refund's gatewayRef.
    let done = resolved(
        &app,
        &id,
        &json!({"estado": "COMPLETADO", "motivo": "the provider shows re_fake_1 succeeded"}),
    )
    .await;
    assert_eq!(done["reembolso"]["estado"], "COMPLETADO");
    assert_eq!(done["reembolso"]["gatewayRef"], "re_fake_1");
    let pago = json(app.get_as(API_KEY, &format!("/v1/pagos/{payment}")).await).await;
    assert_eq!(pago["montoReembolsado"], 50000);
    assert_eq!(
        refund_events(&app).await,
        ["reembolso.revision_manual", "reembolso.completado"]
    );
    assert_eq!(fake.made().len(), 1, "one refund at the provider");
}

/// Scenario B: the provider shows no money went back (the refund pending, none found,
/// failed): COMPLETADO would tell the merchant it did.
async fn completado_is_refused_while_the_provider_shows_no_succeeded_refund(backend: Backend) {
    let (app, fake) = app(backend).await;
    let payment = paid(&app, "pay-1").await;
    let id = pending_under_review(&app, &fake, &payment, "ref-1", 50000).await;

    // Still pending at the provider: neither answer holds yet.
    for estado in ["COMPLETADO", "FALLIDO"] {
        let problem = disagreed(
            &app,
            &id,
            &json!({"estado": estado, "motivo": "checked the dashboard"}),
        )
        .await;
        assert_eq!(ids_in(&problem), ["re_fake_1"], "{problem}");
        assert_eq!(problem["reembolsos"][0]["status"], "pending", "{problem}");
    }

    // No refund at all (its search lags, or it never made one).
    fake.search_lags(true);
    let problem = disagreed(
        &app,
        &id,
        &json!({"estado": "COMPLETADO", "motivo": "I think it went back"}),
    )
    .await;
    assert!(ids_in(&problem).is_empty(), "{problem}");
    assert!(
        crate::helpers::text_has(&problem, "detail", "no succeeded refund"),
        "{problem}"
    );
    fake.search_lags(false);

    // Failed at the provider: naming its refund does not make it succeeded.
    fake.settle_all("failed");
    disagreed(
        &app,
        &id,
        &json!({"estado": "COMPLETADO", "motivo": "x", "gatewayRef": "re_fake_1"}),
    )
    .await;
    assert_eq!(restante(&app, &payment).await, 200000);

    // FALLIDO is what it shows: its amount can be refunded again.
    let done = resolved(
        &app,
        &id,
        &json!({"estado": "FALLIDO", "motivo": "the provider shows re_fake_1 failed"}),
    )
    .await;
    assert_eq!(done["reembolso"]["estado"], "FALLIDO");
    assert_eq!(restante(&app, &payment).await, 250000);
}

/// A `gatewayRef` pasted from the payment's other refund (which the provider made for that
/// one) or mistyped is refused: the money would count twice.
async fn completado_naming_another_refunds_provider_id_is_refused(backend: Backend) {
    let (app, fake) = app(backend).await;
    let payment = paid(&app, "pay-1").await;
    let first = refund(&app, &payment, "ref-1", &json!({"monto": 50000})).await;
    assert_eq!(first.status(), 201);
    assert_eq!(json(first).await["gatewayRef"], "re_fake_1");
    let id = pending_under_review(&app, &fake, &payment, "ref-2", 50000).await;
    fake.settle_all("succeeded");

    for named in ["re_fake_1", "re_typo"] {
        let problem = crate::helpers::naming_refused("COMPLETADO", named, async |body| {
            disagreed(&app, &id, body).await
        })
        .await;
        assert_eq!(
            ids_in(&problem),
            ["re_fake_2"],
            "only this refund's: {problem}"
        );
    }
    // The first refund's provider refund is refused as another refund's — even overruled:
    // one provider refund is one pagos refund.
    for overrule in [None, Some("the dashboard says so")] {
        let mut body =
            json!({"estado": "COMPLETADO", "motivo": "found it", "gatewayRef": "re_fake_1"});
        if let Some(why) = overrule {
            body["contraProveedor"] = why.into();
        }
        let problem = disagreed(&app, &id, &body).await;
        assert!(
            crate::helpers::text_has(&problem, "detail", "another refund of this payment"),
            "{problem}"
        );
    }

    let done = resolved(
        &app,
        &id,
        &json!({"estado": "COMPLETADO", "motivo": "found it", "gatewayRef": "re_fake_2"}),
    )
    .await;
    assert_eq!(done["reembolso"]["gatewayRef"], "re_fake_2");
    let pago = json(app.get_as(API_KEY, &format!("/v1/pagos/{payment}")).await).await;
    assert_eq!(pago["montoReembolsado"], 100000);
}

async fn a_look_up_that_fails_refuses_the_resolution_with_503_and_changes_nothing(
    backend: Backend,
) {
    let (app, fake) = app(backend).await;
    let payment = paid(&app, "pay-1").await;
    let id = pending_under_review(&app, &fake, &payment, "ref-1", 50000).await;
    fake.fail_lookups(true);
    let (before, trail_before) = (read(&app, &id).await, trail(&app, &id).await);
    for body in [
        json!({"estado": "FALLIDO", "motivo": "no refund in the dashboard"}),
        json!({"estado": "COMPLETADO", "motivo": "refunded in the dashboard"}),
    ] {
        let answer = app.admin_post(&path(&id), &body).await;
        crate::helpers::unavailable(answer, &body).await;
    }
    assert_eq!(read(&app, &id).await, before);
    assert_eq!(trail(&app, &id).await, trail_before);
    assert_eq!(restante(&app, &payment).await, 200000);
}

/// The money went back outside pagos' refund (reversed by the bank, the provider still
/// shows it succeeded); then a refund whose provider cannot be asked at all, its dashboard
/// read by on-call.
async fn on_call_overrules_the_provider_with_a_reason_the_refunds_audit_row_keeps(
    backend: Backend,
) {
    let (app, fake) = app(backend).await;
    let payment = paid(&app, "pay-1").await;
    let id = pending_under_review(&app, &fake, &payment, "ref-1", 50000).await;
    fake.settle_all("succeeded");
    let why = "reversed by the card issuer, ticket 77: the provider still shows it succeeded";

    for bad in [
        json!({"estado": "FALLIDO", "motivo": "x", "contraProveedor": "   "}),
        json!({"estado": "FALLIDO", "motivo": "x", "contraProveedor": "y".repeat(1001)}),
    ] {
        let answer = app.admin_post(&path(&id), &bad).await;
        let problem = problem(answer, 422, "a bad contraProveedor").await;
        assert_eq!(problem["type"], "/problems/validation-failed", "{problem}");
    }
    assert_eq!(read(&app, &id).await["estado"], "REVISION_MANUAL");

    let done = resolved(
        &app,
        &id,
        &json!({"estado": "FALLIDO", "motivo": "ticket 77: reversed", "contraProveedor": why}),
    )
    .await;
    assert_eq!(done["reembolso"]["estado"], "FALLIDO");
    let last = crate::helpers::last_transition(&done);
    assert_eq!(last["operador"], "admin", "{last}");
    for said in ["ticket 77: reversed", why, "re_fake_1 succeeded", "overrul"] {
        assert!(
            crate::helpers::text_has(&last, "motivo", said),
            "{said} in {last}"
        );
    }

    // The provider cannot be asked (a look-up that keeps failing): plain answers wait,
    // an overrule is taken, with the look-up's error in the audit row.
    let second = pending_under_review(&app, &fake, &payment, "ref-2", 50000).await;
    fake.fail_lookups(true);
    let plain = app
        .admin_post(
            &path(&second),
            &json!({"estado": "COMPLETADO", "motivo": "dashboard shows it"}),
        )
        .await;
    assert_eq!(plain.status(), 503);
    let why = "the provider's API is down since 03:00; its dashboard shows re_fake_2 succeeded";
    let done = resolved(
        &app,
        &second,
        &json!({"estado": "COMPLETADO", "motivo": "ticket 78", "gatewayRef": "re_fake_2",
                "contraProveedor": why}),
    )
    .await;
    assert_eq!(done["reembolso"]["estado"], "COMPLETADO");
    assert_eq!(done["reembolso"]["gatewayRef"], "re_fake_2");
    let last = crate::helpers::last_transition(&done);
    for said in ["ticket 78", why, "could not be asked", "500"] {
        assert!(
            crate::helpers::text_has(&last, "motivo", said),
            "{said} in {last}"
        );
    }
}

/// The reference gateway keeping refunds and signing its events, and pagos giving up on a
/// refund after 1 s.
async fn app_hearing_events(backend: Backend) -> (TestApp, FakeRefunds) {
    app_with(
        backend,
        &[
            "--give-up-after",
            "1s",
            "--stale-after",
            "1s",
            "--webhook-secret",
            SECRET,
        ],
    )
    .await
}

/// Scenario A again, but the provider's search still lags when on-call resolves: only its
/// event said the refund succeeded. FALLIDO would free its amount to be refunded twice.
async fn fallido_is_refused_while_the_providers_webhook_reported_the_refund_its_search_does_not_show(
    backend: Backend,
) {
    let (app, fake) = app_hearing_events(backend).await;
    let payment = paid(&app, "pay-1").await;
    let id = made_unseen(&app, &fake, &payment, "ref-1", 50000, "succeeded").await;
    let made = fake.made()[0].clone();
    assert_eq!(
        deliver_event(&app, "evt_re_1", "refund.updated", 1, made).await,
        "sin_cambios",
        "under review: on-call decides"
    );

    let fallido = json!({"estado": "FALLIDO", "motivo": "no refund in the provider's search"});
    let refused = disagreed(&app, &id, &fallido).await;
    assert_eq!(ids_in(&refused), ["re_fake_1"], "{refused}");
    let listed = &refused["reembolsos"][0];
    assert_eq!(listed["fuente"], "webhook", "{refused}");
    assert_eq!(listed["status"], "succeeded", "{refused}");
    assert_eq!(listed["amount"], 50000, "{refused}");
    // Nothing freed: what would be left were it freed is still over what is left.
    let again = refund(&app, &payment, "ref-2", &json!({"monto": 250000})).await;
    let over = problem(again, 422, "the refund's amount is still held").await;
    assert_eq!(over["type"], "/problems/refund-exceeds-remaining", "{over}");
    assert_eq!(over["restante"], 200000, "{over}");
    assert_eq!(refund_events(&app).await, ["reembolso.revision_manual"]);

    // The provider cannot be asked: its webhook's word still refuses a plain FALLIDO.
    fake.fail_lookups(true);
    let refused = disagreed(&app, &id, &fallido).await;
    assert_eq!(refused["reembolsos"][0]["fuente"], "webhook", "{refused}");
    assert!(
        crate::helpers::text_has(&refused, "detail", "could not be asked"),
        "{refused}"
    );
    fake.fail_lookups(false);

    // The console's payment page shows it under the payment's refunds.
    let session = crate::console::log_in(&app, ADMIN_TOKEN).await;
    let page = app
        .http
        .get(app.url(&format!("/consola/pagos/{payment}")))
        .header("cookie", format!("pagos_consola={session}"))
        .send()
        .await
        .expect("sent");
    assert_eq!(page.status(), 200);
    let html = page.text().await.expect("text");
    let reports = &html[html
        .find("id=\"refund-reports\"")
        .expect("the refunds' reports")..];
    for said in ["re_fake_1", "succeeded", "evt_re_1", id.as_str()] {
        assert!(reports.contains(said), "{said} in {reports}");
    }

    // COMPLETADO is what the provider reported, and names its refund: its event is
    // evidence enough while the provider cannot be asked, and the audit row says so.
    fake.fail_lookups(true);
    let done = resolved(
        &app,
        &id,
        &json!({"estado": "COMPLETADO", "motivo": "its event reported re_fake_1 succeeded",
                "gatewayRef": "re_fake_1"}),
    )
    .await;
    fake.fail_lookups(false);
    assert_eq!(done["reembolso"]["estado"], "COMPLETADO");
    assert_eq!(done["reembolso"]["gatewayRef"], "re_fake_1");
    let last = done["transiciones"]
        .as_array()
        .and_then(|t| t.last())
        .expect("its audit row");
    for said in ["could not be asked", "re_fake_1 succeeded"] {
        assert!(
            crate::helpers::text_has(last, "motivo", said),
            "{said} in {last}"
        );
    }
    let pago = json(app.get_as(API_KEY, &format!("/v1/pagos/{payment}")).await).await;
    assert_eq!(pago["montoReembolsado"], 50000);
    assert_eq!(fake.made().len(), 1, "one refund at the provider");
}

/// The provider's events about one refund, late, twice, out of order: what pagos keeps is
/// what the newest said, stored once, and the resolution weighs that.
async fn a_stale_or_repeated_refund_event_never_overwrites_what_the_newest_one_reported(
    backend: Backend,
) {
    use pagos::entities::webhook_refund::{self as reports, ReportedRefundStatus};
    use sea_orm::EntityTrait;
    let (app, fake) = app_hearing_events(backend).await;
    let payment = paid(&app, "pay-1").await;
    let id = made_unseen(&app, &fake, &payment, "ref-1", 50000, "pending").await;
    let mut made = fake.made()[0].clone();
    assert_eq!(
        deliver_event(&app, "evt_re_1", "refund.updated", 1, made.clone()).await,
        "sin_cambios"
    );
    // Pending at the provider, by its event: it may still go through.
    let fallido = json!({"estado": "FALLIDO", "motivo": "no refund in the provider's search"});
    let problem = disagreed(&app, &id, &fallido).await;
    assert_eq!(ids_in(&problem), ["re_fake_1"], "{problem}");
    assert_eq!(problem["reembolsos"][0]["status"], "pending", "{problem}");
    assert_eq!(problem["reembolsos"][0]["fuente"], "webhook", "{problem}");

    made["status"] = json!("succeeded");
    assert_eq!(
        deliver_event(&app, "evt_re_3", "refund.updated", 3, made.clone()).await,
        "sin_cambios"
    );
    // The same event again, whatever its body says now, and an older one arriving late.
    let mut repeated = made.clone();
    repeated["status"] = json!("failed");
    assert_eq!(
        deliver_event(&app, "evt_re_3", "refund.updated", 3, repeated).await,
        "duplicado"
    );
    let mut older = made.clone();
    older["status"] = json!("pending");
    assert_eq!(
        deliver_event(&app, "evt_re_2", "refund.updated", 2, older).await,
        "obsoleto"
    );
    let kept = reports::Entity::find().all(&app.db).await.expect("reports");
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0].status, ReportedRefundStatus::Succeeded, "{kept:?}");
    assert_eq!(
        (kept[0].last_sequence, kept[0].last_event_id.as_str()),
        (3, "evt_re_3")
    );
    assert_eq!(kept[0].refund_id.map(|r| r.to_string()), Some(id.clone()));

    // A refund that names no refund of ours (made in the provider's dashboard) is kept
    // too, its events ordered the same way.
    let mut foreign = made.clone();
    foreign["id"] = json!("re_dashboard");
    foreign["reference"] = json!(uuid::Uuid::new_v4().to_string());
    assert_eq!(
        deliver_event(&app, "evt_d_2", "refund.updated", 2, foreign.clone()).await,
        "desconocido"
    );
    foreign["status"] = json!("pending");
    assert_eq!(
        deliver_event(&app, "evt_d_1", "refund.updated", 1, foreign.clone()).await,
        "obsoleto"
    );
    // One that carries no reference at all is the same: known, not refused as malformed
    // for the gateway to send again and again.
    foreign["id"] = json!("re_no_reference");
    foreign["reference"] = json!("");
    assert_eq!(
        deliver_event(&app, "evt_e_1", "refund.updated", 1, foreign).await,
        "desconocido"
    );
    let kept = reports::Entity::find_by_id(("http".to_owned(), "re_dashboard".to_owned()))
        .one(&app.db)
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(
        (kept.status, kept.last_sequence, kept.refund_id),
        (ReportedRefundStatus::Succeeded, 2, None)
    );

    // COMPLETADO on what the newest event reported, its refund recorded.
    let done = resolved(
        &app,
        &id,
        &json!({"estado": "COMPLETADO", "motivo": "its event reported it succeeded"}),
    )
    .await;
    assert_eq!(done["reembolso"]["estado"], "COMPLETADO");
    assert_eq!(done["reembolso"]["gatewayRef"], "re_fake_1");
}

/// A gateway webhook reporting the refund succeeded that commits while on-call's `FALLIDO`
/// waits to be written, after the provider was asked (its search lags; the consumer's
/// transaction: the refund locked, the report written; a refund under review is kept as
/// it is). Before, the resolution wrote `FALLIDO` over it: what went back was freed to be
/// refunded again and the merchant told `reembolso.fallido`. Now it is refused and nothing
/// is freed. (On SQLite the resolution's audit row waits for the webhook's transaction
/// before the provider is asked, so there it sees the report from the start.)
async fn a_refund_a_webhook_reports_succeeded_while_fallido_is_being_written_refuses_it(
    backend: Backend,
) {
    use pagos::entities::webhook_refund;
    use sea_orm::{ConnectionTrait, EntityTrait, TransactionTrait};
    let postgres = matches!(backend, Backend::Postgres(_));
    let (app, fake) = app(backend).await;
    let payment = paid(&app, "pay-1").await;
    let id = made_unseen(&app, &fake, &payment, "ref-1", 50000, "succeeded").await;
    let made = fake.made()[0].clone();

    let webhook = app.db.begin().await.expect("begin");
    if postgres {
        webhook
            .execute_unprepared(&format!(
                "SELECT 1 FROM refunds WHERE id = '{id}' FOR UPDATE"
            ))
            .await
            .expect("the refund locked");
    }
    let at = chrono::Utc::now();
    let refund_id = uuid::Uuid::parse_str(&id).expect("uuid");
    webhook_refund::Entity::insert(webhook_refund::ActiveModel::from(webhook_refund::Model {
        source: "http".into(),
        provider_refund_id: made["id"].as_str().expect("id").into(),
        reference: id.clone(),
        refund_id: Some(refund_id),
        payment_id: Some(uuid::Uuid::parse_str(&payment).expect("uuid")),
        charge_id: made["charge"].as_str().expect("charge").into(),
        status: webhook_refund::ReportedRefundStatus::Succeeded,
        amount: 50000,
        currency: "COP".into(),
        failure_code: None,
        last_sequence: 1,
        last_event_id: "evt_re_late".into(),
        first_seen_at: at,
        updated_at: at,
    }))
    .exec(&webhook)
    .await
    .expect("the report, not committed yet");

    let fallido = json!({"estado": "FALLIDO", "motivo": "no refund in the provider's search"});
    let (before, trail_before) = (read(&app, &id).await, trail(&app, &id).await);
    let resolving = {
        let request = app
            .http
            .post(app.url(&path(&id)))
            .bearer_auth(ADMIN_TOKEN)
            .json(&fallido);
        tokio::spawn(async move { request.send().await.expect("sent") })
    };
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    webhook
        .commit()
        .await
        .expect("the webhook's transaction commits");
    let answer = resolving.await.expect("answered");
    let refused = problem(answer, 409, "FALLIDO over money that went back").await;
    assert_eq!(refused["type"], "/problems/provider-disagrees", "{refused}");
    assert!(
        ids_in(&refused).contains(&"re_fake_1".to_owned()),
        "{refused}"
    );
    assert_eq!(read(&app, &id).await, before, "nothing changed");
    assert_eq!(trail(&app, &id).await, trail_before);
    // Nothing freed: what is left is still held by the refund.
    let again = refund(&app, &payment, "ref-2", &json!({"monto": 250000})).await;
    let over = problem(again, 422, "the refund's amount is still held").await;
    assert_eq!(over["restante"], 200000, "{over}");
}

/// The provider's search still shows the refund succeeded, but its webhooks reported it
/// failed since (a search lags behind its events). Before, `COMPLETADO` was taken on the
/// search's word: counted as given back (`montoReembolsado`, what is left to refund) while
/// the customer got nothing. Now it is refused, nothing changed; on-call who read the
/// dashboard overrules it by saying why.
async fn completado_is_refused_while_the_providers_webhooks_report_the_refund_failed(
    backend: Backend,
) {
    use pagos::entities::webhook_refund;
    use sea_orm::EntityTrait;
    let (app, fake) = app(backend).await;
    let payment = paid(&app, "pay-1").await;
    let id = pending_under_review(&app, &fake, &payment, "ref-1", 50000).await;
    fake.settle_all("succeeded");
    let made = fake.made()[0].clone();
    let provider_refund = made["id"].as_str().expect("id").to_owned();
    let at = chrono::Utc::now();
    webhook_refund::Entity::insert(webhook_refund::ActiveModel::from(webhook_refund::Model {
        source: "http".into(),
        provider_refund_id: provider_refund.clone(),
        reference: id.clone(),
        refund_id: Some(uuid::Uuid::parse_str(&id).expect("uuid")),
        payment_id: Some(uuid::Uuid::parse_str(&payment).expect("uuid")),
        charge_id: made["charge"].as_str().expect("charge").into(),
        status: webhook_refund::ReportedRefundStatus::Failed,
        amount: 50000,
        currency: "COP".into(),
        failure_code: Some("insufficient_funds".into()),
        last_sequence: 3,
        last_event_id: "evt_re_failed".into(),
        first_seen_at: at,
        updated_at: at,
    }))
    .exec(&app.db)
    .await
    .expect("the provider's report");

    let completado = json!({"estado": "COMPLETADO", "motivo": "the provider shows it refunded"});
    let refused = disagreed(&app, &id, &completado).await;
    assert!(ids_in(&refused).contains(&provider_refund), "{refused}");
    for said in ["insufficient_funds", "contraProveedor"] {
        assert!(
            crate::helpers::text_has(&refused, "detail", said),
            "{said}: {refused}"
        );
    }
    let overruled = json!({"estado": "COMPLETADO", "motivo": "refunded",
                           "contraProveedor": "the dashboard shows the refund went back on a retry"});
    let done = resolved(&app, &id, &overruled).await;
    assert_eq!(done["reembolso"]["estado"], "COMPLETADO", "{done}");
}

on_both_databases!(naming_a_provider_refund_of_another_payments_refund_is_refused_even_overruled);

/// A provider refund id that is already another payment's refund's — another merchant's,
/// or this merchant's — is never this refund's, even overruled or with the provider down:
/// its money would count twice. Another merchant's refund is never named; this merchant's
/// is. The refund's own provider refund still settles it.
async fn naming_a_provider_refund_of_another_payments_refund_is_refused_even_overruled(
    backend: Backend,
) {
    let (app, fake) = app(backend).await;
    let theirs = {
        let answer = app
            .pay_as(
                crate::helpers::OTHER_API_KEY,
                "pay-globex",
                &crate::helpers::payment_body(),
            )
            .await;
        assert_eq!(answer.status(), 201);
        json(answer).await["id"].as_str().expect("id").to_owned()
    };
    let their_refund = crate::refunds::refund_as(
        &app,
        crate::helpers::OTHER_API_KEY,
        &theirs,
        "ref-globex",
        &json!({"monto": 50000}),
    )
    .await;
    assert_eq!(their_refund.status(), 201);
    let their_refund = json(their_refund).await;
    assert_eq!(their_refund["gatewayRef"], "re_fake_1");
    let their_refund_id = their_refund["id"].as_str().expect("id").to_owned();

    let sibling_payment = paid(&app, "pay-0").await;
    let ours = refund(&app, &sibling_payment, "ref-0", &json!({"monto": 50000})).await;
    assert_eq!(ours.status(), 201);
    let ours = json(ours).await;
    assert_eq!(ours["gatewayRef"], "re_fake_2");
    let ours_id = ours["id"].as_str().expect("id").to_owned();

    let payment = paid(&app, "pay-1").await;
    let id = pending_under_review(&app, &fake, &payment, "ref-1", 50000).await;
    fake.settle_all("succeeded");

    let why = "the dashboard shows it for this order";
    for (named, lookups_fail) in [
        ("re_fake_1", false),
        ("re_fake_1", true),
        ("re_fake_2", true),
    ] {
        fake.fail_lookups(lookups_fail);
        let body = json!({"estado": "COMPLETADO", "motivo": "found it", "gatewayRef": named,
                          "contraProveedor": why});
        let problem = disagreed(&app, &id, &body).await;
        let said = problem["detail"].as_str().unwrap_or_default();
        assert!(said.contains(named), "{problem}");
        if named == "re_fake_1" {
            assert!(said.contains("another merchant"), "{problem}");
            assert!(!problem.to_string().contains(&their_refund_id), "{problem}");
            assert!(!problem.to_string().contains(&theirs), "{problem}");
        } else {
            assert!(said.contains(&ours_id), "{problem}");
        }
    }
    fake.fail_lookups(false);

    let done = resolved(
        &app,
        &id,
        &json!({"estado": "COMPLETADO", "motivo": "found it", "gatewayRef": "re_fake_3"}),
    )
    .await;
    assert_eq!(done["reembolso"]["gatewayRef"], "re_fake_3");
}
