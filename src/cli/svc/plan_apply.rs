//! `svc stream-plan --apply`: creates what the plan holds and the broker lacks (stream,
//! dead-letter stream, durable consumer), with an administrator's credentials from the
//! environment. Idempotent: what exists and matches is left alone; what exists and differs is
//! reported and never changed (a changed stream or consumer changes what is delivered, and
//! that is the operator's decision).
//!
//! Every broker call is one JetStream API request with the client's 5 s deadline.
#![allow(deprecated)]

use std::io;
use std::sync::Arc;

use nats::jetstream::{ConsumerConfig, DeliverPolicy, JetStream, StreamConfig};
use serde_json::Value;

use super::plan::Plan;
use crate::broker::config::{is_loopback_url, NatsAuth, NatsConfig};
use crate::broker::{
    check_bindable, connect, consumer_shape, is_not_found, settings_drift, typed_config,
    BrokerError, Connection, Denials,
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
        source,
    }
}

fn apply_stream(nc: &Connection, js: &JetStream, planned: &StreamConfig) -> io::Result<Outcome> {
    let info =
        consumer_shape::api_request(nc, &format!("$JS.API.STREAM.INFO.{}", planned.name), b"");
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

/// Stream settings the plan leaves at their defaults but which change what reaches the
/// consumer or what a replay finds, with the default the plan means: a stream that differs
/// is reported. (`max_msgs_per_subject` 1 or `allow_rollup_hdrs` with a publisher's
/// `Nats-Rollup: all` made 4-5 of 5-6 messages vanish before delivery.)
const UNPLANNED_DEFAULTS: &[(&str, &str)] = &[
    ("max_msgs_per_subject", "-1"),
    ("max_msg_size", "-1"),
    ("allow_rollup_hdrs", "false"),
    ("sealed", "false"),
    ("deny_delete", "false"),
    ("deny_purge", "false"),
    ("no_ack", "false"),
    ("mirror", "none"),
    ("sources", "none"),
];

/// The stream settings the broker's stream (its own JSON config) does not have as planned, as
/// `name broker -> plan`: every field the plan sets, and [`UNPLANNED_DEFAULTS`].
fn stream_drift(existing: &Value, planned: &StreamConfig) -> Vec<String> {
    let plan = serde_json::to_value(planned).unwrap_or_default();
    let mut drift = Vec::new();
    let mut compare = |name: &str, broker: String, plan: String| {
        if broker != plan {
            drift.push(format!("{name} {broker} -> {plan}"));
        }
    };
    for (name, value) in plan.as_object().into_iter().flatten() {
        if name == "name" {
            continue;
        }
        compare(
            &display_name(name),
            setting(name, existing.get(name)),
            setting(name, Some(value)),
        );
    }
    for (name, default) in UNPLANNED_DEFAULTS {
        if plan.get(*name).is_none() {
            compare(
                name,
                setting(name, existing.get(*name)),
                default.to_string(),
            );
        }
    }
    drift
}

/// How a setting is shown in a drift line (the names the report has always used).
fn display_name(name: &str) -> String {
    match name {
        "num_replicas" => "replicas",
        "duplicate_window" => "duplicate_window_ns",
        "max_age" => "max_age_s",
        n => n,
    }
    .to_string()
}

/// A stream setting as compared and shown: unlimited limits as -1, durations in seconds,
/// subjects sorted, empty mirror and sources as `none`; the broker's text bounded and escaped.
fn setting(name: &str, v: Option<&Value>) -> String {
    let v = v.unwrap_or(&Value::Null);
    let text = match name {
        "max_msgs_per_subject" | "max_msg_size" | "max_msgs" | "max_bytes" | "max_consumers" => {
            match v.as_i64() {
                Some(n) if n > 0 => n.to_string(),
                _ => "-1".into(),
            }
        }
        "max_age" => (v.as_u64().unwrap_or(0) as f64 / 1e9).to_string(),
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
        "allow_rollup_hdrs" | "sealed" | "deny_delete" | "deny_purge" | "no_ack" => {
            // The broker leaves out a flag that is off.
            v.as_bool().unwrap_or(false).to_string()
        }
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
    if typed.deliver_policy != DeliverPolicy::All {
        d.push("deliver_policy is not all".into());
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
}
