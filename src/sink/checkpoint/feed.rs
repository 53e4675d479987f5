//! What the sink workers and the spool's drain tell the `svc-checkpoint` thread: the bounded
//! channel they never wait on ([`Feed`], [`DrainFeed`]) and its events.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Sender, TrySendError};

use super::read_record;
use crate::message::protection::custody::{Custodian, CustodyConfig};
use crate::text::peer::PeerText;

/// The stream and the stream's incarnation (empty when not known) a sequence is of: one
/// checkpoint covers one origin only.
pub type Origin = (Arc<str>, Arc<str>);

/// What a sink worker tells the thread.
#[derive(Debug, Clone)]
pub enum Event {
    Committed(Origin, u64, [u8; 32]),
    Gap(Origin, u64, &'static str),
}

/// The sink workers' side of the channel: never blocks.
#[derive(Debug)]
pub struct Feed {
    pub(super) tx: Sender<Event>,
    pub(super) overflowed: Arc<AtomicBool>,
    pub dropped: AtomicU64,
}

impl Feed {
    pub fn send(&self, e: Event) {
        if let Err(TrySendError::Full(_)) = self.tx.try_send(e) {
            self.overflowed.store(true, Ordering::Relaxed);
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The fallback spool's drain's side of the channel: a spooled record is reported durable
/// (and ACKed) before it is in the sink, so the sink workers do not tell it; the drain tells
/// it once the sink reported the drained step durable, with the digest computed from the
/// record as stored, as the rescan computes it.
pub struct DrainFeed {
    feed: Arc<Feed>,
    custodian: Custodian,
}

impl DrainFeed {
    pub fn new(feed: Arc<Feed>, custody: &CustodyConfig) -> Result<DrainFeed, String> {
        let custodian = Custodian::load(custody)?;
        Ok(DrainFeed { feed, custodian })
    }

    /// One record the sink now holds, as the spool stored it (the file sink's record text):
    /// told when it is this runner's and its custody seal verifies (as the rescan checks); a
    /// record of another runner is left to that runner's rescan; one failing its seal is
    /// logged and never signed. `place` names it in the log (formatted only then).
    pub fn delivered(&self, record: &[u8], place: impl std::fmt::Display) {
        let read = std::str::from_utf8(record)
            .map_err(|_| "not UTF-8".to_string())
            .and_then(|t| read_record(t, Some(&self.custodian)));
        match read {
            Ok(r) if r.runner_id == self.custodian.runner_id() => {
                let origin: Origin = (Arc::from(r.stream), Arc::from(r.incarnation));
                self.feed
                    .send(Event::Committed(origin, r.sequence, r.digest));
            }
            Ok(_) => {}
            Err(e) => log::error!(
                "custody checkpoints: drained record at {}: {}; never signed",
                PeerText::new(&place.to_string()),
                PeerText::new(&e)
            ),
        }
    }
}
