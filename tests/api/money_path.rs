//! The money path's wrong answers, each reproduced: a refusal after a try that may have
//! charged, a gateway key a gateway still remembers, the gateway's "same key, other
//! request" read as a decline, provider look-ups driven by client retries, two workers on
//! one payment, and personal data kept after it is needed. Once per provider where the
//! provider's answers matter.

use crate::helpers::{Backend, FakeGateway, Spawn, TestApp, json, payment_body};
use crate::on_both_databases;
use crate::providers::{ALL, FakeProvider, Next, Provider};
use pagos::entities::{idempotency_key, payment};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};
use serde_json::Value;
use std::time::Duration;

on_both_databases!(
    a_refused_resend_leaves_a_payment_that_may_be_charged_unknown_until_a_lookup_reads_it,
    a_key_the_gateway_holds_for_another_request_is_never_a_decline,
    a_client_key_reused_after_its_purge_reaches_the_gateway_with_a_new_key,
    a_payment_made_before_generations_keeps_its_key_and_reference,
    client_retries_ask_the_provider_at_most_once_per_backoff_step,
    reconcile_now_leaves_a_payment_a_request_is_sending_alone,
    card_token_and_payer_data_are_erased_once_the_payment_is_final,
    a_charge_the_gateway_reports_in_lower_case_currency_is_the_payments_own,
    a_charge_that_is_not_the_payments_own_never_settles_it_declined_or_not,
    a_pending_charge_its_search_does_not_show_is_never_resent_and_goes_to_review_keeping_it,
    a_look_up_finding_a_pending_charge_that_is_not_the_payments_own_goes_to_review,
    a_reference_gateways_decline_code_charged_back_is_a_decline_like_any_other,
    a_settlement_the_database_refuses_is_503_then_409_then_the_charges_own_answer,
    a_retry_declined_as_a_duplicate_of_the_first_tries_charge_is_settled_by_that_charge,
);

/// The first try charges but its answer is lost to the timeout; the provider forgets the
/// key, and declines the retry as a duplicate of that very charge (Mercado Pago's
/// `cc_rejected_duplicated_payment`, Stripe's `duplicate_transaction`). Before, the
/// payment was answered 402 `FALLIDA`, the customer charged. Now it is not known yet (202),
/// and the reconciler, finding the charge beside its duplicate's decline, settles it
/// COMPLETADA by that charge: one charge, never a second.
async fn a_retry_declined_as_a_duplicate_of_the_first_tries_charge_is_settled_by_that_charge(
    backend: Backend,
) {
    for provider in ALL {
        let (app, fake) = provider
            .spawn(
                backend.clone(),
                &["--gateway-timeout", "200ms", "--gateway-retries", "1"],
            )
            .await;
        fake.next([
            Next::AnswerLate(Duration::from_secs(2)),
            Next::DeclineAsDuplicate,
        ]);
        let (status, pago) = app.pay_read("k-dup", &provider.payment(250_000)).await;
        assert_eq!(status, 202, "{provider:?}: never told declined: {pago}");
        let id = pago["id"].as_str().expect("id").to_owned();
        let report = app.reconcile(&id).await;
        assert_eq!(report["completados"], 1, "{provider:?}: {report}");
        let payment = app.payment(&id).await;
        assert_eq!(payment.state, "COMPLETADA", "{provider:?}");
        assert_eq!(
            payment.gateway_ref.as_deref(),
            Some(provider.charge_id(1).as_str()),
            "{provider:?}: the first try's charge"
        );
        assert_eq!(fake.charges(), 1, "{provider:?}: one charge");
    }
}

async fn a_refused_resend_leaves_a_payment_that_may_be_charged_unknown_until_a_lookup_reads_it(
    backend: Backend,
) {
    for provider in ALL {
        let (app, fake) = provider
            .spawn(
                backend.clone(),
                &["--gateway-timeout", "200ms", "--gateway-retries", "0"],
            )
            .await;
        // Charged, but the answer is lost to the timeout; search has not indexed it yet.
        fake.next([Next::AnswerLate(Duration::from_secs(2))]);
        fake.search_lags(true);
        let (status, pago) = app.pay_read("k-charged", &provider.payment(250_000)).await;
        assert_eq!(status, 202, "{provider:?}: {pago}");
        let id = pago["id"].as_str().expect("id").to_owned();

        // The reconciler resends with the same key: the credentials were rolled (401),
        // then the request is refused (400). Neither says anything about the charge the
        // first try made.
        for refused in [401, 400] {
            fake.next([Next::Refuse(refused)]);
            let report = app.reconcile(&id).await;
            assert_eq!(report["fallidos"], 0, "{provider:?} {refused}: {report}");
            let payment = app.payment(&id).await;
            assert_eq!(
                payment.state, "ENVIADA",
                "{provider:?}: a {refused} to a resend must not fail a payment that may be charged"
            );
        }
        let (status, _) = app.pay_read("k-charged", &provider.payment(250_000)).await;
        assert_eq!(
            status, 202,
            "{provider:?}: the retry is told it is not known yet"
        );

        // Search catches up: the charge is read, and that settles it.
        fake.search_lags(false);
        let report = app.reconcile(&id).await;
        assert_eq!(report["completados"], 1, "{provider:?}: {report}");
        let (status, pago) = app.pay_read("k-charged", &provider.payment(250_000)).await;
        assert_eq!(status, 201, "{provider:?}: {pago}");
        assert_eq!(pago["estado"], "COMPLETADA");
        assert_eq!(fake.charges(), 1, "{provider:?}");
    }
}

async fn a_key_the_gateway_holds_for_another_request_is_never_a_decline(backend: Backend) {
    for provider in ALL {
        let (app, fake) = provider
            .spawn(backend.clone(), &["--gateway-retries", "0"])
            .await;
        let merchant = merchant_id(&app).await;
        // The provider already holds a charge under the gateway key this payment will
        // derive, made with another request (a payment the database forgot, retried
        // with another amount).
        let derived = pagos::idempotency::derive::derive(
            merchant,
            &pagos::idempotency::IdempotencyKey::parse(b"k-held").expect("key"),
            0,
        );
        preload(&app, &fake, &derived.gateway_key, &derived.payment_id, 999).await;
        let (status, pago) = app.pay_read("k-held", &provider.payment(250_000)).await;
        assert_eq!(
            status, 202,
            "{provider:?}: a charge exists under the key; pagos must not say no money was taken: {pago}"
        );
        assert_eq!(pago["estado"], "ENVIADA");
        // The look-up finds that charge: for another amount, so on-call decides.
        let id = pago["id"].as_str().expect("id").to_owned();
        let report = app.reconcile(&id).await;
        assert_eq!(report["revisionManual"], 1, "{provider:?}: {report}");
        assert_eq!(fake.charges(), 1, "{provider:?}: never a second charge");
    }
}

/// Makes the provider hold a charge for `amount` under `key` and `reference`, by sending
/// it the request another pagos payment would have sent.
async fn preload(
    app: &TestApp,
    fake: &FakeProvider,
    key: &str,
    reference: &uuid::Uuid,
    amount: i64,
) {
    use pagos::gateway::ChargeRequest;
    let body = fake.provider.payment(amount);
    let method = pagos::domain::NewPayment::from_json(&body)
        .expect("valid body")
        .payment_method;
    let settings = crate::helpers::settings(
        "sqlite::memory:",
        &[
            "--gateway",
            fake.provider.gateway(),
            "--gateway-url",
            &app.gateway().uri(),
            "--gateway-secret",
            crate::helpers::gateway_secret(fake.provider.gateway()),
        ],
    );
    let gateway = pagos::app::gateway_from(&settings).expect("gateway");
    gateway
        .charge(&ChargeRequest {
            gateway_key: key.to_owned(),
            amount,
            currency: "COP".into(),
            reference: *reference,
            description: None,
            payment_method: method,
        })
        .await
        .expect("charged");
}

async fn merchant_id(app: &TestApp) -> uuid::Uuid {
    crate::helpers::acme(&app.db).await
}

async fn purge_every_final_key(app: &TestApp) {
    let far = pagos::db::now() + chrono::TimeDelta::days(2);
    let purged = pagos::reaper::purge_keys(&app.db, far, 1000)
        .await
        .expect("purge");
    assert!(purged > 0, "the key was purged");
}

async fn a_client_key_reused_after_its_purge_reaches_the_gateway_with_a_new_key(backend: Backend) {
    for provider in ALL {
        // The purge below is the reaper two days from now, while this process lives on in
        // the present: its replay cache, whose entries end before the reaper could delete
        // their key, has no such future, so it is off here (src/idempotency/cache.rs).
        let (app, fake) = provider
            .spawn(backend.clone(), &["--replay-cache-mib", "0"])
            .await;
        let mut ids = Vec::new();
        for round in 0..3 {
            let (status, pago) = app.pay_read("k-reused", &provider.payment(250_000)).await;
            assert_eq!(status, 201, "{provider:?} round {round}: {pago}");
            let answer = app.pay_read("k-reused", &provider.payment(250_000)).await;
            assert_eq!(answer.1["id"], pago["id"], "a replay while the key lives");
            ids.push(pago["id"].as_str().expect("id").to_owned());
            purge_every_final_key(&app).await;
        }
        let made = fake.creates();
        assert_eq!(made.len(), 3, "{provider:?}: three payments, three sends");
        assert_eq!(
            fake.charges(),
            3,
            "{provider:?}: each reuse of the key is a new charge, not the old one replayed"
        );
        for (i, a) in made.iter().enumerate() {
            for b in &made[i + 1..] {
                assert_ne!(a.key, b.key, "{provider:?}: a gateway key per payment");
                assert_ne!(a.reference, b.reference, "{provider:?}");
            }
        }
        assert!(made[1].key.ends_with("-1") && made[2].key.ends_with("-2"));
        for (i, id) in ids.iter().enumerate() {
            let p = app.payment(id).await;
            assert_eq!(p.generation, i as i32);
            assert_eq!(p.state, "COMPLETADA");
            assert_eq!(made[i].reference, *id, "the reference is the payment id");
        }
    }
}

async fn a_payment_made_before_generations_keeps_its_key_and_reference(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    let fake = FakeProvider::new(Provider::Reference);
    fake.mount(app.gateway()).await;
    fake.search_lags(true);
    let merchant = merchant_id(&app).await;
    // A payment registered by an earlier version: a random (v7) id, the gateway key of
    // that version, sent once and left ENVIADA; its key already purged.
    let old_key = format!(
        "pagos-{}-{}",
        merchant.simple(),
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"k-legacy"))
    );
    let at = pagos::db::now() - chrono::TimeDelta::minutes(5);
    let row = crate::helpers::left_payment(
        merchant,
        "k-legacy",
        pagos::entities::payment::PaymentState::Enviada,
        1,
        old_key.clone(),
        at,
    );
    let id = row.id;
    payment::Entity::insert(payment::ActiveModel::from(row))
        .exec_without_returning(&app.db)
        .await
        .expect("seed");

    let report = app.reconcile(&id.to_string()).await;
    assert_eq!(report["completados"], 1, "{report}");
    let made = fake.creates();
    assert_eq!(made.len(), 1);
    assert_eq!(
        made[0].key, old_key,
        "resent with the key it was first sent with"
    );
    assert_eq!(
        made[0].reference,
        id.to_string(),
        "and its own id as reference"
    );

    // The same client key now makes a new payment: a gateway key of its own.
    let (status, pago) = app.pay_read("k-legacy", &payment_body()).await;
    assert_eq!(status, 201, "{pago}");
    assert_ne!(pago["id"], id.to_string());
    let made = fake.creates();
    assert_eq!(made.len(), 2);
    assert_eq!(made[1].key, format!("{old_key}-1"));
    assert_eq!(fake.charges(), 2);
}

async fn lookups(app: &TestApp) -> usize {
    crate::helpers::received(app.gateway(), "GET", |p| p == "/v1/charges")
        .await
        .len()
}

async fn retry_many(app: &TestApp, key: &'static str, n: usize) -> Vec<reqwest::Response> {
    let body = payment_body();
    let retries = (0..n).map(|_| app.pay(key, &body));
    futures::future::join_all(retries).await
}

async fn client_retries_ask_the_provider_at_most_once_per_backoff_step(backend: Backend) {
    let app = crate::helpers::started(backend, &["--stale-after", "1s"]).await;
    app.with_fake(FakeGateway::charging("pending")).await;
    let (status, pago) = app.pay_read("k-pending", &payment_body()).await;
    assert_eq!(status, 202, "{pago}");
    let id = pago["id"].as_str().expect("id").to_owned();
    assert_eq!(lookups(&app).await, 0);

    // Due: ten retries at once. One of them asks the provider; the others get the
    // current state without asking.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    for answer in retry_many(&app, "k-pending", 10).await {
        assert_eq!(answer.status(), 202);
        let wait = crate::helpers::retry_after_secs(&answer);
        assert!(wait >= 1, "Retry-After says when asking again makes sense");
    }
    assert_eq!(lookups(&app).await, 1, "one look-up for ten retries");

    // Its request died holding the key (a crash, simulated): however many retries come,
    // one look-up per backoff step.
    let past = pagos::db::now() - chrono::TimeDelta::seconds(5);
    idempotency_key::Entity::update_many()
        .col_expr(idempotency_key::Column::LeaseUntil, Expr::value(Some(past)))
        .exec(&app.db)
        .await
        .expect("expire the lease");
    payment::Entity::update_many()
        .col_expr(payment::Column::NextAttemptAt, Expr::value(past))
        .col_expr(payment::Column::ClaimedUntil, Expr::value(Some(past)))
        .filter(payment::Column::Id.eq(uuid::Uuid::parse_str(&id).expect("uuid")))
        .exec(&app.db)
        .await
        .expect("make it due");
    for _ in 0..10 {
        let (status, _) = app.pay_read("k-pending", &payment_body()).await;
        assert_eq!(status, 202);
    }
    assert_eq!(
        lookups(&app).await,
        2,
        "ten retries of a key whose request died: one more look-up, not ten"
    );
}

async fn reconcile_now_leaves_a_payment_a_request_is_sending_alone(backend: Backend) {
    let app = crate::helpers::started(backend, &["--gateway-timeout", "10s"]).await;
    let fake = app
        .with_fake(FakeGateway::charging("succeeded").with_delay(Duration::from_secs(4)))
        .await;
    let slow = app.pay_in_background("k-busy");
    crate::helpers::until("the charge reached the gateway", || {
        fake.total_charges() == 1
    })
    .await;
    let id = payment::Entity::find()
        .one(&app.db)
        .await
        .expect("query")
        .expect("registered")
        .id
        .to_string();
    let detail = json(app.admin_get(&format!("/admin/pagos/{id}")).await).await;
    assert!(
        detail["pago"]["retenidoHasta"].is_string(),
        "on-call sees who holds it until when: {detail}"
    );
    let report = app.reconcile(&id).await;
    assert_eq!(report["omitidos"], 1, "the request holds it: {report}");
    assert_eq!(lookups(&app).await, 0, "nobody else asked the provider");
    assert_eq!(slow.await.expect("joined").expect("sent").status(), 201);
    assert_eq!(fake.charges_for(&id), 1);
}

async fn card_token_and_payer_data_are_erased_once_the_payment_is_final(backend: Backend) {
    let (app, fake) = Provider::MercadoPago
        .spawn(
            backend,
            &["--gateway-timeout", "200ms", "--gateway-retries", "0"],
        )
        .await;
    fake.next([Next::AnswerLate(Duration::from_secs(2))]);
    let (status, pago) = app
        .pay_read("k-card", &Provider::MercadoPago.payment(250_000))
        .await;
    assert_eq!(status, 202, "{pago}");
    let id = pago["id"].as_str().expect("id").to_owned();
    let stored = app.payment(&id).await.payment_method.expect("kept");
    assert!(
        stored.contains("ff8080814c11e237014c1ff593b57b4d") && stored.contains("payer@example.com"),
        "kept while the payment may be resent: {stored}"
    );

    let report = app.reconcile(&id).await;
    assert_eq!(report["completados"], 1, "{report}");
    let stored = app
        .payment(&id)
        .await
        .payment_method
        .expect("the method's id stays");
    let method: Value = serde_json::from_str(&stored).expect("JSON");
    assert_eq!(method["id"], "visa", "{stored}");
    for gone in [
        "ff8080814c11e237014c1ff593b57b4d",
        "payer@example.com",
        "1020304050",
    ] {
        assert!(!stored.contains(gone), "{gone} erased: {stored}");
    }
    let (status, pago) = app
        .pay_read("k-card", &Provider::MercadoPago.payment(250_000))
        .await;
    assert_eq!(status, 201);
    assert_eq!(pago["medioPago"]["id"], "visa");
}

/// A gateway that writes currency codes in lower case (as Stripe's API does: `cop`): its
/// charge of the payment's amount is the payment's own, read from the charge's answer
/// and from a look-up alike. Before, `cop` read as another currency than `COP`, and a
/// payment the customer paid went to on-call's review instead of `COMPLETADA`.
async fn a_charge_the_gateway_reports_in_lower_case_currency_is_the_payments_own(backend: Backend) {
    let app = Spawn::new(backend)
        .flags(&["--gateway-retries", "0"])
        .start()
        .await;
    let charges: std::sync::Arc<std::sync::Mutex<Vec<Value>>> = Default::default();
    let answering = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (made, up) = (charges.clone(), answering.clone());
    charges_answered(&app, move |body: &Value| {
        let mut made = made.lock().expect("charges");
        let charge = serde_json::json!({
            "id": format!("ch_lc_{}", made.len() + 1),
            "status": "succeeded",
            "amount": body["amount"],
            "currency": body["currency"].as_str().expect("currency").to_lowercase(),
            "reference": body["reference"],
            "declineCode": null,
        });
        made.push(charge.clone());
        if up.load(std::sync::atomic::Ordering::SeqCst) {
            wiremock::ResponseTemplate::new(201).set_body_json(charge)
        } else {
            // Charged, but the answer is lost: the reconciler looks it up.
            wiremock::ResponseTemplate::new(503)
        }
    })
    .await;
    let found = charges.clone();
    crate::helpers::mount_route(
        app.gateway(),
        "GET",
        "/v1/charges",
        move |request: &wiremock::Request| {
            let reference = crate::helpers::query_param(request, "reference");
            let data: Vec<Value> = found
                .lock()
                .expect("charges")
                .iter()
                .filter(|c| c["reference"] == reference.as_str())
                .cloned()
                .collect();
            wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({ "data": data }))
        },
    )
    .await;

    // The charge's own answer.
    let (status, pago) = app.pay_read("k-lower-1", &payment_body()).await;
    assert_eq!(status, 201, "{pago}");
    assert_eq!(pago["estado"], "COMPLETADA", "{pago}");
    assert_eq!(pago["moneda"], "COP");

    // A look-up's.
    answering.store(false, std::sync::atomic::Ordering::SeqCst);
    let (status, pago) = app.pay_read("k-lower-2", &payment_body()).await;
    assert_eq!(status, 202, "{pago}");
    let id = pago["id"].as_str().expect("id").to_owned();
    let report = app.reconcile(&id).await;
    assert_eq!(report["completados"], 1, "{report}");
    assert_eq!(app.payment(&id).await.state, "COMPLETADA");
    assert_eq!(charges.lock().expect("charges").len(), 2, "one charge each");
}

/// A gateway that answers a key with the charge of the key's earlier request (the database
/// forgot the payment, and the client retried its key with another amount), declined: the
/// gateway never evaluated this request, so it is not this payment's decline. And a look-up
/// that finds another charge than the one the provider named for the payment: a second
/// charge. Before, the first was `402` / `FALLIDA` "card declined", from the charge's answer
/// and from a look-up alike, and the second settled `COMPLETADA` on the other charge.
async fn a_charge_that_is_not_the_payments_own_never_settles_it_declined_or_not(backend: Backend) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let app = Spawn::new(backend)
        .flags(&["--gateway-retries", "0"])
        .start()
        .await;
    let sends = std::sync::Arc::new(AtomicUsize::new(0));
    let (made, found) = (sends.clone(), sends.clone());
    // Send 1: the charge's answer, declined, for the key's earlier amount. Send 2: the answer
    // is lost (503); the look-up finds the same. Send 3: pending `ch_named`; the look-up finds
    // another charge, `ch_other`, succeeded.
    let declined_earlier = |reference: &Value| {
        serde_json::json!({"id": "ch_earlier", "status": "declined", "amount": 250000,
            "currency": "COP", "reference": reference, "declineCode": "card_declined"})
    };
    charges_answered(&app, move |body: &Value| {
        match made.fetch_add(1, Ordering::SeqCst) {
            0 => wiremock::ResponseTemplate::new(201)
                .set_body_json(declined_earlier(&body["reference"])),
            1 => wiremock::ResponseTemplate::new(503),
            _ => wiremock::ResponseTemplate::new(201).set_body_json(serde_json::json!({
                    "id": "ch_named", "status": "pending", "amount": body["amount"],
                    "currency": "COP", "reference": body["reference"], "declineCode": null})),
        }
    })
    .await;
    crate::helpers::mount_route(
        app.gateway(),
        "GET",
        "/v1/charges",
        move |request: &wiremock::Request| {
            let reference = Value::from(crate::helpers::query_param(request, "reference"));
            let charge = if found.load(Ordering::SeqCst) <= 2 {
                declined_earlier(&reference)
            } else {
                serde_json::json!({"id": "ch_other", "status": "succeeded", "amount": 990000,
                    "currency": "COP", "reference": reference, "declineCode": null})
            };
            wiremock::ResponseTemplate::new(200)
                .set_body_json(serde_json::json!({ "data": [charge] }))
        },
    )
    .await;
    let body = serde_json::json!({"creditoId": "42", "monto": 990000, "moneda": "COP"});

    // The charge's own answer.
    let (status, pago) = app.pay_read("k-not-own-1", &body).await;
    assert_eq!(
        status, 202,
        "a decline of another amount is not this payment's decline: {pago}"
    );
    assert_eq!(pago["estado"], "REVISION_MANUAL", "{pago}");
    assert_eq!(pago["gatewayRef"], "ch_earlier", "{pago}");

    // A look-up's.
    let (status, pago) = app.pay_read("k-not-own-2", &body).await;
    assert_eq!(status, 202, "{pago}");
    let id = pago["id"].as_str().expect("id").to_owned();
    let report = app.reconcile(&id).await;
    assert_eq!(report["revisionManual"], 1, "{report}");
    let stored = app.payment(&id).await;
    assert_eq!(stored.state, "REVISION_MANUAL");
    assert_eq!(stored.decline_code, None, "never told as declined");

    // Another charge than the one the provider named.
    let (status, pago) = app.pay_read("k-not-own-3", &body).await;
    assert_eq!(status, 202, "{pago}");
    assert_eq!(pago["gatewayRef"], "ch_named", "{pago}");
    let id = pago["id"].as_str().expect("id").to_owned();
    let report = app.reconcile(&id).await;
    assert_eq!(
        report["revisionManual"], 1,
        "a second charge: on-call decides: {report}"
    );
    let stored = app.payment(&id).await;
    assert_eq!(stored.state, "REVISION_MANUAL");
    assert_eq!(
        stored.gateway_ref.as_deref(),
        Some("ch_named"),
        "the charge the provider named stays recorded"
    );
}

/// The send is answered pending, `ch_first`; the look-up finds nothing (a provider's
/// search behind it). Before, the reconciler resent with the same key, and a gateway that
/// no longer honoured the key made a second charge, `ch_second`. Now a charge the provider
/// named is never sent again: the payment waits for the search, and past
/// `PAGOS_GIVE_UP_AFTER` goes to on-call with the first charge kept, one send in all.
async fn a_pending_charge_its_search_does_not_show_is_never_resent_and_goes_to_review_keeping_it(
    backend: Backend,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let app = Spawn::new(backend)
        .flags(&[
            "--gateway-retries",
            "0",
            "--give-up-after",
            "2s",
            "--stale-after",
            "1s",
        ])
        .start()
        .await;
    // A gateway that has forgotten the key: each send is a new charge.
    let sends = std::sync::Arc::new(AtomicUsize::new(0));
    charges_answered(&app, move |body: &Value| {
        let id = ["ch_first", "ch_second"][sends.fetch_add(1, Ordering::SeqCst).min(1)];
        wiremock::ResponseTemplate::new(201).set_body_json(serde_json::json!({
                "id": id, "status": "pending", "amount": body["amount"], "currency": "COP",
                "reference": body["reference"], "declineCode": null}))
    })
    .await;
    crate::helpers::mount_route(
        app.gateway(),
        "GET",
        "/v1/charges",
        |_: &wiremock::Request| {
            wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({ "data": [] }))
        },
    )
    .await;

    let (status, pago) = app.pay_read("k-second-pending", &payment_body()).await;
    assert_eq!(status, 202, "{pago}");
    assert_eq!(pago["gatewayRef"], "ch_first", "{pago}");
    let id = pago["id"].as_str().expect("id").to_owned();
    let report = app.reconcile(&id).await;
    assert_eq!(report["pendientes"], 1, "waited on: {report}");
    assert_eq!(app.charges_seen().await.len(), 1, "not sent again");

    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    let report = app.reconcile(&id).await;
    assert_eq!(report["revisionManual"], 1, "past the horizon: {report}");
    let stored = app.payment(&id).await;
    assert_eq!(stored.state, "REVISION_MANUAL");
    assert_eq!(
        stored.gateway_ref.as_deref(),
        Some("ch_first"),
        "the first charge kept"
    );
    assert_eq!(app.charges_seen().await.len(), 1, "one send in all");
    let detail = json(app.admin_get(&format!("/admin/pagos/{id}")).await).await;
    assert!(
        crate::helpers::text_has(
            &crate::helpers::last_transition(&detail),
            "motivo",
            "the provider named charge ch_first"
        ),
        "{detail}"
    );
}

/// The reconciler's look-up finds one charge, still pending, that is not the payment's
/// own: another charge than the one the provider named for it, or another amount. As a
/// send answered so, it goes to review at once, the first charge kept; it is not waited on
/// (rescheduled until `PAGOS_GIVE_UP_AFTER`, the merchant told 202 meanwhile).
async fn a_look_up_finding_a_pending_charge_that_is_not_the_payments_own_goes_to_review(
    backend: Backend,
) {
    let app = Spawn::new(backend)
        .flags(&["--gateway-retries", "0"])
        .start()
        .await;
    charges_answered(&app, |body: &Value| {
        wiremock::ResponseTemplate::new(201).set_body_json(serde_json::json!({
            "id": format!("ch_{}", body["reference"].as_str().unwrap_or_default()),
            "status": "pending", "amount": body["amount"], "currency": "COP",
            "reference": body["reference"], "declineCode": null}))
    })
    .await;
    let found = std::sync::Arc::new(std::sync::Mutex::new(Value::Null));
    let shown = found.clone();
    crate::helpers::mount_route(
        app.gateway(),
        "GET",
        "/v1/charges",
        move |_: &wiremock::Request| {
            let charge = shown.lock().expect("lock").clone();
            wiremock::ResponseTemplate::new(200)
                .set_body_json(serde_json::json!({ "data": [charge] }))
        },
    )
    .await;
    let pending = |id: &str, amount: i64, reference: &str| {
        serde_json::json!({"id": id, "status": "pending", "amount": amount, "currency": "COP",
            "reference": reference, "declineCode": null})
    };

    for (key, other) in [("k-other-charge", true), ("k-other-amount", false)] {
        let (status, pago) = app.pay_read(key, &payment_body()).await;
        assert_eq!(status, 202, "{pago}");
        let id = pago["id"].as_str().expect("id").to_owned();
        let own = pago["gatewayRef"]
            .as_str()
            .expect("the pending charge")
            .to_owned();
        let reference = own.trim_start_matches("ch_").to_owned();
        *found.lock().expect("lock") = if other {
            pending("ch_another", 250_000, &reference)
        } else {
            pending(&own, 990_000, &reference)
        };
        let report = app.reconcile(&id).await;
        assert_eq!(report["revisionManual"], 1, "{key}: {report}");
        let stored = app.payment(&id).await;
        assert_eq!(stored.state, "REVISION_MANUAL", "{key}");
        assert_eq!(
            stored.gateway_ref.as_deref(),
            Some(own.as_str()),
            "{key}: the first charge kept"
        );
        let (status, _) = app.pay_read(key, &payment_body()).await;
        assert_eq!(status, 202, "{key}: the retry is told it is not settled");
    }
}

/// The reference protocol's `declineCode` is the gateway's free text: a decline coded
/// `charged_back` (say, a card with charge-backs before) is `FALLIDA`, 402, as the contract
/// has every decline. Only an adapter that reads a dispute (Mercado Pago's
/// `charged_back` status) sends an unsettled payment to review for it.
async fn a_reference_gateways_decline_code_charged_back_is_a_decline_like_any_other(
    backend: Backend,
) {
    let app = Spawn::new(backend).start().await;
    charges_answered(&app, |body: &Value| {
        wiremock::ResponseTemplate::new(201).set_body_json(serde_json::json!({
            "id": "ch_declined", "status": "declined", "amount": body["amount"],
            "currency": "COP", "reference": body["reference"], "declineCode": "charged_back"}))
    })
    .await;
    let (status, answer) = app.pay_read("k-declined-coded", &payment_body()).await;
    assert_eq!(status, 402, "{answer}");
    assert_eq!(answer["pago"]["estado"], "FALLIDA", "{answer}");
    assert_eq!(answer["declineCode"], "charged_back", "{answer}");
}

/// SQLite rolls a transaction back by itself when a write in it fails for want of disk
/// (or an I/O error); a trigger's `RAISE(ROLLBACK)` stands in for the full disk here,
/// since SQLite treats both alike. The payment whose settlement failed is answered 503 and
/// stays for the reconciler; the next payments must be stored for real. Before, the one
/// connection came back to the pool still counted in the rolled-back transaction, a
/// reconciler's claim with nothing due rolled back a savepoint of it (`ROLLBACK TO` ends
/// nothing), and every later payment
/// was answered 201 from writes no other connection, and no restart, would ever see.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_sqlite_rolls_back_a_settlement_itself_the_payments_answered_later_are_stored() {
    let app = Spawn::new(Backend::Sqlite)
        .flags(&["--database-pool-size", "1"])
        .start()
        .await;
    app.with_fake(FakeGateway::charging("succeeded")).await;
    app.db
        .execute_unprepared(
            "CREATE TRIGGER disk_full BEFORE UPDATE ON payments \
             WHEN NEW.credit_id = 'lleno' AND NEW.state = 'COMPLETADA' \
             BEGIN SELECT RAISE(ROLLBACK, 'database or disk is full'); END",
        )
        .await
        .expect("trigger");
    let mut full = payment_body();
    full["creditoId"] = Value::from("lleno");
    let answer = app.pay("k-full", &full).await;
    assert_eq!(answer.status(), 503, "{}", json(answer).await);
    let retry = app.pay("k-full", &full).await;
    assert_eq!(retry.status(), 409, "its saga is the reconciler's now");
    // A pass on-call starts finds nothing due yet: its claim is rolled back.
    let pass = app
        .admin_post("/admin/reconciliaciones", &serde_json::json!({}))
        .await;
    assert_eq!(pass.status(), 200);

    let (status, paid) = app.pay_read("k-later", &payment_body()).await;
    assert_eq!(status, 201, "{paid}");
    assert_eq!(paid["estado"], "COMPLETADA");

    // What another connection, as another process or a restart would, finds stored.
    let other = sea_orm::Database::connect(app.database_url())
        .await
        .expect("open");
    let stored = payment::Entity::find()
        .all(&other)
        .await
        .expect("read")
        .into_iter()
        .map(|p| (p.idempotency_key, p.state.to_string()))
        .collect::<std::collections::BTreeMap<_, _>>();
    assert_eq!(
        stored.get("k-later").map(String::as_str),
        Some("COMPLETADA"),
        "the payment answered 201 is stored: {stored:?}"
    );
    assert_eq!(
        stored.get("k-full").map(String::as_str),
        Some("ENVIADA"),
        "the charge whose settlement failed is left for the reconciler: {stored:?}"
    );
}

/// The gateway charged, and the write of its answer fails (the database refuses it: a
/// trigger stands in for a full disk or a dropped connection). The merchant is told 503,
/// retry with the same key; its retries get 409 while the key is leased to that request,
/// then 202 `ENVIADA` while the payment is held for its send; once the database is back, a
/// retry asks the provider and gets the charge's own answer, the same payment, and
/// nothing is charged twice.
async fn a_settlement_the_database_refuses_is_503_then_409_then_the_charges_own_answer(
    backend: Backend,
) {
    let postgres = matches!(backend, Backend::Postgres(_));
    let app = Spawn::new(backend)
        .flags(&[
            "--gateway-timeout",
            "200ms",
            "--gateway-retries",
            "0",
            "--lease",
            "2s",
        ])
        .start()
        .await;
    let fake = app.with_fake(FakeGateway::charging("succeeded")).await;
    let refuse = if postgres {
        vec![
            "CREATE FUNCTION disk_full() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'could not extend file: No space left on device'; END $$",
            "CREATE TRIGGER disk_full BEFORE UPDATE ON payments FOR EACH ROW \
             WHEN (NEW.credit_id = 'lleno' AND NEW.state = 'COMPLETADA') \
             EXECUTE FUNCTION disk_full()",
        ]
    } else {
        vec![
            "CREATE TRIGGER disk_full BEFORE UPDATE ON payments \
             WHEN NEW.credit_id = 'lleno' AND NEW.state = 'COMPLETADA' \
             BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END",
        ]
    };
    for sql in refuse {
        app.db.execute_unprepared(sql).await.expect("trigger");
    }
    let mut body = payment_body();
    body["creditoId"] = Value::from("lleno");

    let first = app.pay("k-full", &body).await;
    assert_eq!(first.status(), 503);
    assert!(first.headers().contains_key("retry-after"));
    let problem = json(first).await;
    assert_eq!(
        problem["type"], "/problems/service-unavailable",
        "{problem}"
    );
    let held = app.pay("k-full", &body).await;
    assert_eq!(held.status(), 409, "the payment is held for its send");
    assert_eq!(json(held).await["type"], "/problems/request-in-flight");
    assert_eq!(
        fake.total_charges(),
        1,
        "charged once, its answer not stored"
    );

    app.db
        .execute_unprepared("DROP TRIGGER disk_full ON payments")
        .await
        .or(app.db.execute_unprepared("DROP TRIGGER disk_full").await)
        .expect("the database is back");
    // 409 while its key is leased to the first request, then 202 ENVIADA while the
    // payment is held for the send; then a retry asks the provider.
    let mut last = (0, Value::Null);
    let mut seen = Vec::new();
    for _ in 0..80 {
        last = app.pay_read("k-full", &body).await;
        seen.push(last.0);
        if last.0 != 409 && last.0 != 202 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    seen.dedup();
    assert!(seen.iter().all(|s| [409, 202, 201].contains(s)), "{seen:?}");
    let (status, paid) = last;
    assert_eq!(status, 201, "{paid}");
    assert_eq!(paid["estado"], "COMPLETADA");
    let id = paid["id"].as_str().expect("id");
    assert_eq!(
        fake.charges_for(id),
        1,
        "the charge made before, not another"
    );
    assert_eq!(fake.total_charges(), 1);
    let replayed = app.pay("k-full", &body).await;
    assert_eq!(replayed.status(), 201);
    assert_eq!(json(replayed).await["id"], id);
}

/// The gateway answers each charge with `answer` of its body.
async fn charges_answered(
    app: &TestApp,
    answer: impl Fn(&Value) -> wiremock::ResponseTemplate + Send + Sync + 'static,
) {
    crate::helpers::mount_route(
        app.gateway(),
        "POST",
        "/v1/charges",
        move |request: &wiremock::Request| {
            let body: Value = serde_json::from_slice(&request.body).expect("a charge body");
            answer(&body)
        },
    )
    .await;
}
