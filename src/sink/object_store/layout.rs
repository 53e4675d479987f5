//! Object keys: `[<prefix>/][<key_prefix>/]<strategy key>`.
//!
//! The strategy key comes from [`crate::sink::key::strategy_key`] (shared with the file sink),
//! so unsafe characters are already escaped into deterministic components and a redelivered
//! message lands on the same key. `prefix` and `key_prefix` come only from the configuration;
//! message content never chooses them. `max_key_bytes` is enforced on the final primary key and
//! on its sidecar key, before any request.

use crate::message::envelope::Envelope;
use crate::sink::key::strategy_key;

use super::config::{MetadataMode, ObjectStoreConfig, CHECK_NAMESPACE};

/// The keys one envelope writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectKeys {
    pub primary: String,
    /// Present in `metadata_mode = sidecar`: the primary key plus `sidecar_suffix`.
    pub sidecar: Option<String>,
}

/// Joins the configured prefixes in front of a key below them.
pub fn with_prefixes(cfg: &ObjectStoreConfig, rest: &str) -> String {
    let mut key = String::new();
    for part in [cfg.prefix.as_deref(), cfg.key_prefix.as_deref()]
        .into_iter()
        .flatten()
    {
        key.push_str(part);
        key.push('/');
    }
    key.push_str(rest);
    key
}

/// The keys of an envelope, or why it has none (a permanent failure: redelivery yields the
/// same answer).
pub fn object_keys(cfg: &ObjectStoreConfig, env: &Envelope) -> Result<ObjectKeys, String> {
    let rest = strategy_key(env, cfg.key_strategy, &cfg.object_suffix)?;
    let primary = with_prefixes(cfg, &rest);
    check_len(cfg, &primary)?;
    let sidecar = if cfg.metadata_mode == MetadataMode::Sidecar {
        // Invariant: no primary key may equal another envelope's sidecar key. A sidecar key
        // always ends with sidecar_suffix, so a primary key that does is refused.
        if primary.ends_with(&cfg.sidecar_suffix) {
            return Err(format!(
                "key {primary} ends with sidecar_suffix and would collide with a sidecar"
            ));
        }
        let sidecar = format!("{primary}{}", cfg.sidecar_suffix);
        check_len(cfg, &sidecar)?;
        Some(sidecar)
    } else {
        None
    };
    Ok(ObjectKeys { primary, sidecar })
}

/// The key of a `svc test-sink` probe: below `prefix`, in the reserved `_svc-check/` segment,
/// outside every event namespace (`key_prefix` may not start with it).
pub fn probe_key(cfg: &ObjectStoreConfig, unique: &str) -> String {
    let rest = format!("{CHECK_NAMESPACE}/probe-{unique}{}", cfg.object_suffix);
    match cfg.prefix.as_deref() {
        Some(p) => format!("{p}/{rest}"),
        None => rest,
    }
}

fn check_len(cfg: &ObjectStoreConfig, key: &str) -> Result<(), String> {
    if key.len() > cfg.max_key_bytes {
        // The key itself is not echoed whole: it may be long; its start is enough to find it.
        let start: String = key.chars().take(64).collect();
        return Err(format!(
            "key {start}... is {} bytes, over max_key_bytes ({})",
            key.len(),
            cfg.max_key_bytes
        ));
    }
    Ok(())
}
