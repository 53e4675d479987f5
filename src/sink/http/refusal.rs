//! Dead-letter statuses that judge the sink, not the records: a receiver answering 400 to
//! every request (a wrong signing secret, a proxy in front of it) would otherwise dead-letter
//! the whole stream, one record at a time, without a payload to replay.
//!
//! Two rules, applied to a `write_batch`'s outcomes in order:
//! - a batch of two or more records whose every record was judged by a dead-letter status is
//!   a refusal of the sink: all of them become `Transient` (NAK), none is dead-lettered, and
//!   the streak is full (the redeliveries, one at a time, are refusals too);
//! - after [`STREAK_LIMIT`] records in a row (across batches) were dead-lettered with none
//!   accepted in between, further dead-letter statuses are refusals too, until a record is
//!   accepted: single-record batches cannot drain the stream into the dead-letter queue.

use super::KIND;
use crate::sink::{FailureClass, SinkError, WriteOutcome};
use std::sync::Mutex;

/// Records dead-lettered in a row, with none accepted, after which a dead-letter status is
/// taken as the receiver refusing the sink.
pub const STREAK_LIMIT: usize = 8;

/// The dead-letter streak of one sink.
#[derive(Default)]
pub struct Streak {
    dead_in_a_row: Mutex<usize>,
}

fn judged_by_status(o: &WriteOutcome) -> bool {
    matches!(o, WriteOutcome::Permanent(e) if matches!(e.class, FailureClass::HttpStatus(_)))
}

fn refused(o: &WriteOutcome) -> WriteOutcome {
    let why = match o {
        WriteOutcome::Permanent(e) => e.message.as_str(),
        _ => "dead-letter status",
    };
    WriteOutcome::Transient(SinkError::new(
        KIND,
        format!("every record judged bad: {why}"),
    ))
}

impl Streak {
    /// The outcomes with dead letters that are refusals of the sink turned into `Transient`;
    /// the number turned (0: none).
    pub fn apply(&self, outcomes: &mut [WriteOutcome]) -> usize {
        let mut dead = self.dead_in_a_row.lock().unwrap_or_else(|p| p.into_inner());
        if outcomes.len() >= 2 && outcomes.iter().all(judged_by_status) {
            for o in outcomes.iter_mut() {
                *o = refused(o);
            }
            *dead = (*dead).max(STREAK_LIMIT);
            return outcomes.len();
        }
        // Judged by the streak as it stood when the batch was written: a receiver that
        // recovers during a batch answers some requests 200 and some (sent before) 400, and
        // those 400s are still the refusal's, not the records'.
        let refusing = *dead >= STREAK_LIMIT;
        let mut turned = 0;
        for o in outcomes.iter_mut().filter(|o| judged_by_status(o)) {
            if refusing || *dead >= STREAK_LIMIT {
                *o = refused(o);
                turned += 1;
            } else {
                *dead += 1;
            }
        }
        if outcomes.iter().any(|o| matches!(o, WriteOutcome::Durable)) {
            *dead = 0;
        }
        turned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dead() -> WriteOutcome {
        WriteOutcome::Permanent(
            SinkError::new(KIND, "k: 400").classified(FailureClass::HttpStatus(400)),
        )
    }

    fn is_dead(o: &WriteOutcome) -> bool {
        judged_by_status(o)
    }

    #[test]
    fn a_batch_judged_bad_whole_is_a_refusal_and_one_bad_record_is_not() {
        let s = Streak::default();
        let mut all = vec![dead(), dead(), dead()];
        assert_eq!(s.apply(&mut all), 3);
        assert!(all.iter().all(|o| matches!(o, WriteOutcome::Transient(_))));
        // The redeliveries, one at a time, are refusals too until a record is accepted.
        let mut single = vec![dead()];
        assert_eq!(s.apply(&mut single), 1);
        // Right after a refusal the batch's 400 is still the refusal's (NAKed once); its
        // accepted records end the streak, and the next bad record alone is dead-lettered.
        let mut one = vec![WriteOutcome::Durable, dead(), WriteOutcome::Durable];
        assert_eq!(s.apply(&mut one), 1);
        let mut one = vec![WriteOutcome::Durable, dead(), WriteOutcome::Durable];
        assert_eq!(s.apply(&mut one), 0);
        assert!(is_dead(&one[1]));
        // An encoding failure is not a receiver's judgement: never turned.
        let enc = || WriteOutcome::Permanent(SinkError::new(KIND, "too large"));
        let mut encs = vec![enc(), enc()];
        assert_eq!(s.apply(&mut encs), 0);
    }

    #[test]
    fn single_record_batches_stop_dead_lettering_after_the_streak_until_one_is_accepted() {
        let s = Streak::default();
        for _ in 0..STREAK_LIMIT {
            let mut b = vec![dead()];
            assert_eq!(s.apply(&mut b), 0);
        }
        let mut b = vec![dead()];
        assert_eq!(s.apply(&mut b), 1);
        assert!(matches!(b[0], WriteOutcome::Transient(_)));
        let mut ok = vec![WriteOutcome::Durable];
        s.apply(&mut ok);
        let mut b = vec![dead()];
        assert_eq!(
            s.apply(&mut b),
            0,
            "the streak ends with an accepted record"
        );
    }
}
