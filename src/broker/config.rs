//! The `nats` block: where the broker is, how the runner authenticates to it (secrets only by
//! environment variable name), whether TLS is required (once asked for, on every connection),
//! and the durable consumer it binds or creates.

use std::path::PathBuf;
use std::time::Duration;

use crate::document::grammar::is_env_var_name;
use crate::document::reader::ObjectReader;
use crate::message::subject::SubjectPattern;
use crate::text::rfc3339::{format_rfc3339_nanos, parse_rfc3339_nanos};

/// Most filter subjects of `nats.subjects` (a consumer's `filter_subjects`).
pub const MAX_SUBJECTS: usize = 64;

/// How the runner authenticates to the broker. Secrets come from the environment at connect
/// time; the config only names the variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NatsAuth {
    None,
    UserPassword {
        username_env: String,
        password_env: String,
    },
    Token {
        token_env: String,
    },
    CredentialsFile {
        path: PathBuf,
    },
    /// NKey authentication without a JWT: the seed file, readable by its owner only.
    NKey {
        seed_file: PathBuf,
    },
}

/// What the runner may do to the durable consumer at start (`nats.consumer_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerMode {
    /// It must exist; the runner never changes it.
    Bind,
    /// Created from [`ConsumerSettings`] when missing; an existing one is used as it is.
    Create,
    /// Created when missing; an existing one gets the settings' AckWait, MaxAckPending,
    /// MaxDeliver and BackOff. A different filter subject or ack policy is refused, never
    /// changed: that would change which messages the consumer delivers.
    Reconcile,
}

impl ConsumerMode {
    pub fn name(self) -> &'static str {
        match self {
            ConsumerMode::Bind => "bind",
            ConsumerMode::Create => "create",
            ConsumerMode::Reconcile => "reconcile",
        }
    }
}

/// The consumer's settings when the runner creates it or reconciles it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerSettings {
    pub ack_wait: Duration,
    pub max_ack_pending: i64,
    /// -1 = unlimited.
    pub max_deliver: i64,
    /// Redelivery delays after an unacknowledged delivery (empty: AckWait each time).
    pub backoff: Vec<Duration>,
    /// Where a consumer the runner creates starts (`nats.deliver_policy`); an existing
    /// consumer is never moved.
    pub start: StartPosition,
}

/// `nats.deliver_policy` with its starting point: where in the stream a consumer the runner
/// creates begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartPosition {
    /// The oldest message the stream holds.
    #[default]
    All,
    /// Only messages stored after the consumer was created.
    New,
    /// From this stream sequence (`opt_start_seq`).
    ByStartSequence(u64),
    /// From the first message stored at or after this instant (`opt_start_time`, Unix ns).
    ByStartTime(i128),
    /// The newest message of each subject, then everything after.
    LastPerSubject,
}

impl StartPosition {
    /// The policy's name as the config and the JetStream API spell it.
    pub fn policy_name(self) -> &'static str {
        match self {
            StartPosition::All => "all",
            StartPosition::New => "new",
            StartPosition::ByStartSequence(_) => "by_start_sequence",
            StartPosition::ByStartTime(_) => "by_start_time",
            StartPosition::LastPerSubject => "last_per_subject",
        }
    }
}

impl std::fmt::Display for StartPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartPosition::ByStartSequence(seq) => {
                write!(f, "by_start_sequence (opt_start_seq {seq})")
            }
            StartPosition::ByStartTime(nanos) => write!(
                f,
                "by_start_time (opt_start_time {})",
                format_rfc3339_nanos(*nanos)
            ),
            other => f.write_str(other.policy_name()),
        }
    }
}

impl ConsumerSettings {
    /// The AckWait the broker keeps: with a backoff list it sets AckWait to its first value.
    pub fn effective_ack_wait(&self) -> Duration {
        self.backoff.first().copied().unwrap_or(self.ack_wait)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsConfig {
    pub urls: Vec<String>,
    pub stream: String,
    pub consumer: String,
    /// The consumer's filter subjects: `nats.subject` (one) or `nats.subjects` (1 to
    /// [`MAX_SUBJECTS`], disjoint). Never empty in a valid config.
    pub subjects: Vec<String>,
    pub auth: NatsAuth,
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate chain and key for mutual TLS (`tls_cert_file`, `tls_key_file`); the
    /// key file must be readable by its owner only.
    pub tls_client_cert: Option<(PathBuf, PathBuf)>,
    /// TLS on every connection, servers learned from the broker's INFO included: set by
    /// `tls_required`, by any `tls://` URL and by `tls_ca_file` (TLS, once asked for, is never
    /// downgraded).
    pub tls_required: bool,
    /// The operator accepts credentials sent in plaintext to non-loopback hosts.
    pub allow_plaintext_credentials: bool,
    /// What the runner may do to the durable consumer at start.
    pub consumer_mode: ConsumerMode,
    pub consumer_settings: ConsumerSettings,
    /// Connection name shown in the broker's monitoring.
    pub connection_name: String,
}

/// Reads the `nats` block. `default_max_ack_pending`: the MaxAckPending of a consumer the
/// runner creates when the block names none (the config passes one default runner's in-flight
/// messages, so the broker never pauses a default runner).
pub fn read_nats(mut r: ObjectReader<'_>, default_max_ack_pending: i64) -> NatsConfig {
    let urls = read_urls(&mut r);
    let stream = read_broker_name(&mut r, "stream");
    let consumer = read_broker_name(&mut r, "consumer");
    let subjects = read_subjects(&mut r);
    let auth = match r.object("auth") {
        Some(a) => read_nats_auth(a),
        None => NatsAuth::None,
    };
    let tls = read_tls(&mut r, &urls);
    let allow_plaintext_credentials = r.bool_or("allow_plaintext_credentials", false);
    if !tls.required && !allow_plaintext_credentials && auth != NatsAuth::None {
        check_plaintext_credentials(&mut r, &urls);
    }
    let consumer_mode = read_consumer_mode(&mut r);
    let consumer_settings = read_consumer_settings(&mut r, default_max_ack_pending, consumer_mode);
    let connection_name = r.string_or("connection_name", "svc");
    r.finish();
    NatsConfig {
        urls,
        stream,
        consumer,
        subjects,
        auth,
        tls_ca_file: tls.ca_file,
        tls_client_cert: tls.client_cert,
        tls_required: tls.required,
        allow_plaintext_credentials,
        consumer_mode,
        consumer_settings,
        connection_name,
    }
}

/// `url` or `urls`, exactly one of them, each URL checked.
fn read_urls(r: &mut ObjectReader<'_>) -> Vec<String> {
    let url = r.opt_string("url");
    let list = r.has("urls").then(|| r.string_list("urls"));
    match (url, list) {
        (Some(_), Some(_)) => {
            r.problem("urls", "set either url or urls, not both");
            Vec::new()
        }
        (Some(u), None) => {
            check_nats_url(r, "url", &u);
            vec![u]
        }
        (None, Some(list)) => {
            if list.is_empty() {
                r.problem("urls", "must name at least one server");
            }
            for (i, u) in list.iter().enumerate() {
                check_nats_url(r, &format!("urls[{i}]"), u);
            }
            list
        }
        (None, None) => {
            r.problem("url", "is required (or urls)");
            Vec::new()
        }
    }
}

/// A required stream or consumer name (`key`).
fn read_broker_name(r: &mut ObjectReader<'_>, key: &'static str) -> String {
    let name = r.req_string(key);
    if !name.is_empty() && !is_broker_name(&name) {
        r.problem(key, "must be 1 to 64 characters of A-Z a-z 0-9 _ -");
    }
    name
}

/// The TLS settings of the `nats` block, as the runner applies them.
struct Tls {
    ca_file: Option<PathBuf>,
    client_cert: Option<(PathBuf, PathBuf)>,
    /// `tls_required`, or asked for by a `tls://` URL, a CA file or a client certificate.
    required: bool,
}

/// `tls_ca_file`, `tls_cert_file` with `tls_key_file`, `tls_required` (never false once
/// something asks for TLS).
fn read_tls(r: &mut ObjectReader<'_>, urls: &[String]) -> Tls {
    let ca_file = r.opt_nonempty("tls_ca_file").map(PathBuf::from);
    let client_cert = match (
        r.opt_nonempty("tls_cert_file"),
        r.opt_nonempty("tls_key_file"),
    ) {
        (Some(cert), Some(key)) => Some((PathBuf::from(cert), PathBuf::from(key))),
        (Some(_), None) => {
            r.problem("tls_key_file", "is required with tls_cert_file");
            None
        }
        (None, Some(_)) => {
            r.problem("tls_cert_file", "is required with tls_key_file");
            None
        }
        (None, None) => None,
    };
    let tls_asked =
        ca_file.is_some() || client_cert.is_some() || urls.iter().any(|u| u.starts_with("tls://"));
    let tls_explicit = r.has("tls_required");
    let tls_setting = r.bool_or("tls_required", false);
    if tls_explicit && !tls_setting && tls_asked {
        r.problem(
            "tls_required",
            "cannot be false with a tls:// URL, tls_ca_file or a client certificate: TLS applies \
             to every server",
        );
    }
    let required = tls_setting || tls_asked;
    // Shown as the runner applies it (true also when a tls:// URL or a CA asks for TLS),
    // which reads back to the same setting.
    r.record_resolved("tls_required", serde_json::Value::Bool(required));
    Tls {
        ca_file,
        client_cert,
        required,
    }
}

/// Without TLS, credentials go to loopback hosts only (unless the operator allows it).
fn check_plaintext_credentials(r: &mut ObjectReader<'_>, urls: &[String]) {
    let single = r.has("url");
    let key = |i: usize| match single {
        true => "url".to_string(),
        false => format!("urls[{i}]"),
    };
    for (i, u) in urls.iter().enumerate() {
        if !is_loopback_url(u) {
            r.problem(
                &key(i),
                "would carry the nats.auth credentials in plaintext to a non-loopback \
                 host; use tls:// (or tls_ca_file / tls_required), or set \
                 nats.allow_plaintext_credentials to true",
            );
        }
    }
}

/// The settings of a consumer the runner creates or checks; `backoff_seconds` may not
/// list more delays than `max_deliver` allows.
fn read_consumer_settings(
    r: &mut ObjectReader<'_>,
    default_max_ack_pending: i64,
    consumer_mode: ConsumerMode,
) -> ConsumerSettings {
    let consumer_settings = ConsumerSettings {
        ack_wait: Duration::from_secs(r.int_in("ack_wait_seconds", 30, 1, 86_400) as u64),
        // The default in-flight bound: the broker never pauses a default runner.
        max_ack_pending: r.int_in("max_ack_pending", default_max_ack_pending, 1, 1_000_000),
        max_deliver: match r.opt_int_in("max_deliver", -1, 1_000_000) {
            Some(0) => {
                r.problem("max_deliver", "must be -1 (unlimited) or at least 1");
                -1
            }
            Some(n) => n,
            None => -1,
        },
        backoff: read_backoff(r),
        start: read_start(r, consumer_mode),
    };
    let s = &consumer_settings;
    if s.max_deliver != -1 && s.backoff.len() as i64 > s.max_deliver {
        r.problem(
            "backoff_seconds",
            format!(
                "has {} delays but max_deliver is {}: the broker refuses more delays than \
                 deliveries",
                s.backoff.len(),
                s.max_deliver
            ),
        );
    }
    consumer_settings
}

/// `consumer_mode`, with `create_consumer: true` as the older spelling of `create`.
fn read_consumer_mode(r: &mut ObjectReader<'_>) -> ConsumerMode {
    let explicit = r.has("consumer_mode");
    let legacy = r
        .has("create_consumer")
        .then(|| r.bool_or("create_consumer", false));
    let default = match legacy {
        Some(true) => ConsumerMode::Create,
        _ => ConsumerMode::Bind,
    };
    let mode = r.one_of(
        "consumer_mode",
        default,
        &[
            ("bind", ConsumerMode::Bind),
            ("create", ConsumerMode::Create),
            ("reconcile", ConsumerMode::Reconcile),
        ],
    );
    if explicit && mode == ConsumerMode::Bind && legacy == Some(true) {
        r.problem(
            "create_consumer",
            "is true but consumer_mode is \"bind\"; set only consumer_mode",
        );
    }
    let shown = match mode {
        ConsumerMode::Bind => "bind",
        ConsumerMode::Create => "create",
        ConsumerMode::Reconcile => "reconcile",
    };
    r.record_resolved("consumer_mode", serde_json::Value::String(shown.into()));
    mode
}

/// `subject` or `subjects` (exactly one of them): the consumer's filter subjects, each a
/// valid pattern, at most [`MAX_SUBJECTS`], no two of them matching a common subject (the
/// broker refuses overlapping filter subjects, and one message must not be wanted twice).
fn read_subjects(r: &mut ObjectReader<'_>) -> Vec<String> {
    let one = r.has("subject");
    let many = r.has("subjects");
    if one && many {
        r.problem("subjects", "set either subject or subjects, not both");
        return Vec::new();
    }
    if !many {
        let subject = r.req_string("subject");
        if subject.is_empty() {
            return Vec::new();
        }
        if let Err(e) = SubjectPattern::parse(&subject) {
            r.problem("subject", e.to_string());
        }
        return vec![subject];
    }
    let list = r.string_list("subjects");
    if list.is_empty() {
        if r.raw("subjects").is_some_and(|v| v.is_array()) {
            r.problem("subjects", "must name at least one subject");
        }
        return list;
    }
    if list.len() > MAX_SUBJECTS {
        r.problem(
            "subjects",
            format!(
                "names {} subjects; at most {MAX_SUBJECTS} (a consumer's filter_subjects)",
                list.len()
            ),
        );
        return list;
    }
    let mut parsed: Vec<(usize, SubjectPattern)> = Vec::with_capacity(list.len());
    for (i, text) in list.iter().enumerate() {
        let pattern = match SubjectPattern::parse(text) {
            Ok(p) => p,
            Err(e) => {
                r.problem(&format!("subjects[{i}]"), e.to_string());
                continue;
            }
        };
        if let Some((j, other)) = parsed.iter().find(|(_, p)| p.overlaps(&pattern)) {
            r.problem(
                &format!("subjects[{i}]"),
                format!(
                    "\"{text}\" overlaps subjects[{j}] \"{other}\": a subject matches both; \
                     the filter subjects must be disjoint"
                ),
            );
        }
        parsed.push((i, pattern));
    }
    list
}

/// Why a time outside [`is_broker_time`] is refused.
pub const BROKER_TIME_RANGE: &str = "must lie between 1677-09-21T00:12:44Z and \
    2262-04-11T23:47:16Z: the broker keeps a start time as signed 64-bit nanoseconds since \
    1970, and one outside that range starts the consumer elsewhere (at the stream's start or \
    its end) while it reports the time asked for";

/// Whether the broker can hold this instant (Unix nanoseconds) as a start time: nats-server
/// keeps it as a Go `time.Time` and compares `UnixNano()`, which overflows outside `i64`.
pub fn is_broker_time(unix_nanos: i128) -> bool {
    // The whole seconds inside the range (integer division rounds toward zero).
    const LOW: i128 = (i64::MIN as i128 / 1_000_000_000) * 1_000_000_000;
    const HIGH: i128 = (i64::MAX as i128 / 1_000_000_000) * 1_000_000_000;
    (LOW..=HIGH).contains(&unix_nanos)
}

/// `deliver_policy` as read: where a consumer the runner creates starts.
#[derive(Clone, Copy, PartialEq)]
enum Policy {
    All,
    New,
    Sequence,
    Time,
    LastPerSubject,
}

/// `opt_start_time` as written, and its instant when it is an RFC 3339 time the broker
/// takes.
fn read_start_time(r: &mut ObjectReader<'_>) -> (Option<String>, Option<i128>) {
    let time_text = r.opt_nonempty("opt_start_time");
    let time = time_text.as_deref().and_then(|t| {
        let nanos = parse_rfc3339_nanos(t);
        match nanos {
            None => r.problem(
                "opt_start_time",
                "must be an RFC 3339 time, e.g. 2026-11-26T14:00:00Z",
            ),
            Some(n) if !is_broker_time(n) => r.problem("opt_start_time", BROKER_TIME_RANGE),
            Some(_) => {}
        }
        nanos.filter(|n| is_broker_time(*n))
    });
    (time_text, time)
}

/// `deliver_policy` with `opt_start_seq` / `opt_start_time`: where a consumer the runner
/// creates starts. Each starting point goes with its policy only; a policy at all only when
/// the runner may create the consumer.
fn read_start(r: &mut ObjectReader<'_>, mode: ConsumerMode) -> StartPosition {
    let explicit = r.has("deliver_policy");
    let policy = r.one_of(
        "deliver_policy",
        Policy::All,
        &[
            ("all", Policy::All),
            ("new", Policy::New),
            ("by_start_sequence", Policy::Sequence),
            ("by_start_time", Policy::Time),
            ("last_per_subject", Policy::LastPerSubject),
        ],
    );
    if explicit && mode == ConsumerMode::Bind {
        r.problem(
            "deliver_policy",
            "applies only to a consumer the runner creates; consumer_mode \"bind\" never \
             creates one (set consumer_mode to \"create\" or \"reconcile\", or remove it)",
        );
    }
    let seq = r.opt_int_in("opt_start_seq", 1, i64::MAX);
    let (time_text, time) = read_start_time(r);
    if policy != Policy::Sequence && r.has("opt_start_seq") {
        r.problem(
            "opt_start_seq",
            "goes only with deliver_policy \"by_start_sequence\"",
        );
    }
    if policy != Policy::Time && time_text.is_some() {
        r.problem(
            "opt_start_time",
            "goes only with deliver_policy \"by_start_time\"",
        );
    }
    match policy {
        Policy::All => StartPosition::All,
        Policy::New => StartPosition::New,
        Policy::LastPerSubject => StartPosition::LastPerSubject,
        Policy::Sequence => match seq {
            Some(n) => StartPosition::ByStartSequence(n as u64),
            None => {
                if !r.has("opt_start_seq") {
                    r.problem(
                        "opt_start_seq",
                        "is required with deliver_policy \"by_start_sequence\"",
                    );
                }
                StartPosition::All
            }
        },
        Policy::Time => match time {
            Some(nanos) => StartPosition::ByStartTime(nanos),
            None => {
                if time_text.is_none() {
                    r.problem(
                        "opt_start_time",
                        "is required with deliver_policy \"by_start_time\"",
                    );
                }
                StartPosition::All
            }
        },
    }
}

/// `backoff_seconds`: the consumer's redelivery delays, whole seconds, 1 to 100 of them.
fn read_backoff(r: &mut ObjectReader<'_>) -> Vec<Duration> {
    let Some(v) = r.raw("backoff_seconds") else {
        return Vec::new();
    };
    let why = "must be an array of 1 to 100 whole seconds, each from 1 to 86400";
    let Some(items) = v.as_array().filter(|a| !a.is_empty() && a.len() <= 100) else {
        r.problem("backoff_seconds", why);
        return Vec::new();
    };
    let seconds: Option<Vec<u64>> = items
        .iter()
        .map(|i| i.as_u64().filter(|n| (1..=86_400).contains(n)))
        .collect();
    match seconds {
        Some(s) => s.into_iter().map(Duration::from_secs).collect(),
        None => {
            r.problem("backoff_seconds", why);
            Vec::new()
        }
    }
}

/// Broker URLs: `nats://` or `tls://` with a host; credentials in the URL are rejected (the
/// URL gets logged; secrets come from the environment).
fn check_nats_url(r: &ObjectReader<'_>, key: &str, url: &str) {
    let rest = url
        .strip_prefix("nats://")
        .or_else(|| url.strip_prefix("tls://"));
    let Some(rest) = rest else {
        r.problem(key, "must start with nats:// or tls://");
        return;
    };
    let authority = rest.split('/').next().unwrap_or("");
    if authority.contains('@') {
        r.problem(
            key,
            "must not contain credentials; use nats.auth with environment variables",
        );
    } else if authority.is_empty() || rest.len() > authority.len() + 1 {
        r.problem(key, "must be scheme://host[:port] without a path");
    }
}

/// True when the URL's host is `localhost`, in 127.0.0.0/8 or `::1`: plaintext there never
/// crosses a network. Takes `scheme://host[:port]` (a config URL, checked by
/// [`check_nats_url`]) or the bare `host:port` of a broker's INFO `connect_urls`.
pub fn is_loopback_url(url: &str) -> bool {
    let rest = url
        .strip_prefix("nats://")
        .or_else(|| url.strip_prefix("tls://"))
        .unwrap_or(url);
    let authority = rest.split('/').next().unwrap_or("");
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.split(':').next().unwrap_or(""),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

pub(crate) fn is_broker_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn read_nats_auth(mut a: ObjectReader<'_>) -> NatsAuth {
    #[derive(Clone, Copy, PartialEq)]
    enum Mode {
        None,
        UserPassword,
        Token,
        CredentialsFile,
        NKey,
    }
    let mode = a.one_of(
        "mode",
        Mode::None,
        &[
            ("none", Mode::None),
            ("user_password", Mode::UserPassword),
            ("token", Mode::Token),
            ("credentials_file", Mode::CredentialsFile),
            ("nkey", Mode::NKey),
        ],
    );
    let env_name =
        |a: &mut ObjectReader<'_>, key: &'static str, needed: bool| match a.opt_string(key) {
            Some(n) if is_env_var_name(&n) => n,
            Some(_) => {
                a.problem(key, "must be an environment variable name");
                String::new()
            }
            None => {
                if needed {
                    a.problem(key, "is required for this auth mode");
                }
                String::new()
            }
        };
    let username_env = env_name(&mut a, "username_env", matches!(mode, Mode::UserPassword));
    let password_env = env_name(&mut a, "password_env", matches!(mode, Mode::UserPassword));
    let token_env = env_name(&mut a, "token_env", matches!(mode, Mode::Token));
    let credentials_file = a.opt_nonempty("credentials_file");
    if matches!(mode, Mode::CredentialsFile) && credentials_file.is_none() {
        a.problem("credentials_file", "is required for this auth mode");
    }
    let nkey_seed_file = a.opt_nonempty("nkey_seed_file");
    if matches!(mode, Mode::NKey) && nkey_seed_file.is_none() {
        a.problem("nkey_seed_file", "is required for this auth mode");
    }
    a.finish();
    match mode {
        Mode::None => NatsAuth::None,
        Mode::UserPassword => NatsAuth::UserPassword {
            username_env,
            password_env,
        },
        Mode::Token => NatsAuth::Token { token_env },
        Mode::CredentialsFile => NatsAuth::CredentialsFile {
            path: PathBuf::from(credentials_file.unwrap_or_default()),
        },
        Mode::NKey => NatsAuth::NKey {
            seed_file: PathBuf::from(nkey_seed_file.unwrap_or_default()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_times_the_broker_cannot_hold_are_refused() {
        let at = |t: &str| is_broker_time(parse_rfc3339_nanos(t).unwrap());
        for inside in [
            "1677-09-21T00:12:44Z",
            "1970-01-01T00:00:00Z",
            "2026-11-28T10:00:00.5+01:00",
            "2262-04-11T23:47:16Z",
        ] {
            assert!(at(inside), "{inside}");
        }
        for outside in [
            "1677-09-21T00:12:43Z",
            "1500-01-01T00:00:00Z",
            "2262-04-11T23:47:17Z",
            "3026-01-01T00:00:00Z",
            "9999-12-31T23:59:59.999999999Z",
        ] {
            assert!(!at(outside), "{outside}");
        }
    }
}
