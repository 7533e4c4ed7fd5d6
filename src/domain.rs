//! The merchant's payment request, parsed into valid-by-construction values: the wire
//! types' parser (`pagos_types::request`), shared with the client so both ends read a
//! request alike.

pub use pagos_types::request::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mercadopago_ceiling_is_exactly_what_the_adapter_can_write_as_a_decimal() {
        assert!(crate::gateway::amount::to_decimal(MERCADOPAGO_MAX_AMOUNT, 2).is_ok());
        assert!(crate::gateway::amount::to_decimal(MERCADOPAGO_MAX_AMOUNT + 1, 2).is_err());
    }
}
