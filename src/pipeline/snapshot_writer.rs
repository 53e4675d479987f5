//! `svc-snapshot`: writes the metrics snapshot every interval, and once more at exit.
//! A failed write is logged and retried next interval; it never touches delivery.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::RunError;
use crate::config::MetricsConfig;
use crate::files::atomic::write_atomically;
use crate::metrics::snapshot::{self, SNAPSHOT_MODE};
use crate::metrics::Metrics;

#[derive(Clone)]
pub struct SnapshotWriter {
    path: Option<PathBuf>,
    namespace: String,
    interval: Duration,
    metrics: Arc<Metrics>,
    started_at: f64,
}

impl SnapshotWriter {
    pub fn new(cfg: &MetricsConfig, metrics: Arc<Metrics>, started_at: f64) -> SnapshotWriter {
        SnapshotWriter {
            path: cfg.enabled.then(|| cfg.snapshot_file.clone()).flatten(),
            namespace: cfg.namespace.clone(),
            interval: cfg.write_interval,
            metrics,
            started_at,
        }
    }

    /// Writes one snapshot now (no-op when metrics are disabled).
    pub fn write_now(&self) {
        let Some(path) = &self.path else { return };
        let snap = snapshot::capture(&self.metrics, &self.namespace, self.started_at);
        let bytes = match serde_json::to_vec_pretty(&snap) {
            Ok(b) => b,
            Err(e) => return log::error!("metrics snapshot: cannot serialize: {e}"),
        };
        if let Err(e) = write_atomically(path, &bytes, SNAPSHOT_MODE) {
            log::warn!("metrics snapshot: cannot write {}: {e}", path.display());
        }
    }

    /// Starts `svc-snapshot`; it ends when `stop` is set (the caller writes the final one).
    pub fn spawn(&self, stop: Arc<AtomicBool>) -> Result<JoinHandle<()>, RunError> {
        let writer = self.clone();
        super::spawn("svc-snapshot", move || {
            if writer.path.is_none() {
                return;
            }
            let mut next = Instant::now();
            while !stop.load(Ordering::SeqCst) {
                if Instant::now() >= next {
                    writer.write_now();
                    next = Instant::now() + writer.interval;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    }
}
