//! The `sink` block of `type: fanout`: the child sinks, routes with required and optional
//! targets, their waits and timeouts, and what happens to a message no route matches.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::matcher::{subjects_overlap, Conditions, Facts};
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

/// What happens to a message no route matches (`routing.no_match`, or the older
/// `routing.unmatched`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unmatched {
    /// Permanent failure: DLQ or operator review, never a silent ACK.
    Reject,
    /// Every child is a required target (`unmatched: all_required`).
    AllRequired,
    /// The targets of the route at this index in `routes` (`no_match: default_route`).
    DefaultRoute(usize),
    /// ACK, stored nowhere, counted (`no_match: ignore`, only with `allow_ignore: true`).
    Ignore,
}

/// How matching routes combine (`routing.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The first matching route in order decides.
    First,
    /// The union of every matching route's targets, each child once; the stricter wins.
    All,
}

/// Where a message goes, and why.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision<'r> {
    Deliver {
        targets: Cow<'r, [Target]>,
        /// The names of the routes taken; empty when every child is a required target.
        via: Via<'r>,
    },
    Reject,
    Ignore,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Via<'r> {
    /// Routing disabled, or `unmatched: all_required`.
    AllChildren,
    Route(&'r str),
    /// `mode: all`: every matching route, in order.
    Routes(Vec<&'r str>),
    /// `no_match: default_route`.
    Default(&'r str),
}

impl Via<'_> {
    /// A short text for `svc inspect`.
    pub fn describe(&self) -> String {
        match self {
            Via::AllChildren => "every child (routing disabled or unmatched: all_required)".into(),
            Via::Route(r) => format!("route {r}"),
            Via::Routes(rs) => format!("routes {}", rs.join(", ")),
            Via::Default(r) => format!("default route {r} (no route matched)"),
        }
    }
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
    /// The rest of `match`; empty for a subject-only route.
    pub when: Conditions,
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
    pub mode: Mode,
    /// Every route matches on the subject alone: `first` mode uses the subject index.
    pub subject_only: bool,
}

impl Routing {
    /// Routing off: every child is a required target.
    pub fn disabled() -> Routing {
        Routing {
            enabled: false,
            target_sink_types: BTreeMap::new(),
            routes: SubjectRules::default(),
            unmatched: Unmatched::Reject,
            mode: Mode::First,
            subject_only: true,
        }
    }

    /// Where one normalized message goes among the `children`.
    pub fn decide<'r>(
        &'r self,
        children: impl Iterator<Item = &'r String>,
        facts: &Facts<'_>,
    ) -> Decision<'r> {
        let all_required = |children: &mut dyn Iterator<Item = &'r String>| Decision::Deliver {
            targets: Cow::Owned(children.map(|n| Target::required(n)).collect()),
            via: Via::AllChildren,
        };
        let mut children = children;
        if !self.enabled {
            return all_required(&mut children);
        }
        let chosen = match self.mode {
            Mode::First if self.subject_only => {
                self.routes
                    .first_match(facts.subject)
                    .map(|(_, r)| Decision::Deliver {
                        targets: Cow::Borrowed(&r.targets),
                        via: Via::Route(&r.name),
                    })
            }
            Mode::First => {
                self.routes
                    .iter()
                    .find(|r| r.matches(facts))
                    .map(|r| Decision::Deliver {
                        targets: Cow::Borrowed(&r.targets),
                        via: Via::Route(&r.name),
                    })
            }
            Mode::All => self.union(facts),
        };
        chosen.unwrap_or_else(|| match &self.unmatched {
            Unmatched::AllRequired => all_required(&mut children),
            Unmatched::Reject => Decision::Reject,
            Unmatched::Ignore => Decision::Ignore,
            Unmatched::DefaultRoute(i) => Decision::Deliver {
                targets: Cow::Borrowed(&self.routes[*i].targets),
                via: Via::Default(&self.routes[*i].name),
            },
        })
    }

    /// `mode: all`: every matching route's targets, each child once, the stricter winning.
    fn union<'r>(&'r self, facts: &Facts<'_>) -> Option<Decision<'r>> {
        let mut names: Vec<&'r str> = Vec::new();
        let mut targets: Vec<Target> = Vec::new();
        for r in self.routes.iter().filter(|r| r.matches(facts)) {
            names.push(&r.name);
            for t in &r.targets {
                match targets.iter_mut().find(|x| x.sink == t.sink) {
                    Some(x) => x.merge(t),
                    None => targets.push(t.clone()),
                }
            }
        }
        match names.len() {
            0 => None,
            1 => Some(Decision::Deliver {
                targets: Cow::Owned(targets),
                via: Via::Route(names[0]),
            }),
            _ => Some(Decision::Deliver {
                targets: Cow::Owned(targets),
                via: Via::Routes(names),
            }),
        }
    }

    /// `first` mode: pairs of routes one message could match, earlier route first. The
    /// earlier route takes such a message; `svc validate` prints each pair as a warning.
    pub fn overlaps(&self) -> Vec<(&str, &str)> {
        let mut out = Vec::new();
        if !self.enabled || self.mode != Mode::First {
            return out;
        }
        for (i, a) in self.routes.iter().enumerate() {
            for b in self.routes.iter().skip(i + 1) {
                if subjects_overlap(&a.subject, &b.subject) && a.when.compatible(&b.when) {
                    out.push((a.name.as_str(), b.name.as_str()));
                }
            }
        }
        out
    }
}

impl Route {
    pub fn matches(&self, facts: &Facts<'_>) -> bool {
        self.subject.matches(facts.subject) && self.when.matches(facts)
    }
}

impl Target {
    fn required(sink: &str) -> Target {
        Target {
            sink: sink.to_string(),
            required: true,
            minimum_wait: Duration::ZERO,
            timeout: Duration::ZERO,
        }
    }

    /// Two matched routes name the same child: required beats optional; between two optional
    /// targets the longer minimum wait and the longer timeout win.
    fn merge(&mut self, other: &Target) {
        if self.required || other.required {
            *self = Target::required(&self.sink);
        } else {
            self.minimum_wait = self.minimum_wait.max(other.minimum_wait);
            self.timeout = self.timeout.max(other.timeout);
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
            None => Routing::disabled(),
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
    let mode = r.one_of(
        "mode",
        Mode::First,
        &[("first", Mode::First), ("all", Mode::All)],
    );
    let legacy = r.opt_string("unmatched");
    if legacy
        .as_deref()
        .is_some_and(|u| u != "reject" && u != "all_required")
    {
        r.problem("unmatched", "must be one of: reject, all_required");
    }
    let no_match = r.opt_string("no_match");
    let default_route = r.opt_string("default_route");
    let allow_ignore = r.bool_or("allow_ignore", false);
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
        let (subject, when) = match rr.object("match") {
            Some(mut m) => {
                // Without `subject` a route matches every subject (`>`).
                let s = m.opt_string("subject").unwrap_or_else(|| ">".to_string());
                let when = Conditions::read(&mut m);
                m.finish();
                match SubjectPattern::parse(&s) {
                    Ok(p) => (Some(p), when),
                    Err(e) => {
                        rr.problem("match.subject", e.to_string());
                        (None, when)
                    }
                }
            }
            None => {
                rr.problem("match", "is required");
                (None, Conditions::default())
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
                when,
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
    let unmatched = read_unmatched(r, [legacy, no_match, default_route], allow_ignore, &routes);
    let subject_only = routes.iter().all(|r| r.when.is_empty());
    Routing {
        enabled,
        target_sink_types,
        routes: SubjectRules::new(routes),
        unmatched,
        mode,
        subject_only,
    }
}

/// `no_match` (`reject`, `default_route` with `default_route: <route name>`, `ignore` with
/// `allow_ignore: true`) or the older `unmatched` (`reject`, `all_required`), never both.
fn read_unmatched(
    r: &mut ObjectReader<'_>,
    [legacy, no_match, default_route]: [Option<String>; 3],
    allow_ignore: bool,
    routes: &[Route],
) -> Unmatched {
    if legacy.is_some() && no_match.is_some() {
        r.problem("unmatched", "set either unmatched or no_match, not both");
    }
    let u = match (legacy.as_deref(), no_match.as_deref()) {
        (Some("all_required"), _) => Unmatched::AllRequired,
        (Some("reject"), _) | (None, None | Some("reject")) => Unmatched::Reject,
        (Some(_), _) => Unmatched::Reject,
        (None, Some("ignore")) => {
            if !allow_ignore {
                r.problem(
                    "no_match",
                    "ignore acknowledges unmatched messages without storing them; set \
                     allow_ignore: true to accept that",
                );
            }
            Unmatched::Ignore
        }
        (None, Some("default_route")) => match default_route.as_deref() {
            None => {
                r.problem(
                    "default_route",
                    "is required when no_match is default_route",
                );
                Unmatched::Reject
            }
            Some(name) => match routes.iter().position(|x| x.name == name) {
                Some(i) => Unmatched::DefaultRoute(i),
                None => {
                    r.problem(
                        "default_route",
                        format!("{name} is not the name of a route"),
                    );
                    Unmatched::Reject
                }
            },
        },
        (None, Some(_)) => {
            r.problem("no_match", "must be one of: reject, default_route, ignore");
            Unmatched::Reject
        }
    };
    if default_route.is_some() && !matches!(u, Unmatched::DefaultRoute(_)) {
        r.problem(
            "default_route",
            "applies only when no_match is default_route",
        );
    }
    if allow_ignore && u != Unmatched::Ignore {
        r.problem("allow_ignore", "applies only when no_match is ignore");
    }
    u
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
