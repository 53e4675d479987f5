//! What the three cloud monitoring connectors (`oci`, `cloudwatch`, `azure_monitor`) send, before
//! each turns it into its vendor's wire format: the policy-approved metrics flattened into
//! data points with one timestamp.
//!
//! - a counter -> one value (the runner's cumulative count since it started);
//! - a gauge -> one value (non-finite gauges are left out: no cloud API accepts them);
//! - a summary with at least one observation -> one statistic set (count, sum, min, max:
//!   cumulative since the runner started, as the snapshot carries them); a summary without
//!   observations is left out (no cloud accepts a sample count of 0);
//! - with `include_metric_labels_as_dimensions`, each subject-family row of a counter -> one
//!   more value carrying the dimension `subject_family` (the aggregate is still sent without
//!   it). Without the switch, family rows are not sent at all.
//!
//! Names are the exposition names (`<namespace>_<suffix>`); the timestamp of every point is
//! the snapshot's `generated_at_epoch_seconds`.

use super::{metric_name, Context};
use crate::families::LABEL_NAME;
use crate::select::Sample;

/// A point's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Single(f64),
    /// A statistic set (`count` > 0, every number finite).
    Stats {
        count: u64,
        sum: f64,
        min: f64,
        max: f64,
    },
}

/// One data point.
#[derive(Debug, Clone, PartialEq)]
pub struct Datum {
    /// `<namespace>_<suffix>`.
    pub name: String,
    /// The `subject_family` label value, for family rows.
    pub family: Option<String>,
    pub value: Value,
}

impl Datum {
    /// The dimension the family row adds, if any: `(subject_family, <value>)`.
    pub fn family_dimension(&self) -> Option<(&'static str, &str)> {
        self.family.as_deref().map(|f| (LABEL_NAME, f))
    }
}

/// The approved metrics as data points, in the selection's order (sorted by suffix), each
/// metric's family rows right after its aggregate.
pub fn data(ctx: &Context<'_>, include_labels: bool) -> Vec<Datum> {
    let mut out = Vec::new();
    for m in &ctx.prepared().selection.metrics {
        let name = metric_name(ctx.policy, &m.suffix);
        match &m.sample {
            Some(Sample::Counter(v)) => out.push(Datum {
                name: name.clone(),
                family: None,
                value: Value::Single(*v as f64),
            }),
            Some(Sample::Gauge(v)) if v.is_finite() => out.push(Datum {
                name: name.clone(),
                family: None,
                value: Value::Single(*v),
            }),
            Some(Sample::Summary(s))
                if s.count > 0 && [s.sum, s.min, s.max].iter().all(|v| v.is_finite()) =>
            {
                out.push(Datum {
                    name: name.clone(),
                    family: None,
                    value: Value::Stats {
                        count: s.count,
                        sum: s.sum,
                        min: s.min,
                        max: s.max,
                    },
                })
            }
            _ => {}
        }
        if include_labels {
            for (label, v) in &m.labeled {
                if v.is_finite() {
                    out.push(Datum {
                        name: name.clone(),
                        family: Some(label.clone()),
                        value: Value::Single(*v),
                    });
                }
            }
        }
    }
    out
}

/// RFC 3339 UTC timestamp with milliseconds (`2024-05-17T12:34:56.250Z`) of epoch seconds.
pub fn rfc3339_millis(epoch_seconds: f64) -> String {
    let millis = (epoch_seconds.max(0.0) * 1000.0).round() as i128;
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(millis * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

/// Fails when the snapshot is older than a vendor's ingestion window (`max_age_seconds`):
/// the service would reject every point, so nothing is sent.
pub fn check_vendor_window(
    block: &str,
    vendor: &str,
    snapshot_age_seconds: f64,
    max_age_seconds: f64,
) -> Result<(), super::ExportError> {
    if snapshot_age_seconds > max_age_seconds {
        return Err(super::ExportError::Render(format!(
            "{block}: the snapshot is {snapshot_age_seconds:.0} s old; {vendor} accepts data points at most {max_age_seconds:.0} s old, so nothing was sent"
        )));
    }
    Ok(())
}

/// A test-only endpoint override read from `var`: `http(s)://<loopback host>[:port]`, without
/// path, credentials, query or fragment. `Ok(None)` when the variable is unset; any other host
/// is refused (the override exists for tests with a local receiver, never for production).
pub fn loopback_override(
    env: &dyn svc_host::Env,
    var: &str,
) -> Result<Option<String>, super::ExportError> {
    use crate::policy::checks::{is_loopback_host, parse_endpoint};
    let Some(url) = env.var(var) else {
        return Ok(None);
    };
    let bad = |why: &str| super::ExportError::Environment(format!("{var} {why}"));
    let ep = parse_endpoint(&url).map_err(bad)?;
    if !is_loopback_host(&ep.host) {
        return Err(bad(
            "must name a loopback host (it is a test hook for a local receiver)",
        ));
    }
    if !(ep.path.is_empty() || ep.path == "/") {
        return Err(bad(
            "must be scheme, host and optional port, without a path",
        ));
    }
    Ok(Some(url.trim_end_matches('/').to_string()))
}

/// The `Host` header value of a base URL (`scheme://host[:port]`).
pub fn host_of(base_url: &str) -> &str {
    base_url
        .split_once("://")
        .map(|(_, rest)| rest)
        .unwrap_or(base_url)
        .trim_end_matches('/')
}

/// Splits `items` into chunks of at most `n` (n >= 1).
pub fn batches<T>(items: &[T], n: u32) -> std::slice::Chunks<'_, T> {
    items.chunks(n.max(1) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339_millis(1_715_949_296.25), "2024-05-17T12:34:56.250Z");
        assert_eq!(rfc3339_millis(0.0), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn vendor_window() {
        assert!(check_vendor_window("cloud_c_monitoring", "Azure Monitor", 10.0, 1200.0).is_ok());
        assert_eq!(
            check_vendor_window("cloud_c_monitoring", "Azure Monitor", 1300.4, 1200.0)
                .unwrap_err()
                .to_string(),
            "cloud_c_monitoring: the snapshot is 1300 s old; Azure Monitor accepts data points at most 1200 s old, so nothing was sent"
        );
    }

    #[test]
    fn batching() {
        let v: Vec<u32> = (0..45).collect();
        let sizes: Vec<usize> = batches(&v, 20).map(|c| c.len()).collect();
        assert_eq!(sizes, vec![20, 20, 5]);
    }
}
