//! Priority lanes inside one batch (`delivery.priority_lanes`, see `config/lanes.rs`): the
//! sink worker hands a batch's envelopes to the sink lane by lane, one `write_batch` call per
//! lane that has messages, the first lane first; within a lane the fetch order is kept.
//! Commit-then-ACK is unchanged: the outcomes go back to their messages' places in the batch.

use std::sync::atomic::Ordering;

use crate::config::lanes::PriorityLanes;
use crate::message::envelope::Envelope;
use crate::metrics::Metrics;
use crate::sink::{Sink, SinkError, WriteOutcome};

/// Writes `envelopes` lane by lane and returns one outcome per envelope in their given order
/// (`envelopes` is back in that order on return).
pub fn write_by_lane(
    sink: &dyn Sink,
    lanes: &PriorityLanes,
    envelopes: &mut Vec<Envelope>,
    metrics: &Metrics,
) -> Vec<WriteOutcome> {
    let lane_of: Vec<usize> = envelopes
        .iter()
        .map(|e| lanes.lane_of(&e.priority))
        .collect();
    if lane_of.is_sorted() {
        // One lane, or already in lane order: nothing needs to move.
        return write_runs(sink, lanes, envelopes, &lane_of, metrics);
    }
    // A stable sort: the fetch order stays within a lane.
    let mut order: Vec<usize> = (0..envelopes.len()).collect();
    order.sort_by_key(|&i| lane_of[i]);
    let mut places: Vec<Option<Envelope>> = envelopes.drain(..).map(Some).collect();
    let sorted: Vec<Envelope> = order
        .iter()
        .map(|&i| places[i].take().expect("each place is taken once"))
        .collect();
    let sorted_lanes: Vec<usize> = order.iter().map(|&i| lane_of[i]).collect();
    let outcomes = write_runs(sink, lanes, &sorted, &sorted_lanes, metrics);

    let mut back: Vec<Option<(Envelope, WriteOutcome)>> = (0..sorted.len()).map(|_| None).collect();
    for ((&at, env), outcome) in order.iter().zip(sorted).zip(outcomes) {
        back[at] = Some((env, outcome));
    }
    let mut in_order = Vec::with_capacity(back.len());
    for (env, outcome) in back.into_iter().map(|b| b.expect("every place is filled")) {
        envelopes.push(env);
        in_order.push(outcome);
    }
    in_order
}

/// Writes `envelopes`, already in lane order (`lane_of` per envelope), one call per run of
/// one lane; the outcomes in the same order.
fn write_runs(
    sink: &dyn Sink,
    lanes: &PriorityLanes,
    envelopes: &[Envelope],
    lane_of: &[usize],
    metrics: &Metrics,
) -> Vec<WriteOutcome> {
    let mut outcomes = Vec::with_capacity(envelopes.len());
    let mut start = 0;
    while start < envelopes.len() {
        let lane = lane_of[start];
        let len = lane_of[start..].iter().take_while(|&&l| l == lane).count();
        let mut got = sink.write_batch(&envelopes[start..start + len]);
        if got.len() != len {
            // A sink bug must never turn into an ACK: the lane is treated as not written.
            log::error!(
                "sink {} returned {} outcomes for {len} envelopes; treating the lane {} as not \
                 written",
                sink.kind(),
                got.len(),
                lanes.lanes[lane].name
            );
            let e = SinkError::new(sink.kind(), "outcome count mismatch");
            got = vec![WriteOutcome::Transient(e); len];
        }
        if let Some(c) = metrics.lane(lane) {
            let durable = got.iter().filter(|o| o.is_durable()).count();
            c.messages_total.fetch_add(len as u64, Ordering::Relaxed);
            c.messages_written_total
                .fetch_add(durable as u64, Ordering::Relaxed);
            c.sink_writes_total.fetch_add(1, Ordering::Relaxed);
        }
        outcomes.extend(got);
        start += len;
    }
    outcomes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::lanes::Lane;
    use crate::message::envelope::{normalize, EnvelopeConfig, RawMessage};
    use std::sync::{Arc, Mutex};

    /// Records the priorities of each call; refuses priority "bad" for good.
    #[derive(Default)]
    struct Recorder {
        calls: Mutex<Vec<Vec<String>>>,
    }

    impl Sink for Recorder {
        fn kind(&self) -> &'static str {
            "recorder"
        }
        fn write_batch(&self, batch: &[Envelope]) -> Vec<WriteOutcome> {
            let seen = batch.iter().map(|e| e.priority.clone()).collect();
            self.calls.lock().unwrap().push(seen);
            batch
                .iter()
                .map(|e| match e.priority.as_str() {
                    "bad" => WriteOutcome::Permanent(SinkError::new("recorder", "refused")),
                    _ => WriteOutcome::Durable,
                })
                .collect()
        }
        fn check(&self) -> Result<String, SinkError> {
            Ok(String::new())
        }
    }

    fn envelope(seq: u64, priority: &str) -> Envelope {
        let msg = RawMessage {
            stream_incarnation: Default::default(),
            subject: "orders.eu".into(),
            stream: Arc::from("ORDERS"),
            consumer: Arc::from("svc"),
            stream_sequence: seq,
            consumer_sequence: seq,
            delivery_count: 1,
            published_unix_nanos: None,
            headers: Vec::new(),
            data: b"{}".to_vec(),
            unreadable: None,
            header_block: Default::default(),
        };
        let mut env = normalize(&msg, 1, &EnvelopeConfig::default()).0;
        env.priority = priority.to_string();
        env
    }

    fn lanes() -> PriorityLanes {
        let lane = |name: &str, p: &[&str]| Lane {
            name: name.into(),
            priorities: p.iter().map(|s| s.to_string()).collect(),
        };
        PriorityLanes {
            lanes: vec![
                lane("flash", &["flash"]),
                lane("priority", &["priority", "bad"]),
                lane("routine", &["routine"]),
            ],
            default_lane: 2,
        }
    }

    #[test]
    fn a_mixed_batch_goes_lane_by_lane_and_outcomes_return_to_their_messages() {
        let sink = Recorder::default();
        let metrics = Metrics::default().with_lanes(vec![
            "flash".into(),
            "priority".into(),
            "routine".into(),
        ]);
        let prios = ["routine", "flash", "bad", "normal", "flash", "priority"];
        let mut envs: Vec<Envelope> = prios
            .iter()
            .enumerate()
            .map(|(i, p)| envelope(i as u64 + 1, p))
            .collect();
        let outcomes = write_by_lane(&sink, &lanes(), &mut envs, &metrics);

        let calls = sink.calls.lock().unwrap().clone();
        assert_eq!(
            calls,
            [
                vec!["flash", "flash"],
                vec!["bad", "priority"],
                // An unknown priority ("normal") goes to the default lane, in fetch order.
                vec!["routine", "normal"],
            ]
        );
        let seqs: Vec<u64> = envs.iter().map(|e| e.stream_sequence).collect();
        assert_eq!(
            seqs,
            [1, 2, 3, 4, 5, 6],
            "envelopes are back in batch order"
        );
        let durable: Vec<bool> = outcomes.iter().map(WriteOutcome::is_durable).collect();
        assert_eq!(durable, [true, true, false, true, true, true]);

        let rows: Vec<(String, u64, u64, u64)> = metrics
            .lanes()
            .map(|(n, c)| {
                (
                    n.to_string(),
                    c.messages_total.load(Ordering::Relaxed),
                    c.messages_written_total.load(Ordering::Relaxed),
                    c.sink_writes_total.load(Ordering::Relaxed),
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("flash".into(), 2, 2, 1),
                ("priority".into(), 2, 1, 1),
                ("routine".into(), 2, 2, 1)
            ]
        );
    }

    #[test]
    fn a_lane_without_messages_makes_no_call() {
        let sink = Recorder::default();
        let mut envs = vec![envelope(1, "routine"), envelope(2, "routine")];
        let outcomes = write_by_lane(&sink, &lanes(), &mut envs, &Metrics::default());
        assert_eq!(outcomes.len(), 2);
        assert_eq!(sink.calls.lock().unwrap().len(), 1);
    }
}
