//! What the broker must hold for a configuration, computed offline: the stream, the durable
//! consumer (exactly [`crate::broker::planned_consumer`], so the plan and `svc run` cannot drift), the
//! dead-letter stream, and the NATS permissions of the runner's user.
//!
//! The permissions are every subject the runner publishes to or subscribes to, read from the
//! code that uses them (this module names each one's user); `tests/stream_plan.rs` runs the
//! runner under exactly these permissions and without each one in turn, so a subject added
//! to the runner without being added here fails that test.

use std::time::Duration;

use nats::jetstream::{ConsumerConfig, DiscardPolicy, RetentionPolicy, StorageType, StreamConfig};
use serde_json::{json, Value};

use crate::broker::advisory::AdvisoryKind;
use crate::broker::config::StartPosition;
use crate::broker::planned_consumer;
use crate::config::{ConsumerMode, RuntimeConfig};

/// The stream settings the configuration does not hold (`svc stream-plan` flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSettings {
    /// Defaults to file: a broker restart keeps the messages.
    pub storage: StorageType,
    /// Defaults to 1 (a single server); warned about.
    pub replicas: usize,
    /// Defaults to limits: messages stay after delivery (for `svc inspect` and replays).
    pub retention: RetentionPolicy,
    /// Defaults to new: a full stream refuses publishes rather than deleting messages not
    /// yet delivered.
    pub discard: DiscardPolicy,
    /// Defaults to 2 minutes (the broker's own default).
    pub duplicate_window: Duration,
    /// Zero: unlimited. Defaults to 7 days.
    pub max_age: Duration,
    /// -1: unlimited. Defaults to 1 GiB.
    pub max_bytes: i64,
    /// -1: unlimited. Defaults to unlimited (bytes and age bound the stream).
    pub max_msgs: i64,
    /// Name of the dead-letter stream; defaults to `dead_letter.expected_stream`, else
    /// `<stream>_DLQ`.
    pub dead_letter_stream: Option<String>,
}

impl Default for StreamSettings {
    fn default() -> Self {
        StreamSettings {
            storage: StorageType::File,
            replicas: 1,
            retention: RetentionPolicy::Limits,
            discard: DiscardPolicy::New,
            duplicate_window: Duration::from_secs(120),
            max_age: Duration::from_secs(7 * 86_400),
            max_bytes: 1 << 30,
            max_msgs: -1,
            dead_letter_stream: None,
        }
    }
}

/// One subject the runner's user needs, with the reason shown to the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub subject: String,
    pub why: &'static str,
}

/// The runner user's permissions: nothing else is needed, nothing here is superfluous.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Permissions {
    pub publish: Vec<Grant>,
    pub subscribe: Vec<Grant>,
}

/// Everything `svc stream-plan` prints and `--apply` creates.
#[derive(Debug, Clone)]
pub struct Plan {
    pub stream: StreamConfig,
    /// The durable consumer exactly as `svc run` creates it.
    pub consumer: ConsumerConfig,
    pub consumer_mode: ConsumerMode,
    /// Where the consumer starts when created (`nats.deliver_policy`).
    pub start: StartPosition,
    pub dead_letter_stream: Option<StreamConfig>,
    pub permissions: Permissions,
    /// The permissions of a `svc replay` user (read-only on the stream).
    pub replay_permissions: Permissions,
    /// The permissions of a `svc dlq redrive` user (empty without a dead-letter stream).
    pub redrive_permissions: Permissions,
    pub warnings: Vec<String>,
}

/// The plan for `cfg` with the stream `settings`; Err: the settings cannot work with it.
pub fn plan(cfg: &RuntimeConfig, settings: &StreamSettings) -> Result<Plan, String> {
    let n = &cfg.nats;
    if settings.max_age > Duration::ZERO && settings.duplicate_window > settings.max_age {
        return Err("--duplicate-window must not be longer than --max-age".into());
    }
    let stream = stream_config(&n.stream, &n.subjects, settings);
    let mut warnings = stream_warnings(settings);
    let dlq = &cfg.dead_letter;
    let dead_letter_stream = if dlq.enabled {
        let name = match (&dlq.expected_stream, &settings.dead_letter_stream) {
            (Some(expected), Some(asked)) if expected != asked => {
                return Err(format!(
                    "--dlq-stream {asked} differs from dead_letter.expected_stream {expected}"
                ))
            }
            (Some(name), _) | (None, Some(name)) => name.clone(),
            (None, None) => format!("{}_DLQ", n.stream),
        };
        if name == n.stream {
            return Err(format!(
                "the dead-letter stream must not be the stream {name} itself"
            ));
        }
        Some(stream_config(
            &name,
            std::slice::from_ref(&dlq.subject),
            settings,
        ))
    } else {
        None
    };
    match n.consumer_mode {
        ConsumerMode::Bind => warnings.push(
            "nats.consumer_mode bind: the runner never creates the consumer; create it with \
             --apply before `svc run`"
                .into(),
        ),
        ConsumerMode::Create | ConsumerMode::Reconcile => {}
    }
    let dlq_name = dead_letter_stream.as_ref().map(|s| s.name.as_str());
    let permissions = permissions(cfg, dlq_name);
    let replay_permissions = replay_permissions(cfg, dlq_name);
    let redrive_permissions = dlq_name
        .map(|dlq| redrive_permissions(cfg, dlq))
        .unwrap_or_default();
    Ok(Plan {
        stream,
        consumer: planned_consumer(n),
        consumer_mode: n.consumer_mode,
        start: n.consumer_settings.start,
        dead_letter_stream,
        permissions,
        replay_permissions,
        redrive_permissions,
        warnings,
    })
}

fn stream_config(name: &str, subjects: &[String], s: &StreamSettings) -> StreamConfig {
    StreamConfig {
        name: name.to_string(),
        subjects: subjects.to_vec(),
        storage: s.storage,
        num_replicas: s.replicas,
        retention: s.retention,
        discard: s.discard,
        duplicate_window: i64::try_from(s.duplicate_window.as_nanos()).unwrap_or(i64::MAX),
        max_age: s.max_age,
        max_bytes: s.max_bytes,
        max_msgs: s.max_msgs,
        max_msgs_per_subject: -1,
        max_consumers: -1,
        ..Default::default()
    }
}

fn stream_warnings(s: &StreamSettings) -> Vec<String> {
    let mut w = Vec::new();
    if s.replicas == 1 {
        w.push(
            "replicas 1: the stream lives on one server; losing its disk loses messages not \
             yet delivered (--replicas 3 on a cluster)"
                .into(),
        );
    }
    if s.storage == StorageType::Memory {
        w.push("storage memory: a broker restart loses every message of the stream".into());
    }
    if s.discard == DiscardPolicy::Old {
        w.push(
            "discard old: at a limit the broker deletes the oldest messages, delivered or not"
                .into(),
        );
    }
    match s.retention {
        RetentionPolicy::WorkQueue => w.push(
            "retention workqueue: a message is gone once acknowledged, and `svc inspect` \
             cannot open its own consumer on the stream"
                .into(),
        ),
        RetentionPolicy::Interest => w.push(
            "retention interest: a message is gone once every consumer acknowledged it (and \
             at once when no consumer exists)"
                .into(),
        ),
        RetentionPolicy::Limits => {}
    }
    if s.max_age.is_zero() && s.max_bytes < 0 && s.max_msgs < 0 {
        w.push("no limit on age, bytes or messages: the stream can fill the broker's disk".into());
    }
    w
}

/// Every subject the runner uses, and why.
fn permissions(cfg: &RuntimeConfig, dead_letter_stream: Option<&str>) -> Permissions {
    let (stream, consumer) = (&cfg.nats.stream, &cfg.nats.consumer);
    let mut p = Permissions::default();
    let mut publish = |subject: String, why| p.publish.push(Grant { subject, why });
    // broker/incarnation.rs.
    publish(
        format!("$JS.API.STREAM.INFO.{stream}"),
        "the stream's incarnation (creation time), at start and when the consumer was created \
         again",
    );
    // bind_consumer and the consumer watch (consumer_watch.rs).
    publish(
        format!("$JS.API.CONSUMER.INFO.{stream}.{consumer}"),
        "look up the consumer at start and watch it while running",
    );
    if cfg.nats.consumer_mode != ConsumerMode::Bind {
        publish(
            format!("$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{consumer}"),
            "create the consumer when missing (and update it: reconcile)",
        );
    }
    publish(
        format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"),
        "pull requests",
    );
    publish(
        format!("$JS.ACK.{stream}.{consumer}.>"),
        "acknowledgements (ACK, NAK, TERM, in progress)",
    );
    if cfg.dead_letter.enabled {
        publish(cfg.dead_letter.subject.clone(), "dead-letter records");
        publish(
            "$JS.API.STREAM.NAMES".into(),
            "start-up check of the stream that captures the dead-letter subject",
        );
        if let Some(dlq) = dead_letter_stream {
            publish(
                format!("$JS.API.STREAM.MSG.GET.{dlq}"),
                "read back a record the dead-letter stream calls a duplicate",
            );
            publish(
                format!("$JS.API.STREAM.INFO.{dlq}"),
                "start-up check of the dead-letter stream's settings (one that removes \
                 confirmed dead letters on its own is warned of)",
            );
        }
    }
    let mut subscribe = |subject: String, why| p.subscribe.push(Grant { subject, why });
    subscribe(
        "_INBOX.>".into(),
        "replies: deliveries of its pull requests, answers to its requests",
    );
    let checkpoints = cfg.custody.enabled && cfg.custody.checkpoints.enabled;
    if cfg.advisories.enabled {
        for kind in AdvisoryKind::ALL {
            let why = if checkpoints && kind == AdvisoryKind::MaxDeliveries {
                "advisories (metrics), and each message the broker gives up on at max_deliver \
                 is listed as a custody checkpoint gap"
            } else {
                "advisories (metrics only)"
            };
            subscribe(kind.subject(stream, consumer), why);
        }
    } else if checkpoints {
        subscribe(
            AdvisoryKind::MaxDeliveries.subject(stream, consumer),
            "each message the broker gives up on at max_deliver is listed as a custody \
             checkpoint gap",
        );
    }
    p
}

/// Every subject `svc replay` uses (`pipeline::replay`, `broker::inspect::read_while`): it
/// reads through an ephemeral push consumer, acknowledges nothing and never touches the
/// durable consumer, so none of the runner's consumer or ACK subjects is here.
pub fn replay_permissions(cfg: &RuntimeConfig, dead_letter_stream: Option<&str>) -> Permissions {
    let stream = &cfg.nats.stream;
    let mut p = Permissions::default();
    let mut publish = |subject: String, why| p.publish.push(Grant { subject, why });
    publish(
        format!("$JS.API.STREAM.INFO.{stream}"),
        "the stream's last sequence (the range's end) and its incarnation",
    );
    publish(
        format!("$JS.API.CONSUMER.CREATE.{stream}"),
        "create the replay's ephemeral consumer (no acknowledgement)",
    );
    publish(
        format!("$JS.API.CONSUMER.DELETE.{stream}.*"),
        "delete it at the end (else the broker drops it 5 s after the replay)",
    );
    publish(
        format!("$JS.API.CONSUMER.INFO.{stream}.*"),
        "its info: confirm the end of the range and a delivery without its payload",
    );
    publish(
        format!("$JS.FC.{stream}.>"),
        "answer the consumer's flow control",
    );
    if cfg.dead_letter.enabled {
        publish(
            cfg.dead_letter.subject.clone(),
            "dead-letter records (marked replayed)",
        );
        if let Some(dlq) = dead_letter_stream {
            publish(
                format!("$JS.API.STREAM.MSG.GET.{dlq}"),
                "read back a record the dead-letter stream calls a duplicate",
            );
        }
    }
    p.subscribe.push(Grant {
        subject: "_INBOX.>".into(),
        why: "the consumer's deliveries, answers to its requests",
    });
    p
}

/// Every subject `svc dlq redrive` uses (`pipeline::replay::redrive`): it finds the
/// dead-letter stream, reads its records through an ephemeral consumer, fetches each original
/// from the source stream by sequence (`STREAM.MSG.GET`, read-only: no consumer on the source
/// stream, nothing acknowledged), publishes a new record for a message refused again and
/// deletes the old record. Nothing of the runner's durable consumer is here.
pub fn redrive_permissions(cfg: &RuntimeConfig, dlq: &str) -> Permissions {
    let stream = &cfg.nats.stream;
    let mut p = Permissions::default();
    let mut publish = |subject: String, why| p.publish.push(Grant { subject, why });
    publish(
        "$JS.API.STREAM.NAMES".into(),
        "find the stream that captures dead_letter.subject",
    );
    publish(
        format!("$JS.API.STREAM.INFO.{stream}"),
        "the source stream's incarnation (a record of an older one is kept)",
    );
    publish(
        format!("$JS.API.STREAM.MSG.GET.{stream}"),
        "fetch each original by sequence (read-only)",
    );
    publish(
        format!("$JS.API.STREAM.INFO.{dlq}"),
        "the dead-letter stream's last sequence (the redrive's end)",
    );
    publish(
        format!("$JS.API.CONSUMER.CREATE.{dlq}"),
        "create the ephemeral consumer that reads the records (no acknowledgement)",
    );
    publish(
        format!("$JS.API.CONSUMER.DELETE.{dlq}.*"),
        "delete it at the end",
    );
    publish(
        format!("$JS.API.CONSUMER.INFO.{dlq}.*"),
        "its info: confirm the end of the records and a record without its payload",
    );
    publish(format!("$JS.FC.{dlq}.>"), "answer its flow control");
    publish(
        format!("$JS.API.STREAM.MSG.DELETE.{dlq}"),
        "remove a record once its message is stored",
    );
    publish(
        cfg.dead_letter.subject.clone(),
        "a new record for a message refused again",
    );
    publish(
        format!("$JS.API.STREAM.MSG.GET.{dlq}"),
        "read back a record the dead-letter stream calls a duplicate",
    );
    p.subscribe.push(Grant {
        subject: "_INBOX.>".into(),
        why: "the consumer's deliveries, answers to its requests",
    });
    p
}

/// The permissions as a nats-server `authorization` block for `user` (JSON, which the
/// server's configuration format reads as it is).
pub fn authorization_block(p: &Permissions, user: &str) -> Value {
    let subjects = |g: &[Grant]| g.iter().map(|g| g.subject.clone()).collect::<Vec<_>>();
    json!({"users": [{
        "user": user,
        "permissions": {
            "publish": {"allow": subjects(&p.publish)},
            "subscribe": {"allow": subjects(&p.subscribe)},
        }
    }]})
}

/// The JetStream API request that creates `stream` (subject and body).
pub fn stream_request(stream: &StreamConfig) -> (String, Value) {
    (
        format!("$JS.API.STREAM.CREATE.{}", stream.name),
        serde_json::to_value(stream).expect("stream configs always serialize"),
    )
}

/// The JetStream API request that creates the durable `consumer` on `stream`.
pub fn consumer_request(stream: &str, consumer: &ConsumerConfig) -> (String, Value) {
    let name = consumer.durable_name.as_deref().unwrap_or_default();
    (
        format!("$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{name}"),
        json!({
            "stream_name": stream,
            "config": serde_json::to_value(consumer).expect("consumer configs always serialize"),
        }),
    )
}

/// A policy's name as the API and the plan's JSON spell it (`file`, `limits`, `new`).
pub fn api_name<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The whole plan as JSON: API requests, the authorization block, the warnings.
pub fn to_json(plan: &Plan, user: &str) -> Value {
    let request = |(api, body): (String, Value)| json!({"api": api, "request": body});
    json!({
        "stream": request(stream_request(&plan.stream)),
        "consumer": request(consumer_request(&plan.stream.name, &plan.consumer)),
        "dead_letter_stream": plan.dead_letter_stream.as_ref().map(|s| request(stream_request(s))),
        "authorization": authorization_block(&plan.permissions, user),
        "replay_authorization": authorization_block(&plan.replay_permissions, &format!("{user}-replay")),
        "redrive_authorization": plan.dead_letter_stream.as_ref().map(|_| authorization_block(&plan.redrive_permissions, &format!("{user}-redrive"))),
        "warnings": plan.warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> RuntimeConfig {
        RuntimeConfig::parse(&format!(
            r#"{{"nats": {{"url": "nats://127.0.0.1:4222", "stream": "ORDERS", "consumer": "svc",
                "subject": "orders.>", "consumer_mode": "create"}},
               "sink": {{"type": "file", "directory": "/tmp/x"}} {extra}}}"#
        ))
        .unwrap()
    }

    fn subjects(g: &[Grant]) -> Vec<&str> {
        g.iter().map(|g| g.subject.as_str()).collect()
    }

    #[test]
    fn the_consumer_is_the_runners_and_the_permissions_follow_the_config() {
        let c = cfg("");
        let p = plan(&c, &StreamSettings::default()).unwrap();
        assert_eq!(p.consumer, planned_consumer(&c.nats));
        assert_eq!(p.stream.subjects, ["orders.>"]);
        assert!(p.dead_letter_stream.is_none());
        assert_eq!(
            subjects(&p.permissions.publish),
            [
                "$JS.API.STREAM.INFO.ORDERS",
                "$JS.API.CONSUMER.INFO.ORDERS.svc",
                "$JS.API.CONSUMER.DURABLE.CREATE.ORDERS.svc",
                "$JS.API.CONSUMER.MSG.NEXT.ORDERS.svc",
                "$JS.ACK.ORDERS.svc.>",
            ]
        );
        assert_eq!(subjects(&p.permissions.subscribe), ["_INBOX.>"]);
        assert!(p.warnings.iter().any(|w| w.starts_with("replicas 1")));
        // Custody checkpoints list what the broker gives up on from its advisory.
        let mut custody = cfg("");
        custody.custody.enabled = true;
        custody.custody.checkpoints.enabled = true;
        let p = plan(&custody, &StreamSettings::default()).unwrap();
        assert_eq!(
            subjects(&p.permissions.subscribe),
            [
                "_INBOX.>",
                "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.ORDERS.svc"
            ]
        );
        let bind = RuntimeConfig::parse(
            r#"{"nats": {"url": "nats://127.0.0.1:4222", "stream": "ORDERS", "consumer": "svc",
                "subject": "orders.>", "consumer_mode": "bind"},
               "sink": {"type": "file", "directory": "/tmp/x"}}"#,
        )
        .unwrap();
        let p = plan(&bind, &StreamSettings::default()).unwrap();
        assert!(!subjects(&p.permissions.publish)
            .iter()
            .any(|s| s.contains("CREATE")));
        assert!(p.warnings.iter().any(|w| w.contains("consumer_mode bind")));

        let c = cfg(
            r#", "dead_letter": {"enabled": true, "subject": "dlq.orders"},
                 "advisories": {"enabled": true}"#,
        );
        let p = plan(&c, &StreamSettings::default()).unwrap();
        let dlq = p.dead_letter_stream.as_ref().unwrap();
        assert_eq!(
            (dlq.name.as_str(), dlq.subjects.as_slice()),
            ("ORDERS_DLQ", &["dlq.orders".to_string()][..])
        );
        let publish = subjects(&p.permissions.publish);
        assert!(publish.contains(&"dlq.orders") && publish.contains(&"$JS.API.STREAM.NAMES"));
        assert!(publish.contains(&"$JS.API.STREAM.MSG.GET.ORDERS_DLQ"));
        assert_eq!(p.permissions.subscribe.len(), 4);
        let block = authorization_block(&p.permissions, "runner");
        assert_eq!(
            block["users"][0]["permissions"]["subscribe"]["allow"][1],
            "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.ORDERS.svc"
        );
    }

    #[test]
    fn several_subjects_and_a_start_are_planned() {
        let c = RuntimeConfig::parse(
            r#"{"nats": {"url": "nats://127.0.0.1:4222", "stream": "ORDERS", "consumer": "svc",
                "subjects": ["orders.a", "payments.>"], "consumer_mode": "reconcile",
                "deliver_policy": "by_start_time", "opt_start_time": "2026-11-28T09:00:00Z"},
               "sink": {"type": "file", "directory": "/tmp/x"}}"#,
        )
        .unwrap();
        let p = plan(&c, &StreamSettings::default()).unwrap();
        assert_eq!(p.stream.subjects, ["orders.a", "payments.>"]);
        assert_eq!(p.consumer.filter_subjects, ["orders.a", "payments.>"]);
        assert_eq!(p.consumer.filter_subject, "");
        let j = to_json(&p, "svc");
        let config = &j["consumer"]["request"]["config"];
        assert_eq!(config["deliver_policy"], "by_start_time");
        assert_eq!(config["opt_start_time"], "2026-11-28T09:00:00Z");
        assert_eq!(
            p.start.to_string(),
            "by_start_time (opt_start_time 2026-11-28T09:00:00Z)"
        );
    }

    #[test]
    fn impossible_settings_are_refused() {
        // Validation keeps the DLQ subject outside nats.subject; the stream names are ours.
        let c = cfg(r#", "dead_letter": {"enabled": true, "subject": "dlq.orders"}"#);
        let same = StreamSettings {
            dead_letter_stream: Some("ORDERS".into()),
            ..Default::default()
        };
        assert!(plan(&c, &same)
            .unwrap_err()
            .contains("must not be the stream ORDERS"));
        let c = cfg(
            r#", "dead_letter": {"enabled": true, "subject": "dlq.orders",
                         "expected_stream": "DLQ"}"#,
        );
        let other = StreamSettings {
            dead_letter_stream: Some("X".into()),
            ..Default::default()
        };
        assert!(plan(&c, &other)
            .unwrap_err()
            .contains("differs from dead_letter.expected_stream"));
        let p = plan(&c, &StreamSettings::default()).unwrap();
        assert_eq!(p.dead_letter_stream.unwrap().name, "DLQ");
        let s = StreamSettings {
            max_age: Duration::from_secs(60),
            ..Default::default()
        };
        assert!(plan(&cfg(""), &s)
            .unwrap_err()
            .contains("--duplicate-window"));
    }

    #[test]
    fn json_holds_the_api_requests() {
        let p = plan(&cfg(""), &StreamSettings::default()).unwrap();
        let j = to_json(&p, "svc");
        assert_eq!(j["stream"]["api"], "$JS.API.STREAM.CREATE.ORDERS");
        assert_eq!(
            j["stream"]["request"]["max_age"],
            7 * 86_400 * 1_000_000_000i64
        );
        assert_eq!(j["stream"]["request"]["discard"], "new");
        assert_eq!(
            j["consumer"]["api"],
            "$JS.API.CONSUMER.DURABLE.CREATE.ORDERS.svc"
        );
        assert_eq!(j["consumer"]["request"]["config"]["ack_policy"], "explicit");
        assert_eq!(j["dead_letter_stream"], Value::Null);
    }
}
