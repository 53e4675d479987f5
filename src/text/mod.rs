//! Text forms the service writes: lower-case hex digests, RFC 3339 instants, and the bounded,
//! escaped form in which anything a peer said may reach a log line or an error.

pub mod hex;
pub mod peer;
pub mod rfc3339;
