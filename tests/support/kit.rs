//! Shared by the operator-kit tests (alert rules, dashboard): the metric names the exporter
//! can really serve, and the `svc_` names a PromQL text refers to.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use svc::observe::catalogue::{Kind, KNOWN, LEGACY_ALIASES};

pub fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Every series name `svc-observe` renders under the `svc` namespace: counters and gauges as
/// is, summaries as `_count`, `_sum`, `_min`, `_max`, `_last` (docs/observe.md).
pub fn exported_names() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for k in KNOWN {
        let base = format!("svc_{}", k.suffix);
        match k.kind {
            Kind::Summary => {
                for s in ["count", "sum", "min", "max", "last"] {
                    out.insert(format!("{base}_{s}"));
                }
            }
            Kind::Counter | Kind::Gauge => {
                out.insert(base);
            }
        }
    }
    for a in LEGACY_ALIASES {
        out.insert(format!("svc_{}", a.alias));
    }
    out
}

/// The `svc_...` identifiers in a PromQL text (regex fragments such as `svc_.+` excluded).
pub fn svc_names(promql: &str) -> BTreeSet<String> {
    let b = promql.as_bytes();
    let mut out = BTreeSet::new();
    let mut i = 0;
    while i < b.len() {
        let starts = b[i..].starts_with(b"svc_")
            && (i == 0
                || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b':'));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
            j += 1;
        }
        let name = &promql[i..j];
        let regex_fragment = j < b.len() && b[j] == b'.';
        if !regex_fragment && !name.ends_with('_') {
            out.insert(name.to_string());
        }
        i = j;
    }
    out
}
