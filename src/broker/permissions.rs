//! Permission violations the broker reports on a connection.
//!
//! A subject the runner's NATS user may not use is not refused where it is used: the server
//! drops the publish or subscription and sends `-ERR 'Permissions Violation for Publish to
//! "<subject>"'` (or `for Subscription to`) on the connection, which the client hands to its
//! error callback. Left there, a denied ACK only shows as messages coming back, a denied
//! request as a timeout. [`Denials`] keeps the first violation so the runner can stop with it;
//! the subject is the server's text and shown as [`PeerText`]. The text never holds a secret:
//! the server names the subject, not the user or its credentials.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::text::peer::PeerText;

/// Characters of the server's text kept (a subject is at most a few hundred in practice).
const MAX_TEXT_CHARS: usize = 300;

/// The first permission violation seen on a connection.
#[derive(Debug, Default)]
pub struct Denials {
    first: Mutex<Option<String>>,
    /// The client's connection thread has ended: it will never reconnect or deliver again.
    client_ended: AtomicBool,
}

impl Denials {
    /// Records `server_error` when it is a permission violation; true then.
    pub fn note(&self, server_error: &str) -> bool {
        let Some(text) = violation(server_error) else {
            return false;
        };
        let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert(text);
        true
    }

    /// Notes that the client's connection thread ended (its close callback).
    pub fn note_client_ended(&self) {
        self.client_ended.store(true, Ordering::SeqCst);
    }

    /// Whether the client's connection thread ended: a runner still running then would log
    /// "reconnecting" and deliver nothing, for good.
    pub fn client_ended(&self) -> bool {
        self.client_ended.load(Ordering::SeqCst)
    }

    /// The first violation as an operator reads it, if any.
    pub fn first(&self) -> Option<String> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// `permission denied: publish to "<subject>"` for a server's permission violation text.
fn violation(server_error: &str) -> Option<String> {
    let text = server_error.trim().trim_matches('\'');
    let lower = text.to_ascii_lowercase();
    let at = lower.find("permissions violation for ")?;
    let what = &text[at + "permissions violation for ".len()..];
    let shown = PeerText::with_limit(what, MAX_TEXT_CHARS).to_string();
    // "Publish to", "Publish with Reply of", "Subscription to": lowercase the verb only.
    let mut chars = shown.chars();
    let shown = match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect::<String>(),
        None => shown,
    };
    Some(format!("permission denied: {shown}"))
}

/// How `svc run` reports a violation: the user is its own, and the plan says what it needs.
pub fn runner_error(denied: &str) -> String {
    format!(
        "broker: {denied} (the NATS user of nats.auth lacks this permission; \
         `svc stream-plan` lists the permissions the runner needs)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn violations_are_kept_first_one_wins() {
        let d = Denials::default();
        assert!(!d.note("Stale Connection"));
        assert_eq!(d.first(), None);
        assert!(d.note("Permissions Violation for Publish to \"$JS.ACK.ORDERS.svc.1.2.3.4.0\""));
        assert!(d.note("'Permissions Violation for Subscription to \"_INBOX.>\"'"));
        let first = d.first().unwrap();
        assert!(
            first.starts_with("permission denied: publish to \"$JS.ACK.ORDERS.svc.1.2.3.4.0\""),
            "{first}"
        );
    }

    #[test]
    fn subscriptions_are_named_and_peer_text_escaped() {
        let d = Denials::default();
        assert!(d.note("Permissions Violation for Subscription to \"a\u{1b}[31m\""));
        let first = d.first().unwrap();
        assert!(
            first.starts_with("permission denied: subscription to \"a"),
            "{first}"
        );
        assert!(!first.contains('\u{1b}'), "{first}");
    }
}
