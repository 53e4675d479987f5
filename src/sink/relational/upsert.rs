//! `write_mode: upsert` pieces shared by both engines: the row key taken from the payload with
//! `key_field` (a JSON pointer), and the choice of the newest row per key inside a batch.

use crate::message::envelope::Envelope;

/// The row key under `write_mode: upsert` with `key_field`: `k-` and the payload's value at
/// the pointer (a string as is, a number or boolean as its JSON text).
pub fn field_key(env: &Envelope, pointer: &str) -> Result<String, String> {
    let v: serde_json::Value = serde_json::from_str(env.payload.json())
        .map_err(|e| format!("payload is not JSON for key_field: {e}"))?;
    match v.pointer(pointer) {
        Some(serde_json::Value::String(s)) if !s.is_empty() => Ok(format!("k-{s}")),
        Some(n @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => {
            Ok(format!("k-{n}"))
        }
        Some(_) => Err(format!(
            "key_field {pointer} is not a non-empty string, number or boolean in the payload"
        )),
        None => Err(format!("key_field {pointer} is missing from the payload")),
    }
}

/// Of `idx` (rows of one table), the rows to write: per key the one with the highest stream
/// sequence (the last of equals). The others are superseded inside the batch.
pub fn newest_per_key(batch: &[Envelope], keys: &[String], idx: &[usize]) -> Vec<usize> {
    let mut best: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for &i in idx {
        let e = best.entry(keys[i].as_str()).or_insert(i);
        if batch[i].stream_sequence >= batch[*e].stream_sequence {
            *e = i;
        }
    }
    let mut keep: Vec<usize> = best.into_values().collect();
    keep.sort_unstable();
    keep
}
