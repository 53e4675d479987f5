//! Sinks: where envelopes become durable.
//!
//! A sink reports a [`WriteOutcome`] per envelope; it never acknowledges anything (only
//! `svc-ack` does, after reading these outcomes). One implementation per file; each sink's
//! config struct lives beside it and is read by [`SinkConfig::read`].

pub mod checkpoint;
mod countdown;
pub mod fanout;
pub mod file;
pub mod http;
pub mod key;
pub mod layout;
pub mod object_store;
mod pool;
pub mod relational;
pub mod resolver;
pub mod spool;
pub mod url_scheme;

use std::fmt;
use std::sync::Arc;

use crate::document::reader::ObjectReader;
use crate::message::envelope::Envelope;
use crate::metrics::Metrics;
use crate::text::error_chain;

/// What happened to one envelope in a batch write.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteOutcome {
    /// Written and durable now.
    Durable,
    /// Already durable from an earlier delivery (duplicate by key): counts as success.
    AlreadyDurable,
    /// Durable in the fallback spool, not yet in the sink: counts as success (acknowledged);
    /// custody checkpoints learn of it from the drain, once the sink holds it.
    Spooled,
    /// Not durable; may succeed on redelivery (destination unavailable, timeout).
    Transient(SinkError),
    /// Not durable and retrying the same message will not help (rejected by policy or limits).
    Permanent(SinkError),
}

impl fmt::Display for WriteOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WriteOutcome::Durable => f.write_str("durable"),
            WriteOutcome::AlreadyDurable => f.write_str("already durable"),
            WriteOutcome::Spooled => f.write_str("durable in the spool"),
            WriteOutcome::Transient(e) => write!(f, "transient: {}", error_chain(e)),
            WriteOutcome::Permanent(e) => {
                write!(f, "permanent ({}): {}", e.class.code(), error_chain(e))
            }
        }
    }
}

impl WriteOutcome {
    /// True when the message may be acknowledged.
    pub fn is_durable(&self) -> bool {
        matches!(
            self,
            WriteOutcome::Durable | WriteOutcome::AlreadyDurable | WriteOutcome::Spooled
        )
    }
}

pub use crate::message::failure::FailureClass;

/// A sink failure, safe to log: never a payload, secret or credential-bearing URL.
///
/// `Display` is `sink <type>: <message>` and never repeats the cause: where one is kept
/// ([`SinkError::caused_by`]), [`std::error::Error::source`] returns it and the place that
/// prints the error prints the chain once ([`crate::text::error_chain`]): the ACK path, the
/// sink workers and the CLI do.
#[derive(Debug, Clone)]
pub struct SinkError {
    /// Sink type, e.g. `file`.
    pub sink: &'static str,
    /// What failed, e.g. `write stream-sequence/ORDERS/42.json: disk full`.
    pub message: String,
    /// Why, as a stable code (meaningful for permanent failures).
    pub class: FailureClass,
    /// The cause (an I/O, store or database error), when kept. Shared so that an outcome can
    /// be copied to every envelope of a batch.
    cause: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl SinkError {
    pub fn new(sink: &'static str, message: impl Into<String>) -> Self {
        SinkError {
            sink,
            message: message.into(),
            class: FailureClass::Unclassified,
            cause: None,
        }
    }

    /// The same error with its failure class.
    pub fn classified(mut self, class: FailureClass) -> Self {
        self.class = class;
        self
    }

    /// The same error keeping `cause` as its source; `message` then says only what failed.
    pub fn caused_by(mut self, cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.cause = Some(Arc::new(cause));
        self
    }
}

/// Equal when they say the same: type, message, class and the cause's text.
impl PartialEq for SinkError {
    fn eq(&self, other: &Self) -> bool {
        self.sink == other.sink
            && self.message == other.message
            && self.class == other.class
            && self.cause.as_ref().map(|c| c.to_string())
                == other.cause.as_ref().map(|c| c.to_string())
    }
}

impl Eq for SinkError {}

impl fmt::Display for SinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sink {}: {}", self.sink, self.message)
    }
}

impl std::error::Error for SinkError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause.as_deref().map(|c| c as _)
    }
}

/// A destination. Implementations are shared by the sink worker pool, hence `Send + Sync`.
pub trait Sink: Send + Sync {
    /// Sink type name as configured (`file`, `object_store`, ...).
    fn kind(&self) -> &'static str;

    /// Writes a batch and returns exactly one outcome per envelope, in order. Returning means
    /// every `Durable` outcome is on stable storage.
    fn write_batch(&self, batch: &[Envelope]) -> Vec<WriteOutcome>;

    /// Whether [`Sink::write_stored_records`] takes a message's stored record
    /// ([`crate::message::record`], `svc.file.message.v1`) as it is. The spool keeps exactly
    /// that form, so a drain into such a sink (today the file sink's jsonl mode) hands its
    /// records over as they are instead of decoding and encoding each again.
    fn takes_stored_records(&self) -> bool {
        false
    }

    /// Writes stored records ([`crate::message::record`]: one JSON object each, no newline),
    /// one outcome per record, as [`Sink::write_batch`] does. Called only when
    /// [`Sink::takes_stored_records`]; any other sink refuses them.
    fn write_stored_records(&self, records: &[&[u8]]) -> Vec<WriteOutcome> {
        let refuse = SinkError::new(self.kind(), "this sink takes no encoded records");
        vec![WriteOutcome::Transient(refuse); records.len()]
    }

    /// Initializes the real destination and proves it is usable (for `svc test-sink`),
    /// returning a one-line human verdict.
    fn check(&self) -> Result<String, SinkError>;
}

/// The `sink` block: exactly one sink type.
#[derive(Debug, Clone, PartialEq)]
pub enum SinkConfig {
    File(file::FileSinkConfig),
    ObjectStore(Box<object_store::config::ObjectStoreConfig>),
    Http(Box<http::config::HttpSinkConfig>),
    RelationalDb(relational::RelationalConfig),
    Fanout(fanout::FanoutConfig),
    Spool(Box<spool::SpoolSinkConfig>),
}

impl SinkConfig {
    /// Reads the `sink` block, dispatching on `type`.
    pub fn read(mut r: ObjectReader<'_>) -> Option<SinkConfig> {
        let kind = r.req_string("type");
        let cfg = match kind.as_str() {
            "file" => Some(SinkConfig::File(file::FileSinkConfig::read(&mut r))),
            "object_store" => Some(SinkConfig::ObjectStore(Box::new(
                object_store::config::ObjectStoreConfig::read(&mut r),
            ))),
            "http" => Some(SinkConfig::Http(Box::new(
                http::config::HttpSinkConfig::read(&mut r),
            ))),
            "relational_db" => Some(SinkConfig::RelationalDb(
                relational::RelationalConfig::read(&mut r),
            )),
            "fanout" => Some(SinkConfig::Fanout(fanout::FanoutConfig::read(&mut r))),
            "spool" => spool::SpoolSinkConfig::read(&mut r).map(|c| SinkConfig::Spool(Box::new(c))),
            "" => None,
            _ => {
                r.problem(
                    "type",
                    "must be one of: file, object_store, http, relational_db, fanout, spool",
                );
                None
            }
        };
        if cfg.is_some() {
            r.finish();
        }
        cfg
    }

    pub fn kind(&self) -> &'static str {
        match self {
            SinkConfig::File(_) => "file",
            SinkConfig::ObjectStore(_) => "object_store",
            SinkConfig::Http(_) => "http",
            SinkConfig::RelationalDb(_) => "relational_db",
            SinkConfig::Fanout(_) => "fanout",
            SinkConfig::Spool(_) => "spool",
        }
    }

    /// Why this sink would refuse `env` for good without sending it, by the check its own
    /// writer makes (the HTTP sink: a record over `max_request_bytes`, or one it cannot
    /// encode); `None` when it would send it. `svc spool inspect` shows what the drain would
    /// keep as rejected.
    pub fn refuses_for_good(&self, env: &Envelope) -> Option<String> {
        match self {
            SinkConfig::Http(c) => http::request::record(c, env).err().map(|(why, _)| why),
            _ => None,
        }
    }

    /// Builds the sink. May touch the destination (create directories, open clients).
    pub fn build(&self, metrics: Arc<Metrics>) -> Result<Arc<dyn Sink>, SinkError> {
        match self {
            SinkConfig::File(c) => Ok(Arc::new(file::FileSink::new(c.clone(), metrics)?)),
            SinkConfig::ObjectStore(c) => Ok(Arc::new(object_store::ObjectStoreSink::new(
                (**c).clone(),
                metrics,
            )?)),
            SinkConfig::Http(c) => Ok(Arc::new(http::HttpSink::new((**c).clone(), metrics)?)),
            SinkConfig::RelationalDb(c) if c.engine == relational::config::Engine::Mysql => Ok(
                Arc::new(relational::my_sink::MySqlSink::new(c.clone(), metrics)?),
            ),
            SinkConfig::RelationalDb(c) => Ok(Arc::new(relational::RelationalSink::new(
                c.clone(),
                metrics,
            )?)),
            SinkConfig::Fanout(c) => Ok(Arc::new(fanout::FanoutSink::new(c, metrics)?)),
            SinkConfig::Spool(c) => {
                let spool = spool::Spool::open(&c.spool, metrics)
                    .map_err(|e| SinkError::new("spool", e.to_string()))?;
                Ok(Arc::new(spool::fallback::SpoolSink::new(Arc::new(spool))))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_read_as_operator_text_not_debug() {
        let full = SinkError::new(
            "file",
            "append to segment-1.jsonl: No space left on device (os error 28)",
        );
        assert_eq!(
            WriteOutcome::Transient(full.clone()).to_string(),
            "transient: sink file: append to segment-1.jsonl: No space left on device (os error 28)"
        );
        assert_eq!(
            WriteOutcome::Permanent(full.classified(FailureClass::TooLarge)).to_string(),
            "permanent (too_large): sink file: append to segment-1.jsonl: No space left on device (os error 28)"
        );
        assert_eq!(WriteOutcome::Durable.to_string(), "durable");
        assert_eq!(WriteOutcome::AlreadyDurable.to_string(), "already durable");
    }

    #[test]
    fn http_refusals_carry_their_status_in_the_code() {
        assert_eq!(FailureClass::HttpStatus(400).code(), "http_400");
        assert_eq!(FailureClass::HttpStatus(599).code(), "http_599");
        assert_eq!(FailureClass::HttpStatus(42).code(), "http_other");
    }

    #[test]
    fn a_kept_cause_is_the_source_and_printed_once() {
        let cause = std::io::Error::other("disk full");
        let e = SinkError::new("file", "output directory /out is not writable").caused_by(cause);
        assert_eq!(
            e.to_string(),
            "sink file: output directory /out is not writable"
        );
        assert_eq!(
            std::error::Error::source(&e).map(|c| c.to_string()),
            Some("disk full".to_string())
        );
        assert_eq!(
            crate::text::error_chain(&e),
            "sink file: output directory /out is not writable: disk full"
        );
        assert_eq!(
            WriteOutcome::Transient(e.clone()).to_string(),
            "transient: sink file: output directory /out is not writable: disk full"
        );
        // Equal by what they say, the cause included.
        assert_eq!(e, e.clone());
        assert_ne!(
            e,
            SinkError::new("file", "output directory /out is not writable")
        );
    }
}
