//! Routing on what the message is: match kinds, `mode`, `no_match`, and their validation.

use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::sink::fanout::matcher::subjects_overlap;

fn sinks() -> serde_json::Value {
    json!({
        "eu": {"type": "file", "directory": "/tmp/svc-route-eu"},
        "general": {"type": "file", "directory": "/tmp/svc-route-general"},
        "audit": {"type": "file", "directory": "/tmp/svc-route-audit"},
    })
}

fn routing(extra: serde_json::Value) -> Result<Routing, Vec<String>> {
    let mut r = json!({"enabled": true});
    for (k, v) in extra.as_object().unwrap() {
        r[k] = v.clone();
    }
    match read_sink(&json!({"type": "fanout", "sinks": sinks(), "routing": r})) {
        Ok(SinkConfig::Fanout(c)) => Ok(c.routing),
        Ok(other) => panic!("{other:?}"),
        Err(p) => Err(p),
    }
}

fn ok(extra: serde_json::Value) -> Routing {
    routing(extra).unwrap_or_else(|p| panic!("{p:?}"))
}

fn refused(extra: serde_json::Value, path: &str, reason: &str) {
    let p = routing(extra).expect_err("must be refused");
    assert!(
        p.iter().any(|x| x.contains(path) && x.contains(reason)),
        "no problem at {path} saying {reason:?} in {p:?}"
    );
}

struct Msg {
    subject: &'static str,
    priority: &'static str,
    classification: &'static str,
    labels: Vec<String>,
    headers: BTreeMap<String, String>,
}

fn msg(subject: &'static str, priority: &'static str, classification: &'static str) -> Msg {
    Msg {
        subject,
        priority,
        classification,
        labels: Vec::new(),
        headers: BTreeMap::new(),
    }
}

impl Msg {
    fn labels(mut self, l: &[&str]) -> Msg {
        self.labels = l.iter().map(|s| s.to_string()).collect();
        self
    }
    fn header(mut self, k: &str, v: &str) -> Msg {
        self.headers.insert(k.into(), v.into());
        self
    }
    fn facts(&self) -> Facts<'_> {
        Facts {
            subject: self.subject,
            marks: Marks::new(
                self.priority,
                self.classification,
                self.labels.iter().map(String::as_str),
            ),
            headers: &self.headers,
        }
    }
}

const CHILDREN: [&str; 3] = ["audit", "eu", "general"];

/// `(route names, sorted "sink" / "sink?" for optional)`, or "reject" / "ignore".
fn route(r: &Routing, m: &Msg) -> String {
    let children: Vec<String> = CHILDREN.iter().map(|s| s.to_string()).collect();
    match r.decide(children.iter(), &m.facts()) {
        Decision::Deliver { targets, via } => {
            let mut t: Vec<String> = targets
                .iter()
                .map(|t| format!("{}{}", t.sink, if t.required { "" } else { "?" }))
                .collect();
            t.sort();
            format!("{} -> {}", via.describe(), t.join(","))
        }
        Decision::Reject => "reject".into(),
        Decision::Ignore => "ignore".into(),
    }
}

#[test]
fn each_match_kind_selects_its_route() {
    let r = ok(json!({"routes": [
        {"name": "by-class", "match": {"classification": ["restricted"]}, "targets": ["eu"]},
        {"name": "by-prio", "match": {"subject": "orders.>", "priority": ["high"]},
         "targets": ["audit"]},
        {"name": "by-labels", "match": {"labels_all": ["eu", "pii"], "labels_none": ["test"]},
         "targets": ["eu", "audit"]},
        {"name": "by-any", "match": {"labels_any": ["fr", "de"]}, "targets": ["eu"]},
        {"name": "by-header", "match": {"headers": {"Tenant": "acme"}}, "targets": ["audit"]},
        {"name": "rest", "match": {"subject": ">"}, "targets": ["general"]},
    ]}));
    assert!(!r.subject_only);
    let cases = [
        (msg("a", "normal", "restricted"), "route by-class -> eu"),
        (msg("orders.x", "high", "public"), "route by-prio -> audit"),
        (msg("other", "high", "public"), "route rest -> general"),
        (
            msg("a", "normal", "public").labels(&["eu", "pii"]),
            "route by-labels -> audit,eu",
        ),
        (
            msg("a", "normal", "public").labels(&["eu", "pii", "test"]),
            "route rest -> general",
        ),
        (
            msg("a", "normal", "public").labels(&["eu"]),
            "route rest -> general",
        ),
        (
            msg("a", "normal", "public").labels(&["de"]),
            "route by-any -> eu",
        ),
        (
            msg("a", "normal", "public").header("Tenant", "acme"),
            "route by-header -> audit",
        ),
        (
            msg("a", "normal", "public").header("Tenant", "acmeX"),
            "route rest -> general",
        ),
    ];
    for (m, want) in &cases {
        assert_eq!(route(&r, m), *want, "{:?} {:?}", m.subject, m.labels);
    }
}

#[test]
fn today_subject_only_routes_still_read_and_use_the_index() {
    let r = ok(json!({"routes": [
        {"name": "a", "match": {"subject": "orders.*"}, "targets": ["eu"]},
        {"name": "b", "match": {"subject": "orders.>"}, "targets": ["general"]},
    ], "unmatched": "all_required"}));
    assert!(r.subject_only);
    assert_eq!(r.mode, Mode::First);
    assert_eq!(route(&r, &msg("orders.x", "n", "c")), "route a -> eu");
    assert_eq!(
        route(&r, &msg("orders.x.y", "n", "c")),
        "route b -> general"
    );
    assert!(route(&r, &msg("x", "n", "c")).ends_with("-> audit,eu,general"));
}

#[test]
fn mode_all_unites_targets_once_and_the_stricter_wins() {
    let r = ok(json!({"mode": "all", "routes": [
        {"name": "restricted", "match": {"classification": ["restricted"]}, "targets": [
            "eu", {"sink": "audit", "required": false, "minimum_wait_ms": 100, "timeout_ms": 900}]},
        {"name": "eu", "match": {"labels_any": ["eu"]}, "targets": [
            "eu", {"sink": "audit", "required": false, "minimum_wait_ms": 300, "timeout_ms": 500},
            {"sink": "general", "required": false}]},
        {"name": "audit-all", "match": {"priority": ["high"]}, "targets": ["audit"]},
    ]}));
    let both = msg("s", "normal", "restricted").labels(&["eu"]);
    assert_eq!(
        route(&r, &both),
        "routes restricted, eu -> audit?,eu,general?"
    );
    let children: Vec<String> = CHILDREN.iter().map(|s| s.to_string()).collect();
    let Decision::Deliver { targets, .. } = r.decide(children.iter(), &both.facts()) else {
        panic!("not delivered");
    };
    let audit = targets.iter().find(|t| t.sink == "audit").unwrap();
    assert_eq!(audit.minimum_wait, Duration::from_millis(300));
    assert_eq!(audit.timeout, Duration::from_millis(900));
    // A required target beats an optional one for the same child.
    let high = msg("s", "high", "restricted");
    assert_eq!(route(&r, &high), "routes restricted, audit-all -> audit,eu");
    assert_eq!(route(&r, &msg("s", "low", "public")), "reject");
}

#[test]
fn no_match_forms() {
    let routes = json!([
        {"name": "eu", "match": {"labels_all": ["eu"]}, "targets": ["eu"]},
        {"name": "fallback", "match": {"subject": "never.used"}, "targets": ["general"]},
    ]);
    let plain = msg("x", "n", "c");
    let r = ok(json!({"routes": routes}));
    assert_eq!(route(&r, &plain), "reject");
    let r = ok(json!({"routes": routes, "no_match": "default_route",
                      "default_route": "fallback"}));
    assert_eq!(
        route(&r, &plain),
        "default route fallback (no route matched) -> general"
    );
    let r = ok(json!({"routes": routes, "no_match": "ignore", "allow_ignore": true}));
    assert_eq!(route(&r, &plain), "ignore");
    assert_eq!(route(&r, &plain.labels(&["eu"])), "route eu -> eu");
    refused(
        json!({"routes": routes, "no_match": "ignore"}),
        "routing.no_match",
        "allow_ignore",
    );
    refused(
        json!({"routes": routes, "no_match": "default_route", "default_route": "nope"}),
        "routing.default_route",
        "nope is not the name of a route",
    );
    refused(
        json!({"routes": routes, "no_match": "default_route"}),
        "routing.default_route",
        "is required",
    );
    refused(
        json!({"routes": routes, "no_match": "reject", "unmatched": "reject"}),
        "routing.unmatched",
        "not both",
    );
    refused(
        json!({"routes": routes, "no_match": "drop"}),
        "routing.no_match",
        "one of",
    );
    refused(
        json!({"routes": routes, "allow_ignore": true}),
        "routing.allow_ignore",
        "only",
    );
}

#[test]
fn a_route_no_message_could_match_is_refused() {
    let one =
        |m: serde_json::Value| json!({"routes": [{"name": "r", "match": m, "targets": ["eu"]}]});
    let at = "routing.routes[0].match";
    for key in [
        "priority",
        "classification",
        "labels_all",
        "labels_any",
        "labels_none",
    ] {
        refused(one(json!({key: []})), &format!("{at}.{key}"), "empty list");
    }
    refused(
        one(json!({"headers": {}})),
        &format!("{at}.headers"),
        "is empty",
    );
    refused(
        one(json!({"labels_all": ["eu", "x"], "labels_none": ["eu"]})),
        &format!("{at}.labels_none"),
        "eu is also in labels_all",
    );
    refused(
        one(json!({"labels_any": ["a", "b"], "labels_none": ["a", "b", "c"]})),
        &format!("{at}.labels_any"),
        "also in labels_none",
    );
    refused(
        one(json!({"headers": {"X-Api-Token": "t"}})),
        &format!("{at}.headers.X-Api-Token"),
        "secret",
    );
    refused(one(json!({"colour": ["red"]})), &format!("{at}.colour"), "");
}

#[test]
fn overlapping_routes_in_first_mode_are_named() {
    let r = ok(json!({"routes": [
        {"name": "restricted", "match": {"classification": ["restricted"]}, "targets": ["eu"]},
        {"name": "public", "match": {"classification": ["public"]}, "targets": ["general"]},
        {"name": "eu", "match": {"labels_all": ["eu"], "subject": "orders.*"}, "targets": ["eu"]},
        {"name": "not-eu", "match": {"labels_none": ["eu"], "subject": "orders.>"},
         "targets": ["general"]},
    ]}));
    let o = r.overlaps();
    assert!(o.contains(&("restricted", "eu")), "{o:?}");
    assert!(o.contains(&("restricted", "not-eu")), "{o:?}");
    assert!(!o.contains(&("restricted", "public")), "{o:?}");
    assert!(!o.contains(&("eu", "not-eu")), "{o:?}");
    let all = ok(json!({"mode": "all", "routes": [
        {"name": "a", "match": {"subject": ">"}, "targets": ["eu"]},
        {"name": "b", "match": {"subject": ">"}, "targets": ["eu"]},
    ]}));
    assert!(all.overlaps().is_empty());
}

#[test]
fn subject_overlap_follows_wildcards() {
    let p = |s: &str| SubjectPattern::parse(s).unwrap();
    assert!(subjects_overlap(&p("a.*"), &p("a.b")));
    assert!(subjects_overlap(&p("a.>"), &p("*.b.c")));
    assert!(!subjects_overlap(&p("a.*"), &p("a.b.c")));
    assert!(!subjects_overlap(&p("a.b"), &p("a.c")));
    assert!(!subjects_overlap(&p("a"), &p("a.>")));
    assert!(subjects_overlap(&p(">"), &p("x.y")));
}

#[test]
fn ignored_messages_are_acknowledged_counted_and_written_nowhere() {
    let r = ok(json!({"routes": [
        {"name": "eu", "match": {"labels_all": ["eu"]}, "targets": ["eu"]},
    ], "no_match": "ignore", "allow_ignore": true}));
    let eu = Scripted::new(0, Behavior::Durable);
    let general = Scripted::new(0, Behavior::Durable);
    let (sink, m) = fanout(vec![("eu", eu.clone()), ("general", general.clone())], r, 4);
    let mut tagged = env("s", 1);
    tagged.labels_list = vec!["eu".into()];
    let out = sink.write_batch(&[tagged, env("s", 2)]);
    assert!(
        out.iter().all(|o| matches!(o, WriteOutcome::Durable)),
        "{out:?}"
    );
    assert_eq!(eu.seqs(), vec![1]);
    assert!(general.seqs().is_empty());
    assert_eq!(count(&m, "fanout_messages_ignored_total"), 1);
    assert_eq!(count(&m, "fanout_messages_routed_total"), 1);
}

/// Found by the attack on the routing (issue 45): route values are compared as a message's
/// are read, without case and trimmed, so `labels_none: ["PII"]` excludes a message labelled
/// `pii` and `classification: ["RESTRICTED"]` matches it however the vocabulary spells it; a
/// value no message can carry (`"eu,pii"`) is refused instead of never matching.
#[test]
fn route_values_compare_as_message_values_are_read() {
    let r = ok(json!({"routes": [
        {"name": "restricted", "match": {"classification": ["RESTRICTED"]}, "targets": ["eu"]},
        {"name": "no-pii", "match": {"labels_none": ["PII"], "priority": [" High "]},
         "targets": ["general"]},
        {"name": "rest", "match": {"subject": ">"}, "targets": ["audit"]},
    ]}));
    for spelled in ["restricted", "RESTRICTED"] {
        assert_eq!(
            route(&r, &msg("a", "normal", spelled)),
            "route restricted -> eu",
            "{spelled}"
        );
    }
    assert_eq!(
        route(&r, &msg("a", "high", "public").labels(&["pii"])),
        "route rest -> audit"
    );
    assert_eq!(
        route(&r, &msg("a", "HIGH", "public").labels(&["eu"])),
        "route no-pii -> general"
    );
    for bad in [
        json!({"labels_all": ["eu,pii"]}),
        json!({"labels_none": ["pii!"]}),
    ] {
        let key = bad.as_object().unwrap().keys().next().unwrap().clone();
        refused(
            json!({"routes": [{"name": "r", "match": bad, "targets": ["eu"]}]}),
            &key,
            "is not a value a message can carry",
        );
    }
}
