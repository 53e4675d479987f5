//! Metrics snapshot (`svc.metrics.snapshot.v1`): a file the exporter does not own, read on
//! every scrape and export.
//!
//! Calls `Snapshot::parse` and `Snapshot::check_times` (what `observe::textfile::read_snapshot`
//! runs on the file's text), then `observe::select::select` and `observe::exposition::render` with a policy that admits
//! every metric and subject family, as a scrape does.
//! Properties: no panic; a refusal renders (Display) without control characters and bounded;
//! an accepted snapshot round-trips through its JSON form; the exposition it renders has no
//! control character in any line and every sample line is `name[{labels}] value`.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use svc::metrics::snapshot::Snapshot;
use svc::observe::exposition::{self, Options};
use svc::observe::policy::Policy;
use svc::observe::select;
use svc_fuzz::{assert_clean_display, assert_clean_lines, MAX_ERROR_CHARS};

const POLICY: &str = r#"{
  "schema": "svc.observability.policy.v1",
  "enabled": true,
  "allowed_metric_patterns": ["*"],
  "include_observations": true,
  "include_legacy": true,
  "scrape": {"enabled": true, "include_help": true, "include_type": true},
  "subject_metrics": {"enabled": true, "max_subject_families": 20,
    "rules": [{"subject": "orders.>", "label": "orders"}, {"subject": "orders.eu.>", "label": "orders_eu"}]}
}"#;

fn policy() -> &'static Policy {
    static P: OnceLock<Policy> = OnceLock::new();
    P.get_or_init(|| Policy::parse(POLICY).unwrap_or_else(|e| panic!("harness policy: {e}")))
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let snap = match Snapshot::parse(text) {
        Ok(s) => s,
        Err(reason) => {
            assert_clean_display("snapshot refusal", &reason, MAX_ERROR_CHARS);
            return;
        }
    };
    // What read_snapshot checks next: the times, against a fixed "now".
    if let Err(why) = snap.check_times(1_718_000_000.0) {
        assert_clean_display("snapshot times", &why, MAX_ERROR_CHARS);
    }
    let json = serde_json::to_string(&snap).expect("a parsed snapshot serializes");
    assert_eq!(
        Snapshot::parse(&json).as_ref(),
        Ok(&snap),
        "snapshot round-trips"
    );

    let policy = policy();
    match select::select(&snap, policy) {
        Ok(selection) => {
            let out = exposition::render(
                &selection,
                &Options {
                    namespace: &policy.namespace,
                    include_help: true,
                    include_type: true,
                },
            );
            assert_clean_lines("exposition", &out);
            for line in out.lines().filter(|l| !l.starts_with('#')) {
                let (series, value) = line.rsplit_once(' ').expect("sample line has a value");
                assert!(
                    !value.is_empty() && !series.is_empty(),
                    "sample line {line:?}"
                );
                let name = series.split('{').next().unwrap();
                assert!(
                    svc::document::grammar::is_metric_name(name),
                    "metric name {name:?} in line {line:?}"
                );
            }
        }
        Err(overflow) => assert_clean_display("overflow", &overflow.to_string(), MAX_ERROR_CHARS),
    }
});
