//! On-call's resolution of a payment under review is checked against the provider first:
//! what its search shows for the payment (only the payment's own charges) and what its
//! webhooks reported. `COMPLETADA` needs a succeeded charge of the payment's amount, and a
//! `gatewayRef` must be one of them; `FALLIDA` is refused while a charge is still pending,
//! and without `reembolsar` while the provider shows money taken. A refusal is `409
//! provider-disagrees` with the charges found, and changes nothing. When the provider
//! cannot be asked, the resolution is on-call's word (only `reembolsar` gets a 503). On-call
//! may overrule the provider only by saying why (`contraProveedor`), kept in the audit row.

use crate::helpers::{ADMIN_TOKEN, Backend, FakeGateway, TestApp, json, payment_body, problem};
use crate::on_both_databases;
use crate::operators::{payment_under_review, under_review};
use serde_json::{Value, json};

on_both_databases!(
    completada_is_refused_while_the_provider_shows_no_succeeded_charge_and_nothing_changes,
    completada_naming_a_charge_the_provider_does_not_hold_succeeded_for_this_payment_is_refused,
    completada_without_a_gateway_ref_keeps_the_payments_charge_or_takes_the_one_succeeded,
    fallida_without_reembolsar_is_refused_while_the_provider_shows_a_succeeded_charge,
    while_the_provider_cannot_be_asked_on_call_resolves_on_its_word_and_the_trail_says_so,
    on_call_overrules_the_provider_only_with_a_reason_the_audit_row_keeps,
    fallida_is_refused_while_a_charge_is_still_pending_at_the_provider_unless_overruled,
    completada_names_the_charge_when_neither_the_provider_nor_the_payment_does,
    what_on_call_writes_holding_a_nul_is_422_and_changes_nothing,
    a_charge_a_webhook_reports_succeeded_while_fallida_is_being_written_refuses_it,
    a_second_charge_a_webhook_reports_while_completada_is_being_written_refuses_it,
    completada_is_refused_while_the_providers_webhooks_report_its_charge_failed_since,
    while_the_provider_cannot_be_asked_completada_still_weighs_what_its_webhooks_reported,
    after_a_resolution_that_refunds_on_calls_row_is_the_last_out_of_review_as_the_runbook_reads_it,
);

async fn app(backend: Backend) -> TestApp {
    crate::helpers::started(backend, &["--give-up-after", "1s", "--stale-after", "1s"]).await
}

/// The payment `id` as on-call reads it: its row and audit trail.
async fn detail(app: &TestApp, id: &str) -> Value {
    json(app.admin_get(&format!("/admin/pagos/{id}")).await).await
}

/// On-call's resolution `body` of `id` is refused with `409 provider-disagrees`, and the
/// payment and its audit trail are as they were; the problem.
async fn disagreed(app: &TestApp, id: &str, body: &Value) -> Value {
    let before = detail(app, id).await;
    let answer = app.resolve_as(ADMIN_TOKEN, id, body).await;
    let problem = problem(answer, 409, &body.to_string()).await;
    assert_eq!(problem["type"], "/problems/provider-disagrees", "{problem}");
    assert!(problem["cargos"].is_array(), "the charges found: {problem}");
    let after = detail(app, id).await;
    assert_eq!(after["pago"]["estado"], "REVISION_MANUAL", "{body}");
    assert_eq!(after["pago"], before["pago"], "nothing changed: {body}");
    assert_eq!(after["transiciones"], before["transiciones"], "{body}");
    problem
}

/// On-call's resolution `body` of `id` is refused (`disagreed`), listing `charge` alone,
/// `status` at the provider, and saying each of `said` in its detail; the problem.
async fn refused_for(
    app: &TestApp,
    id: &str,
    body: &Value,
    charge: &str,
    status: &str,
    said: &[&str],
) -> Value {
    let problem = disagreed(app, id, body).await;
    assert_eq!(ids_in(&problem), [charge], "{problem}");
    assert_eq!(problem["cargos"][0]["status"], status, "{problem}");
    for said in said {
        assert!(
            crate::helpers::text_has(&problem, "detail", said),
            "{said} in {problem}"
        );
    }
    problem
}

/// On-call's resolution `body` of `id`, as the break-glass token, is taken: the payment
/// in the state asked; its detail.
async fn resolved(app: &TestApp, id: &str, body: &Value) -> Value {
    let done = app.resolved_as(ADMIN_TOKEN, id, body).await;
    assert_eq!(done["pago"]["estado"], body["estado"], "{done}");
    done
}

/// On-call resolves payment `id` `COMPLETADA` on its own charge `own`: taken, the payment
/// on that charge.
async fn completed_on_its_own_charge(app: &TestApp, id: &str, own: &str, motivo: &str) {
    let body = json!({"estado": "COMPLETADA", "motivo": motivo, "gatewayRef": own});
    let done = resolved(app, id, &body).await;
    assert_eq!(done["pago"]["gatewayRef"], own, "{done}");
}

/// The payment's charges decline at the provider, and on-call resolves it FALLIDA: taken.
async fn declined_then_failed(app: &TestApp, fake: &FakeGateway, id: &str) {
    fake.settle(id, "declined");
    let body = json!({"estado": "FALLIDA", "motivo": "declined at the provider"});
    resolved(app, id, &body).await;
}

fn ids_in(problem: &Value) -> Vec<String> {
    problem["cargos"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["id"].as_str().map(str::to_owned))
        .collect()
}

async fn completada_is_refused_while_the_provider_shows_no_succeeded_charge_and_nothing_changes(
    backend: Backend,
) {
    let app = app(backend).await;
    let (id, fake) = payment_under_review(&app, "k-res-1").await;
    let charge = fake.charge_ids(&id).remove(0);

    // The provider holds the payment's charge, still pending: no money taken yet.
    refused_for(
        &app,
        &id,
        &json!({"estado": "COMPLETADA", "motivo": "I think it went through"}),
        &charge,
        "pending",
        &["no succeeded charge"],
    )
    .await;
    // Naming that very charge does not make it succeeded.
    disagreed(
        &app,
        &id,
        &json!({"estado": "COMPLETADA", "motivo": "x", "gatewayRef": charge}),
    )
    .await;

    // Once the provider shows it succeeded, the same resolution is taken.
    fake.settle(&id, "succeeded");
    let done = resolved(
        &app,
        &id,
        &json!({"estado": "COMPLETADA", "motivo": "succeeded now"}),
    )
    .await;
    assert_eq!(done["pago"]["gatewayRef"], charge.as_str());
}

/// A `gatewayRef` pasted from another payment (here: another customer's charge, which a
/// later refund of this payment would refund), mistyped, or of another amount is refused.
async fn completada_naming_a_charge_the_provider_does_not_hold_succeeded_for_this_payment_is_refused(
    backend: Backend,
) {
    let app = app(backend).await;
    let (id, fake) = payment_under_review(&app, "k-res-2").await;
    fake.settle(&id, "succeeded");
    let own = fake.charge_ids(&id).remove(0);
    fake.set_new_status("succeeded");
    let other = json(app.pay("k-res-other", &payment_body()).await).await;
    assert_eq!(other["estado"], "COMPLETADA", "{other}");
    let others_charge = other["gatewayRef"].as_str().expect("charge").to_owned();
    let wrong_amount = fake.preload_for(&id, "succeeded", 100);

    for named in [others_charge.as_str(), "ch_typo", wrong_amount.as_str()] {
        let problem = crate::helpers::naming_refused("COMPLETADA", named, async |body| {
            disagreed(&app, &id, body).await
        })
        .await;
        assert!(
            !ids_in(&problem).contains(&others_charge),
            "only this payment's charges: {problem}"
        );
    }
    assert_ne!(
        app.payment(&id).await.gateway_ref.as_deref(),
        Some(others_charge.as_str())
    );

    // Its own charge fits, but the one of 100 took money too: refunded first, then said.
    let own_alone = json!({"estado": "COMPLETADA", "motivo": "found it", "gatewayRef": own});
    let problem = disagreed(&app, &id, &own_alone).await;
    assert!(ids_in(&problem).contains(&wrong_amount), "{problem}");
    let done = resolved(
        &app,
        &id,
        &json!({"estado": "COMPLETADA", "motivo": "found it", "gatewayRef": own,
                "contraProveedor": format!("{wrong_amount} refunded in the dashboard")}),
    )
    .await;
    assert_eq!(done["pago"]["gatewayRef"], own.as_str(), "{done}");
}

async fn completada_without_a_gateway_ref_keeps_the_payments_charge_or_takes_the_one_succeeded(
    backend: Backend,
) {
    let app = app(backend).await;
    let fake = app.with_fake(FakeGateway::charging("pending")).await;
    let resolve = |id: String| {
        let app = &app;
        async move {
            app.resolve_as(
                ADMIN_TOKEN,
                &id,
                &json!({"estado": "COMPLETADA", "motivo": "the provider shows it paid"}),
            )
            .await
        }
    };

    // Its own charge was declined; one other charge for it succeeded: that one.
    let first = under_review(&app, &fake, "k-res-3a").await;
    fake.settle(&first, "declined");
    let taken = fake.preload_for(&first, "succeeded", 250_000);
    let answer = resolve(first.clone()).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(json(answer).await["pago"]["gatewayRef"], taken.as_str());

    // Its own charge succeeded, and a second one too: the customer is charged twice, and
    // a COMPLETADA payment is not looked at again. Refused, naming both, until on-call
    // says the second went back (here overruling a provider that still shows it
    // succeeded, as Stripe shows a refunded PaymentIntent); its own stays its charge.
    let second = under_review(&app, &fake, "k-res-3b").await;
    fake.settle(&second, "succeeded");
    let own = fake.charge_ids(&second).remove(0);
    let twice = fake.preload_for(&second, "succeeded", 250_000);
    for named in [None, Some(own.as_str())] {
        let mut body = json!({"estado": "COMPLETADA", "motivo": "the provider shows it paid"});
        if let Some(named) = named {
            body["gatewayRef"] = json!(named);
        }
        let problem = disagreed(&app, &second, &body).await;
        let found = ids_in(&problem);
        assert!(found.contains(&own) && found.contains(&twice), "{problem}");
        assert!(
            crate::helpers::text_has(&problem, "detail", "charged more than once"),
            "{problem}"
        );
    }
    let answer = app
        .resolve_as(
            ADMIN_TOKEN,
            &second,
            &json!({"estado": "COMPLETADA", "motivo": "paid once; the second charge refunded",
                    "contraProveedor": format!("{twice} refunded in the dashboard, re_77")}),
        )
        .await;
    assert_eq!(answer.status(), 200);
    assert_eq!(json(answer).await["pago"]["gatewayRef"], own.as_str());

    // Its own charge declined and two others succeeded: on-call must say which.
    let third = under_review(&app, &fake, "k-res-3c").await;
    fake.settle(&third, "declined");
    let a = fake.preload_for(&third, "succeeded", 250_000);
    let b = fake.preload_for(&third, "succeeded", 250_000);
    let problem = disagreed(
        &app,
        &third,
        &json!({"estado": "COMPLETADA", "motivo": "the provider shows it paid"}),
    )
    .await;
    assert!(
        crate::helpers::text_has(&problem, "detail", "gatewayRef"),
        "{problem}"
    );
    let found = ids_in(&problem);
    assert!(found.contains(&a) && found.contains(&b), "{problem}");
}

async fn fallida_without_reembolsar_is_refused_while_the_provider_shows_a_succeeded_charge(
    backend: Backend,
) {
    let app = app(backend).await;
    let (id, fake) = payment_under_review(&app, "k-res-4").await;
    fake.settle(&id, "succeeded");
    let charge = fake.charge_ids(&id).remove(0);

    // It names the charge and tells on-call the way.
    refused_for(
        &app,
        &id,
        &json!({"estado": "FALLIDA", "motivo": "no money was taken"}),
        &charge,
        "succeeded",
        &["reembolsar", &charge],
    )
    .await;

    // Declined at the provider after all: FALLIDA is what it shows.
    declined_then_failed(&app, &fake, &id).await;
}

async fn while_the_provider_cannot_be_asked_on_call_resolves_on_its_word_and_the_trail_says_so(
    backend: Backend,
) {
    let app = app(backend).await;
    let (id, fake) = payment_under_review(&app, "k-res-5").await;
    fake.fail_lookups(true);
    let before = detail(&app, &id).await;
    // reembolsar refunds what the provider shows: it needs an answer.
    let body = json!({"estado": "FALLIDA", "motivo": "refund it", "reembolsar": true});
    let answer = app.resolve_as(ADMIN_TOKEN, &id, &body).await;
    let refused = crate::helpers::unavailable(answer, &body).await;
    // Dropping reembolsar for contraProveedor would record the charge as settled outside
    // pagos, never refunded: the advice is to wait for the provider, not that.
    let advice = refused["detail"].as_str().unwrap_or_default();
    assert!(advice.contains("try again"), "{refused}");
    assert!(
        !advice.contains("resolve with contraProveedor"),
        "{refused}"
    );
    let after = detail(&app, &id).await;
    assert_eq!(after["pago"], before["pago"]);
    assert_eq!(after["transiciones"], before["transiciones"]);

    // Nothing contradicts on-call, who read the dashboard: resolved as asked (the
    // contract's resolution), and the trail says the provider could not be asked.
    let answer = app
        .resolve_as(
            ADMIN_TOKEN,
            &id,
            &json!({"estado": "FALLIDA", "motivo": "ticket 31: no charge in the dashboard"}),
        )
        .await;
    assert_eq!(answer.status(), 200);
    let after = detail(&app, &id).await;
    assert_eq!(after["pago"]["estado"], "FALLIDA");
    let last = crate::helpers::last_transition(&after)["motivo"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(last.contains("ticket 31"), "{last}");
    assert!(last.contains("could not be asked"), "{last}");
}

/// While the provider's search cannot be asked, what its webhooks reported still counts
/// against a COMPLETADA: a charge of another amount is not the payment's (a later refund
/// of the payment would refund it), and two charges that succeeded are a customer charged
/// twice. Before, both were taken on on-call's word. Overruled, saying why, it is taken.
async fn while_the_provider_cannot_be_asked_completada_still_weighs_what_its_webhooks_reported(
    backend: Backend,
) {
    use pagos::entities::webhook_charge;
    use sea_orm::EntityTrait;
    let app = app(backend).await;
    let (id, fake) = payment_under_review(&app, "k-res-reported").await;
    fake.fail_lookups(true);
    let payment = app.payment(&id).await;
    let reported = |charge: &str, amount: i64| {
        let at = chrono::Utc::now();
        webhook_charge::ActiveModel::from(webhook_charge::Model {
            source: "http".into(),
            charge_id: charge.into(),
            reference: payment.id.to_string(),
            payment_id: Some(payment.id),
            status: webhook_charge::ReportedStatus::Succeeded,
            amount,
            currency: payment.currency.clone(),
            decline_code: None,
            last_sequence: 1,
            last_event_id: format!("evt_{charge}"),
            first_seen_at: at,
            updated_at: at,
        })
    };
    webhook_charge::Entity::insert(reported("ch_small", 1_000))
        .exec(&app.db)
        .await
        .expect("a report");
    let small = json!({"estado": "COMPLETADA", "motivo": "dashboard", "gatewayRef": "ch_small"});
    let problem = disagreed(&app, &id, &small).await;
    assert!(
        crate::helpers::text_has(&problem, "detail", "not this payment's charge"),
        "{problem}"
    );

    webhook_charge::Entity::insert(reported("ch_full", payment.amount))
        .exec(&app.db)
        .await
        .expect("a report");
    let full = json!({"estado": "COMPLETADA", "motivo": "dashboard", "gatewayRef": "ch_full"});
    let problem = disagreed(&app, &id, &full).await;
    assert!(
        crate::helpers::text_has(&problem, "detail", "charged more than once"),
        "{problem}"
    );

    let overruled = json!({"estado": "COMPLETADA", "motivo": "dashboard", "gatewayRef": "ch_full",
                           "contraProveedor": "ch_small refunded in the dashboard, re_9"});
    let done = resolved(&app, &id, &overruled).await;
    assert_eq!(done["pago"]["gatewayRef"], "ch_full", "{done}");
}

/// Money went back outside pagos (a bank transfer), the provider still shows the charge
/// succeeded: on-call resolves FALLIDA overruling the provider, and says why.
async fn on_call_overrules_the_provider_only_with_a_reason_the_audit_row_keeps(backend: Backend) {
    let app = app(backend).await;
    let (id, fake) = payment_under_review(&app, "k-res-6").await;
    fake.settle(&id, "succeeded");
    let charge = fake.charge_ids(&id).remove(0);
    let why = "card closed: returned by bank transfer TR-991, ticket 12";

    for bad in [
        json!({"estado": "FALLIDA", "motivo": "x", "contraProveedor": "   "}),
        json!({"estado": "FALLIDA", "motivo": "x", "reembolsar": true, "contraProveedor": why}),
    ] {
        let answer = app.resolve_as(ADMIN_TOKEN, &id, &bad).await;
        let problem = problem(answer, 422, &bad.to_string()).await;
        assert_eq!(problem["type"], "/problems/validation-failed", "{problem}");
    }
    assert_eq!(app.payment(&id).await.state, "REVISION_MANUAL");

    let done = resolved(&app, &id, &json!({"estado": "FALLIDA", "motivo": "ticket 12: money returned", "contraProveedor": why})).await;
    let last = crate::helpers::last_transition(&done);
    assert_eq!(last["operador"], "admin", "{last}");
    for said in ["ticket 12: money returned", why, charge.as_str(), "overrul"] {
        assert!(
            crate::helpers::text_has(&last, "motivo", said),
            "{said} in {last}"
        );
    }
}

/// A charge still pending may yet take the money, and a FALLIDA payment is never looked at
/// again: the customer could be charged under a "no money taken" answer, nobody refunding.
async fn fallida_is_refused_while_a_charge_is_still_pending_at_the_provider_unless_overruled(
    backend: Backend,
) {
    let app = app(backend).await;
    let fake = app.with_fake(FakeGateway::charging("pending")).await;
    let id = under_review(&app, &fake, "k-res-7a").await;
    let charge = fake.charge_ids(&id).remove(0);

    for body in [
        json!({"estado": "FALLIDA", "motivo": "the customer gave up"}),
        json!({"estado": "FALLIDA", "motivo": "refund it", "reembolsar": true}),
    ] {
        let said = ["pending", charge.as_str(), "contraProveedor"];
        refused_for(&app, &id, &body, &charge, "pending", &said).await;
    }

    // Once it failed at the provider, FALLIDA is what it shows.
    declined_then_failed(&app, &fake, &id).await;

    // On-call may close one still pending, saying why; the audit row keeps it.
    let other = under_review(&app, &fake, "k-res-7b").await;
    let why = "3-D Secure abandoned; the provider expires it in 7 days, ticket 44";
    let done = resolved(
        &app,
        &other,
        &json!({"estado": "FALLIDA", "motivo": "ticket 44", "contraProveedor": why}),
    )
    .await;
    let last = crate::helpers::last_transition(&done);
    assert!(crate::helpers::text_has(&last, "motivo", why), "{last}");
}

/// A payment whose send timed out has no charge id; resolved COMPLETADA without one, it
/// could never be refunded (a refund refunds the payment's charge). When neither the
/// provider's answer nor the payment names it, on-call must: 422, nothing changed.
async fn completada_names_the_charge_when_neither_the_provider_nor_the_payment_does(
    backend: Backend,
) {
    let app = crate::helpers::started(
        backend,
        &[
            "--give-up-after",
            "1s",
            "--stale-after",
            "1s",
            "--gateway-retries",
            "0",
        ],
    )
    .await;
    let fake = app
        .with_fake(FakeGateway::charging("pending").with_delay(std::time::Duration::from_secs(2)))
        .await;
    let id = under_review(&app, &fake, "k-res-8").await;
    fake.clear_delay();
    assert_eq!(
        app.payment(&id).await.gateway_ref,
        None,
        "its send timed out"
    );
    let charge = fake.charge_ids(&id).remove(0);

    let unnamed = [
        // The provider cannot be asked: on-call's word, but it must name the charge.
        (
            true,
            json!({"estado": "COMPLETADA", "motivo": "the dashboard shows it paid"}),
        ),
        // The provider shows the charge still pending; on-call overrules it.
        (
            false,
            json!({"estado": "COMPLETADA", "motivo": "paid", "contraProveedor": "the dashboard shows it captured"}),
        ),
    ];
    for (lookups_fail, body) in unnamed {
        fake.fail_lookups(lookups_fail);
        let before = detail(&app, &id).await;
        let answer = app.resolve_as(ADMIN_TOKEN, &id, &body).await;
        let problem = problem(answer, 422, &body.to_string()).await;
        assert!(
            crate::helpers::text_has(&problem, "detail", "gatewayRef"),
            "{problem}"
        );
        let after = detail(&app, &id).await;
        assert_eq!(after["pago"], before["pago"], "nothing changed: {body}");
        assert_eq!(after["transiciones"], before["transiciones"], "{body}");
    }

    fake.fail_lookups(true);
    let done = resolved(&app, &id, &json!({"estado": "COMPLETADA", "motivo": "the dashboard shows it paid", "gatewayRef": charge})).await;
    assert_eq!(done["pago"]["gatewayRef"], charge.as_str());
}

/// `motivo`, `contraProveedor` and `gatewayRef` holding a NUL, which PostgreSQL cannot
/// store: a 422 naming the field on either database, the payment as it was, and the audit
/// row of the refused resolution written with the NUL as `�` (not a 503 to try again,
/// again and again, because the row could not be written).
async fn what_on_call_writes_holding_a_nul_is_422_and_changes_nothing(backend: Backend) {
    let app = app(backend).await;
    let (id, _fake) = payment_under_review(&app, "k-res-nul").await;
    let bodies = [
        (json!({"estado": "FALLIDA", "motivo": "a\u{0}b"}), "motivo"),
        (
            json!({"estado": "FALLIDA", "motivo": "ab", "contraProveedor": "a\u{0}b"}),
            "contraProveedor",
        ),
        (
            json!({"estado": "COMPLETADA", "motivo": "ab", "gatewayRef": "ch_\u{0}"}),
            "gatewayRef",
        ),
        (json!({"estado": "FALLI\u{0}DA", "motivo": "ab"}), "estado"),
    ];
    for (body, field) in bodies {
        let before = detail(&app, &id).await;
        let answer = app.resolve_as(ADMIN_TOKEN, &id, &body).await;
        let problem = problem(answer, 422, &body.to_string()).await;
        assert!(
            crate::helpers::text_has(&problem, "detail", field),
            "{field}: {problem}"
        );
        let after = detail(&app, &id).await;
        assert_eq!(after["pago"], before["pago"], "nothing changed: {body}");
        assert_eq!(after["transiciones"], before["transiciones"], "{body}");
    }
    let rows: Vec<Value> =
        crate::operator_actions::actions_as(&app, ADMIN_TOKEN, &format!("?objetivo={id}"))
            .await
            .into_iter()
            .filter(|r| r["accion"] == "resolve_payment")
            .collect();
    assert_eq!(rows.len(), 4, "one row per refused resolution: {rows:?}");
    assert!(
        rows.iter().all(|r| r["detalle"]
            .as_str()
            .is_some_and(|d| d.contains('\u{FFFD}') && d.contains("refused (422"))),
        "{rows:?}"
    );
}

/// A gateway webhook reporting a charge succeeded that commits while on-call's `FALLIDA`
/// waits to be written, after the provider was asked (its consumer's transaction: the
/// payment locked, the report written; a payment under review is kept as it is). Before,
/// the resolution wrote `FALLIDA` over it: a payment told "no money taken" with a charge
/// taken, which nothing would ever refund (the webhook was acknowledged, and the reconciler
/// does not look at `FALLIDA` payments). Now it is refused, nothing changed, and the
/// resolution asked again sees the charge. (On SQLite the resolution's audit row waits for
/// the webhook's transaction before the provider is asked, so there it sees the report
/// from the start; the window it closes there is between the question and the write.)
async fn a_charge_a_webhook_reports_succeeded_while_fallida_is_being_written_refuses_it(
    backend: Backend,
) {
    let app = app(backend.clone()).await;
    let (id, fake) = payment_under_review(&app, "k-res-race").await;
    fake.settle(&id, "declined");
    let charge = "ch_reported_late";
    let body = json!({"estado": "FALLIDA", "motivo": "declined at the provider"});
    refused_while_a_report_commits(&app, &backend, &id, charge, &body).await;

    // Asked again, the resolution sees the charge and says the way.
    let again = disagreed(&app, &id, &body).await;
    assert!(ids_in(&again).contains(&charge.to_owned()), "{again}");
    assert!(
        crate::helpers::text_has(&again, "detail", "reembolsar"),
        "{again}"
    );
}

/// The same for `COMPLETADA` on the payment's own charge: a second charge reported
/// succeeded while the resolution is written would stay with the customer, nothing
/// looking at a COMPLETADA payment again. Refused, both charges listed.
async fn a_second_charge_a_webhook_reports_while_completada_is_being_written_refuses_it(
    backend: Backend,
) {
    let app = app(backend.clone()).await;
    let (id, fake) = payment_under_review(&app, "k-res-race-2").await;
    fake.settle(&id, "succeeded");
    let own = fake.charge_ids(&id).remove(0);
    let body = json!({"estado": "COMPLETADA", "motivo": "paid", "gatewayRef": own});
    let problem = refused_while_a_report_commits(&app, &backend, &id, "ch_second", &body).await;
    assert!(ids_in(&problem).contains(&own), "{problem}");
    assert!(
        crate::helpers::text_has(&problem, "detail", "charged more than once"),
        "{problem}"
    );
}

/// On-call's resolution `body` of `id` while a webhook's report of `charge` succeeded is
/// being written (its transaction holding the payment, as the consumer's does) and commits
/// 1.5 s later: refused (409 `provider-disagrees`, the charge listed), nothing changed.
async fn refused_while_a_report_commits(
    app: &TestApp,
    backend: &Backend,
    id: &str,
    charge: &str,
    body: &Value,
) -> Value {
    use pagos::entities::webhook_charge;
    use sea_orm::{ConnectionTrait, EntityTrait, TransactionTrait};
    let payment = app.payment(id).await;
    let webhook = app.db.begin().await.expect("begin");
    if matches!(backend, Backend::Postgres(_)) {
        webhook
            .execute_unprepared(&format!(
                "SELECT 1 FROM payments WHERE id = '{}' FOR UPDATE",
                payment.id
            ))
            .await
            .expect("the payment locked");
    }
    let at = chrono::Utc::now();
    webhook_charge::Entity::insert(webhook_charge::ActiveModel::from(webhook_charge::Model {
        source: "http".into(),
        charge_id: charge.into(),
        reference: payment.id.to_string(),
        payment_id: Some(payment.id),
        status: webhook_charge::ReportedStatus::Succeeded,
        amount: payment.amount,
        currency: payment.currency.clone(),
        decline_code: None,
        last_sequence: 1,
        last_event_id: "evt_late".into(),
        first_seen_at: at,
        updated_at: at,
    }))
    .exec(&webhook)
    .await
    .expect("the report, not committed yet");

    let before = detail(app, id).await;
    let resolving = {
        let request = app
            .http
            .post(app.url(&format!("/admin/pagos/{id}/resolucion")))
            .bearer_auth(ADMIN_TOKEN)
            .json(body);
        tokio::spawn(async move { request.send().await.expect("sent") })
    };
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    webhook
        .commit()
        .await
        .expect("the webhook's transaction commits");
    let answer = resolving.await.expect("answered");
    let problem = problem(answer, 409, &body.to_string()).await;
    assert_eq!(problem["type"], "/problems/provider-disagrees", "{problem}");
    assert!(ids_in(&problem).contains(&charge.to_owned()), "{problem}");
    let after = detail(app, id).await;
    assert_eq!(after["pago"]["estado"], "REVISION_MANUAL", "{after}");
    assert_eq!(
        after["transiciones"], before["transiciones"],
        "nothing changed"
    );
    problem
}

/// The provider's search still shows the payment's charge succeeded, but its webhooks
/// reported it failed since (Mercado Pago's `charged_back` or `refunded` done in its own
/// dashboard; a search lags behind its events). Before, `COMPLETADA` was taken on the
/// search's word: the merchant told money was taken that the provider says is not, and
/// nothing looked at the payment again. Now it is refused, nothing changed; on-call who
/// read the dashboard overrules it by saying why.
async fn completada_is_refused_while_the_providers_webhooks_report_its_charge_failed_since(
    backend: Backend,
) {
    use pagos::entities::webhook_charge;
    use sea_orm::EntityTrait;
    let app = app(backend).await;
    let (id, fake) = payment_under_review(&app, "k-res-reversed").await;
    fake.settle(&id, "succeeded");
    let charge = fake.charge_ids(&id).remove(0);
    let payment = app.payment(&id).await;
    let at = chrono::Utc::now();
    webhook_charge::Entity::insert(webhook_charge::ActiveModel::from(webhook_charge::Model {
        source: "http".into(),
        charge_id: charge.clone(),
        reference: payment.id.to_string(),
        payment_id: Some(payment.id),
        status: webhook_charge::ReportedStatus::Declined,
        amount: payment.amount,
        currency: payment.currency.clone(),
        decline_code: Some("charged_back".into()),
        last_sequence: 3,
        last_event_id: "evt_reversed".into(),
        first_seen_at: at,
        updated_at: at,
    }))
    .exec(&app.db)
    .await
    .expect("the provider's report");

    let body = json!({"estado": "COMPLETADA", "motivo": "the provider shows it paid", "gatewayRef": charge});
    let problem = disagreed(&app, &id, &body).await;
    assert!(ids_in(&problem).contains(&charge), "{problem}");
    for said in ["charged_back", "contraProveedor"] {
        assert!(
            crate::helpers::text_has(&problem, "detail", said),
            "{said}: {problem}"
        );
    }
    let without_ref = json!({"estado": "COMPLETADA", "motivo": "the provider shows it paid"});
    disagreed(&app, &id, &without_ref).await;

    let overruled = json!({"estado": "COMPLETADA", "motivo": "the dispute was won",
                           "contraProveedor": "the dashboard shows the dispute won, money kept"});
    let done = resolved(&app, &id, &overruled).await;
    assert_eq!(done["pago"]["gatewayRef"], charge.as_str(), "{done}");
}

/// After `FALLIDA` with `reembolsar` the last audit rows are the refunds' (`FALLIDA` →
/// `FALLIDA`), not on-call's: on-call's row is the last one out of `REVISION_MANUAL`,
/// which is the one runbooks/revision-manual.md tells on-call to read, in the answer and
/// in the payment's detail.
async fn after_a_resolution_that_refunds_on_calls_row_is_the_last_out_of_review_as_the_runbook_reads_it(
    backend: Backend,
) {
    let app = app(backend).await;
    let (id, fake) = payment_under_review(&app, "k-res-rows").await;
    fake.settle(&id, "succeeded");
    let refunds = crate::refunds::FakeRefunds::default();
    refunds.mount_refunds(app.gateway()).await;
    let body =
        json!({"estado": "FALLIDA", "reembolsar": true, "motivo": "ticket 41: charged after all"});
    let done = resolved(&app, &id, &body).await;
    assert_eq!(done["reembolsos"][0]["estado"], "COMPLETADO", "{done}");
    assert_eq!(refunds.made().len(), 1);
    for answer in [done, detail(&app, &id).await] {
        let rows = answer["transiciones"].as_array().expect("audit rows");
        let last = rows.last().expect("a row");
        assert_eq!(
            last["desde"], "FALLIDA",
            "a refund's row is the last: {last}"
        );
        let ours = rows
            .iter()
            .rev()
            .find(|t| t["desde"] == "REVISION_MANUAL")
            .expect("on-call's row");
        assert_eq!(ours["hacia"], "FALLIDA", "{ours}");
        assert_eq!(ours["quien"], "admin", "{ours}");
        assert!(
            crate::helpers::text_has(ours, "motivo", "resolved by admin (on-call): ticket 41"),
            "{ours}"
        );
    }
    let runbook = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/runbooks/revision-manual.md"
    ))
    .expect("the runbook");
    assert!(
        !runbook
            .lines()
            .any(|l| l.contains("jq ") && l.contains(".transiciones[-1]")),
        "runbooks/revision-manual.md reads the last audit row as on-call's"
    );
    assert_eq!(
        runbook
            .matches(r#"[.transiciones[] | select(.desde == "REVISION_MANUAL")] | last"#)
            .count(),
        2,
        "the resolve and the verify commands select on-call's row"
    );
}

on_both_databases!(
    naming_another_merchants_charge_while_the_provider_is_down_is_refused_and_recorded,
    naming_another_payments_charge_is_refused_even_overruling_a_provider_that_answers,
    a_charge_the_providers_webhooks_reported_for_another_reference_is_refused,
    the_console_form_naming_another_merchants_charge_is_refused_on_its_page,
);

/// On-call's resolution `body` of `id` is refused with `409
/// charge-belongs-to-another-payment` naming `charge`, and the payment and its audit trail
/// are as they were, still under review; the problem.
async fn charge_refused(app: &TestApp, id: &str, body: &Value, charge: &str) -> Value {
    let before = detail(app, id).await;
    let answer = app.resolve_as(ADMIN_TOKEN, id, body).await;
    let problem = problem(answer, 409, &body.to_string()).await;
    assert_eq!(
        problem["type"], "/problems/charge-belongs-to-another-payment",
        "{problem}"
    );
    assert_eq!(problem["cargo"], charge, "{problem}");
    assert!(
        crate::helpers::text_has(&problem, "detail", charge),
        "{problem}"
    );
    let after = detail(app, id).await;
    assert_eq!(after["pago"]["estado"], "REVISION_MANUAL", "{body}");
    assert_eq!(after["pago"], before["pago"], "nothing changed: {body}");
    assert_eq!(after["transiciones"], before["transiciones"], "{body}");
    problem
}

/// The newest `resolve_payment` row of who asked, on payment `id`.
async fn last_resolution_row(app: &TestApp, id: &str) -> Value {
    crate::operator_actions::actions_as(app, ADMIN_TOKEN, &format!("?objetivo={id}"))
        .await
        .into_iter()
        .find(|r| r["accion"] == "resolve_payment")
        .expect("a row of the resolution")
}

/// A payment of merchant globex, paid at `fake`: its id and its charge.
async fn globex_paid(app: &TestApp, fake: &FakeGateway, key: &str) -> (String, String) {
    fake.set_new_status("succeeded");
    let paid = json(
        app.pay_as(crate::helpers::OTHER_API_KEY, key, &payment_body())
            .await,
    )
    .await;
    assert_eq!(paid["estado"], "COMPLETADA", "{paid}");
    let id = paid["id"].as_str().expect("id").to_owned();
    (id, paid["gatewayRef"].as_str().expect("charge").to_owned())
}

/// Merchant B's charge named on merchant A's payment under review while the provider
/// cannot be asked. Before, on-call's word was taken as it stood: A's payment COMPLETADA
/// on B's charge, and A's next refund refunded B's customer (B's own refund then found
/// nothing left). Now it is refused, COMPLETADA or FALLIDA, nothing changed, the refusal
/// in the audit trail, never naming B's payment; A's own charge still resolves it.
async fn naming_another_merchants_charge_while_the_provider_is_down_is_refused_and_recorded(
    backend: Backend,
) {
    let app = app(backend).await;
    let (id, fake) = payment_under_review(&app, "k-res-owner-1").await;
    let own = fake.charge_ids(&id).remove(0);
    let (theirs, their_charge) = globex_paid(&app, &fake, "k-res-owner-globex").await;
    fake.fail_lookups(true);

    for estado in ["COMPLETADA", "FALLIDA"] {
        let body = json!({"estado": estado, "motivo": "ticket 7: the dashboard shows it", "gatewayRef": their_charge});
        let problem = charge_refused(&app, &id, &body, &their_charge).await;
        assert!(problem.get("pagoId").is_none(), "{problem}");
        assert!(
            crate::helpers::text_has(&problem, "detail", "another merchant"),
            "{problem}"
        );
        assert!(!problem.to_string().contains(&theirs), "{problem}");
        let row = last_resolution_row(&app, &id).await;
        let said = row["detalle"].as_str().unwrap_or_default();
        assert!(
            said.contains("refused (409 charge-belongs-to-another-payment)"),
            "{row}"
        );
        assert!(
            said.contains(estado) && said.contains(&their_charge),
            "{row}"
        );
        assert!(!said.contains(&theirs), "{row}");
    }
    assert_eq!(app.payment(&theirs).await.gateway_ref, Some(their_charge));

    completed_on_its_own_charge(&app, &id, &own, "ticket 7: its own charge").await;
}

/// `contraProveedor` overrules what the provider shows of this payment, never whose a
/// charge is: another payment's charge (here the same merchant's, which the refusal names)
/// is refused overruled too, while the provider answers; this payment's own charge, once
/// it succeeded, is taken.
async fn naming_another_payments_charge_is_refused_even_overruling_a_provider_that_answers(
    backend: Backend,
) {
    let app = app(backend).await;
    let (id, fake) = payment_under_review(&app, "k-res-owner-2").await;
    let own = fake.charge_ids(&id).remove(0);
    fake.set_new_status("succeeded");
    let other = json(app.pay("k-res-owner-2b", &payment_body()).await).await;
    assert_eq!(other["estado"], "COMPLETADA", "{other}");
    let other_id = other["id"].as_str().expect("id").to_owned();
    let others_charge = other["gatewayRef"].as_str().expect("charge").to_owned();

    for estado in ["COMPLETADA", "FALLIDA"] {
        let body = json!({"estado": estado, "motivo": "ticket 8", "gatewayRef": others_charge,
                          "contraProveedor": "the dashboard shows it captured for this order"});
        let problem = charge_refused(&app, &id, &body, &others_charge).await;
        assert_eq!(problem["pagoId"], other_id.as_str(), "{problem}");
        assert!(
            crate::helpers::text_has(&problem, "detail", &other_id),
            "{problem}"
        );
        let row = last_resolution_row(&app, &id).await;
        assert!(
            crate::helpers::text_has(
                &row,
                "detalle",
                "refused (409 charge-belongs-to-another-payment)"
            ),
            "{row}"
        );
    }

    fake.settle(&id, "succeeded");
    let done = resolved(
        &app,
        &id,
        &json!({"estado": "COMPLETADA", "motivo": "ticket 8: its own", "gatewayRef": own,
                "contraProveedor": "checked in the dashboard"}),
    )
    .await;
    assert_eq!(done["pago"]["gatewayRef"], own.as_str());
}

/// A charge the provider's own webhooks reported for another reference (an orphan charge:
/// no payment of pagos records it) is not this payment's, whatever on-call says.
async fn a_charge_the_providers_webhooks_reported_for_another_reference_is_refused(
    backend: Backend,
) {
    let app = crate::helpers::started(
        backend,
        &[
            "--give-up-after",
            "1s",
            "--stale-after",
            "1s",
            "--webhook-secret",
            crate::compensation::SECRET,
        ],
    )
    .await;
    let (id, fake) = payment_under_review(&app, "k-res-owner-3").await;
    let elsewhere = uuid::Uuid::new_v4().to_string();
    let reported = json!({"id": "ch_reported_elsewhere", "status": "succeeded", "amount": 250000,
                          "currency": "COP", "reference": elsewhere, "declineCode": null});
    let answer =
        crate::compensation::deliver_event(&app, "evt_elsewhere", "charge.updated", 1, reported)
            .await;
    assert_eq!(answer, "huerfano");
    fake.fail_lookups(true);

    for overrule in [None, Some("the dashboard shows it paid this order")] {
        let mut body = json!({"estado": "COMPLETADA", "motivo": "ticket 9",
                              "gatewayRef": "ch_reported_elsewhere"});
        if let Some(why) = overrule {
            body["contraProveedor"] = why.into();
        }
        let problem = charge_refused(&app, &id, &body, "ch_reported_elsewhere").await;
        assert_eq!(problem["fuente"], "webhook", "{problem}");
        assert!(
            crate::helpers::text_has(&problem, "detail", "webhooks reported"),
            "{problem}"
        );
    }
}

/// The console's resolve form names a charge too, and reaches the same check: another
/// merchant's charge, while the provider cannot be asked, is refused on the payment's page
/// (409), nothing changed.
async fn the_console_form_naming_another_merchants_charge_is_refused_on_its_page(backend: Backend) {
    let app = app(backend).await;
    let (id, fake) = payment_under_review(&app, "k-res-owner-4").await;
    let (theirs, their_charge) = globex_paid(&app, &fake, "k-res-owner-globex-4").await;
    fake.fail_lookups(true);
    let token = crate::operators::operator(&app, "bea", pagos::operators::Role::Operador).await;
    let cookie = format!(
        "pagos_consola={}",
        crate::console::log_in(&app, &token).await
    );
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let page = client
        .get(app.url(&format!("/consola/pagos/{id}")))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("page")
        .text()
        .await
        .expect("html");
    let at = page.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    let csrf = page[at..].split('"').next().expect("csrf").to_owned();
    let before = detail(&app, &id).await;

    let answer = client
        .post(app.url(&format!("/consola/pagos/{id}/resolver")))
        .header("cookie", &cookie)
        .form(&[
            ("estado", "COMPLETADA"),
            ("motivo", "ticket 10: the dashboard shows it"),
            ("gatewayRef", their_charge.as_str()),
            ("csrf", csrf.as_str()),
        ])
        .send()
        .await
        .expect("sent");
    assert_eq!(answer.status(), 409);
    let html = answer.text().await.expect("html");
    crate::helpers::assert_contains_all(&html, &[&their_charge, "another merchant"]);
    assert!(
        !html.contains(&theirs),
        "never the other merchant's payment"
    );
    let after = detail(&app, &id).await;
    assert_eq!(after["pago"]["estado"], "REVISION_MANUAL");
    assert_eq!(after["pago"], before["pago"], "nothing changed");
    assert_eq!(after["transiciones"], before["transiciones"]);
}
