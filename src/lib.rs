//! `svc`: a message-delivery runner (NATS JetStream pull consumer -> one sink, commit first,
//! ACK last) and the library behind its metrics exporter. See `docs/architecture.md`.

pub mod advisory;
pub mod aws;
pub mod backoff;
pub mod broker;
pub mod cli;
pub mod config;
pub mod dead_letter;
pub mod envelope;
pub mod hex;
pub mod labels;
pub mod message_metadata;
pub mod metrics;
pub mod observe;
pub mod pipeline;
pub mod rfc3339;
pub mod sink;
pub mod subject;
