//! API keys: generated with 190 bits of randomness in the format secret scanners look for
//! (`sk_live_…`, or `sk_test_…` for a sandbox database), or chosen by hand (tests and
//! demos use such keys); stored only as their SHA-256; shown only by a prefix too short
//! to authenticate. Never logs or displays a whole key.

use rand::distr::{Alphanumeric, SampleString};
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use std::fmt;

/// Random characters of a generated key: 32 base62 characters are 190 bits.
const RANDOM_CHARS: usize = 32;
/// The longest prefix shown: a generated key's scheme and 8 of its random characters
/// (47 bits, plenty to tell a merchant's keys apart), which leaves 24 unknown (142 bits).
const MAX_PREFIX_CHARS: usize = 16;
/// A hand-chosen key shorter than this gets a warning.
pub const SHORT_BELOW_CHARS: usize = 24;
/// A hand-chosen key with less apparent entropy than this gets a warning.
pub const WEAK_BELOW_BITS: f64 = 128.0;
const MAX_CHARS: usize = 255;
/// Characters of a bearer token (RFC 6750's b64token) besides letters and digits.
const SYMBOLS: &str = "-._~+/=";

/// Which scheme a generated key carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// Payments move money: `sk_live_`.
    Live,
    /// The sandbox gateway: `sk_test_`.
    Test,
}

impl KeyKind {
    /// The kind of key a database whose payments go through the gateway named `gateway`
    /// (its `PAGOS_GATEWAY` name) calls for: the sandbox never moves money.
    pub fn of_gateway(gateway: &str) -> KeyKind {
        if gateway == "sandbox" {
            KeyKind::Test
        } else {
            KeyKind::Live
        }
    }

    pub fn scheme(self) -> &'static str {
        match self {
            KeyKind::Live => "sk_live_",
            KeyKind::Test => "sk_test_",
        }
    }
}

/// A whole API key. `Debug` shows only its prefix.
#[derive(Clone)]
pub struct ApiKey(SecretString);

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("an API key cannot be empty")]
    Empty,
    #[error("an API key has at most {MAX_CHARS} characters")]
    TooLong,
    #[error("an API key holds only letters, digits and {SYMBOLS} (a bearer token)")]
    BadCharacter,
}

/// How guessable a hand-chosen key looks: its length, and its length times the bits of the
/// smallest alphabet its characters come from (lower case 26, upper case 26, digits 10,
/// symbols 7). An estimate from above: `aaaa…` counts as random lower case.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Strength {
    pub chars: usize,
    pub bits: f64,
}

impl Strength {
    pub fn is_weak(self) -> bool {
        self.chars < SHORT_BELOW_CHARS || self.bits < WEAK_BELOW_BITS
    }
}

/// SHA-256 of a key, hex: what is stored and looked up. Keys are long random strings, so
/// a fast hash is enough.
pub fn hash_api_key(api_key: &str) -> String {
    // Into a buffer at once: `hex::encode` collects a char at a time, a visible part of
    // an authenticated request's cost (it runs on every one).
    let mut hex = [0u8; 64];
    hex::encode_to_slice(Sha256::digest(api_key.as_bytes()), &mut hex)
        .expect("64 hex digits for 32 bytes");
    std::str::from_utf8(&hex)
        .expect("hex digits are ASCII")
        .to_owned()
}

/// The README's public demo key: the key of the merchant `serve` creates on a fresh
/// database in sandbox mode. Never a key of a real gateway's merchant.
pub const DEMO_API_KEY: &str = "sk_sandbox_demo";

impl ApiKey {
    /// Whether this is the README's public demo key.
    pub fn is_demo(&self) -> bool {
        self.expose() == DEMO_API_KEY
    }

    /// A new random key of `kind`.
    pub fn generate(kind: KeyKind) -> ApiKey {
        let random = Alphanumeric.sample_string(&mut rand::rng(), RANDOM_CHARS);
        ApiKey(SecretString::from(format!("{}{random}", kind.scheme())))
    }

    /// A key chosen by hand, as a bearer token can carry it.
    pub fn chosen(raw: &SecretString) -> Result<ApiKey, KeyError> {
        let key = raw.expose_secret();
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.chars().count() > MAX_CHARS {
            return Err(KeyError::TooLong);
        }
        if !key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || SYMBOLS.contains(c))
        {
            return Err(KeyError::BadCharacter);
        }
        Ok(ApiKey(raw.clone()))
    }

    /// The whole key, to print once to whoever creates it.
    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }

    pub fn hash(&self) -> String {
        hash_api_key(self.expose())
    }

    /// The first characters of the key: at most 16 and at most half of it, so a prefix
    /// never authenticates (`sk_live_AbCd1234` for a generated key).
    pub fn prefix(&self) -> String {
        let key = self.expose();
        let shown = MAX_PREFIX_CHARS.min(key.chars().count() / 2);
        key.chars().take(shown).collect()
    }

    pub fn strength(&self) -> Strength {
        let key = self.expose();
        let has = |class: fn(&char) -> bool, size: f64| {
            if key.chars().any(|c| class(&c)) {
                size
            } else {
                0.0
            }
        };
        let alphabet = has(char::is_ascii_lowercase, 26.0)
            + has(char::is_ascii_uppercase, 26.0)
            + has(char::is_ascii_digit, 10.0)
            + has(|c| !c.is_ascii_alphanumeric(), SYMBOLS.len() as f64);
        let chars = key.chars().count();
        Strength {
            chars,
            bits: chars as f64 * alphabet.max(1.0).log2(),
        }
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiKey({}…)", self.prefix())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chosen(raw: &str) -> Result<ApiKey, KeyError> {
        ApiKey::chosen(&SecretString::from(raw))
    }

    #[test]
    fn a_key_is_stored_as_the_lowercase_hex_of_its_sha256() {
        // What the keys of every earlier version were stored as (FIPS 180-2's "abc").
        assert_eq!(
            hash_api_key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_generated_key_has_its_scheme_and_32_random_base62_characters() {
        for (kind, scheme) in [(KeyKind::Live, "sk_live_"), (KeyKind::Test, "sk_test_")] {
            let key = ApiKey::generate(kind);
            let random = key.expose().strip_prefix(scheme).expect("scheme");
            assert_eq!(random.len(), 32);
            assert!(random.chars().all(|c| c.is_ascii_alphanumeric()));
            assert!(!key.strength().is_weak());
        }
    }

    #[test]
    fn two_generated_keys_differ() {
        let a = ApiKey::generate(KeyKind::Live);
        let b = ApiKey::generate(KeyKind::Live);
        assert_ne!(a.expose(), b.expose());
        assert_ne!(a.prefix(), b.prefix());
    }

    #[test]
    fn a_prefix_shows_at_most_half_of_the_key() {
        let generated = ApiKey::generate(KeyKind::Live);
        assert_eq!(generated.prefix().len(), 16);
        assert!(generated.expose().starts_with(&generated.prefix()));
        assert_eq!(
            chosen("sk_test_acme").map(|k| k.prefix()),
            Ok("sk_tes".into())
        );
        assert_eq!(chosen("x").map(|k| k.prefix()), Ok(String::new()));
    }

    #[test]
    fn short_or_guessable_chosen_keys_are_weak() {
        for weak in [
            "sk_test_acme",
            "sk_sandbox_demo",
            "abcdefghijklmnopqrstuvwxyz",
        ] {
            assert!(chosen(weak).expect("valid").strength().is_weak(), "{weak}");
        }
        let strong = chosen("Xk3-9fQ_aZ7mP2vL8wR4tY6uB1nC5dE0").expect("valid");
        assert!(!strong.strength().is_weak());
    }

    #[test]
    fn chosen_keys_must_be_bearer_tokens() {
        assert_eq!(chosen("").err(), Some(KeyError::Empty));
        assert_eq!(chosen("sk test").err(), Some(KeyError::BadCharacter));
        assert_eq!(chosen("sk_ñ").err(), Some(KeyError::BadCharacter));
        assert_eq!(chosen(&"a".repeat(256)).err(), Some(KeyError::TooLong));
        assert!(chosen("sk_given_1").is_ok());
    }

    #[test]
    fn debug_shows_only_the_prefix() {
        let key = ApiKey::generate(KeyKind::Live);
        let shown = format!("{key:?}");
        assert!(!shown.contains(key.expose()), "{shown}");
        assert!(shown.contains(&key.prefix()));
    }
}
