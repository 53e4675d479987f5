//! The `sink` block of `type: fanout`: the child sinks, routes with required and optional
//! targets, their waits and timeouts, and what happens to a message no route matches.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::KIND;
use crate::document::reader::{join, ObjectReader};
use crate::message::subject::{SubjectPattern, SubjectRule, SubjectRules};
use crate::sink::SinkConfig;

/// Default waits of an optional target whose child is an object store (spec: 1000 / 5000 ms).
pub const OBJECT_STORE_MINIMUM_WAIT_MS: u64 = 1000;
pub const OBJECT_STORE_TIMEOUT_MS: u64 = 5000;
/// Default waits of an optional target of any other child type: the gate does not wait beyond
/// the required writes; the write may take 5 s.
pub const OTHER_MINIMUM_WAIT_MS: u64 = 0;
pub const OTHER_TIMEOUT_MS: u64 = 5000;
/// Upper bound of both waits.
pub const MAX_WAIT_MS: i64 = 600_000;

/// What happens to a message no route matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmatched {
    /// Permanent failure: DLQ or operator review, never a silent ACK.
    Reject,
    /// Every child is a required target.
    AllRequired,
}

/// One target of a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub sink: String,
    pub required: bool,
    /// Optional targets only: how long the gate may wait for this write (from batch start).
    pub minimum_wait: Duration,
    /// Optional targets only: after this the write counts as timed out.
    pub timeout: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub name: String,
    pub subject: SubjectPattern,
    pub targets: Vec<Target>,
}

impl SubjectRule for Route {
    fn pattern(&self) -> &SubjectPattern {
        &self.subject
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    pub enabled: bool,
    pub target_sink_types: BTreeMap<String, String>,
    pub routes: SubjectRules<Route>,
    pub unmatched: Unmatched,
}

impl Routing {
    /// The targets of one subject among the `children`, or `None` when it must be rejected.
    /// With routing off, and for an unmatched subject under `all_required`, every child is a
    /// required target.
    pub fn targets_for<'r>(
        &'r self,
        children: impl Iterator<Item = &'r String>,
        subject: &str,
    ) -> Option<std::borrow::Cow<'r, [Target]>> {
        use std::borrow::Cow;
        let all_required = |children: &mut dyn Iterator<Item = &'r String>| {
            Cow::Owned(
                children
                    .map(|name| Target {
                        sink: name.clone(),
                        required: true,
                        minimum_wait: Duration::ZERO,
                        timeout: Duration::ZERO,
                    })
                    .collect(),
            )
        };
        let mut children = children;
        if !self.enabled {
            return Some(all_required(&mut children));
        }
        match self.routes.first_match(subject).map(|(_, route)| route) {
            Some(r) => Some(Cow::Borrowed(&r.targets)),
            None => match self.unmatched {
                Unmatched::AllRequired => Some(all_required(&mut children)),
                Unmatched::Reject => None,
            },
        }
    }
}

/// The `fanout` sink block.
#[derive(Debug, Clone, PartialEq)]
pub struct FanoutConfig {
    pub sinks: BTreeMap<String, SinkConfig>,
    pub routing: Routing,
    /// Optional writes per child that may run at once (including abandoned ones).
    pub optional_max_in_flight: usize,
}

fn is_child_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

impl FanoutConfig {
    pub fn read(r: &mut ObjectReader<'_>) -> FanoutConfig {
        let problems = r.problems();
        let mut sinks = BTreeMap::new();
        let sinks_path = r.path_of("sinks");
        match r.raw("sinks") {
            None => r.problem("sinks", "is required"),
            Some(Value::Object(m)) if m.is_empty() => {
                r.problem("sinks", "must name at least one child sink")
            }
            Some(Value::Object(m)) => {
                for (name, v) in m {
                    let path = join(&sinks_path, name);
                    if !is_child_name(name) {
                        problems.push(
                            path.clone(),
                            "child names must be 1 to 64 characters of a-z 0-9 _ -",
                        );
                    }
                    if v.get("type").and_then(Value::as_str) == Some(KIND) {
                        problems.push(
                            join(&path, "type"),
                            "a fan-out child must not itself be a fan-out sink",
                        );
                        continue;
                    }
                    if let Some(c) = SinkConfig::read(ObjectReader::at(path, v, problems)) {
                        sinks.insert(name.clone(), c);
                    }
                }
            }
            Some(_) => r.problem("sinks", "must be an object of child name to sink config"),
        }
        let optional_max_in_flight = r.int_in("optional_max_in_flight", 4, 1, 64) as usize;
        let routing = match r.object("routing") {
            Some(mut rr) => {
                let routing = read_routing(&mut rr, &sinks);
                rr.finish();
                routing
            }
            None => Routing {
                enabled: false,
                target_sink_types: BTreeMap::new(),
                routes: SubjectRules::default(),
                unmatched: Unmatched::Reject,
            },
        };
        FanoutConfig {
            sinks,
            routing,
            optional_max_in_flight,
        }
    }
}

fn read_routing(r: &mut ObjectReader<'_>, sinks: &BTreeMap<String, SinkConfig>) -> Routing {
    let enabled = r.bool_or("enabled", false);
    let unmatched = r.one_of(
        "unmatched",
        Unmatched::Reject,
        &[
            ("reject", Unmatched::Reject),
            ("all_required", Unmatched::AllRequired),
        ],
    );
    let target_sink_types = r.string_map("target_sink_types");
    if !target_sink_types.is_empty() {
        for (name, kind) in &target_sink_types {
            match sinks.get(name) {
                Some(c) if c.kind() != kind => r.problem(
                    "target_sink_types",
                    format!(
                        "{name} is declared {kind} but the child sink is {}",
                        c.kind()
                    ),
                ),
                Some(_) => {}
                None => r.problem(
                    "target_sink_types",
                    format!("{name} is not a child sink in sinks"),
                ),
            }
        }
        for name in sinks.keys() {
            if !target_sink_types.contains_key(name) {
                r.problem(
                    "target_sink_types",
                    format!("must declare the type of {name}"),
                );
            }
        }
    }
    let problems = r.problems();
    let mut routes = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let route_readers = r.objects_at_most("routes", crate::message::subject::MAX_RULES);
    for mut rr in route_readers {
        let name = rr.req_string("name");
        if !name.is_empty() {
            if names.contains(&name) {
                rr.problem("name", "is used by an earlier route");
            }
            names.push(name.clone());
        }
        let subject = match rr.object("match") {
            Some(mut m) => {
                let s = m.req_string("subject");
                m.finish();
                if s.is_empty() {
                    None
                } else {
                    match SubjectPattern::parse(&s) {
                        Ok(p) => Some(p),
                        Err(e) => {
                            rr.problem("match.subject", e.to_string());
                            None
                        }
                    }
                }
            }
            None => {
                rr.problem("match", "is required");
                None
            }
        };
        let targets_path = rr.path_of("targets");
        let mut targets: Vec<Target> = Vec::new();
        match rr.raw("targets") {
            Some(Value::Array(items)) if !items.is_empty() => {
                for (i, item) in items.iter().enumerate() {
                    let path = format!("{targets_path}[{i}]");
                    if let Some(t) = read_target(&path, item, sinks, problems) {
                        if targets.iter().any(|x| x.sink == t.sink) {
                            problems.push(path, format!("names {} twice in one route", t.sink));
                        } else {
                            targets.push(t);
                        }
                    }
                }
                if !targets.is_empty() && !targets.iter().any(|t| t.required) {
                    problems.push(
                        targets_path.clone(),
                        "must include at least one required target (optional targets are not \
                         in the custody path)",
                    );
                }
            }
            None => rr.problem("targets", "is required"),
            Some(_) => rr.problem("targets", "must be a non-empty array"),
        }
        rr.finish();
        if let Some(subject) = subject {
            routes.push(Route {
                name,
                subject,
                targets,
            });
        }
    }
    if enabled && names.is_empty() {
        r.problem(
            "routes",
            "must have at least one route when routing is enabled",
        );
    }
    Routing {
        enabled,
        target_sink_types,
        routes: SubjectRules::new(routes),
        unmatched,
    }
}

fn read_target(
    path: &str,
    item: &Value,
    sinks: &BTreeMap<String, SinkConfig>,
    problems: &crate::document::reader::Problems,
) -> Option<Target> {
    let known = |name: &str, at: String| -> Option<&SinkConfig> {
        let c = sinks.get(name);
        if c.is_none() {
            problems.push(at, format!("{name} is not a child sink in sinks"));
        }
        c
    };
    match item {
        Value::String(name) => {
            known(name, path.to_string())?;
            Some(Target {
                sink: name.clone(),
                required: true,
                minimum_wait: Duration::ZERO,
                timeout: Duration::ZERO,
            })
        }
        Value::Object(_) => {
            let mut r = ObjectReader::at(path.to_string(), item, problems);
            let sink = r.req_string("sink");
            let required = r.bool_or("required", true);
            let min = r.opt_int_in("minimum_wait_ms", 0, MAX_WAIT_MS);
            let timeout = r.opt_int_in("timeout_ms", 1, MAX_WAIT_MS);
            let child = if sink.is_empty() {
                None
            } else {
                known(&sink, r.path_of("sink"))
            };
            if required {
                for (key, v) in [("minimum_wait_ms", min), ("timeout_ms", timeout)] {
                    if v.is_some() {
                        r.problem(key, "applies only to optional targets (required: false)");
                    }
                }
            }
            let object_store = child.is_some_and(|c| c.kind() == "object_store");
            let (dmin, dtimeout) = if object_store {
                (OBJECT_STORE_MINIMUM_WAIT_MS, OBJECT_STORE_TIMEOUT_MS)
            } else {
                (OTHER_MINIMUM_WAIT_MS, OTHER_TIMEOUT_MS)
            };
            let timeout = timeout.map_or(dtimeout, |v| v as u64);
            // An omitted minimum wait never exceeds an explicit, shorter timeout.
            let min = min.map_or(dmin.min(timeout), |v| v as u64);
            if !required && min > timeout {
                r.problem("minimum_wait_ms", "must not exceed timeout_ms");
            }
            r.finish();
            child?;
            Some(Target {
                sink,
                required,
                minimum_wait: if required {
                    Duration::ZERO
                } else {
                    Duration::from_millis(min)
                },
                timeout: if required {
                    Duration::ZERO
                } else {
                    Duration::from_millis(timeout)
                },
            })
        }
        _ => {
            problems.push(
                path.to_string(),
                "must be a child sink name or an object with sink, required, minimum_wait_ms, \
                 timeout_ms",
            );
            None
        }
    }
}
