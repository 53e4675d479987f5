//! Text forms the service writes: lower-case hex digests, RFC 3339 instants, the bounded,
//! escaped form in which anything a peer said may reach a log line or an error, the scrubbing
//! of secrets a peer echoes back, the escaping of what reaches a terminal, and the budget of
//! log lines a peer can cause, the wiping of secrets from memory once they are no longer
//! needed, and the search for bytes to escape.

pub mod chain;
pub mod hex;
pub mod json;
pub mod log_budget;
pub mod peer;
pub mod rfc3339;
pub mod scan;
pub mod secret_bytes;
pub mod secrets;
pub mod terminal;

pub use chain::error_chain;
