//! Text forms the service writes: lower-case hex digests, RFC 3339 instants, the bounded,
//! escaped form in which anything a peer said may reach a log line or an error, and the
//! scrubbing of secrets a peer echoes back, and the escaping of what reaches a terminal.

pub mod hex;
pub mod peer;
pub mod rfc3339;
pub mod secrets;
pub mod terminal;
