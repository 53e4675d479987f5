//! Fan-out sink: one batch written to several child sinks in parallel, behind an ACK gate.
//!
//! # Routing
//! Each message gets a *target set*: with `routing.enabled` the first route whose
//! `match.subject` matches names the targets; with routing disabled every child is a required
//! target. A message that no route matches follows `routing.unmatched`: `reject` (default) makes
//! it a `Permanent` outcome — never written anywhere, never acknowledged as success, so it goes
//! to the DLQ or operator review; `all_required` writes it to every child as required. There is
//! no path on which a message is acknowledged without a required child having stored it (every
//! route must name at least one required target; config validation enforces it).
//!
//! # Threads
//! `write_batch` runs on the caller's thread (a `svc-sink-N` worker):
//! - required writes run on scoped threads `svc-fanout-<child>` (one per child and target
//!   shape) and are joined before `write_batch` returns: they are the custody path;
//! - optional writes run on detached threads `svc-fanout-opt-<child>` with their own copy of
//!   the envelopes, because they may outlive the batch. The gate waits for an optional write at
//!   most until `minimum_wait_ms` after the batch started (it releases sooner when the write
//!   finishes sooner, and never waits for an optional write once that time has passed);
//!   `timeout_ms` is how long the write may take before it is counted as timed out and its
//!   result is ignored;
//! - one watcher thread `svc-fanout-watch` per fan-out sink counts optional writes that pass
//!   their timeout while still running.
//!
//! Bound: at most `optional_max_in_flight` optional writes per child run at once, including
//! ones abandoned after their timeout. When a child is at the limit, a new optional write to it
//! is skipped and counted as a timeout, so a hung optional child costs a fixed number of threads
//! and never delays ACKs. Each optional write is accounted exactly once (success, failure or
//! timeout) through a compare-and-swap on its state.
//!
//! # Outcome per message
//! All required targets durable -> `Durable` (`AlreadyDurable` when every one said so); any
//! required target permanent -> `Permanent` (retrying cannot help that child); else any
//! required target transient -> `Transient`. Optional results never change the outcome.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use super::{FailureClass, Sink, SinkError, WriteOutcome};
use crate::message::envelope::Envelope;
use crate::metrics::Metrics;
use crate::text::error_chain;

const KIND: &str = "fanout";

mod config;
mod matcher;

pub use config::*;
pub use matcher::{Conditions, Facts, Marks};

/// State of one optional write, shared by its thread, the gate and the watcher.
const RUNNING: u8 = 0;
const FINISHED: u8 = 1;
const TIMED_OUT: u8 = 2;

struct OptionalJob {
    state: AtomicU8,
    deadline: Instant,
    child: String,
    messages: u64,
}

impl OptionalJob {
    /// Claims the job's accounting for a timeout; true when this caller counts it.
    fn time_out(&self, metrics: &Metrics) -> bool {
        let won = self
            .state
            .compare_exchange(RUNNING, TIMED_OUT, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if won {
            Metrics::add(
                &metrics.counters.fanout_optional_child_timeout_total,
                self.messages,
            );
            log::warn!(
                "fanout: optional child {} did not finish {} message(s) within its timeout; \
                 result ignored (ACK not affected)",
                self.child,
                self.messages
            );
        }
        won
    }
}

struct Child {
    name: String,
    sink: Arc<dyn Sink>,
    /// Optional writes of this child still running.
    optional_in_flight: Arc<AtomicUsize>,
}

/// The fan-out sink.
pub struct FanoutSink {
    children: BTreeMap<String, Child>,
    routing: Routing,
    optional_max_in_flight: usize,
    metrics: Arc<Metrics>,
    watch: Sender<Arc<OptionalJob>>,
}

/// Decrements a child's optional in-flight count when its thread ends, however it ends.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl FanoutSink {
    /// Builds every child and starts the watcher thread.
    pub fn new(cfg: &FanoutConfig, metrics: Arc<Metrics>) -> Result<FanoutSink, SinkError> {
        let mut children = BTreeMap::new();
        for (name, c) in &cfg.sinks {
            let sink = c.build(metrics.clone()).map_err(|e| {
                SinkError::new(KIND, format!("child {name} ({})", c.kind())).caused_by(e)
            })?;
            children.insert(
                name.clone(),
                Child {
                    name: name.clone(),
                    sink,
                    optional_in_flight: Arc::new(AtomicUsize::new(0)),
                },
            );
        }
        if cfg.routing.enabled && cfg.routing.unmatched == Unmatched::Ignore {
            log::warn!(
                "fanout: routing.no_match is ignore: a message no route matches is acknowledged \
                 and stored nowhere (counted in fanout_messages_ignored_total)"
            );
        }
        Self::with_children(
            children,
            cfg.routing.clone(),
            cfg.optional_max_in_flight,
            metrics,
        )
    }

    /// Builds a fan-out over ready child sinks (tests use their own `Sink` implementations).
    pub fn from_sinks(
        children: Vec<(String, Arc<dyn Sink>)>,
        routing: Routing,
        optional_max_in_flight: usize,
        metrics: Arc<Metrics>,
    ) -> Result<FanoutSink, SinkError> {
        let children = children
            .into_iter()
            .map(|(name, sink)| {
                (
                    name.clone(),
                    Child {
                        name,
                        sink,
                        optional_in_flight: Arc::new(AtomicUsize::new(0)),
                    },
                )
            })
            .collect();
        Self::with_children(children, routing, optional_max_in_flight, metrics)
    }

    fn with_children(
        children: BTreeMap<String, Child>,
        routing: Routing,
        optional_max_in_flight: usize,
        metrics: Arc<Metrics>,
    ) -> Result<FanoutSink, SinkError> {
        for route in &routing.routes {
            for t in &route.targets {
                if !children.contains_key(&t.sink) {
                    return Err(SinkError::new(
                        KIND,
                        format!("route {} names unknown child {}", route.name, t.sink),
                    ));
                }
            }
        }
        // Every pending job is a running optional thread, so this capacity is never reached.
        let (tx, rx) = bounded(children.len() * optional_max_in_flight + 1);
        let m = metrics.clone();
        std::thread::Builder::new()
            .name("svc-fanout-watch".into())
            .spawn(move || watch(rx, &m))
            .map_err(|e| SinkError::new(KIND, format!("start the watcher thread: {e}")))?;
        Ok(FanoutSink {
            children,
            routing,
            optional_max_in_flight,
            metrics,
            watch: tx,
        })
    }

    /// The targets of one normalized message, or its outcome when it goes nowhere: a
    /// permanent failure (`no_match: reject`) or an ACK, counted (`no_match: ignore`).
    fn targets_for(&self, env: &Envelope) -> Result<Cow<'_, [Target]>, WriteOutcome> {
        // Markings are gathered only when a route asks for more than the subject.
        let facts = if self.routing.subject_only {
            Facts::subject_only(env)
        } else {
            Facts::of(env)
        };
        match self.routing.decide(self.children.keys(), &facts) {
            Decision::Deliver { targets, .. } => Ok(targets),
            Decision::Reject => Err(WriteOutcome::Permanent(
                SinkError::new(
                    KIND,
                    "no fan-out route matches the message (no_match = reject)",
                )
                .classified(FailureClass::Unroutable),
            )),
            Decision::Ignore => {
                Metrics::add(&self.metrics.counters.fanout_messages_ignored_total, 1);
                Err(WriteOutcome::Durable)
            }
        }
    }

    /// Starts one optional write on its own thread, or accounts it as a timeout when the child
    /// is at its in-flight limit. Returns the job and a receiver that fires when it finishes.
    fn start_optional(
        &self,
        child: &Child,
        envelopes: Vec<Envelope>,
        start: Instant,
        timeout: Duration,
    ) -> Option<(Arc<OptionalJob>, Receiver<()>)> {
        let job = Arc::new(OptionalJob {
            state: AtomicU8::new(RUNNING),
            deadline: start + timeout,
            child: child.name.clone(),
            messages: envelopes.len() as u64,
        });
        let before = child.optional_in_flight.fetch_add(1, Ordering::AcqRel);
        let guard = InFlight(child.optional_in_flight.clone());
        if before >= self.optional_max_in_flight {
            drop(guard);
            log::warn!(
                "fanout: optional child {} still has {before} write(s) running; skipping this one",
                child.name
            );
            job.time_out(&self.metrics);
            return None;
        }
        let (done_tx, done_rx) = bounded(1);
        let sink = child.sink.clone();
        let metrics = self.metrics.clone();
        let j = job.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("svc-fanout-opt-{}", child.name))
            .spawn(move || {
                let _guard = guard;
                let outcomes = run_child(&*sink, &j.child, &envelopes);
                if Instant::now() > j.deadline {
                    j.time_out(&metrics);
                } else if j
                    .state
                    .compare_exchange(RUNNING, FINISHED, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    let failed: Vec<&WriteOutcome> =
                        outcomes.iter().filter(|o| !o.is_durable()).collect();
                    if let Some(first) = failed.first() {
                        Metrics::add(
                            &metrics.counters.fanout_optional_child_failure_total,
                            failed.len() as u64,
                        );
                        log::warn!(
                            "fanout: optional child {} failed {} of {} message(s) (ACK not \
                             affected): {}",
                            j.child,
                            failed.len(),
                            outcomes.len(),
                            outcome_error(first)
                        );
                    }
                }
                let _ = done_tx.try_send(());
            });
        match spawned {
            Ok(_) => {
                let _ = self.watch.try_send(job.clone());
                Some((job, done_rx))
            }
            Err(e) => {
                // The closure (and the in-flight guard in it) was dropped with the error.
                if job
                    .state
                    .compare_exchange(RUNNING, FINISHED, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    Metrics::add(
                        &self.metrics.counters.fanout_optional_child_failure_total,
                        job.messages,
                    );
                }
                log::warn!("fanout: cannot start optional write to {}: {e}", child.name);
                None
            }
        }
    }
}

fn outcome_error(o: &WriteOutcome) -> String {
    match o {
        WriteOutcome::Transient(e) | WriteOutcome::Permanent(e) => error_chain(e),
        _ => "durable".into(),
    }
}

/// Runs a child's write, turning a panic or a wrong outcome count into transient failures.
fn run_child(sink: &dyn Sink, name: &str, batch: &[Envelope]) -> Vec<WriteOutcome> {
    match catch_unwind(AssertUnwindSafe(|| sink.write_batch(batch))) {
        Ok(o) if o.len() == batch.len() => o,
        Ok(o) => {
            log::error!(
                "fanout: child {name} returned {} outcomes for {} messages",
                o.len(),
                batch.len()
            );
            vec![
                WriteOutcome::Transient(SinkError::new(
                    KIND,
                    format!("child {name} returned a wrong number of outcomes"),
                ));
                batch.len()
            ]
        }
        Err(_) => {
            log::error!("fanout: child {name} panicked while writing");
            vec![super::pool::panicked(KIND, &format!("child {name}")); batch.len()]
        }
    }
}

/// The watcher: counts optional writes still running at their deadline.
fn watch(rx: Receiver<Arc<OptionalJob>>, metrics: &Metrics) {
    let mut pending: Vec<Arc<OptionalJob>> = Vec::new();
    loop {
        let wait = pending
            .iter()
            .map(|j| j.deadline.saturating_duration_since(Instant::now()))
            .min()
            .unwrap_or(Duration::from_secs(3600));
        match rx.recv_timeout(wait) {
            Ok(job) => pending.push(job),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        pending.retain(|j| {
            if j.state.load(Ordering::Acquire) != RUNNING {
                return false;
            }
            if now >= j.deadline {
                j.time_out(metrics);
                return false;
            }
            true
        });
    }
}

/// One child write of a batch: which child, required or not, which messages.
struct Job<'a> {
    child: &'a Child,
    target: Target,
    idx: Vec<usize>,
}

impl Sink for FanoutSink {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn write_batch(&self, batch: &[Envelope]) -> Vec<WriteOutcome> {
        let start = Instant::now();
        let c = &self.metrics.counters;
        let mut outcomes: Vec<Option<WriteOutcome>> = vec![None; batch.len()];

        // Route: group messages by (child, target shape), keeping batch order.
        let mut jobs: Vec<Job> = Vec::new();
        for (i, env) in batch.iter().enumerate() {
            let targets = match self.targets_for(env) {
                Ok(t) => t,
                Err(o) => {
                    outcomes[i] = Some(o);
                    continue;
                }
            };
            Metrics::add(&c.fanout_messages_routed_total, 1);
            Metrics::add(&c.fanout_child_sinks_selected_total, targets.len() as u64);
            for t in targets.iter() {
                match jobs
                    .iter_mut()
                    .find(|j| j.child.name == t.sink && j.target == *t)
                {
                    Some(j) => j.idx.push(i),
                    None => jobs.push(Job {
                        child: &self.children[&t.sink],
                        target: t.clone(),
                        idx: vec![i],
                    }),
                }
            }
        }
        let subset = |idx: &[usize]| -> Cow<'_, [Envelope]> {
            if idx.len() == batch.len() {
                Cow::Borrowed(batch)
            } else {
                Cow::Owned(idx.iter().map(|&i| batch[i].clone()).collect())
            }
        };

        // Optional writes start first: they own their envelopes and may outlive this call.
        let mut optional = Vec::new();
        for j in jobs.iter().filter(|j| !j.target.required) {
            let envs = subset(&j.idx).into_owned();
            if let Some(started) = self.start_optional(j.child, envs, start, j.target.timeout) {
                optional.push((started, start + j.target.minimum_wait.min(j.target.timeout)));
            }
        }

        // Required writes: the custody path, joined before returning.
        let required: Vec<&Job> = jobs.iter().filter(|j| j.target.required).collect();
        let results: Vec<Vec<WriteOutcome>> = if required.len() == 1 {
            let j = required[0];
            vec![run_child(&*j.child.sink, &j.child.name, &subset(&j.idx))]
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = required
                    .iter()
                    .map(|j| {
                        let envs = subset(&j.idx);
                        let spawned = std::thread::Builder::new()
                            .name(format!("svc-fanout-{}", j.child.name))
                            .spawn_scoped(s, move || {
                                run_child(&*j.child.sink, &j.child.name, &envs)
                            });
                        (j, spawned)
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|(j, h)| match h {
                        Ok(h) => h.join().unwrap_or_else(|_| {
                            vec![
                                WriteOutcome::Transient(SinkError::new(
                                    KIND,
                                    format!("child {} thread failed", j.child.name),
                                ));
                                j.idx.len()
                            ]
                        }),
                        Err(e) => vec![
                            WriteOutcome::Transient(SinkError::new(
                                KIND,
                                format!("cannot start a thread for child {}: {e}", j.child.name),
                            ));
                            j.idx.len()
                        ],
                    })
                    .collect()
            })
        };

        // Per message: the required children's outcomes.
        let mut per_message: Vec<Vec<(&str, WriteOutcome)>> = vec![Vec::new(); batch.len()];
        for (j, res) in required.iter().zip(results) {
            for (&i, o) in j.idx.iter().zip(res) {
                if o.is_durable() {
                    Metrics::add(&c.fanout_required_child_success_total, 1);
                } else {
                    Metrics::add(&c.fanout_required_child_failure_total, 1);
                }
                per_message[i].push((j.child.name.as_str(), o));
            }
        }

        // The gate gives optional writes their minimum wait, never more.
        for ((_job, done), until) in &optional {
            let _ = done.recv_deadline(*until);
        }

        let mut released = 0u64;
        let out: Vec<WriteOutcome> = outcomes
            .into_iter()
            .zip(per_message)
            .map(|(pre, results)| {
                let o = pre.unwrap_or_else(|| combine(results));
                if o.is_durable() {
                    released += 1;
                }
                o
            })
            .collect();
        Metrics::add(&c.fanout_messages_acked_total, released);
        Metrics::add(
            &c.fanout_messages_ack_blocked_total,
            batch.len() as u64 - released,
        );
        self.metrics.observe(
            crate::metrics::SummaryMetric::FanoutAckGateWait,
            start.elapsed().as_secs_f64(),
        );
        out
    }

    fn check(&self) -> Result<String, SinkError> {
        let mut ok = Vec::new();
        let mut failed = Vec::new();
        for child in self.children.values() {
            match child.sink.check() {
                Ok(v) => ok.push(format!("{} ({}): {v}", child.name, child.sink.kind())),
                Err(e) => failed.push(format!(
                    "child {} ({}): {}",
                    child.name,
                    child.sink.kind(),
                    error_chain(&e)
                )),
            }
        }
        if !failed.is_empty() {
            return Err(SinkError::new(KIND, failed.join("; ")));
        }
        Ok(format!(
            "{} child sink(s) ready: {}",
            ok.len(),
            ok.join("; ")
        ))
    }
}

/// The outcome of one message from its required children's outcomes.
fn combine(results: Vec<(&str, WriteOutcome)>) -> WriteOutcome {
    if results.is_empty() {
        // Unreachable by config validation (every route has a required target); never ACK.
        return WriteOutcome::Permanent(
            SinkError::new(KIND, "no required target").classified(FailureClass::Unroutable),
        );
    }
    let wrap = |name: &str, e: &SinkError| {
        SinkError::new(KIND, format!("required child {name}: {}", error_chain(e)))
            .classified(e.class)
    };
    if let Some((n, WriteOutcome::Permanent(e))) = results
        .iter()
        .find(|(_, o)| matches!(o, WriteOutcome::Permanent(_)))
    {
        return WriteOutcome::Permanent(wrap(n, e));
    }
    if let Some((n, WriteOutcome::Transient(e))) = results
        .iter()
        .find(|(_, o)| matches!(o, WriteOutcome::Transient(_)))
    {
        return WriteOutcome::Transient(wrap(n, e));
    }
    if results
        .iter()
        .all(|(_, o)| *o == WriteOutcome::AlreadyDurable)
    {
        WriteOutcome::AlreadyDurable
    } else {
        WriteOutcome::Durable
    }
}

#[cfg(test)]
mod tests;
