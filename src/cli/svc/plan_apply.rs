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

use super::plan::{api_name, Plan};
use crate::broker::config::{is_loopback_url, NatsAuth, NatsConfig};
use crate::broker::{
    check_bindable, connect, is_not_found, settings_drift, BrokerError, Connection, Denials,
};
use crate::metrics::Metrics;

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
        let outcome = apply_stream(&js, stream).map_err(fail(&what))?;
        done.push(Applied { what, outcome });
    }
    let name = plan.consumer.durable_name.clone().unwrap_or_default();
    let what = format!("consumer {}/{name}", plan.stream.name);
    let outcome =
        apply_consumer(&js, &plan.stream.name, &plan.consumer, nats).map_err(fail(&what))?;
    done.push(Applied { what, outcome });
    Ok(done)
}

fn fail(what: &str) -> impl Fn(io::Error) -> BrokerError + '_ {
    move |source| BrokerError {
        action: format!("apply {what}"),
        source,
    }
}

fn apply_stream(js: &JetStream, planned: &StreamConfig) -> io::Result<Outcome> {
    match js.stream_info(&planned.name) {
        Ok(info) => Ok(outcome(stream_drift(&info.config, planned))),
        Err(e) if is_not_found(&e) => {
            js.add_stream(planned)?;
            Ok(Outcome::Created)
        }
        Err(e) => Err(e),
    }
}

fn apply_consumer(
    js: &JetStream,
    stream: &str,
    planned: &ConsumerConfig,
    nats: &NatsConfig,
) -> io::Result<Outcome> {
    let name = planned.durable_name.as_deref().unwrap_or_default();
    match js.consumer_info(stream, name) {
        Ok(info) => Ok(outcome(consumer_drift(&info.config, nats))),
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

/// The planned stream settings the broker's stream does not have, as `name broker -> plan`.
fn stream_drift(existing: &StreamConfig, planned: &StreamConfig) -> Vec<String> {
    let sorted = |s: &[String]| {
        let mut v = s.to_vec();
        v.sort();
        v.join(", ")
    };
    // (name, the broker's value, the plan's value) of each setting the plan owns.
    let fields = |c: &StreamConfig| {
        [
            ("subjects", sorted(&c.subjects)),
            ("storage", api_name(&c.storage)),
            ("replicas", c.num_replicas.to_string()),
            ("retention", api_name(&c.retention)),
            ("discard", api_name(&c.discard)),
            ("duplicate_window_ns", c.duplicate_window.to_string()),
            ("max_age_s", c.max_age.as_secs_f64().to_string()),
            ("max_bytes", c.max_bytes.to_string()),
            ("max_msgs", c.max_msgs.to_string()),
        ]
    };
    fields(existing)
        .into_iter()
        .zip(fields(planned))
        .filter(|((_, broker), (_, plan))| broker != plan)
        .map(|((name, broker), (_, plan))| format!("{name} {broker} -> {plan}"))
        .collect()
}

/// What the runner checks of an existing consumer, and what `reconcile` owns: the runner's
/// own comparisons, so `--apply` and `svc run` judge a consumer alike.
fn consumer_drift(existing: &ConsumerConfig, nats: &NatsConfig) -> Vec<String> {
    let mut d = Vec::new();
    if let Err(why) = check_bindable(existing, nats) {
        d.push(why);
    }
    d.extend(settings_drift(existing, nats));
    if existing.deliver_policy != DeliverPolicy::All {
        d.push("deliver_policy is not all".into());
    }
    d
}
