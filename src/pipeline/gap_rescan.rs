//! At start, with custody checkpoints and a DLQ: the runner's own dead letters stored since
//! about its chain's last checkpoint are read back and told to `svc-checkpoint` as gaps, before
//! any delivery. A gap is told when its dead letter is confirmed and signed at the next
//! checkpoint; a kill -9 between the two left it in no checkpoint, so the sequence read as
//! neither a record nor a gap. The thread lists each found gap unless the chain signed it
//! already or its record is pending (`sink::checkpoint::Event::FoundGap`).
//!
//! From when: the chain's last checkpoint less [`MARGIN`] (a dead letter stored before the cut
//! whose confirmation came after it, clocks of other runners writing the same DLQ); a chain
//! with none, or with every checkpoint drained from the spool, reads back up to [`MAX_READ`]
//! messages. Every read is bounded ([`MAX_READ`], [`TIMEOUT`]); a read that fails or is cut
//! short is logged and the runner starts: the gaps are evidence, never a reason to hold
//! delivery. A message terminated without a DLQ (`max_deliveries`) leaves no record the
//! runner could read back: such a gap told before a kill -9 stays unlisted (documented).

use std::sync::Arc;
use std::time::Duration;

use crate::broker::dead_letter::rescan::{runner_gaps, Reach, Whose};
use crate::broker::dead_letter::DeadLetterPublisher;
use crate::config::RuntimeConfig;
use crate::sink::checkpoint::{Event, Feed, Origin};
use crate::text::peer::PeerText;

/// How long before the chain's last checkpoint the read starts.
pub const MARGIN: Duration = Duration::from_secs(3600);
/// Messages of the dead-letter stream read at most (any runner's).
pub const MAX_READ: u64 = 100_000;
/// The whole read, per capturing stream.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// Reads the runner's dead letters back and tells `feed` of each (see the module comment).
pub fn tell_found_gaps(
    nc: &nats::Connection,
    cfg: &RuntimeConfig,
    feed: &Feed,
    last: Option<i128>,
) {
    let dl = &cfg.dead_letter;
    if !dl.enabled || dl.runner_id.is_empty() {
        return;
    }
    let publisher = DeadLetterPublisher::new(nc.clone(), dl.clone());
    let streams = match publisher.capturing_streams() {
        Ok(s) => s,
        Err(e) => {
            log::warn!(
                "custody checkpoints: the dead-letter stream is not known ({e}): gaps a crash \
                 left unsigned are not looked for"
            );
            return;
        }
    };
    let who = Whose {
        runner_id: &dl.runner_id,
        stream: &cfg.nats.stream,
        consumer: &cfg.nats.consumer,
        subject: &dl.subject,
    };
    let reach = Reach {
        since_unix_nanos: last.map(|t| t - MARGIN.as_nanos() as i128),
        max_read: MAX_READ,
        timeout: TIMEOUT,
    };
    let wanted = |s: &&String| dl.expected_stream.as_ref().is_none_or(|e| e == *s);
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
                let n = found.gaps.len();
                for g in found.gaps {
                    let origin: Origin = (Arc::from(g.stream), Arc::from(g.incarnation));
                    let why = match g.by_sink {
                        true => crate::pipeline::GapReason::DeadLettered,
                        false => crate::pipeline::GapReason::RefusedBeforeSink,
                    };
                    if !feed.send_waiting(Event::FoundGap(origin, g.sequence, why.code())) {
                        return;
                    }
                }
                log::info!(
                    "custody checkpoints: {} messages of dead-letter stream {} read back, {n} of \
                     this runner (listed unless signed already)",
                    found.read,
                    PeerText::new(stream)
                );
            }
            Err(e) => log::warn!(
                "custody checkpoints: the dead letters of stream {} could not be read back ({}): \
                 gaps a crash left unsigned are not looked for",
                PeerText::new(stream),
                PeerText::new(&e)
            ),
        }
    }
}
