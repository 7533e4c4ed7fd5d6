//! Operators: the people of on-call, their tokens (`op_…`, only the SHA-256 stored) and
//! roles, the store behind `pagos operators …` and behind the admin API's and the
//! console's authentication; and what they asked (`actions`), the audit of on-call's
//! actions that move nothing by their own hand.
//!
//! Never stores, logs or shows a whole token: the command that creates one prints it once.

pub mod actions;
pub mod cli;
pub mod store;

pub use crate::entities::operator::Role;
use rand::distr::{Alphanumeric, SampleString};
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};

/// What a generated token starts with, so secret scanners and people recognise it.
pub const TOKEN_SCHEME: &str = "op_";
/// 32 base62 characters: 190 bits.
const RANDOM_CHARS: usize = 32;
/// The name the audit trail gives to whoever used `PAGOS_ADMIN_TOKEN`; no operator may
/// take it.
pub const BREAK_GLASS: &str = "admin";
/// The names pagos writes itself where an operator's name goes (the audit trail's actors,
/// a refund's "asked by"): an operator named so would pass for one of them. Compared
/// without case.
pub const RESERVED_NAMES: [&str; 6] = [
    BREAK_GLASS,
    "merchant",
    "pagos",
    "reconciler",
    "request",
    "webhook",
];
pub const MAX_NAME_CHARS: usize = 64;

/// A new operator token. `Debug` shows nothing of it.
pub struct Token(SecretString);

impl Token {
    pub fn generate() -> Token {
        let random = Alphanumeric.sample_string(&mut rand::rng(), RANDOM_CHARS);
        Token(SecretString::from(format!("{TOKEN_SCHEME}{random}")))
    }

    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }

    pub fn hash(&self) -> String {
        hash_token(self.expose())
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(op_…)")
    }
}

/// SHA-256 of a token, hex: what is stored and looked up.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// An operator's name, parsed once: 1–64 letters, digits, `.`, `_`, `-` or `@`, and not
/// the break-glass `admin`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorName(String);

impl OperatorName {
    pub fn parse(raw: &str) -> Result<OperatorName, String> {
        let name = raw.trim();
        if name.is_empty() {
            return Err("an operator name cannot be blank".to_owned());
        }
        if name.chars().count() > MAX_NAME_CHARS {
            return Err(format!(
                "an operator name has at most {MAX_NAME_CHARS} characters"
            ));
        }
        if !name
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'))
        {
            return Err(
                "an operator name holds only letters, digits, '.', '_', '-' and '@'".to_owned(),
            );
        }
        if name.eq_ignore_ascii_case(BREAK_GLASS) {
            return Err(format!(
                "{BREAK_GLASS:?} is reserved: the name of the break-glass token (PAGOS_ADMIN_TOKEN); choose another"
            ));
        }
        Ok(OperatorName(name.to_owned()))
    }

    /// A name a new operator may take: not one pagos writes itself (`RESERVED_NAMES`).
    /// Existing operators keep theirs (they can still be revoked by it).
    pub fn parse_new(raw: &str) -> Result<OperatorName, String> {
        let name = OperatorName::parse(raw)?;
        // Letters of other alphabets that look like Latin ones (Cyrillic `а` in `аdmin`),
        // or a dotless `ı`, would let a name pass, in the audit trail and the console, for
        // a reserved one or another operator's. Latin-1's accented letters (José, João,
        // Núñez) stay: each shows its accent.
        if !name
            .0
            .chars()
            .all(|c| c.is_ascii() || ('\u{c0}'..='\u{ff}').contains(&c))
        {
            return Err(
                "a new operator's name holds only letters of the Latin alphabet (accented ones included: á, ñ, ç…), digits, '.', '_', '-' and '@': a letter of another alphabet can look like another name's".to_owned(),
            );
        }
        if let Some(reserved) = RESERVED_NAMES
            .iter()
            .find(|r| name.0.eq_ignore_ascii_case(r))
        {
            return Err(format!(
                "{reserved:?} is reserved: pagos writes it itself in the audit trail and in a refund's \"asked by\" (reserved: {}); choose another",
                RESERVED_NAMES.join(", ")
            ));
        }
        Ok(name)
    }

    /// The name compared without case: two operators never differ by case alone.
    pub fn folded(&self) -> String {
        self.0.to_lowercase()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_token_is_op_and_190_bits_and_its_hash_is_sha256_hex() {
        let token = Token::generate();
        assert!(token.expose().starts_with("op_"));
        assert_eq!(token.expose().len(), 3 + 32);
        assert_ne!(token.expose(), Token::generate().expose());
        assert_eq!(token.hash().len(), 64);
        assert_eq!(token.hash(), hash_token(token.expose()));
        assert!(!format!("{token:?}").contains(&token.expose()[3..]));
    }

    #[test]
    fn operator_names_are_trimmed_plain_and_never_admin() {
        assert_eq!(
            OperatorName::parse("  ana.p ").map(|n| n.0),
            Ok("ana.p".into())
        );
        assert!(OperatorName::parse("").is_err());
        assert!(OperatorName::parse("Admin").is_err());
        assert!(OperatorName::parse("ana p").is_err());
        assert!(OperatorName::parse("<b>").is_err());
        assert!(OperatorName::parse(&"a".repeat(65)).is_err());
        assert!(OperatorName::parse("josé").is_ok());
    }

    #[test]
    fn a_new_operator_never_takes_a_name_pagos_writes_itself() {
        for name in [
            "merchant",
            "Pagos",
            "RECONCILER",
            "request",
            "webhook",
            "admin",
        ] {
            let refused = OperatorName::parse_new(name).expect_err(name);
            assert!(refused.contains("reserved"), "{refused}");
        }
        assert!(
            OperatorName::parse("merchant").is_ok(),
            "an existing one is named"
        );
        assert!(OperatorName::parse_new("merchant.ops").is_ok());
    }

    #[test]
    fn a_new_operator_name_cannot_pass_for_another_with_letters_of_another_alphabet() {
        for look_alike in ["\u{430}dmin", "\u{391}na", "adm\u{131}n", "p\u{430}gos"] {
            let refused = OperatorName::parse_new(look_alike).expect_err(look_alike);
            assert!(refused.contains("another alphabet"), "{refused}");
            assert!(
                OperatorName::parse(look_alike).is_ok(),
                "one already added is still named"
            );
        }
        for name in ["José", "João.núñez", "françois"] {
            assert!(OperatorName::parse_new(name).is_ok(), "{name}");
        }
    }
}
