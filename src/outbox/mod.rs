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

use crate::entities::{event, event_to_fan_out};
use chrono::{DateTime, SecondsFormat, Utc};
use pagos_types::EventType;
use sea_orm::{ConnectionTrait, DbErr, EntityTrait};
use uuid::Uuid;

/// Whether transitions write their events: always, but in the outbox benchmark's
/// yardstick (the `bench-without-outbox` feature), which measures what the outbox costs.
pub const ON: bool = !cfg!(feature = "bench-without-outbox");

/// A new event id: `evt_` and a UUIDv7 in hex, so ids sort by the time they were made.
pub fn new_id() -> String {
    format!("evt_{}", Uuid::now_v7().simple())
}

/// The event row of `tipo` about `subject` (a payment or a refund) at step `sequence`
/// (its version after the change: it only grows), with `datos` the JSON text of its
/// representation after the change, kept byte for byte (the contract's field order). The
/// body is rendered here once: every delivery sends these bytes.
pub fn event(
    merchant: Uuid,
    tipo: EventType,
    subject: Uuid,
    sequence: i64,
    datos: &str,
    at: DateTime<Utc>,
) -> event::Model {
    /// `Evento` without its `datos`, which are spliced in as they were rendered.
    #[derive(serde::Serialize)]
    struct Head<'a> {
        id: &'a str,
        tipo: EventType,
        #[serde(rename = "creadoEn")]
        creado_en: String,
        secuencia: u64,
    }
    let id = new_id();
    let head = Head {
        id: &id,
        tipo,
        creado_en: at.to_rfc3339_opts(SecondsFormat::Millis, true),
        secuencia: u64::try_from(sequence).unwrap_or(0),
    };
    // A struct of strings and numbers always serializes.
    let head = serde_json::to_string(&head).unwrap_or_default();
    let open = head.strip_suffix('}').unwrap_or(&head);
    let body = format!(r#"{open},"datos":{datos}}}"#);
    event::Model {
        id,
        merchant_id: merchant,
        event_type: tipo,
        subject_id: subject,
        sequence,
        body,
        created_at: at,
    }
}

/// Writes `event` in `tx`, the transaction of the change it tells, and queues it for the
/// delivery worker's fan-out. The caller commits all or nothing. (Refund transitions call
/// this the way payment transitions do.)
pub async fn record<C: ConnectionTrait>(tx: &C, event: &event::Model) -> Result<(), DbErr> {
    event::Entity::insert(event::ActiveModel::from(event.clone()))
        .exec_without_returning(tx)
        .await?;
    event_to_fan_out::Entity::insert(event_to_fan_out::ActiveModel::from(
        event_to_fan_out::Model {
            event_id: event.id.clone(),
        },
    ))
    .exec_without_returning(tx)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagos_types::Evento;

    #[test]
    fn the_body_is_the_contracts_event_with_datos_as_rendered() {
        let at = DateTime::parse_from_rfc3339("2026-01-02T03:04:05.678Z")
            .expect("time")
            .with_timezone(&Utc);
        let datos = r#"{"id":"p","creditoId":"42","estado":"COMPLETADA"}"#;
        let e = event(
            Uuid::nil(),
            EventType::PagoCompletado,
            Uuid::nil(),
            7,
            datos,
            at,
        );
        assert_eq!(
            e.body,
            format!(
                r#"{{"id":"{}","tipo":"pago.completado","creadoEn":"2026-01-02T03:04:05.678Z","secuencia":7,"datos":{datos}}}"#,
                e.id
            )
        );
        let wire: Evento = serde_json::from_str(&e.body).expect("an Evento");
        assert_eq!(wire.secuencia, 7);
        assert!(e.id.starts_with("evt_") && e.id.len() == 36);
    }
}
