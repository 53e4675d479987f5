//! The object-store sink's checkpoint store ([`ObjectStore`]).

use std::sync::Arc;

use super::{checkpoints_bound, records_bound, records_of, CheckpointStore, MAX_AUDIT_CHECKPOINTS};
use crate::message::protection::checkpoint::MAX_CHECKPOINT_BYTES;
use crate::message::protection::checkpoint_audit::StoredRecord;
use crate::message::protection::custody::Custodian;

/// Most objects an object-store audit lists.
pub const MAX_LISTED_OBJECTS: usize = 10_000_000;

/// The object store's checkpoints: `<prefix>/_svc-custody/checkpoints/<hex runner id>-<index>.json`
/// (a reserved segment no `key_prefix` may start with), each one PUT (durable when the store
/// answers 2xx).
pub struct ObjectStore {
    sink: crate::sink::object_store::ObjectStoreSink,
}

impl ObjectStore {
    pub fn new(
        cfg: &crate::sink::object_store::config::ObjectStoreConfig,
    ) -> Result<ObjectStore, String> {
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let sink = crate::sink::object_store::ObjectStoreSink::new(cfg.clone(), metrics)
            .map_err(|e| crate::text::error_chain(&e))?;
        Ok(ObjectStore { sink })
    }

    fn below_prefix(&self, rest: &str) -> String {
        match self.sink.config().prefix.as_deref() {
            Some(p) => format!("{p}/{rest}"),
            None => rest.to_string(),
        }
    }

    fn checkpoint_dir(&self) -> String {
        use crate::sink::object_store::config::CUSTODY_NAMESPACE;
        self.below_prefix(&format!("{CUSTODY_NAMESPACE}/checkpoints/"))
    }
}

impl CheckpointStore for ObjectStore {
    fn put(&self, runner_id: &str, index: u64, bytes: &[u8]) -> Result<(), String> {
        let key = self.checkpoint_key(runner_id, index);
        // Conditional: an existing checkpoint is never replaced (a store that ignores
        // If-None-Match is refused by `svc test-sink`'s probe; docs/payload-protection.md).
        let headers = [
            ("content-type".to_string(), "application/json".to_string()),
            ("if-none-match".to_string(), "*".to_string()),
        ];
        match self.sink.client().put_object(&key, bytes, &headers) {
            Ok(_) => Ok(()),
            Err(e) if e.is_precondition_failed() => Err(format!(
                "put {key}: a checkpoint exists under that key already; it is never overwritten"
            )),
            Err(e) => Err(format!("put {key}: {e}")),
        }
    }

    fn checkpoints(&self) -> Result<Vec<(String, String)>, String> {
        self.read_checkpoints(&self.checkpoint_dir())
    }

    /// The objects named for `runner_id` only (its hex id, then `-`, which hex never holds).
    fn chain(&self, runner_id: &str) -> Result<Vec<(String, String)>, String> {
        let hex = crate::text::hex::lower(runner_id.as_bytes());
        self.read_checkpoints(&format!("{}{hex}-", self.checkpoint_dir()))
    }

    /// The one object named for (`runner_id`, `index`): one GET, never a listing.
    fn get(&self, runner_id: &str, index: u64) -> Result<Option<String>, String> {
        let key = self.checkpoint_key(runner_id, index);
        match self
            .sink
            .client()
            .get_object(&key, MAX_CHECKPOINT_BYTES + 1)
        {
            Ok(r) => Ok(r.map(|r| String::from_utf8(r.body).unwrap_or_default())),
            Err(e) => Err(format!("get {key}: {e}")),
        }
    }

    fn records(&self) -> Result<Vec<StoredRecord>, String> {
        self.scan(None)
    }

    fn scan(&self, seal: Option<&Custodian>) -> Result<Vec<StoredRecord>, String> {
        use crate::sink::object_store::config::{CHECK_NAMESPACE, CUSTODY_NAMESPACE};
        let cfg = self.sink.config();
        let client = self.sink.client();
        let root = self.below_prefix("");
        let reserved = [CHECK_NAMESPACE, CUSTODY_NAMESPACE].map(|s| self.below_prefix(s));
        let mut out = Vec::new();
        for key in client.list_keys(&root, MAX_LISTED_OBJECTS)? {
            let sidecar = cfg.metadata_mode
                == crate::sink::object_store::config::MetadataMode::Sidecar
                && key.ends_with(&cfg.sidecar_suffix);
            if sidecar || reserved.iter().any(|r| key.starts_with(r.as_str())) {
                continue;
            }
            let place = crate::text::peer::PeerText::new(&key).to_string();
            match client.get_object(&key, cfg.max_object_bytes) {
                Ok(Some(r)) => match String::from_utf8(r.body) {
                    Ok(text) => {
                        records_of(&place, &text, seal, &mut out);
                        records_bound(out.len())?;
                    }
                    Err(_) => out.push(StoredRecord {
                        place,
                        read: Err("not UTF-8 JSON (compressed?)".into()),
                    }),
                },
                Ok(None) => {}
                Err(e) => out.push(StoredRecord {
                    place,
                    read: Err(format!("cannot read: {e}")),
                }),
            }
        }
        Ok(out)
    }
}

impl ObjectStore {
    /// The key of checkpoint `index` of `runner_id`.
    fn checkpoint_key(&self, runner_id: &str, index: u64) -> String {
        format!(
            "{}{}-{index:020}.json",
            self.checkpoint_dir(),
            crate::text::hex::lower(runner_id.as_bytes())
        )
    }

    /// The checkpoint objects whose keys begin with `prefix`, as (key, text), bounded.
    fn read_checkpoints(&self, prefix: &str) -> Result<Vec<(String, String)>, String> {
        let client = self.sink.client();
        let (mut out, mut total) = (Vec::new(), 0usize);
        for key in client.list_keys(prefix, MAX_AUDIT_CHECKPOINTS)? {
            let text = match client.get_object(&key, MAX_CHECKPOINT_BYTES + 1) {
                Ok(Some(r)) => String::from_utf8(r.body).unwrap_or_default(),
                Ok(None) => continue,
                Err(e) => return Err(format!("get {key}: {e}")),
            };
            checkpoints_bound(&mut total, &text)?;
            out.push((key, text));
        }
        Ok(out)
    }
}
