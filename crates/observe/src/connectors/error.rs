//! The error of an export command: what failed, whether retrying can help, and the exit code.

use std::fmt;

use super::{EXIT_FAILURE, EXIT_INVALID};
use crate::families::Overflow;
use crate::policy::LoadError;
use crate::select::Stale;
use crate::textfile::SnapshotError;

/// Why an export did not complete. `Display` names the connector block first and never
/// contains a secret value.
#[derive(Debug)]
pub enum ExportError {
    /// The policy file could not be read or is invalid (exit 2).
    Policy(LoadError),
    /// A variable the policy names is missing or unusable, or a header is reserved (exit 2).
    Environment(String),
    /// The snapshot is missing, unreadable or invalid (exit 1).
    Snapshot(SnapshotError),
    /// The snapshot is older than the connector's `stale_after_seconds` (exit 1).
    Stale { block: &'static str, stale: Stale },
    /// Subject families over the limit with `overflow_action` `fail_closed` (exit 1).
    Overflow(Overflow),
    /// A request, datagram or message over its limit: nothing was sent (exit 1).
    Oversize {
        /// The limit's policy field, e.g. `otlp.max_request_bytes`.
        field: String,
        /// What is too large, e.g. `request body` or `datagram 3 (svc.messages_acked_total)`.
        what: String,
        size: usize,
        limit: u64,
    },
    /// Rendering failed (a value the format cannot carry, ...) (exit 1).
    Render(String),
    /// Sending failed after the bounded retries; `sent` of `total` items made it (exit 1).
    Send {
        block: &'static str,
        sent: usize,
        total: usize,
        /// Short reason of the last failure (no secret, no body).
        last: String,
    },
    /// Writing the dry-run output failed (exit 1).
    Output(std::io::Error),
}

impl ExportError {
    /// The process exit code for this error: 2 for invalid input, 1 for runtime failures.
    pub fn exit_code(&self) -> u8 {
        match self {
            ExportError::Policy(_) | ExportError::Environment(_) => EXIT_INVALID,
            _ => EXIT_FAILURE,
        }
    }
}

impl fmt::Display for ExportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExportError::Policy(e) => write!(f, "{e}"),
            ExportError::Environment(e) => f.write_str(e),
            ExportError::Snapshot(e) => write!(f, "metrics withheld: {e}"),
            ExportError::Stale { block, stale } => write!(
                f,
                "metrics withheld: {stale} ({block}.stale_after_seconds; --allow-stale overrides)"
            ),
            ExportError::Overflow(e) => write!(f, "metrics withheld: {e}"),
            ExportError::Oversize {
                field,
                what,
                size,
                limit,
            } => write!(
                f,
                "{what} is {size} bytes, over {field} {limit}; nothing was sent"
            ),
            ExportError::Render(e) => f.write_str(e),
            ExportError::Send {
                block,
                sent,
                total,
                last,
            } => write!(f, "{block}: sent {sent} of {total}; last failure: {last}"),
            ExportError::Output(e) => write!(f, "cannot write the dry-run output: {e}"),
        }
    }
}

impl std::error::Error for ExportError {}
