//! The crash explorer (issue 48): a component's scripted workload, run as the real `svc`
//! binary, killed at every durable system call ([`explore`]), and replayed into every on-disk
//! state a power cut could leave ([`power`]), each followed by a restart or a drain and a
//! check of the invariants the workload states (docs/delivery-semantics.md, "Crash model"):
//!
//! - every message the broker saw ACKed before the kill (or the cut) is stored: exactly once
//!   where the sink's keys allow, at least once for `jsonl`, or in the spool, delivered after
//!   the restart;
//! - every restart makes progress until the backlog is empty (nothing stops for good);
//! - no file is left that a later start refuses;
//! - the service's own state files (the spool's `position`, the metrics snapshot) are never
//!   half-written.
//!
//! "ACKed" is what the runner told the broker: [`AckLog`] counts the `+ACK`s on
//! `$JS.ACK.<stream>.<consumer>.>` for a kill, and [`power`] reads them from the trace.
//! [`trace`] reads strace's output. The workloads themselves are in tests/crash.rs.

pub mod explore;
pub mod power;
pub mod trace;

use std::collections::BTreeSet;
use std::time::Duration;

/// The stream sequences the runner ACKed, as the broker's ACK subjects carry them.
pub struct AckLog {
    sub: nats::Subscription,
    acked: BTreeSet<u64>,
}

impl AckLog {
    /// Subscribes (and flushes, so no ACK is missed) before the runner starts.
    pub fn start(nc: &nats::Connection, stream: &str, consumer: &str) -> AckLog {
        let sub = nc
            .subscribe(&format!("$JS.ACK.{stream}.{consumer}.>"))
            .unwrap();
        nc.flush().unwrap();
        AckLog {
            sub,
            acked: BTreeSet::new(),
        }
    }

    /// Every sequence ACKed so far (waits `settle` for ACKs still on their way).
    pub fn acked(&mut self, settle: Duration) -> &BTreeSet<u64> {
        std::thread::sleep(settle);
        while let Some(m) = self.sub.try_next() {
            let tokens: Vec<&str> = m.subject.split('.').collect();
            // v1: $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>...; v2 adds two tokens.
            let at = if tokens.len() >= 11 { 7 } else { 5 };
            let ack = m.data.is_empty() || m.data.starts_with(b"+ACK");
            if let (true, Some(Ok(seq))) = (ack, tokens.get(at).map(|t| t.parse::<u64>())) {
                self.acked.insert(seq);
            }
        }
        &self.acked
    }
}

/// The spool's `position` file is whole: 28 bytes, its magic, its checksum.
pub fn position_whole(bytes: &[u8]) -> bool {
    bytes.len() == 28
        && bytes.starts_with(b"SVCPOS01")
        && crc32fast::hash(&bytes[..24]).to_le_bytes() == bytes[24..28]
}
