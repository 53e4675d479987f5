//! `svc-signal`: SIGTERM/SIGINT set the stop flag; SIGUSR1 logs the pipeline dump.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::{Handle, Signals};

use super::{Monitor, RunError};

/// `stop_at` records the first stop signal's time: the shutdown deadline counts from it.
pub fn spawn(
    stop: Arc<AtomicBool>,
    stop_at: Arc<OnceLock<Instant>>,
    monitor: Arc<Monitor>,
) -> Result<Handle, RunError> {
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGUSR1])
        .map_err(|e| RunError::Fatal(format!("cannot install signal handlers: {e}")))?;
    let handle = signals.handle();
    super::spawn("svc-signal", move || {
        for sig in signals.forever() {
            match sig {
                SIGUSR1 => log::info!("{}", monitor.report()),
                _ => {
                    stop_at.get_or_init(Instant::now);
                    if stop.swap(true, Ordering::SeqCst) {
                        log::warn!("second stop signal: still draining in-flight batches");
                    } else {
                        log::info!("stop requested: no new pulls; draining in-flight batches");
                    }
                }
            }
        }
    })?;
    Ok(handle)
}
