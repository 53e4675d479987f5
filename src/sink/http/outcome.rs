//! What an answer (or its absence) means: success, retry, a refusal of one record (the
//! `dead_letter_statuses`), or a refusal of the sink itself (any other status: a wrong token,
//! a moved endpoint, a proxy, a redirect), with the receiver's words kept bounded and shown
//! only as peer text, and `Retry-After` read as seconds or an HTTP date.

use std::fmt;
use std::time::{Duration, SystemTime};

use crate::text::peer::PeerText;
use crate::text::secrets::Secrets;

/// Largest part of a response body read (the rest is never read: the connection is closed).
pub const MAX_RESPONSE_BODY: u64 = 64 * 1024;
/// Characters of the receiver's body shown in an error.
const SHOWN_BODY_CHARS: usize = 200;

/// One attempt that did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// The receiver judged the record: a `dead_letter_statuses` status.
    Refused { status: u16, body: String },
    /// The receiver refused the sink itself (credentials, URL, proxy, a redirect): a status
    /// that is neither success, retry nor dead-letter. Nothing is wrong with the records;
    /// they wait (NAK) until an operator fixes the sink.
    Unusable { status: u16, body: String },
    /// A retry status; `retry_after` as the receiver asked, when it did.
    Retry {
        status: u16,
        body: String,
        retry_after: Option<Duration>,
    },
    /// No complete answer within `request_timeout_seconds` (the request may have arrived).
    Timeout(String),
    /// Connection refused or reset, DNS failure, an answer cut short or malformed.
    Unavailable(String),
    /// TLS handshake or certificate failure.
    Tls(String),
    /// Anything else (a request that cannot be built).
    Other(String),
}

impl HttpError {
    /// Worth sending again: retry statuses and every failure that left no answer.
    pub fn is_transient(&self) -> bool {
        !matches!(self, HttpError::Refused { .. } | HttpError::Other(_))
    }

    /// The same error with every secret the request carried scrubbed from the receiver's
    /// words (an answer may quote the request's `Authorization` header), before anything
    /// cuts them.
    pub fn hidden(self, secrets: &Secrets) -> HttpError {
        let h = |t: String| secrets.scrub(&t).into_owned();
        match self {
            HttpError::Refused { status, body } => HttpError::Refused {
                status,
                body: h(body),
            },
            HttpError::Unusable { status, body } => HttpError::Unusable {
                status,
                body: h(body),
            },
            HttpError::Retry {
                status,
                body,
                retry_after,
            } => HttpError::Retry {
                status,
                body: h(body),
                retry_after,
            },
            HttpError::Timeout(t) => HttpError::Timeout(h(t)),
            HttpError::Unavailable(t) => HttpError::Unavailable(h(t)),
            HttpError::Tls(t) => HttpError::Tls(h(t)),
            HttpError::Other(t) => HttpError::Other(h(t)),
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            HttpError::Refused { status, .. }
            | HttpError::Unusable { status, .. }
            | HttpError::Retry { status, .. } => Some(*status),
            _ => None,
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            HttpError::Retry { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let answer = |f: &mut fmt::Formatter<'_>, status: u16, body: &str| {
            write!(f, "status {status}")?;
            let trimmed = body.trim();
            if !trimmed.is_empty() {
                let cut: String = trimmed.chars().take(SHOWN_BODY_CHARS).collect();
                write!(f, ": {}", PeerText::new(&cut))?;
            }
            Ok(())
        };
        match self {
            HttpError::Refused { status, body } => answer(f, *status, body),
            HttpError::Unusable { status, body } => {
                answer(f, *status, body)?;
                if (300..400).contains(status) {
                    f.write_str(" (redirects are never followed)")?;
                }
                f.write_str(
                    " (the receiver refuses the sink, not a record: check the URL, the \
                     credentials and any proxy; messages wait, NAKed)",
                )
            }
            HttpError::Retry {
                status,
                body,
                retry_after,
            } => {
                answer(f, *status, body)?;
                if let Some(d) = retry_after {
                    write!(f, " (retry after {} s)", d.as_secs_f64())?;
                }
                Ok(())
            }
            HttpError::Timeout(d) => write!(f, "timeout: {d}"),
            // Transport errors can quote what the peer sent (a malformed status line).
            HttpError::Unavailable(d) => {
                write!(f, "receiver unavailable: {}", PeerText::new(d))
            }
            HttpError::Tls(d) => write!(f, "tls: {}", PeerText::new(d)),
            HttpError::Other(d) => write!(f, "{d}"),
        }
    }
}

impl std::error::Error for HttpError {}

/// What each status means: the sink's `success_statuses`, `retry_statuses` and
/// `dead_letter_statuses`; any other status refuses the sink itself.
#[derive(Debug, Clone, Copy)]
pub struct Statuses<'a> {
    pub success: &'a [u16],
    pub retry: &'a [u16],
    pub dead_letter: &'a [u16],
}

/// The error of an answered request whose status is not a success, or `None` for success.
pub fn judge(
    status: u16,
    body: &[u8],
    retry_after: Option<&str>,
    statuses: Statuses<'_>,
    now: SystemTime,
) -> Option<HttpError> {
    if statuses.success.contains(&status) {
        return None;
    }
    let body = String::from_utf8_lossy(body).into_owned();
    if statuses.retry.contains(&status) {
        return Some(HttpError::Retry {
            status,
            body,
            retry_after: retry_after.and_then(|v| parse_retry_after(v, now)),
        });
    }
    if statuses.dead_letter.contains(&status) {
        return Some(HttpError::Refused { status, body });
    }
    Some(HttpError::Unusable { status, body })
}

/// `Retry-After`: delta seconds or an HTTP date (a date in the past means now). Anything
/// else is ignored (the backoff applies).
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Duration::from_secs(
            v.parse::<u64>().unwrap_or(u64::MAX).min(86_400),
        ));
    }
    let when = parse_http_date(v)?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO))
}

/// An IMF-fixdate (`Wed, 21 Oct 2015 07:28:00 GMT`), the form RFC 9110 requires senders to use.
fn parse_http_date(v: &str) -> Option<SystemTime> {
    let format = time::format_description::parse_borrowed::<2>(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT",
    )
    .ok()?;
    let t = time::PrimitiveDateTime::parse(v, &format)
        .ok()?
        .assume_utc();
    let secs = u64::try_from(t.unix_timestamp()).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

/// The wait before the next attempt: the backoff, or the receiver's `Retry-After` when
/// longer, capped at `max_retry_after` (never below the backoff).
pub fn next_wait(
    backoff: Duration,
    retry_after: Option<Duration>,
    max_retry_after: Duration,
) -> Duration {
    match retry_after {
        Some(asked) => asked.min(max_retry_after).max(backoff),
        None => backoff,
    }
}

/// Classifies a transport failure.
pub fn classify(e: ureq::Error) -> HttpError {
    use ureq::Error as E;
    match e {
        E::Timeout(t) => HttpError::Timeout(format!("{t} timed out")),
        E::Io(io) => match io.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
            Some(tls) => HttpError::Tls(format!("rustls: {tls}")),
            None if io.kind() == std::io::ErrorKind::TimedOut => HttpError::Timeout(io.to_string()),
            None => HttpError::Unavailable(io.to_string()),
        },
        E::ConnectionFailed | E::HostNotFound | E::Protocol(_) => {
            HttpError::Unavailable(e.to_string())
        }
        E::Rustls(t) => HttpError::Tls(t.to_string()),
        E::Tls(t) => HttpError::Tls(t.to_string()),
        other => HttpError::Unavailable(other.to_string()),
    }
}

/// A failure while reading the body of an answer whose status line arrived.
pub fn read_failure(status: u16, e: std::io::Error) -> HttpError {
    if e.kind() == std::io::ErrorKind::TimedOut {
        HttpError::Timeout(format!(
            "reading the body of a status {status} answer timed out"
        ))
    } else {
        HttpError::Unavailable(format!("reading the body of a status {status} answer: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Statuses<'static> = Statuses {
        success: &[200, 201, 202, 204],
        retry: &[408, 425, 429, 500, 502, 503, 504],
        dead_letter: &[400, 413, 415, 422],
    };

    #[test]
    fn statuses_sort_into_success_retry_and_refusal() {
        let now = SystemTime::now();
        assert_eq!(judge(204, b"", None, S, now), None);
        let e = judge(503, b"busy", Some("2"), S, now).unwrap();
        assert!(e.is_transient());
        assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(e.to_string(), "status 503: busy (retry after 2 s)");
        let e = judge(301, b"", Some("2"), S, now).unwrap();
        assert!(
            matches!(e, HttpError::Unusable { status: 301, .. }),
            "{e:?}"
        );
        assert!(
            e.to_string().starts_with(
                "status 301 (redirects are never followed) (the receiver refuses the sink"
            ),
            "{e}"
        );
        // Statuses that say the sink is unusable never judge a record.
        for status in [401, 403, 404, 407, 409, 501] {
            let e = judge(status, b"no", None, S, now).unwrap();
            assert!(matches!(e, HttpError::Unusable { .. }), "{status}: {e:?}");
        }
        for status in [400, 413, 415, 422] {
            let e = judge(status, b"no", None, S, now).unwrap();
            assert!(matches!(e, HttpError::Refused { .. }), "{status}: {e:?}");
            assert!(!e.is_transient());
        }
        let e = judge(400, b"bad \x1b[31m record", None, S, now).unwrap();
        assert!(!e.to_string().contains('\x1b'), "{e}");
        assert!(judge(206, b"", None, S, now).is_some());
        let echo = judge(401, b"denied: Bearer tok-123456789", None, S, now).unwrap();
        let mut secrets = Secrets::new();
        secrets.add_authorization("Bearer tok-123456789");
        let shown = echo.hidden(&secrets).to_string();
        assert!(!shown.contains("tok-123456789"), "{shown}");
    }

    #[test]
    fn retry_after_reads_seconds_and_dates_and_never_shortens_the_backoff() {
        let now = parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-1", now), None);
        let (b, max) = (Duration::from_millis(500), Duration::from_secs(10));
        assert_eq!(
            next_wait(b, Some(Duration::from_secs(2)), max),
            Duration::from_secs(2)
        );
        assert_eq!(next_wait(b, Some(Duration::from_secs(99)), max), max);
        assert_eq!(next_wait(b, Some(Duration::ZERO), max), b);
        assert_eq!(next_wait(b, None, max), b);
    }
}
