//! Mission metadata profiles: named schemas (`required_fields`, `optional_fields`, each field
//! with a JSON type and bounds, `unknown_fields` allow or forbid), read from the config and
//! applied to each object. Field names come from the config (a grammar keeps them plain), so
//! errors may name them; a field the object brings that no profile lists is never named.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde_json::{Map, Number, Value};

use crate::document::reader::join;
use crate::message::refusal::Problems;

/// Longest profile or field name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;
/// Most profiles, and most fields of one profile.
pub const MAX_PROFILES: usize = 64;
pub const MAX_FIELDS: usize = 256;

/// The JSON type of a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldType {
    String,
    Integer,
    Number,
    Boolean,
    Object,
    Array,
}

impl FieldType {
    fn parse(s: &str) -> Option<FieldType> {
        Some(match s {
            "string" => FieldType::String,
            "integer" => FieldType::Integer,
            "number" => FieldType::Number,
            "boolean" => FieldType::Boolean,
            "object" => FieldType::Object,
            "array" => FieldType::Array,
            _ => return None,
        })
    }

    fn article(self) -> &'static str {
        match self {
            FieldType::String => "a string",
            FieldType::Integer => "an integer",
            FieldType::Number => "a number",
            FieldType::Boolean => "a boolean",
            FieldType::Object => "an object",
            FieldType::Array => "an array",
        }
    }

    fn is(self, v: &Value) -> bool {
        match self {
            FieldType::String => v.is_string(),
            FieldType::Integer => v.is_i64() || v.is_u64(),
            FieldType::Number => v.is_number(),
            FieldType::Boolean => v.is_boolean(),
            FieldType::Object => v.is_object(),
            FieldType::Array => v.is_array(),
        }
    }
}

/// One field of a profile with its bounds: `min`/`max` for integer and number values,
/// `min_length`/`max_length` for string bytes, array items and object keys.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldSpec {
    pub kind: FieldType,
    /// Kept as written: an integer bound compares with an integer value exactly (as f64,
    /// every value up to 1,024 above 2^63 - 1 equalled a `max` of 2^63 - 1).
    pub min: Option<Number>,
    pub max: Option<Number>,
    pub min_length: Option<u64>,
    pub max_length: Option<u64>,
}

/// A named schema.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub required: BTreeMap<String, FieldSpec>,
    pub optional: BTreeMap<String, FieldSpec>,
    /// `unknown_fields`: `forbid` (false, the default) or `allow`.
    pub allow_unknown: bool,
}

/// The key naming an object's profile.
pub const PROFILE_KEY: &str = "profile";

/// A profile or field name: 1 to 64 bytes of `A-Z a-z 0-9 _ - . :`.
pub fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_BYTES
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b))
}

/// Reads `profiles` (an object of name to profile) at `path`; problems into `problems`.
pub fn read_profiles(
    path: &str,
    v: &Value,
    problems: &crate::document::reader::Problems,
) -> BTreeMap<String, Profile> {
    let mut out = BTreeMap::new();
    let Value::Object(map) = v else {
        problems.push(path, "must be an object of profile name to profile");
        return out;
    };
    if map.len() > MAX_PROFILES {
        problems.push(path, format!("must have at most {MAX_PROFILES} profiles"));
    }
    for (name, p) in map {
        let at = join(path, name);
        if !is_name(name) {
            problems.push(
                &at,
                format!(
                    "profile names must be 1 to {MAX_NAME_BYTES} characters of A-Z a-z 0-9 _ - . :"
                ),
            );
            continue;
        }
        if let Some(profile) = read_profile(&at, p, problems) {
            out.insert(name.clone(), profile);
        }
    }
    out
}

fn read_profile(
    path: &str,
    v: &Value,
    problems: &crate::document::reader::Problems,
) -> Option<Profile> {
    let Value::Object(map) = v else {
        problems.push(path, "must be a JSON object");
        return None;
    };
    let mut ok = true;
    for key in map.keys() {
        if !["required_fields", "optional_fields", "unknown_fields"].contains(&key.as_str()) {
            problems.push(join(path, key), "unknown field");
            ok = false;
        }
    }
    let allow_unknown = match map.get("unknown_fields") {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) if s == "forbid" => false,
        Some(Value::String(s)) if s == "allow" => true,
        Some(_) => {
            problems.push(
                join(path, "unknown_fields"),
                "must be one of: forbid, allow",
            );
            ok = false;
            false
        }
    };
    let required = read_fields(
        &join(path, "required_fields"),
        map.get("required_fields"),
        problems,
    );
    let optional = read_fields(
        &join(path, "optional_fields"),
        map.get("optional_fields"),
        problems,
    );
    let (Some(required), Some(optional)) = (required, optional) else {
        return None;
    };
    for name in required.keys() {
        if optional.contains_key(name) {
            problems.push(
                join(&join(path, "optional_fields"), name),
                "is also in required_fields",
            );
            ok = false;
        }
    }
    ok.then_some(Profile {
        required,
        optional,
        allow_unknown,
    })
}

fn read_fields(
    path: &str,
    v: Option<&Value>,
    problems: &crate::document::reader::Problems,
) -> Option<BTreeMap<String, FieldSpec>> {
    let mut out = BTreeMap::new();
    let map = match v {
        None | Some(Value::Null) => return Some(out),
        Some(Value::Object(m)) => m,
        Some(_) => {
            problems.push(path, "must be an object of field name to field");
            return None;
        }
    };
    if map.len() > MAX_FIELDS {
        problems.push(path, format!("must have at most {MAX_FIELDS} fields"));
    }
    let mut ok = true;
    for (name, spec) in map {
        let at = join(path, name);
        if !is_name(name) {
            problems.push(
                &at,
                format!(
                    "field names must be 1 to {MAX_NAME_BYTES} characters of A-Z a-z 0-9 _ - . :"
                ),
            );
            ok = false;
        } else if name == PROFILE_KEY {
            problems.push(
                &at,
                "profile is the key naming the profile; it is not a field",
            );
            ok = false;
        } else {
            match read_spec(&at, spec, problems) {
                Some(s) => {
                    out.insert(name.clone(), s);
                }
                None => ok = false,
            }
        }
    }
    ok.then_some(out)
}

fn read_spec(
    path: &str,
    v: &Value,
    problems: &crate::document::reader::Problems,
) -> Option<FieldSpec> {
    let Value::Object(map) = v else {
        problems.push(path, "must be a JSON object with a type");
        return None;
    };
    let mut ok = true;
    let kind = match map.get("type") {
        Some(Value::String(s)) => FieldType::parse(s),
        _ => None,
    };
    let Some(kind) = kind else {
        problems.push(
            join(path, "type"),
            "is required: one of string, integer, number, boolean, object, array",
        );
        return None;
    };
    let number = |key: &str, ok: &mut bool| -> Option<Number> {
        match map.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => Some(n.clone()),
            Some(_) => {
                problems.push(join(path, key), "must be a number");
                *ok = false;
                None
            }
        }
    };
    let length = |key: &str, ok: &mut bool| -> Option<u64> {
        match map.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) if n.as_u64().is_some() => n.as_u64(),
            Some(_) => {
                problems.push(join(path, key), "must be a non-negative integer");
                *ok = false;
                None
            }
        }
    };
    let spec = FieldSpec {
        kind,
        min: number("min", &mut ok),
        max: number("max", &mut ok),
        min_length: length("min_length", &mut ok),
        max_length: length("max_length", &mut ok),
    };
    for key in map.keys() {
        let applies = match key.as_str() {
            "type" => true,
            "min" | "max" => matches!(kind, FieldType::Integer | FieldType::Number),
            "min_length" | "max_length" => matches!(
                kind,
                FieldType::String | FieldType::Array | FieldType::Object
            ),
            _ => {
                problems.push(join(path, key), "unknown field");
                ok = false;
                continue;
            }
        };
        if !applies {
            problems.push(
                join(path, key),
                format!("does not apply to type {}", type_name(kind)),
            );
            ok = false;
        }
    }
    if let (Some(lo), Some(hi)) = (&spec.min, &spec.max) {
        if compare(lo, hi) == Ordering::Greater {
            problems.push(join(path, "min"), "must not be greater than max");
            ok = false;
        }
    }
    if let (Some(lo), Some(hi)) = (spec.min_length, spec.max_length) {
        if lo > hi {
            problems.push(
                join(path, "min_length"),
                "must not be greater than max_length",
            );
            ok = false;
        }
    }
    ok.then_some(spec)
}

fn type_name(k: FieldType) -> &'static str {
    match k {
        FieldType::String => "string",
        FieldType::Integer => "integer",
        FieldType::Number => "number",
        FieldType::Boolean => "boolean",
        FieldType::Object => "object",
        FieldType::Array => "array",
    }
}

impl Profile {
    /// Checks an object's fields (the `profile` key aside); `base` is the path prefix.
    pub fn check(&self, map: &Map<String, Value>, base: &str, out: &mut Problems) {
        for (name, spec) in &self.required {
            match map.get(name) {
                Some(v) => spec.check(v, &join(base, name), out),
                None => out.push(
                    join(base, name),
                    "missing_field",
                    "is required by the profile",
                ),
            }
        }
        for (name, spec) in &self.optional {
            if let Some(v) = map.get(name) {
                spec.check(v, &join(base, name), out);
            }
        }
        if !self.allow_unknown {
            let unknown = map.keys().any(|k| {
                k != PROFILE_KEY && !self.required.contains_key(k) && !self.optional.contains_key(k)
            });
            if unknown {
                // The name is the publisher's: never repeated.
                out.push(
                    base,
                    "unknown_field",
                    "holds a field the profile does not list (unknown_fields: forbid)",
                );
            }
        }
    }
}

/// Two JSON numbers compared exactly: integers as integers (i64 and u64 alike), an integer
/// and a fraction without rounding the integer to f64.
pub fn compare(a: &Number, b: &Number) -> Ordering {
    match (integer(a), integer(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(x), None) => integer_vs_float(x, b.as_f64().unwrap_or(0.0)),
        (None, Some(y)) => integer_vs_float(y, a.as_f64().unwrap_or(0.0)).reverse(),
        (None, None) => {
            let (x, y) = (a.as_f64().unwrap_or(0.0), b.as_f64().unwrap_or(0.0));
            x.partial_cmp(&y).unwrap_or(Ordering::Equal)
        }
    }
}

fn integer(n: &Number) -> Option<i128> {
    n.as_i64()
        .map(i128::from)
        .or_else(|| n.as_u64().map(i128::from))
}

/// `i` against the finite `f` (JSON has no NaN or infinity), exactly.
fn integer_vs_float(i: i128, f: f64) -> Ordering {
    // Beyond +-2^120 no i64 or u64 value can reach; below it, `floor` converts exactly.
    const FAR: f64 = 1.329_227_995_784_916e36;
    if f >= FAR {
        return Ordering::Less;
    }
    if f <= -FAR {
        return Ordering::Greater;
    }
    let floor = f.floor();
    match i.cmp(&(floor as i128)) {
        Ordering::Equal if f > floor => Ordering::Less,
        other => other,
    }
}

impl FieldSpec {
    fn check(&self, v: &Value, path: &str, out: &mut Problems) {
        if !self.kind.is(v) {
            out.push(
                path,
                "wrong_type",
                format!("must be {}", self.kind.article()),
            );
            return;
        }
        if let Value::Number(n) = v {
            let low = self
                .min
                .as_ref()
                .is_some_and(|m| compare(n, m) == Ordering::Less);
            let high = self
                .max
                .as_ref()
                .is_some_and(|m| compare(n, m) == Ordering::Greater);
            if low || high {
                out.push(
                    path,
                    "out_of_bounds",
                    "is outside the profile's min and max",
                );
            }
        }
        let length = match v {
            Value::String(s) => Some(s.len() as u64),
            Value::Array(a) => Some(a.len() as u64),
            Value::Object(m) => Some(m.len() as u64),
            _ => None,
        };
        if let Some(len) = length {
            let short = self.min_length.is_some_and(|m| len < m);
            let long = self.max_length.is_some_and(|m| len > m);
            if short || long {
                out.push(
                    path,
                    "out_of_bounds",
                    format!("has length {len}, outside the profile's min_length and max_length"),
                );
            }
        }
    }
}

#[cfg(test)]
mod exact {
    use super::*;

    fn n(text: &str) -> Number {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn integer_bounds_compare_exactly() {
        let max = n("9223372036854775807");
        for above in [
            "9223372036854775808",
            "9223372036854776832",
            "18446744073709551615",
        ] {
            assert_eq!(compare(&n(above), &max), Ordering::Greater, "{above}");
        }
        assert_eq!(compare(&max, &max), Ordering::Equal);
        assert_eq!(
            compare(&n("-9223372036854775808"), &n("-9223372036854775807")),
            Ordering::Less
        );
        assert_eq!(compare(&n("3"), &n("2.5")), Ordering::Greater);
        assert_eq!(compare(&n("2"), &n("2.5")), Ordering::Less);
        assert_eq!(compare(&n("-3"), &n("-2.5")), Ordering::Less);
        assert_eq!(compare(&n("2"), &n("2.0")), Ordering::Equal);
        assert_eq!(
            compare(&n("1e300"), &n("18446744073709551615")),
            Ordering::Greater
        );
        assert_eq!(compare(&n("0.5"), &n("0.25")), Ordering::Greater);
    }
}
