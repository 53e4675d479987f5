//! What the runner knows about one message, as pure functions of its bytes and the config:
//! the subject grammar, the metadata (priority, classification, labels), the security label
//! profile and the envelope that every sink receives.
//!
//! Nothing here does I/O or holds a connection; `svc-normalize` calls into these modules and
//! the unit tests feed them byte literals. The stage order inside `svc-normalize` is
//! subject rules -> metadata -> security labels -> envelope (see `src/pipeline/normalize.rs`).

pub mod envelope;
pub mod labels;
pub mod metadata;
pub mod subject;
