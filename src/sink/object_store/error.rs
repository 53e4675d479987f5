//! Errors of the S3 client: a status with the store's words (kept whole for classification,
//! scrubbed of the request's secrets, shown bounded and escaped), or the transport failure
//! that left no answer. Each error says whether the sink retries it.

use std::fmt;

use crate::sink::FailureClass;
use crate::text::peer::PeerText;
use crate::text::secrets::Secrets;

/// A failed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum S3Error {
    /// The service answered with a non-success status; `code` is the S3 error code when the
    /// body carried one. `code` and `message` are the server's text, kept whole for
    /// classification and shown through [`PeerText`] (bounded, escaped).
    Status {
        status: u16,
        code: String,
        message: String,
    },
    /// The request did not complete within the timeout (the write may have happened).
    Timeout(String),
    /// Connection refused, reset, DNS failure, broken response: the service is unavailable
    /// (the write may have happened).
    Unavailable(String),
    /// TLS handshake or certificate failure.
    Tls(String),
    /// No valid credentials to sign with (temporary ones expired and the refresh is
    /// failing); nothing was sent.
    Credentials(String),
    /// A 2xx answer whose body is over the reader's bound (a GET of an object larger than
    /// the caller can use). Not retryable: the same object comes back.
    BodyTooLarge { status: u16, limit: u64 },
    /// Anything else (bad request construction, unreadable CA file).
    Other(String),
}

impl S3Error {
    /// The error of a non-success answer: its status and the `Code` and `Message` of the S3
    /// error document in its body (message cut to 200 characters). The service's text is kept
    /// as sent, for classification; Display escapes and bounds it. Also the fuzzing entry point
    /// of the error XML (`fuzz/fuzz_targets/s3_error.rs`).
    /// A body that is no error document (or was cut before its elements closed) gives an
    /// excerpt of its start as the message.
    pub fn from_answer(status: u16, body: &[u8]) -> S3Error {
        let text = String::from_utf8_lossy(body);
        let code = xml_field(&text, "Code").unwrap_or_default();
        let message = match xml_field(&text, "Message") {
            Some(m) => m.chars().take(200).collect(),
            None if code.is_empty() => text.trim().chars().take(200).collect(),
            None => String::new(),
        };
        S3Error::Status {
            status,
            code,
            message,
        }
    }

    /// The same error with every secret in `secrets` scrubbed from the peer's text.
    pub(super) fn hidden(self, secrets: &Secrets) -> S3Error {
        let h = |t: String| secrets.scrub(&t).into_owned();
        match self {
            S3Error::Status {
                status,
                code,
                message,
            } => S3Error::Status {
                status,
                code: h(code),
                message: h(message),
            },
            S3Error::Timeout(t) => S3Error::Timeout(h(t)),
            S3Error::Unavailable(t) => S3Error::Unavailable(h(t)),
            S3Error::Tls(t) => S3Error::Tls(h(t)),
            S3Error::Credentials(t) => S3Error::Credentials(h(t)),
            S3Error::Other(t) => S3Error::Other(h(t)),
            e @ S3Error::BodyTooLarge { .. } => e,
        }
    }

    /// HTTP 412: a conditional create found the key.
    pub fn is_precondition_failed(&self) -> bool {
        matches!(self, S3Error::Status { status: 412, .. })
    }

    /// Destination-unavailable or ambiguous: worth retrying the same request in the sink.
    /// 409 is a conditional-write conflict (a concurrent writer of the key); 408, 429 and 5xx
    /// are the service asking to come back.
    pub fn is_retryable(&self) -> bool {
        match self {
            S3Error::Timeout(_) | S3Error::Unavailable(_) => true,
            S3Error::Status { status, .. } => {
                matches!(status, 408 | 409 | 429) || (500..600).contains(status)
            }
            S3Error::Tls(_)
            | S3Error::Credentials(_)
            | S3Error::BodyTooLarge { .. }
            | S3Error::Other(_) => false,
        }
    }

    /// Rejections tied to this object's size or key: redelivery cannot help.
    pub fn permanent_class(&self) -> Option<FailureClass> {
        match self {
            S3Error::Status {
                status: 400, code, ..
            } => match code.as_str() {
                "EntityTooLarge" | "MetadataTooLarge" => Some(FailureClass::TooLarge),
                "KeyTooLongError" => Some(FailureClass::InvalidKey),
                _ => None,
            },
            _ => None,
        }
    }
}

impl fmt::Display for S3Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            S3Error::Status {
                status,
                code,
                message,
            } => {
                write!(f, "status {status}")?;
                // The service's words, bounded and escaped: they reach logs and DLQ records.
                if !code.is_empty() {
                    write!(f, " {}", PeerText::with_limit(code, 64))?;
                }
                if !message.is_empty() {
                    write!(f, ": {}", PeerText::new(message))?;
                }
                if *status == 403 {
                    write!(f, " (check the credentials and the bucket policy)")?;
                }
                Ok(())
            }
            S3Error::Timeout(d) => write!(f, "timeout: {d}"),
            // Transport errors can quote what the peer sent (a malformed status line).
            S3Error::Unavailable(d) => write!(f, "destination unavailable: {}", PeerText::new(d)),
            S3Error::Tls(d) => write!(f, "tls: {d}"),
            S3Error::Credentials(d) => write!(f, "no valid credentials: {d}"),
            S3Error::BodyTooLarge { status, limit } => {
                write!(f, "status {status}: answer body over {limit} bytes")
            }
            S3Error::Other(d) => write!(f, "{d}"),
        }
    }
}

impl std::error::Error for S3Error {}

/// A failure while reading the body of an answer whose status line arrived.
pub(super) fn read_failure(status: u16, e: std::io::Error) -> S3Error {
    if e.kind() == std::io::ErrorKind::TimedOut {
        S3Error::Timeout(format!(
            "reading the body of a status {status} answer timed out"
        ))
    } else {
        S3Error::Unavailable(format!("reading the body of a status {status} answer: {e}"))
    }
}

/// Sorts transport errors into the classes the sink acts on.
pub(super) fn classify(e: ureq::Error) -> S3Error {
    use ureq::Error as E;
    match e {
        E::Timeout(t) => S3Error::Timeout(format!("{t} timed out")),
        E::Io(io) => match io.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
            Some(tls) => S3Error::Tls(format!("rustls: {tls}")),
            None => S3Error::Unavailable(io.to_string()),
        },
        E::ConnectionFailed | E::HostNotFound | E::Protocol(_) => {
            S3Error::Unavailable(e.to_string())
        }
        E::Rustls(t) => S3Error::Tls(t.to_string()),
        E::Tls(t) => S3Error::Tls(t.to_string()),
        E::BodyExceedsLimit(n) => S3Error::Other(format!("response body over {n} bytes")),
        other => S3Error::Other(other.to_string()),
    }
}

/// The text of the first `<name>` element, unescaped for the five XML entities.
pub(super) fn xml_field(text: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let start = text.find(&open)? + open.len();
    let end = start + text[start..].find(&close)?;
    Some(
        text[start..end]
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&amp;", "&"),
    )
}
