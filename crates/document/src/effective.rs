//! The effective document: while [`capture`] runs, every getter of the strict reader's
//! `ObjectReader` records the value its field ended up with (the value written, or the
//! default it used) at the field's path, in reading order. The readers
//! hold each field's default once, in plain sight; recording them as they are read means
//! `svc show-effective-config` can never drift from what the runner really uses.
//!
//! Only what the document says or what a getter defaulted to is recorded: nothing read from
//! the environment or a file passes through a reader, so no secret can reach the output.
//!
//! A field whose absence means something of its own (the reader asked `has(key)` first, e.g.
//! "TLS unless said otherwise") is recorded as `null` when absent, never as the default: an
//! explicit default would read back with another meaning.

use std::cell::RefCell;

use serde_json::Value;

/// A recorded document, keys in reading order (a `serde_json::Map` here sorts them).
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Leaf(Value),
    Object(Vec<(String, Node)>),
    Array(Vec<Node>),
}

/// What one [`capture`] recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Capture {
    pub tree: Node,
    /// Paths of nested blocks that were absent (recorded as `null`): a caller may try `{}`
    /// there to show their defaults too.
    pub absent_objects: Vec<String>,
}

thread_local! {
    static RECORDER: RefCell<Option<Capture>> = const { RefCell::new(None) };
}

/// Runs `f` with recording on (this thread only) and returns what was recorded.
pub fn capture<T>(f: impl FnOnce() -> T) -> (T, Capture) {
    RECORDER.with(|r| {
        *r.borrow_mut() = Some(Capture {
            tree: Node::Object(Vec::new()),
            absent_objects: Vec::new(),
        })
    });
    let out = f();
    let captured = RECORDER.with(|r| r.borrow_mut().take());
    (out, captured.expect("set above, on this thread"))
}

/// Notes that the nested block at `path` was absent.
pub(crate) fn record_absent_object(path: &str) {
    RECORDER.with(|r| {
        if let Some(c) = r.borrow_mut().as_mut() {
            c.absent_objects.push(path.to_string());
        }
    });
}

/// Sets `value` at a reader path inside a JSON document (creating objects on the way);
/// false when the path runs through something else.
pub fn insert(doc: &mut Value, path: &str, value: Value) -> bool {
    let segments = parse_path(path);
    let Some((last, init)) = segments.split_last() else {
        return false;
    };
    let mut at = doc;
    for s in init {
        at = match (at, s) {
            (Value::Object(m), Segment::Key(k)) => match m.get_mut(k) {
                Some(v) => v,
                None => return false,
            },
            (Value::Array(a), Segment::Index(i)) => match a.get_mut(*i) {
                Some(v) => v,
                None => return false,
            },
            _ => return false,
        };
    }
    match (at, last) {
        (Value::Object(m), Segment::Key(k)) => {
            m.insert(k.clone(), value);
            true
        }
        _ => false,
    }
}

/// Is a capture running? Getters skip building values otherwise.
pub(crate) fn recording() -> bool {
    RECORDER.with(|r| r.borrow().is_some())
}

/// Sets the node at a reader path (`a.b[2].c`), replacing what was there in its place.
pub fn record(path: &str, node: Node) {
    RECORDER.with(|r| {
        if let Some(c) = r.borrow_mut().as_mut() {
            let segments = parse_path(path);
            if !segments.is_empty() {
                set(&mut c.tree, &segments, node);
            }
        }
    });
}

#[derive(Debug, PartialEq)]
enum Segment {
    Key(String),
    Index(usize),
}

/// `a.b[2].c` -> Key(a), Key(b), Index(2), Key(c). Reader paths join keys with `.` and
/// append `[i]` for list items; the names the runtime config nests under (blocks, fan-out
/// children) have neither character.
fn parse_path(path: &str) -> Vec<Segment> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (key, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !key.is_empty() {
            out.push(Segment::Key(key.to_string()));
        }
        while let Some(stripped) = rest.strip_prefix('[') {
            let Some(close) = stripped.find(']') else {
                break;
            };
            if let Ok(i) = stripped[..close].parse() {
                out.push(Segment::Index(i));
            }
            rest = &stripped[close + 1..];
        }
    }
    out
}

/// A recorded JSON object or array becomes a node that can take children.
fn expand(node: &mut Node) {
    if let Node::Leaf(v) = node {
        match v {
            Value::Object(m) => {
                *node = Node::Object(
                    m.iter()
                        .map(|(k, v)| (k.clone(), Node::Leaf(v.clone())))
                        .collect(),
                )
            }
            Value::Array(items) => {
                *node = Node::Array(items.iter().cloned().map(Node::Leaf).collect())
            }
            _ => {}
        }
    }
}

fn set(at: &mut Node, segments: &[Segment], node: Node) {
    let Some((first, rest)) = segments.split_first() else {
        *at = node;
        return;
    };
    expand(at);
    let child = match (at, first) {
        (Node::Object(fields), Segment::Key(k)) => {
            let i = match fields.iter().position(|(name, _)| name == k) {
                Some(i) => i,
                None => {
                    fields.push((k.clone(), Node::Object(Vec::new())));
                    fields.len() - 1
                }
            };
            &mut fields[i].1
        }
        (Node::Array(items), Segment::Index(i)) => {
            while items.len() <= *i {
                items.push(Node::Object(Vec::new()));
            }
            &mut items[*i]
        }
        // A path through a scalar: the document was invalid there; nothing to record.
        _ => return,
    };
    set(child, rest, node);
}

impl Node {
    /// Pretty JSON, two-space indent, keys in recorded order, final newline.
    pub fn to_json_pretty(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, 0);
        out.push('\n');
        out
    }

    fn write(&self, out: &mut String, depth: usize) {
        let pad = |out: &mut String, d: usize| out.push_str(&"  ".repeat(d));
        match self {
            Node::Leaf(Value::Object(m)) if !m.is_empty() => {
                let n = Node::Object(
                    m.iter()
                        .map(|(k, v)| (k.clone(), Node::Leaf(v.clone())))
                        .collect(),
                );
                n.write(out, depth);
            }
            Node::Leaf(Value::Array(a)) if !a.is_empty() => {
                Node::Array(a.iter().cloned().map(Node::Leaf).collect()).write(out, depth)
            }
            Node::Leaf(v) => {
                out.push_str(&serde_json::to_string(v).expect("JSON values always serialize"))
            }
            Node::Object(fields) if fields.is_empty() => out.push_str("{}"),
            Node::Object(fields) => {
                out.push_str("{\n");
                for (i, (k, v)) in fields.iter().enumerate() {
                    pad(out, depth + 1);
                    out.push_str(&serde_json::to_string(k).expect("strings always serialize"));
                    out.push_str(": ");
                    v.write(out, depth + 1);
                    if i + 1 < fields.len() {
                        out.push(',');
                    }
                    out.push('\n');
                }
                pad(out, depth);
                out.push('}');
            }
            Node::Array(items) if items.is_empty() => out.push_str("[]"),
            Node::Array(items) => {
                out.push_str("[\n");
                for (i, v) in items.iter().enumerate() {
                    pad(out, depth + 1);
                    v.write(out, depth + 1);
                    if i + 1 < items.len() {
                        out.push(',');
                    }
                    out.push('\n');
                }
                pad(out, depth);
                out.push(']');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_build_an_ordered_tree() {
        assert_eq!(
            parse_path("sink.routes[1].targets[0].sink"),
            [
                Segment::Key("sink".into()),
                Segment::Key("routes".into()),
                Segment::Index(1),
                Segment::Key("targets".into()),
                Segment::Index(0),
                Segment::Key("sink".into()),
            ]
        );
        let ((), Capture { tree, .. }) = capture(|| {
            record("z", Node::Leaf(json!(1)));
            record("a.b", Node::Leaf(json!("x")));
            record("a.l", Node::Leaf(json!([{"k": 1}, {"k": 2}])));
            record("a.l[1].d", Node::Leaf(json!(true)));
            record("z", Node::Leaf(json!(2)));
        });
        assert_eq!(
            tree.to_json_pretty(),
            "{\n  \"z\": 2,\n  \"a\": {\n    \"b\": \"x\",\n    \"l\": [\n      {\n        \
             \"k\": 1\n      },\n      {\n        \"k\": 2,\n        \"d\": true\n      }\n    \
             ]\n  }\n}\n"
        );
        assert!(!recording());
        record("ignored", Node::Leaf(json!(1)));
        let mut doc = json!({"a": {"l": [{"k": 1}]}});
        assert!(insert(&mut doc, "a.l[0].m", json!({})));
        assert!(!insert(&mut doc, "a.x.y", json!({})));
        assert_eq!(doc, json!({"a": {"l": [{"k": 1, "m": {}}]}}));
    }
}
