//! What pagos does when a provider's answer is lost, as one table run once per provider
//! (the reference protocol, Stripe, Mercado Pago) against `providers::FakeProvider`, which
//! keeps each one's rules: its paths, its key header, its search, its error shapes.

use crate::helpers::{Backend, TestApp, json};
use crate::on_both_databases;
use crate::providers::{ALL, Next, Provider};
use serde_json::Value;
use std::time::Duration;

on_both_databases!(every_scenario_of_the_table_holds_for_every_provider);

/// A lost answer, and what the reconciler must make of it.
#[derive(Clone, Copy, Debug)]
enum Scenario {
    /// Charged, the answer lost to the timeout; search finds the charge: settled from it,
    /// nothing resent.
    TimeoutThenSearchFindsTheCharge,
    /// Not charged (a 5xx); search finds nothing inside the key window: resent with the
    /// same key and the same body, charged once.
    SearchMissInsideTheKeyWindowResendsWithTheSameKey,
    /// Not charged (a 5xx); search finds nothing outside the key window: never resent,
    /// REVISION_MANUAL.
    SearchMissOutsideTheKeyWindowGoesToManualReview,
}

const TABLE: [Scenario; 3] = [
    Scenario::TimeoutThenSearchFindsTheCharge,
    Scenario::SearchMissInsideTheKeyWindowResendsWithTheSameKey,
    Scenario::SearchMissOutsideTheKeyWindowGoesToManualReview,
];

const QUICK: [&str; 4] = ["--gateway-timeout", "200ms", "--gateway-retries", "0"];

async fn every_scenario_of_the_table_holds_for_every_provider(backend: Backend) {
    for scenario in TABLE {
        for provider in ALL {
            run(scenario, provider, backend.clone()).await;
        }
    }
}

/// Pays once with a fresh fake of `provider`; the payment's id, answered 202.
async fn pay_unknown(app: &TestApp, provider: Provider) -> String {
    let answer = app.pay("k-lost", &provider.payment(250_000)).await;
    let status = answer.status().as_u16();
    let pago: Value = json(answer).await;
    assert_eq!(status, 202, "{provider:?}: {pago}");
    assert_eq!(pago["estado"], "ENVIADA", "{provider:?}");
    pago["id"].as_str().expect("id").to_owned()
}

fn report_says(report: &Value, field: &str, case: &str) {
    assert_eq!(report["examinados"], 1, "{case}: {report}");
    assert_eq!(report[field], 1, "{case}: {report}");
}

async fn run(scenario: Scenario, provider: Provider, backend: Backend) {
    let case = format!("{scenario:?} with {provider:?}");
    match scenario {
        Scenario::TimeoutThenSearchFindsTheCharge => {
            let (app, fake) = provider.spawn(backend, &QUICK).await;
            fake.next([Next::AnswerLate(Duration::from_secs(2))]);
            let id = pay_unknown(&app, provider).await;

            report_says(&app.reconcile(&id).await, "completados", &case);
            let payment = app.payment(&id).await;
            assert_eq!(payment.state, "COMPLETADA", "{case}");
            assert!(payment.gateway_ref.is_some(), "{case}: the charge's id");
            assert_eq!(fake.creates().len(), 1, "{case}: found, nothing resent");
            assert_eq!(fake.charges(), 1, "{case}");
            assert_eq!(fake.searches(), [id], "{case}: searched by its reference");
        }
        Scenario::SearchMissInsideTheKeyWindowResendsWithTheSameKey => {
            let (app, fake) = provider.spawn(backend, &QUICK).await;
            fake.next([Next::Refuse(500)]);
            let id = pay_unknown(&app, provider).await;

            report_says(&app.reconcile(&id).await, "completados", &case);
            let sent = fake.creates();
            assert_eq!(sent.len(), 2, "{case}: the first try and the resend");
            assert_eq!(sent[0].key, sent[1].key, "{case}: the same key");
            assert_eq!(sent[0].body, sent[1].body, "{case}: the same body");
            assert_eq!(fake.charges(), 1, "{case}: one charge");
            assert_eq!(app.payment(&id).await.state, "COMPLETADA", "{case}");
        }
        Scenario::SearchMissOutsideTheKeyWindowGoesToManualReview => {
            let mut flags = QUICK.to_vec();
            flags.extend(["--gateway-key-window", "1s"]);
            // A window shorter than a look at the reconciler's pace, which the start-up
            // checks refuse: here it stands for a window that has passed.
            let spawn = crate::helpers::Spawn::new(backend).flags(&flags);
            let (app, fake) = provider.spawn_as(spawn.unvalidated()).await;
            fake.next([Next::Refuse(500)]);
            let id = pay_unknown(&app, provider).await;
            tokio::time::sleep(Duration::from_millis(1100)).await;

            report_says(&app.reconcile(&id).await, "revisionManual", &case);
            assert_eq!(
                fake.creates().len(),
                1,
                "{case}: never resent outside the window"
            );
            assert_eq!(fake.charges(), 0, "{case}");
            assert_eq!(app.payment(&id).await.state, "REVISION_MANUAL", "{case}");
        }
    }
}
