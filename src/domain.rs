//! The merchant's payment request, parsed from JSON into types that are valid by
//! construction. Pure: no I/O.
//!
//! Validation reports every offending field at once, so a merchant fixes a request in one
//! round trip.

use serde::Serialize;
use serde_json::{Map, Value};

/// A currency pagos accepts, with its ISO 4217 minor-unit exponent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Currency {
    code: &'static str,
    exponent: u8,
}

/// The currencies the service supports (ISO 4217 code, minor-unit exponent).
pub const CURRENCIES: &[(&str, u8)] = &[
    ("ARS", 2),
    ("BRL", 2),
    ("CLP", 0),
    ("COP", 2),
    ("EUR", 2),
    ("GBP", 2),
    ("MXN", 2),
    ("PEN", 2),
    ("USD", 2),
    ("UYU", 2),
];

impl Currency {
    pub fn parse(code: &str) -> Option<Currency> {
        CURRENCIES
            .iter()
            .find(|(c, _)| *c == code)
            .map(|&(code, exponent)| Currency { code, exponent })
    }

    pub fn code(self) -> &'static str {
        self.code
    }

    /// Digits after the decimal point in this currency's major unit (COP: 2, CLP: 0).
    pub fn exponent(self) -> u8 {
        self.exponent
    }
}

pub const MAX_CREDIT_ID_LEN: usize = 64;
pub const MAX_DESCRIPTION_LEN: usize = 255;

/// A validated `POST /v1/pagos` body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewPayment {
    pub credit_id: String,
    /// Positive, in minor units of `currency`.
    pub amount: i64,
    pub currency: Currency,
    pub description: Option<String>,
}

/// One offending field, as listed in a 422 problem.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct FieldError {
    /// The JSON field name, as the merchant sent it.
    pub campo: String,
    /// What is wrong, for a human.
    pub detalle: String,
}

fn field_error(campo: &str, detalle: impl Into<String>) -> FieldError {
    FieldError {
        campo: campo.to_owned(),
        detalle: detalle.into(),
    }
}

const KNOWN_FIELDS: [&str; 4] = ["creditoId", "monto", "moneda", "descripcion"];

impl NewPayment {
    /// Parses a JSON body already known to be syntactically valid JSON.
    pub fn from_json(body: &Value) -> Result<NewPayment, Vec<FieldError>> {
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
        let credit_id = parse_credit_id(object).map_err(|e| errors.push(e)).ok();
        let amount = parse_amount(object).map_err(|e| errors.push(e)).ok();
        let currency = parse_currency(object).map_err(|e| errors.push(e)).ok();
        let description = parse_description(object).map_err(|e| errors.push(e)).ok();
        match (credit_id, amount, currency, description) {
            (Some(credit_id), Some(amount), Some(currency), Some(description))
                if errors.is_empty() =>
            {
                Ok(NewPayment {
                    credit_id,
                    amount,
                    currency,
                    description,
                })
            }
            _ => Err(errors),
        }
    }
}

fn parse_credit_id(object: &Map<String, Value>) -> Result<String, FieldError> {
    match object.get("creditoId") {
        None | Some(Value::Null) => Err(field_error("creditoId", "required")),
        Some(Value::String(s)) if s.trim().is_empty() => {
            Err(field_error("creditoId", "must not be blank"))
        }
        Some(Value::String(s)) if s.chars().count() > MAX_CREDIT_ID_LEN => Err(field_error(
            "creditoId",
            format!("at most {MAX_CREDIT_ID_LEN} characters"),
        )),
        Some(Value::String(s)) if s.chars().any(char::is_control) => Err(field_error(
            "creditoId",
            "must not contain control characters",
        )),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(field_error("creditoId", "must be a string")),
    }
}

fn parse_amount(object: &Map<String, Value>) -> Result<i64, FieldError> {
    match object.get("monto") {
        None | Some(Value::Null) => Err(field_error("monto", "required")),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(v) if v > 0 => Ok(v),
            Some(_) => Err(field_error("monto", "must be greater than zero")),
            None if n.is_u64() => Err(field_error("monto", "is too large")),
            None => Err(field_error(
                "monto",
                "must be a whole number of minor units (no decimals)",
            )),
        },
        Some(_) => Err(field_error("monto", "must be a number, not a string")),
    }
}

fn parse_currency(object: &Map<String, Value>) -> Result<Currency, FieldError> {
    match object.get("moneda") {
        None | Some(Value::Null) => Err(field_error("moneda", "required")),
        Some(Value::String(s)) => Currency::parse(s).ok_or_else(|| {
            let supported: Vec<&str> = CURRENCIES.iter().map(|(c, _)| *c).collect();
            field_error(
                "moneda",
                format!(
                    "unsupported currency {s:?}; supported: {}",
                    supported.join(", ")
                ),
            )
        }),
        Some(_) => Err(field_error("moneda", "must be an ISO 4217 code string")),
    }
}

fn parse_description(object: &Map<String, Value>) -> Result<Option<String>, FieldError> {
    match object.get("descripcion") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.chars().count() > MAX_DESCRIPTION_LEN => Err(field_error(
            "descripcion",
            format!("at most {MAX_DESCRIPTION_LEN} characters"),
        )),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(field_error("descripcion", "must be a string")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(body: Value) -> Vec<String> {
        match NewPayment::from_json(&body) {
            Ok(_) => vec![],
            Err(errors) => errors.into_iter().map(|e| e.campo).collect(),
        }
    }

    #[test]
    fn the_contract_example_is_valid() {
        let parsed =
            NewPayment::from_json(&json!({"creditoId":"42","monto":250000,"moneda":"COP"}));
        let payment = parsed.expect("valid");
        assert_eq!(payment.amount, 250000);
        assert_eq!(payment.currency.code(), "COP");
        assert_eq!(payment.currency.exponent(), 2);
        assert_eq!(payment.description, None);
    }

    #[test]
    fn every_bad_field_is_reported_at_once() {
        assert_eq!(
            fields(json!({"creditoId":"","monto":0,"moneda":"XXX","extra":1})),
            vec!["extra", "creditoId", "monto", "moneda"]
        );
    }

    #[test]
    fn amounts_must_be_positive_whole_numbers() {
        for bad in [
            json!(0),
            json!(-5),
            json!(1.5),
            json!("100"),
            json!(1e300),
            json!(null),
        ] {
            assert_eq!(
                fields(json!({"creditoId":"42","monto":bad,"moneda":"COP"})),
                vec!["monto"],
                "{bad}"
            );
        }
    }

    #[test]
    fn a_json_array_is_not_a_payment() {
        assert_eq!(fields(json!([1, 2])), vec!["(cuerpo)"]);
    }

    #[test]
    fn lengths_are_bounded() {
        let long = "x".repeat(65);
        assert_eq!(
            fields(
                json!({"creditoId":long,"monto":1,"moneda":"USD","descripcion":"y".repeat(256)})
            ),
            vec!["creditoId", "descripcion"]
        );
    }
}
