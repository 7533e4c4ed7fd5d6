//! A merchant's name, parsed once: trimmed, non-blank, at most 64 printable characters.
//! Names are unique (an index says so), so a name is how the command line finds a merchant.

use std::fmt;

pub const MAX_CHARS: usize = 64;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MerchantName(String);

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("a merchant name cannot be blank")]
    Blank,
    #[error("a merchant name has at most {MAX_CHARS} characters (this one has {0})")]
    TooLong(usize),
    #[error("a merchant name holds only printable characters (found {0})")]
    Unprintable(String),
}

/// Characters a name may hold: none that a terminal would not show, such as controls,
/// zero-width characters or bidirectional overrides (a name that reads as another). The
/// migration that put existing names right applies the same rule.
fn printable(c: char) -> bool {
    !c.is_control()
        && !matches!(c,
            '\u{00AD}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}')
}

impl MerchantName {
    pub fn parse(raw: &str) -> Result<MerchantName, NameError> {
        let name = raw.trim();
        if name.is_empty() {
            return Err(NameError::Blank);
        }
        if let Some(bad) = name.chars().find(|c| !printable(*c)) {
            return Err(NameError::Unprintable(format!("U+{:04X}", u32::from(bad))));
        }
        let chars = name.chars().count();
        if chars > MAX_CHARS {
            return Err(NameError::TooLong(chars));
        }
        Ok(MerchantName(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MerchantName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for MerchantName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MerchantName::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_trimmed() {
        assert_eq!(
            MerchantName::parse("  Panadería Ñandú \n").map(|n| n.to_string()),
            Ok("Panadería Ñandú".to_owned())
        );
    }

    #[test]
    fn blank_names_are_refused() {
        for raw in ["", "   ", "\t\n"] {
            assert_eq!(MerchantName::parse(raw), Err(NameError::Blank), "{raw:?}");
        }
    }

    #[test]
    fn a_name_has_at_most_64_characters_not_bytes() {
        assert!(MerchantName::parse(&"ñ".repeat(64)).is_ok());
        assert_eq!(
            MerchantName::parse(&"a".repeat(65)),
            Err(NameError::TooLong(65))
        );
    }

    #[test]
    fn control_and_invisible_characters_are_refused() {
        for raw in ["a\tb", "a\u{0007}b", "ac\u{200B}me", "acme\u{202E}evil"] {
            assert!(
                matches!(MerchantName::parse(raw), Err(NameError::Unprintable(_))),
                "{raw:?}"
            );
        }
    }
}
