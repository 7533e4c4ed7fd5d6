//! An event as the contract shows it (section 7): what changed about a payment or a
//! refund, delivered to the merchant's endpoints and listed by `GET /v1/eventos`.
//!
//! `secuencia` increases per payment (or refund): a consumer ignores an event at or below
//! the last one it applied for that payment. The `id` is the `webhook-id` of every
//! delivery of the event: a consumer applies each id once.
//!
//! The server writes the body once, when the event is recorded, and sends those very
//! bytes on every attempt; the field order below is that body's.

use crate::state::PaymentState;
#[cfg(feature = "sea-orm")]
use sea_orm::entity::prelude::StringLen;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// What happened. Stored and sent as the contract's dotted name (`pago.completado`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "sea-orm",
    derive(sea_orm::EnumIter, sea_orm::DeriveActiveEnum),
    sea_orm(rs_type = "String", db_type = "String(StringLen::N(40))")
)]
pub enum EventType {
    #[serde(rename = "pago.completado")]
    #[cfg_attr(feature = "sea-orm", sea_orm(string_value = "pago.completado"))]
    PagoCompletado,
    #[serde(rename = "pago.fallido")]
    #[cfg_attr(feature = "sea-orm", sea_orm(string_value = "pago.fallido"))]
    PagoFallido,
    #[serde(rename = "pago.revision_manual")]
    #[cfg_attr(feature = "sea-orm", sea_orm(string_value = "pago.revision_manual"))]
    PagoRevisionManual,
    #[serde(rename = "reembolso.completado")]
    #[cfg_attr(feature = "sea-orm", sea_orm(string_value = "reembolso.completado"))]
    ReembolsoCompletado,
    #[serde(rename = "reembolso.fallido")]
    #[cfg_attr(feature = "sea-orm", sea_orm(string_value = "reembolso.fallido"))]
    ReembolsoFallido,
    #[serde(rename = "reembolso.revision_manual")]
    #[cfg_attr(
        feature = "sea-orm",
        sea_orm(string_value = "reembolso.revision_manual")
    )]
    ReembolsoRevisionManual,
}

impl EventType {
    pub const ALL: [EventType; 6] = [
        EventType::PagoCompletado,
        EventType::PagoFallido,
        EventType::PagoRevisionManual,
        EventType::ReembolsoCompletado,
        EventType::ReembolsoFallido,
        EventType::ReembolsoRevisionManual,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventType::PagoCompletado => "pago.completado",
            EventType::PagoFallido => "pago.fallido",
            EventType::PagoRevisionManual => "pago.revision_manual",
            EventType::ReembolsoCompletado => "reembolso.completado",
            EventType::ReembolsoFallido => "reembolso.fallido",
            EventType::ReembolsoRevisionManual => "reembolso.revision_manual",
        }
    }

    /// The event a payment's move into `state` is, if the merchant must be told of it:
    /// a final state, or review (an on-call resolution emits the state it sets).
    pub fn of_payment(state: PaymentState) -> Option<EventType> {
        match state {
            PaymentState::Completada => Some(EventType::PagoCompletado),
            PaymentState::Fallida => Some(EventType::PagoFallido),
            PaymentState::RevisionManual => Some(EventType::PagoRevisionManual),
            PaymentState::EnProceso | PaymentState::Enviada => None,
        }
    }

    /// The event a refund's move into `state` is, if the merchant must be told of it.
    pub fn of_refund(state: crate::RefundState) -> Option<EventType> {
        match state {
            crate::RefundState::Completado => Some(EventType::ReembolsoCompletado),
            crate::RefundState::Fallido => Some(EventType::ReembolsoFallido),
            crate::RefundState::RevisionManual => Some(EventType::ReembolsoRevisionManual),
            crate::RefundState::EnProceso | crate::RefundState::Enviado => None,
        }
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not an event type.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown event type {0:?}")]
pub struct UnknownEventType(pub String);

impl FromStr for EventType {
    type Err = UnknownEventType;
    fn from_str(text: &str) -> Result<EventType, UnknownEventType> {
        EventType::ALL
            .into_iter()
            .find(|t| t.as_str() == text)
            .ok_or_else(|| UnknownEventType(text.to_owned()))
    }
}

/// The event of the contract: the body of every delivery and of `GET /v1/eventos`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Evento {
    /// `evt_…`; the `webhook-id` of its deliveries.
    pub id: String,
    pub tipo: EventType,
    /// RFC 3339.
    #[serde(rename = "creadoEn")]
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub creado_en: String,
    /// Increases per payment (or refund).
    pub secuencia: u64,
    /// The payment (or refund) as it stood when the event was written.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub datos: serde_json::Value,
}

/// Whether pagos delivers to an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "sea-orm",
    derive(sea_orm::EnumIter, sea_orm::DeriveActiveEnum),
    sea_orm(rs_type = "String", db_type = "String(StringLen::N(20))")
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EndpointState {
    #[cfg_attr(feature = "sea-orm", sea_orm(string_value = "ACTIVO"))]
    Activo,
    /// Answered 410, or every delivery failed for `PAGOS_WEBHOOKS_DISABLE_AFTER`: nothing
    /// is sent until the merchant reactivates it.
    #[cfg_attr(feature = "sea-orm", sea_orm(string_value = "DESACTIVADO"))]
    Desactivado,
}

/// A merchant's webhook endpoint as `/v1/webhook-endpoints` shows it. `secreto` only in
/// the answers that create or rotate it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookEndpoint {
    pub id: uuid::Uuid,
    pub url: String,
    /// The event types delivered to it.
    pub eventos: Vec<EventType>,
    pub estado: EndpointState,
    /// `whsec_…`: shown once, when made (creation, rotation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secreto: Option<String>,
    /// RFC 3339.
    #[serde(rename = "creadoEn")]
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub creado_en: String,
    /// Until when the secret the last rotation replaced also signs (RFC 3339): 24 h after
    /// that rotation. A secret replaced by the rotation before, if that was less than 24 h
    /// earlier, signs too, until 24 h after its own replacement (before this time).
    #[serde(
        rename = "secretoAnteriorHasta",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub secreto_anterior_hasta: Option<String>,
    /// Why it is `DESACTIVADO`.
    #[serde(
        rename = "motivoDesactivacion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub motivo_desactivacion: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_type_has_the_contracts_dotted_name_both_ways() {
        for t in EventType::ALL {
            let text = serde_json::to_value(t).expect("json");
            assert_eq!(text, json!(t.as_str()));
            assert_eq!(t.as_str().parse::<EventType>(), Ok(t));
            assert_eq!(serde_json::from_value::<EventType>(text).ok(), Some(t));
        }
        assert!("pago.enviado".parse::<EventType>().is_err());
    }

    #[test]
    fn only_final_states_and_review_are_events() {
        assert_eq!(
            EventType::of_payment(PaymentState::Completada),
            Some(EventType::PagoCompletado)
        );
        assert_eq!(
            EventType::of_payment(PaymentState::Fallida),
            Some(EventType::PagoFallido)
        );
        assert_eq!(
            EventType::of_payment(PaymentState::RevisionManual),
            Some(EventType::PagoRevisionManual)
        );
        assert_eq!(EventType::of_payment(PaymentState::EnProceso), None);
        assert_eq!(EventType::of_payment(PaymentState::Enviada), None);
    }

    #[test]
    fn the_body_is_written_in_the_contracts_order() {
        let e = Evento {
            id: "evt_1".into(),
            tipo: EventType::PagoFallido,
            creado_en: "2026-01-01T00:00:00.000Z".into(),
            secuencia: 3,
            datos: json!({"id": "p"}),
        };
        assert_eq!(
            serde_json::to_string(&e).expect("json"),
            r#"{"id":"evt_1","tipo":"pago.fallido","creadoEn":"2026-01-01T00:00:00.000Z","secuencia":3,"datos":{"id":"p"}}"#
        );
    }
}
