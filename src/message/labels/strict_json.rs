//! The JSON forms of a profile: the strict parser of the header (one object, no duplicate
//! keys) and the canonical form (keys sorted by their UTF-8 bytes, no whitespace) whose size
//! `max_bytes` limits.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::LabelReason;

/// Canonical JSON: object keys sorted by their UTF-8 bytes at every level, no whitespace,
/// strings escaped as serde_json does (minimal escapes, UTF-8 kept).
pub fn canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

/// Length in bytes of the canonical JSON of a profile, without building it: serde_json's
/// compact output of a key-ordered map is the canonical form (asserted by tests).
pub(super) fn canonical_len(map: &Map<String, Value>) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail.
    let _ = serde_json::to_writer(&mut count, map);
    count.0
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => write_object(m, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        // Scalars: serde_json's compact form is already canonical.
        other => out.push_str(&other.to_string()),
    }
}

fn write_object(m: &Map<String, Value>, out: &mut String) {
    let mut keys: Vec<&String> = m.keys().collect();
    keys.sort();
    out.push('{');
    for (i, k) in keys.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&Value::String(k.clone()).to_string());
        out.push(':');
        write_canonical(&m[k], out);
    }
    out.push('}');
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
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
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
