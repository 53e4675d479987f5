//! Canonical JSON: the project's one writer of it, for custody evidence and for the size limit
//! of a security-label profile alike.
//!
//! The rule: no whitespace; object keys sorted by their UTF-8 bytes; strings escaped as
//! RFC 8785 and serde_json escape them (`"`, `\` and control characters, everything else kept);
//! every number by its exact decimal value, laid out by [`write_number`]'s rule, so `1e2`,
//! `100.0` and `100` agree (PostgreSQL's `jsonb` rewrites one into another), while
//! `18446744073709551616` and `18446744073709551617` never do.
//!
//! Two inputs. [`parse`] reads JSON text strictly (no duplicate keys, bounded nesting, numbers
//! kept as written) into a [`Json`] tree: what `svc verify-custody` reads back from a store
//! and what a payload's text is sealed from. [`write_value`] writes a `serde_json::Value`
//! (labels and metadata the runner built itself), whose floating-point numbers are taken by
//! their shortest round-trip decimal.

use std::borrow::Cow;
use std::fmt;
use std::io::Write as _;

use serde_json::Value;

/// Deepest nesting [`parse`] accepts: a stored record holds a payload that may itself nest as
/// deep as serde_json allows (128), inside a few levels of its own.
pub const MAX_DEPTH: usize = 256;

/// Largest exponent digits read from a number (after leading zeros): `1e999999999` is the
/// most; beyond it a number is refused rather than compared by a truncated value.
const MAX_EXPONENT_DIGITS: usize = 9;

/// A JSON value with its numbers as written and its objects' members sorted by key bytes.
#[derive(Debug, Clone, PartialEq)]
pub enum Json<'a> {
    Null,
    Bool(bool),
    Number(Decimal<'a>),
    String(Cow<'a, str>),
    Array(Vec<Json<'a>>),
    /// Members sorted by their keys' UTF-8 bytes; keys are unique.
    Object(Vec<(Cow<'a, str>, Json<'a>)>),
}

impl<'a> Json<'a> {
    /// The member `key` of an object.
    pub fn get(&self, key: &str) -> Option<&Json<'a>> {
        match self {
            Json::Object(members) => members
                .binary_search_by(|(k, _)| k.as_bytes().cmp(key.as_bytes()))
                .ok()
                .map(|i| &members[i].1),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }
}

/// A JSON number's exact value: `-`? `int` `.frac`? `e exp`?, as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decimal<'a> {
    negative: bool,
    int: &'a str,
    frac: &'a str,
    exp: i64,
}

impl<'a> Decimal<'a> {
    /// Reads JSON number text (RFC 8259 grammar, nothing around it).
    pub fn parse(text: &'a str) -> Result<Decimal<'a>, ParseError> {
        let b = text.as_bytes();
        let bad = ParseError::Syntax { at: 0 };
        let mut i = 0;
        let negative = b.first() == Some(&b'-');
        if negative {
            i += 1;
        }
        let int_start = i;
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                while b.get(i).is_some_and(u8::is_ascii_digit) {
                    i += 1;
                }
            }
            _ => return Err(bad),
        }
        let int = &text[int_start..i];
        let mut frac = "";
        if b.get(i) == Some(&b'.') {
            let start = i + 1;
            i = start;
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            if i == start {
                return Err(bad);
            }
            frac = &text[start..i];
        }
        let mut exp = 0i64;
        if matches!(b.get(i), Some(b'e' | b'E')) {
            i += 1;
            let exp_negative = match b.get(i) {
                Some(b'-') => {
                    i += 1;
                    true
                }
                Some(b'+') => {
                    i += 1;
                    false
                }
                _ => false,
            };
            let start = i;
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            if i == start {
                return Err(bad);
            }
            let digits = text[start..i].trim_start_matches('0');
            if digits.len() > MAX_EXPONENT_DIGITS {
                return Err(ParseError::NumberOutOfRange);
            }
            exp = digits.parse::<i64>().unwrap_or(0);
            if exp_negative {
                exp = -exp;
            }
        }
        if i != b.len() {
            return Err(bad);
        }
        let d = Decimal {
            negative,
            int,
            frac,
            exp,
        };
        // The bound is on the exponent the canonical form writes (`0.10e-999999999` is
        // `1e-1000000000`), so that every canonical form reads back.
        if let Some(point) = d.point() {
            if (point - 1).abs() > MAX_CANONICAL_EXPONENT {
                return Err(ParseError::NumberOutOfRange);
            }
        }
        Ok(d)
    }

    /// The `point` of [`Decimal::normalized`] (`None` for zero), without building its digits.
    fn point(&self) -> Option<i64> {
        let int = self.int.trim_start_matches('0');
        if !int.is_empty() {
            return Some(self.exp + int.len() as i64);
        }
        // 0.000ddd: the leading zeros of the fraction move the point.
        let frac = self.frac.trim_start_matches('0');
        let skipped = (self.frac.len() - frac.len()) as i64;
        (!frac.is_empty()).then_some(self.exp - skipped)
    }

    /// The digits without leading or trailing zeros (empty for zero) and the place of the
    /// decimal point: the value is `0.digits x 10^point`.
    fn normalized(&self) -> (Cow<'a, str>, i64) {
        let int = self.int.trim_start_matches('0');
        let (digits, point): (Cow<'a, str>, i64) = if int.is_empty() {
            // 0.000ddd: the leading zeros of the fraction move the point.
            let frac = self.frac.trim_start_matches('0');
            let skipped = (self.frac.len() - frac.len()) as i64;
            (Cow::Borrowed(frac), self.exp - skipped)
        } else if self.frac.is_empty() {
            (Cow::Borrowed(int), self.exp + int.len() as i64)
        } else {
            (
                Cow::Owned(format!("{int}{}", self.frac)),
                self.exp + int.len() as i64,
            )
        };
        match digits {
            Cow::Borrowed(d) => (Cow::Borrowed(d.trim_end_matches('0')), point),
            Cow::Owned(d) => (Cow::Owned(d.trim_end_matches('0').to_string()), point),
        }
    }
}

/// Largest exponent magnitude of a canonical number (nine digits, as [`Decimal::parse`]
/// reads).
const MAX_CANONICAL_EXPONENT: i64 = 999_999_999;

impl Decimal<'_> {
    /// Characters of the number written without an exponent, as PostgreSQL prints a
    /// `numeric` (integer digits, then the fraction's digits at the scale written): what a
    /// short text such as `1e131071` becomes in a reader's hands. An upper bound, never less.
    pub fn plain_len(&self) -> u64 {
        let int = self.int.trim_start_matches('0').len() as i64;
        let whole = (int + self.exp).max(1);
        let fraction = (self.frac.len() as i64 - self.exp).max(0);
        (whole + fraction) as u64
    }
}

/// Why [`parse`] refused a text. Never quotes the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    /// Not JSON; the byte offset where reading stopped.
    Syntax { at: usize },
    /// An object names one key twice (two readers could keep different values).
    DuplicateKey,
    /// Nested deeper than [`MAX_DEPTH`].
    TooDeep,
    /// A number's exponent beyond `1e999999999`.
    NumberOutOfRange,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Syntax { at } => write!(f, "not JSON (syntax error at byte {at})"),
            ParseError::DuplicateKey => f.write_str("an object has a duplicate key"),
            ParseError::TooDeep => write!(f, "nested deeper than {MAX_DEPTH} levels"),
            ParseError::NumberOutOfRange => f.write_str("a number's exponent is out of range"),
        }
    }
}

impl std::error::Error for ParseError {}

/// Reads one JSON value (whitespace around it allowed), strictly: see the module docs.
pub fn parse(text: &str) -> Result<Json<'_>, ParseError> {
    let mut p = Parser { text, at: 0 };
    p.whitespace();
    let v = p.value(0)?;
    p.whitespace();
    if p.at != text.len() {
        return Err(p.syntax());
    }
    Ok(v)
}

/// Reads one JSON value as [`parse`] does (the same texts accepted, the same errors) without
/// building its tree: each number and string value is handed to `value`, each object key to
/// `key`; `Ok(false)` as soon as one of them says no. `Ok(true)` exactly when [`parse`]
/// succeeds and both accept every scalar and key of its tree.
pub fn scan<'a>(
    text: &'a str,
    value: &mut dyn FnMut(&Json<'a>) -> bool,
    key: &mut dyn FnMut(&str) -> bool,
) -> Result<bool, ParseError> {
    let mut s = Scan {
        p: Parser { text, at: 0 },
        keys: Vec::new(),
        value,
        key,
    };
    s.p.whitespace();
    if !s.value(0)? {
        return Ok(false);
    }
    s.p.whitespace();
    if s.p.at != text.len() {
        return Err(s.p.syntax());
    }
    Ok(true)
}

/// [`scan`]'s state: the parser, and the keys of the objects open now (each object's after
/// its parent's), compared for duplicates when the object ends.
struct Scan<'a, 'f> {
    p: Parser<'a>,
    keys: Vec<Cow<'a, str>>,
    value: &'f mut dyn FnMut(&Json<'a>) -> bool,
    key: &'f mut dyn FnMut(&str) -> bool,
}

impl<'a> Scan<'a, '_> {
    fn value(&mut self, depth: usize) -> Result<bool, ParseError> {
        match self.p.peek() {
            Some(b'[') => self.array(depth + 1),
            Some(b'{') => self.object(depth + 1),
            _ => {
                let v = self.p.value(depth)?;
                Ok((self.value)(&v))
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<bool, ParseError> {
        if depth > MAX_DEPTH {
            return Err(ParseError::TooDeep);
        }
        self.p.at += 1;
        self.p.whitespace();
        if self.p.peek() == Some(b']') {
            self.p.at += 1;
            return Ok(true);
        }
        loop {
            self.p.whitespace();
            if !self.value(depth)? {
                return Ok(false);
            }
            self.p.whitespace();
            match self.p.peek() {
                Some(b',') => self.p.at += 1,
                Some(b']') => {
                    self.p.at += 1;
                    return Ok(true);
                }
                _ => return Err(self.p.syntax()),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<bool, ParseError> {
        if depth > MAX_DEPTH {
            return Err(ParseError::TooDeep);
        }
        self.p.at += 1;
        let first = self.keys.len();
        self.p.whitespace();
        if self.p.peek() == Some(b'}') {
            self.p.at += 1;
            return Ok(true);
        }
        loop {
            self.p.whitespace();
            if self.p.peek() != Some(b'"') {
                return Err(self.p.syntax());
            }
            let k = self.p.string()?;
            if !(self.key)(&k) {
                return Ok(false);
            }
            self.keys.push(k);
            self.p.whitespace();
            if self.p.peek() != Some(b':') {
                return Err(self.p.syntax());
            }
            self.p.at += 1;
            self.p.whitespace();
            if !self.value(depth)? {
                return Ok(false);
            }
            self.p.whitespace();
            match self.p.peek() {
                Some(b',') => self.p.at += 1,
                Some(b'}') => {
                    self.p.at += 1;
                    break;
                }
                _ => return Err(self.p.syntax()),
            }
        }
        let mine = &mut self.keys[first..];
        // Stable: it merges the sorted runs a publisher may send (atk52b: the unstable sort
        // took twice the old tree walk on keys in five sorted runs).
        mine.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        if mine.windows(2).any(|w| w[0] == w[1]) {
            return Err(ParseError::DuplicateKey);
        }
        self.keys.truncate(first);
        Ok(true)
    }
}

struct Parser<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Parser<'a> {
    fn syntax(&self) -> ParseError {
        ParseError::Syntax { at: self.at }
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn literal(&mut self, word: &str, v: Json<'a>) -> Result<Json<'a>, ParseError> {
        if self.text[self.at..].starts_with(word) {
            self.at += word.len();
            Ok(v)
        } else {
            Err(self.syntax())
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json<'a>, ParseError> {
        match self.peek() {
            Some(b'n') => self.literal("null", Json::Null),
            Some(b't') => self.literal("true", Json::Bool(true)),
            Some(b'f') => self.literal("false", Json::Bool(false)),
            Some(b'"') => Ok(Json::String(self.string()?)),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b'[') => self.array(depth + 1),
            Some(b'{') => self.object(depth + 1),
            _ => Err(self.syntax()),
        }
    }

    fn number(&mut self) -> Result<Json<'a>, ParseError> {
        let start = self.at;
        let b = self.text.as_bytes();
        while b
            .get(self.at)
            .is_some_and(|c| c.is_ascii_digit() || b"+-.eE".contains(c))
        {
            self.at += 1;
        }
        match Decimal::parse(&self.text[start..self.at]) {
            Ok(d) => Ok(Json::Number(d)),
            Err(ParseError::Syntax { .. }) => Err(ParseError::Syntax { at: start }),
            Err(e) => Err(e),
        }
    }

    /// A string: borrowed when it has no escape; escapes decoded by serde_json (which refuses
    /// unpaired surrogates and bad escapes).
    fn string(&mut self) -> Result<Cow<'a, str>, ParseError> {
        use svc_text::scan::{byte_mask, find, less_mask};
        let b = self.text.as_bytes();
        let start = self.at;
        let mut i = start + 1;
        let mut escaped = false;
        // The runs between quotes, backslashes and control bytes, eight bytes at a time.
        let word_has = |w| (less_mask(w, 0x20) | byte_mask(w, b'"') | byte_mask(w, b'\\')) != 0;
        let special = |c: u8| c < 0x20 || c == b'"' || c == b'\\';
        loop {
            let Some(at) = find(b, i, word_has, special) else {
                return Err(ParseError::Syntax { at: b.len().max(i) });
            };
            i = at;
            match b[i] {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    i += 2;
                }
                _ => return Err(ParseError::Syntax { at: i }),
            }
        }
        // `i` is on the closing quote (an ASCII byte, so a char boundary).
        self.at = i + 1;
        if !escaped {
            return Ok(Cow::Borrowed(&self.text[start + 1..i]));
        }
        serde_json::from_str::<String>(&self.text[start..=i])
            .map(Cow::Owned)
            .map_err(|_| ParseError::Syntax { at: start })
    }

    fn array(&mut self, depth: usize) -> Result<Json<'a>, ParseError> {
        if depth > MAX_DEPTH {
            return Err(ParseError::TooDeep);
        }
        self.at += 1;
        let mut items = Vec::new();
        self.whitespace();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(Json::Array(items));
        }
        loop {
            self.whitespace();
            items.push(self.value(depth)?);
            self.whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(Json::Array(items));
                }
                _ => return Err(self.syntax()),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Json<'a>, ParseError> {
        if depth > MAX_DEPTH {
            return Err(ParseError::TooDeep);
        }
        self.at += 1;
        let mut members = Vec::new();
        self.whitespace();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(Json::Object(members));
        }
        loop {
            self.whitespace();
            if self.peek() != Some(b'"') {
                return Err(self.syntax());
            }
            let key = self.string()?;
            self.whitespace();
            if self.peek() != Some(b':') {
                return Err(self.syntax());
            }
            self.at += 1;
            self.whitespace();
            let v = self.value(depth)?;
            members.push((key, v));
            self.whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    break;
                }
                _ => return Err(self.syntax()),
            }
        }
        members.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        if members.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(ParseError::DuplicateKey);
        }
        Ok(Json::Object(members))
    }
}

/// A JSON string as serde_json writes it, copied whole when nothing needs escaping.
pub fn write_string(out: &mut Vec<u8>, s: &str) {
    let needs_escape = s.bytes().fold(false, |acc, b| {
        acc | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if needs_escape {
        serde_json::to_writer(&mut *out, s).expect("a string serializes");
    } else {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

/// The canonical form of a number's exact value `±D × 10^E` (`D` its digits without leading
/// or trailing zeros, `P` = len(D) + E the place of the decimal point):
/// - zero: `0` (whatever its sign or form);
/// - an integer (E ≥ 0) within -2^63 ..= 2^64-1, the range serde_json holds as integers:
///   plainly (`100`, `18446744073709551615`);
/// - else, 0 < P ≤ 16: digits with the point inside (`2.5`, `123456.789`);
/// - else, -5 < P ≤ 0: `0.` then zeros (`0.00001`);
/// - else: `d.ddde±<P-1>` (`1e-6`, `1.5e+300`, `1e+21`).
///
/// These are the layouts serde_json gives the shortest round-trip form of a double, so every
/// number a double holds exactly keeps the form it had when custody compared through doubles;
/// what a double cannot hold is now compared exactly.
pub fn write_number(out: &mut Vec<u8>, d: &Decimal<'_>) {
    let (digits, point) = d.normalized();
    let digits: &str = &digits;
    if digits.is_empty() {
        out.push(b'0');
        return;
    }
    if d.negative {
        out.push(b'-');
    }
    let n = digits.len() as i64;
    let e = point - n;
    if e >= 0 && fits_64_bits(digits, point, d.negative) {
        out.extend_from_slice(digits.as_bytes());
        out.resize(out.len() + e as usize, b'0');
    } else if 0 < point && point <= 16 {
        let (head, tail) = digits.split_at(point as usize);
        out.extend_from_slice(head.as_bytes());
        out.push(b'.');
        out.extend_from_slice(tail.as_bytes());
    } else if -5 < point && point <= 0 {
        out.extend_from_slice(b"0.");
        out.resize(out.len() + (-point) as usize, b'0');
        out.extend_from_slice(digits.as_bytes());
    } else {
        let (first, rest) = digits.split_at(1);
        out.extend_from_slice(first.as_bytes());
        if !rest.is_empty() {
            out.push(b'.');
            out.extend_from_slice(rest.as_bytes());
        }
        let _ = write!(out, "e{:+}", point - 1);
    }
}

/// Whether the integer `digits` followed by zeros up to `point` digits lies within
/// -2^63 ..= 2^64-1.
fn fits_64_bits(digits: &str, point: i64, negative: bool) -> bool {
    let bound = if negative {
        "9223372036854775808"
    } else {
        "18446744073709551615"
    };
    match point.cmp(&(bound.len() as i64)) {
        std::cmp::Ordering::Less => true,
        std::cmp::Ordering::Greater => false,
        std::cmp::Ordering::Equal => {
            let zeros = bound.len() - digits.len();
            format!("{digits}{}", "0".repeat(zeros)).as_str() <= bound
        }
    }
}

/// Writes the canonical JSON of a parsed document.
pub fn write(out: &mut Vec<u8>, v: &Json<'_>) {
    match v {
        Json::Null => out.extend_from_slice(b"null"),
        Json::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Json::Number(d) => write_number(out, d),
        Json::String(s) => write_string(out, s),
        Json::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(out, item);
            }
            out.push(b']');
        }
        Json::Object(members) => {
            // Already sorted by `parse`.
            out.push(b'{');
            for (i, (k, v)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(out, k);
                out.push(b':');
                write(out, v);
            }
            out.push(b'}');
        }
    }
}

/// Writes the canonical JSON of a `serde_json::Value`; a float by its shortest round-trip
/// decimal, then by the number rule.
pub fn write_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                let _ = write!(out, "{u}");
            } else if let Some(i) = n.as_i64() {
                let _ = write!(out, "{i}");
            } else {
                let text = n.to_string();
                match Decimal::parse(&text) {
                    Ok(d) => write_number(out, &d),
                    // serde_json writes only valid numbers; kept as written if not.
                    Err(_) => out.extend_from_slice(text.as_bytes()),
                }
            }
        }
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => write_map(out, map),
    }
}

/// Writes the canonical JSON of an object.
pub fn write_map(out: &mut Vec<u8>, map: &serde_json::Map<String, Value>) {
    // serde_json's map iterates in key order unless its `preserve_order` feature is
    // on somewhere in the build: sort only when needed.
    let in_order = map
        .keys()
        .zip(map.keys().skip(1))
        .all(|(a, b)| a.as_bytes() < b.as_bytes());
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    if !in_order {
        entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    }
    out.push(b'{');
    for (i, (k, v)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(out, k);
        out.push(b':');
        write_value(out, v);
    }
    out.push(b'}');
}

/// The canonical JSON of a value as a `String`.
pub fn value_to_string(v: &Value) -> String {
    let mut out = Vec::new();
    write_value(&mut out, v);
    String::from_utf8(out).expect("canonical JSON of a Value is UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(text: &str) -> Result<String, ParseError> {
        let mut out = Vec::new();
        write(&mut out, &parse(text)?);
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn numbers_by_their_exact_value() {
        for (text, want) in [
            ("0", "0"),
            ("-0", "0"),
            ("-0.000e5", "0"),
            ("100", "100"),
            ("1e2", "100"),
            ("100.0", "100"),
            ("1.50", "1.5"),
            ("2.5", "2.5"),
            ("-3", "-3"),
            ("0.001", "0.001"),
            ("0.00001", "0.00001"),
            ("1e-5", "0.00001"),
            ("1e-6", "1e-6"),
            ("0.0000015", "1.5e-6"),
            ("123456.789", "123456.789"),
            ("12345678901234567890", "12345678901234567890"),
            ("18446744073709551615", "18446744073709551615"),
            ("18446744073709551616", "1.8446744073709551616e+19"),
            ("18446744073709551999", "1.8446744073709551999e+19"),
            ("-9223372036854775808", "-9223372036854775808"),
            ("-9223372036854775809", "-9.223372036854775809e+18"),
            ("-1e19", "-1e+19"),
            ("1e19", "10000000000000000000"),
            ("1e20", "1e+20"),
            ("1e21", "1e+21"),
            ("1.5e300", "1.5e+300"),
            ("1E+2", "100"),
            ("1e131071", "1e+131071"),
            ("-1e-400", "-1e-400"),
            (
                "0.1000000000000000055511151231257827",
                "0.1000000000000000055511151231257827",
            ),
            ("1234567890123456.5", "1234567890123456.5"),
            ("12345678901234567.5", "1.23456789012345675e+16"),
        ] {
            assert_eq!(canon(text).unwrap(), want, "{text}");
        }
        // Two numbers a double cannot tell apart stay apart.
        assert_ne!(
            canon("18446744073709551616").unwrap(),
            canon("18446744073709551617").unwrap()
        );
        assert_eq!(
            canon("1e1000000000"),
            Err(ParseError::NumberOutOfRange),
            "exponent beyond nine digits"
        );
        assert_eq!(canon("1e000000000000000000002").unwrap(), "100");
        // Found by the canonical_json fuzz target: the written exponent has nine digits, the
        // canonical one would need ten.
        assert_eq!(canon("0.10e-999999999"), Err(ParseError::NumberOutOfRange));
        assert_eq!(canon("0.1e-999999998").unwrap(), "1e-999999999");
        assert_eq!(canon("12e999999998").unwrap(), "1.2e+999999999");
        assert_eq!(canon("123e999999998"), Err(ParseError::NumberOutOfRange));
        assert_eq!(canon("0.000e-999999999").unwrap(), "0");
    }

    /// The rule custody used while it compared numbers through doubles: integers as written,
    /// integral doubles up to 2^53 as integers, other doubles by serde_json's shortest form.
    fn through_doubles(n: &serde_json::Number) -> String {
        if let Some(u) = n.as_u64() {
            u.to_string()
        } else if let Some(i) = n.as_i64() {
            i.to_string()
        } else {
            let f = n.as_f64().unwrap();
            if f.fract() == 0.0 && f.abs() <= 9_007_199_254_740_992.0 {
                (f as i64).to_string()
            } else {
                n.to_string()
            }
        }
    }

    /// Every number a double holds exactly (integral ones up to 2^53, and integers as
    /// written) keeps the canonical form it had when custody compared through doubles, so
    /// records sealed then verify now.
    #[test]
    fn doubles_keep_their_form() {
        for text in [
            "1.5",
            "0.1",
            "1e-7",
            "2.5e-6",
            "123.456",
            "1e300",
            "0.3333333333333333",
            "-7.25",
            "65536.5",
            "9007199254740992",
            "9007199254740992.0",
            "1e2",
            "100.0",
            "-0.0",
            "12345678901234567890",
            "-5",
            "0.00001",
            "1e-5",
            "5e-324",
            "1.7976931348623157e308",
        ] {
            let v: Value = serde_json::from_str(text).unwrap();
            let Value::Number(n) = &v else { unreachable!() };
            assert_eq!(
                canon(text).unwrap(),
                through_doubles(n),
                "{text}: from text"
            );
            assert_eq!(
                value_to_string(&v),
                through_doubles(n),
                "{text}: from a Value"
            );
        }
        assert_eq!(value_to_string(&serde_json::json!(1.0)), "1");
        // Beyond the 64-bit range serde_json writes a double in exponent form, and so does
        // the canonical rule: a label profile's stored form is its canonical form there too.
        for f in [-1e19, 1e20, -9.3e18, 3e19] {
            let v = serde_json::json!(f);
            assert_eq!(value_to_string(&v), v.to_string(), "{f}");
        }
    }

    #[test]
    fn objects_sorted_strings_escaped_whitespace_gone() {
        assert_eq!(
            canon(" {\"b\": [1.0, true, null], \"a\": \"\u{e9}\\n\\u0041\", \"A\": {}} ").unwrap(),
            "{\"A\":{},\"a\":\"\u{e9}\\nA\",\"b\":[1,true,null]}"
        );
        let v = parse(r#"{"z": 1, "m": {"k": "v"}}"#).unwrap();
        assert_eq!(
            v.get("m").and_then(|m| m.get("k")).and_then(Json::as_str),
            Some("v")
        );
        assert_eq!(v.get("q"), None);
    }

    #[test]
    fn plain_lengths() {
        for (text, len) in [
            ("0", 1),
            ("100", 3),
            ("1.50", 3),
            ("1e2", 3),
            ("1.0e-3", 5),
            ("-7", 1),
            ("1e131071", 131072),
            ("1e-400", 401),
            ("123456789012345678901234567890", 30),
        ] {
            assert_eq!(Decimal::parse(text).unwrap().plain_len(), len, "{text}");
        }
    }

    #[test]
    fn strict_reading() {
        assert_eq!(
            canon(r#"{"amount":1,"amount":2}"#),
            Err(ParseError::DuplicateKey)
        );
        assert_eq!(
            canon(r#"{"a":{"x":1,"x":1}}"#),
            Err(ParseError::DuplicateKey)
        );
        // The same key written with an escape is the same key.
        assert_eq!(
            canon(r#"{"a":1,"\u0061":2}"#),
            Err(ParseError::DuplicateKey)
        );
        for bad in [
            "",
            "{",
            "[1,]",
            "{\"a\":1,}",
            "01",
            "1.",
            ".5",
            "-",
            "1e",
            "+1",
            "nul",
            "\"\u{1}\"",
            "\"\\ud800\"",
            "\"\\x\"",
            "[1] 2",
            "{a:1}",
            "'a'",
            "NaN",
            "Infinity",
        ] {
            assert!(
                matches!(canon(bad), Err(ParseError::Syntax { .. })),
                "{bad:?}: {:?}",
                canon(bad)
            );
        }
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(canon(&deep(MAX_DEPTH)).is_ok());
        assert_eq!(canon(&deep(MAX_DEPTH + 1)), Err(ParseError::TooDeep));
        let e = ParseError::Syntax { at: 3 }.to_string();
        assert_eq!(e, "not JSON (syntax error at byte 3)");
    }

    /// What serde_json accepts, this accepts too, with the same strings and the same shape.
    #[test]
    fn agrees_with_serde_json_on_valid_documents() {
        let doc = r#"{"s":"tab\there \"q\" \\ \u00e9 \ud83d\ude00","n":[-1,2.5,1e-3,0],"o":{"e":[]},"t":true,"f":false,"z":null}"#;
        let ours = canon(doc).unwrap();
        let v: Value = serde_json::from_str(doc).unwrap();
        assert_eq!(ours, value_to_string(&v));
    }

    /// Where the string loop before the eight-bytes-at-a-time scan stopped: the closing
    /// quote's index, or the error's offset.
    fn old_string_end(b: &[u8], start: usize) -> Result<usize, usize> {
        let mut i = start + 1;
        loop {
            match b.get(i) {
                None => return Err(i),
                Some(b'"') => return Ok(i),
                Some(b'\\') => i += 2,
                Some(c) if *c < 0x20 => return Err(i),
                Some(_) => i += 1,
            }
        }
    }

    /// Random strings (control bytes, quotes, backslashes, escapes, multi-byte characters,
    /// unterminated, straddling the 8-byte words) read alone and as an object's key: the same
    /// errors at the same offsets as the byte-by-byte loop, and the same text as serde_json.
    #[test]
    fn strings_read_by_words_as_byte_by_byte() {
        let palette = [
            "a",
            "bcdefgh",
            "\"",
            "\\",
            "\\\\",
            "\\n",
            "\\u0041",
            "\\ud83d\\ude00",
            "é",
            "😀",
            "\u{1}",
            "\t",
            "\u{1f}",
            "\u{7f}",
            " ",
            "\\x",
            "\\",
        ];
        let mut x: u64 = 0x853c_49e6_748f_ea9b;
        let mut next = move |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        for round in 0..20_000 {
            let body: String = (0..next(40))
                .map(|_| palette[next(palette.len())])
                .collect();
            let close = if round % 5 == 0 { "" } else { "\"" };
            for (text, start) in [
                (format!("\"{body}{close}"), 0),
                (format!("{{\"{body}{close}:1}}"), 1),
            ] {
                let got = parse(&text);
                let by_serde = serde_json::from_str::<Value>(&text);
                match old_string_end(text.as_bytes(), start) {
                    Err(at) => assert_eq!(got, Err(ParseError::Syntax { at }), "{text:?}"),
                    Ok(_) => match (&got, &by_serde) {
                        (Ok(ours), Ok(v)) => {
                            let mut out = Vec::new();
                            write(&mut out, ours);
                            assert_eq!(String::from_utf8(out).unwrap(), value_to_string(v));
                        }
                        (Err(_), Err(_)) => {}
                        _ => panic!("{text:?}: {got:?} against serde_json {by_serde:?}"),
                    },
                }
            }
        }
    }

    // ---- atk52b: attacks on `scan` (h52perf) -------------------------------------------

    /// atk52b: xorshift, as the other fuzz tests here.
    fn atk52b_rng(seed: u64) -> impl FnMut(usize) -> usize {
        let mut x = seed;
        move |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        }
    }

    /// atk52b: scan accepting everything must give exactly parse's answer (same Ok, same
    /// error, same offset).
    fn atk52b_same(text: &str) {
        let by_parse = parse(text).map(|_| true);
        let by_scan = scan(text, &mut |_| true, &mut |_| true);
        assert_eq!(by_scan, by_parse, "scan and parse differ on {text:?}");
    }

    /// atk52b: a random adversarial document: atoms chosen to be hostile (numbers at the
    /// exponent bound, malformed numbers, lone and paired surrogates, NUL escapes, keys that
    /// decode equal, strings straddling 8-byte words), arrays and objects of them, random
    /// whitespace, random truncation and random byte splices.
    fn atk52b_doc(next: &mut impl FnMut(usize) -> usize, d: u32) -> String {
        const ATOMS: &[&str] = &[
            "0",
            "-0",
            "-0.0",
            "1e400",
            "1E+",
            "01",
            "1.",
            ".5",
            "-",
            "1e999999999",
            "1e1000000000",
            "0.1e-999999998",
            "0.1e-999999999",
            "10e999999998",
            "1e0000000000999999999",
            "0e99999999999",
            "1e-0",
            "1E+09",
            "-1.50e-3",
            "123456789012345678901234567890",
            "1.0000000000000000000000001",
            "0.000",
            "\"\"",
            "\"1234567\"",
            "\"12345678\"",
            "\"123456789\"",
            "\"\\u0000\"",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"\\ud83d\\ude00\"",
            "\"\\ud83d\"",
            "\"\\u00e9\"",
            "\"é😀\u{2028}\"",
            "\"\\/\"",
            "\"\\x\"",
            "\"\\\"",
            "\"abc\\\"defg\"",
            "\"\u{7f}\"",
            "true",
            "false",
            "null",
            "nul",
            "tru",
            "[",
            "]",
            "{",
            "}",
            ",",
            ":",
        ];
        const KEYS: &[&str] = &[
            "a",
            "\\u0061",
            "\\u0041",
            "A",
            "",
            "\\u0000",
            "a\\u0000",
            "\\\\u0061",
            "é",
            "\\u00e9",
            "\\ud83d\\ude00",
            "😀",
            "abcdefgh",
            "abcdefg\\u0068",
            "a\\/",
            "a/",
        ];
        const WS: &[&str] = &["", "", "", " ", "\n", "\t\r ", "\u{b}", "\u{c}"];
        let ws = |next: &mut dyn FnMut(usize) -> usize| WS[next(WS.len())];
        match next(if d > 6 { 1 } else { 5 }) {
            0 => ATOMS[next(ATOMS.len())].to_string(),
            1 => {
                let items: Vec<String> = (0..next(5)).map(|_| atk52b_doc(next, d + 1)).collect();
                format!("[{}{}{}]", ws(next), items.join(ws(next)), ws(next))
            }
            2 | 3 => {
                let members: Vec<String> = (0..next(5))
                    .map(|_| {
                        let k = KEYS[next(KEYS.len())];
                        let sep = [":", " : ", ""][next(3)];
                        format!("\"{k}\"{sep}{}", atk52b_doc(next, d + 1))
                    })
                    .collect();
                let comma = [",", ", ", ",,", ""][next(4)];
                format!("{{{}}}", members.join(comma))
            }
            _ => {
                let n = next(300);
                let open = if next(2) == 0 { "[" } else { "[{\"a\":" };
                open.repeat(n) + &"]".repeat(next(300))
            }
        }
    }

    /// atk52b: 200,000 hostile documents, also truncated at every kind of offset: scan
    /// answers exactly as parse (Ok/Err, the error variant, the Syntax offset).
    #[test]
    fn held_atk52b_scan_is_parse_on_hostile_documents() {
        let mut next = atk52b_rng(0x9e37_79b9_7f4a_7c15);
        for round in 0..200_000 {
            let text = atk52b_doc(&mut next, 0);
            atk52b_same(&text);
            if round % 4 == 0 && !text.is_empty() {
                let mut cut = next(text.len());
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                atk52b_same(&text[..cut]);
            }
        }
    }

    /// atk52b: documents mutated character by character (a character replaced, inserted or
    /// removed, from a palette of quotes, backslashes, brackets, digits, signs, control
    /// characters, multi-byte characters): scan answers exactly as parse, 100,000 times.
    #[test]
    fn held_atk52b_scan_is_parse_on_mutated_documents() {
        const PALETTE: &[char] = &[
            '"', '\\', '[', ']', '{', '}', ',', ':', '0', '1', '-', '+', '.', 'e', 'E', 'u', 'd',
            '8', 'a', ' ', '\n', '\u{0}', '\u{1f}', '\u{7f}', 'é', '😀', '\u{2028}', 'n', 't',
        ];
        let mut next = atk52b_rng(0x1234_5678_9abc_def1);
        for _ in 0..100_000 {
            let mut chars: Vec<char> = atk52b_doc(&mut next, 0).chars().collect();
            for _ in 0..1 + next(3) {
                let at = next(chars.len() + 1);
                let c = PALETTE[next(PALETTE.len())];
                match next(3) {
                    0 if at < chars.len() => chars[at] = c,
                    1 if at < chars.len() => {
                        chars.remove(at);
                    }
                    _ => chars.insert(at, c),
                }
            }
            atk52b_same(&chars.into_iter().collect::<String>());
        }
    }

    /// atk52b: the duplicate-key check of scan on keys that decode equal, keys equal in
    /// different objects (not duplicates), a duplicate only in an inner object after the
    /// outer's keys were pushed, and a duplicate in an object inside an array of objects.
    #[test]
    fn held_atk52b_scan_duplicate_keys_decoded_and_scoped() {
        let dup = Err(ParseError::DuplicateKey);
        for (text, want) in [
            (r#"{"a":1,"\u0061":2}"#, dup),
            (r#"{"\ud83d\ude00":1,"😀":2}"#, dup),
            (r#"{"a/":1,"a\/":2}"#, dup),
            (r#"{"a":{"a":1},"b":{"a":2}}"#, Ok(true)),
            (r#"{"a":{"b":1},"b":{"a":2,"c":{"a":3,"b":4}}}"#, Ok(true)),
            (r#"{"a":{"b":1,"c":{"x":1,"x":2}},"b":2}"#, dup),
            (
                r#"[{"a":1},{"a":1},{"a":1,"b":{"a":1}},{"b":2,"\u0062":3}]"#,
                dup,
            ),
            (r#"{"b":1,"a":{"c":1},"c":2}"#, Ok(true)),
            (r#"{"a":{"b":1},"b":1,"a":2}"#, dup),
            (r#"{"a":{"q":1,"q":2}"#, dup),
        ] {
            atk52b_same(text);
            assert_eq!(scan(text, &mut |_| true, &mut |_| true), want, "{text}");
        }
    }

    /// atk52b: numbers at every edge of the exponent bound and of the `point` shortcut, with
    /// leading and trailing zeros on both sides of the point: scan and parse agree, and the
    /// new check (`point`) refuses exactly what the old one (`normalized`) refused.
    #[test]
    fn held_atk52b_exponent_bound_same_as_normalized() {
        let mut next = atk52b_rng(0x2545_f491_4f6c_dd1d);
        let zeros = |n: usize| "0".repeat(n);
        for _ in 0..100_000 {
            let int = match next(4) {
                0 => "0".to_string(),
                1 => format!("{}", 1 + next(9)),
                2 => format!("{}{}", 1 + next(9), zeros(next(12))),
                _ => format!("{}{}{}", 1 + next(9), zeros(next(3)), 1 + next(9)),
            };
            let frac = match next(4) {
                0 => String::new(),
                1 => format!(".{}", zeros(1 + next(12))),
                2 => format!(".{}{}", zeros(next(12)), 1 + next(9)),
                _ => format!(".{}{}{}", zeros(next(3)), 1 + next(9), zeros(next(5))),
            };
            let e = [999_999_999i64, 999_999_998, 999_999_990, 1, 0][next(5)] - next(15) as i64;
            let exp = match next(3) {
                0 => String::new(),
                1 => format!("e{e}"),
                _ => format!("E-{}{e}", zeros(next(3))),
            };
            let text = format!("{}{int}{frac}{exp}", if next(2) == 0 { "-" } else { "" });
            atk52b_same(&text);
            let by_old = Decimal::parse(&text).map(|d| {
                let (digits, point) = d.normalized();
                digits.is_empty() || (point - 1).abs() <= MAX_CANONICAL_EXPONENT
            });
            if let Ok(old_ok) = by_old {
                let new = Decimal::parse(&text);
                assert_eq!(new.is_ok(), old_ok, "{text}");
            }
        }
    }

    /// atk52b: the best of 5 runs of parse and of scan on `text` (both must accept it).
    fn atk52b_times(text: &str) {
        atk52b_same(text);
        let best = |f: &dyn Fn()| {
            (0..5)
                .map(|_| {
                    let t = std::time::Instant::now();
                    f();
                    t.elapsed()
                })
                .min()
                .unwrap()
        };
        let by_parse = best(&|| assert!(parse(text).is_ok()));
        let by_scan = best(&|| assert_eq!(scan(text, &mut |_| true, &mut |_| true), Ok(true)));
        eprintln!(
            "atk52b: {} bytes: parse {:.3} ms, scan {:.3} ms (best of 5)",
            text.len(),
            by_parse.as_secs_f64() * 1e3,
            by_scan.as_secs_f64() * 1e3
        );
    }

    /// atk52b: amplification held. About 1 MiB of distinct keys in random order, of distinct
    /// escaped keys, and of small nested objects: scan costs no more than parse (the tree)
    /// did. The duplicate check sorts each object's keys once (n log n), never pairwise.
    #[test]
    fn held_atk52b_a_mib_of_keys_scans_as_it_parses() {
        let mut next = atk52b_rng(0x853c_49e6_748f_ea9b);
        let mut order: Vec<usize> = (0..90_000).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, next(i + 1));
        }
        let shuffled = format!(
            "{{{}}}",
            order
                .iter()
                .map(|n| format!("\"k{n}\":{n}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        let escaped: String = format!(
            "{{{}}}",
            (0..60_000)
                .map(|n| format!("\"\\u0061{n}\":1"))
                .collect::<Vec<_>>()
                .join(",")
        );
        let nested = format!("[{}]", vec![r#"{"a":{"a":{"a":1}}}"#; 50_000].join(","));
        for text in [&shuffled, &escaped, &nested] {
            assert!(text.len() > 900_000, "{}", text.len());
            // The times are printed, not asserted (speed lives in benches/; a loaded CI host
            // would make a timed assertion flaky): atk52b measured scan at most parse's cost.
            atk52b_times(text);
        }
    }

    /// FIXED (atk52b finding, class 8, low; now `sort_by`): scan sorts an object's keys with `sort_unstable_by`
    /// (pattern-defeating quicksort), parse with the stable `sort_by` (which merges the
    /// already sorted runs it finds). Keys a publisher writes in runs (`"k0".."k89999"`: five
    /// sorted runs, 1.3 MB) cost scan about twice what parse and the tree walk cost before the
    /// merge: 27.5 ms against 10.9 ms optimized (rustc -O, /work/notes/atk52b-failing/bench.rs;
    /// 0.44x with `sort_by` in scan); in this debug test, best of 5, 483 ms against 86 ms. Expected:
    /// scan no slower than parse (within 20%). The worst case per MiB did not grow (random
    /// key order costs both about 30-40 ms optimized).
    #[test]
    fn fixed_atk52b_keys_in_sorted_runs_scan_as_they_parse() {
        let runs = format!(
            "{{{}}}",
            (0..90_000)
                .map(|n| format!("\"k{n}\":{n}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        // Printed, not asserted (see above): with the stable sort, 0.44x of parse optimized.
        atk52b_times(&runs);
    }

    /// atk52b: strings ending exactly at, one before and one after every 8-byte word edge,
    /// with an escape or a multi-byte character straddling the edge, and the same bytes left
    /// unterminated: parse (and scan) answer as serde_json (accept/refuse) and the old
    /// byte-by-byte loop (offset).
    #[test]
    fn held_atk52b_strings_at_word_edges() {
        let tails = [
            "",
            "\\\"",
            "\\\\",
            "é",
            "😀",
            "\\u00e9",
            "\\ud83d\\ude00",
            "\\",
            "\u{1}",
        ];
        for pad in 0..24 {
            for tail in tails {
                for close in ["\"", ""] {
                    for lead in ["", " ", "[", "{\"k\":"] {
                        let body = format!("{}{tail}", "x".repeat(pad));
                        let end = match lead {
                            "[" => "]",
                            "{\"k\":" => "}",
                            _ => "",
                        };
                        let text = format!("{lead}\"{body}{close}{end}");
                        atk52b_same(&text);
                        let ours = parse(&text).is_ok();
                        let serde = serde_json::from_str::<Value>(&text).is_ok();
                        assert_eq!(ours, serde, "{text:?}");
                    }
                }
            }
        }
    }
}
