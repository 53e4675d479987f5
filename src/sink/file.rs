//! File sink (minimal: one file per event, exclusive create, fsync). Being completed.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use super::key::{strategy_key, KeyStrategy};
use super::{Sink, SinkError, WriteOutcome};
use crate::config::reader::ObjectReader;
use crate::envelope::Envelope;
use crate::metrics::Metrics;

#[derive(Debug, Clone, PartialEq)]
pub struct FileSinkConfig {
    pub directory: PathBuf,
}

impl FileSinkConfig {
    pub fn read(r: &mut ObjectReader<'_>) -> FileSinkConfig {
        let directory = PathBuf::from(r.req_string("directory"));
        FileSinkConfig { directory }
    }
}

pub struct FileSink {
    cfg: FileSinkConfig,
}

impl FileSink {
    pub fn new(cfg: FileSinkConfig, _metrics: Arc<Metrics>) -> Result<FileSink, SinkError> {
        fs::create_dir_all(&cfg.directory)
            .map_err(|e| SinkError::new("file", format!("create output directory: {e}")))?;
        Ok(FileSink { cfg })
    }

    fn write_one(&self, env: &Envelope) -> WriteOutcome {
        let key = match strategy_key(env, KeyStrategy::IdempotencyKey, ".json") {
            Ok(k) => k,
            Err(e) => return WriteOutcome::Permanent(SinkError::new("file", e)),
        };
        let path = self.cfg.directory.join(&key);
        let result = (|| {
            let dir = path.parent().expect("key has a directory");
            fs::create_dir_all(dir)?;
            let mut f = match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
                Err(e) => return Err(e),
            };
            let body = serde_json::to_vec(env).map_err(std::io::Error::other)?;
            f.write_all(&body)?;
            f.sync_all()?;
            File::open(dir)?.sync_all()?;
            Ok(true)
        })();
        match result {
            Ok(true) => WriteOutcome::Durable,
            Ok(false) => WriteOutcome::AlreadyDurable,
            Err(e) => WriteOutcome::Transient(SinkError::new("file", format!("write {key}: {e}"))),
        }
    }
}

impl Sink for FileSink {
    fn kind(&self) -> &'static str {
        "file"
    }

    fn write_batch(&self, batch: &[Envelope]) -> Vec<WriteOutcome> {
        batch.iter().map(|e| self.write_one(e)).collect()
    }

    fn check(&self) -> Result<String, SinkError> {
        Ok(format!(
            "directory {} is writable",
            self.cfg.directory.display()
        ))
    }
}
