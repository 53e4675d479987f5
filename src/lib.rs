//! `svc`: a message-delivery runner (NATS JetStream pull consumer -> one sink, commit first,
//! ACK last) and the library behind its metrics exporter. See `docs/architecture.md`.

pub mod allocator;
pub mod aws;
pub mod backoff;
pub mod broker;
pub mod cli;
pub mod config;
pub mod db;
pub mod document;
pub mod files;
pub mod host;
pub mod message;
pub mod metrics;
pub mod observe;
pub mod pipeline;
pub mod sink;
pub mod text;
