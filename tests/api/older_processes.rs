//! A rolling deployment past `m20261205_000015`: processes built before it still write
//! `events.fanned_out` (`FALSE`) with each event and fan out by that flag. Their statements
//! must keep working against the current schema, and the events they write must reach the
//! merchant through the current processes' fan-out.

use crate::helpers::{Backend, json, payment_body};
use crate::on_both_databases;
use crate::receiver::Receiver;
use crate::webhooks_out::{FLAGS, eventually};
use pagos::entities::event;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};
use std::time::Duration;

on_both_databases!(an_event_written_by_an_older_process_is_queued_and_delivered);

async fn an_event_written_by_an_older_process_is_queued_and_delivered(backend: Backend) {
    let app = crate::helpers::Spawn::new(backend)
        .flags(&FLAGS)
        .delivering()
        .start()
        .await;
    let _fake = app
        .with_fake(crate::helpers::FakeGateway::charging("succeeded"))
        .await;
    let receiver = Receiver::start().await;
    app.register_endpoint(&receiver.url("/")).await;

    let answer = app.pay("k-1", &payment_body()).await;
    assert_eq!(answer.status(), 201);
    let paid = uuid::Uuid::parse_str(json(answer).await["id"].as_str().expect("id")).expect("uuid");
    let current = event::Entity::find()
        .filter(event::Column::SubjectId.eq(paid))
        .one(&app.db)
        .await
        .expect("query")
        .expect("the current process's event");
    eventually(
        Duration::from_secs(10),
        "the current event delivered",
        async || receiver.deliveries().len() == 1,
    )
    .await;

    // What an older process's final statement wrote: every column, the flag unset.
    let older = pagos::outbox::new_id();
    app.db
        .execute_unprepared(&format!(
            r#"INSERT INTO "events" ("id", "merchant_id", "event_type", "subject_id", "sequence", "body", "created_at", "fanned_out")
               SELECT '{older}', "merchant_id", "event_type", "subject_id", "sequence" + 1,
                      REPLACE("body", '{current}', '{older}'), "created_at", FALSE
               FROM "events" WHERE "id" = '{current}'"#,
            current = current.id
        ))
        .await
        .expect("an older process's insert still runs");

    // An older process's fan-out scan sees only what older processes wrote…
    let unset = app
        .db
        .query_all_raw(sea_orm::Statement::from_string(
            app.db.get_database_backend(),
            r#"SELECT "id" FROM "events" WHERE "fanned_out" = FALSE"#,
        ))
        .await
        .expect("an older process's fan-out scan still runs");
    let unset: Vec<String> = unset
        .iter()
        .map(|row| row.try_get("", "id").expect("id"))
        .collect();
    assert_eq!(
        unset,
        vec![older.clone()],
        "the current event counts as handled"
    );

    // …and the current processes deliver it, once.
    eventually(
        Duration::from_secs(10),
        "the older event delivered",
        async || receiver.deliveries().len() == 2,
    )
    .await;
    let got = &receiver.deliveries()[1];
    assert_eq!(got.header("webhook-id"), older);
    assert!(String::from_utf8_lossy(&got.body).contains(&older));

    // An older process's fan-out may still take it: marking it is harmless.
    app.db
        .execute_unprepared(&format!(
            r#"UPDATE "events" SET "fanned_out" = TRUE WHERE "id" = '{older}'"#
        ))
        .await
        .expect("an older process's fan-out update still runs");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.deliveries().len(), 2, "each event delivered once");
}
