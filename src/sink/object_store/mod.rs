//! Object-store sink (`sink.type = "object_store"`): one object per envelope (plus an optional
//! sidecar) in one bucket of an S3-compatible service, under a deterministic key.
//!
//! Threading: the sink owns a [`Pool`] of `max_concurrent_puts` threads named `svc-s3-put-N`
//! (`src/sink/pool.rs`: how batches are handed to them and their outcomes collected), started
//! when it is built and shared by every `svc-sink-N` worker. `write_batch` (on a sink worker)
//! prepares keys and bodies of the whole batch itself (microseconds per object, where a put
//! takes milliseconds); a put thread claims one object at a time and writes it. The number of
//! puts in flight is `max_concurrent_puts` for the whole sink, whatever `sink_workers` is. One
//! object per event is round-trip bound, hence the concurrency; the HTTP agent's pool keeps
//! the keep-alive connections.
//!
//! Failure semantics (see `docs/sinks/object-store.md`):
//! - 2xx: durable. 412 on a conditional create: prior success (`skip_existing`), or, with
//!   `fail_existing`, already durable only when the stored object is the same message, else a
//!   permanent error.
//! - Timeouts, network errors, 408/409/429/5xx: ambiguous; retried here up to `max_retries`
//!   with the configured backoff, then `Transient` (the runner NAKs; redelivery retries the
//!   same key).
//! - Key, size and metadata limits: `Permanent`, before any request.
//! - Other statuses (403, 404 bucket, TLS): `Transient` without in-sink retries: the message
//!   is fine, the destination or its credentials are not.

pub mod body;
pub mod client;
pub mod config;
pub mod error;
pub mod existing;
pub mod layout;

use super::pool::{Job, Pool};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::message::envelope::Envelope;
use crate::metrics::Metrics;
use crate::sink::key::KeyBasis;
use crate::sink::{FailureClass, Sink, SinkError, WriteOutcome};

use crate::aws::chain;
use crate::aws::{Env, ProcessEnv};
use crate::sink::layout::{Compression, DuplicatePolicy};
use client::{ClientOptions, S3Client, S3Error};
use config::ObjectStoreConfig;

const KIND: &str = "object_store";

/// Idle keep-alive connections kept beyond one per put thread. Every request of the sink runs
/// on a put thread, so `max_concurrent_puts` connections are in use at most; a pool smaller
/// than that would close connections after one request (TIME_WAIT per object).
const POOL_SPARE: usize = 2;

pub struct ObjectStoreSink {
    shared: Arc<Shared>,
    /// The put threads, `svc-s3-put-N`.
    pool: Pool<Shared>,
    /// `bucket at endpoint, credentials from source`, safe to print.
    description: String,
}

/// What the put threads share with the sink.
struct Shared {
    cfg: ObjectStoreConfig,
    client: S3Client,
    metrics: Arc<Metrics>,
}

/// One envelope, ready to write: everything the put thread needs, owned.
struct Prepared {
    keys: layout::ObjectKeys,
    bodies: body::Bodies,
    /// Identity of the message, to recognise it in an existing object.
    stream: String,
    stream_incarnation: String,
    stream_sequence: u64,
    payload_sha256: String,
    subject: String,
    message_id: Option<String>,
    basis: KeyBasis,
}

/// An object is its batch index and what to put.
impl Job for Shared {
    type Batch = ();
    type Item = (usize, Prepared);
    type Outcomes = std::iter::Once<WriteOutcome>;

    fn indexes((index, _): &(usize, Prepared)) -> &[usize] {
        std::slice::from_ref(index)
    }

    fn run(&self, _: &(), (_, prepared): &(usize, Prepared)) -> Self::Outcomes {
        std::iter::once(self.write(prepared))
    }
}

impl ObjectStoreSink {
    /// Resolves region, endpoint and credentials from the process environment and builds the
    /// HTTP client. Does not contact the object store; the credential chain may call its
    /// source (STS, the container endpoint, instance metadata, a `credential_process`) once,
    /// and then refreshes temporary credentials on its own thread.
    pub fn new(cfg: ObjectStoreConfig, metrics: Arc<Metrics>) -> Result<Self, SinkError> {
        Self::with_env(cfg, metrics, &ProcessEnv)
    }

    pub fn with_env(
        cfg: ObjectStoreConfig,
        metrics: Arc<Metrics>,
        env: &dyn Env,
    ) -> Result<Self, SinkError> {
        let err = |m: String| SinkError::new(KIND, m);
        let region = client::resolve_region(&cfg, env);
        let endpoint = client::resolve_endpoint(&cfg, &region, env).map_err(err)?;
        let creds = chain::provider(&cfg.credential_mode, env, Some(&region)).map_err(err)?;
        let ca_pem = match &cfg.ca_file {
            Some(path) => Some(std::fs::read(path).map_err(|e| {
                SinkError::new(KIND, format!("ca_file {}", path.display())).caused_by(e)
            })?),
            None => None,
        };
        let description = format!(
            "bucket {} at {}://{} (region {region}, credentials from {})",
            cfg.bucket,
            if endpoint.https { "https" } else { "http" },
            endpoint.authority,
            creds.describe()
        );
        let client = S3Client::new(
            endpoint,
            &cfg.bucket,
            &region,
            cfg.addressing_style,
            creds,
            ClientOptions {
                timeout: cfg.request_timeout,
                pool_per_host: cfg.max_concurrent_puts + POOL_SPARE,
                ca_pem,
            },
        )
        .map_err(|e| SinkError::new(KIND, e.to_string()))?;
        require_object_lock(&cfg, &client, &description)?;
        let threads_wanted = cfg.max_concurrent_puts;
        let shared = Arc::new(Shared {
            cfg,
            client,
            metrics,
        });
        let pool = Pool::start("svc-s3-put", KIND, "put", threads_wanted, shared.clone())?;
        log::info!(
            "sink object_store: {description}; {threads_wanted} put threads, duplicate policy \
             {}",
            shared.cfg.duplicate_policy
        );
        Ok(ObjectStoreSink {
            shared,
            pool,
            description,
        })
    }

    /// The underlying client (tests read objects back through it).
    pub fn client(&self) -> &S3Client {
        &self.shared.client
    }

    pub fn config(&self) -> &ObjectStoreConfig {
        &self.shared.cfg
    }
}

impl Shared {
    /// Keys and bodies of an envelope; an error is a permanent outcome (no request made).
    fn prepare(&self, env: &Envelope) -> Result<Prepared, WriteOutcome> {
        let permanent =
            |m: String, class| WriteOutcome::Permanent(SinkError::new(KIND, m).classified(class));
        let keys = layout::object_keys(&self.cfg, env)
            .map_err(|e| permanent(e, FailureClass::InvalidKey))?;
        let bodies = body::build(&self.cfg, env, &keys.primary, keys.sidecar.is_some())
            .map_err(|e| permanent(format!("{}: {e}", keys.primary), FailureClass::TooLarge))?;
        Ok(Prepared {
            keys,
            bodies,
            stream: env.stream.to_string(),
            stream_incarnation: env.stream_incarnation.to_string(),
            stream_sequence: env.stream_sequence,
            payload_sha256: env.payload_info.sha256.clone(),
            subject: env.subject.clone(),
            message_id: env.message_id.clone(),
            basis: KeyBasis::of(self.cfg.key_strategy, env),
        })
    }

    /// One envelope: primary put, then the sidecar put.
    fn write(&self, p: &Prepared) -> WriteOutcome {
        let (keys, bodies) = (&p.keys, &p.bodies);
        let conditional = self.cfg.duplicate_policy != DuplicatePolicy::Replace;
        let mut headers = body::common_headers(&self.cfg, true);
        if conditional {
            headers.push(("if-none-match".into(), "*".into()));
        }
        for (k, v) in &bodies.metadata {
            headers.push((format!("x-amz-meta-{k}"), v.clone()));
        }
        let now = unix_seconds();
        headers.extend(body::retention_headers(&self.cfg, &bodies.primary, now));
        let mut outcome = match self.put_with_retries(&keys.primary, &bodies.primary, &headers) {
            Ok(()) => WriteOutcome::Durable,
            Err(e) if e.is_precondition_failed() && conditional => {
                self.existing_verdict(&keys.primary, p, &bodies.primary)
            }
            Err(e) => return self.failure(&format!("put {}", keys.primary), e),
        };
        if let (Some(sidecar_key), Some(sidecar_body)) = (&keys.sidecar, &bodies.sidecar) {
            if !outcome.is_durable() {
                return outcome;
            }
            let mut headers = body::common_headers(&self.cfg, false);
            if conditional {
                headers.push(("if-none-match".into(), "*".into()));
            }
            headers.extend(body::retention_headers(&self.cfg, sidecar_body, now));
            match self.put_with_retries(sidecar_key, sidecar_body, &headers) {
                Ok(()) => {}
                // The sidecar exists already: written by an earlier delivery.
                Err(e) if e.is_precondition_failed() && conditional => {}
                Err(e) => {
                    outcome = self.failure(
                        &format!("put sidecar {sidecar_key} (primary object stored)"),
                        e,
                    )
                }
            }
        }
        outcome
    }

    /// Maps a final request failure to an outcome.
    fn failure(&self, what: &str, e: S3Error) -> WriteOutcome {
        let err = SinkError::new(KIND, format!("{what}: {e}"));
        if let Some(class) = e.permanent_class() {
            WriteOutcome::Permanent(err.classified(class))
        } else {
            WriteOutcome::Transient(err)
        }
    }

    /// A conditional put found the key taken. The stored object may be this very message,
    /// written by an earlier attempt whose answer was lost (timeout, runner killed before the
    /// ACK): then it is already durable. `skip_existing` also takes a copy of the message made
    /// under the same key (the same payload and the fields the key was made from). Anything
    /// else is the permanent duplicate error, with the reason. The stored object is read
    /// bounded and never parsed into a tree ([`existing`]).
    fn existing_verdict(&self, key: &str, p: &Prepared, ours: &[u8]) -> WriteOutcome {
        let policy = self.cfg.duplicate_policy;
        let duplicate = |why: &str| {
            WriteOutcome::Permanent(
                SinkError::new(
                    KIND,
                    format!("put {key}: key already exists and {why} (duplicate_policy {policy})"),
                )
                .classified(FailureClass::DuplicateExists),
            )
        };
        let stored = match self.client.get_object(key, self.cfg.max_object_bytes) {
            Ok(Some(reply)) => reply.body,
            // Deleted meanwhile: let redelivery try the create again.
            Ok(None) => {
                return WriteOutcome::Transient(SinkError::new(
                    KIND,
                    format!("put {key}: precondition failed but the object is gone"),
                ))
            }
            // Our own object is never larger than `max_object_bytes`.
            Err(S3Error::BodyTooLarge { limit, .. }) => {
                return duplicate(&format!("the stored object is over {limit} bytes"))
            }
            Err(e) => return self.failure(&format!("get {key} after precondition failure"), e),
        };
        if stored == ours {
            return WriteOutcome::AlreadyDurable;
        }
        let identity = existing::Ours {
            stream: &p.stream,
            stream_incarnation: &p.stream_incarnation,
            stream_sequence: p.stream_sequence,
            payload_sha256: &p.payload_sha256,
            subject: &p.subject,
            message_id: p.message_id.as_deref(),
            basis: match policy {
                DuplicatePolicy::SkipExisting => p.basis,
                _ => KeyBasis::StreamSequence,
            },
            plain_len: p.bodies.plain_len,
        };
        match existing::same_message(&self.cfg, &stored, &identity) {
            Ok(()) => WriteOutcome::AlreadyDurable,
            Err(why) => duplicate(&why),
        }
    }

    /// One put, retried in place for retryable failures up to `max_retries`.
    fn put_with_retries(
        &self,
        key: &str,
        body: &[u8],
        headers: &[(String, String)],
    ) -> Result<(), S3Error> {
        let mut attempt = 0u32;
        loop {
            match self.client.put_object(key, body, headers) {
                Ok(_) => return Ok(()),
                Err(e) if e.is_retryable() && attempt < self.cfg.max_retries => {
                    attempt += 1;
                    Metrics::add(&self.metrics.counters.sink_retries_total, 1);
                    log::debug!("sink object_store: put {key}: {e}; retry {attempt}");
                    std::thread::sleep(self.cfg.retry.delay(attempt));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Sink for ObjectStoreSink {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn write_batch(&self, batch: &[Envelope]) -> Vec<WriteOutcome> {
        let outcomes: Vec<OnceLock<WriteOutcome>> = batch.iter().map(|_| OnceLock::new()).collect();
        let mut objects = Vec::with_capacity(batch.len());
        for (index, env) in batch.iter().enumerate() {
            match self.shared.prepare(env) {
                Ok(p) => objects.push((index, p)),
                Err(outcome) => {
                    let _ = outcomes[index].set(outcome);
                }
            }
        }
        self.pool.run((), outcomes, objects)
    }

    /// Proves the bucket is reachable and writable: a conditional put of a probe object under
    /// `<prefix>/_svc-check/` (outside every event namespace) with the same headers as event
    /// objects (content type, encryption), then its delete. The probe is put twice: the
    /// second, conditional put must be refused (412), or the store ignores `If-None-Match`,
    /// and the duplicate policies that rely on it (`skip_existing`, `fail_existing`) would
    /// silently overwrite objects; the sink is then not usable with them.
    fn check(&self) -> Result<String, SinkError> {
        let cfg = &self.shared.cfg;
        let client = &self.shared.client;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let key = layout::probe_key(cfg, &format!("{}-{nanos}", std::process::id()));
        let doc = serde_json::json!({
            "schema": "svc.objectstore.probe.v1",
            "purpose": "svc test-sink write check; safe to delete",
        });
        let json = serde_json::to_vec(&doc).unwrap_or_default();
        let bytes = match cfg.compression {
            Compression::Gzip => body::gzip(&json).unwrap_or_default(),
            Compression::None => json,
        };
        let mut headers = body::common_headers(cfg, true);
        headers.push(("if-none-match".into(), "*".into()));
        client.put_object(&key, &bytes, &headers).map_err(|e| {
            SinkError::new(KIND, format!("{}: put probe {key}: {e}", self.description))
        })?;
        let conditional = match client.put_object(&key, &bytes, &headers) {
            Err(e) if e.is_precondition_failed() => Ok(()),
            Ok(status) => Err(format!(
                "the store answered {status} to a second conditional put (If-None-Match: *) of \
                 probe {key}: it ignores conditional writes"
            )),
            Err(e) => Err(format!(
                "the second conditional put of probe {key} was not refused with 412: {e}"
            )),
        };
        let deleted = match client.delete_object(&key) {
            Ok(()) => "deleted".to_string(),
            Err(e) => format!(
                "deleting it failed: {e}; it lies outside the event namespace and may be \
                 removed by hand"
            ),
        };
        match (conditional, cfg.duplicate_policy) {
            (Ok(()), _) => Ok(format!(
                "{} is reachable and writable, and refuses to overwrite (probe object {key} \
                 written, a second conditional put refused with 412; {deleted}){}",
                self.description,
                lock_note(cfg)
            )),
            (Err(why), DuplicatePolicy::Replace) => Ok(format!(
                "{} is reachable and writable (probe object {key} written; {deleted}); note: \
                 {why}, which duplicate_policy replace does not rely on",
                self.description
            )),
            (Err(why), policy) => Err(SinkError::new(
                KIND,
                format!(
                    "{}: {why}; duplicate_policy {policy} relies on them (use a store that \
                     honours If-None-Match, or duplicate_policy replace); probe {deleted}",
                    self.description
                ),
            )),
        }
    }
}

/// With `object_lock` or `legal_hold`, the bucket must have Object Lock enabled: without it
/// the store refuses every locked put (or, worse, a store that ignores the headers keeps the
/// objects unprotected). Asked once, before the first put.
fn require_object_lock(
    cfg: &ObjectStoreConfig,
    client: &S3Client,
    description: &str,
) -> Result<(), SinkError> {
    if cfg.object_lock.is_none() && !cfg.legal_hold {
        return Ok(());
    }
    match client.object_lock_enabled() {
        Ok(true) => Ok(()),
        Ok(false) => Err(SinkError::new(
            KIND,
            format!(
                "{description}: object_lock/legal_hold are configured but the bucket has no \
                 Object Lock (it must be created with Object Lock enabled)"
            ),
        )),
        Err(e) => Err(SinkError::new(
            KIND,
            format!("{description}: reading the bucket's Object Lock configuration"),
        )
        .caused_by(e)),
    }
}

/// What `svc test-sink` says of Object Lock (the bucket's was checked when the sink was made).
fn lock_note(cfg: &ObjectStoreConfig) -> String {
    let lock = cfg
        .object_lock
        .map(|l| format!("{} retention of {} days", l.mode.as_str(), l.retain_days));
    let hold = cfg.legal_hold.then(|| "a legal hold".to_string());
    match (lock, hold) {
        (None, None) => String::new(),
        (Some(l), Some(h)) => format!("; the bucket has Object Lock: objects get {l} and {h}"),
        (Some(one), None) | (None, Some(one)) => {
            format!("; the bucket has Object Lock: objects get {one}")
        }
    }
}

/// Seconds since the Unix epoch (0 for a clock before it).
fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
