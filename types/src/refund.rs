//! A refund as the contract shows it (section 6): `POST /v1/pagos/{id}/reembolsos` and
//! `GET /v1/reembolsos/{id}` answer with it, a refusal carries it under `reembolso`; and
//! the request that asks for one, parsed once into valid values.
//!
//! The field order is the bytes of every answer (frozen answers are replayed byte for
//! byte), so it never changes.

use crate::request::{FieldError, MAX_SAFE_AMOUNT};
#[cfg(feature = "sea-orm")]
use sea_orm::entity::prelude::StringLen;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;
use uuid::Uuid;

/// Where a refund stands. The names are the contract's (`estado`), masculine as the noun.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "sea-orm",
    derive(sea_orm::EnumIter, sea_orm::DeriveActiveEnum),
    sea_orm(rs_type = "String", db_type = "String(StringLen::N(20))")
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RefundState {
    /// Registered, never sent to the gateway.
    #[cfg_attr(feature = "sea-orm", sea_orm(string_value = "EN_PROCESO"))]
    EnProceso,
    /// Maybe sent: after a crash, ask the provider before anything else.
    #[cfg_attr(feature = "sea-orm", sea_orm(string_value = "ENVIADO"))]
    Enviado,
    /// The money went back. Final.
    #[cfg_attr(feature = "sea-orm", sea_orm(string_value = "COMPLETADO"))]
    Completado,
    /// Refused or failed at the gateway; no money went back. Final.
    #[cfg_attr(feature = "sea-orm", sea_orm(string_value = "FALLIDO"))]
    Fallido,
    /// pagos cannot decide without risking a second refund: on-call decides.
    #[cfg_attr(feature = "sea-orm", sea_orm(string_value = "REVISION_MANUAL"))]
    RevisionManual,
}

impl RefundState {
    pub const ALL: [RefundState; 5] = [
        RefundState::EnProceso,
        RefundState::Enviado,
        RefundState::Completado,
        RefundState::Fallido,
        RefundState::RevisionManual,
    ];

    /// The states whose amount counts against what is left of the payment: everything
    /// but `FALLIDO` (no money went back, and none will).
    pub const COUNTED: [RefundState; 4] = [
        RefundState::EnProceso,
        RefundState::Enviado,
        RefundState::Completado,
        RefundState::RevisionManual,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RefundState::EnProceso => "EN_PROCESO",
            RefundState::Enviado => "ENVIADO",
            RefundState::Completado => "COMPLETADO",
            RefundState::Fallido => "FALLIDO",
            RefundState::RevisionManual => "REVISION_MANUAL",
        }
    }

    /// COMPLETADO and FALLIDO never change again (but for a contradiction).
    pub fn is_terminal(self) -> bool {
        matches!(self, RefundState::Completado | RefundState::Fallido)
    }
}

impl fmt::Display for RefundState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The refund representation of the contract.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Reembolso {
    pub id: Uuid,
    #[serde(rename = "pagoId")]
    pub payment_id: Uuid,
    /// Minor units of `moneda`.
    #[serde(rename = "monto")]
    pub amount: i64,
    #[serde(rename = "moneda")]
    pub currency: String,
    #[serde(rename = "estado")]
    pub state: RefundState,
    #[serde(rename = "motivo", default)]
    pub reason: Option<String>,
    #[serde(rename = "gatewayRef", default)]
    pub gateway_ref: Option<String>,
    /// RFC 3339.
    #[serde(rename = "creadoEn")]
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub created_at: String,
    /// RFC 3339.
    #[serde(rename = "actualizadoEn")]
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub updated_at: String,
}

/// The longest `motivo`.
pub const MAX_REASON_LEN: usize = 255;

/// The body of `POST /v1/pagos/{id}/reembolsos`, parsed: valid by construction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewRefund {
    /// None: everything not yet refunded.
    pub amount: Option<i64>,
    pub reason: Option<String>,
}

const KNOWN_FIELDS: [&str; 2] = ["monto", "motivo"];

fn field_error(campo: &str, detalle: impl Into<String>) -> FieldError {
    FieldError {
        campo: campo.to_owned(),
        detalle: detalle.into(),
    }
}

impl NewRefund {
    /// Parses a JSON body, listing every offending field at once. `reason_required`: the
    /// on-call refund must say why.
    pub fn from_json(body: &Value, reason_required: bool) -> Result<NewRefund, Vec<FieldError>> {
        let Some(object) = body.as_object() else {
            return Err(vec![field_error(
                "(cuerpo)",
                "the body must be a JSON object",
            )]);
        };
        let mut errors = Vec::new();
        for name in object.keys() {
            if !KNOWN_FIELDS.contains(&name.as_str()) {
                errors.push(field_error(name, "unknown field"));
            }
        }
        let amount = parse_amount(object).map_err(|e| errors.push(e)).ok();
        let reason = parse_reason(object, reason_required)
            .map_err(|e| errors.push(e))
            .ok();
        match (amount, reason) {
            (Some(amount), Some(reason)) if errors.is_empty() => Ok(NewRefund { amount, reason }),
            _ => Err(errors),
        }
    }
}

fn parse_amount(object: &Map<String, Value>) -> Result<Option<i64>, FieldError> {
    match object.get("monto") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(v) if v > MAX_SAFE_AMOUNT => Err(field_error(
                "monto",
                format!("at most {MAX_SAFE_AMOUNT} (2^53 − 1)"),
            )),
            Some(v) if v > 0 => Ok(Some(v)),
            Some(_) => Err(field_error("monto", "must be greater than zero")),
            None if n.is_u64() => Err(field_error(
                "monto",
                format!("at most {MAX_SAFE_AMOUNT} (2^53 − 1)"),
            )),
            None if n.as_f64().is_some_and(|f| f <= 0.0) => {
                Err(field_error("monto", "must be greater than zero"))
            }
            None if n.as_f64().is_some_and(|f| f > MAX_SAFE_AMOUNT as f64) => Err(field_error(
                "monto",
                format!("at most {MAX_SAFE_AMOUNT} (2^53 − 1)"),
            )),
            // A whole amount written with a fraction or an exponent (50000.0, 5e4).
            None if n.as_f64().is_some_and(|f| f.fract() == 0.0) => Err(field_error(
                "monto",
                "must be written as a whole number, without a decimal point or exponent (50000, not 50000.0)",
            )),
            None => Err(field_error(
                "monto",
                "must be a whole number of minor units (no decimals)",
            )),
        },
        Some(other) => Err(field_error(
            "monto",
            crate::request::must_be_a_number(other),
        )),
    }
}

fn parse_reason(object: &Map<String, Value>, required: bool) -> Result<Option<String>, FieldError> {
    match object.get("motivo") {
        None | Some(Value::Null) if required => Err(field_error("motivo", "required")),
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if required && s.trim().is_empty() => {
            Err(field_error("motivo", "required"))
        }
        Some(Value::String(s)) if s.chars().count() > MAX_REASON_LEN => Err(field_error(
            "motivo",
            format!("at most {MAX_REASON_LEN} characters"),
        )),
        Some(Value::String(s)) if s.contains('\0') => {
            Err(field_error("motivo", crate::request::NUL_REFUSED))
        }
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(field_error("motivo", "must be a string")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(body: Value, required: bool) -> Vec<String> {
        match NewRefund::from_json(&body, required) {
            Ok(_) => vec![],
            Err(errors) => errors.into_iter().map(|e| e.campo).collect(),
        }
    }

    #[test]
    fn a_motivo_holding_nul_is_refused_and_other_control_characters_are_not() {
        assert_eq!(fields(json!({"motivo": "a\u{0}b"}), false), ["motivo"]);
        assert!(fields(json!({"motivo": "línea 1\nlínea 2\t"}), true).is_empty());
    }

    #[test]
    fn the_contract_example_and_an_empty_body_are_valid() {
        assert_eq!(
            NewRefund::from_json(
                &json!({"monto": 50000, "motivo": "solicitud del cliente"}),
                false
            ),
            Ok(NewRefund {
                amount: Some(50000),
                reason: Some("solicitud del cliente".into())
            })
        );
        assert_eq!(
            NewRefund::from_json(&json!({}), false),
            Ok(NewRefund {
                amount: None,
                reason: None
            })
        );
    }

    #[test]
    fn a_monto_that_is_not_a_number_is_told_what_it_is() {
        for (written, what) in [
            (json!("50000"), "must be a number, not a string"),
            (json!(true), "must be a number, not a boolean"),
            (json!([1]), "must be a number, not an array"),
            (json!({"valor": 1}), "must be a number, not an object"),
        ] {
            let errors =
                NewRefund::from_json(&json!({ "monto": written }), false).expect_err("refused");
            assert_eq!(errors.len(), 1, "{written}");
            assert_eq!(errors[0].campo, "monto");
            assert_eq!(errors[0].detalle, what, "{written}");
        }
    }

    #[test]
    fn every_bad_field_is_listed_at_once() {
        assert_eq!(
            fields(json!({"monto": 0, "motivo": 3, "extra": 1}), false),
            vec!["extra", "monto", "motivo"]
        );
        assert_eq!(fields(json!({"monto": "5"}), false), vec!["monto"]);
        assert_eq!(fields(json!({"monto": 1.5}), false), vec!["monto"]);
        assert_eq!(fields(json!({"monto": -3}), false), vec!["monto"]);
        assert_eq!(
            fields(json!({"monto": 9007199254740992_i64}), false),
            vec!["monto"]
        );
        assert_eq!(
            fields(json!({"motivo": "x".repeat(256)}), false),
            vec!["motivo"]
        );
        assert_eq!(fields(json!([1]), false), vec!["(cuerpo)"]);
    }

    #[test]
    fn the_on_call_refund_must_say_why() {
        assert_eq!(fields(json!({"monto": 5}), true), vec!["motivo"]);
        assert_eq!(fields(json!({"motivo": "  "}), true), vec!["motivo"]);
        assert!(fields(json!({"motivo": "cliente llamó"}), true).is_empty());
    }

    #[test]
    fn the_refund_is_written_in_the_contracts_order() {
        let r = Reembolso {
            id: Uuid::nil(),
            payment_id: Uuid::nil(),
            amount: 50000,
            currency: "COP".into(),
            state: RefundState::Completado,
            reason: None,
            gateway_ref: Some("re_1".into()),
            created_at: "2026-01-01T00:00:00.000Z".into(),
            updated_at: "2026-01-01T00:00:01.000Z".into(),
        };
        let text = serde_json::to_string(&r).expect("json");
        assert_eq!(
            text,
            r#"{"id":"00000000-0000-0000-0000-000000000000","pagoId":"00000000-0000-0000-0000-000000000000","monto":50000,"moneda":"COP","estado":"COMPLETADO","motivo":null,"gatewayRef":"re_1","creadoEn":"2026-01-01T00:00:00.000Z","actualizadoEn":"2026-01-01T00:00:01.000Z"}"#
        );
        assert_eq!(serde_json::from_str::<Reembolso>(&text).expect("reads"), r);
    }

    #[test]
    fn only_a_failed_refund_leaves_its_amount_to_refund_again() {
        for state in RefundState::ALL {
            assert_eq!(
                RefundState::COUNTED.contains(&state),
                state != RefundState::Fallido
            );
        }
    }
}
