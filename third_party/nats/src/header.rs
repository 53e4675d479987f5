// Copyright 2020-2022 The NATS Authors
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
// http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

use std::{
    collections::HashMap,
    convert::TryFrom,
    iter::{FromIterator, IntoIterator},
    ops::Deref,
};

use std::iter::Iterator;

use log::trace;

const HEADER_LINE: &str = "NATS/1.0";
const HEADER_LINE_LEN: usize = HEADER_LINE.len();

/// Status
pub const STATUS: &str = "Status";

/// Description
pub const DESCRIPTION: &str = "Description";

/// Nats-Msg-Id
pub const NATS_MSG_ID: &str = "Nats-Msg-Id";

/// Nats-Expected-Stream
pub const NATS_EXPECTED_STREAM: &str = "Nats-Expected-Stream";

/// Nats-Expected-Last-Msg-Id
pub const NATS_EXPECTED_LAST_MSG_ID: &str = "Nats-Expected-Last-Msg-Id";

/// Nats-Expected-Last-Sequence
pub const NATS_EXPECTED_LAST_SEQUENCE: &str = "Nats-Expected-Last-Sequence";

/// Nats-Expected-Last-Subject-Sequence
pub const NATS_EXPECTED_LAST_SUBJECT_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";

/// Nats-Last-Consumer
pub const NATS_LAST_CONSUMER: &str = "Nats-Last-Consumer";

/// Nats-Consumer-Stalled
pub const NATS_CONSUMER_STALLED: &str = "Nats-Consumer-Stalled";

/// A multi-map from header name to its distinct values, in the order they first arrived (so the
/// first value of a repeated header is the first on the wire, every time: svc keeps and routes
/// on it)
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HeaderMap {
    /// A multi-map from header name to its distinct values, in the order they first arrived (so the
    /// first value of a repeated header is the first on the wire, every time: svc keeps and routes
    /// on it)
    inner: HashMap<String, Vec<String>>,
    /// The status code and description of the version line (`NATS/1.0 408 Request
    /// Timeout`): the server's, never a publisher's header line named `Status`.
    status: Option<String>,
    description: Option<String>,
    /// The block's header lines and their name and value bytes as the server sent them,
    /// counted before any map is built: repeated lines, which the map keeps once, included.
    counted: HeaderCount,
}

/// Header lines and their name and value bytes (trimmed, a folded line's bytes plus one),
/// counted in the raw block. A line repeated with the same name and value counts each time.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HeaderCount {
    /// Header lines (a folded continuation belongs to its line).
    pub lines: usize,
    /// Name and value bytes of those lines.
    pub bytes: usize,
}

/// Most header lines this client builds a map from: svc's own input limit
/// (`src/message/limits.rs` `MAX_HEADERS`; an assertion there keeps the two equal at compile
/// time). A block with more is marked unreadable and no map is built: thousands of one-byte
/// lines otherwise cost more than a hundred times their bytes in the map (1.0 GiB for 1,500
/// messages of 8,000 lines).
pub const MAX_HEADER_LINES: usize = 256;

/// Most name and value bytes this client builds a map from: svc's `MAX_HEADER_BYTES`.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// The reason given for a block over [`MAX_HEADER_LINES`].
pub const TOO_MANY_LINES: &str = "the message has more header lines than the client reads";

/// The reason given for a block over [`MAX_HEADER_BYTES`].
pub const TOO_MANY_BYTES: &str = "the message has more header bytes than the client reads";

impl HeaderMap {
    /// The status code of the version line, set by the server only (404, 408, 100, ...).
    pub fn status(&self) -> Option<&str> {
        self.status.as_deref()
    }

    /// The description of the version line, set by the server only.
    pub fn description(&self) -> Option<&str> {
        self.description.as_deref()
    }

    /// The raw block's header lines and bytes, repeated lines included; zero for a map not
    /// read from a message.
    pub fn counted(&self) -> HeaderCount {
        self.counted
    }
}

/// Counts the header lines of a block (after its version line) and their name and value bytes,
/// allocating nothing.
fn count_lines(text: &str) -> HeaderCount {
    let mut count = HeaderCount::default();
    for line in text.lines().skip(1) {
        if line.is_empty() {
            continue;
        }
        if line.starts_with(is_continuation) {
            count.bytes += line.trim().len() + 1;
            continue;
        }
        count.lines += 1;
        count.bytes += match line.split_once(':') {
            Some((k, v)) => k.trim().len() + v.trim().len(),
            None => line.trim().len(),
        };
    }
    count
}

/// Reads a message's header block: the map, or an empty map and the reason it could not be
/// read (see [`parse_headers`]). Lines and bytes are counted first, and a block over
/// [`MAX_HEADER_LINES`] or [`MAX_HEADER_BYTES`] is refused before any map is built; either
/// way the map carries the counts, so the caller can name the bound. Public for svc's tests only.
#[doc(hidden)]
pub fn read_headers(buf: &[u8]) -> (HeaderMap, Option<&'static str>) {
    let counted = std::str::from_utf8(buf)
        .map(count_lines)
        .unwrap_or_default();
    let refused = |why| {
        let map = HeaderMap {
            counted,
            ..Default::default()
        };
        (map, Some(why))
    };
    if counted.lines > MAX_HEADER_LINES {
        return refused(TOO_MANY_LINES);
    }
    if counted.bytes > MAX_HEADER_BYTES {
        return refused(TOO_MANY_BYTES);
    }
    match parse_headers(buf) {
        Ok(mut map) => {
            map.counted = counted;
            (map, None)
        }
        Err(why) => refused(why),
    }
}

impl FromIterator<(String, String)> for HeaderMap {
    fn from_iter<T>(iter: T) -> Self
    where
        T: IntoIterator<Item = (String, String)>,
    {
        let mut inner = HashMap::default();
        for (k, v) in iter {
            push_once(inner.entry(k).or_default(), v);
        }
        HeaderMap {
            inner,
            ..Default::default()
        }
    }
}

impl<'a> FromIterator<(&'a String, &'a String)> for HeaderMap {
    fn from_iter<T>(iter: T) -> Self
    where
        T: IntoIterator<Item = (&'a String, &'a String)>,
    {
        let mut inner = HashMap::default();
        for (k, v) in iter {
            let k = k.to_string();
            let v = v.to_string();
            push_once(inner.entry(k).or_default(), v);
        }
        HeaderMap {
            inner,
            ..Default::default()
        }
    }
}

impl<'a> FromIterator<&'a (&'a String, &'a String)> for HeaderMap {
    fn from_iter<T>(iter: T) -> Self
    where
        T: IntoIterator<Item = &'a (&'a String, &'a String)>,
    {
        let mut inner = HashMap::default();
        for (k, v) in iter {
            let k = k.to_string();
            let v = v.to_string();
            push_once(inner.entry(k).or_default(), v);
        }
        HeaderMap {
            inner,
            ..Default::default()
        }
    }
}

impl<'a> FromIterator<(&'a str, &'a str)> for HeaderMap {
    fn from_iter<T>(iter: T) -> Self
    where
        T: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let mut inner = HashMap::default();
        for (k, v) in iter {
            let k = k.to_string();
            let v = v.to_string();
            push_once(inner.entry(k).or_default(), v);
        }
        HeaderMap {
            inner,
            ..Default::default()
        }
    }
}

impl<'a> FromIterator<&'a (&'a str, &'a str)> for HeaderMap {
    fn from_iter<T>(iter: T) -> Self
    where
        T: IntoIterator<Item = &'a (&'a str, &'a str)>,
    {
        let mut inner = HashMap::default();
        for (k, v) in iter {
            let k = k.to_string();
            let v = v.to_string();
            push_once(inner.entry(k).or_default(), v);
        }
        HeaderMap {
            inner,
            ..Default::default()
        }
    }
}

/// Adds `value` unless the header already holds it; true when it was added. Linear, and bounded:
/// a map is built from at most [`MAX_HEADER_LINES`] lines.
fn push_once(values: &mut Vec<String>, value: String) -> bool {
    if values.contains(&value) {
        return false;
    }
    values.push(value);
    true
}

fn parse_error<T, E: AsRef<str>>(e: E) -> std::io::Result<T> {
    trace!("header parse error: {}", e.as_ref());
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        e.as_ref(),
    ))
}

fn is_continuation(c: char) -> bool {
    c == ' ' || c == '\t'
}

impl TryFrom<&[u8]> for HeaderMap {
    type Error = std::io::Error;

    fn try_from(buf: &[u8]) -> std::io::Result<Self> {
        parse_headers(buf).or_else(parse_error)
    }
}

/// Parses a header block strictly: what the server and this client could read differently is
/// refused, with a static reason (never the block's bytes), so the caller can deliver the
/// message as unreadable instead of dropping the connection.
pub(crate) fn parse_headers(buf: &[u8]) -> Result<HeaderMap, &'static str> {
    let text = std::str::from_utf8(buf).map_err(|_| "a header is not UTF-8")?;
    // The server reads `Nats-Msg-Id` at the first place its bytes appear, and only when that
    // place starts a line and `:` follows; this client reads header lines by name. Where the
    // two would read different ids (the name inside another header first, `Nats-Msg-Id :`, the
    // header twice), the block is refused.
    let server_reads_id = text.find(NATS_MSG_ID).is_some_and(|i| {
        i >= 2 && &text[i - 2..i] == "\r\n" && text[i + NATS_MSG_ID.len()..].starts_with(':')
    });
    let mut id_lines = 0;
    let mut map = HeaderMap::default();
    // Lines end at LF, a CR before it dropped, as this client always read them (it writes a
    // line break inside a value as a bare LF and folds the next line).
    let mut lines = text.lines();
    let version = lines
        .next()
        .ok_or("expected header information not present")?;
    let rest = version
        .strip_prefix(HEADER_LINE)
        .ok_or("the version line does not begin with NATS/1.0")?;
    let rest = rest.trim();
    if !rest.is_empty() {
        match rest.split_once(' ') {
            Some((status, description)) => {
                map.status = Some(status.trim().to_string());
                let description = description.trim();
                if !description.is_empty() {
                    map.description = Some(description.to_string());
                }
            }
            None => map.status = Some(rest.to_string()),
        }
    }
    let mut lines = lines.peekable();
    while let Some(line) = lines.next() {
        if line.is_empty() {
            continue;
        }
        if line.starts_with(is_continuation) {
            return Err("a header line is folded (starts with a space or tab)");
        }
        let (k, v) = line.split_once(':').ok_or("a header line has no ':'")?;
        let k = k.trim();
        let mut value = String::from(v.trim());
        // A folded line continues the value (this client folds a value holding a line break
        // when it publishes). The server does not unfold: a folded message id would be read
        // two ways.
        while let Some(more) = lines.next_if(|l| l.starts_with(is_continuation)) {
            if k == NATS_MSG_ID {
                return Err("the broker and this client would read Nats-Msg-Id differently");
            }
            value.push(' ');
            value.push_str(more.trim());
        }
        if k == NATS_MSG_ID {
            // The server's value ends at the first CR.
            if value.contains('\r') {
                return Err("the broker and this client would read Nats-Msg-Id differently");
            }
            id_lines += 1;
        }
        push_once(map.inner.entry(k.to_string()).or_default(), value);
    }
    if id_lines != usize::from(server_reads_id) {
        return Err("the broker and this client would read Nats-Msg-Id differently");
    }
    Ok(map)
}

impl Deref for HeaderMap {
    type Target = HashMap<String, Vec<String>>;

    fn deref(&self) -> &Self::Target {
        &self.inner
    }
}

impl HeaderMap {
    /// Creates a new header map
    pub fn new() -> HeaderMap {
        HeaderMap::default()
    }

    /// Clears the map, removing all key-value pairs.
    ///
    /// # Examples
    ///
    /// ```
    /// # use nats::HeaderMap;
    /// # use nats::header::STATUS;
    /// let mut map = HeaderMap::new();
    /// map.insert(STATUS, "200".to_string());
    ///
    /// map.clear();
    /// assert!(map.is_empty());
    /// ```
    pub fn clear(&mut self) {
        self.inner.clear();
    }

    /// Returns true if the map contains no elements.
    ///
    ///  # Examples
    ///
    /// ```
    /// # use nats::HeaderMap;
    /// # use nats::header::STATUS;
    /// let mut map = HeaderMap::new();
    ///
    /// assert!(map.is_empty());
    ///
    /// map.insert(STATUS, "200".to_string());
    ///
    /// assert!(!map.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// Returns `true` if the map contains a value for the specified key.
    pub fn contains_key(&self, key: &str) -> bool {
        self.inner.contains_key(key)
    }
}

impl HeaderMap {
    /// Inserts a key-value pair into the map.
    ///
    /// If the map did not previously have this key present, then `None` is
    /// returned.
    ///
    /// If the map did have this key present, the new value is associated with
    /// the key and all previous values are removed.
    ///
    /// # Examples
    ///
    /// ```
    /// # use nats::HeaderMap;
    /// # use nats::header::STATUS;
    /// let mut map = HeaderMap::new();
    /// map.insert(STATUS, "200");
    /// assert!(!map.is_empty());
    ///
    /// let mut previous = map.insert(STATUS, "302").unwrap();
    /// assert_eq!(vec!["200".to_string()], previous);
    /// ```
    pub fn insert<K, V>(&mut self, key: K, value: V) -> Option<Vec<String>>
    where
        K: Into<String>,
        V: Into<String>,
    {
        self.inner.insert(key.into(), vec![value.into()])
    }

    /// Inserts a key-value pair into the map.
    ///
    /// If the map did not previously have this key present, then false is returned.
    ///
    /// If the map did have this key present, the new value is inserted to the end of the set of values currently associated with the key.
    ///
    /// # Examples
    ///
    /// ```
    /// # use nats::HeaderMap;
    /// # use nats::header::STATUS;
    /// let mut map = HeaderMap::new();
    /// map.append(STATUS, "200");
    /// assert!(!map.is_empty());
    /// ```
    pub fn append<K, V>(&mut self, key: K, value: V) -> bool
    where
        K: Into<String>,
        V: Into<String>,
    {
        push_once(self.inner.entry(key.into()).or_default(), value.into())
    }

    /// Returns a reference to the value associated with the key.
    ///
    /// If there are multiple values associated with the key, then the first one
    /// is returned. Use `get_all` to get all values associated with a given
    /// key. Returns `None` if there are no values associated with the key.
    ///
    /// # Examples
    ///
    /// ```
    /// # use nats::HeaderMap;
    /// # use nats::header::STATUS;
    /// let mut map = HeaderMap::new();
    /// assert!(map.get(STATUS).is_none());
    ///
    /// map.insert(STATUS, "200".to_string());
    /// assert_eq!(map.get(STATUS).unwrap(), &"200");
    /// ```
    pub fn get<K: ToString + ?Sized>(&self, key: &K) -> Option<&String> {
        self.inner
            .get(&key.to_string())
            .and_then(|values| values.iter().next())
    }

    /// Returns a view of all values associated with a key.
    ///
    /// The returned view does not incur any allocations and allows iterating
    /// the values associated with the key.  See [`GetAll`] for more details.
    /// Returns `None` if there are no values associated with the key.
    ///
    /// [`GetAll`]: struct.GetAll.html
    ///
    /// # Examples
    ///
    /// ```
    /// # use nats::HeaderMap;
    /// # use nats::header::STATUS;
    /// let mut map = HeaderMap::new();
    ///
    /// map.insert(STATUS, "hello");
    /// map.append(STATUS, "goodbye");
    ///
    /// let values = map.get_all(STATUS);
    ///
    /// // Prints hello, then goodbye: the order they arrived in.
    /// for x in values {
    ///     println!("{}", x);
    /// }
    /// ```
    pub fn get_all<K: ToString + ?Sized>(&self, key: &K) -> GetAll<'_> {
        GetAll {
            map: self,
            key: key.to_string(),
        }
    }

    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        // `<version line>\r\n[headers]\r\n\r\n[payload]\r\n`
        let mut buf = vec![];
        buf.extend_from_slice(b"NATS/1.0\r\n");
        for (k, vs) in &self.inner {
            for v in vs {
                buf.extend_from_slice(k.trim().as_bytes());
                buf.push(b':');
                buf.extend_from_slice(v.trim().as_bytes());
                buf.extend_from_slice(b"\r\n");
            }
        }
        buf.extend_from_slice(b"\r\n");
        buf
    }
}

/// A view to all values stored in a single entry.
///
/// This struct is returned by `HeaderMap::get_all`.
#[derive(Debug)]
pub struct GetAll<'a> {
    map: &'a HeaderMap,
    key: String,
}

impl<'a> GetAll<'a> {
    /// Returns an iterator visiting all values associated with the entry.
    ///
    /// The values are iterated on in the order they first arrived.
    ///
    /// # Examples
    ///
    /// ```
    /// # use nats::HeaderMap;
    /// # use nats::header::STATUS;
    /// let mut map = HeaderMap::new();
    /// map.insert(STATUS, "hello");
    /// map.append(STATUS, "goodbye");
    ///
    /// let values = map.get_all(STATUS);
    ///
    /// // Prints hello, then goodbye: the order they arrived in.
    /// for x in values {
    ///     println!("{}", x);
    /// }
    /// ```
    pub fn iter(&self) -> ValueIter<'a> {
        // This creates a new GetAll struct so that the lifetime
        // isn't bound to &self.
        GetAll {
            map: self.map,
            key: self.key.to_owned(),
        }
        .into_iter()
    }
}

impl<'a> IntoIterator for GetAll<'a> {
    type Item = &'a String;
    type IntoIter = ValueIter<'a>;

    fn into_iter(self) -> ValueIter<'a> {
        ValueIter {
            maybe_inner: self.map.inner.get(&self.key).map(|values| values.iter()),
        }
    }
}

/// Iterator for iterating over values.
pub struct ValueIter<'a> {
    maybe_inner: Option<std::slice::Iter<'a, String>>,
}

impl<'a> Iterator for ValueIter<'a> {
    type Item = &'a String;

    fn next(&mut self) -> Option<Self::Item> {
        match &mut self.maybe_inner {
            Some(inner) => inner.next(),
            None => None,
        }
    }
}

#[cfg(test)]
mod try_from {
    use super::*;

    fn values(h: &HeaderMap, k: &str) -> Option<Vec<String>> {
        h.inner.get(k).cloned()
    }

    fn set(v: &str) -> Option<Vec<String>> {
        Some(vec![v.to_string()])
    }

    #[test]
    fn inline_status() {
        for line in ["NATS/1.0 100", "NATS/1.0  100"] {
            let headers = HeaderMap::try_from(line.as_bytes()).unwrap();
            assert_eq!(headers.status(), Some("100"));
            // The server's status is not a header: a publisher cannot forge it.
            assert_eq!(values(&headers, STATUS), None);
        }
    }

    #[test]
    fn inline_status_with_description() {
        for line in [
            "NATS/1.0 100 Idle Heartbeat",
            "NATS/1.0  100  Idle Heartbeat",
        ] {
            let headers = HeaderMap::try_from(line.as_bytes()).unwrap();
            assert_eq!(headers.status(), Some("100"));
            assert_eq!(headers.description(), Some("Idle Heartbeat"));
        }
        let forged = HeaderMap::try_from("NATS/1.0\r\nStatus: 404\r\n\r\n".as_bytes()).unwrap();
        assert_eq!(forged.status(), None);
        assert_eq!(values(&forged, STATUS), set("404"));
    }

    #[test]
    fn repeated_headers_keep_their_wire_order() {
        // A set would yield either value first, differently per map: svc keeps (and fan-out
        // routes on) a header's first value, which must be the same on every delivery.
        for _ in 0..32 {
            let block = "NATS/1.0\r\nX-Region: eu\r\nX-Region: us\r\nX-Region: eu\r\nX-Tier: b\r\nX-Tier: a\r\n\r\n";
            let headers = HeaderMap::try_from(block.as_bytes()).unwrap();
            assert_eq!(
                values(&headers, "X-Region"),
                Some(vec!["eu".into(), "us".into()])
            );
            assert_eq!(headers.get("X-Tier").map(String::as_str), Some("b"));
            let all: Vec<&String> = headers.get_all("X-Tier").iter().collect();
            assert_eq!(all, ["b", "a"]);
        }
    }

    #[test]
    fn malformed_lines_are_refused() {
        for block in [
            "NATS/1.0 200\r\nX-Test-A a\r\n",
            "NATS/1.0 200\r\nX: a\nNats-Msg-Id: b\r\n",
            "NATS/1.0 200\r\n folded first\r\n",
            "NATS/1.0 200\r\nNats-Msg-Id: a\r\n b\r\n",
            "HTTP/1.0 200\r\n",
        ] {
            let error = HeaderMap::try_from(block.as_bytes()).unwrap_err();
            assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput, "{block:?}");
        }
    }

    #[test]
    fn lines() {
        let headers = HeaderMap::try_from(
            "NATS/1.0 200\r\nAccept-Encoding: json\r\nAuthorization: s3cr3t\r\n\r\nX-C: c\r\n\r\n"
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(values(&headers, "Accept-Encoding"), set("json"));
        assert_eq!(values(&headers, "Authorization"), set("s3cr3t"));
        assert_eq!(values(&headers, "X-C"), set("c"));
        for block in [
            "NATS/1.0 200\r\nX-Test: one,\r\n\ttwo,\r\n\tthree\r\n",
            "NATS/1.0 200\r\nX-Test: one,\r\n two,\r\n three\r\n",
        ] {
            let headers = HeaderMap::try_from(block.as_bytes()).unwrap();
            assert_eq!(values(&headers, "X-Test"), set("one, two, three"));
        }
    }
}
