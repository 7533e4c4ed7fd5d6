//! The client's `Idempotency-Key`, parsed once at the edge.
//!
//! Holding an `IdempotencyKey` means it is valid: 1–255 visible ASCII characters. The
//! quoted sf-string form of the IETF draft (`"abc"`) is the same key as `abc`. A value that
//! begins with `"` is that form or nothing: one with parameters (`"abc";a=1`) or broken
//! quoting is refused, never taken as a key of its own, which a client resending it
//! re-serialized (`"abc"`) would find to be another key, another payment.

use std::fmt;

pub const MAX_KEY_LEN: usize = 255;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the Idempotency-Key header is required on this request")]
    Missing,
    #[error("send exactly one Idempotency-Key header")]
    Repeated,
    #[error("the Idempotency-Key must not be empty")]
    Empty,
    #[error("the Idempotency-Key is {0} characters long; at most 255 are allowed")]
    TooLong(usize),
    #[error("the Idempotency-Key may only hold visible ASCII characters (no spaces, no accents)")]
    NotVisibleAscii,
    #[error("the quoted Idempotency-Key is not a valid sf-string")]
    BadQuoting,
}

impl IdempotencyKey {
    /// Parses the header's raw bytes.
    pub fn parse(raw: &[u8]) -> Result<Self, KeyError> {
        if raw.first() == Some(&b'"') {
            // An sf-string item (RFC 9651), without parameters.
            let item: sfv::Item = sfv::Parser::new(raw)
                .parse()
                .map_err(|_| KeyError::BadQuoting)?;
            return match item.bare_item {
                sfv::BareItem::String(inner) if item.params.is_empty() => {
                    Self::from_plain(inner.as_str().as_bytes())
                }
                _ => Err(KeyError::BadQuoting),
            };
        }
        Self::from_plain(raw)
    }

    fn from_plain(raw: &[u8]) -> Result<Self, KeyError> {
        if raw.is_empty() {
            return Err(KeyError::Empty);
        }
        if !raw.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err(KeyError::NotVisibleAscii);
        }
        if raw.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong(raw.len()));
        }
        // All bytes are ASCII, so this cannot fail.
        let text = String::from_utf8_lossy(raw).into_owned();
        Ok(IdempotencyKey(text))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_is_a_key() {
        let key = IdempotencyKey::parse(b"6f1b2c9e-4c1a-4b7e-9d1e-0a6c2f6a1b10");
        assert_eq!(
            key.map(|k| k.to_string()),
            Ok("6f1b2c9e-4c1a-4b7e-9d1e-0a6c2f6a1b10".to_owned())
        );
    }

    #[test]
    fn the_quoted_form_is_the_same_key() {
        assert_eq!(
            IdempotencyKey::parse(b"\"abc\""),
            IdempotencyKey::parse(b"abc")
        );
        assert_eq!(
            IdempotencyKey::parse(br#""a\"b\\c""#).map(|k| k.to_string()),
            Ok(r#"a"b\c"#.to_owned())
        );
    }

    #[test]
    fn length_is_bounded_at_255() {
        assert!(IdempotencyKey::parse(&[b'k'; 255]).is_ok());
        assert_eq!(
            IdempotencyKey::parse(&[b'k'; 256]),
            Err(KeyError::TooLong(256))
        );
        assert_eq!(IdempotencyKey::parse(b""), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse(b"\"\""), Err(KeyError::Empty));
    }

    #[test]
    fn only_visible_ascii_is_accepted() {
        assert_eq!(
            IdempotencyKey::parse("clavé".as_bytes()),
            Err(KeyError::NotVisibleAscii)
        );
        assert_eq!(
            IdempotencyKey::parse(b"a b"),
            Err(KeyError::NotVisibleAscii)
        );
        assert_eq!(
            IdempotencyKey::parse(b"a\tb"),
            Err(KeyError::NotVisibleAscii)
        );
    }

    #[test]
    fn a_quoted_key_with_parameters_is_refused_whatever_it_ends_with() {
        for raw in [
            &br#""k1";a=1"#[..],
            br#""k1";a="1""#,
            br#""k1";a"#,
            br#""k1"abc"#,
            br#""k1"#,
        ] {
            assert_eq!(
                IdempotencyKey::parse(raw),
                Err(KeyError::BadQuoting),
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
        assert!(
            IdempotencyKey::parse(br#"k1";a=1"#).is_ok(),
            "a quote inside"
        );
    }

    #[test]
    fn broken_quoting_is_refused() {
        assert_eq!(
            IdempotencyKey::parse(br#""a"b""#),
            Err(KeyError::BadQuoting)
        );
        assert_eq!(
            IdempotencyKey::parse(br#""a\x""#),
            Err(KeyError::BadQuoting)
        );
        // An sf-string item with parameters is not a key.
        assert_eq!(
            IdempotencyKey::parse(br#""abc";v="1""#),
            Err(KeyError::BadQuoting)
        );
        // A well-quoted string is still held to the key's own rules.
        assert_eq!(
            IdempotencyKey::parse(br#""a b""#),
            Err(KeyError::NotVisibleAscii)
        );
        assert_eq!(IdempotencyKey::parse(br#""""#), Err(KeyError::Empty));
    }
}
