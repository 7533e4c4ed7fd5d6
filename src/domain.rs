//! The merchant's payment request, parsed into valid-by-construction values: the wire
//! types' parser (`pagos_types::request`), shared with the client so both ends read a
//! request alike; and the longest duration a setting takes.

pub use pagos_types::request::*;

/// The longest duration any setting takes: a century. Longer ones protect nothing, and
/// added to a date or an instant they would overflow it at run time instead of failing
/// at start.
pub const LONGEST_SETTING: std::time::Duration = std::time::Duration::from_secs(100 * 31_557_600);

/// `d`, or why a setting may not be that long.
pub fn at_most_a_century(d: std::time::Duration) -> Result<std::time::Duration, String> {
    if d > LONGEST_SETTING {
        Err("must be at most 100 years".into())
    } else {
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mercadopago_ceiling_is_exactly_what_the_adapter_can_write_as_a_decimal() {
        assert!(crate::gateway::amount::to_decimal(MERCADOPAGO_MAX_AMOUNT, 2).is_ok());
        assert!(crate::gateway::amount::to_decimal(MERCADOPAGO_MAX_AMOUNT + 1, 2).is_err());
    }
}
