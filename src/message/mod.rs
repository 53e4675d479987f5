//! What the runner knows about one message, as pure functions of its bytes and the config:
//! the subject grammar, the metadata (priority, classification, labels), the security label
//! profile, the envelope that every sink receives, and its protection (publisher
//! authenticity, payload encryption, custody evidence).
//!
//! Nothing here does I/O or holds a connection (except reading protection keys once at start,
//! `protection::keys`); `svc-normalize` calls into these modules and
//! the unit tests feed them byte literals. The stage order inside `svc-normalize` is
//! input limits -> authenticity -> envelope -> metadata -> security labels -> payload
//! encryption -> custody (see `src/pipeline/normalize.rs`); [`limits`] bounds what one
//! message may bring, authenticity and the last two live in [`protection`].

pub mod envelope;
pub mod labels;
pub mod limits;
pub mod metadata;
pub mod protection;
pub mod subject;
