//! The outbox: every payment transition a merchant must know writes its event with the
//! transition, or neither is written. Payments settled by the request, the reconciler and
//! on-call; a transition that fails leaves no event and no move.

use crate::helpers::{
    ADMIN_TOKEN, Backend, Charge, FakeGateway, Spawn, TestApp, json, payment_body,
};
use crate::on_both_databases;
use pagos::entities::event;
use pagos::saga::state::Event;
use pagos::saga::store::{Actor, Changes};
use pagos_types::{EventType, Evento};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, TransactionTrait};
use serde_json::json;
use std::time::Duration;

on_both_databases!(
    a_completed_payment_writes_one_event_with_the_payment_as_it_answered,
    a_declined_payment_writes_a_failed_event,
    the_reconciler_and_on_call_write_events_with_growing_sequences,
    a_transition_that_fails_writes_neither_the_move_nor_its_event,
    a_rolled_back_transaction_leaves_no_event,
    a_payment_left_pending_writes_no_event,
);

pub async fn events_of(app: &TestApp, payment: &str) -> Vec<event::Model> {
    let id = uuid::Uuid::parse_str(payment).expect("uuid");
    event::Entity::find()
        .filter(event::Column::SubjectId.eq(id))
        .order_by_asc(event::Column::Sequence)
        .all(&app.db)
        .await
        .expect("query")
}

fn wire(e: &event::Model) -> Evento {
    serde_json::from_str(&e.body).expect("the body is an Evento")
}

async fn a_completed_payment_writes_one_event_with_the_payment_as_it_answered(backend: Backend) {
    let app = crate::helpers::charging(backend, Charge::succeeded()).await;
    let answer = app.pay("k-1", &payment_body()).await;
    assert_eq!(answer.status(), 201);
    let text = answer.text().await.expect("body");
    let pago: serde_json::Value = serde_json::from_str(&text).expect("json");
    let id = pago["id"].as_str().expect("id");

    let events = events_of(&app, id).await;
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e.event_type, EventType::PagoCompletado);
    assert!(e.id.starts_with("evt_"));
    let body = wire(e);
    assert_eq!(body.id, e.id);
    assert_eq!(body.tipo, EventType::PagoCompletado);
    assert_eq!(
        body.datos, pago,
        "datos is the payment the merchant was answered"
    );
    let stored = app.payment(id).await;
    assert_eq!(
        body.secuencia,
        u64::try_from(stored.version).expect("version")
    );
    // Queued for the delivery worker's fan-out, with the payment's move.
    let queued = pagos::entities::event_to_fan_out::Entity::find_by_id(e.id.clone())
        .one(&app.db)
        .await
        .expect("query");
    assert!(queued.is_some(), "the event waits for its fan-out");
}

async fn a_declined_payment_writes_a_failed_event(backend: Backend) {
    let app = crate::helpers::charging(backend, Charge::declined()).await;
    let answer = app.pay("k-2", &payment_body()).await;
    assert_eq!(answer.status(), 402);
    let problem = json(answer).await;
    let id = problem["pago"]["id"].as_str().expect("id");
    let events = events_of(&app, id).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].event_type, EventType::PagoFallido);
    assert_eq!(wire(&events[0]).datos["estado"], "FALLIDA");
}

async fn the_reconciler_and_on_call_write_events_with_growing_sequences(backend: Backend) {
    let app =
        crate::helpers::started(backend, &["--give-up-after", "1s", "--stale-after", "1s"]).await;
    let fake = app.with_fake(FakeGateway::charging("pending")).await;
    let answer = app.pay("k-3", &payment_body()).await;
    assert_eq!(answer.status(), 202);
    let id = json(answer).await["id"].as_str().expect("id").to_owned();
    assert!(events_of(&app, &id).await.is_empty(), "ENVIADA is no event");

    fake.fail_lookups(true);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let report = app.reconcile(&id).await;
    assert_eq!(report["revisionManual"], 1, "{report}");
    // The provider answers again, and shows the charge succeeded.
    fake.fail_lookups(false);
    fake.settle(&id, "succeeded");
    app.resolved_as(
        ADMIN_TOKEN,
        &id,
        &json!({"estado": "COMPLETADA", "motivo": "seen succeeded in the dashboard"}),
    )
    .await;

    let events = events_of(&app, &id).await;
    let types: Vec<_> = events.iter().map(|e| e.event_type).collect();
    assert_eq!(
        types,
        [EventType::PagoRevisionManual, EventType::PagoCompletado]
    );
    let (first, second) = (wire(&events[0]), wire(&events[1]));
    assert!(second.secuencia > first.secuencia);
    assert_eq!(first.datos["estado"], "REVISION_MANUAL");
    assert_eq!(second.datos["estado"], "COMPLETADA");
}

/// A payment with `key` left ENVIADA by a gateway answering `pending`: its id and row.
async fn left_enviada(app: &TestApp, key: &str) -> (String, pagos::entities::payment::Model) {
    app.with_fake(FakeGateway::charging("pending")).await;
    let answer = app.pay(key, &payment_body()).await;
    let id = json(answer).await["id"].as_str().expect("id").to_owned();
    let current = app.payment(&id).await;
    (id, current)
}

/// A move whose event cannot be written (here: an event of that very step is already
/// there) fails whole: the payment stays where it was, no second event appears. On
/// PostgreSQL this is the one-statement write; on SQLite its transaction.
async fn a_transition_that_fails_writes_neither_the_move_nor_its_event(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    let (id, current) = left_enviada(&app, "k-4").await;
    let blocker = pagos::outbox::event(
        current.merchant_id,
        EventType::PagoCompletado,
        current.id,
        current.version + 1,
        "{}",
        pagos::db::now(),
    );
    pagos::outbox::record(&app.db, &blocker)
        .await
        .expect("inserted");

    let changes = Changes {
        gateway_ref: Some("ch_x".into()),
        ..Changes::default()
    };
    let written = pagos::saga::apply_now(
        &app.db,
        &current,
        Event::Charged,
        changes,
        Actor::Reconciler,
        "test",
    )
    .await;
    assert!(written.is_err(), "the event's conflict fails the move");
    let after = app.payment(&id).await;
    assert_eq!(after.state, "ENVIADA");
    assert_eq!(after.version, current.version);
    let events = events_of(&app, &id).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].id, blocker.id);
}

async fn a_rolled_back_transaction_leaves_no_event(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    let (id, current) = left_enviada(&app, "k-5").await;

    let tx = app.db.begin().await.expect("begin");
    let written = pagos::saga::apply(
        &tx,
        &current,
        Event::Declined,
        Changes::default(),
        Actor::Webhook,
        "test",
    )
    .await
    .expect("applied in the transaction");
    assert!(matches!(written, pagos::saga::store::Written::Applied(_)));
    let inside = event::Entity::find()
        .filter(event::Column::SubjectId.eq(current.id))
        .all(&tx)
        .await
        .expect("query");
    assert_eq!(inside.len(), 1, "written in the transaction");
    tx.rollback().await.expect("rollback");

    assert!(events_of(&app, &id).await.is_empty());
    assert_eq!(app.payment(&id).await.state, "ENVIADA");
}

async fn a_payment_left_pending_writes_no_event(backend: Backend) {
    let app = Spawn::new(backend).start().await;
    app.with_fake(FakeGateway::charging("pending")).await;
    let answer = app.pay("k-6", &payment_body()).await;
    assert_eq!(answer.status(), 202);
    let id = json(answer).await["id"].as_str().expect("id").to_owned();
    assert!(events_of(&app, &id).await.is_empty());
}
