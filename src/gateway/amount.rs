//! Amounts between pagos (minor units of the ISO 4217 currency: `monto`) and what each
//! provider takes: Stripe its own minor units (the ISO ones, except for the currencies it
//! treats as zero-decimal), Mercado Pago decimal major units (`transaction_amount`).
//!
//! Pure and exact: a conversion that would round is refused, never approximated, because
//! a charge for another amount than the payment's is a wrong charge.

use crate::domain::Currency;

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

/// Amounts this large or larger are refused in decimal form: beyond 15 significant
/// digits a double cannot carry every decimal exactly.
const MAX_DECIMAL_MINOR: i64 = 1_000_000_000_000_000;

/// pagos' minor units as a decimal number of major units: 250000 COP → 2500.00.
///
/// The `f64` is the nearest double to the exact decimal, and serde_json writes the
/// shortest text that reads back as that double: `2500.0`, `12.34`, never `12.340000001`.
/// With at most 15 significant digits that text is the exact decimal.
pub fn to_decimal(amount: i64, exponent: u8) -> Result<f64, AmountError> {
    if amount.unsigned_abs() >= MAX_DECIMAL_MINOR.unsigned_abs() {
        return Err(AmountError::Overflow(amount));
    }
    let factor = 10i64
        .checked_pow(u32::from(exponent))
        .ok_or(AmountError::Overflow(amount))?;
    // Both exact in f64; IEEE division rounds the quotient once, to the nearest double.
    Ok(amount as f64 / factor as f64)
}

/// A decimal number of major units back to minor units: 2500.0 (2) → 250000. Exact: the
/// number is read back as the shortest decimal text of the double (what the provider
/// wrote), and one with more decimals than the currency has (2500.005 COP) is refused.
pub fn from_decimal(value: f64, exponent: u8) -> Result<i64, AmountError> {
    let not_an_amount = || AmountError::NotAnAmount(value.to_string());
    let text = serde_json::Number::from_f64(value)
        .ok_or_else(not_an_amount)?
        .to_string();
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.as_str()),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    let fraction = fraction.trim_end_matches('0');
    let plain = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !plain(whole) || !plain(fraction) {
        // Exponent notation: far out of any amount's range.
        return Err(not_an_amount());
    }
    if fraction.len() > usize::from(exponent) {
        return Err(not_an_amount());
    }
    let padded = format!("{whole}{fraction:0<width$}", width = usize::from(exponent));
    let minor: i64 = padded.parse().map_err(|_| not_an_amount())?;
    if minor >= MAX_DECIMAL_MINOR {
        return Err(not_an_amount());
    }
    Ok(if negative { -minor } else { minor })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cop_250000_is_2500_00_in_major_units_and_back() {
        assert_eq!(to_decimal(250_000, 2), Ok(2500.0));
        assert_eq!(
            serde_json::to_string(&to_decimal(250_000, 2).expect("ok")).expect("json"),
            "2500.0"
        );
        assert_eq!(from_decimal(2500.0, 2), Ok(250_000));
    }

    #[test]
    fn cents_survive_the_round_trip_through_a_double() {
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
            let decimal = to_decimal(amount, 2).expect("in range");
            let text = serde_json::to_string(&decimal).expect("json");
            let read: f64 = serde_json::from_str(&text).expect("number");
            assert_eq!(from_decimal(read, 2), Ok(amount), "{amount} → {text}");
        }
        assert_eq!(
            serde_json::to_string(&to_decimal(1234, 2).expect("ok")).expect("json"),
            "12.34"
        );
    }

    #[test]
    fn a_zero_decimal_currency_has_no_cents() {
        assert_eq!(to_decimal(5000, 0), Ok(5000.0));
        assert_eq!(from_decimal(5000.0, 0), Ok(5000));
        assert!(from_decimal(5000.5, 0).is_err());
    }

    #[test]
    fn more_decimals_than_the_currency_has_are_refused() {
        assert!(from_decimal(2500.005, 2).is_err());
        assert!(from_decimal(f64::NAN, 2).is_err());
        assert!(from_decimal(f64::INFINITY, 2).is_err());
        assert!(to_decimal(i64::MAX, 2).is_err());
        assert!(to_decimal(1_000_000_000_000_000, 2).is_err());
        assert_eq!(
            from_decimal(0.1 + 0.2, 2),
            Err(AmountError::NotAnAmount("0.30000000000000004".into()))
        );
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
