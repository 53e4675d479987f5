//! Broker server-monitoring answers (crates/observe/src/connectors/broker_monitoring.rs): the JSON of
//! the broker's monitoring endpoints (`/varz`, `/jsz`, ...), read by `broker-monitoring-poll`.
//!
//! Calls what `broker_monitoring::fetch` and `poll` run after the HTTP exchange:
//! `read_bounded` (limit from the first input byte), `serde_json::from_slice`, `extract_all`
//! with a fixed list of allowed fields, and `render`.
//! Properties: no panic; a body over the limit is refused; the rendering has no control
//! character, renders only allowed fields (names from `metric_name`), never a string value,
//! and every sample value is a finite number.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc::observe::connectors::broker_monitoring::{
    extract_all, metric_name, read_bounded, render, Poll, RenderOptions,
};
use svc_fuzz::{assert_clean_display, assert_clean_lines, split_selector};

const FIELDS: &[&str] = &[
    "connections",
    "mem",
    "cpu",
    "in_msgs",
    "slow_consumers",
    "jetstream.stats.memory",
    "jetstream.stats.storage",
    "jetstream.config.max_memory",
    "server_id",
    "a.b.c.d",
];

fuzz_target!(|data: &[u8]| {
    let Some((sel, rest)) = split_selector(data) else {
        return;
    };
    let max = [16u64, 256, 4096, 1 << 20][(sel & 3) as usize];
    let bytes = match read_bounded(rest, max) {
        Ok(b) => {
            assert!(b.len() as u64 <= max && b == rest);
            b
        }
        Err(e) => {
            assert!(rest.len() as u64 > max);
            assert_clean_display("read", &e, 1024);
            return;
        }
    };
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return;
    };
    let fields: Vec<String> = FIELDS.iter().map(|s| s.to_string()).collect();
    let endpoint = ["/varz", "/jsz", "/connz"][(sel >> 2) as usize % 3];
    let poll = Poll {
        endpoints: vec![extract_all(endpoint, &doc, &fields)],
    };
    let out = render(
        &poll,
        &RenderOptions {
            namespace: "svc",
            include_help: sel & 16 != 0,
            include_type: sel & 32 != 0,
        },
    );
    assert_clean_lines("broker monitoring exposition", &out);
    let names: Vec<String> = FIELDS
        .iter()
        .map(|f| metric_name("svc", endpoint, f))
        .collect();
    for line in out.lines().filter(|l| !l.starts_with('#')) {
        let (name, value) = line.split_once(' ').expect("name value");
        assert!(
            names.iter().any(|n| n == name),
            "unexpected series {name:?}"
        );
        let v: f64 = value.parse().unwrap_or_else(|_| panic!("value {value:?}"));
        assert!(v.is_finite());
    }
});
