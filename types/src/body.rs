//! A request body read as JSON, with every member written twice in one object named
//! (`{"monto":1,"monto":250000}`): JSON leaves its meaning open, and `serde_json` keeps
//! the last. A proxy, a log or the merchant's own check may read the first: one body, two
//! amounts. pagos refuses it rather than pick one.
//!
//! The value is built member by member here, never by `serde_json::Value`'s own reader,
//! which, with `serde_json`'s `raw_value` feature on in the same build, reads an object of
//! one member named `$serde_json::private::RawValue` as the JSON text that member holds:
//! here that name is one more member, refused as unknown by the field checks.
//!
//! Pure: it only reads. The caller lists [`Read::refused`] beside the other field errors
//! of a 422 (the fields' own rules, `request` and `refund`, refuse what a value may not
//! hold); a body that is not JSON at all is still `serde_json`'s error.

use crate::request::FieldError;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;

/// A body read: its value (the last of a repeated member, as `serde_json` would keep)
/// and the members written twice, each with the path of the field (`medioPago.token`).
#[derive(Debug, PartialEq)]
pub struct Read {
    pub value: Value,
    pub refused: Vec<FieldError>,
}

/// `text` read as JSON: its value and what is refused in it (module docs); `Err` when it
/// is not JSON.
pub fn read(text: &str) -> Result<Read, serde_json::Error> {
    let refused = RefCell::new(Vec::new());
    let mut reader = serde_json::Deserializer::from_str(text);
    let value = Node {
        at: At::Body,
        refused: &refused,
    }
    .deserialize(&mut reader)?;
    reader.end()?;
    Ok(Read {
        value,
        refused: refused.into_inner(),
    })
}

/// Where a value stands in the body, written out (`medioPago.token`, `x[1].b`) only for a
/// refusal: reading a body that has none allocates no path.
#[derive(Clone, Copy)]
enum At<'a> {
    Body,
    Member(&'a At<'a>, &'a str),
    Item(&'a At<'a>, usize),
}

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            At::Body => Ok(()),
            At::Member(At::Body, name) => f.write_str(name),
            At::Member(parent, name) => write!(f, "{parent}.{name}"),
            At::Item(parent, index) => write!(f, "{parent}[{index}]"),
        }
    }
}

/// One value of the body, at `at`.
struct Node<'a> {
    at: At<'a>,
    refused: &'a RefCell<Vec<FieldError>>,
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    /// As `serde_json::Value` reads it (JSON has no NaN nor infinity: never `Null` here).
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(Node {
            at: At::Item(&self.at, items.len()),
            refused: self.refused,
        })? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members = Map::new();
        let mut repeated = HashSet::new();
        while let Some(name) = map.next_key::<String>()? {
            let at = At::Member(&self.at, &name);
            let value = map.next_value_seed(Node {
                at,
                refused: self.refused,
            })?;
            if members.contains_key(&name) && !repeated.contains(&name) {
                self.refused.borrow_mut().push(FieldError {
                    campo: at.to_string(),
                    detalle: "written more than once in the same object: send each field once"
                        .to_owned(),
                });
                repeated.insert(name.clone());
            }
            members.insert(name, value);
        }
        Ok(Value::Object(members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn campos(text: &str) -> Vec<String> {
        read(text)
            .expect("JSON")
            .refused
            .into_iter()
            .map(|e| e.campo)
            .collect()
    }

    #[test]
    fn a_body_without_repeats_or_nul_reads_as_serde_json_reads_it() {
        let text = r#"{"creditoId":"42","monto":250000,"moneda":"COP","x":[1,-2,2.5,1e300,18446744073709551615,null,true,{"a":"b\n"}]}"#;
        let read = read(text).expect("JSON");
        assert!(read.refused.is_empty(), "{:?}", read.refused);
        assert_eq!(
            read.value,
            serde_json::from_str::<Value>(text).expect("JSON")
        );
    }

    #[test]
    fn a_member_written_twice_is_named_once_with_its_path_and_the_last_kept() {
        let read =
            read(r#"{"monto":1,"monto":250000,"monto":3,"medioPago":{"token":"a","token":"b"}}"#)
                .expect("JSON");
        let campos: Vec<&str> = read.refused.iter().map(|e| e.campo.as_str()).collect();
        assert_eq!(campos, ["monto", "medioPago.token"]);
        assert_eq!(read.value["monto"], 3);
        assert_eq!(read.value["medioPago"]["token"], "b");
    }

    #[test]
    fn repeats_are_named_at_any_depth_and_alike_names_in_other_objects_are_not_repeats() {
        assert_eq!(
            campos(r#"{"a":{"b":1},"c":[{"b":2},{"b":3,"b":4}],"b":5}"#),
            ["c[1].b"]
        );
    }

    #[test]
    fn serde_json_s_private_raw_value_member_is_a_member_like_any_other() {
        let text = r#"{"$serde_json::private::RawValue":"{\"monto\":250000}"}"#;
        let read = read(text).expect("JSON");
        assert!(read.refused.is_empty());
        assert_eq!(
            read.value,
            json!({"$serde_json::private::RawValue": "{\"monto\":250000}"})
        );
    }

    #[test]
    fn what_is_not_json_is_serde_json_s_error() {
        for text in ["{\"a\":", "{} {}", "[1,]", ""] {
            assert!(read(text).is_err(), "{text}");
        }
    }
}
