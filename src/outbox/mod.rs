//! The transactional outbox: every change a merchant must know is an event row written
//! in the same statement or transaction as the change, so there is never an event for a
//! change that rolled back, nor a change without its event. Delivering them is the
//! delivery worker's, afterwards (`dispatcher`).
//!
//! A transition records its event with `record` inside its transaction (SQLite, and any
//! transaction on PostgreSQL), or — in a one-statement step of `saga::store` — as a
//! data-modifying `WITH` clause that inserts `event`'s row only if the transition's update
//! moved the row. Either way the row is made by `event`, so both write the same thing.
//!
//! Storage only: it never renders a payment (the caller hands over `datos`) and never
//! sends anything.

pub mod deliveries;
pub mod endpoints;
pub mod events;

use crate::entities::event;
use chrono::{DateTime, SecondsFormat, Utc};
use pagos_types::{EventType, Evento};
use sea_orm::{ConnectionTrait, DbErr, EntityTrait};
use uuid::Uuid;

/// A new event id: `evt_` and a UUIDv7 in hex, so ids sort by the time they were made.
pub fn new_id() -> String {
    format!("evt_{}", Uuid::now_v7().simple())
}

/// The event row of `tipo` about `subject` (a payment or a refund) at step `sequence`
/// (its version after the change: it only grows), with `datos` its representation after
/// the change. The body is rendered here once: every delivery sends these bytes.
pub fn event(
    merchant: Uuid,
    tipo: EventType,
    subject: Uuid,
    sequence: i64,
    datos: serde_json::Value,
    at: DateTime<Utc>,
) -> event::Model {
    let id = new_id();
    let wire = Evento {
        id: id.clone(),
        tipo,
        creado_en: at.to_rfc3339_opts(SecondsFormat::Millis, true),
        secuencia: u64::try_from(sequence).unwrap_or(0),
        datos,
    };
    event::Model {
        id,
        merchant_id: merchant,
        event_type: tipo,
        subject_id: subject,
        sequence,
        // Serializing a struct of strings, numbers and a JSON value cannot fail.
        body: serde_json::to_string(&wire).unwrap_or_default(),
        created_at: at,
        fanned_out: false,
    }
}

/// Writes `event` in `tx`, the transaction of the change it tells. The caller commits
/// both or neither. (Refund transitions call this the way payment transitions do.)
pub async fn record<C: ConnectionTrait>(tx: &C, event: &event::Model) -> Result<(), DbErr> {
    event::Entity::insert(event::ActiveModel::from(event.clone()))
        .exec_without_returning(tx)
        .await?;
    Ok(())
}
