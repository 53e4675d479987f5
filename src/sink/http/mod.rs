//! HTTP sink (`sink.type = "http"`): the batch's messages as records in one or more requests
//! to one URL (a webhook, an ingestion API), committed when the receiver answers a success
//! status, signed the Standard Webhooks way when secrets are configured.
//!
//! Threading: the sink owns a [`Pool`] of `max_concurrent_requests` threads named
//! `svc-http-N` (`src/sink/pool.rs`), started when it is built and shared by every
//! `svc-sink-N` worker, over one `ureq` agent whose pool keeps the connections alive.
//! `write_batch` (on a sink worker) encodes the records and groups them into requests itself;
//! the request threads claim the batch's requests one at a time, as the object-store sink's
//! put threads claim objects, and the worker sleeps until every request of the batch has its
//! verdict. Requests in flight are `max_concurrent_requests` for the whole sink, whatever
//! `sink_workers` is. Dropping the sink stops the pool; its threads finish the batches queued
//! and are joined.
//!
//! Failure semantics (see `docs/sinks/http.md`):
//! - A success status: every record of the request is durable.
//! - A retry status, a timeout or a connection failure: the same request is sent again after
//!   the backoff (or the receiver's `Retry-After`, capped, never shorter) while the batch's
//!   retry budget lasts; then `Transient` for its records (NAK, redelivered under the same
//!   keys; the runner's in-progress acknowledgements keep the batch alive meanwhile).
//! - A `dead_letter_statuses` status (400, 413, 415, 422 by default: the receiver judged a
//!   record): a request of several records is split in halves and each half sent again, down
//!   to single records, so only the records the receiver refuses become `Permanent` (class
//!   `http_<status>`), the others are durable. A record is never durable without a success
//!   status for a request holding it.
//! - Every record of a batch of two or more judged by a dead-letter status, or a dead-letter
//!   status after `refusal::STREAK_LIMIT` dead letters in a row with none accepted: the
//!   receiver refuses the sink (a wrong signing secret, a proxy): as below, never a dead letter.
//! - Any other status (401, 403, 404, 407, 3xx: redirects are never followed): the receiver
//!   refuses the sink itself, not a record. `Transient` for the request's records at once (NAK
//!   with the runner's backoff, never a dead letter), `http_sink_unusable_total`, and one
//!   error line until a request succeeds again.
//! - A record over `max_request_bytes`, or one that cannot be encoded: `Permanent` for that
//!   message alone, before any request.

pub mod client;
pub mod config;
pub mod outcome;
pub mod refusal;
pub mod request;
pub mod signature;

use super::pool::{Job, Pool};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::message::envelope::Envelope;
use crate::metrics::Metrics;
use crate::sink::{FailureClass, Sink, SinkError, WriteOutcome};
use client::Client;
use config::HttpSinkConfig;
use outcome::{next_wait, HttpError};
use request::Record;
use signature::Signer;

use crate::text::secret_bytes::SecretString;
use crate::text::secrets::Secrets;

const KIND: &str = "http";

pub struct HttpSink {
    shared: Arc<Shared>,
    /// The request threads, `svc-http-N`.
    pool: Pool<Shared>,
    /// `POST https://host/path (signed, 2 secret headers)`, safe to print: the URL was
    /// validated to hold no credentials, and the query is left out (it may hold a token).
    description: String,
}

/// What the request threads share with the sink.
struct Shared {
    cfg: Arc<HttpSinkConfig>,
    client: Client,
    signer: Option<Signer>,
    /// `headers_env`, read at start. Never logged, never in the config or a snapshot; wiped
    /// when the sink drops.
    secret_headers: Vec<(String, SecretString)>,
    /// Every secret value a request carries, scrubbed from what a receiver answers.
    secrets: Secrets,
    metrics: Arc<Metrics>,
    /// The receiver refuses the sink itself (said once at error level until a success).
    unusable: AtomicBool,
    /// Dead letters in a row: a receiver judging every record bad refuses the sink.
    streak: refusal::Streak,
}

/// What every request of one batch reads: its encoded records (by batch index) and the end
/// of its in-call retries.
struct Batch {
    records: Vec<Option<Record>>,
    retry_until: Instant,
}

/// A request is a group of batch indexes.
impl Job for Shared {
    type Batch = Batch;
    type Item = Vec<usize>;
    type Outcomes = Vec<WriteOutcome>;

    fn indexes(group: &Vec<usize>) -> &[usize] {
        group
    }

    fn run(&self, batch: &Batch, group: &Vec<usize>) -> Vec<WriteOutcome> {
        self.deliver(batch, group)
    }
}

impl HttpSink {
    /// Reads secrets from the process environment, the CA and client identity files, and
    /// starts the request threads. Does not contact the receiver.
    pub fn new(cfg: HttpSinkConfig, metrics: Arc<Metrics>) -> Result<Self, SinkError> {
        Self::with_env(cfg, metrics, |name| std::env::var(name).ok())
    }

    pub fn with_env(
        cfg: HttpSinkConfig,
        metrics: Arc<Metrics>,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, SinkError> {
        let err = |m: String| SinkError::new(KIND, m);
        let signer = Signer::from_env(&cfg.signing_secrets_env, &var)
            .map_err(|e| err(format!("signing_secrets_env: {e}")))?;
        let mut secret_headers = Vec::with_capacity(cfg.headers_env.len());
        for (name, env) in &cfg.headers_env {
            let value = SecretString::new(var(env).ok_or_else(|| {
                err(format!(
                    "headers_env.{name}: environment variable {env} is not set"
                ))
            })?);
            let text = value.expose();
            if text.is_empty() || text.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
                return Err(err(format!(
                    "headers_env.{name}: environment variable {env} must hold a non-empty \
                     value without control characters"
                )));
            }
            secret_headers.push((name.clone(), value));
        }
        let mut secrets = Secrets::new();
        // A token in the URL's query must not come back through an error's text either.
        if let Ok(u) = url::Url::parse(&cfg.url) {
            if let Some(query) = u.query() {
                secrets.add(query);
            }
            for (_, value) in u.query_pairs() {
                secrets.add(&value);
            }
        }
        for (_, value) in &secret_headers {
            secrets.add_authorization(value.expose());
        }
        // A static header's value is not secret by its name, but a receiver quoting it back
        // (a tenant id, a routing key) is still the request's words: scrubbed the same way.
        for value in cfg.headers.values() {
            secrets.add(value);
        }
        for name in &cfg.signing_secrets_env {
            if let Some(v) = var(name).map(SecretString::new) {
                secrets.add(v.expose().trim());
                secrets.add(v.expose().trim().trim_start_matches("whsec_"));
            }
        }
        // A header the HTTP library refuses would fail every request, transiently, forever:
        // refuse it at start instead (naming the header, never its value). A `headers_env`
        // value is not handed to the library here (its `HeaderValue` is a copy it would free
        // unwiped): the check above already refused every byte the library refuses (controls
        // but tab, and DEL).
        let static_headers = cfg
            .headers
            .iter()
            .map(|(k, v)| (k, Some(v.as_str()), "headers"));
        let env_headers = secret_headers.iter().map(|(k, _)| (k, None, "headers_env"));
        for (name, value, field) in static_headers.chain(env_headers) {
            if ureq::http::HeaderName::from_bytes(name.as_bytes()).is_err()
                || value.is_some_and(|v| ureq::http::HeaderValue::from_str(v).is_err())
            {
                return Err(err(format!(
                    "{field}.{name}: not a valid HTTP header name and value"
                )));
            }
        }
        let cfg = Arc::new(cfg);
        let client = Client::new(cfg.clone()).map_err(err)?;
        let description = describe(&cfg, signer.is_some(), secret_headers.len());
        let threads_wanted = cfg.max_concurrent_requests;
        let shared = Arc::new(Shared {
            cfg,
            client,
            signer,
            secret_headers,
            secrets,
            metrics,
            unusable: AtomicBool::new(false),
            streak: refusal::Streak::default(),
        });
        let pool = Pool::start("svc-http", KIND, "request", threads_wanted, shared.clone())?;
        log::info!("sink http: {description}; {threads_wanted} request threads");
        Ok(HttpSink {
            shared,
            pool,
            description,
        })
    }
}

/// What the sink writes to: scheme, host and port only (a webhook URL's path and a query
/// may carry a token).
fn describe(cfg: &HttpSinkConfig, signed: bool, secret_headers: usize) -> String {
    let target = url::Url::parse(&cfg.url)
        .map(|u| {
            let host = u.host_str().unwrap_or_default().to_string();
            let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
            format!("{}://{host}{port}", u.scheme())
        })
        .unwrap_or_default();
    format!(
        "{} {target} ({}, {}{})",
        cfg.method.as_str(),
        if signed { "signed" } else { "unsigned" },
        match cfg.batching {
            config::Batching::None => "one message per request",
            config::Batching::JsonArray => "json_array batches",
            config::Batching::Ndjson => "ndjson batches",
        },
        if secret_headers > 0 {
            format!(
                ", {secret_headers} header{} from the environment",
                if secret_headers == 1 { "" } else { "s" }
            )
        } else {
            String::new()
        }
    )
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Shared {
    /// The outcomes of one request's records, in order: sent with retries, and split on a
    /// permanent refusal until the refused records are found.
    fn deliver(&self, batch: &Batch, group: &[usize]) -> Vec<WriteOutcome> {
        let records: Vec<&Record> = group
            .iter()
            .filter_map(|i| batch.records[*i].as_ref())
            .collect();
        if records.len() != group.len() {
            // Invariant: only encoded records are grouped; never durable without a request.
            return vec![
                WriteOutcome::Transient(SinkError::new(KIND, "record missing"));
                group.len()
            ];
        }
        self.deliver_records(&records, batch.retry_until)
    }

    fn deliver_records(&self, records: &[&Record], retry_until: Instant) -> Vec<WriteOutcome> {
        let err = match self.send_with_retries(records, retry_until) {
            Ok(()) => return vec![WriteOutcome::Durable; records.len()],
            Err(e) => e,
        };
        let what = if records.len() == 1 {
            records[0].key.clone()
        } else {
            format!("request of {} records", records.len())
        };
        match err.status() {
            Some(status) if !err.is_transient() => {
                if records.len() > 1 {
                    log::debug!("sink http: {what}: {err}; splitting to find the refused records");
                    let (left, right) = records.split_at(records.len() / 2);
                    let mut out = self.deliver_records(left, retry_until);
                    out.extend(self.deliver_records(right, retry_until));
                    return out;
                }
                vec![WriteOutcome::Permanent(
                    SinkError::new(KIND, format!("{what}: {err}"))
                        .classified(FailureClass::HttpStatus(status)),
                )]
            }
            _ => vec![
                WriteOutcome::Transient(SinkError::new(KIND, format!("{what}: {err}")));
                records.len()
            ],
        }
    }

    /// One request, sent again on transient failures while the budget lasts.
    fn send_with_retries(
        &self,
        records: &[&Record],
        retry_until: Instant,
    ) -> Result<(), HttpError> {
        let cfg = &self.cfg;
        let req = request::build(cfg, records)
            .map_err(|e| HttpError::Other(format!("gzip of the request body: {e}")))?;
        let c = &self.metrics.counters;
        let mut attempt = 0u32;
        loop {
            let mut headers = request::headers(
                cfg,
                &self.secret_headers,
                self.signer.as_ref(),
                &req,
                unix_now(),
            );
            let started = Instant::now();
            let result = self
                .client
                .send(&headers, &req.body)
                .map_err(|e| e.hidden(&self.secrets));
            request::wipe_header_values(&mut headers);
            self.metrics.observe(
                crate::metrics::SummaryMetric::HttpRequest,
                started.elapsed().as_secs_f64(),
            );
            Metrics::add(&c.http_request_bytes_total, req.body.len() as u64);
            let counter = match result.as_ref().map(|a| a.status).map_err(HttpError::status) {
                Ok(s) | Err(Some(s)) if s < 300 => &c.http_requests_2xx_total,
                Ok(s) | Err(Some(s)) if s < 400 => &c.http_requests_3xx_total,
                Ok(s) | Err(Some(s)) if s < 500 => &c.http_requests_4xx_total,
                Ok(_) | Err(Some(_)) => &c.http_requests_5xx_total,
                Err(None) => &c.http_request_failures_total,
            };
            Metrics::add(counter, 1);
            let e = match result {
                Ok(_) => {
                    self.usable_again();
                    return Ok(());
                }
                Err(e) if !e.is_transient() => return Err(e),
                // A certificate or handshake failure repeats until an operator acts: NAK now.
                Err(e @ HttpError::Tls(_)) => return Err(e),
                Err(e @ HttpError::Unusable { .. }) => {
                    self.unusable(&e);
                    return Err(e);
                }
                Err(e) => e,
            };
            attempt += 1;
            let wait = next_wait(
                cfg.retry.delay(attempt),
                e.retry_after(),
                cfg.max_retry_after,
            );
            if Instant::now() + wait > retry_until {
                return Err(e);
            }
            Metrics::add(&c.http_retries_total, 1);
            Metrics::add(&c.sink_retries_total, 1);
            if let Some(asked) = e.retry_after() {
                Metrics::add(&c.http_retry_after_waits_total, 1);
                self.metrics.observe(
                    crate::metrics::SummaryMetric::HttpRetryAfterWait,
                    wait.as_secs_f64(),
                );
                log::info!(
                    "sink http: {}: {e}; waiting {:.3} s as asked ({:.3} s)",
                    req.key,
                    wait.as_secs_f64(),
                    asked.as_secs_f64()
                );
            } else {
                log::debug!("sink http: {}: {e}; retry {attempt}", req.key);
            }
            std::thread::sleep(wait);
        }
    }
}

impl Shared {
    /// A status that refuses the sink itself: counted every time, said once.
    fn unusable(&self, e: &dyn std::fmt::Display) {
        Metrics::add(&self.metrics.counters.http_sink_unusable_total, 1);
        if !self.unusable.swap(true, Ordering::Relaxed) {
            log::error!("sink http: the receiver refuses the sink: {e}");
        }
    }

    fn usable_again(&self) {
        if self.unusable.swap(false, Ordering::Relaxed) {
            log::warn!("sink http: the receiver accepts requests again");
        }
    }
}

impl HttpSink {
    /// Dead letters that are the receiver refusing the sink (see [`refusal`]) become NAKs,
    /// counted and said as any refusal of the sink.
    fn refused_whole(&self, outcomes: &mut [WriteOutcome]) {
        let turned = self.shared.streak.apply(outcomes);
        if turned == 0 {
            return;
        }
        let first = outcomes.iter().find_map(|o| match o {
            WriteOutcome::Transient(e) => Some(e.message.clone()),
            _ => None,
        });
        self.shared.unusable(&first.unwrap_or_default());
    }
}

impl Sink for HttpSink {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn write_batch(&self, batch: &[Envelope]) -> Vec<WriteOutcome> {
        let cfg = &self.shared.cfg;
        let outcomes: Vec<OnceLock<WriteOutcome>> = batch.iter().map(|_| OnceLock::new()).collect();
        let mut records = Vec::with_capacity(batch.len());
        let mut sizes = Vec::with_capacity(batch.len());
        let mut indexes = Vec::with_capacity(batch.len());
        for (index, env) in batch.iter().enumerate() {
            match request::record(cfg, env) {
                Ok(r) => {
                    sizes.push(r.bytes.len());
                    records.push(Some(r));
                    indexes.push(index);
                }
                Err((why, class)) => {
                    sizes.push(0);
                    records.push(None);
                    let _ = outcomes[index].set(WriteOutcome::Permanent(
                        SinkError::new(KIND, why).classified(class),
                    ));
                }
            }
        }
        let requests = request::group(cfg, &indexes, &sizes);
        let batch = Batch {
            records,
            retry_until: Instant::now() + cfg.retry_budget,
        };
        let mut outcomes = self.pool.run(batch, outcomes, requests);
        self.refused_whole(&mut outcomes);
        outcomes
    }

    /// A real request: the probe method on the probe URL (or the sink's URL), with the
    /// configured headers. Usable when the receiver answers 2xx, or 405/501 to a method it
    /// does not serve (it answered: the address, TLS and any proxy work); never without an
    /// answer.
    fn check(&self) -> Result<String, SinkError> {
        let cfg = &self.shared.cfg;
        let mut headers: Vec<(String, String)> = cfg
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        request::add_secret_headers(&mut headers, &self.shared.secret_headers);
        let probe = cfg.probe_method.as_str();
        let answer = self
            .shared
            .client
            .probe(&headers)
            .map_err(|e| e.hidden(&self.shared.secrets));
        request::wipe_header_values(&mut headers);
        match answer {
            Ok(status) if (200..300).contains(&status) => Ok(format!(
                "{}: the receiver answered {status} to {probe}",
                self.description
            )),
            Ok(status @ (405 | 501)) => Ok(format!(
                "{}: the receiver answered {status} to {probe} (it does not serve that method; \
                 address, TLS and proxy work)",
                self.description
            )),
            Ok(status) => Err(SinkError::new(
                KIND,
                format!(
                    "{}: the receiver answered {status} to {probe}",
                    self.description
                ),
            )),
            Err(e) => Err(SinkError::new(
                KIND,
                format!("{}: {probe} got no answer", self.description),
            )
            .caused_by(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(extra: &str, env: &[(&str, &str)]) -> Result<HttpSink, SinkError> {
        build_at("http://127.0.0.1:9/hook?token=q-secret-123456", extra, env)
    }

    fn build_at(url: &str, extra: &str, env: &[(&str, &str)]) -> Result<HttpSink, SinkError> {
        let v: serde_json::Value = serde_json::from_str(&format!(
            r#"{{"type": "http", "url": "{url}",
                 "allow_http_for_local_testing": true {extra}}}"#
        ))
        .unwrap();
        let problems = crate::document::reader::Problems::new();
        let cfg = match crate::sink::SinkConfig::read(crate::document::reader::ObjectReader::at(
            "sink".into(),
            &v,
            &problems,
        )) {
            Some(crate::sink::SinkConfig::Http(c)) if problems.is_empty() => *c,
            _ => panic!("bad test config"),
        };
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        HttpSink::with_env(cfg, Arc::new(Metrics::default()), move |name| {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn the_start_line_shows_scheme_host_and_port_never_a_webhook_path() {
        for (url, shown) in [
            (
                "https://hooks.slack.com/services/T0AB12/B0CD34/q-secret-7788",
                "POST https://hooks.slack.com (",
            ),
            (
                "https://discord.com/api/webhooks/123/q-secret-7788",
                "POST https://discord.com (",
            ),
            (
                "http://127.0.0.1:8080/x/q-secret-7788",
                "POST http://127.0.0.1:8080 (",
            ),
        ] {
            let sink = build_at(url, "", &[]).unwrap();
            assert!(sink.description.starts_with(shown), "{}", sink.description);
            assert!(
                !sink.description.contains("q-secret"),
                "{}",
                sink.description
            );
        }
    }

    #[test]
    fn secrets_come_from_the_environment_and_no_error_or_description_shows_one() {
        let headers = r#", "headers_env": {"Authorization": "T_TOKEN"},
                         "signing_secrets_env": ["T_SIGN"]"#;
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let ok = build(
            headers,
            &[("T_TOKEN", "Bearer tok-abcdef123"), ("T_SIGN", secret)],
        )
        .unwrap();
        assert_eq!(
            ok.description,
            "POST http://127.0.0.1:9 (signed, json_array batches, 1 header from the \
             environment)"
        );
        let missing = build(headers, &[("T_SIGN", secret)])
            .err()
            .unwrap()
            .to_string();
        assert_eq!(
            missing,
            "sink http: headers_env.Authorization: environment variable T_TOKEN is not set"
        );
        // The config's header grammar lets `(` through; the HTTP library does not.
        let odd = r#", "headers": {"X(Team)": "payments"}"#;
        let bad = build(odd, &[]).err().unwrap().to_string();
        assert_eq!(
            bad,
            "sink http: headers.X(Team): not a valid HTTP header name and value"
        );
        let unsigned = build(
            headers,
            &[("T_TOKEN", "Bearer x"), ("T_SIGN", "raw-secret-value")],
        )
        .err()
        .unwrap()
        .to_string();
        assert!(!unsigned.contains("raw-secret-value"), "{unsigned}");
        // A static header's value is scrubbed as the secret ones are.
        let with_static = build(r#", "headers": {"X-Tenant": "tenant-9f8e7d6c"}"#, &[]).unwrap();
        let echoed = HttpError::Unusable {
            status: 401,
            body: "unknown tenant tenant-9f8e7d6c".into(),
        }
        .hidden(&with_static.shared.secrets)
        .to_string();
        assert!(!echoed.contains("tenant-9f8e7d6c"), "{echoed}");
        // The URL's query is one of the secrets scrubbed from a receiver's words.
        let echoed = HttpError::Refused {
            status: 400,
            body: "bad token q-secret-123456".into(),
        }
        .hidden(&ok.shared.secrets)
        .to_string();
        assert!(!echoed.contains("q-secret-123456"), "{echoed}");
    }
}
