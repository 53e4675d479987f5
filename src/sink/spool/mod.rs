//! The spool: a local, durable, bounded queue of envelope records for when the downstream is
//! gone (see docs/spool.md).
//!
//! - [`frame`]: segment framing (length, CRC-32, resync mark); pure, fuzzed.
//! - [`codec`]: a record's body, the envelope as the sink would receive it.
//! - [`seal`]: a body encrypted at rest (AES-256-GCM, bound to its spool, segment and offset).
//! - [`meta`]: the spool's identity and the first segment sealed under encryption.
//! - [`aside`]: `svc spool set-aside`, one record moved out of the drain's way.
//! - [`dir`]: the directory boundary, the lock, the drain position file.
//! - [`store`]: appends, the drain position, removal of drained segments.
//! - [`scan`]: recovery at open, and the read-only survey of `svc spool status`.
//! - [`drain`]: delivering the spool to a sink, oldest first.
//! - [`put`]: custody checkpoint frames the drain puts into the target's store, checked first.
//! - [`drained`]: the last checkpoint the drain put, per runner id (the start's drained head).
//! - [`fallback`]: the sinks built on it (fallback wrapper, `sink.type` = `spool`).

pub mod aside;
pub mod codec;
pub mod config;
pub mod dir;
pub mod drain;
pub mod drained;
pub mod fallback;
pub mod frame;
pub mod meta;
mod put;
pub mod scan;
pub mod seal;
pub mod store;

pub use config::{SpoolConfig, SpoolSinkConfig};
pub use store::Spool;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_atk47d;
#[cfg(test)]
mod tests_checkpoint;
#[cfg(test)]
mod tests_hostile;
#[cfg(test)]
mod tests_meta;
#[cfg(test)]
mod tests_sealed;
