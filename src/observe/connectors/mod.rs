//! Push connectors of `svc-observe`: one file per connector, one shared path for everything
//! that must behave the same in all of them.
//!
//! ```text
//! CLI <command> <snapshot> <policy> [--dry-run] [--allow-stale]
//!   └─ run_export(connector)
//!        1. switches: top-level `enabled` and the block's own (disabled -> exit 0, no snapshot)
//!        2. prepare(): read snapshot ─ check_fresh (the one stale check) ─ select (the one filter)
//!        3. connector.plan(): bodies or datagrams, headers with `Secret` values (env resolved here)
//!        4. check_sizes() (the one size guard): any item over its limit -> nothing is sent
//!        5. --dry-run: print the plan with every secret as `<redacted>`; otherwise
//!           deliver(): HTTP requests or datagrams, each through with_retries() (the one loop)
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
pub mod broker_monitoring;
pub mod cloud;
pub mod cloud_a;
pub mod cloud_b;
pub mod cloud_c;
pub mod collector_agent;
pub mod oci_auth;
pub mod oci_instance;
pub mod oci_signature;
pub mod otlp;
pub mod search_stack;
pub mod siem_hec;
pub mod statsd;
pub mod syslog;
pub mod transport;

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::document::grammar::is_env_var_name;
use crate::metrics::snapshot::Snapshot;
use crate::observe::families::Overflow;
use crate::observe::policy::checks::RESERVED_HEADERS;
use crate::observe::policy::{LoadError, Policy};
use crate::observe::select::{self, Selection, Stale};
use crate::observe::textfile::{read_snapshot, SnapshotError};

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
    &cloud_a::CONNECTOR,
    &cloud_b::CONNECTOR,
    &cloud_c::CONNECTOR,
];

/// The export command named `command`, if there is one.
pub fn find(command: &str) -> Option<&'static Connector> {
    CONNECTORS.iter().copied().find(|c| c.command == command)
}

// ---------------------------------------------------------------------------------------------
// Secrets

/// A value resolved from the environment at export time (a token, a header value). It is
/// never stored in the policy, and its `Debug` and `Display` print `<redacted>`, so it cannot
/// reach a log line, an error or dry-run output by accident. Only [`Secret::expose`] gives the
/// value, for the one place that puts it on the wire.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    value: String,
    /// Where the credential itself starts (after a scheme prefix such as `Splunk `), so output
    /// can be scrubbed of the bare credential too: a receiver may echo it without the prefix.
    credential_at: usize,
}

/// What a secret prints as.
pub const REDACTED: &str = "<redacted>";

impl Secret {
    /// Wraps a value (for values derived from secrets, e.g. `Splunk <token>`).
    pub fn new(value: String) -> Secret {
        Secret {
            value,
            credential_at: 0,
        }
    }

    /// The value, for the wire only.
    pub fn expose(&self) -> &str {
        &self.value
    }

    /// The credential without any scheme prefix; for scrubbing output only.
    fn credential(&self) -> &str {
        &self.value[self.credential_at..]
    }

    /// A secret made of a prefix and this secret (`Splunk ` + token, `Bearer ` + token).
    pub fn prefixed(&self, prefix: &str) -> Secret {
        Secret {
            value: format!("{prefix}{}", self.value),
            credential_at: prefix.len() + self.credential_at,
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// Reads the environment variable `var` for the policy field `field` (e.g.
/// `siem_hec.token_env`). Unset, empty, non-UTF-8 or multi-line values are errors naming the
/// field and the variable, never the value.
pub fn resolve_env(field: &str, var: &str) -> Result<Secret, ExportError> {
    resolve_env_with(field, var, &|v| std::env::var_os(v))
}

/// [`resolve_env`] over any lookup (tests pass a map).
pub fn resolve_env_with(
    field: &str,
    var: &str,
    lookup: &dyn Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<Secret, ExportError> {
    let problem = |why: &str| ExportError::Environment(format!("{field}: {why}"));
    if !is_env_var_name(var) {
        return Err(problem("does not name a valid environment variable"));
    }
    let Some(raw) = lookup(var) else {
        return Err(problem(&format!("environment variable {var} is not set")));
    };
    let Ok(value) = raw.into_string() else {
        return Err(problem(&format!(
            "environment variable {var} is not valid UTF-8"
        )));
    };
    if value.is_empty() {
        return Err(problem(&format!("environment variable {var} is empty")));
    }
    // A header value must be one line of visible characters (CR/LF would split the request).
    if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
        return Err(problem(&format!(
            "environment variable {var} contains a line break or NUL"
        )));
    }
    Ok(Secret::new(value))
}

/// Resolves a `headers_env` map (header name -> variable name) of block `block`. Headers in
/// `reserved` (compared case-insensitively) are refused here too, whatever validation said,
/// so a connector's own headers (`Authorization` of the SIEM, `Content-Type`) cannot be
/// overridden at send time.
pub fn resolve_headers(
    block: &str,
    headers_env: &BTreeMap<String, String>,
    reserved: &[&str],
) -> Result<Vec<Header>, ExportError> {
    let mut out = Vec::with_capacity(headers_env.len());
    for (name, var) in headers_env {
        let field = format!("{block}.headers_env.{name}");
        if reserved.iter().any(|r| r.eq_ignore_ascii_case(name))
            || RESERVED_HEADERS
                .iter()
                .any(|r| r.eq_ignore_ascii_case(name))
        {
            return Err(ExportError::Environment(format!(
                "{field}: is set by the connector and cannot be overridden"
            )));
        }
        out.push(Header::secret(name, resolve_env(&field, var)?));
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Errors

/// Why an export did not complete. `Display` names the connector block first and never
/// contains a secret value.
#[derive(Debug)]
pub enum ExportError {
    /// The policy file could not be read or is invalid (exit 2).
    Policy(LoadError),
    /// A variable the policy names is missing or unusable, or a header is reserved (exit 2).
    Environment(String),
    /// The snapshot is missing, unreadable or invalid (exit 1).
    Snapshot(SnapshotError),
    /// The snapshot is older than the connector's `stale_after_seconds` (exit 1).
    Stale { block: &'static str, stale: Stale },
    /// Subject families over the limit with `overflow_action` `fail_closed` (exit 1).
    Overflow(Overflow),
    /// A request, datagram or message over its limit: nothing was sent (exit 1).
    Oversize {
        /// The limit's policy field, e.g. `otlp.max_request_bytes`.
        field: String,
        /// What is too large, e.g. `request body` or `datagram 3 (svc.messages_acked_total)`.
        what: String,
        size: usize,
        limit: u64,
    },
    /// Rendering failed (a value the format cannot carry, ...) (exit 1).
    Render(String),
    /// Sending failed after the bounded retries; `sent` of `total` items made it (exit 1).
    Send {
        block: &'static str,
        sent: usize,
        total: usize,
        /// Short reason of the last failure (no secret, no body).
        last: String,
    },
    /// Writing the dry-run output failed (exit 1).
    Output(std::io::Error),
}

impl ExportError {
    /// The process exit code for this error: 2 for invalid input, 1 for runtime failures.
    pub fn exit_code(&self) -> u8 {
        match self {
            ExportError::Policy(_) | ExportError::Environment(_) => EXIT_INVALID,
            _ => EXIT_FAILURE,
        }
    }
}

impl fmt::Display for ExportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExportError::Policy(e) => write!(f, "{e}"),
            ExportError::Environment(e) => f.write_str(e),
            ExportError::Snapshot(e) => write!(f, "metrics withheld: {e}"),
            ExportError::Stale { block, stale } => write!(
                f,
                "metrics withheld: {stale} ({block}.stale_after_seconds; --allow-stale overrides)"
            ),
            ExportError::Overflow(e) => write!(f, "metrics withheld: {e}"),
            ExportError::Oversize {
                field,
                what,
                size,
                limit,
            } => write!(
                f,
                "{what} is {size} bytes, over {field} {limit}; nothing was sent"
            ),
            ExportError::Render(e) => f.write_str(e),
            ExportError::Send {
                block,
                sent,
                total,
                last,
            } => write!(f, "{block}: sent {sent} of {total}; last failure: {last}"),
            ExportError::Output(e) => write!(f, "cannot write the dry-run output: {e}"),
        }
    }
}

impl std::error::Error for ExportError {}

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
    let snapshot = read_snapshot(snapshot_path).map_err(ExportError::Snapshot)?;
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
                log::warn!(
                    "{what}: attempt {n} of {total} failed: {}; retrying in {:.3} s",
                    f.reason(),
                    retry.backoff.as_secs_f64()
                );
                std::thread::sleep(retry.backoff);
                n += 1;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Plans: what a connector wants sent

/// A request header value: plain (shown by `--dry-run`) or secret (shown as `<redacted>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderValue {
    Plain(String),
    Secret(Secret),
}

/// One request header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    pub value: HeaderValue,
}

impl Header {
    pub fn plain(name: &str, value: &str) -> Header {
        Header {
            name: name.to_string(),
            value: HeaderValue::Plain(value.to_string()),
        }
    }

    pub fn secret(name: &str, value: Secret) -> Header {
        Header {
            name: name.to_string(),
            value: HeaderValue::Secret(value),
        }
    }

    /// The value for the wire.
    pub fn wire_value(&self) -> &str {
        match &self.value {
            HeaderValue::Plain(v) => v,
            HeaderValue::Secret(s) => s.expose(),
        }
    }
}

/// Checks a 2xx response body; an `Err` is a permanent failure (e.g. a HEC answer with a
/// non-zero `code`, a cloud API reporting rejected metrics inside a 200).
pub type BodyCheck = fn(&[u8]) -> Result<(), String>;

/// One HTTP request of a plan.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    pub method: Method,
    /// Validated by the policy: http(s), no credentials, no query.
    pub url: String,
    /// Every header, including `Content-Type`.
    pub headers: Vec<Header>,
    pub body: Vec<u8>,
    /// Optional check of a 2xx answer's body.
    pub check: Option<BodyCheck>,
    /// Short description for reports and errors, e.g. `OTLP request (34 metrics)`.
    pub what: String,
}

/// What a connector wants delivered.
#[derive(Debug, Clone)]
pub enum Delivery {
    /// HTTP requests, sent in order; each one retried on its own.
    Http {
        requests: Vec<HttpRequest>,
        timeout: Duration,
        /// Largest response body read (longer answers are cut, never loaded unbounded).
        max_response_bytes: u64,
    },
    /// Datagrams over UDP or a Unix datagram socket, best effort: each datagram retried on
    /// its own, failures counted and reported.
    Datagrams {
        target: DatagramTarget,
        /// `(what, bytes)`: `what` names the metric for errors and reports.
        datagrams: Vec<(String, Vec<u8>)>,
        timeout: Duration,
    },
}

/// A connector's plan: the delivery, the size limit every item must respect, the retry
/// policy, and strings the dry run must hide besides header secrets (e.g. a cloud
/// compartment id in a body).
#[derive(Debug, Clone)]
pub struct Plan {
    pub delivery: Delivery,
    pub limit: Limit,
    pub retry: Retry,
    /// Approved metrics represented (for the report line).
    pub metrics: usize,
    /// Strings replaced by `<redacted>` in dry-run output and error excerpts.
    pub redact: Vec<String>,
}

/// The one size guard over a whole plan: every item is checked before anything is sent.
pub fn check_sizes(plan: &Plan) -> Result<(), ExportError> {
    match &plan.delivery {
        Delivery::Http { requests, .. } => {
            for r in requests {
                check_size(&plan.limit.field, &r.what, r.body.len(), plan.limit.max)?;
            }
        }
        Delivery::Datagrams { datagrams, .. } => {
            for (what, bytes) in datagrams {
                check_size(&plan.limit.field, what, bytes.len(), plan.limit.max)?;
            }
        }
    }
    Ok(())
}

/// Replaces every secret value and every `redact` string in `text` with `<redacted>`.
pub fn scrub(text: &str, secrets: &[&str]) -> String {
    let mut out = text.to_string();
    for s in secrets {
        if !s.is_empty() {
            out = out.replace(s, REDACTED);
        }
    }
    out
}

/// Values to scrub from anything printed about `plan`: header secrets and `plan.redact`.
fn plan_secrets(plan: &Plan) -> Vec<&str> {
    let mut v: Vec<&str> = plan.redact.iter().map(String::as_str).collect();
    if let Delivery::Http { requests, .. } = &plan.delivery {
        for r in requests {
            for h in &r.headers {
                if let HeaderValue::Secret(s) = &h.value {
                    // The whole value first, so `Splunk <redacted>` never half-shows.
                    v.push(s.expose());
                    v.push(s.credential());
                }
            }
        }
    }
    v
}

/// Writes the `--dry-run` rendering of a plan: for HTTP, the request line, headers (secret
/// values as `<redacted>`) and body of each request; for datagrams, one datagram per line
/// (line breaks inside a datagram written as `\n`).
pub fn write_dry_run(
    command: &str,
    plan: &Plan,
    out: &mut dyn Write,
) -> Result<(), std::io::Error> {
    let secrets = plan_secrets(plan);
    let clean = |t: &str| scrub(t, &secrets);
    match &plan.delivery {
        Delivery::Http { requests, .. } => {
            writeln!(
                out,
                "# svc-observe {command} --dry-run: {} request{}, {} metric{}; nothing sent",
                requests.len(),
                plural(requests.len()),
                plan.metrics,
                plural(plan.metrics)
            )?;
            for r in requests {
                writeln!(out, "{} {}", r.method.as_str(), clean(&r.url))?;
                for h in &r.headers {
                    match &h.value {
                        HeaderValue::Plain(v) => writeln!(out, "{}: {}", h.name, clean(v))?,
                        HeaderValue::Secret(_) => writeln!(out, "{}: {REDACTED}", h.name)?,
                    }
                }
                writeln!(out)?;
                writeln!(out, "{}", clean(&String::from_utf8_lossy(&r.body)))?;
            }
        }
        Delivery::Datagrams {
            target, datagrams, ..
        } => {
            writeln!(
                out,
                "# svc-observe {command} --dry-run: {} datagram{} to {target}, {} metric{}; nothing sent",
                datagrams.len(),
                plural(datagrams.len()),
                plan.metrics,
                plural(plan.metrics)
            )?;
            for (_, d) in datagrams {
                let text = String::from_utf8_lossy(d).replace('\n', "\\n");
                writeln!(out, "{}", clean(&text))?;
            }
        }
    }
    out.flush()
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// What a delivery achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub items: usize,
    pub bytes: usize,
}

/// Sends a plan (after [`check_sizes`]). HTTP: every request must succeed (after retries);
/// the first request that fails stops the delivery. Datagrams: every datagram is tried (best
/// effort); any failure makes the delivery fail with the counts.
pub fn deliver(block: &'static str, plan: &Plan) -> Result<Sent, ExportError> {
    let secrets = plan_secrets(plan);
    match &plan.delivery {
        Delivery::Http {
            requests,
            timeout,
            max_response_bytes,
        } => {
            // A trust-root file named by SSL_CERT_FILE that cannot be used is an environment
            // problem (exit 2), like an unset token variable.
            let agent = transport::http_agent(*timeout).map_err(ExportError::Environment)?;
            let mut bytes = 0;
            for (i, r) in requests.iter().enumerate() {
                let label = format!("{block}: {}", r.what);
                let res = with_retries(&label, &plan.retry, |_| {
                    transport::send_http(&agent, r, *max_response_bytes, &secrets)
                });
                match res {
                    Ok(reply) => {
                        log::info!("{label}: HTTP {}", reply.status);
                        bytes += r.body.len();
                    }
                    Err((f, attempts)) => {
                        return Err(ExportError::Send {
                            block,
                            sent: i,
                            total: requests.len(),
                            last: format!(
                                "{}: {} (after {attempts} attempt{})",
                                r.what,
                                scrub(f.reason(), &secrets),
                                plural(attempts as usize)
                            ),
                        })
                    }
                }
            }
            Ok(Sent {
                items: requests.len(),
                bytes,
            })
        }
        Delivery::Datagrams {
            target,
            datagrams,
            timeout,
        } => {
            let socket = transport::DatagramSocket::open(target, *timeout).map_err(|e| {
                ExportError::Send {
                    block,
                    sent: 0,
                    total: datagrams.len(),
                    last: format!("cannot open a socket for {target}: {e}"),
                }
            })?;
            let (mut sent, mut bytes, mut last) = (0, 0, None);
            for (what, d) in datagrams {
                let label = format!("{block}: {what}");
                match with_retries(&label, &plan.retry, |_| socket.send(d)) {
                    Ok(()) => {
                        sent += 1;
                        bytes += d.len();
                    }
                    Err((f, attempts)) => {
                        log::warn!(
                            "{label}: not sent after {attempts} attempt{}: {}",
                            plural(attempts as usize),
                            f.reason()
                        );
                        last = Some(format!("{what}: {}", f.reason()));
                    }
                }
            }
            match last {
                None => Ok(Sent { items: sent, bytes }),
                Some(last) => Err(ExportError::Send {
                    block,
                    sent,
                    total: datagrams.len(),
                    last,
                }),
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
    /// The connector's `stale_after_seconds`.
    pub stale_after: fn(&Policy) -> Option<f64>,
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
    let prepared = match (c.input, &args.snapshot) {
        (Input::SnapshotAndPolicy, Some(path)) => Some(prepare(
            path,
            policy,
            c.block,
            (c.stale_after)(policy),
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
            let sent = deliver(c.block, &plan)?;
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
                .map(|r| scrub(&r.url, &plan_secrets(plan)))
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
