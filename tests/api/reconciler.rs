//! The reconciler's decision table against a gateway that remembers its charges, driven
//! through the admin API; on-call's endpoints; the key reaper.

use crate::helpers::{ADMIN_TOKEN, Backend, FakeGateway, Spawn, TestApp, json, payment_body};
use crate::on_both_databases;
use serde_json::{Value, json};
use std::time::Duration;

on_both_databases!(
    a_pending_charge_is_rescheduled_then_settled_and_the_key_answers_the_final_state,
    a_failing_lookup_reschedules_and_counts_attempts,
    past_the_give_up_horizon_the_payment_goes_to_review_and_on_call_settles_it,
    no_charge_inside_the_key_window_is_resent_with_the_same_key,
    a_resend_the_provider_answers_pending_clears_the_error_of_the_send_before,
    a_look_up_answering_another_payments_charge_is_not_believed,
    no_charge_outside_the_key_window_goes_to_review_without_a_resend,
    never_sent_past_the_key_window_goes_to_review_without_a_send,
    a_resend_whose_write_waited_past_the_key_window_is_not_sent,
    a_charge_the_provider_named_is_not_resent_while_its_search_does_not_show_it,
    a_slow_requests_send_holds_its_payment_past_a_lease_shorter_than_the_call,
    admin_endpoints_refuse_a_missing_or_wrong_token,
    the_admin_list_shows_payments_in_a_state_oldest_first,
    only_payments_under_review_can_be_resolved_by_hand,
    the_reaper_deletes_expired_final_keys_and_never_an_in_flight_one,
    metrics_count_idempotency_outcomes_and_gateway_calls,
    one_pass_settles_every_due_payment_however_many_claims_it_takes,
    a_pass_never_has_more_look_ups_in_flight_than_its_concurrency,
    a_claim_that_fails_ends_the_pass_only_after_the_payments_in_hand_are_settled,
    a_refund_the_provider_made_but_its_search_does_not_show_yet_is_resent_with_its_key,
);

/// Starts a payment that the gateway leaves pending (202, ENVIADA); returns its id.
async fn pending_payment(app: &TestApp, key: &str) -> String {
    let answer = app.pay(key, &payment_body()).await;
    assert_eq!(answer.status(), 202);
    let body = json(answer).await;
    assert_eq!(body["estado"], "ENVIADA");
    body["id"].as_str().expect("id").to_owned()
}

fn report(examined: u64, field: &str) -> impl Fn(&Value) {
    let field = field.to_owned();
    move |r: &Value| {
        assert_eq!(r["examinados"], examined, "{r}");
        assert_eq!(r[field.as_str()], examined, "{field} in {r}");
    }
}

async fn a_pending_charge_is_rescheduled_then_settled_and_the_key_answers_the_final_state(
    backend: Backend,
) {
    let app = Spawn::new(backend).start().await;
    let fake = app.with_fake(FakeGateway::charging("pending")).await;
    let id = pending_payment(&app, "k-p").await;

    report(1, "pendientes")(&app.reconcile(&id).await);
    let stored = app.payment(&id).await;
    assert_eq!(stored.state, "ENVIADA");
    assert!(
        stored.next_attempt_at > chrono::Utc::now(),
        "looked at again later"
    );

    fake.settle_all("succeeded");
    report(1, "completados")(&app.reconcile(&id).await);
    assert_eq!(app.payment(&id).await.state, "COMPLETADA");
    assert_eq!(fake.charges_for(&id), 1);

    let retry = app.pay("k-p", &payment_body()).await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(json(retry).await["estado"], "COMPLETADA");
}

async fn a_failing_lookup_reschedules_and_counts_attempts(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    let fake = app.with_fake(FakeGateway::charging("pending")).await;
    let id = pending_payment(&app, "k-f").await;
    let before = app.payment(&id).await.attempts;

    fake.fail_lookups(true);
    report(1, "pendientes")(&app.reconcile(&id).await);
    report(1, "pendientes")(&app.reconcile(&id).await);
    let after = app.payment(&id).await;
    assert_eq!(after.state, "ENVIADA");
    assert_eq!(after.attempts, before + 2);
    assert_eq!(fake.charges_for(&id), 1, "a failed lookup never resends");
}

async fn past_the_give_up_horizon_the_payment_goes_to_review_and_on_call_settles_it(
    backend: Backend,
) {
    let app =
        crate::helpers::started(backend, &["--give-up-after", "1s", "--stale-after", "1s"]).await;
    let fake = app.with_fake(FakeGateway::charging("pending")).await;
    let id = pending_payment(&app, "k-g").await;
    fake.fail_lookups(true);
    tokio::time::sleep(Duration::from_millis(1100)).await;

    report(1, "revisionManual")(&app.reconcile(&id).await);
    assert_eq!(app.payment(&id).await.state, "REVISION_MANUAL");
    let listed = json(app.admin_get("/admin/pagos?estado=REVISION_MANUAL").await).await;
    assert_eq!(listed["pagos"][0]["id"], id.as_str());
    // A retry meanwhile waits for on-call, not for a look-up pagos will never make: not
    // told to come back every second.
    for _ in 0..2 {
        let retry = app.pay("k-g", &payment_body()).await;
        assert_eq!(retry.status(), 202);
        let wait = crate::helpers::retry_after_secs(&retry);
        assert_eq!(wait, 300, "under review, Retry-After is five minutes");
    }

    // The provider answers again, and shows the charge succeeded: on-call resolves by it.
    fake.fail_lookups(false);
    fake.settle(&id, "succeeded");
    let detail = app.resolved_as(ADMIN_TOKEN, &id, &json!({"estado": "COMPLETADA", "motivo": "charge ch_fake_1 seen succeeded in the provider dashboard"})).await;
    assert_eq!(detail["pago"]["estado"], "COMPLETADA");
    let last = crate::helpers::last_transition(&detail);
    assert_eq!(last["quien"], "admin");
    assert_eq!(last["desde"], "REVISION_MANUAL");
    assert!(crate::helpers::text_has(
        &last,
        "motivo",
        "provider dashboard"
    ));
    let escalation = &detail["transiciones"].as_array().expect("rows")[1];
    assert_eq!(escalation["quien"], "reconciler");
    assert_eq!(escalation["hacia"], "REVISION_MANUAL");

    let retry = app.pay("k-g", &payment_body()).await;
    assert_eq!(retry.status(), 201, "the key answers on-call's decision");
}

/// An app without retries whose gateway answers the first charge 503 without charging
/// (it never reaches the gateway's books): the payment is left `ENVIADA`; what later
/// charges do is for the test to mount.
async fn first_try_never_charged(backend: Backend) -> TestApp {
    let app = crate::helpers::started(
        backend,
        &["--gateway-timeout", "200ms", "--gateway-retries", "0"],
    )
    .await;
    first_charge_answered_503(&app).await;
    app
}

/// The gateway answers `app`'s first charge 503 without charging it.
async fn first_charge_answered_503(app: &TestApp) {
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::path("/v1/charges"))
        .respond_with(wiremock::ResponseTemplate::new(503))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(app.gateway())
        .await;
}

async fn no_charge_inside_the_key_window_is_resent_with_the_same_key(backend: Backend) {
    let app = first_try_never_charged(backend).await;
    let fake = app.with_fake(FakeGateway::charging("succeeded")).await;
    let answer = app.pay("k-w", &payment_body()).await;
    assert_eq!(answer.status(), 202);
    let id = json(answer).await["id"].as_str().expect("id").to_owned();

    report(1, "completados")(&app.reconcile(&id).await);
    let posts = app.charges_seen().await;
    assert_eq!(posts.len(), 2, "the first try and the reconciler's resend");
    assert_eq!(
        posts[0].headers["idempotency-key"],
        posts[1].headers["idempotency-key"]
    );
    assert_eq!(fake.charges_for(&id), 1);
    let detail = json(app.admin_get(&format!("/admin/pagos/{id}")).await).await;
    let resent = detail["transiciones"]
        .as_array()
        .expect("rows")
        .iter()
        .any(|t| t["quien"] == "reconciler" && crate::helpers::text_has(t, "motivo", "same key"));
    assert!(resent, "the resend is in the audit trail: {detail}");
}

/// The last error is why a payment waits now. A first send whose outcome is unknown (a
/// 503) leaves its error; the reconciler's resend, which the provider answers (the charge
/// pending), leaves none: the payment waits on the provider, not on an error.
async fn a_resend_the_provider_answers_pending_clears_the_error_of_the_send_before(
    backend: Backend,
) {
    let app = first_try_never_charged(backend).await;
    let fake = app.with_fake(FakeGateway::charging("pending")).await;
    let id = pending_payment(&app, "k-resent-pending").await;
    let detail = json(app.admin_get(&format!("/admin/pagos/{id}")).await).await;
    let said = &detail["pago"]["ultimoError"]["mensaje"];
    assert!(
        said.as_str().is_some_and(|m| m.contains("outcome unknown")),
        "the first send's error: {said}"
    );

    report(1, "reenviados")(&app.reconcile(&id).await);
    assert_eq!(fake.charges_for(&id), 1, "resent, and charged pending");
    app.waits_on_the_provider(&id).await;
}

/// A gateway whose search answers another payment's charge (a filter it ignored): the
/// payment is not settled on it. Left `ENVIADA` by a first try that never charged, it is
/// resent with its own key and settled on its own charge: the merchant is never told
/// COMPLETADA for money that was taken from somebody else.
async fn a_look_up_answering_another_payments_charge_is_not_believed(backend: Backend) {
    let app = first_try_never_charged(backend).await;
    let someone_else = uuid::Uuid::new_v4().to_string();
    wiremock::Mock::given(wiremock::matchers::method("GET"))
        .and(wiremock::matchers::path("/v1/charges"))
        .respond_with(wiremock::ResponseTemplate::new(200).set_body_json(json!({
            "data": [{"id": "ch_someone_else", "status": "succeeded", "amount": 250000,
                      "currency": "COP", "reference": someone_else}]
        })))
        .with_priority(1)
        .mount(app.gateway())
        .await;
    let fake = app.with_fake(FakeGateway::charging("succeeded")).await;
    let answer = app.pay("k-foreign", &payment_body()).await;
    assert_eq!(answer.status(), 202);
    let id = json(answer).await["id"].as_str().expect("id").to_owned();

    report(1, "completados")(&app.reconcile(&id).await);
    assert_eq!(fake.charges_for(&id), 1, "charged once, by the resend");
    let pago = json(
        app.get_as(crate::helpers::API_KEY, &format!("/v1/pagos/{id}"))
            .await,
    )
    .await;
    assert_eq!(pago["estado"], "COMPLETADA", "{pago}");
    assert_ne!(pago["gatewayRef"], "ch_someone_else", "{pago}");
}

/// An app whose gateway calls time out after `timeout`, without retries, with a key window
/// of `window`, shorter than the start-up checks allow: it stands for a longer one.
async fn with_a_key_window(backend: Backend, timeout: &str, window: &str) -> TestApp {
    Spawn::new(backend)
        .flags(&[
            "--gateway-timeout",
            timeout,
            "--gateway-retries",
            "0",
            "--gateway-key-window",
            window,
        ])
        .unvalidated()
        .start()
        .await
}

async fn no_charge_outside_the_key_window_goes_to_review_without_a_resend(backend: Backend) {
    // A key window shorter than a look at the reconciler's pace, which the start-up checks
    // refuse: here it stands for a window that has passed.
    let app = with_a_key_window(backend, "200ms", "1s").await;
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::path("/v1/charges"))
        .respond_with(wiremock::ResponseTemplate::new(503))
        .mount(app.gateway())
        .await;
    wiremock::Mock::given(wiremock::matchers::method("GET"))
        .and(wiremock::matchers::path("/v1/charges"))
        .respond_with(wiremock::ResponseTemplate::new(200).set_body_json(json!({"data": []})))
        .mount(app.gateway())
        .await;
    let answer = app.pay("k-o", &payment_body()).await;
    let id = json(answer).await["id"].as_str().expect("id").to_owned();
    tokio::time::sleep(Duration::from_millis(1100)).await;

    report(1, "revisionManual")(&app.reconcile(&id).await);
    assert_eq!(
        app.charges_seen().await.len(),
        1,
        "never resent outside the window"
    );
    let detail = json(app.admin_get(&format!("/admin/pagos/{id}")).await).await;
    let reason = detail["transiciones"]
        .as_array()
        .and_then(|t| t.last())
        .expect("rows")["motivo"]
        .clone();
    assert!(
        reason.as_str().is_some_and(|r| r.contains("key window")),
        "{reason}"
    );
}

/// A payment whose records say it was never sent (`EN_PROCESO`), past the gateway's key
/// window: a database restored from before its send would say the same, and the gateway
/// no longer remembers the key. It goes to on-call; nothing is sent.
async fn never_sent_past_the_key_window_goes_to_review_without_a_send(backend: Backend) {
    use sea_orm::EntityTrait;
    // Refused at start (shorter than a send); here it stands for a window that has passed.
    let app = Spawn::new(backend)
        .flags(&["--gateway-key-window", "1s"])
        .unvalidated()
        .start()
        .await;
    let fake = app.with_fake(FakeGateway::charging("succeeded")).await;
    let merchant = crate::helpers::acme(&app.db).await;
    let row = crate::helpers::left_payment(
        merchant,
        "k-restored",
        pagos::entities::payment::PaymentState::EnProceso,
        0,
        "pagos-restored-gateway-key".into(),
        pagos::db::now() - chrono::TimeDelta::seconds(5),
    );
    let id = row.id.to_string();
    pagos::entities::payment::Entity::insert(pagos::entities::payment::ActiveModel::from(row))
        .exec_without_returning(&app.db)
        .await
        .expect("seed");

    report(1, "revisionManual")(&app.reconcile(&id).await);
    assert_eq!(fake.charges_for(&id), 0, "nothing sent");
    assert!(
        app.charges_seen().await.is_empty(),
        "no charge request at all"
    );
    let detail = json(app.admin_get(&format!("/admin/pagos/{id}")).await).await;
    let reason = crate::helpers::last_transition(&detail)["motivo"].clone();
    assert!(
        reason
            .as_str()
            .is_some_and(|r| r.contains("key window") && r.contains("restored")),
        "{reason}"
    );
}

/// The provider answered the send with a pending charge (its id recorded), and its search
/// does not show that charge yet (its index behind). Before, the reconciler read "no
/// charge" and sent the payment again with its key: a provider that had forgotten the key
/// (Mercado Pago's memory of keys is undocumented) would make a second charge. Now it waits
/// for the search, and nothing is sent.
async fn a_charge_the_provider_named_is_not_resent_while_its_search_does_not_show_it(
    backend: Backend,
) {
    let app = Spawn::new(backend).start().await;
    let fake = app.with_fake(FakeGateway::charging("pending")).await;
    let id = pending_payment(&app, "k-named").await;
    let named = app.payment(&id).await.gateway_ref.expect("the charge's id");
    wiremock::Mock::given(wiremock::matchers::method("GET"))
        .and(wiremock::matchers::path("/v1/charges"))
        .respond_with(wiremock::ResponseTemplate::new(200).set_body_json(json!({"data": []})))
        .with_priority(1)
        .mount(app.gateway())
        .await;

    report(1, "pendientes")(&app.reconcile(&id).await);
    assert_eq!(app.charges_seen().await.len(), 1, "never sent again");
    assert_eq!(fake.charges_for(&id), 1);
    let pago = app.payment(&id).await;
    assert_eq!(pago.state, "ENVIADA");
    assert_eq!(pago.gateway_ref.as_deref(), Some(named.as_str()));
}

/// The reconciler chooses to resend inside the gateway's key window, but the write that
/// marks the payment sent waits (a lock held by another session, a busy pool) until the
/// window has passed: a send then could reach a gateway that has forgotten the key, and
/// charge a second time beside a first charge its search does not show yet. Before, the
/// send went out all the same; now it is handed back unsent, and the next look gives it
/// to on-call.
async fn a_resend_whose_write_waited_past_the_key_window_is_not_sent(backend: Backend) {
    use sea_orm::ConnectionTrait;
    // A window of 4 s, which the start-up checks refuse: it stands for an hour's.
    let app = with_a_key_window(backend.clone(), "1s", "4s").await;
    first_charge_answered_503(&app).await;
    // The search shows nothing (its index behind), after a moment.
    wiremock::Mock::given(wiremock::matchers::method("GET"))
        .and(wiremock::matchers::path("/v1/charges"))
        .respond_with(
            wiremock::ResponseTemplate::new(200)
                .set_body_json(json!({"data": []}))
                .set_delay(Duration::from_millis(500)),
        )
        .with_priority(1)
        .mount(app.gateway())
        .await;
    let fake = app.with_fake(FakeGateway::charging("succeeded")).await;
    let id = {
        let answer = app.pay("k-late-write", &payment_body()).await;
        assert_eq!(answer.status(), 202);
        json(answer).await["id"].as_str().expect("id").to_owned()
    };

    // Once the reconciler has claimed the payment and is asking the provider, another
    // session takes the payment's row and keeps it past the window.
    let hold_the_row = async {
        while crate::helpers::received(app.gateway(), "GET", |p| p == "/v1/charges")
            .await
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let holder = sea_orm::TransactionTrait::begin(&app.db)
            .await
            .expect("begin");
        let id = match backend {
            Backend::Sqlite => format!("'{id}'"),
            Backend::Postgres(_) => format!("'{id}'::uuid"),
        };
        holder
            .execute_unprepared(&format!(
                "UPDATE payments SET attempts = attempts WHERE id = {id}"
            ))
            .await
            .expect("the payment's row, held");
        tokio::time::sleep(Duration::from_secs(5)).await;
        holder.commit().await.expect("let go");
    };
    let (first, ()) = tokio::join!(app.reconcile(&id), hold_the_row);
    report(1, "pendientes")(&first);

    assert_eq!(app.charges_seen().await.len(), 1, "the first try only");
    assert_eq!(fake.charges_for(&id), 0);
    let detail = json(app.admin_get(&format!("/admin/pagos/{id}")).await).await;
    assert_eq!(detail["pago"]["estado"], "ENVIADA", "{detail}");
    assert!(
        crate::helpers::text_has(&detail["pago"]["ultimoError"], "mensaje", "key window"),
        "{detail}"
    );
    report(1, "revisionManual")(&app.reconcile(&id).await);
    assert_eq!(app.charges_seen().await.len(), 1, "never resent");
}

async fn a_slow_requests_send_holds_its_payment_past_a_lease_shorter_than_the_call(
    backend: Backend,
) {
    // A lease shorter than the gateway call: exactly what the start-up checks refuse, built
    // here on purpose. The write that marks the payment sent holds it for the whole send,
    // counted from that write, whatever is left of the lease: on-call's "reconcile now"
    // skips it while the request's send is in flight, and the request settles it.
    let app = Spawn::new(backend)
        .flags(&[
            "--gateway-timeout",
            "10s",
            "--gateway-retries",
            "0",
            "--lease",
            "300ms",
        ])
        .unvalidated()
        .start()
        .await;
    let fake = app
        .with_fake(FakeGateway::charging("declined").with_delay(Duration::from_secs(4)))
        .await;

    let slow = app.pay_in_background("k-slow");
    // Marked sent (the charge reached the gateway), and the lease run out since.
    crate::helpers::until("the charge reached the gateway", || {
        fake.total_charges() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let id = {
        use pagos::entities::payment;
        use sea_orm::EntityTrait;
        payment::Entity::find()
            .one(&app.db)
            .await
            .expect("query")
            .expect("registered")
            .id
            .to_string()
    };
    // The lease ran out; the send still holds the payment.
    report(1, "omitidos")(&app.reconcile(&id).await);
    assert_eq!(
        fake.lookups_made(),
        0,
        "nobody asked the provider meanwhile"
    );

    let answer = slow.await.expect("joined").expect("sent");
    assert_eq!(answer.status(), 402);
    let body = json(answer).await;
    assert_eq!(body["pago"]["estado"], "FALLIDA");
    assert_eq!(app.payment(&id).await.state, "FALLIDA");
    assert_eq!(fake.total_charges(), 1);
    let detail = json(app.admin_get(&format!("/admin/pagos/{id}")).await).await;
    let settled: Vec<&Value> = detail["transiciones"]
        .as_array()
        .expect("rows")
        .iter()
        .filter(|t| t["desde"] == "ENVIADA" && t["hacia"] != "ENVIADA")
        .collect();
    assert_eq!(settled.len(), 1, "one decision, the request's: {detail}");
    assert_eq!(settled[0]["quien"], "request");
}

async fn admin_endpoints_refuse_a_missing_or_wrong_token(backend: Backend) {
    let app = Spawn::new(backend).sandbox().start().await;
    let paths = [
        ("GET", "/admin/pagos?estado=ENVIADA"),
        ("POST", "/admin/reconciliaciones"),
        (
            "POST",
            "/admin/pagos/00000000-0000-0000-0000-000000000000/resolucion",
        ),
    ];
    for (method, path) in paths {
        for token in [None, Some("wrong"), Some(crate::helpers::API_KEY)] {
            let mut request = app
                .http
                .request(method.parse().expect("method"), app.url(path))
                .json(&json!({}));
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            let answer = request.send().await.expect("sent");
            assert_eq!(answer.status(), 401, "{method} {path} with {token:?}");
            assert_eq!(answer.headers()["content-type"], "application/problem+json");
        }
    }
    let ok = app.get_as(ADMIN_TOKEN, "/admin/pagos?estado=ENVIADA").await;
    assert_eq!(ok.status(), 200);
}

async fn the_admin_list_shows_payments_in_a_state_oldest_first(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    app.with_fake(FakeGateway::charging("pending")).await;
    let first = pending_payment(&app, "k-l1").await;
    let second = pending_payment(&app, "k-l2").await;
    let listed = json(app.admin_get("/admin/pagos?estado=ENVIADA&limite=10").await).await;
    let ids = crate::helpers::listed(&listed, "pagos", "id");
    assert_eq!(ids, vec![first.as_str(), second.as_str()]);
    assert!(
        listed["pagos"][0]["intentos"]
            .as_i64()
            .is_some_and(|n| n >= 1)
    );
    assert!(listed["pagos"][0]["proximoIntento"].is_string());
    let bad = app.admin_get("/admin/pagos?estado=PAGADA").await;
    assert_eq!(bad.status(), 422);
}

async fn only_payments_under_review_can_be_resolved_by_hand(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    app.with_fake(FakeGateway::charging("succeeded")).await;
    let created = json(app.pay("k-r", &payment_body()).await).await;
    let id = created["id"].as_str().expect("id");
    let path = format!("/admin/pagos/{id}/resolucion");
    let refused = app
        .admin_post(&path, &json!({"estado": "FALLIDA", "motivo": "test"}))
        .await;
    assert_eq!(refused.status(), 409);
    let bad = app
        .admin_post(&path, &json!({"estado": "PAGADA", "motivo": "x"}))
        .await;
    assert_eq!(bad.status(), 422);
    let no_reason = app
        .admin_post(&path, &json!({"estado": "FALLIDA", "motivo": "  "}))
        .await;
    assert_eq!(no_reason.status(), 422);
    assert_eq!(app.payment(id).await.state, "COMPLETADA");
}

async fn the_reaper_deletes_expired_final_keys_and_never_an_in_flight_one(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    let fake = app.with_fake(FakeGateway::charging("succeeded")).await;
    for n in 0..5 {
        assert_eq!(
            app.pay(&format!("k-done-{n}"), &payment_body())
                .await
                .status(),
            201
        );
    }
    fake.set_new_status("pending");
    let pending = pending_payment(&app, "k-open").await;

    let now = chrono::Utc::now();
    let none = pagos::reaper::purge_keys(&app.db, now - chrono::TimeDelta::days(1), 2)
        .await
        .expect("purge");
    assert_eq!(none, 0, "no key is past a retention that has not run out");
    assert_eq!(app.count_rows().await, (6, 6));

    // Two keys per statement: the five final keys take three statements.
    let future = chrono::Utc::now() + chrono::TimeDelta::days(2);
    let purged = pagos::reaper::purge_keys(&app.db, future, 2)
        .await
        .expect("purge");
    assert_eq!(purged, 5, "every final payment's key, batch after batch");
    assert_eq!(
        app.count_rows().await,
        (1, 6),
        "the in-flight key stays; payments are never deleted"
    );

    // The open key still protects its payment.
    let retry = app.pay("k-open", &payment_body()).await;
    assert_eq!(json(retry).await["id"], pending.as_str());
    // A purged key is a new key: it makes a new payment.
    fake.set_new_status("succeeded");
    let reused = app.pay("k-done-0", &payment_body()).await;
    assert_eq!(reused.status(), 201);
    assert!(reused.headers().get("idempotent-replayed").is_none());
    assert_eq!(app.count_rows().await, (2, 7));
}

async fn metrics_count_idempotency_outcomes_and_gateway_calls(backend: Backend) {
    let app = crate::helpers::started(backend, &["--metrics-refresh", "100ms"]).await;
    app.with_fake(FakeGateway::charging("succeeded")).await;
    app.pay("k-m", &payment_body()).await;
    app.pay("k-m", &payment_body()).await;
    app.pay(
        "k-m",
        &json!({"creditoId": "1", "monto": 5, "moneda": "USD"}),
    )
    .await;
    // Counters move at once; the gauges of stored state at the next background refresh.
    let text = app
        .scrape_until("the payment in the gauges", |m| {
            m.lines()
                .any(|l| l == "pagos_payments{estado=\"COMPLETADA\"} 1")
        })
        .await;
    for line in [
        "pagos_idempotency_requests_total{operation=\"payment\",outcome=\"new\"} 1",
        "pagos_idempotency_requests_total{operation=\"payment\",outcome=\"replayed\"} 1",
        "pagos_idempotency_requests_total{operation=\"payment\",outcome=\"mismatch\"} 1",
        "pagos_gateway_calls_total{operation=\"charge\",outcome=\"succeeded\"} 1",
        "pagos_payments{estado=\"COMPLETADA\"} 1",
        "pagos_payments{estado=\"ENVIADA\"} 0",
        "pagos_oldest_unsettled_payment_age_seconds 0.0",
        "pagos_database_up 1",
        "pagos_http_responses_total{method=\"POST\",route=\"/v1/pagos\",status=\"422\"} 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    assert!(text.contains("pagos_gateway_call_duration_seconds_bucket"));
    assert!(
        !text.contains(crate::helpers::API_KEY),
        "no secrets in metrics"
    );
}

/// `n` payments the gateway left pending and has charged since, all due now: the backlog
/// an outage leaves for a pass. Their ids.
async fn charged_and_due(app: &TestApp, fake: &FakeGateway, prefix: &str, n: usize) -> Vec<String> {
    use pagos::entities::payment;
    use sea_orm::sea_query::Expr;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};

    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(pending_payment(app, &format!("{prefix}-{i}")).await);
    }
    fake.settle_all("succeeded");
    payment::Entity::update_many()
        .col_expr(
            payment::Column::NextAttemptAt,
            Expr::value(chrono::Utc::now() - chrono::TimeDelta::minutes(1)),
        )
        .filter(payment::Column::State.eq("ENVIADA"))
        .exec(&app.db)
        .await
        .expect("due now");
    ids
}

/// A pass claims `--reconcile-concurrency` payments at a time and claims again while the
/// last ones are still being looked up: ten due payments at concurrency 3 are four
/// claims, one pass, each payment looked up once. A payment claimed ahead has more than
/// its look-up's time left on its claim when its turn comes: it is written twice, claimed
/// and settled, with no renewal of its claim in between.
async fn one_pass_settles_every_due_payment_however_many_claims_it_takes(backend: Backend) {
    use pagos::entities::payment;
    use sea_orm::EntityTrait;

    // A lease just over a send's worst case (14 s with the helpers' 500 ms timeout and
    // three retries): a claim lasts exactly one payment's whole work, look-up and send.
    let app =
        crate::helpers::started(backend, &["--reconcile-concurrency", "3", "--lease", "15s"]).await;
    let fake = app.with_fake(FakeGateway::charging("pending")).await;
    let ids = charged_and_due(&app, &fake, "k-many", 10).await;
    let version = async |id: &str| {
        payment::Entity::find_by_id(id.parse::<uuid::Uuid>().expect("uuid"))
            .one(&app.db)
            .await
            .expect("read")
            .expect("stored")
            .version
    };
    let mut before = Vec::new();
    for id in &ids {
        before.push(version(id).await);
    }

    let pass = app.admin_post("/admin/reconciliaciones", &json!({})).await;
    assert_eq!(pass.status(), 200);
    report(10, "completados")(&json(pass).await);
    for (id, before) in ids.iter().zip(before) {
        assert_eq!(app.payment(id).await.state, "COMPLETADA", "{id}");
        assert_eq!(fake.charges_for(id), 1, "{id}");
        assert_eq!(version(id).await, before + 2, "{id}: claimed, then settled");
    }
    let lookups = crate::helpers::received(app.gateway(), "GET", |_| true)
        .await
        .len();
    assert_eq!(lookups, 10, "each payment looked up once");
}

/// Two look-ups at once, each waited for long enough that a loaded machine's slow answer
/// is never a timeout.
const LOOK_UPS_OF_TWO: &[&str] = &["--reconcile-concurrency", "2", "--gateway-timeout", "5s"];

/// `PAGOS_RECONCILE_CONCURRENCY` bounds the look-ups a pass has in flight at the provider
/// (contract section 1), however many payments the pass has claimed and is writing.
async fn a_pass_never_has_more_look_ups_in_flight_than_its_concurrency(backend: Backend) {
    let app = crate::helpers::started(backend, LOOK_UPS_OF_TWO).await;
    let fake = app
        .with_fake(FakeGateway::charging("pending").with_lookup_delay(Duration::from_millis(200)))
        .await;
    let ids = charged_and_due(&app, &fake, "k-bound", 8).await;

    let pass = app.admin_post("/admin/reconciliaciones", &json!({})).await;
    assert_eq!(pass.status(), 200);
    report(8, "completados")(&json(pass).await);
    for id in &ids {
        assert_eq!(app.payment(id).await.state, "COMPLETADA", "{id}");
    }
    assert_eq!(
        fake.most_lookups_at_once(),
        2,
        "two look-ups at once, never more"
    );
}

/// A claim that fails (the database refuses it) ends the pass, but not before the
/// payments already claimed are settled: dropped, they would stay claimed and unsettled
/// until their claims ran out. On-call is told the pass failed (503); the payments never
/// claimed are left for the next pass, which settles them, each looked up once in all.
async fn a_claim_that_fails_ends_the_pass_only_after_the_payments_in_hand_are_settled(
    backend: Backend,
) {
    use pagos::entities::payment;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};

    // Concurrency 2: claims of 2, up to 4 payments in the work and 2 more in hand, all
    // claimed before the first look-up (200 ms) is answered; then 2 more every 100 ms.
    let app = crate::helpers::started(backend, LOOK_UPS_OF_TWO).await;
    let fake = app
        .with_fake(FakeGateway::charging("pending").with_lookup_delay(Duration::from_millis(200)))
        .await;
    let ids = charged_and_due(&app, &fake, "k-cut", 20).await;

    let pass = tokio::spawn({
        let (url, client) = (app.url("/admin/reconciliaciones"), reqwest::Client::new());
        async move {
            client
                .post(url)
                .bearer_auth(ADMIN_TOKEN)
                .json(&json!({}))
                .send()
                .await
                .expect("sent")
        }
    });
    // Claimed, or (on a very slow machine) already settled.
    let claimed = || {
        payment::Entity::find()
            .filter(
                sea_orm::Condition::any()
                    .add(payment::Column::ClaimedUntil.is_not_null())
                    .add(payment::Column::State.ne("ENVIADA")),
            )
            .all(&app.db)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while claimed().await.expect("read").len() < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "the pass claims payments"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // From now on, a write that claims a payment (sets a new `claimed_until`) fails;
    // settling writes do not set one.
    crate::helpers::refuse_claims(&app.db, None).await;
    let in_hand: Vec<String> = claimed()
        .await
        .expect("read")
        .iter()
        .map(|p| p.id.to_string())
        .collect();
    assert!(in_hand.len() >= 4 && in_hand.len() < 20, "{in_hand:?}");

    let answer = pass.await.expect("joined");
    assert_eq!(answer.status(), 503, "on-call is told the pass failed");
    let lookups_of = async |id: &str| {
        crate::helpers::received(app.gateway(), "GET", |_| true)
            .await
            .iter()
            .filter(|r| crate::helpers::query_param(r, "reference") == id)
            .count()
    };
    for id in &ids {
        let p = app.payment(id).await;
        if in_hand.contains(id) {
            assert_eq!(p.state, "COMPLETADA", "{id}: claimed before the failure");
            assert_eq!(lookups_of(id).await, 1, "{id}");
        } else {
            assert_eq!(p.state, "ENVIADA", "{id}: never claimed");
            assert_eq!(lookups_of(id).await, 0, "{id}");
        }
    }

    crate::helpers::allow_claims(&app.db).await;
    let again = app.admin_post("/admin/reconciliaciones", &json!({})).await;
    assert_eq!(again.status(), 200);
    let left = 20 - in_hand.len() as u64;
    report(left, "completados")(&json(again).await);
    for id in &ids {
        assert_eq!(app.payment(id).await.state, "COMPLETADA", "{id}");
        assert_eq!(lookups_of(id).await, 1, "{id}: looked up once in all");
        assert_eq!(fake.charges_for(id), 1, "{id}");
    }
}

on_both_databases!(a_payment_settled_by_a_webhook_during_the_passs_look_up_is_reported_skipped);

/// A pass looks a payment up; the provider's search lags (nothing yet), and while it is
/// answered a gateway event settles the payment. The pass decides to resend, but its
/// mark is fenced: it sent nothing and decided nothing. Its report says `omitidos`, not
/// `completados` — on-call reads the report as what this pass did.
async fn a_payment_settled_by_a_webhook_during_the_passs_look_up_is_reported_skipped(
    backend: Backend,
) {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, ResponseTemplate};
    let app = crate::webhooks::spawn_with(
        backend,
        &["--gateway-retries", "0", "--gateway-timeout", "5s"],
    )
    .await;
    Mock::given(method("POST"))
        .and(path("/v1/charges"))
        .respond_with(ResponseTemplate::new(503))
        .mount(app.gateway())
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/charges"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"data": []}))
                .set_delay(Duration::from_millis(1500)),
        )
        .mount(app.gateway())
        .await;
    let answer = app.pay("k-raced", &payment_body()).await;
    assert_eq!(answer.status(), 202);
    let id = json(answer).await["id"].as_str().expect("id").to_owned();

    let pass = async {
        let answer = app
            .post_as(
                crate::webhooks::ADMIN,
                "/admin/reconciliaciones",
                &json!({ "pagoId": id }),
            )
            .await;
        assert_eq!(answer.status(), 200);
        json(answer).await
    };
    let webhook = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let charge = json!({"id": "ch_raced", "status": "succeeded", "amount": 250000,
            "currency": "COP", "reference": id, "declineCode": null});
        crate::compensation::deliver_event(&app, "evt_raced", "charge.updated", 1, charge).await
    };
    let (report, word) = tokio::join!(pass, webhook);
    assert_eq!(word, "aplicado");
    assert_eq!(report["omitidos"], 1, "{report}");
    assert_eq!(report["completados"], 0, "{report}");
    assert_eq!(app.payment(&id).await.state, "COMPLETADA");
    assert_eq!(app.charges_seen().await.len(), 1, "nothing resent");
}

/// The provider made the refund, its answer was lost to the timeout, and its search does
/// not list it yet. A look-up finding nothing is no proof that nothing was made: the
/// reconciler resends with the refund's own key, which the provider answers with the
/// refund it made. One refund at the provider, COMPLETADO, and the retry of the merchant's
/// key gets it.
async fn a_refund_the_provider_made_but_its_search_does_not_show_yet_is_resent_with_its_key(
    backend: Backend,
) {
    use crate::refunds::{FakeRefunds, app_with, paid, refund};
    let (app, fake): (TestApp, FakeRefunds) = app_with(
        backend,
        &["--gateway-timeout", "200ms", "--gateway-retries", "0"],
    )
    .await;
    let payment = paid(&app, "pay-1").await;
    fake.delay(Duration::from_millis(600));
    fake.search_lags(true);
    let body = json!({"monto": 50000});
    let asked = refund(&app, &payment, "ref-lost", &body).await;
    assert_eq!(asked.status(), 202, "its outcome is unknown");
    let id = json(asked).await["id"].as_str().expect("id").to_owned();
    assert_eq!(fake.made().len(), 1, "the provider made it");

    fake.delay(Duration::ZERO);
    let answer = app
        .admin_post("/admin/reconciliaciones", &json!({ "reembolsoId": id }))
        .await;
    assert_eq!(answer.status(), 200);
    let report = json(answer).await;
    assert_eq!(report["reembolsos"]["completados"], 1, "{report}");
    assert_eq!(
        fake.made().len(),
        1,
        "the resend was answered with the same refund"
    );

    let retried = refund(&app, &payment, "ref-lost", &body).await;
    assert_eq!(retried.status(), 201);
    let retried = json(retried).await;
    assert_eq!(retried["id"], id.as_str());
    assert_eq!(retried["estado"], "COMPLETADO");
    let pago = json(
        app.get_as(crate::helpers::API_KEY, &format!("/v1/pagos/{payment}"))
            .await,
    )
    .await;
    assert_eq!(pago["montoReembolsado"], 50000);
}
