//! `statsd-export`: one datagram per approved aggregate metric to a StatsD daemon over UDP or
//! a Unix datagram socket; the datagram builder is shared with `agent-statsd-export` (the
//! tagged dialect, `agent_statsd.rs`).
//!
//! Every value is sent as a gauge (`<name>:<value>|g`), counters included. The snapshot holds
//! cumulative totals since the runner started; a StatsD counter (`|c`) adds each value it
//! receives to the current flush interval, so sending `1200|c` every export would count the
//! same 1200 messages again and again. A gauge carries "the value is now 1200", which is what
//! the snapshot says; rates are derived downstream from the gauge series (keeping per-export
//! state to send deltas would lose or double counts whenever an export fails or the runner
//! restarts). A summary becomes one datagram with the gauges `<name>_count`, `<name>_sum`
//! and, once observed, `_min`, `_max`, `_last` (one line each).
//!
//! Names: `<metric_prefix>.<suffix>`, or `<namespace>.<suffix>` when `metric_prefix` is unset
//! (the StatsD/Graphite dotted hierarchy). Plain StatsD reads a gauge value with a sign as a
//! delta, so a negative value is sent as `<name>:0|g` followed by `<name>:-x|g` in the same
//! datagram. Values are plain decimals (no exponent); non-finite values are not sent.
//!
//! Best effort: each datagram is tried `max_retries + 1` times at most; failures are counted
//! and the export exits 1 naming how many were sent. A datagram over `max_datagram_bytes`
//! fails the export before anything is sent.

use super::{
    Action, Connector, Context, DatagramTarget, Delivery, ExportError, Input, Limit, Plan, Retry,
};
use crate::exposition::format_value;
use crate::families::LABEL_NAME;
use crate::policy::checks::Transport;
use crate::policy::statsd::Statsd;
use crate::select::{Sample, Selected};

pub const CONNECTOR: Connector = Connector {
    command: "statsd-export",
    block: "statsd",
    summary: "Send the approved aggregates as StatsD gauges (one datagram per metric).",
    help: "\
Usage: svc-observe statsd-export <snapshot_file> <policy_file> [--dry-run] [--allow-stale]

Sends one datagram per approved aggregate metric to the StatsD daemon at statsd.host:port
(UDP) or statsd.socket_path (unixgram); needs enabled and statsd.enabled. Values are gauges
(`<prefix>.<metric>:<value>|g`): the snapshot holds cumulative totals. Best effort: failed
datagrams are counted (statsd.max_retries attempts after the first).

Options:
  --dry-run      Print the datagrams, one per line, instead of sending them
  --allow-stale  Send even if the snapshot is older than statsd.stale_after_seconds

Exit codes: 0 all sent (or disabled by policy), 1 some or all not sent (or snapshot
missing, invalid or stale, or a datagram over statsd.max_datagram_bytes), 2 invalid policy or
usage.
",
    input: Input::SnapshotAndPolicy,
    enabled: |p| p.statsd.enabled,
    push: |p| &p.statsd.push,
    action: Action::Plan(plan),
};

/// The two datagram dialects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dialect {
    /// Plain StatsD: no tags, signed gauge values are deltas.
    Plain,
    /// Tagged (DogStatsD): `|#k:v,...`; gauge values are absolute; optionally the prepared
    /// subject-family rows as extra datagrams tagged `subject_family:<value>`.
    Tagged {
        tags: Vec<(String, String)>,
        family_rows: bool,
    },
}

fn plan(ctx: &Context<'_>) -> Result<Plan, ExportError> {
    datagram_plan(ctx, "statsd", &ctx.policy.statsd, &Dialect::Plain)
}

/// Where a StatsD block sends.
pub fn target(s: &Statsd) -> DatagramTarget {
    match s.transport {
        Transport::Udp => DatagramTarget::Udp {
            host: s.host.clone(),
            port: s.port,
        },
        Transport::Unixgram => DatagramTarget::Unix {
            path: s.socket_path.clone().unwrap_or_default().into(),
        },
    }
}

/// The plan of either dialect.
pub fn datagram_plan(
    ctx: &Context<'_>,
    block: &'static str,
    s: &Statsd,
    dialect: &Dialect,
) -> Result<Plan, ExportError> {
    let p = ctx.prepared();
    let prefix = s.metric_prefix.as_deref().unwrap_or(&ctx.policy.namespace);
    let mut datagrams = Vec::new();
    let mut metrics = 0;
    for m in &p.selection.metrics {
        let name = format!("{prefix}.{}", m.suffix);
        let mut counted = false;
        if let Some(d) = aggregate_datagram(&name, m, dialect) {
            datagrams.push((name.clone(), d.into_bytes()));
            counted = true;
        }
        if let Dialect::Tagged {
            tags,
            family_rows: true,
        } = dialect
        {
            for (label, v) in &m.labeled {
                if !v.is_finite() {
                    continue;
                }
                let mut t = tags.clone();
                t.push((LABEL_NAME.to_string(), tag_value(label)));
                let line = gauge_line(&name, *v, dialect, &t);
                datagrams.push((format!("{name} {LABEL_NAME}={label}"), line.into_bytes()));
                counted = true;
            }
        }
        if counted {
            metrics += 1;
        }
    }
    Ok(Plan {
        delivery: Delivery::Datagrams {
            target: target(s),
            datagrams,
            timeout: s.push.timeout(),
        },
        limit: Limit::of(block, &s.push),
        retry: Retry::of(&s.push),
        metrics,
        redact: Vec::new(),
    })
}

/// The datagram of a metric's unlabeled aggregate (several lines for a summary).
fn aggregate_datagram(name: &str, m: &Selected, dialect: &Dialect) -> Option<String> {
    let tags: &[(String, String)] = match dialect {
        Dialect::Plain => &[],
        Dialect::Tagged { tags, .. } => tags,
    };
    let lines: Vec<String> = match m.sample.as_ref()? {
        Sample::Counter(v) => vec![gauge_line(name, *v as f64, dialect, tags)],
        Sample::Gauge(v) => vec![gauge_line(name, *v, dialect, tags)],
        Sample::Summary(s) => {
            let mut parts = vec![("count", s.count as f64), ("sum", s.sum)];
            if s.count > 0 {
                parts.extend([("min", s.min), ("max", s.max), ("last", s.last)]);
            }
            parts
                .into_iter()
                .filter(|(_, v)| v.is_finite())
                .map(|(part, v)| gauge_line(&format!("{name}_{part}"), v, dialect, tags))
                .collect()
        }
    };
    let lines: Vec<String> = lines.into_iter().filter(|l| !l.is_empty()).collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// One gauge line (two for a negative plain-StatsD value); empty for a non-finite value.
pub fn gauge_line(name: &str, v: f64, dialect: &Dialect, tags: &[(String, String)]) -> String {
    if !v.is_finite() {
        return String::new();
    }
    let suffix = if tags.is_empty() {
        String::new()
    } else {
        let t: Vec<String> = tags.iter().map(|(k, v)| format!("{k}:{v}")).collect();
        format!("|#{}", t.join(","))
    };
    let value = format_value(v);
    if *dialect == Dialect::Plain && v < 0.0 {
        format!("{name}:0|g\n{name}:{value}|g")
    } else {
        format!("{name}:{value}|g{suffix}")
    }
}

/// A tag value from a prepared label: characters outside `[A-Za-z0-9_.:/-]` (a raw pattern's
/// `*` and `>`, anything that would break the `|#k:v,...` syntax) become `_`.
pub fn tag_value(v: &str) -> String {
    v.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.:/-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn gauge_lines() {
        assert_eq!(
            gauge_line("svc.a", 1200.0, &Dialect::Plain, &[]),
            "svc.a:1200|g"
        );
        assert_eq!(
            gauge_line("svc.a", 0.0000001, &Dialect::Plain, &[]),
            "svc.a:0.0000001|g"
        );
        // A signed value is a delta in plain StatsD: set to 0 first.
        assert_eq!(
            gauge_line("svc.a", -2.5, &Dialect::Plain, &[]),
            "svc.a:0|g\nsvc.a:-2.5|g"
        );
        let tagged = Dialect::Tagged {
            tags: Vec::new(),
            family_rows: false,
        };
        let t = tags(&[("env", "prod"), ("team", "core")]);
        assert_eq!(
            gauge_line("svc.a", -2.5, &tagged, &t),
            "svc.a:-2.5|g|#env:prod,team:core"
        );
        assert_eq!(gauge_line("svc.a", f64::NAN, &Dialect::Plain, &[]), "");
        assert_eq!(gauge_line("svc.a", f64::INFINITY, &tagged, &t), "");
    }

    #[test]
    fn tag_values_cannot_break_the_syntax() {
        assert_eq!(tag_value("orders"), "orders");
        assert_eq!(tag_value("orders.>"), "orders._");
        assert_eq!(tag_value("a,b|c#d e"), "a_b_c_d_e");
        assert_eq!(tag_value("deadbeef01234567"), "deadbeef01234567");
    }
}
