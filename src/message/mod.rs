//! What the runner knows about one message, as pure functions of its bytes and the config:
//! the subject grammar, the metadata (priority, classification, labels), the security label
//! profile, the envelope that every sink receives, and its protection (publisher
//! authenticity, payload encryption, custody evidence).
//!
//! Nothing here does I/O or holds a connection (except reading protection keys once at start,
//! `protection::keys`); `svc-normalize` calls into these modules and
//! the unit tests feed them byte literals. The stage order inside `svc-normalize` is
//! input limits -> size policy (input) -> authenticity -> envelope -> metadata -> security
//! labels -> mission metadata -> pre-sink policy -> payload encryption -> custody -> size
//! policy (record) (see `src/pipeline/normalize.rs`); [`limits`] bounds what one message may
//! bring, authenticity and encryption and custody live in [`protection`], the three
//! governance stages ([`mission`], [`policy`], [`size_policy`]) refuse with a [`refusal`].

pub mod envelope;
pub mod failure;
pub mod labels;
pub mod limits;
pub mod metadata;
pub mod mission;
pub mod policy;
pub mod protection;
pub mod record;
pub mod refusal;
pub mod size_policy;
// Subject patterns are a crate of their own (crates/subject), which the exporter shares.
pub use svc_subject as subject;
