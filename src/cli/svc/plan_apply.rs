//! `svc stream-plan --apply`: creates what the plan holds and the broker lacks (stream,
//! dead-letter stream, durable consumer), with an administrator's credentials from the
//! environment. Idempotent: what exists and matches is left alone; what exists and differs is
//! reported and never changed (a changed stream or consumer changes what is delivered, and
//! that is the operator's decision).
//!
//! Every broker call is one JetStream API request with the client's 5 s deadline.

use std::io;
use std::sync::Arc;

use nats::jetstream::{ConsumerConfig, JetStream, StreamConfig};
use serde_json::Value;

use super::plan::Plan;
use crate::broker::config::{is_loopback_url, NatsAuth, NatsConfig};
use crate::broker::{
    check_bindable, connect, consumer_shape, incarnation, is_not_found, settings_drift,
    typed_config, BrokerError, Connection, Denials,
};
use crate::metrics::Metrics;
use crate::text::peer::PeerText;

/// Administrator user name (with [`ADMIN_PASSWORD_ENV`]).
pub const ADMIN_USER_ENV: &str = "SVC_ADMIN_NATS_USER";
/// Administrator password (with [`ADMIN_USER_ENV`]).
pub const ADMIN_PASSWORD_ENV: &str = "SVC_ADMIN_NATS_PASSWORD";
/// Administrator token.
pub const ADMIN_TOKEN_ENV: &str = "SVC_ADMIN_NATS_TOKEN";
/// Path of the administrator's `.creds` file (JWT and NKey seed).
pub const ADMIN_CREDS_ENV: &str = "SVC_ADMIN_NATS_CREDS";

/// What `--apply` found or did for one item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Created,
    /// It exists as planned.
    Matches,
    /// It exists and differs: `name: broker -> plan` each; left unchanged.
    Differs(Vec<String>),
}

/// One item of the plan and its outcome, e.g. `stream ORDERS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub what: String,
    pub outcome: Outcome,
}

/// The runner's connection settings with the administrator's credentials (whichever of the
/// variables is set; none: no credentials, as a development server takes). Secret values are
/// read by [`connect`], never here; the credentials file is checked here (the NKey seed
/// file's rule) so that a refusal names its variable. Errors name variables and paths only.
pub fn admin_config(nats: &NatsConfig) -> Result<NatsConfig, String> {
    let set = |v: &str| std::env::var_os(v).is_some_and(|x| !x.is_empty());
    let user = set(ADMIN_USER_ENV) || set(ADMIN_PASSWORD_ENV);
    let chosen = [user, set(ADMIN_TOKEN_ENV), set(ADMIN_CREDS_ENV)];
    if chosen.iter().filter(|c| **c).count() > 1 {
        return Err(format!(
            "set one of {ADMIN_USER_ENV}/{ADMIN_PASSWORD_ENV}, {ADMIN_TOKEN_ENV}, \
             {ADMIN_CREDS_ENV}, not several"
        ));
    }
    let auth = if user {
        NatsAuth::UserPassword {
            username_env: ADMIN_USER_ENV.into(),
            password_env: ADMIN_PASSWORD_ENV.into(),
        }
    } else if chosen[1] {
        NatsAuth::Token {
            token_env: ADMIN_TOKEN_ENV.into(),
        }
    } else if chosen[2] {
        let path = std::path::PathBuf::from(std::env::var_os(ADMIN_CREDS_ENV).unwrap_or_default());
        // Checked here to name the variable; `connect` reads it again under the same rule.
        crate::broker::read_credentials_file(&path)
            .map_err(|e| format!("{ADMIN_CREDS_ENV} {}: {e}", path.display()))?;
        NatsAuth::CredentialsFile { path }
    } else {
        NatsAuth::None
    };
    // The rule validation applies to the runner's own credentials.
    if auth != NatsAuth::None && !nats.tls_required && !nats.allow_plaintext_credentials {
        if let Some(url) = nats.urls.iter().find(|u| !is_loopback_url(u)) {
            return Err(format!(
                "{url} would carry the administrator's credentials in plaintext to a \
                 non-loopback host; use TLS or set nats.allow_plaintext_credentials"
            ));
        }
    }
    Ok(NatsConfig {
        auth,
        connection_name: "svc stream-plan".into(),
        ..nats.clone()
    })
}

/// Connects as the administrator (see [`admin_config`]).
pub fn connect_admin(admin: &NatsConfig) -> Result<(Connection, Arc<Denials>), BrokerError> {
    let denials = Arc::new(Denials::default());
    let nc = connect(admin, Arc::new(Metrics::default()), denials.clone())?;
    Ok((nc, denials))
}

/// Creates what is missing, in order: stream, dead-letter stream, consumer. Stops at the
/// first broker failure (the items before it are already done).
pub fn apply(nc: &Connection, plan: &Plan, nats: &NatsConfig) -> Result<Vec<Applied>, BrokerError> {
    let js = nats::jetstream::new(nc.clone());
    let mut done = Vec::new();
    for stream in std::iter::once(&plan.stream).chain(&plan.dead_letter_stream) {
        let what = format!("stream {}", stream.name);
        let outcome = apply_stream(nc, &js, stream).map_err(fail(&what))?;
        done.push(Applied { what, outcome });
    }
    let name = plan.consumer.durable_name.clone().unwrap_or_default();
    let what = format!("consumer {}/{name}", plan.stream.name);
    let outcome =
        apply_consumer(nc, &js, &plan.stream.name, &plan.consumer, nats).map_err(fail(&what))?;
    done.push(Applied { what, outcome });
    Ok(done)
}

fn fail(what: &str) -> impl Fn(io::Error) -> BrokerError + '_ {
    move |source| BrokerError {
        action: format!("apply {what}"),
        source: source.into(),
    }
}

fn apply_stream(nc: &Connection, js: &JetStream, planned: &StreamConfig) -> io::Result<Outcome> {
    let info = incarnation::stream_info(nc, &planned.name, consumer_shape::API_TIMEOUT);
    match info {
        Ok(info) => Ok(outcome(stream_drift(&info["config"], planned))),
        Err(e) if is_not_found(&e) => {
            js.add_stream(planned)?;
            Ok(Outcome::Created)
        }
        Err(e) => Err(e),
    }
}

fn apply_consumer(
    nc: &Connection,
    js: &JetStream,
    stream: &str,
    planned: &ConsumerConfig,
    nats: &NatsConfig,
) -> io::Result<Outcome> {
    let name = planned.durable_name.as_deref().unwrap_or_default();
    match consumer_shape::consumer_config(nc, stream, name) {
        Ok(config) => Ok(outcome(consumer_drift(&config, nats))),
        Err(e) if is_not_found(&e) => {
            crate::broker::require_filter_subjects(nc, &nats.subjects)
                .map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?;
            js.add_consumer(stream, planned)?;
            Ok(Outcome::Created)
        }
        Err(e) => Err(e),
    }
}

fn outcome(drift: Vec<String>) -> Outcome {
    if drift.is_empty() {
        Outcome::Matches
    } else {
        Outcome::Differs(drift)
    }
}

/// How `--apply` judges one field of an existing stream's config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Review {
    /// The plan sets it: compared with the plan's value.
    Planned,
    /// The plan leaves it at this default (as [`setting`] shows it), and any other value can
    /// drop, move, hide or rewrite a message before the consumer delivers it, or change what
    /// a replay finds: compared with the default.
    Lossy(&'static str),
    /// Whatever its value, what is stored is what was published and stays until delivered
    /// (the reason is beside each entry of [`STREAM_FIELDS`]): not compared.
    Harmless,
}

/// Every field of nats-server 2.15's `StreamConfig` (server/stream.go; 2.9 knows a subset),
/// judged one by one. A field the broker reports that is not here and is set (not absent,
/// false, 0, empty) is reported as not reviewed: a newer server's setting is a difference
/// until someone has read what it does.
///
/// Measured with a publisher and `svc run` after `--apply`: `max_msgs_per_subject` 1 or
/// `allow_rollup_hdrs` with `Nats-Rollup: all` made 4-5 of 5-6 messages vanish before
/// delivery; on nats-server 2.15.1, `allow_msg_ttl` with `Nats-TTL: 1s` left 0 of 5 in the
/// stream, and `subject_transform` to `moved.>` stored all 5 where the consumer's `orders.>`
/// filter never delivered one.
const STREAM_FIELDS: &[(&str, Review)] = &[
    ("name", Review::Planned),
    ("subjects", Review::Planned),
    ("retention", Review::Planned),
    ("max_consumers", Review::Planned),
    ("max_msgs", Review::Planned),
    ("max_bytes", Review::Planned),
    ("max_age", Review::Planned),
    ("discard", Review::Planned),
    ("storage", Review::Planned),
    ("num_replicas", Review::Planned),
    ("duplicate_window", Review::Planned),
    // Keeps only the newest N messages of a subject: the others vanish undelivered.
    ("max_msgs_per_subject", Review::Lossy("-1")),
    // Refuses a larger publish the plan's stream would store.
    ("max_msg_size", Review::Lossy("-1")),
    // `Nats-Rollup` from any publisher purges the subject or the stream.
    ("allow_rollup_hdrs", Review::Lossy("false")),
    // Nothing gets in; nothing can be removed for a redo.
    ("sealed", Review::Lossy("false")),
    ("deny_delete", Review::Lossy("false")),
    ("deny_purge", Review::Lossy("false")),
    // Publishers get no PubAck: a lost publish goes unnoticed.
    ("no_ack", Review::Lossy("false")),
    // A mirror takes no publishes; sources add another stream's messages.
    ("mirror", Review::Lossy("none")),
    ("sources", Review::Lossy("none")),
    // A publisher's `Nats-TTL` removes its message when the TTL passes, delivered or not.
    ("allow_msg_ttl", Review::Lossy("false")),
    // Rewrites the subject before storing: a message moved out of the consumer's filter is
    // stored and never delivered, one moved into another subject is delivered under it.
    ("subject_transform", Review::Lossy("none")),
    // Stores delete markers (messages no publisher sent) where max_age emptied a subject;
    // the server also turns on `allow_msg_ttl` and `allow_rollup_hdrs` for it.
    ("subject_delete_marker_ttl", Review::Lossy("0")),
    // Counter streams store the running sum instead of the published payload and refuse
    // publishes without `Nats-Incr`.
    ("allow_msg_counter", Review::Lossy("false")),
    // A schedule message makes the server publish messages later and roll up subjects.
    ("allow_msg_schedules", Review::Lossy("false")),
    // Refuses a publish on a subject holding `max_msgs_per_subject` messages (it acts only
    // with that limit, itself a difference; named so that the report shows both).
    ("discard_new_per_subject", Review::Lossy("false")),
    // `async`: the PubAck comes before the write reaches the disk; a crash loses
    // acknowledged messages that were never delivered.
    ("persist_mode", Review::Lossy("default")),
    // Copies every stored message, headers and payload, to another subject for any core
    // NATS subscriber: past the consumer, the security labels and the sink's access rules.
    ("republish", Review::Lossy("none")),
    // Defaults imposed on the stream's consumers: `inactive_threshold` deletes an idle
    // durable with its acknowledgement state (under interest retention, its messages too),
    // `max_ack_pending` caps the consumer the plan creates.
    ("consumer_limits", Review::Lossy("none")),
    // Text for people.
    ("description", Review::Harmless),
    // The server's own `_nats.*` keys and an operator's notes; no behaviour.
    ("metadata", Review::Harmless),
    // Where replicas live; the messages are the same on any server.
    ("placement", Review::Harmless),
    // Storage compression, undone on every read.
    ("compression", Review::Harmless),
    // The first sequence number of a new stream: numbering only, nothing is dropped (the
    // runner's ids carry the stream's incarnation, not an assumption of sequence 1).
    ("first_seq", Review::Harmless),
    // Direct get: another way to read, nothing removed.
    ("allow_direct", Review::Harmless),
    ("mirror_direct", Review::Harmless),
    // Atomic and fast batch publishing: what a batch stores is stored and delivered like
    // any message; a batch the server drops was never acknowledged to its publisher.
    ("allow_atomic", Review::Harmless),
    ("allow_batched", Review::Harmless),
    // nats-server 2.9's stream templates (removed in 2.10): who created the stream.
    ("template_owner", Review::Harmless),
];

/// The stream settings the broker's stream (its own JSON config) does not have as planned, as
/// `name broker -> plan`: every field the plan sets, every [`Review::Lossy`] field of
/// [`STREAM_FIELDS`], and every set field that is not listed there.
fn stream_drift(existing: &Value, planned: &StreamConfig) -> Vec<String> {
    let plan = serde_json::to_value(planned).unwrap_or_default();
    let mut drift = Vec::new();
    let mut compare = |name: &str, broker: String, plan: String| {
        if broker != plan {
            drift.push(format!("{} {broker} -> {plan}", display_name(name)));
        }
    };
    for (name, value) in plan.as_object().into_iter().flatten() {
        if name == "name" {
            continue;
        }
        compare(
            name,
            setting(name, existing.get(name)),
            setting(name, Some(value)),
        );
    }
    for (name, review) in STREAM_FIELDS {
        if let (Review::Lossy(default), None) = (review, plan.get(*name)) {
            compare(
                name,
                setting(name, existing.get(*name)),
                default.to_string(),
            );
        }
    }
    for (name, value) in existing.as_object().into_iter().flatten() {
        let known = STREAM_FIELDS.iter().any(|(n, _)| n == name) || plan.get(name).is_some();
        if !known && is_set(value) {
            compare(
                name,
                setting(name, Some(value)),
                "(a setting this svc has not reviewed)".into(),
            );
        }
    }
    drift
}

/// Whether a broker field is set: not absent, false, zero or empty.
fn is_set(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// How a setting is shown in a drift line (the names the report has always used).
fn display_name(name: &str) -> String {
    match name {
        "num_replicas" => "replicas",
        "duplicate_window" => "duplicate_window_ns",
        "max_age" => "max_age_s",
        "subject_delete_marker_ttl" => "subject_delete_marker_ttl_s",
        n => n,
    }
    .to_string()
}

/// A stream setting as compared and shown: unlimited limits as -1, durations in seconds,
/// subjects sorted, empty objects, mirror and sources as `none`; the broker's text bounded
/// and escaped.
fn setting(name: &str, v: Option<&Value>) -> String {
    let v = v.unwrap_or(&Value::Null);
    let text = match name {
        "max_msgs_per_subject" | "max_msg_size" | "max_msgs" | "max_bytes" | "max_consumers" => {
            match v.as_i64() {
                Some(n) if n > 0 => n.to_string(),
                _ => "-1".into(),
            }
        }
        "max_age" | "subject_delete_marker_ttl" => {
            (v.as_u64().unwrap_or(0) as f64 / 1e9).to_string()
        }
        "subjects" => {
            let mut s: Vec<String> = v
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| s.as_str().unwrap_or("?").to_string())
                .collect();
            s.sort();
            s.join(", ")
        }
        "allow_rollup_hdrs"
        | "sealed"
        | "deny_delete"
        | "deny_purge"
        | "no_ack"
        | "allow_msg_ttl"
        | "allow_msg_counter"
        | "allow_msg_schedules"
        | "discard_new_per_subject" => {
            // The broker leaves out a flag that is off.
            v.as_bool().unwrap_or(false).to_string()
        }
        // Absent or empty: the server's default mode.
        "persist_mode" => match v.as_str() {
            None | Some("") => "default".into(),
            Some(mode) => mode.to_string(),
        },
        _ => match v {
            Value::Null => "none".into(),
            Value::Array(a) if a.is_empty() => "none".into(),
            Value::Object(o) if o.is_empty() => "none".into(),
            Value::Bool(b) => b.to_string(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        },
    };
    PeerText::with_limit(&text, 200).to_string()
}

/// What the runner checks of an existing consumer, and what `reconcile` owns: the runner's
/// own comparisons, so `--apply` and `svc run` judge a consumer alike.
fn consumer_drift(existing: &Value, nats: &NatsConfig) -> Vec<String> {
    let mut d = Vec::new();
    if let Err(why) = check_bindable(existing, nats) {
        d.push(why);
    }
    let typed = typed_config(existing);
    d.extend(settings_drift(&typed, nats));
    // Never moved, by --apply or `svc run`: only reported.
    if let Err(why) = consumer_shape::check_start(existing, nats.consumer_settings.start) {
        d.push(why);
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn mirrors_sources_and_a_sealed_stream_are_differences() {
        let planned = StreamConfig {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            max_msgs_per_subject: -1,
            max_consumers: -1,
            ..Default::default()
        };
        let mut broker = serde_json::to_value(&planned).unwrap();
        assert_eq!(stream_drift(&broker, &planned), Vec::<String>::new());
        broker["sealed"] = json!(true);
        broker["mirror"] = json!({"name": "UPSTREAM"});
        broker["sources"] = json!([{"name": "A"}]);
        let drift = stream_drift(&broker, &planned);
        assert_eq!(drift.len(), 3, "{drift:?}");
        assert!(drift.iter().any(|d| d == "sealed true -> false"));
        assert!(drift
            .iter()
            .any(|d| d.starts_with("mirror {") && d.ends_with("-> none")));
        assert!(drift.iter().any(|d| d.starts_with("sources [")));
    }

    fn planned() -> StreamConfig {
        StreamConfig {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            max_msgs_per_subject: -1,
            max_consumers: -1,
            ..Default::default()
        }
    }

    /// nats-server 2.15's stream config as it reports it for the planned stream, with every
    /// field that cannot lose a message set to something other than its default.
    fn harmless_broker() -> Value {
        let mut broker = serde_json::to_value(planned()).unwrap();
        for (k, v) in [
            ("description", json!("orders")),
            ("metadata", json!({"_nats.ver": "2.15.1", "team": "a"})),
            ("placement", json!({"cluster": "east", "tags": ["ssd"]})),
            ("compression", json!("s2")),
            ("first_seq", json!(1000)),
            ("allow_direct", json!(true)),
            ("mirror_direct", json!(true)),
            ("allow_atomic", json!(true)),
            ("allow_batched", json!(true)),
            ("consumer_limits", json!({})),
            ("allow_msg_ttl", json!(false)),
            ("persist_mode", json!("default")),
        ] {
            broker[k] = v;
        }
        broker
    }

    #[test]
    fn every_field_is_reviewed_and_the_harmless_ones_are_not_differences() {
        for (name, _) in STREAM_FIELDS {
            assert_eq!(
                STREAM_FIELDS.iter().filter(|(n, _)| n == name).count(),
                1,
                "{name}"
            );
        }
        assert_eq!(
            stream_drift(&harmless_broker(), &planned()),
            Vec::<String>::new()
        );
    }

    /// Each setting that drops, moves, hides, rewrites or copies out a message before
    /// delivery is a difference on its own; so is a setting this svc does not know.
    #[test]
    fn settings_that_lose_or_move_messages_are_differences() {
        for (k, v, said) in [
            ("allow_msg_ttl", json!(true), "allow_msg_ttl true -> false"),
            (
                "subject_transform",
                json!({"src": "orders.>", "dest": "moved.>"}),
                "subject_transform {\"dest\":\"moved.>\",\"src\":\"orders.>\"} -> none",
            ),
            (
                "subject_delete_marker_ttl",
                json!(5_000_000_000u64),
                "subject_delete_marker_ttl_s 5 -> 0",
            ),
            (
                "allow_msg_counter",
                json!(true),
                "allow_msg_counter true -> false",
            ),
            (
                "allow_msg_schedules",
                json!(true),
                "allow_msg_schedules true -> false",
            ),
            (
                "discard_new_per_subject",
                json!(true),
                "discard_new_per_subject true -> false",
            ),
            (
                "persist_mode",
                json!("async"),
                "persist_mode async -> default",
            ),
            (
                "republish",
                json!({"src": ">", "dest": "copy.>"}),
                "republish {\"dest\":\"copy.>\",\"src\":\">\"} -> none",
            ),
            (
                "consumer_limits",
                json!({"inactive_threshold": 1_000_000_000u64}),
                "consumer_limits {\"inactive_threshold\":1000000000} -> none",
            ),
            (
                "allow_future_thing",
                json!(true),
                "allow_future_thing true -> (a setting this svc has not reviewed)",
            ),
        ] {
            let mut broker = harmless_broker();
            broker[k] = v;
            assert_eq!(stream_drift(&broker, &planned()), vec![said.to_string()]);
        }
        // Unset fields a newer server reports are not differences.
        let mut broker = harmless_broker();
        broker["allow_future_thing"] = json!(false);
        broker["future_limits"] = json!({});
        assert_eq!(stream_drift(&broker, &planned()), Vec::<String>::new());
    }
}
