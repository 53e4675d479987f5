//! The broker side: connecting ([`connection`]), binding the durable pull consumer
//! ([`binding`]), turning deliveries into plain data plus an acknowledgement handle
//! ([`delivery`]), and sending ACK/NAK/TERM/in-progress ([`ack`]). This file holds what they
//! share: the connection types and [`BrokerError`].
//!
//! The client is the sync `nats` crate, carried in-tree (`third_party/nats`, its changes in
//! `CHANGES.md` there): it delivers every message the broker sends, marking what it could not
//! read as sent (`unreadable`), which `svc-normalize` settles.

mod ack;
pub mod advisory;
mod binding;
pub mod config;
pub mod confirm_inbox;
mod connection;
pub mod consumer_limits;
pub mod consumer_shape;
pub mod consumer_watch;
pub mod dead_letter;
mod delivery;
pub mod incarnation;
pub mod inherited;
pub mod inspect;
pub mod permissions;
pub mod probe;

use std::fmt;
use std::io;

use crate::text::peer::PeerText;
pub use connection::{connect, connect_within, read_credentials_file};
pub use permissions::Denials;

pub use ack::*;
pub use binding::*;
pub use delivery::*;

/// The broker connection (aliased so the crate's deprecation allowance stays in this module).
pub type Connection = nats::Connection;
/// A bound pull subscription.
pub type PullSubscription = nats::jetstream::PullSubscription;

/// A broker failure, safe to print (never a credential). `Display` says what we were doing
/// (`broker: connect`); the cause is its `source()`, printed once by whoever prints the error
/// ([`crate::text::error_chain`]).
#[derive(Debug)]
pub struct BrokerError {
    /// What we were doing, e.g. `connect`, `bind consumer ORDERS/svc`.
    pub action: String,
    pub source: PeerCause,
}

/// Characters of a [`BrokerError`]'s source shown at most: our longest own message plus a
/// bounded quote of the broker.
const SOURCE_MAX_CHARS: usize = 512;

impl fmt::Display for BrokerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "broker: {}", self.action)
    }
}

impl std::error::Error for BrokerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// The cause of a [`BrokerError`]. Its text can carry what the broker said (a JetStream API
/// error description, an `-ERR`), so `Display` shows it as [`PeerText`]: bounded to
/// `SOURCE_MAX_CHARS` and escaped.
#[derive(Debug)]
pub struct PeerCause(pub io::Error);

impl From<io::Error> for PeerCause {
    fn from(e: io::Error) -> Self {
        PeerCause(e)
    }
}

impl fmt::Display for PeerCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}",
            PeerText::with_limit(&self.0.to_string(), SOURCE_MAX_CHARS)
        )
    }
}

/// No source of its own: the I/O error's text is already its `Display`.
impl std::error::Error for PeerCause {}

fn err(action: impl Into<String>) -> impl FnOnce(io::Error) -> BrokerError {
    let action = action.into();
    move |source| BrokerError {
        action,
        source: source.into(),
    }
}

pub(crate) fn is_not_found(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || e.to_string().contains("10014")
        || e.to_string().to_lowercase().contains("not found")
}

#[cfg(test)]
mod tests {

    use super::delivery::*;
    use crate::message::envelope::RawMessage;

    use std::sync::Arc;

    #[test]
    fn a_batch_completed_confirmation_ends_no_request() {
        assert!(batch_completed("409", Some("Batch Completed")));
        assert!(!batch_completed(
            "409",
            Some("Message Size Exceeds MaxBytes")
        ));
        assert!(!batch_completed("408", Some("Request Timeout")));
        assert!(!batch_completed("409", None));
    }

    use super::*;

    /// Found by `fuzz/fuzz_targets/ack_subject.rs`: empty stream or consumer tokens were
    /// accepted (and became the delivery's stream name).
    #[test]
    fn ack_subjects_with_empty_names_or_wide_times_are_refused() {
        for bad in [
            // A publish time wider than the broker's int64 (review atk46c: it overflowed ages).
            "$JS.ACK.ORDERS.svc.1.2.3.-170141183460469231731687303715884105728.5",
            "$JS.ACK.ORDERS.svc.1.2.3.9223372036854775808.5",
            "$JS.ACK..svc.1.2.3.4.5",
            "$JS.ACK.ORDERS..1.2.3.4.5",
            "$JS.ACK.hub.ACC..svc.1.2.3.4.5.x",
        ] {
            assert_eq!(AckSubject::parse(bad), None, "{bad}");
        }
    }

    /// The tokens are found by a byte loop since h53http: every subject made of these tokens
    /// (empty ones, signs, overflowing numbers, non-ASCII, 1 to 12 of them) parses as the
    /// `str::split` version did.
    #[test]
    fn ack_subjects_parse_as_the_split_version_did() {
        fn by_split(reply: &str) -> Option<AckSubject<'_>> {
            let rest = reply.strip_prefix("$JS.ACK.")?;
            let mut tokens: [&str; 9] = [""; 9];
            let mut count = 0;
            for token in rest.split('.') {
                if count < tokens.len() {
                    tokens[count] = token;
                }
                count += 1;
            }
            let t = match count {
                7 => &tokens[..7],
                n if n >= 9 => &tokens[2..9],
                _ => return None,
            };
            if t[0].is_empty() || t[1].is_empty() {
                return None;
            }
            Some(AckSubject {
                stream: t[0],
                consumer: t[1],
                delivered: t[2].parse().ok()?,
                stream_sequence: t[3].parse().ok()?,
                consumer_sequence: t[4].parse().ok()?,
                published_unix_nanos: t[5].parse::<i64>().ok()?.into(),
                pending: t[6].parse().unwrap_or(0),
            })
        }
        let pool = [
            "",
            "S",
            "svc",
            "1",
            "+2",
            "-3",
            "07",
            "18446744073709551616",
            "9223372036854775807",
            "-9223372036854775808",
            "é",
            "x y",
            "$JS",
        ];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut parsed = 0;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = 1 + (x % 12) as usize;
            let tokens: Vec<&str> = (0..n)
                .map(|i| {
                    // Mostly numbers after the names, so many subjects parse.
                    let pick = (x >> (5 * i % 59)) as usize;
                    if (2..7).contains(&i) && pick % 3 > 0 {
                        pool[3 + pick % 4]
                    } else {
                        pool[pick % pool.len()]
                    }
                })
                .collect();
            let reply = format!("$JS.ACK.{}", tokens.join("."));
            assert_eq!(AckSubject::parse(&reply), by_split(&reply), "{reply}");
            parsed += usize::from(by_split(&reply).is_some());
        }
        assert!(parsed > 1000, "{parsed} of the subjects parsed");
        for odd in [
            "$JS.ACK.",
            "$JS.ACK",
            "$JS.ACK..",
            "$JS.ACK.a.b.1.2.3.4.",
            "x",
        ] {
            assert_eq!(AckSubject::parse(odd), by_split(odd), "{odd}");
        }
    }

    #[test]
    fn ack_subjects_of_both_forms_parse() {
        let expected = AckSubject {
            stream: "ORDERS",
            consumer: "svc",
            delivered: 2,
            stream_sequence: 1041,
            consumer_sequence: 17,
            published_unix_nanos: 1_700_000_000_123_456_789,
            pending: 5,
        };
        for reply in [
            "$JS.ACK.ORDERS.svc.2.1041.17.1700000000123456789.5",
            "$JS.ACK._.ACCHASH.ORDERS.svc.2.1041.17.1700000000123456789.5",
            "$JS.ACK.hub.ACCHASH.ORDERS.svc.2.1041.17.1700000000123456789.5.rnd",
            "$JS.ACK.hub.ACCHASH.ORDERS.svc.2.1041.17.1700000000123456789.5.rnd.future",
        ] {
            assert_eq!(AckSubject::parse(reply), Some(expected), "{reply}");
        }
        // The crate agrees on the form the broker here sends.
        let m = nats::Message {
            reply: Some("$JS.ACK.ORDERS.svc.2.1041.17.1700000000123456789.5".into()),
            ..Default::default()
        };
        let info = m.jetstream_message_info().unwrap();
        assert_eq!(
            (
                info.stream,
                info.consumer,
                info.delivered,
                info.stream_seq,
                info.consumer_seq
            ),
            ("ORDERS", "svc", 2, 1041, 17)
        );
        assert_eq!(
            info.published.unix_timestamp_nanos(),
            1_700_000_000_123_456_789
        );
    }

    #[test]
    fn a_consumer_created_again_starts_a_new_ack_generation() {
        let shared = Arc::new(AckGeneration::default());
        let mut names = DeliveryNames::new("I1".into(), Arc::clone(&shared));
        for sequence in [1, 2, 7] {
            names.note_consumer_sequence(sequence);
        }
        assert_eq!((names.generation, shared.current()), (0, 0));
        // Delivery sequence 1 again: handles of earlier deliveries are of another generation.
        names.note_consumer_sequence(1);
        assert_eq!((names.generation, shared.current()), (1, 1));
        names.note_consumer_sequence(2);
        assert_eq!(shared.current(), 1);
    }

    /// A stream found created again starts a generation too, unless the delivery's own
    /// consumer sequence already did (a runner beside others may see no sequence go back).
    #[test]
    fn a_stream_found_created_again_starts_one_generation() {
        let shared = Arc::new(AckGeneration::default());
        let mut names = DeliveryNames::new("I1".into(), Arc::clone(&shared));
        names.note_consumer_sequence(5);
        assert_eq!(names.set_incarnation("I2".into()), Some(1));
        assert_eq!((names.generation, shared.current()), (1, 1));
        names.note_consumer_sequence(6);
        names.note_consumer_sequence(2);
        assert_eq!(shared.current(), 2, "the sequence went back");
        assert_eq!(names.set_incarnation("I3".into()), None, "not twice");
        assert_eq!((names.generation, shared.current()), (2, 2));
    }

    #[test]
    fn empty_deliveries_with_a_size_header_may_be_headers_only() {
        let size = |name: &str| vec![(name.to_string(), "60".to_string())];
        let empty = |headers| RawMessage {
            headers,
            ..RawMessage::sample("orders.a", 1, b"")
        };
        assert!(maybe_headers_only(&empty(size("Nats-Msg-Size"))));
        assert!(maybe_headers_only(&empty(size("nats-msg-size"))));
        let unreadable = RawMessage {
            unreadable: Some("a header block"),
            ..empty(vec![])
        };
        assert!(maybe_headers_only(&unreadable));
        assert!(!maybe_headers_only(&empty(vec![])));
        assert!(!maybe_headers_only(&empty(size("Nats-Msg-Id"))));
        let whole = RawMessage {
            headers: size("Nats-Msg-Size"),
            ..RawMessage::sample("orders.a", 1, b"{}")
        };
        assert!(!maybe_headers_only(&whole));
    }

    #[test]
    fn delivery_names_are_shared_until_they_change() {
        let mut cached = None;
        let first = DeliveryNames::share(&mut cached, "ORDERS");
        let again = DeliveryNames::share(&mut cached, "ORDERS");
        assert!(Arc::ptr_eq(&first, &again));
        let other = DeliveryNames::share(&mut cached, "AUDIT");
        assert_eq!(&*other, "AUDIT");
        assert_eq!(&*first, "ORDERS");
        assert!(Arc::ptr_eq(
            &other,
            &DeliveryNames::share(&mut cached, "AUDIT")
        ));
    }

    #[test]
    fn other_subjects_are_not_deliveries() {
        for reply in [
            "_INBOX.abc",
            "$JS.ACK.ORDERS.svc.2.1041.17.1700000000123456789",
            "$JS.ACK.x.ORDERS.svc.2.1041.17.1700000000123456789.5",
            "$JS.ACK.ORDERS.svc.two.1041.17.1700000000123456789.5",
            "$JS.ACK.ORDERS.svc.2.-1.17.1700000000123456789.5",
            "$JS.ACK.ORDERS.svc.2.1041.17.time.5",
        ] {
            assert_eq!(AckSubject::parse(reply), None, "{reply}");
        }
    }
}

#[cfg(test)]
#[path = "client_parser_tests.rs"]
mod client_parser_tests;
