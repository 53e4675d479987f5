//! `svc show-effective-config`: the configuration as the runner reads it, every default filled
//! in, in reading order (the order of `docs/configuration.md`). The values are recorded by the
//! readers themselves while they validate ([`crate::document::effective`]), so the output
//! cannot drift from the defaults the runner uses, and it is a valid configuration that reads
//! back to the same [`RuntimeConfig`] and prints the same bytes again.

use serde_json::Value;

use super::RuntimeConfig;
use crate::document::effective;
use crate::document::reader::{parse_json, Invalid};

/// Rounds of filling absent blocks with `{}` (a block found in one round can hold more).
const FILL_ROUNDS: usize = 4;

/// Validates `text` (the same problems as `svc validate`) and renders the effective
/// configuration as pretty JSON. An absent block is shown read from `{}` (every default)
/// wherever `{}` reads to exactly the configuration that leaving it out does; elsewhere it
/// stays `null`.
pub fn effective_json(text: &str) -> Result<String, Invalid> {
    let cfg = RuntimeConfig::parse(text)?;
    let mut doc = parse_json(text)?;
    let mut tried: Vec<String> = Vec::new();
    for _ in 0..FILL_ROUNDS {
        let (_, captured) = effective::capture(|| RuntimeConfig::parse(&doc.to_string()));
        let mut changed = false;
        for path in captured.absent_objects {
            if tried.contains(&path) {
                continue;
            }
            let mut with = doc.clone();
            if effective::insert(&mut with, &path, Value::Object(Default::default()))
                && RuntimeConfig::parse(&with.to_string()).is_ok_and(|c| c == cfg)
            {
                doc = with;
                changed = true;
            }
            tried.push(path);
        }
        if !changed {
            break;
        }
    }
    let (read, captured) = effective::capture(|| RuntimeConfig::parse(&doc.to_string()));
    read?;
    Ok(captured.tree.to_json_pretty())
}
