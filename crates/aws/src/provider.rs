//! The credentials a caller signs with, kept current: [`Provider::current`] is a lock and an
//! `Arc` clone, never a network call, so the data path never waits for a credential source.
//!
//! Static credentials (environment, static profile keys, a `credential_process` answer
//! without `Expiration`) are kept as they are. Temporary ones are refreshed ahead of expiry
//! by one thread per provider, `svc-aws-creds`: it fetches again when
//! [`refresh_delay`] says (5 minutes before expiry, or half-way for shorter lifetimes), and
//! the old credentials are served meanwhile. A failed refresh keeps the current credentials
//! while they are valid and says so in the log (warning, with when they expire); it is retried
//! with a backoff. Once they have expired, [`Provider::current`] fails with the last refresh
//! error (the sink treats that as transient: the message is redelivered) until a refresh
//! succeeds.
//!
//! Dropping the provider stops the thread; a fetch in progress finishes first (it has its own
//! deadline) and is not waited for.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use time::OffsetDateTime;

use super::credentials::{Credentials, Source};
use super::parse::Issued;

/// A fetch of fresh credentials from the source that answered first; returns the source too
/// (the IMDS role name can change).
pub type Fetch = Box<dyn Fn() -> Result<(Issued, Source), String> + Send + Sync>;

/// How long before expiry a refresh starts, at most.
pub const REFRESH_AHEAD: Duration = Duration::from_secs(300);

struct State {
    current: Arc<Credentials>,
    expiration: Option<OffsetDateTime>,
    source: Source,
    /// Successful fetches so far (the first one included).
    fetches: u64,
    last_error: Option<String>,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

/// See the module comment.
pub struct Provider {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("Provider")
            .field("source", &st.source)
            .field("credentials", &st.current)
            .field("expiration", &st.expiration)
            .finish()
    }
}

impl Provider {
    /// Credentials that do not change.
    pub fn fixed(credentials: Credentials, source: Source) -> Provider {
        Provider {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    current: Arc::new(credentials),
                    expiration: None,
                    source,
                    fetches: 1,
                    last_error: None,
                    stop: false,
                }),
                wake: Condvar::new(),
            }),
        }
    }

    /// Fetches once now (an error is the caller's start-up error); with an expiration,
    /// starts the refresh thread.
    pub fn refreshing(fetch: Fetch) -> Result<Provider, String> {
        let (issued, source) = fetch()?;
        let expiration = issued.expiration;
        let p = Provider::fixed(issued.credentials, source);
        p.lock().expiration = expiration;
        if expiration.is_some() {
            let shared = p.shared.clone();
            std::thread::Builder::new()
                .name("svc-aws-creds".into())
                .spawn(move || refresh_loop(&shared, &fetch))
                .map_err(|e| format!("cannot start the credential refresh thread: {e}"))?;
        }
        Ok(p)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The credentials to sign with now; an error once they have expired and no refresh
    /// has succeeded.
    pub fn current(&self) -> Result<Arc<Credentials>, String> {
        let st = self.lock();
        match st.expiration {
            Some(exp) if exp <= OffsetDateTime::now_utc() => Err(format!(
                "credentials from {} expired at {}; refresh failing: {}",
                st.source,
                rfc3339(exp),
                st.last_error.as_deref().unwrap_or("not refreshed yet")
            )),
            _ => Ok(st.current.clone()),
        }
    }

    /// Where the current credentials came from (safe to print).
    pub fn source(&self) -> Source {
        self.lock().source.clone()
    }

    /// When the current credentials expire; `None` for credentials that do not.
    pub fn expiration(&self) -> Option<OffsetDateTime> {
        self.lock().expiration
    }

    /// Successful fetches so far (1 after start).
    pub fn fetches(&self) -> u64 {
        self.lock().fetches
    }

    /// `source` and, for temporary credentials, their expiry: the start-up log's words.
    pub fn describe(&self) -> String {
        let st = self.lock();
        match st.expiration {
            Some(e) => format!(
                "{} (temporary, expire {}; refreshed ahead of expiry)",
                st.source,
                rfc3339(e)
            ),
            None => st.source.to_string(),
        }
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.lock().stop = true;
        self.shared.wake.notify_all();
    }
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| t.unix_timestamp().to_string())
}

/// How long to wait before refreshing credentials that expire `left` from now: until
/// [`REFRESH_AHEAD`] before expiry, or half of `left` when that is shorter (short-lived
/// credentials), at least 1 s.
pub fn refresh_delay(left: Duration) -> Duration {
    let ahead = REFRESH_AHEAD.min(left / 2);
    left.saturating_sub(ahead).max(Duration::from_secs(1))
}

/// After a failed refresh: a quarter of the validity left, between 1 s and 60 s; 5 s once
/// expired.
pub fn retry_delay(left: Duration) -> Duration {
    if left.is_zero() {
        Duration::from_secs(5)
    } else {
        (left / 4).clamp(Duration::from_secs(1), Duration::from_secs(60))
    }
}

fn left_until(exp: Option<OffsetDateTime>) -> Duration {
    match exp {
        Some(e) => {
            let secs = (e - OffsetDateTime::now_utc()).as_seconds_f64();
            Duration::from_secs_f64(secs.max(0.0))
        }
        // Not expected (the thread runs for temporary credentials only): check hourly.
        None => Duration::from_secs(3600),
    }
}

fn refresh_loop(shared: &Shared, fetch: &Fetch) {
    let lock = || shared.state.lock().unwrap_or_else(|e| e.into_inner());
    let mut wait = refresh_delay(left_until(lock().expiration));
    loop {
        {
            let st = lock();
            let (st, _) = shared
                .wake
                .wait_timeout_while(st, wait, |s| !s.stop)
                .unwrap_or_else(|e| e.into_inner());
            if st.stop {
                return;
            }
        }
        // The fetch runs without the lock: signers keep using the current credentials.
        let result = fetch();
        let mut st = lock();
        if st.stop {
            return;
        }
        match result {
            Ok((issued, source)) => {
                if source != st.source {
                    log::info!(
                        "AWS credentials now from {source} (were from {})",
                        st.source
                    );
                }
                st.current = Arc::new(issued.credentials);
                st.expiration = issued.expiration;
                st.source = source;
                st.fetches += 1;
                st.last_error = None;
                log::info!(
                    "AWS credentials from {} refreshed; {}",
                    st.source,
                    match st.expiration {
                        Some(e) => format!("they expire {}", rfc3339(e)),
                        None => "they do not expire".to_string(),
                    }
                );
                if st.expiration.is_none() {
                    return;
                }
                wait = refresh_delay(left_until(st.expiration));
            }
            Err(e) => {
                let left = left_until(st.expiration);
                wait = retry_delay(left);
                if left.is_zero() {
                    log::error!(
                        "AWS credentials from {}: refresh failed: {e}; they expired at {}, \
                         requests fail until a refresh succeeds (next try in {:.0} s)",
                        st.source,
                        st.expiration.map(rfc3339).unwrap_or_default(),
                        wait.as_secs_f64()
                    );
                } else {
                    log::warn!(
                        "AWS credentials from {}: refresh failed: {e}; the current ones stay \
                         in use until they expire at {} (next try in {:.0} s)",
                        st.source,
                        st.expiration.map(rfc3339).unwrap_or_default(),
                        wait.as_secs_f64()
                    );
                }
                st.last_error = Some(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn creds(id: &str) -> Credentials {
        Credentials {
            access_key_id: id.into(),
            secret_access_key: "s".into(),
            session_token: Some("t".into()),
        }
    }

    #[test]
    fn delays() {
        let s = Duration::from_secs;
        assert_eq!(refresh_delay(s(3600)), s(3300));
        assert_eq!(refresh_delay(s(6)), s(3));
        assert_eq!(refresh_delay(s(0)), s(1));
        assert_eq!(retry_delay(s(0)), s(5));
        assert_eq!(retry_delay(s(2)), s(1));
        assert_eq!(retry_delay(s(3600)), s(60));
    }

    /// Refresh ahead, a failed refresh that keeps the valid credentials, then expiry.
    #[test]
    fn refreshes_ahead_keeps_valid_ones_then_expires() {
        let calls = Arc::new(AtomicU32::new(0));
        let c = calls.clone();
        let fetch: Fetch = Box::new(move || {
            let n = c.fetch_add(1, Ordering::SeqCst);
            if n >= 2 {
                return Err("endpoint down".into());
            }
            Ok((
                Issued {
                    credentials: creds(&format!("K{n}")),
                    expiration: Some(OffsetDateTime::now_utc() + Duration::from_secs(3)),
                },
                Source::Environment,
            ))
        });
        let p = Provider::refreshing(fetch).unwrap();
        assert_eq!(p.current().unwrap().access_key_id, "K0");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while p.fetches() < 2 {
            assert!(std::time::Instant::now() < deadline, "no refresh");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(p.current().unwrap().access_key_id, "K1");
        // The third fetch fails: K1 stays in use while valid, then current() fails.
        while calls.load(Ordering::SeqCst) < 3 {
            assert!(std::time::Instant::now() < deadline, "no retry");
            std::thread::sleep(Duration::from_millis(20));
        }
        while p.current().is_ok() {
            assert!(std::time::Instant::now() < deadline, "never expired");
            assert_eq!(p.current().unwrap().access_key_id, "K1");
            std::thread::sleep(Duration::from_millis(20));
        }
        let e = p.current().unwrap_err();
        assert!(
            e.contains("expired at") && e.ends_with("endpoint down"),
            "{e}"
        );
        assert!(!format!("{p:?}").contains("K1"));
    }
}
