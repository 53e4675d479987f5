//! The database clients: small, synchronous PostgreSQL ([`postgres`], protocol 3.0) and
//! MySQL/MariaDB ([`mysql`], protocol 4.1) clients on `std::net`, with what they share: the
//! connection parameters ([`params`]), the error kinds ([`error`]) and the deadline-bound TCP and
//! TLS transport ([`transport`]).
//!
//! A library, not part of a sink: it imports only [`svc_text`] (peer text, secrets), and the
//! relational sink and the checkpoint store are its users. Why in-tree and not a crate from
//! crates.io: each client's module comment and docs/sinks/relational.md.
//!
//! Every server is a peer that may be hostile: each operation has one deadline, every message,
//! row count and result size is bounded, and no secret reaches an error's text.

pub mod error;
pub mod mysql;
pub mod params;
pub mod postgres;
pub mod transport;
