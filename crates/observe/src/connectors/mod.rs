//! Push connectors of `svc-observe`: one file per connector, one shared path for everything
//! that must behave the same in all of them.
//!
//! ```text
//! CLI <command> <snapshot> <policy> [--dry-run] [--allow-stale]
//!   └─ run_export(connector)
//!        1. switches: top-level `enabled` and the block's own (disabled -> exit 0, no snapshot);
//!           the run's one Deadline (`export_deadline_seconds`) starts here
//!        2. prepare(): read snapshot ─ check_fresh (the one stale check) ─ select (the one filter)
//!        3. connector.plan(): bodies or datagrams, headers with `Secret` values (env resolved here)
//!        4. check_sizes() (the one size guard): any item over its limit -> nothing is sent
//!        5. --dry-run: print the plan with every secret as `<redacted>`; otherwise
//!           deliver(): HTTP requests or datagrams, each through with_retries_until() (the one
//!           loop), every attempt and wait cut to what is left of the deadline
//! ```
//!
//! Shared pieces: [`Secret`] and [`resolve_env`] / [`resolve_headers`] (environment-variable
//! names in, values never stored in the policy, printed, logged or put in an error),
//! [`check_size`], [`Retry`] / [`with_retries`], [`transport`] (HTTP via ureq, UDP and Unix
//! datagram sockets), [`ExportError`] with its exit code, and the [`CONNECTORS`] registry the
//! CLI dispatches on (one entry per export command).
//!
//! A connector is a [`Connector`] value: its command name, help text, policy block, switch and
//! staleness accessors, and either a `plan` function (what to send; the framework does dry
//! run, size guard, retries and reporting) or a `custom` function for connectors that do not
//! fit that shape (a poller). Adding a connector = one `pub mod` line and one registry entry.

pub mod agent_statsd;
pub mod azure_monitor;
pub mod broker_monitoring;
pub mod cloud;
pub mod cloudwatch;
pub mod collector_agent;
pub mod oci;
pub mod otlp;
pub mod search_stack;
pub mod siem_hec;
pub mod statsd;
pub mod syslog;
pub mod transport;

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::policy::{LoadError, Policy, PushSettings};
use crate::select::{self, Selection};
use crate::textfile::read_snapshot;
use svc_snapshot::Snapshot;

mod deadline;
mod error;
mod plan;
mod secret;

pub use deadline::Deadline;
pub use error::ExportError;
pub use plan::*;
pub use secret::*;
pub use transport::{DatagramTarget, HttpReply, Method};

/// Exit codes shared with the rest of `svc-observe`.
pub const EXIT_OK: u8 = 0;
pub const EXIT_FAILURE: u8 = 1;
pub const EXIT_INVALID: u8 = 2;

/// Every export command, in the order `--help` lists them. The CLI dispatches on `command`.
pub const CONNECTORS: &[&Connector] = &[
    &otlp::CONNECTOR,
    &search_stack::CONNECTOR,
    &collector_agent::CONNECTOR,
    &siem_hec::CONNECTOR,
    &statsd::CONNECTOR,
    &agent_statsd::CONNECTOR,
    &syslog::CONNECTOR,
    &oci::CONNECTOR,
    &cloudwatch::CONNECTOR,
    &azure_monitor::CONNECTOR,
];

/// The export command named `command`, if there is one.
pub fn find(command: &str) -> Option<&'static Connector> {
    CONNECTORS.iter().copied().find(|c| c.command == command)
}

// ---------------------------------------------------------------------------------------------
// Snapshot, staleness, selection

/// What every connector starts from: the snapshot and the policy-approved metrics.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub snapshot: Snapshot,
    pub selection: Selection,
}

/// Reads the snapshot, applies the one stale check (`stale_after` of the connector's block,
/// unless `allow_stale`) and the one policy filter ([`select::select`]).
pub fn prepare(
    snapshot_path: &Path,
    policy: &Policy,
    block: &'static str,
    stale_after: Option<f64>,
    allow_stale: bool,
) -> Result<Prepared, ExportError> {
    let snapshot =
        read_snapshot(snapshot_path, policy.expected_owner).map_err(ExportError::Snapshot)?;
    select::check_fresh(&snapshot, stale_after, allow_stale)
        .map_err(|stale| ExportError::Stale { block, stale })?;
    let selection = select::select(&snapshot, policy).map_err(ExportError::Overflow)?;
    Ok(Prepared {
        snapshot,
        selection,
    })
}

// ---------------------------------------------------------------------------------------------
// Size guard

/// The one size guard: `size` must not exceed `limit` (the policy field `field`).
pub fn check_size(field: &str, what: &str, size: usize, limit: u64) -> Result<(), ExportError> {
    if size as u64 > limit {
        Err(ExportError::Oversize {
            field: field.to_string(),
            what: what.to_string(),
            size,
            limit,
        })
    } else {
        Ok(())
    }
}

/// A byte limit and the policy field it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// E.g. `otlp.max_request_bytes`.
    pub field: String,
    pub max: u64,
}

impl Limit {
    pub fn new(block: &str, key: &str, max: u64) -> Limit {
        Limit {
            field: format!("{block}.{key}"),
            max,
        }
    }

    /// The size bound of a block's shared settings.
    pub fn of(block: &str, push: &PushSettings) -> Limit {
        Limit::new(block, push.size_key, push.max_bytes)
    }
}

// ---------------------------------------------------------------------------------------------
// Retries

/// Bounded retries: `max_retries` after the first attempt, `backoff` between attempts
/// (`retry_backoff_seconds`, a fixed delay: the spec's "delay between retries").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Retry {
    pub max_retries: u32,
    pub backoff: Duration,
}

impl Retry {
    pub fn new(max_retries: u32, retry_backoff_seconds: f64) -> Retry {
        Retry {
            max_retries,
            backoff: Duration::from_secs_f64(retry_backoff_seconds.clamp(0.0, 60.0)),
        }
    }

    /// The retry policy of a block's shared settings.
    pub fn of(push: &PushSettings) -> Retry {
        Retry::new(push.max_retries, push.retry_backoff_seconds)
    }

    /// Attempts in total.
    pub fn attempts(&self) -> u32 {
        self.max_retries + 1
    }
}

/// How one attempt failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Worth another attempt (connection refused, timeout, 5xx, 429, 408).
    Retryable(String),
    /// Another attempt would fail the same way (4xx, a rejected body).
    Permanent(String),
}

impl Failure {
    pub fn reason(&self) -> &str {
        match self {
            Failure::Retryable(r) | Failure::Permanent(r) => r,
        }
    }
}

/// The one retry loop: runs `attempt(n)` (n from 1) until it succeeds, fails permanently, or
/// `retry.attempts()` attempts have failed; sleeps `retry.backoff` between attempts. Returns
/// the last failure with the number of attempts made.
pub fn with_retries<T>(
    what: &str,
    retry: &Retry,
    attempt: impl FnMut(u32) -> Result<T, Failure>,
) -> Result<T, (Failure, u32)> {
    with_retries_until(what, retry, None, attempt)
}

/// [`with_retries`] that never sleeps past `end`: the wait before another attempt is cut to
/// what is left (the attempt itself sees the deadline and fails).
pub fn with_retries_until<T>(
    what: &str,
    retry: &Retry,
    end: Option<std::time::Instant>,
    mut attempt: impl FnMut(u32) -> Result<T, Failure>,
) -> Result<T, (Failure, u32)> {
    let total = retry.attempts();
    let mut n = 1;
    loop {
        match attempt(n) {
            Ok(v) => return Ok(v),
            Err(f @ Failure::Permanent(_)) => return Err((f, n)),
            Err(f) if n >= total => return Err((f, n)),
            Err(f) => {
                let wait = match end {
                    Some(end) => retry
                        .backoff
                        .min(end.saturating_duration_since(std::time::Instant::now())),
                    None => retry.backoff,
                };
                log::warn!(
                    "{what}: attempt {n} of {total} failed: {}; retrying in {:.3} s",
                    f.reason(),
                    wait.as_secs_f64()
                );
                std::thread::sleep(wait);
                n += 1;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Connectors and the export command

/// What a connector's function receives.
pub struct Context<'a> {
    pub policy: &'a Policy,
    /// `None` for connectors whose [`Input`] is `PolicyOnly`.
    pub prepared: Option<&'a Prepared>,
    pub dry_run: bool,
    pub allow_stale: bool,
    /// The run's deadline; network steps inside `plan` (e.g. fetching an identity) keep to it.
    pub deadline: Deadline,
}

impl Context<'_> {
    /// The prepared snapshot; connectors with `Input::SnapshotAndPolicy` always have one.
    pub fn prepared(&self) -> &Prepared {
        self.prepared
            .expect("connectors that read a snapshot are called with one")
    }
}

/// Positional arguments of an export command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// `<snapshot_file> <policy_file>`.
    SnapshotAndPolicy,
    /// `<policy_file>` (a connector that does not export the snapshot).
    PolicyOnly,
}

/// What the connector does once switches and snapshot are checked.
#[derive(Clone, Copy)]
pub enum Action {
    /// Build a plan; the framework does size guard, dry run, delivery and the report.
    Plan(fn(&Context<'_>) -> Result<Plan, ExportError>),
    /// Do everything itself (e.g. a poller); must honour `dry_run`. Returns the report line.
    Custom(fn(&Context<'_>, &mut dyn Write) -> Result<String, ExportError>),
}

/// An export connector: everything the CLI needs to run it.
pub struct Connector {
    /// CLI command, e.g. `otlp-export`.
    pub command: &'static str,
    /// Policy block, e.g. `otlp`.
    pub block: &'static str,
    /// One line for the global `--help`.
    pub summary: &'static str,
    /// The command's own `--help` text.
    pub help: &'static str,
    pub input: Input,
    /// The connector's own `enabled` switch (the top-level one is checked by the framework).
    pub enabled: fn(&Policy) -> bool,
    /// The block's shared delivery settings (`stale_after_seconds`, `export_deadline_seconds`,
    /// ...).
    pub push: fn(&Policy) -> &PushSettings,
    pub action: Action,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("command", &self.command)
            .finish()
    }
}

impl PartialEq for Connector {
    fn eq(&self, other: &Self) -> bool {
        self.command == other.command
    }
}

impl Eq for Connector {}

/// Arguments of an export command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportArgs {
    pub snapshot: Option<PathBuf>,
    pub policy: PathBuf,
    pub dry_run: bool,
    pub allow_stale: bool,
}

/// How an export ended without error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Disabled by policy (`enabled=false` or `<block>.enabled=false`); nothing read or sent.
    Disabled(String),
    /// The dry run was printed.
    DryRun,
    /// Delivered; the report line.
    Sent(String),
}

/// Runs an export command: loads the policy, checks the switches, prepares the snapshot, then
/// runs the connector. The returned outcome's text is printed by the caller.
pub fn run_export(
    c: &Connector,
    args: &ExportArgs,
    out: &mut dyn Write,
) -> Result<Outcome, ExportError> {
    let policy = Policy::load(&args.policy).map_err(ExportError::Policy)?;
    run_with_policy(c, &policy, args, out)
}

/// [`run_export`] with a loaded policy.
pub fn run_with_policy(
    c: &Connector,
    policy: &Policy,
    args: &ExportArgs,
    out: &mut dyn Write,
) -> Result<Outcome, ExportError> {
    if !policy.enabled {
        return Ok(Outcome::Disabled("enabled=false".into()));
    }
    if !(c.enabled)(policy) {
        return Ok(Outcome::Disabled(format!("{}.enabled=false", c.block)));
    }
    let push = (c.push)(policy);
    let deadline = Deadline::start(c.block, push.export_deadline_seconds);
    let prepared = match (c.input, &args.snapshot) {
        (Input::SnapshotAndPolicy, Some(path)) => Some(prepare(
            path,
            policy,
            c.block,
            push.stale_after_seconds,
            args.allow_stale,
        )?),
        (Input::SnapshotAndPolicy, None) => {
            return Err(ExportError::Render(format!(
                "{}: a snapshot file is required",
                c.command
            )))
        }
        (Input::PolicyOnly, _) => None,
    };
    let ctx = Context {
        policy,
        prepared: prepared.as_ref(),
        dry_run: args.dry_run,
        allow_stale: args.allow_stale,
        deadline,
    };
    match c.action {
        Action::Custom(f) => {
            let line = f(&ctx, out)?;
            Ok(if args.dry_run {
                Outcome::DryRun
            } else {
                Outcome::Sent(line)
            })
        }
        Action::Plan(f) => {
            let plan = f(&ctx)?;
            check_sizes(&plan)?;
            if args.dry_run {
                write_dry_run(c.command, &plan, out).map_err(ExportError::Output)?;
                return Ok(Outcome::DryRun);
            }
            let sent = deliver(c.block, &plan, &deadline)?;
            Ok(Outcome::Sent(report_line(c, &plan, &sent)))
        }
    }
}

/// `otlp-export: sent 34 metrics in 1 request (12034 bytes) to http://...`.
fn report_line(c: &Connector, plan: &Plan, sent: &Sent) -> String {
    let (unit, dest) = match &plan.delivery {
        Delivery::Http { requests, .. } => (
            "request",
            requests
                .first()
                .map(|r| plan_secrets(plan).scrub(&r.url).into_owned())
                .unwrap_or_default(),
        ),
        Delivery::Datagrams { target, .. } => ("datagram", target.to_string()),
    };
    format!(
        "{}: sent {} metric{} in {} {unit}{} ({} bytes) to {dest}",
        c.command,
        plan.metrics,
        plural(plan.metrics),
        sent.items,
        plural(sent.items),
        sent.bytes
    )
}

/// Runs an export command for the CLI: prints the outcome (stdout) or the error (stderr) and
/// returns the exit code.
pub fn main_export(
    c: &Connector,
    args: &ExportArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    match run_export(c, args, out) {
        Ok(Outcome::Disabled(reason)) => {
            let _ = writeln!(
                out,
                "{}: disabled by policy ({reason}); nothing sent",
                c.command
            );
            EXIT_OK
        }
        Ok(Outcome::DryRun) => EXIT_OK,
        Ok(Outcome::Sent(line)) => {
            let _ = writeln!(out, "{line}");
            EXIT_OK
        }
        Err(ExportError::Policy(LoadError::Invalid(inv))) => {
            let _ = writeln!(err, "Observability policy is invalid:");
            for p in &inv.0 {
                let _ = writeln!(err, "  {p}");
            }
            EXIT_INVALID
        }
        Err(e) => {
            let _ = writeln!(err, "svc-observe {}: {e}", c.command);
            e.exit_code()
        }
    }
}

/// Exported metric name: `<namespace>_<suffix>` (the same name as the text exposition).
pub fn metric_name(policy: &Policy, suffix: &str) -> String {
    format!("{}_{suffix}", policy.namespace)
}

/// Seconds since the epoch -> nanoseconds (clamped at 0; fractions kept to the microsecond).
pub fn epoch_nanos(seconds: f64) -> u64 {
    if !seconds.is_finite() || seconds <= 0.0 {
        return 0;
    }
    let micros = (seconds * 1e6).round();
    (micros as u64).saturating_mul(1000)
}

#[cfg(test)]
mod tests;
