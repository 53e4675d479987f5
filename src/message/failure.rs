//! Why a record's write failed for good, as a stable code: the one vocabulary the sinks
//! report in and the dead-letter record, the logs and docs/delivery-semantics.md carry. Kept
//! below both the sinks and the broker (whose dead-letter records name it).

use std::sync::OnceLock;

/// Why a write failed for good, as a stable code: what a dead-letter record and the log carry
/// of a permanent sink failure. Never the value that caused it (a database message may quote
/// the row; the code does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureClass {
    /// No finer class known (also every transient failure).
    Unclassified,
    /// The key already holds another event (`duplicate_policy` `fail_existing`, or a relational
    /// idempotency key whose stored subject or digest differs).
    DuplicateExists,
    /// The destination refused the value itself (PostgreSQL SQLSTATE class 22, 23 or 54).
    ValueRejected,
    /// Over a size limit (`max_record_bytes`, `max_object_bytes`, `max_metadata_bytes`, or the
    /// object store's own).
    TooLarge,
    /// No usable key or name can be made for it (strategy input missing, key too long).
    InvalidKey,
    /// The target name exists and is not a regular file.
    DestinationConflict,
    /// No route or required target for its subject (fan-out).
    Unroutable,
    /// The record could not be encoded.
    EncodeFailed,
    /// An HTTP receiver refused the record with this status (code `http_<status>`).
    HttpStatus(u16),
}

impl FailureClass {
    /// The code in logs, DLQ records (`failure.reason`) and docs/delivery-semantics.md.
    pub fn code(self) -> &'static str {
        match self {
            FailureClass::Unclassified => "sink_failure",
            FailureClass::DuplicateExists => "duplicate_exists",
            FailureClass::ValueRejected => "value_rejected",
            FailureClass::TooLarge => "too_large",
            FailureClass::InvalidKey => "invalid_key",
            FailureClass::DestinationConflict => "destination_conflict",
            FailureClass::Unroutable => "unroutable",
            FailureClass::EncodeFailed => "encode_failed",
            FailureClass::HttpStatus(status) => http_status_code(status),
        }
    }
}

/// `http_<status>` as a `'static` text (DLQ records and log lines take the code by
/// reference): one table of the 500 possible codes, made once.
fn http_status_code(status: u16) -> &'static str {
    static CODES: OnceLock<Vec<String>> = OnceLock::new();
    let codes = CODES.get_or_init(|| (100..600).map(|s| format!("http_{s}")).collect());
    match status {
        100..=599 => &codes[usize::from(status - 100)],
        _ => "http_other",
    }
}
