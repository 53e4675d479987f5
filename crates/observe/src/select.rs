//! From snapshot + policy to the approved metric set every connector renders: the shared
//! filter applied to each snapshot section, legacy aliases added, subject-family rows
//! evaluated. Connectors check their own switches first, then call [`select`].

use std::collections::BTreeMap;

use crate::catalogue::{self, Kind};
use crate::families::{self, Overflow};
use crate::filter::Filter;
use crate::policy::Policy;
use svc_snapshot::Snapshot;
use svc_snapshot::Summary;

/// The unlabeled aggregate of one metric.
#[derive(Debug, Clone, PartialEq)]
pub enum Sample {
    Counter(u64),
    Gauge(f64),
    Summary(Summary),
}

/// One approved metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Selected {
    pub suffix: String,
    pub kind: Kind,
    pub help: String,
    /// The unlabeled aggregate; `None` when only subject-family rows exist.
    pub sample: Option<Sample>,
    /// `subject_family` label value -> value, in kept order.
    pub labeled: Vec<(String, f64)>,
}

/// The approved metrics, sorted by suffix.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Selection {
    pub metrics: Vec<Selected>,
}

/// Names the exposition grammar and the lint accept for a kind: counters end in `_total`,
/// nothing else does.
fn well_named(suffix: &str, kind: Kind) -> bool {
    svc_document::grammar::is_metric_name(suffix)
        && suffix.len() <= 128
        && (kind == Kind::Counter) == suffix.ends_with("_total")
}

/// Applies the policy to a snapshot. The caller has checked the connector switches; a policy
/// whose top-level `enabled` is false selects nothing.
pub fn select(snapshot: &Snapshot, policy: &Policy) -> Result<Selection, Overflow> {
    let mut out: BTreeMap<String, Selected> = BTreeMap::new();
    if !policy.enabled {
        return Ok(Selection::default());
    }
    let filter = Filter::new(policy);
    let mut base: BTreeMap<&str, (Kind, Sample)> = BTreeMap::new();
    for (name, v) in &snapshot.counters {
        base.entry(name)
            .or_insert((Kind::Counter, Sample::Counter(*v)));
    }
    for (name, v) in &snapshot.gauges {
        base.entry(name).or_insert((Kind::Gauge, Sample::Gauge(*v)));
    }
    for (name, s) in &snapshot.summaries {
        base.entry(name)
            .or_insert((Kind::Summary, Sample::Summary(*s)));
    }
    for (name, (kind, sample)) in &base {
        if well_named(name, *kind) && filter.allows(name, *kind) {
            out.insert(
                name.to_string(),
                Selected {
                    suffix: name.to_string(),
                    kind: *kind,
                    help: catalogue::help(name),
                    sample: Some(sample.clone()),
                    labeled: Vec::new(),
                },
            );
        }
    }
    for alias in catalogue::LEGACY_ALIASES {
        let Some((kind, sample)) = base.get(alias.target) else {
            continue;
        };
        if base.contains_key(alias.alias) || !well_named(alias.alias, *kind) {
            continue;
        }
        if filter.allows_alias(alias, *kind) {
            out.insert(
                alias.alias.to_string(),
                Selected {
                    suffix: alias.alias.to_string(),
                    kind: *kind,
                    help: format!(
                        "Legacy alias of {}_{}. {}",
                        policy.namespace,
                        alias.target,
                        catalogue::help(alias.target)
                    ),
                    sample: Some(sample.clone()),
                    labeled: Vec::new(),
                },
            );
        }
    }
    for (suffix, labeled) in families::evaluate(snapshot, policy)? {
        match out.get_mut(&suffix) {
            Some(sel) if sel.kind == Kind::Counter => sel.labeled = labeled,
            Some(_) => {} // a name of another kind: never mix types under one name
            None if !base.contains_key(suffix.as_str()) => {
                out.insert(
                    suffix.clone(),
                    Selected {
                        help: catalogue::help(&suffix),
                        suffix,
                        kind: Kind::Counter,
                        sample: None,
                        labeled,
                    },
                );
            }
            None => {}
        }
    }
    Ok(Selection {
        metrics: out.into_values().collect(),
    })
}

/// The snapshot is older than the connector's `stale_after_seconds`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stale {
    pub age_seconds: f64,
    pub limit_seconds: f64,
}

impl std::fmt::Display for Stale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "snapshot is stale: {:.0} s old, stale_after_seconds is {}",
            self.age_seconds, self.limit_seconds
        )
    }
}

impl std::error::Error for Stale {}

/// Fails closed when the snapshot is older than `limit` (unless `allow_stale`).
pub fn check_fresh(
    snapshot: &Snapshot,
    limit: Option<f64>,
    allow_stale: bool,
) -> Result<(), Stale> {
    match limit {
        Some(limit) if !allow_stale => {
            let age = snapshot.age_seconds();
            if age > limit {
                Err(Stale {
                    age_seconds: age,
                    limit_seconds: limit,
                })
            } else {
                Ok(())
            }
        }
        _ => Ok(()),
    }
}
