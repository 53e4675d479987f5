//! The batch worker pool of the sinks whose batch is many slow, independent round trips: the
//! object store's puts (`svc-s3-put-N`) and the HTTP sink's requests (`svc-http-N`).
//!
//! A pool is `threads` named threads, started when the sink is built and shared by every
//! `svc-sink-N` worker. [`Pool::run`] (on a sink worker) takes a batch whose items (an object,
//! a request) the sink has prepared itself (microseconds each, where a round trip takes
//! milliseconds), puts them in one shared [`Work`], sends one token per thread that can help
//! (at most one per item) through a bounded channel, and sleeps until every item is done. A
//! thread that takes a token claims the batch's items one at a time (an atomic index) and
//! writes each item's outcomes into the slots of the batch indexes it covers, until none is
//! left; the one that completes the last item wakes the worker ([`Countdown`]). Outcomes are
//! thus in batch order, and the hand-offs are per batch, not per item (one per object cost a
//! wake-up of the worker per object, a measurable share of the object-store sink's CPU).
//! Tokens queue in order, so batches are served first come, first served, and because the
//! pool is shared one batch's slow tail leaves threads free for the next batch: the round
//! trips in flight are `threads` for the whole sink, whatever `sink_workers` is. Dropping the
//! pool closes the token channel; the threads finish the tokens queued and exit, and are
//! joined.
//!
//! A panic is turned into an outcome here, and only here ([`panicked`] is the outcome; the
//! file sink's writers and the fan-out's child threads use it too): a bug in one item must
//! neither kill its thread nor leave the batch's worker waiting for an outcome that never
//! comes, so the item's messages get a transient outcome (redelivered) and the thread goes
//! on. The panic hook has reported the panic.
//!
//! Not on this pool: the file sink's writers (`file/writer_pool.rs`: a mutex-and-condvar queue
//! of one boxed task per file, because idle crossbeam receivers spin on a two-core host, and a
//! second fsync each writer defers a few files), and the fan-out's child writes (one thread
//! per child for the length of a batch, joined or left running past a timeout: a shared pool
//! would let one child's slow write hold the threads another child's batch waits for).

use super::countdown::Countdown;
use super::{SinkError, WriteOutcome};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use crossbeam_channel::Sender;

/// What a pool's threads do with one item of a batch; the sink implements it on what its
/// threads share (its client and config).
pub trait Job: Send + Sync + 'static {
    /// What every item of one batch reads (the HTTP sink's encoded records).
    type Batch: Send + Sync + 'static;
    /// One unit a thread claims: an object to put, a request to send.
    type Item: Send + Sync + 'static;
    /// The outcomes of one item, one per index of [`Job::indexes`], in that order.
    type Outcomes: IntoIterator<Item = WriteOutcome>;

    /// The batch indexes `item` decides; each index is in one item only.
    fn indexes(item: &Self::Item) -> &[usize];

    fn run(&self, batch: &Self::Batch, item: &Self::Item) -> Self::Outcomes;
}

/// The transient outcome of work that panicked (`what`: "put thread", "child s3").
pub fn panicked(kind: &'static str, what: &str) -> WriteOutcome {
    WriteOutcome::Transient(SinkError::new(kind, format!("{what} panicked")))
}

pub struct Pool<J: Job> {
    names: Names,
    /// Tokens for the threads; `None` only while dropping.
    tokens: Option<Sender<Arc<Work<J>>>>,
    threads: Vec<JoinHandle<()>>,
}

/// How the pool's outcomes name the sink and its threads.
#[derive(Clone, Copy)]
struct Names {
    kind: &'static str,
    /// `put`, `request`.
    what: &'static str,
}

impl Names {
    fn transient(&self, why: &str) -> WriteOutcome {
        WriteOutcome::Transient(SinkError::new(self.kind, format!("{} {why}", self.what)))
    }
}

/// One batch being written: its items, claimed one at a time by the threads holding one of
/// its tokens, and one outcome slot per message of the batch.
struct Work<J: Job> {
    batch: J::Batch,
    items: Vec<J::Item>,
    /// Next entry of `items` to claim.
    next: AtomicUsize,
    /// Outcome per batch index; those decided before any round trip come filled.
    outcomes: Vec<OnceLock<WriteOutcome>>,
    /// Items not completed yet; the sink worker waits for the last.
    left: Countdown,
}

impl<J: Job> Work<J> {
    /// The next item nobody has claimed yet.
    fn claim(&self) -> Option<&J::Item> {
        self.items.get(self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// Claims and runs items until none is left to claim.
    fn help(&self, job: &J, names: Names) {
        while let Some(item) = self.claim() {
            match catch_unwind(AssertUnwindSafe(|| job.run(&self.batch, item))) {
                Ok(outcomes) => self.complete(item, outcomes),
                Err(_) => {
                    let what = format!("{} thread", names.what);
                    let failed = J::indexes(item).iter().map(|_| panicked(names.kind, &what));
                    self.complete(item, failed)
                }
            }
        }
    }

    fn complete(&self, item: &J::Item, outcomes: impl IntoIterator<Item = WriteOutcome>) {
        for (index, outcome) in J::indexes(item).iter().zip(outcomes) {
            // Invariant: each batch index is in one item, and items are claimed once. An
            // index out of range (a bug) must not take the thread: its slot stays empty.
            if let Some(slot) = self.outcomes.get(*index) {
                let _ = slot.set(outcome);
            }
        }
        self.left.complete_one();
    }
}

impl<J: Job> Pool<J> {
    /// Starts `threads` threads named `<name>-0`, `<name>-1` ...; `what` names them in
    /// errors and outcomes ("put", "request").
    pub fn start(
        name: &str,
        kind: &'static str,
        what: &'static str,
        threads: usize,
        job: Arc<J>,
    ) -> Result<Pool<J>, SinkError> {
        // Tokens of two batches per thread can wait: a worker rarely blocks handing out
        // tokens, and when it does, it is woken once per token, not per item.
        let (tx, rx) = crossbeam_channel::bounded::<Arc<Work<J>>>(threads * 2);
        let names = Names { kind, what };
        let mut pool = Pool {
            names,
            tokens: Some(tx),
            threads: Vec::with_capacity(threads),
        };
        for n in 0..threads {
            let (job, rx) = (job.clone(), rx.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-{n}"))
                .spawn(move || {
                    for work in rx {
                        work.help(&job, names);
                    }
                });
            match spawned {
                Ok(h) => pool.threads.push(h),
                // Dropping the pool stops and joins the threads already started.
                Err(e) => {
                    return Err(SinkError::new(
                        kind,
                        format!("cannot start {what} thread {n}: {e}"),
                    ))
                }
            }
        }
        Ok(pool)
    }

    /// The outcomes of one batch of `outcomes.len()` messages, in batch order: those filled
    /// already as given, the others from the items that cover them.
    pub fn run(
        &self,
        batch: J::Batch,
        outcomes: Vec<OnceLock<WriteOutcome>>,
        items: Vec<J::Item>,
    ) -> Vec<WriteOutcome> {
        let helpers = items.len().min(self.threads.len());
        let work = Arc::new(Work::<J> {
            left: Countdown::new(items.len()),
            batch,
            items,
            next: AtomicUsize::new(0),
            outcomes,
        });
        let mut handed_out = 0;
        for _ in 0..helpers {
            // Blocks while the tokens of earlier batches fill the channel.
            match self.tokens.as_ref().map(|t| t.send(work.clone()).is_ok()) {
                Some(true) => handed_out += 1,
                _ => break,
            }
        }
        if handed_out == 0 {
            // No thread will ever see this batch (cannot happen while the pool lives): fail
            // what is left here.
            while let Some(item) = work.claim() {
                let stopped = J::indexes(item)
                    .iter()
                    .map(|_| self.names.transient("threads stopped"));
                work.complete(item, stopped);
            }
        }
        work.left.wait();
        // Outcomes are cloned, not moved out: a thread may still hold a token of this
        // finished batch. Clones are cheap (`Durable` is a unit).
        work.outcomes
            .iter()
            .map(|o| {
                o.get()
                    .cloned()
                    .unwrap_or_else(|| self.names.transient("thread ended early"))
            })
            .collect()
    }
}

impl<J: Job> Drop for Pool<J> {
    fn drop(&mut self) {
        self.tokens = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Items of one or two batch indexes; index 7 panics; records the threads' names.
    struct Echo {
        seen: Mutex<Vec<String>>,
    }

    impl Job for Echo {
        type Batch = usize;
        type Item = Vec<usize>;
        type Outcomes = Vec<WriteOutcome>;

        fn indexes(item: &Vec<usize>) -> &[usize] {
            item
        }

        fn run(&self, skip: &usize, item: &Vec<usize>) -> Vec<WriteOutcome> {
            assert!(!item.contains(&7), "item 7 fails");
            let name = std::thread::current()
                .name()
                .unwrap_or_default()
                .to_string();
            self.seen.lock().unwrap().push(name);
            // Fewer outcomes than indexes for an item holding `skip`.
            let n = item.len() - usize::from(item.contains(skip));
            vec![WriteOutcome::Durable; n]
        }
    }

    #[test]
    fn outcomes_come_back_in_batch_order_and_a_panic_is_a_transient_outcome() {
        let job = Arc::new(Echo {
            seen: Mutex::new(Vec::new()),
        });
        let pool = Pool::start("svc-test-pool", "test", "put", 3, job.clone()).unwrap();
        for _ in 0..3 {
            let outcomes: Vec<OnceLock<WriteOutcome>> = (0..21).map(|_| OnceLock::new()).collect();
            let early = WriteOutcome::Permanent(SinkError::new("test", "refused early"));
            let _ = outcomes[0].set(early);
            let items: Vec<Vec<usize>> = (1..21).step_by(2).map(|i| vec![i, i + 1]).collect();
            let got = pool.run(11, outcomes, items);
            assert_eq!(got.len(), 21);
            for (i, o) in got.iter().enumerate() {
                let text = match o {
                    WriteOutcome::Durable => "durable".to_string(),
                    WriteOutcome::Transient(e) => format!("transient {e}"),
                    WriteOutcome::Permanent(e) => format!("permanent {e}"),
                    _ => "other".to_string(),
                };
                let expected = match i {
                    0 => "permanent sink test: refused early",
                    7 | 8 => "transient sink test: put thread panicked",
                    12 => "transient sink test: put thread ended early",
                    _ => "durable",
                };
                assert_eq!(text, expected, "index {i}");
            }
        }
        let seen = job.seen.lock().unwrap();
        assert!(
            seen.iter().all(|n| n.starts_with("svc-test-pool-")),
            "{seen:?}"
        );
        assert_eq!(pool.threads.len(), 3);
        assert!(
            pool.threads.iter().all(|t| !t.is_finished()),
            "the panics took no thread with them"
        );
    }

    /// A job naming a batch index past the end (a bug) neither kills its thread nor leaves
    /// the batch waiting.
    #[test]
    fn an_index_out_of_range_leaves_its_slot_empty_and_the_thread_alive() {
        let job = Arc::new(Echo {
            seen: Mutex::new(Vec::new()),
        });
        let pool = Pool::start("svc-test-pool", "test", "put", 1, job).unwrap();
        for _ in 0..2 {
            let outcomes: Vec<OnceLock<WriteOutcome>> = (0..2).map(|_| OnceLock::new()).collect();
            let got = pool.run(usize::MAX, outcomes, vec![vec![0], vec![1, 2]]);
            assert!(matches!(
                got[..],
                [WriteOutcome::Durable, WriteOutcome::Durable]
            ));
        }
        assert!(!pool.threads[0].is_finished());
    }

    #[test]
    fn a_batch_without_items_returns_its_outcomes_at_once() {
        let job = Arc::new(Echo {
            seen: Mutex::new(Vec::new()),
        });
        let pool = Pool::start("svc-test-pool", "test", "put", 2, job).unwrap();
        assert!(pool.run(0, Vec::new(), Vec::new()).is_empty());
        let one = vec![OnceLock::from(WriteOutcome::Durable)];
        assert!(matches!(
            pool.run(0, one, Vec::new())[..],
            [WriteOutcome::Durable]
        ));
    }
}
