//! The JSON forms of a profile: the strict parser of the header (one object, no duplicate
//! keys) and the canonical form (keys sorted by their UTF-8 bytes, no whitespace) whose size
//! `max_bytes` limits.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::LabelReason;

/// Canonical JSON (the project's one writer, [`crate::document::canonical`]).
pub fn canonical_json(v: &Value) -> String {
    crate::document::canonical::value_to_string(v)
}

/// Length in bytes of the canonical JSON of a profile.
pub(super) fn canonical_len(map: &Map<String, Value>) -> usize {
    let mut out = Vec::new();
    crate::document::canonical::write_map(&mut out, map);
    out.len()
}

/// Parses JSON refusing duplicate object keys (which serde_json would silently resolve to the
/// last one: an ambiguity two readers could resolve differently). The error never quotes input.
pub fn parse_strict(text: &str) -> Result<Value, LabelReason> {
    let mut de = serde_json::Deserializer::from_str(text);
    let result = StrictValue::deserialize(&mut de).and_then(|v| de.end().map(|()| v.0));
    result.map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            Category::Data if e.to_string().starts_with(DUPLICATE_KEY) => LabelReason::DuplicateKey,
            _ if e.to_string().starts_with("recursion limit exceeded") => {
                LabelReason::NestingTooDeep
            }
            _ => LabelReason::InvalidJson {
                line: e.line(),
                column: e.column(),
            },
        }
    })
}

const DUPLICATE_KEY: &str = "svc: duplicate object key";

/// A JSON value built by a visitor that refuses duplicate keys.
struct StrictValue(Value);

impl<'de> Deserialize<'de> for StrictValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(StrictValue)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    /// An integral number written as a float (`1.0`, `1e2`) becomes the integer it is, so
    /// serde_json writes a profile in its canonical form (`1`, `100`), as custody reads it.
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;
        Ok(if v.fract() == 0.0 && (0.0..TWO_POW_64).contains(&v) {
            Value::from(v as u64)
        } else if v.fract() == 0.0 && (i64::MIN as f64..0.0).contains(&v) {
            Value::from(v as i64)
        } else {
            Value::from(v)
        })
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
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
        while let Some(StrictValue(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            if map.contains_key(&key) {
                return Err(de::Error::custom(DUPLICATE_KEY));
            }
            let StrictValue(v) = access.next_value()?;
            map.insert(key, v);
        }
        Ok(Value::Object(map))
    }
}
