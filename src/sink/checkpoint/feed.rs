//! What the sink workers and the spool's drain tell the `svc-checkpoint` thread: the bounded
//! channel they never wait on ([`Feed`], [`DrainFeed`]) and its events.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, TrySendError};

use super::read_record;
use crate::message::protection::custody::{Custodian, CustodyConfig};
use crate::metrics::Metrics;
use crate::text::peer::PeerText;

/// The stream and the stream's incarnation (empty when not known) a sequence is of: one
/// checkpoint covers one origin only.
pub type Origin = (Arc<str>, Arc<str>);

/// What a sink worker tells the thread.
#[derive(Debug, Clone)]
pub enum Event {
    Committed(Origin, u64, [u8; 32]),
    Gap(Origin, u64, &'static str),
    /// The stop gave up waiting for the sink ([`Feed::end_now`]): cut what is pending and end,
    /// whoever still holds a feed.
    End,
}

/// The sink workers' and `svc-ack`'s side of the channel: never blocks.
#[derive(Debug)]
pub struct Feed {
    pub(super) tx: Sender<Event>,
    pub(super) overflowed: Arc<AtomicBool>,
    /// Counts what a full channel drops (`checkpoint_records_untold_total`,
    /// `checkpoint_gaps_unlisted_total`).
    pub(super) metrics: Arc<Metrics>,
    pub(super) signed_gaps: Arc<SignedGaps>,
    /// True while the thread reads the store back (`Writer::rescan`): no checkpoint is cut
    /// then, for as long as the read takes.
    pub(super) rescanning: Arc<AtomicBool>,
    /// True while the last checkpoint could not be stored.
    pub(super) failing: Arc<AtomicBool>,
    /// The put under way, if any.
    pub(super) put: Arc<PutWatch>,
    /// Gaps told while the channel was full. A committed record dropped then is found again
    /// by the rescan after the overflow; a gap is not (nothing stores it but the checkpoint,
    /// and a message settled unsigned or abandoned at `max_deliver` is not delivered again),
    /// so it waits here for the next cut, [`SPILLED_GAPS_KEPT`] at most (atk56).
    pub(super) spilled: Arc<Spilled>,
    /// Set by [`Feed::end_now`]; the thread ends at its next look.
    pub(super) ending: Arc<AtomicBool>,
}

/// Gaps (origin, sequence -> first reason) told while the channel was full: one entry per
/// gap, so a gap told again (a held dead letter on each redelivery) takes no second slot
/// (atk58: 2,000 held refusals told ten times a second filled the 65,536 with copies, and a
/// real gap past them was dropped).
pub(super) type Spilled = Mutex<HashMap<(Origin, u64), &'static str>>;

/// Gaps kept aside at most while the channel is full; past it each is logged as listed
/// nowhere.
pub const SPILLED_GAPS_KEPT: usize = 65_536;

/// A put that takes this long counts as a failing store.
pub const PUT_HANGS_AFTER: Duration = Duration::from_secs(1);

/// When the checkpoint put under way began, so that a put that hangs (a table locked, a
/// store that does not answer until its deadline) counts as a failing store once it has
/// taken [`PUT_HANGS_AFTER`], not only once it failed (atk54 finding 2).
#[derive(Debug)]
pub struct PutWatch {
    base: Instant,
    /// Milliseconds since `base` plus one when the put began; 0 when none is under way.
    since: AtomicU64,
}

impl PutWatch {
    pub(super) fn new() -> PutWatch {
        PutWatch {
            base: Instant::now(),
            since: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }

    pub(super) fn begin(&self) {
        self.since.store(self.now(), Ordering::Relaxed);
    }

    pub(super) fn end(&self) {
        self.since.store(0, Ordering::Relaxed);
    }

    fn hangs(&self) -> bool {
        let since = self.since.load(Ordering::Relaxed);
        since != 0 && self.now().saturating_sub(since) >= PUT_HANGS_AFTER.as_millis() as u64
    }
}

impl Feed {
    pub fn send(&self, e: Event) {
        let Err(TrySendError::Full(e)) = self.tx.try_send(e) else {
            return;
        };
        self.overflowed.store(true, Ordering::Relaxed);
        if let Event::Gap(o, seq, why) = e {
            let mut spilled = self.spilled.lock().unwrap_or_else(PoisonError::into_inner);
            let kept = spilled.len() < SPILLED_GAPS_KEPT || spilled.contains_key(&(o.clone(), seq));
            if kept {
                spilled.entry((o, seq)).or_insert(why);
                return;
            }
            log::error!(
                "custody checkpoints: stream {} sequence {seq}: a gap ({why}) told while the \
                 checkpoint thread is {SPILLED_GAPS_KEPT} gaps behind: this line is its only \
                 record",
                PeerText::new(&o.0)
            );
            return Metrics::add(&self.metrics.counters.checkpoint_gaps_unlisted_total, 1);
        }
        Metrics::add(&self.metrics.counters.checkpoint_records_untold_total, 1);
    }

    /// The stop's deadline is near and a sink worker has not ended (it would end the thread by
    /// dropping its feed): the thread cuts what is pending, gaps told until now included,
    /// and ends without waiting for the rest.
    pub fn end_now(&self) {
        self.ending.store(true, Ordering::SeqCst);
        let _ = self.tx.try_send(Event::End);
    }

    /// The gaps kept aside while the channel was full (`Writer::cut` takes them).
    pub(super) fn take_spilled(spilled: &Spilled) -> Vec<(Origin, u64, &'static str)> {
        let taken = std::mem::take(&mut *spilled.lock().unwrap_or_else(PoisonError::into_inner));
        taken
            .into_iter()
            .map(|((o, seq), why)| (o, seq, why))
            .collect()
    }

    /// Whether a stored checkpoint of this runner lists `seq` of `o` as a gap: sign first,
    /// settle last. `svc-ack` acknowledges (after its dead letter) or terminates a message it
    /// gives up on only then (`pipeline/gap_hold.rs`), so a kill -9 leaves no settled message
    /// that no checkpoint lists (the broker delivers an unsettled one again, and the restart's
    /// chain read back fills this).
    pub fn gap_signed(&self, o: &Origin, seq: u64) -> bool {
        self.signed_gaps.holds(o, seq)
    }

    /// How many times stored checkpoints (or the chain read at start) were noted so far: a
    /// hold need look for newly signed gaps only when it moved (`pipeline/gap_hold.rs`).
    pub fn signed_epoch(&self) -> u64 {
        self.signed_gaps.1.load(Ordering::Relaxed)
    }

    /// Whether a stored checkpoint of this runner lists `seq` of `o` as a gap whose dead
    /// letter was confirmed ([`DEAD_LETTERED`]).
    pub fn gap_dead_lettered(&self, o: &Origin, seq: u64) -> bool {
        self.signed_gaps.reason(o, seq) == Some(true)
    }

    /// Whether the thread is reading the store back now (no checkpoint is cut meanwhile: a
    /// locked table or a store of millions of records makes that minutes; atk53b finding 4).
    pub fn rescanning(&self) -> bool {
        self.rescanning.load(Ordering::Relaxed)
    }

    /// Whether the store is failing: the last checkpoint could not be stored, or the put under
    /// way has taken [`PUT_HANGS_AFTER`] already.
    pub fn store_failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed) || self.put.hangs()
    }
}

/// Gaps signed lately, the newest [`SIGNED_GAPS_KEPT`], noted by the `svc-checkpoint` thread
/// once the checkpoint listing them is stored (or the chain read at start): a message refused on
/// every delivery (no DLQ, no `max_deliveries`) is listed in one checkpoint, not in every one
/// after it (atk50a finding 6). Older ones are forgotten: the verifier counts a gap listed
/// twice once, and one forgotten before its `+TERM` is listed again, then terminated. The
/// second field counts the notes ([`Feed::signed_epoch`]).
#[derive(Debug, Default)]
pub(super) struct SignedGaps(Mutex<Remembered>, AtomicU64);

#[derive(Debug, Default)]
struct Remembered {
    /// Each gap, and whether it is listed as [`DEAD_LETTERED`].
    held: BTreeMap<(Origin, u64), bool>,
    order: VecDeque<(Origin, u64)>,
}

/// The reason a checkpoint lists a gap with when its dead letter was confirmed.
pub const DEAD_LETTERED: &str = "dead_lettered";

/// Every reason a gap is told with (the pipeline's `GapReason` codes and its
/// `abandoned_at_max_deliver`; a test there holds the list complete). A gap read back from a
/// file takes its reason from here: any other text is refused.
pub const GAP_REASONS: [&str; 4] = [
    "refused_before_sink",
    DEAD_LETTERED,
    "terminated",
    "abandoned_at_max_deliver",
];

/// The known reason spelled `text`.
pub fn gap_reason(text: &str) -> Option<&'static str> {
    GAP_REASONS.into_iter().find(|r| *r == text)
}

/// Signed gaps remembered.
const SIGNED_GAPS_KEPT: usize = 65_536;

impl SignedGaps {
    pub(super) fn holds(&self, o: &Origin, seq: u64) -> bool {
        self.reason(o, seq).is_some()
    }

    /// Whether the gap is listed, and if so whether as [`DEAD_LETTERED`].
    fn reason(&self, o: &Origin, seq: u64) -> Option<bool> {
        let r = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        r.held.get(&(o.clone(), seq)).copied()
    }

    /// Notes the gaps (sequence, reason) a stored checkpoint of origin `o` lists.
    pub(super) fn note<'a>(&self, o: &Origin, gaps: impl Iterator<Item = (u64, &'a str)>) {
        let mut r = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        self.1.fetch_add(1, Ordering::Relaxed);
        for (seq, why) in gaps {
            let dead_lettered = why == DEAD_LETTERED;
            let first = r.held.insert((o.clone(), seq), dead_lettered).is_none();
            if first {
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

#[cfg(test)]
mod spill_tests {
    use super::*;

    #[test]
    fn a_gap_told_while_the_channel_is_full_waits_aside_a_record_is_dropped() {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let spilled = Arc::new(Mutex::new(HashMap::new()));
        let feed = Feed {
            tx,
            overflowed: Arc::new(AtomicBool::new(false)),
            metrics: Arc::new(Metrics::default()),
            signed_gaps: Arc::new(SignedGaps::default()),
            rescanning: Arc::new(AtomicBool::new(false)),
            failing: Arc::new(AtomicBool::new(false)),
            put: Arc::new(PutWatch::new()),
            spilled: Arc::clone(&spilled),
            ending: Arc::new(AtomicBool::new(false)),
        };
        let o: Origin = (Arc::from("S"), Arc::from(""));
        feed.send(Event::Committed(o.clone(), 1, [0; 32]));
        feed.send(Event::Committed(o.clone(), 2, [0; 32]));
        feed.send(Event::Gap(o.clone(), 3, "abandoned_at_max_deliver"));
        for _ in 0..3 {
            feed.send(Event::Gap(o.clone(), 3, "terminated"));
        }
        assert!(feed.overflowed.load(Ordering::Relaxed));
        let untold = &feed.metrics.counters.checkpoint_records_untold_total;
        assert_eq!(untold.load(Ordering::Relaxed), 1, "record 2 dropped");
        let aside = Feed::take_spilled(&spilled);
        assert_eq!(aside.len(), 1, "a gap told again takes no second slot");
        assert_eq!((aside[0].1, aside[0].2), (3, "abandoned_at_max_deliver"));
        assert!(Feed::take_spilled(&spilled).is_empty(), "taken once");
        for seq in 0..=SPILLED_GAPS_KEPT as u64 {
            feed.send(Event::Gap(o.clone(), 10 + seq, "terminated"));
        }
        let unlisted = &feed.metrics.counters.checkpoint_gaps_unlisted_total;
        assert_eq!(unlisted.load(Ordering::Relaxed), 1, "one past the bound");
        assert_eq!(Feed::take_spilled(&spilled).len(), SPILLED_GAPS_KEPT);
        assert_eq!(rx.len(), 1);
    }
}
