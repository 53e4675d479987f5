//! Plans: what a connector wants sent (HTTP requests or datagrams), checked against its size
//! limits, shown by `--dry-run` with secrets redacted, and delivered with retries.

use std::io::Write;
use std::time::Duration;

use super::{
    check_size, transport, with_retries_until, DatagramTarget, Deadline, ExportError, Failure,
    Limit, Method, Retry, Secret, REDACTED,
};

/// A request header value: plain (shown by `--dry-run`) or secret (shown as `<redacted>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderValue {
    Plain(String),
    Secret(Secret),
}

/// One request header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    pub value: HeaderValue,
}

impl Header {
    pub fn plain(name: &str, value: &str) -> Header {
        Header {
            name: name.to_string(),
            value: HeaderValue::Plain(value.to_string()),
        }
    }

    pub fn secret(name: &str, value: Secret) -> Header {
        Header {
            name: name.to_string(),
            value: HeaderValue::Secret(value),
        }
    }

    /// The value for the wire.
    pub fn wire_value(&self) -> &str {
        match &self.value {
            HeaderValue::Plain(v) => v,
            HeaderValue::Secret(s) => s.expose(),
        }
    }
}

/// Checks a 2xx response body; an `Err` is a permanent failure (e.g. a HEC answer with a
/// non-zero `code`, a cloud API reporting rejected metrics inside a 200).
pub type BodyCheck = fn(&[u8]) -> Result<(), String>;

/// One HTTP request of a plan.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    pub method: Method,
    /// Validated by the policy: http(s), no credentials, no query.
    pub url: String,
    /// Every header, including `Content-Type`.
    pub headers: Vec<Header>,
    pub body: Vec<u8>,
    /// Optional check of a 2xx answer's body.
    pub check: Option<BodyCheck>,
    /// Short description for reports and errors, e.g. `OTLP request (34 metrics)`.
    pub what: String,
}

/// What a connector wants delivered.
#[derive(Debug, Clone)]
pub enum Delivery {
    /// HTTP requests, sent in order; each one retried on its own.
    Http {
        requests: Vec<HttpRequest>,
        timeout: Duration,
        /// Largest response body read (longer answers are cut, never loaded unbounded).
        max_response_bytes: u64,
    },
    /// Datagrams over UDP or a Unix datagram socket, best effort: each datagram retried on
    /// its own, failures counted and reported.
    Datagrams {
        target: DatagramTarget,
        /// `(what, bytes)`: `what` names the metric for errors and reports.
        datagrams: Vec<(String, Vec<u8>)>,
        timeout: Duration,
    },
}

/// A connector's plan: the delivery, the size limit every item must respect, the retry
/// policy, and strings the dry run must hide besides header secrets (e.g. a cloud
/// compartment id in a body).
#[derive(Debug, Clone)]
pub struct Plan {
    pub delivery: Delivery,
    pub limit: Limit,
    pub retry: Retry,
    /// Approved metrics represented (for the report line).
    pub metrics: usize,
    /// Strings replaced by `<redacted>` in dry-run output and error excerpts.
    pub redact: Vec<String>,
}

/// The one size guard over a whole plan: every item is checked before anything is sent.
pub fn check_sizes(plan: &Plan) -> Result<(), ExportError> {
    match &plan.delivery {
        Delivery::Http { requests, .. } => {
            for r in requests {
                check_size(&plan.limit.field, &r.what, r.body.len(), plan.limit.max)?;
            }
        }
        Delivery::Datagrams { datagrams, .. } => {
            for (what, bytes) in datagrams {
                check_size(&plan.limit.field, what, bytes.len(), plan.limit.max)?;
            }
        }
    }
    Ok(())
}

/// Replaces every secret value and every `redact` string in `text` with `<redacted>` (scrub
/// the whole text before any cut: see [`svc_text::secrets`]).
pub use svc_text::secrets::scrub;
use svc_text::secrets::Secrets;

/// Values to scrub from anything printed about `plan`: header secrets (whole, without their
/// scheme prefix, and for an `Authorization` value its key id and signature) and `plan.redact`.
pub(super) fn plan_secrets(plan: &Plan) -> Secrets {
    let mut v = Secrets::of(plan.redact.iter().map(String::as_str));
    if let Delivery::Http { requests, .. } = &plan.delivery {
        for r in requests {
            for h in &r.headers {
                if let HeaderValue::Secret(s) = &h.value {
                    if h.name.eq_ignore_ascii_case("authorization") {
                        v.add_authorization(s.expose());
                    } else {
                        v.add(s.expose());
                    }
                    v.add(s.credential());
                }
            }
        }
    }
    v
}

/// Writes the `--dry-run` rendering of a plan: for HTTP, the request line, headers (secret
/// values as `<redacted>`) and body of each request; for datagrams, one datagram per line
/// (line breaks inside a datagram written as `\n`).
pub fn write_dry_run(
    command: &str,
    plan: &Plan,
    out: &mut dyn Write,
) -> Result<(), std::io::Error> {
    let secrets = plan_secrets(plan);
    let clean = |t: &str| secrets.scrub(t).into_owned();
    match &plan.delivery {
        Delivery::Http { requests, .. } => {
            writeln!(
                out,
                "# svc-observe {command} --dry-run: {} request{}, {} metric{}; nothing sent",
                requests.len(),
                plural(requests.len()),
                plan.metrics,
                plural(plan.metrics)
            )?;
            for r in requests {
                writeln!(out, "{} {}", r.method.as_str(), clean(&r.url))?;
                for h in &r.headers {
                    match &h.value {
                        HeaderValue::Plain(v) => writeln!(out, "{}: {}", h.name, clean(v))?,
                        HeaderValue::Secret(_) => writeln!(out, "{}: {REDACTED}", h.name)?,
                    }
                }
                writeln!(out)?;
                writeln!(out, "{}", clean(&String::from_utf8_lossy(&r.body)))?;
            }
        }
        Delivery::Datagrams {
            target, datagrams, ..
        } => {
            writeln!(
                out,
                "# svc-observe {command} --dry-run: {} datagram{} to {target}, {} metric{}; nothing sent",
                datagrams.len(),
                plural(datagrams.len()),
                plan.metrics,
                plural(plan.metrics)
            )?;
            for (_, d) in datagrams {
                let text = String::from_utf8_lossy(d).replace('\n', "\\n");
                writeln!(out, "{}", clean(&text))?;
            }
        }
    }
    out.flush()
}

pub(super) fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// What a delivery achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub items: usize,
    pub bytes: usize,
}

/// Sends a plan (after [`check_sizes`]) within the run's `deadline`: each attempt gets at most
/// what is left of it, and no wait between attempts runs past it. HTTP: every request must
/// succeed (after retries); the first request that fails stops the delivery. Datagrams: every
/// datagram is tried (best effort) until the deadline; any failure makes the delivery fail
/// with the counts.
pub fn deliver(block: &'static str, plan: &Plan, deadline: &Deadline) -> Result<Sent, ExportError> {
    let secrets = plan_secrets(plan);
    let end = Some(deadline.end());
    match &plan.delivery {
        Delivery::Http {
            requests,
            timeout,
            max_response_bytes,
        } => {
            // A trust-root file named by SSL_CERT_FILE that cannot be used is an environment
            // problem (exit 2), like an unset token variable.
            let agent = transport::http_agent(*timeout).map_err(ExportError::Environment)?;
            let mut bytes = 0;
            for (i, r) in requests.iter().enumerate() {
                let label = format!("{block}: {}", r.what);
                let res = with_retries_until(&label, &plan.retry, end, |_| {
                    let limit = deadline.cap(*timeout).map_err(Failure::Permanent)?;
                    transport::send_http(&agent, r, *max_response_bytes, &secrets, limit)
                });
                match res {
                    Ok(reply) => {
                        log::info!("{label}: HTTP {}", reply.status);
                        bytes += r.body.len();
                    }
                    Err((f, attempts)) => {
                        return Err(ExportError::Send {
                            block,
                            sent: i,
                            total: requests.len(),
                            last: format!(
                                "{}: {} (after {attempts} attempt{})",
                                r.what,
                                secrets.scrub(f.reason()).into_owned(),
                                plural(attempts as usize)
                            ),
                        })
                    }
                }
            }
            Ok(Sent {
                items: requests.len(),
                bytes,
            })
        }
        Delivery::Datagrams {
            target,
            datagrams,
            timeout,
        } => {
            let socket = transport::DatagramSocket::open(target, *timeout).map_err(|e| {
                ExportError::Send {
                    block,
                    sent: 0,
                    total: datagrams.len(),
                    last: format!("cannot open a socket for {target}: {e}"),
                }
            })?;
            let (mut sent, mut bytes, mut last) = (0, 0, None);
            for (what, d) in datagrams {
                if deadline.left().is_zero() {
                    // The rest is not tried: a receiver that blocks every send would otherwise
                    // hold the run for datagrams x attempts x timeout.
                    last = Some(format!("{what}: {}", deadline.reached()));
                    break;
                }
                let label = format!("{block}: {what}");
                let res = with_retries_until(&label, &plan.retry, end, |_| {
                    let limit = deadline.cap(*timeout).map_err(Failure::Permanent)?;
                    socket.send_within(d, limit)
                });
                match res {
                    Ok(()) => {
                        sent += 1;
                        bytes += d.len();
                    }
                    Err((f, attempts)) => {
                        log::warn!(
                            "{label}: not sent after {attempts} attempt{}: {}",
                            plural(attempts as usize),
                            f.reason()
                        );
                        last = Some(format!("{what}: {}", f.reason()));
                    }
                }
            }
            match last {
                None => Ok(Sent { items: sent, bytes }),
                Some(last) => Err(ExportError::Send {
                    block,
                    sent,
                    total: datagrams.len(),
                    last,
                }),
            }
        }
    }
}
