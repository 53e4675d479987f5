//! `svc`: a message-delivery runner (NATS JetStream pull consumer -> one sink, commit first,
//! ACK last) and the library behind its metrics exporter. See `docs/architecture.md`.

// The lowest layers, crates of their own (crates/), under their module names.
pub use svc_aws as aws;
pub use svc_db as db;
pub use svc_document as document;
pub use svc_files as files;
pub use svc_host as host;
// The exporter, a crate that does not depend on this one (crates/observe).
pub use svc_observe as observe;
pub use svc_text as text;

pub mod allocator;
pub mod backoff;
pub mod broker;
pub mod cli;
pub mod config;
pub mod message;
pub mod metrics;
pub mod pipeline;
pub mod sink;
