//! Amounts between pagos (minor units of the ISO 4217 currency: `monto`) and what each
//! provider takes: Stripe its own minor units (the ISO ones, except for the currencies it
//! treats as zero-decimal), Mercado Pago decimal major units (`transaction_amount`).
//!
//! Pure and exact: a conversion that would round is refused, never approximated, because
//! a charge for another amount than the payment's is a wrong charge.

use crate::domain::Currency;
use rust_decimal::Decimal;

/// Currencies Stripe takes in whole units (its "zero-decimal currencies").
const STRIPE_ZERO_DECIMAL: &[&str] = &[
    "BIF", "CLP", "DJF", "GNF", "JPY", "KMF", "KRW", "MGA", "PYG", "RWF", "UGX", "VND", "VUV",
    "XAF", "XOF", "XPF",
];

/// Currencies Stripe takes in thousandths.
const STRIPE_THREE_DECIMAL: &[&str] = &["BHD", "JOD", "KWD", "OMR", "TND"];

/// Digits after the decimal point of Stripe's unit for `code` (upper case).
pub fn stripe_exponent(code: &str) -> u8 {
    if STRIPE_ZERO_DECIMAL.contains(&code) {
        0
    } else if STRIPE_THREE_DECIMAL.contains(&code) {
        3
    } else {
        2
    }
}

/// The ISO 4217 exponent pagos knows for `code`; for a currency pagos does not support,
/// the provider's own (nothing of ours can be in it anyway).
pub fn iso_exponent(code: &str, otherwise: u8) -> u8 {
    Currency::parse(code).map_or(otherwise, Currency::exponent)
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    #[error("{amount} cannot be written with {to} decimals without rounding")]
    Inexact { amount: i64, to: u8 },
    #[error("{0} is out of range")]
    Overflow(i64),
    #[error("{0} is not an amount")]
    NotAnAmount(String),
}

/// `amount` with `from` decimals, written with `to` decimals: 250000 (2) → 2500 (0).
pub fn rescale(amount: i64, from: u8, to: u8) -> Result<i64, AmountError> {
    if to >= from {
        let factor = 10i64
            .checked_pow(u32::from(to - from))
            .ok_or(AmountError::Overflow(amount))?;
        amount
            .checked_mul(factor)
            .ok_or(AmountError::Overflow(amount))
    } else {
        let factor = 10i64
            .checked_pow(u32::from(from - to))
            .ok_or(AmountError::Overflow(amount))?;
        if amount % factor == 0 {
            Ok(amount / factor)
        } else {
            Err(AmountError::Inexact { amount, to })
        }
    }
}

/// pagos' minor units of `currency` as Stripe's `amount`.
pub fn to_stripe(amount: i64, currency: &str) -> Result<i64, AmountError> {
    let stripe = stripe_exponent(currency);
    rescale(amount, iso_exponent(currency, stripe), stripe)
}

/// Stripe's `amount` of `currency` (upper case) in pagos' minor units.
pub fn from_stripe(amount: i64, currency: &str) -> Result<i64, AmountError> {
    let stripe = stripe_exponent(currency);
    rescale(amount, stripe, iso_exponent(currency, stripe))
}

/// Amounts this large or larger are refused in decimal form: Mercado Pago's API (and every
/// JSON reader that keeps numbers as doubles) cannot carry more than 15 significant digits
/// exactly.
const MAX_DECIMAL_MINOR: i64 = 1_000_000_000_000_000;

/// A decimal number of major units (Mercado Pago's `transaction_amount`, a refund's
/// `amount`), exact: a `rust_decimal::Decimal`, written and read as a JSON number by its
/// text, never through a double.
///
/// Written as the shortest decimal, with `.0` on a whole number (`2500.0`, `12.34`): the
/// text pagos has always sent, so a payment sent before an upgrade is sent again with the
/// very same body, which a provider needs to replay rather than refuse the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MajorUnits(pub Decimal);

impl serde::Serialize for MajorUnits {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let normalized = self.0.normalize();
        let text = if normalized.scale() == 0 {
            format!("{normalized}.0")
        } else {
            normalized.to_string()
        };
        let raw =
            serde_json::value::RawValue::from_string(text).map_err(serde::ser::Error::custom)?;
        raw.serialize(serializer)
    }
}

impl<'de> serde::Deserialize<'de> for MajorUnits {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Box::<serde_json::value::RawValue>::deserialize(deserializer)?;
        let text = raw.get().trim();
        let not_a_number = || serde::de::Error::custom(format!("{text} is not an amount"));
        if !text.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
            return Err(not_a_number());
        }
        let parsed = if text.contains(['e', 'E']) {
            Decimal::from_scientific(text)
        } else {
            Decimal::from_str_exact(text)
        };
        parsed.map(MajorUnits).map_err(|_| not_a_number())
    }
}

/// pagos' minor units as a decimal number of major units: 250000 COP → 2500.00, exactly.
pub fn to_decimal(amount: i64, exponent: u8) -> Result<MajorUnits, AmountError> {
    if amount.unsigned_abs() >= MAX_DECIMAL_MINOR.unsigned_abs() || exponent > 18 {
        return Err(AmountError::Overflow(amount));
    }
    Ok(MajorUnits(Decimal::new(amount, u32::from(exponent))))
}

/// A decimal number of major units back to minor units: 2500.0 (2) → 250000. One with more
/// decimals than the currency has (2500.005 COP) is refused, never rounded.
pub fn from_decimal(value: MajorUnits, exponent: u8) -> Result<i64, AmountError> {
    let not_an_amount = || AmountError::NotAnAmount(value.0.normalize().to_string());
    let value = value.0.normalize();
    if value.scale() > u32::from(exponent) {
        return Err(not_an_amount());
    }
    let factor = Decimal::from(
        10i64
            .checked_pow(u32::from(exponent))
            .ok_or_else(not_an_amount)?,
    );
    let minor = value
        .checked_mul(factor)
        .and_then(|m| i64::try_from(m).ok())
        .ok_or_else(not_an_amount)?;
    if minor.unsigned_abs() >= MAX_DECIMAL_MINOR.unsigned_abs() {
        return Err(not_an_amount());
    }
    Ok(minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn major(text: &str) -> MajorUnits {
        serde_json::from_str(text).expect("a number")
    }

    fn wire(amount: i64, exponent: u8) -> String {
        serde_json::to_string(&to_decimal(amount, exponent).expect("in range")).expect("json")
    }

    #[test]
    fn cop_250000_is_2500_00_in_major_units_and_back() {
        assert_eq!(wire(250_000, 2), "2500.0");
        assert_eq!(from_decimal(major("2500.0"), 2), Ok(250_000));
        assert_eq!(from_decimal(major("2500"), 2), Ok(250_000));
        assert_eq!(from_decimal(major("2500.00"), 2), Ok(250_000));
    }

    #[test]
    fn cents_survive_the_round_trip_exactly() {
        for amount in [
            1,
            5,
            10,
            99,
            101,
            1234,
            250_050,
            99_999_999_999,
            999_999_999_999_999,
        ] {
            let text = wire(amount, 2);
            assert_eq!(
                from_decimal(major(&text), 2),
                Ok(amount),
                "{amount} → {text}"
            );
        }
        assert_eq!(wire(1234, 2), "12.34");
    }

    #[test]
    fn the_text_sent_is_the_one_a_double_wrote_before() {
        // A payment sent before amounts were decimals is sent again with the same body.
        #[allow(clippy::cast_precision_loss)]
        for exponent in [0u8, 2, 3] {
            for amount in [
                1,
                5,
                10,
                99,
                101,
                1234,
                250_000,
                250_050,
                123_456_789,
                999_999_999_999_999,
            ] {
                let factor = 10i64.pow(u32::from(exponent)) as f64;
                let before = serde_json::to_string(&(amount as f64 / factor)).expect("json");
                assert_eq!(wire(amount, exponent), before, "{amount} ({exponent})");
            }
        }
    }

    #[test]
    fn a_zero_decimal_currency_has_no_cents() {
        assert_eq!(wire(5000, 0), "5000.0");
        assert_eq!(from_decimal(major("5000"), 0), Ok(5000));
        assert!(from_decimal(major("5000.5"), 0).is_err());
    }

    #[test]
    fn more_decimals_than_the_currency_has_are_refused() {
        assert!(from_decimal(major("2500.005"), 2).is_err());
        assert!(to_decimal(i64::MAX, 2).is_err());
        assert!(to_decimal(1_000_000_000_000_000, 2).is_err());
        assert_eq!(
            from_decimal(major("0.30000000000000004"), 2),
            Err(AmountError::NotAnAmount("0.30000000000000004".into()))
        );
        assert_eq!(from_decimal(major("2.5e3"), 2), Ok(250_000));
        assert!(serde_json::from_str::<MajorUnits>("\"2500\"").is_err());
        assert!(serde_json::from_str::<MajorUnits>("null").is_err());
    }

    #[test]
    fn stripe_takes_the_iso_minor_units_of_pagos_currencies() {
        for (code, exponent) in crate::domain::CURRENCIES {
            assert_eq!(stripe_exponent(code), *exponent, "{code}");
            assert_eq!(to_stripe(250_000, code), Ok(250_000));
            assert_eq!(from_stripe(250_000, code), Ok(250_000));
        }
        assert_eq!(
            to_stripe(5000, "CLP"),
            Ok(5000),
            "CLP: the peso is the unit"
        );
    }

    #[test]
    fn rescaling_is_exact_or_refused() {
        assert_eq!(rescale(250_000, 2, 0), Ok(2500));
        assert_eq!(rescale(2500, 0, 2), Ok(250_000));
        assert_eq!(rescale(250, 2, 3), Ok(2500));
        assert_eq!(
            rescale(250_050, 2, 0),
            Err(AmountError::Inexact {
                amount: 250_050,
                to: 0
            })
        );
        assert!(rescale(i64::MAX, 0, 2).is_err());
    }
}
