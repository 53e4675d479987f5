//! At start, with custody checkpoints and a DLQ: the runner's own dead letters stored since
//! about its chain's last checkpoint are read back and told to `svc-checkpoint` as gaps, before
//! any delivery. A gap is told when its dead letter is confirmed and signed at the next
//! checkpoint; a kill -9 between the two left it in no checkpoint, so the sequence read as
//! neither a record nor a gap. The read runs after binding and before the `svc-checkpoint`
//! thread starts; its first rescan lists each found gap unless the chain signed the sequence
//! (as a gap or as a record) or its record is pending (`Writer::add_found_gaps`). Only records
//! naming this runner, its stream in the stream's current incarnation and its durable count.
//!
//! From when, by the broker's store time (its own clock, monotonic with the sequence): the
//! chain's last checkpoint less [`MARGIN`] (a dead letter stored before the cut whose
//! confirmation came after it, the runner's clock against the broker's); without a chain, now
//! less [`MARGIN`]. Every read is bounded ([`MAX_READ`] per stream, one [`TIMEOUT`] for all, one
//! `dead_letter.publish_timeout_ms` per request); a read that fails or is cut short is logged
//! and the runner starts: the gaps are evidence, never a reason to hold delivery. A message
//! terminated without a DLQ leaves no record the runner could read back: `svc-ack` terminates
//! it only once a stored checkpoint lists it (`Feed::gap_signed`), so nothing is to be found.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::broker::dead_letter::rescan::{runner_gaps, Reach, Whose};
use crate::broker::dead_letter::DeadLetterPublisher;
use crate::config::RuntimeConfig;
use crate::sink::checkpoint::Origin;
use crate::text::peer::PeerText;

/// How long before the chain's last checkpoint (or, without one, before now) the read starts,
/// by the broker's store time.
pub const MARGIN: Duration = Duration::from_secs(3600);
/// Messages of the dead-letter streams read at most (any runner's), per stream.
pub const MAX_READ: u64 = 100_000;
/// The whole read, every capturing stream included.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// The runner's dead letters read back (see the module comment), as gaps of the stream's
/// current incarnation: (origin, sequence, reason code).
pub fn found_gaps(
    nc: &nats::Connection,
    cfg: &RuntimeConfig,
    incarnation: &Arc<str>,
    last_cut: Option<i128>,
) -> Vec<(Origin, u64, &'static str)> {
    let dl = &cfg.dead_letter;
    if !dl.enabled || dl.runner_id.is_empty() {
        return Vec::new();
    }
    let publisher = DeadLetterPublisher::new(nc.clone(), dl.clone());
    let streams = match publisher.capturing_streams() {
        Ok(s) => s,
        Err(e) => {
            log::warn!(
                "custody checkpoints: the dead-letter stream is not known ({e}): gaps a crash \
                 left unsigned are not looked for"
            );
            return Vec::new();
        }
    };
    let who = Whose {
        runner_id: &dl.runner_id,
        stream: &cfg.nats.stream,
        incarnation,
        consumer: &cfg.nats.consumer,
        subject: &dl.subject,
    };
    let from = last_cut.unwrap_or_else(crate::message::envelope::now_unix_nanos);
    let reach = Reach {
        since_unix_nanos: from - MARGIN.as_nanos() as i128,
        max_read: MAX_READ,
        deadline: Instant::now() + TIMEOUT,
        request_timeout: dl.publish_timeout,
    };
    let origin: Origin = (Arc::from(cfg.nats.stream.as_str()), incarnation.clone());
    let wanted = |s: &&String| dl.expected_stream.as_ref().is_none_or(|e| e == *s);
    let mut gaps = Vec::new();
    for stream in streams.iter().filter(wanted).take(4) {
        match runner_gaps(nc, stream, who, reach) {
            Ok(found) => {
                if let Some(why) = &found.cut_short {
                    log::warn!(
                        "custody checkpoints: dead letters of stream {} read back only until \
                         {why}: older gaps a crash left unsigned are not looked for",
                        PeerText::new(stream)
                    );
                }
                log::info!(
                    "custody checkpoints: {} messages of dead-letter stream {} read back, {} of \
                     this runner (listed unless signed already)",
                    found.read,
                    PeerText::new(stream),
                    found.gaps.len()
                );
                gaps.extend(found.gaps.into_iter().map(|g| {
                    let why = match g.by_sink {
                        true => crate::pipeline::GapReason::DeadLettered,
                        false => crate::pipeline::GapReason::RefusedBeforeSink,
                    };
                    (origin.clone(), g.sequence, why.code())
                }));
            }
            Err(e) => log::warn!(
                "custody checkpoints: the dead letters of stream {} could not be read back ({}): \
                 gaps a crash left unsigned are not looked for",
                PeerText::new(stream),
                PeerText::new(&e)
            ),
        }
    }
    gaps
}
