//! A payment as the contract shows it: `POST /v1/pagos` and `GET /v1/pagos/{id}` answer
//! with it, a decline carries it under `pago`. Field names are the contract's (Spanish),
//! mapped with serde; the code speaks English.
//!
//! The server serializes it and the client reads it: the field order is the bytes of every
//! answer (frozen answers are replayed byte for byte), so it never changes.

use crate::state::PaymentState;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The payment representation of the contract.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Pago {
    pub id: Uuid,
    #[serde(rename = "creditoId")]
    pub credit_id: String,
    /// Minor units of `moneda`.
    #[serde(rename = "monto")]
    pub amount: i64,
    #[serde(rename = "moneda")]
    pub currency: String,
    #[serde(
        rename = "descripcion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub description: Option<String>,
    /// The payment method charged: only its `id` (a Stripe `pm_…` or a Mercado Pago
    /// `payment_method_id`), never a token, e-mail or document.
    #[serde(rename = "medioPago", default, skip_serializing_if = "Option::is_none")]
    pub payment_method: Option<MedioPago>,
    #[serde(rename = "estado")]
    pub state: PaymentState,
    #[serde(rename = "gatewayRef", default)]
    pub gateway_ref: Option<String>,
    /// Sum of the payment's `COMPLETADO` refunds, in minor units. Shown when the payment is
    /// read (`GET /v1/pagos/{id}`, every payment of the search `GET /v1/pagos`) and in the
    /// answer to its `POST`, frozen when it was made: 0 there, whatever was refunded since.
    #[serde(
        rename = "montoReembolsado",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub refunded_amount: Option<i64>,
    /// RFC 3339.
    #[serde(rename = "creadoEn")]
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub created_at: String,
    /// RFC 3339.
    #[serde(rename = "actualizadoEn")]
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub updated_at: String,
}

/// What the representation shows of a payment method.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MedioPago {
    #[cfg_attr(feature = "openapi", schema(example = "pm_1Q0PsIJvEtkwdCNYMSaVuRz6"))]
    pub id: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pago(estado: &str) -> serde_json::Value {
        json!({"id": "0193c4a2-7f1e-7c3a-9b0e-2a4d5f6e7a8b", "creditoId": "42", "monto": 250000,
               "moneda": "COP", "estado": estado, "gatewayRef": "ch_1",
               "creadoEn": "2026-01-01T00:00:00.000Z", "actualizadoEn": "2026-01-01T00:00:01.000Z"})
    }

    #[test]
    fn the_payment_round_trips_with_the_contracts_names() {
        let p: Pago = serde_json::from_value(pago("COMPLETADA")).expect("payment");
        assert_eq!(serde_json::to_value(&p).expect("json"), pago("COMPLETADA"));
    }

    #[test]
    fn fields_are_written_in_the_contracts_order_and_absent_options_are_left_out() {
        let mut p: Pago = serde_json::from_value(pago("ENVIADA")).expect("payment");
        p.gateway_ref = None;
        assert_eq!(
            serde_json::to_string(&p).expect("json"),
            r#"{"id":"0193c4a2-7f1e-7c3a-9b0e-2a4d5f6e7a8b","creditoId":"42","monto":250000,"moneda":"COP","estado":"ENVIADA","gatewayRef":null,"creadoEn":"2026-01-01T00:00:00.000Z","actualizadoEn":"2026-01-01T00:00:01.000Z"}"#
        );
        p.description = Some("cuota 3".into());
        p.payment_method = Some(MedioPago { id: "visa".into() });
        let text = serde_json::to_string(&p).expect("json");
        assert!(
            text.contains(
                r#""moneda":"COP","descripcion":"cuota 3","medioPago":{"id":"visa"},"estado""#
            ),
            "{text}"
        );
    }
}
