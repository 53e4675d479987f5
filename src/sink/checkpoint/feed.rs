//! What the sink workers and the spool's drain tell the `svc-checkpoint` thread: the bounded
//! channel they never wait on ([`Feed`], [`DrainFeed`]) and its events.

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

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

/// The sink workers' and `svc-ack`'s side of the channel: never blocks.
#[derive(Debug)]
pub struct Feed {
    pub(super) tx: Sender<Event>,
    pub(super) overflowed: Arc<AtomicBool>,
    pub dropped: AtomicU64,
    pub(super) signed_gaps: Arc<SignedGaps>,
    /// True while the thread reads the store back (`Writer::rescan`): no checkpoint is cut
    /// then, for as long as the read takes.
    pub(super) rescanning: Arc<AtomicBool>,
    /// True while the last checkpoint could not be stored.
    pub(super) failing: Arc<AtomicBool>,
}

impl Feed {
    pub fn send(&self, e: Event) {
        if let Err(TrySendError::Full(_)) = self.tx.try_send(e) {
            self.overflowed.store(true, Ordering::Relaxed);
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether a stored checkpoint of this runner lists `seq` of `o` as a gap: sign first,
    /// settle last. `svc-ack` acknowledges (after its dead letter) or terminates a message it
    /// gives up on only then (`pipeline/gap_hold.rs`), so a kill -9 leaves no settled message
    /// that no checkpoint lists (the broker delivers an unsettled one again, and the restart's
    /// chain read back fills this).
    pub fn gap_signed(&self, o: &Origin, seq: u64) -> bool {
        self.signed_gaps.holds(o, seq)
    }

    /// Whether the thread is reading the store back now (no checkpoint is cut meanwhile: a
    /// locked table or a store of millions of records makes that minutes; atk53b finding 4).
    pub fn rescanning(&self) -> bool {
        self.rescanning.load(Ordering::Relaxed)
    }

    /// Whether the last checkpoint could not be stored (the store failing).
    pub fn store_failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }
}

/// Gaps signed lately, the newest [`SIGNED_GAPS_KEPT`], noted by the `svc-checkpoint` thread
/// once the checkpoint listing them is stored (or the chain read at start): a message refused on
/// every delivery (no DLQ, no `max_deliveries`) is listed in one checkpoint, not in every one
/// after it (atk50a finding 6). Older ones are forgotten: the verifier counts a gap listed
/// twice once, and one forgotten before its `+TERM` is listed again, then terminated.
#[derive(Debug, Default)]
pub(super) struct SignedGaps(Mutex<Remembered>);

#[derive(Debug, Default)]
struct Remembered {
    held: BTreeSet<(Origin, u64)>,
    order: VecDeque<(Origin, u64)>,
}

/// Signed gaps remembered.
const SIGNED_GAPS_KEPT: usize = 65_536;

impl SignedGaps {
    pub(super) fn holds(&self, o: &Origin, seq: u64) -> bool {
        let r = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        r.held.contains(&(o.clone(), seq))
    }

    pub(super) fn note(&self, o: &Origin, seqs: impl Iterator<Item = u64>) {
        let mut r = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        for seq in seqs {
            if r.held.insert((o.clone(), seq)) {
                r.order.push_back((o.clone(), seq));
            }
            if r.order.len() > SIGNED_GAPS_KEPT {
                if let Some(old) = r.order.pop_front() {
                    r.held.remove(&old);
                }
            }
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
