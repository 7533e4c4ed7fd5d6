//! The request fingerprint: SHA-256 over method, path and the RFC 8785 canonical body.
//!
//! Key order and white space in the body do not change it; any value does. Pure.

use sha2::{Digest, Sha256};

/// Hex SHA-256 of `METHOD \n PATH \n canonical(body)`.
pub fn fingerprint(method: &str, path: &str, body: &serde_json::Value) -> String {
    // serde_json values always canonicalize (numbers are finite by construction);
    // an error here would be a bug in the canonicalizer, not bad input.
    let canonical = serde_json_canonicalizer::to_vec(body).unwrap_or_default();
    let mut hasher = Sha256::new();
    hasher.update(method.as_bytes());
    hasher.update(b"\n");
    hasher.update(path.as_bytes());
    hasher.update(b"\n");
    hasher.update(&canonical);
    hex::encode(hasher.finalize())
}

/// A request's body, as sent and as parsed, with its fingerprint, computed at most once
/// and only when asked for: a replay answered from memory compares the bytes sent instead
/// (`cache::Frozen::answers`) and never canonicalizes or hashes.
pub struct Fingerprinted<'a> {
    method: &'static str,
    path: &'a str,
    body: &'a serde_json::Value,
    sent: &'a str,
    hex: std::sync::OnceLock<String>,
}

impl<'a> Fingerprinted<'a> {
    /// `body`: `sent` parsed.
    pub fn new(
        method: &'static str,
        path: &'a str,
        body: &'a serde_json::Value,
        sent: &'a str,
    ) -> Self {
        Fingerprinted {
            method,
            path,
            body,
            sent,
            hex: std::sync::OnceLock::new(),
        }
    }

    pub fn body(&self) -> &'a serde_json::Value {
        self.body
    }

    /// The body as its bytes were sent.
    pub fn sent(&self) -> &'a str {
        self.sent
    }

    /// `fingerprint(method, path, body)`.
    pub fn fingerprint(&self) -> &str {
        self.hex
            .get_or_init(|| fingerprint(self.method, self.path, self.body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn of(text: &str) -> String {
        let value: serde_json::Value = serde_json::from_str(text).expect("test JSON");
        fingerprint("POST", "/v1/pagos", &value)
    }

    #[test]
    fn key_order_and_white_space_do_not_change_it() {
        let a = of(r#"{"creditoId":"42","monto":250000,"moneda":"COP"}"#);
        let b = of("{ \"moneda\" : \"COP\",\n  \"monto\": 250000, \"creditoId\":\"42\" }");
        assert_eq!(a, b);
    }

    #[test]
    fn equal_numbers_written_differently_are_the_same_body() {
        assert_eq!(of(r#"{"monto":1E2}"#), of(r#"{"monto":100.0}"#));
    }

    #[test]
    fn any_value_change_changes_it() {
        let base = of(r#"{"creditoId":"42","monto":250000,"moneda":"COP"}"#);
        for other in [
            r#"{"creditoId":"43","monto":250000,"moneda":"COP"}"#,
            r#"{"creditoId":"42","monto":250001,"moneda":"COP"}"#,
            r#"{"creditoId":"42","monto":250000,"moneda":"USD"}"#,
            r#"{"creditoId":"42","monto":250000,"moneda":"COP","descripcion":"x"}"#,
            r#"{"creditoId":"42","monto":"250000","moneda":"COP"}"#,
        ] {
            assert_ne!(base, of(other), "{other}");
        }
    }

    #[test]
    fn method_and_path_are_part_of_it() {
        let body = json!({"monto": 1});
        assert_ne!(
            fingerprint("POST", "/v1/pagos", &body),
            fingerprint("PUT", "/v1/pagos", &body)
        );
        assert_ne!(
            fingerprint("POST", "/v1/pagos", &body),
            fingerprint("POST", "/v1/otros", &body)
        );
    }

    #[test]
    fn it_is_64_hex_characters() {
        let f = of("{}");
        assert_eq!(f.len(), 64);
        assert!(f.chars().all(|c| c.is_ascii_hexdigit()));
    }
}
