//! The inbox the broker answers confirmed acknowledgements on (`delivery.ack_confirmation`):
//! one subscription, `_INBOX.<unique>.*`, each ACK's reply subject naming it by a token.
//!
//! What the broker sends there is read as peer input: an answer confirms only when its subject
//! is this inbox plus a decimal token, and it carries neither a status nor a payload (the
//! broker's confirmation is an empty message). The queue between the client and `svc-ack` is
//! bounded: past it the client drops answers, and the ACKs they confirmed are sent again.

use std::io;

use super::{AckHandle, Connection};
use crate::text::peer::PeerText;

/// What one message on the inbox says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The broker processed the ACK sent with this token.
    Confirmed(u64),
    /// A message naming this token that is not a confirmation (a status such as 503 when the
    /// consumer is gone, or a payload): the ACK stays unconfirmed.
    NotConfirmed(u64, String),
    /// A subject that names no token of this inbox.
    Foreign,
}

pub struct ConfirmInbox {
    sub: nats::Subscription,
    /// `_INBOX.<unique>.`
    prefix: String,
}

impl ConfirmInbox {
    /// Subscribes the inbox; at most `capacity` answers wait in its queue.
    pub fn open(nc: &Connection, capacity: usize) -> io::Result<ConfirmInbox> {
        let prefix = format!("{}.", nc.new_inbox());
        let sub = nc.subscribe(&format!("{prefix}*"))?;
        sub.set_message_limits(capacity.max(1));
        Ok(ConfirmInbox { sub, prefix })
    }

    /// Sends `+ACK` for `handle` as a request answered on this inbox under `token`.
    pub fn send_ack(&self, nc: &Connection, handle: &AckHandle, token: u64) -> io::Result<()> {
        super::send_confirmed_ack(nc, handle, &format!("{}{token}", self.prefix))
    }

    /// The queue of answers (for `select!`).
    pub fn receiver(&self) -> &crossbeam_channel::Receiver<nats::Message> {
        self.sub.receiver()
    }

    /// Reads one message of the inbox.
    pub fn answer(&self, msg: &nats::Message) -> Answer {
        read_answer(&self.prefix, msg)
    }
}

fn read_answer(prefix: &str, msg: &nats::Message) -> Answer {
    let Some(token) = msg
        .subject
        .strip_prefix(prefix)
        .filter(|t| !t.is_empty() && t.len() <= 20 && t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse::<u64>().ok())
    else {
        return Answer::Foreign;
    };
    // The broker's confirmation is an empty message without headers; a status (503 when the
    // consumer is gone) or anything else confirms nothing.
    let what = match (&msg.headers, msg.data.is_empty(), &msg.unreadable) {
        (None, true, None) => return Answer::Confirmed(token),
        (_, _, Some(why)) => format!("unreadable headers: {why}"),
        (Some(h), _, _) => match h.status() {
            Some(code) => format!("status {}", PeerText::new(code)),
            None => "headers".to_string(),
        },
        (None, false, None) => format!("{} payload bytes", msg.data.len()),
    };
    Answer::NotConfirmed(token, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(subject: &str, header: Option<&str>, data: &[u8]) -> nats::Message {
        let headers = header.map(|v| {
            let mut h = nats::header::HeaderMap::new();
            h.insert("X-Any", v.to_string());
            h
        });
        nats::Message::new(subject, None, data, headers)
    }

    #[test]
    fn only_an_empty_answer_naming_a_token_confirms() {
        let p = "_INBOX.abc.";
        assert_eq!(
            read_answer(p, &msg("_INBOX.abc.42", None, b"")),
            Answer::Confirmed(42)
        );
        assert!(matches!(
            read_answer(p, &msg("_INBOX.abc.42", Some("x"), b"")),
            Answer::NotConfirmed(42, _)
        ));
        assert!(matches!(
            read_answer(p, &msg("_INBOX.abc.7", None, b"x")),
            Answer::NotConfirmed(7, _)
        ));
        for foreign in [
            "_INBOX.abc.",
            "_INBOX.abc.-1",
            "_INBOX.abc.4x",
            "_INBOX.abd.4",
            "_INBOX.abc.99999999999999999999999",
            "_INBOX.abc.+4",
        ] {
            assert_eq!(
                read_answer(p, &msg(foreign, None, b"")),
                Answer::Foreign,
                "{foreign}"
            );
        }
    }
}
