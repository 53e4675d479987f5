//! The paragraph `svc validate` prints after success: what the runner will consume, where it
//! writes, which protections are on, where dead letters and metrics go. Names and paths only
//! (a config holds no secret, and no value is read from the environment here).

use crate::config::{ConsumerMode, RuntimeConfig};
use crate::sink::SinkConfig;

/// One paragraph, lines wrapped by the caller's terminal.
pub fn paragraph(cfg: &RuntimeConfig) -> String {
    let n = &cfg.nats;
    let mut parts = vec![format!(
        "Consumes stream {} through durable consumer {} filtered on {}; the consumer {}.",
        n.stream,
        n.consumer,
        n.subjects.join(", "),
        match n.consumer_mode {
            ConsumerMode::Bind => "must already exist",
            ConsumerMode::Create => "is created when missing",
            ConsumerMode::Reconcile =>
                "is created when missing, or its AckWait, MaxAckPending, MaxDeliver and BackOff \
                 are brought to this config",
        }
    )];
    if n.consumer_mode != ConsumerMode::Bind && n.consumer_settings.start != Default::default() {
        parts.push(format!(
            "A consumer created by the runner starts at deliver_policy {}.",
            n.consumer_settings.start
        ));
    }
    parts.push(format!("Writes to {}.", sink(&cfg.sink)));
    let protections: Vec<&str> = [
        (cfg.payload_encryption.enabled, "payload encryption"),
        (cfg.authenticity.enabled, "publisher authenticity"),
        (cfg.custody.enabled, "custody evidence"),
        (cfg.security_labels.enabled, "security labels"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect();
    parts.push(if protections.is_empty() {
        "Protections: none.".to_string()
    } else {
        format!("Protections: {}.", protections.join(", "))
    });
    let governance: Vec<String> = [
        (
            cfg.mission_metadata.enabled,
            format!(
                "mission metadata ({} profile(s))",
                cfg.mission_metadata.profiles.len()
            ),
        ),
        (
            cfg.pre_sink_policy.enabled,
            format!(
                "pre-sink policy ({} rule(s), unmatched subjects {})",
                cfg.pre_sink_policy.rules.len(),
                if cfg.pre_sink_policy.allow_unmatched {
                    "allowed"
                } else {
                    "refused"
                }
            ),
        ),
        (cfg.size_policy.enabled, "size policy".to_string()),
    ]
    .into_iter()
    .filter_map(|(on, text)| on.then_some(text))
    .collect();
    if !governance.is_empty() {
        parts.push(format!("Governance: {}.", governance.join(", ")));
    }
    parts.push(if cfg.dead_letter.enabled {
        format!("Dead letters go to {}.", cfg.dead_letter.subject)
    } else {
        "No dead-letter queue (permanent failures are left to the broker's limits).".to_string()
    });
    parts.push(match (&cfg.metrics.enabled, &cfg.metrics.snapshot_file) {
        (true, Some(path)) => format!("Metrics snapshot: {}.", path.display()),
        _ => "No metrics snapshot.".to_string(),
    });
    if cfg.advisories.enabled {
        parts.push("Broker advisories are watched.".to_string());
    }
    parts.join(" ")
}

/// `file`, or `fanout (a: file, b: object_store)` with every child.
fn sink(s: &SinkConfig) -> String {
    match s {
        SinkConfig::Fanout(f) => {
            let children: Vec<String> = f
                .sinks
                .iter()
                .map(|(name, c)| format!("{name}: {}", sink(c)))
                .collect();
            format!("a fanout sink ({})", children.join(", "))
        }
        other => format!("a {} sink", other.kind()),
    }
}

/// Overlapping route pairs `validate` names one by one; the rest are counted in one line (a
/// thousand routes under one wildcard would otherwise print half a million lines).
const MAX_OVERLAP_WARNINGS: usize = 20;

/// Warnings `validate` prints after the summary: fan-out routes that overlap in `first` mode
/// (the earlier route takes every message both could match) and `no_match: ignore`.
pub fn warnings(cfg: &RuntimeConfig) -> Vec<String> {
    let mut out = spool_warnings(cfg);
    let SinkConfig::Fanout(f) = &cfg.sink else {
        return out;
    };
    let overlaps = f.routing.overlaps();
    out.extend(overlaps.iter().take(MAX_OVERLAP_WARNINGS).map(|(a, b)| {
        format!(
            "fan-out routes {a} and {b} overlap (mode first): a message matching both \
             takes {a} only"
        )
    }));
    if overlaps.len() > MAX_OVERLAP_WARNINGS {
        out.push(format!(
            "fan-out routes: {} more overlapping pairs not listed ({} in all)",
            overlaps.len() - MAX_OVERLAP_WARNINGS,
            overlaps.len()
        ));
    }
    if f.routing.enabled && f.routing.unmatched == crate::sink::fanout::Unmatched::Ignore {
        out.push(
            "fan-out no_match is ignore: a message no route matches is acknowledged and \
             stored nowhere"
                .into(),
        );
    }
    out
}

/// A spool asked to store records in clear, or to read them beside a key (migration only).
fn spool_warnings(cfg: &RuntimeConfig) -> Vec<String> {
    let spool = match (&cfg.sink, &cfg.spool) {
        (SinkConfig::Spool(s), _) => &s.spool,
        (_, Some(s)) => s,
        _ => return Vec::new(),
    };
    if spool.encryption.is_some() {
        if !spool.allow_unencrypted {
            return Vec::new();
        }
        return vec![format!(
            "the spool at {} has a key and allow_unencrypted: true: that is for migrating a \
             spool written in clear only (its records in clear are read from the segments \
             written before encryption was turned on); remove allow_unencrypted once the \
             spool has drained",
            crate::text::terminal::text_line(&spool.dir.display().to_string())
        )];
    }
    vec![format!(
        "the spool at {} stores records unencrypted (allow_unencrypted: true, no encryption): \
         payloads lie in clear on its disk",
        crate::text::terminal::text_line(&spool.dir.display().to_string())
    )]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_beside_allow_unencrypted_is_warned_as_migration_only() {
        let spool = |extra: serde_json::Value| {
            let mut spool = serde_json::json!({"dir": "/tmp/s", "max_bytes": 1_000_000, "encryption":
                {"key_id": "k", "key_file": "/tmp/k.key"}});
            spool
                .as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            let cfg = serde_json::json!({
                "nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c",
                         "subject": "s.>"},
                "sink": {"type": "file", "directory": "/tmp/x"},
                "spool": spool
            });
            warnings(&RuntimeConfig::parse(&cfg.to_string()).unwrap())
        };
        assert!(spool(serde_json::json!({})).is_empty());
        let w = spool(serde_json::json!({"allow_unencrypted": true}));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("migrating") && w[0].contains("only"),
            "{}",
            w[0]
        );
    }

    #[test]
    fn overlapping_routes_are_named_up_to_a_bound_then_counted() {
        // 30 routes under one wildcard: 435 overlapping pairs.
        let routes: Vec<serde_json::Value> = (0..30)
            .map(|i| serde_json::json!({"name": format!("r{i}"), "match": {"subject": "s.>"}, "targets": ["a"]}))
            .collect();
        let cfg = serde_json::json!({
            "nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c",
                     "subject": "s.>"},
            "sink": {"type": "fanout", "sinks": {"a": {"type": "file", "directory": "/tmp/x"}},
                     "routing": {"enabled": true, "routes": routes}}
        });
        let cfg = RuntimeConfig::parse(&cfg.to_string()).unwrap();
        let w = warnings(&cfg);
        assert_eq!(w.len(), MAX_OVERLAP_WARNINGS + 1, "{w:#?}");
        assert!(w[0].contains("routes r0 and r1 overlap"), "{}", w[0]);
        assert_eq!(
            w[MAX_OVERLAP_WARNINGS],
            "fan-out routes: 415 more overlapping pairs not listed (435 in all)"
        );
    }
}
