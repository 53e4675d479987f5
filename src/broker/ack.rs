//! Acknowledgements: ACK/NAK/TERM/in-progress sent on a delivery's ack subject.

use std::io;
use std::time::Duration;

use super::delivery::AckHandle;
use super::Connection;

/// Acknowledgement verbs of JetStream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AckVerb {
    Ack,
    /// NAK with a redelivery delay.
    Nak(Duration),
    Term,
    InProgress,
}

/// Sends one acknowledgement (buffered; the client's flusher or [`Connection::flush`] sends it).
pub fn send_ack(nc: &Connection, handle: &AckHandle, verb: AckVerb) -> io::Result<()> {
    match verb {
        AckVerb::Ack => nc.publish(&handle.reply, b"+ACK"),
        AckVerb::Nak(delay) if delay.is_zero() => nc.publish(&handle.reply, b"-NAK"),
        AckVerb::Nak(delay) => nc.publish(
            &handle.reply,
            format!("-NAK {{\"delay\": {}}}", delay.as_nanos()),
        ),
        AckVerb::Term => nc.publish(&handle.reply, b"+TERM"),
        AckVerb::InProgress => nc.publish(&handle.reply, b"+WPI"),
    }
}

/// Sends `+ACK` as a request: the broker answers on `confirm_to` once it has processed it
/// (JetStream's double acknowledgement; `pipeline/confirm.rs` waits for that answer).
pub fn send_confirmed_ack(nc: &Connection, handle: &AckHandle, confirm_to: &str) -> io::Result<()> {
    nc.publish_request(&handle.reply, confirm_to, b"+ACK")
}
