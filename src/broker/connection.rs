//! Connecting to the broker: credentials from the environment or private files, TLS and
//! mutual TLS, the refusal to send credentials in plaintext to advertised servers, reconnect
//! pacing, and the callbacks that count connection events and keep permission violations.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::{NatsAuth, NatsConfig};
use super::{invalid, probe, BrokerError, Connection, Denials};
use crate::backoff::{Backoff, Growth, Jitter};
use crate::message::protection::keys::{read_private_file, read_private_file_up_to};
use crate::metrics::Metrics;
use crate::text::log_budget::LogBudget;
use crate::text::peer::PeerText;
use crate::text::secret_bytes::{env_secret, SecretString};

/// Reads a secret from the named environment variable; the error names the variable only.
/// Ours is wiped once the client has copied it (the client keeps its own copy for reconnects).
fn secret_from_env(var: &str) -> Result<SecretString, BrokerError> {
    env_secret(var).map_err(|_| BrokerError {
        action: "connect".into(),
        source: io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("environment variable {var} is not set or not valid UTF-8"),
        )
        .into(),
    })
}

/// Whole time allowed for reading one seed's INFO before connecting (see [`probe`]).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Refuses to start when a plaintext seed, to which the credentials may go (loopback, per
/// validation), advertises servers off the host: a reconnect would carry the credentials to
/// them in clear. A seed that cannot be probed is left to the connect that follows.
fn check_advertised_servers(cfg: &NatsConfig, timeout: Duration) -> Result<(), BrokerError> {
    if cfg.tls_required || cfg.allow_plaintext_credentials || cfg.auth == NatsAuth::None {
        return Ok(());
    }
    for url in &cfg.urls {
        let Ok(remote) = probe::advertised_remote_plaintext(url, timeout.min(PROBE_TIMEOUT)) else {
            continue;
        };
        if !remote.is_empty() {
            let list = remote.join(", ");
            return Err(invalid(
                "connect",
                &format!(
                    "the broker at {url} advertises servers off this host ({}); a reconnect \
                     would send them the nats.auth credentials in plaintext: use TLS, set \
                     no_advertise on the broker, or set nats.allow_plaintext_credentials to true",
                    PeerText::with_limit(&list, 120)
                ),
            ));
        }
    }
    Ok(())
}

/// What of `auth` a server receives in clear without TLS, when it is a secret: a token, a
/// password, or a credentials file's user JWT (NKey sends only a signature of the server's
/// nonce, which is worth nothing to whoever receives it).
fn cleartext_secret(auth: &NatsAuth) -> Option<&'static str> {
    match auth {
        NatsAuth::Token { .. } => Some("the token"),
        NatsAuth::UserPassword { .. } => Some("the user name and password"),
        NatsAuth::CredentialsFile { .. } => Some("the credentials file's user JWT"),
        NatsAuth::None | NatsAuth::NKey { .. } => None,
    }
}

/// Warns once per connect when a secret would go to the broker in clear. Validation allows it
/// only to loopback (or with `allow_plaintext_credentials`), and loopback is not safe either:
/// whatever local process holds the broker's port (during a broker restart, say) receives it.
fn warn_cleartext_credentials(cfg: &NatsConfig) {
    if cfg.tls_required {
        return;
    }
    if let Some(what) = cleartext_secret(&cfg.auth) {
        log::warn!(
            "broker: nats.auth sends {what} to {} without TLS: any local process that holds the broker's \
             port (during a broker restart, say) receives it; use NKey authentication \
             (nats.auth.mode nkey) or TLS (docs/security.md)",
            cfg.urls.join(", ")
        );
    }
}

/// Connects with the configured auth and TLS, counting connection events into `metrics` and
/// keeping the broker's permission violations in `denials`. Each attempt to one server (TCP,
/// INFO, TLS, CONNECT, the first PONG) takes at most the client's default 5 s
/// ([`nats::DEFAULT_CONNECT_TIMEOUT`]); then the next server is tried.
pub fn connect(
    cfg: &NatsConfig,
    metrics: Arc<Metrics>,
    denials: Arc<Denials>,
) -> Result<Connection, BrokerError> {
    connect_within(cfg, metrics, denials, nats::DEFAULT_CONNECT_TIMEOUT)
}

/// [`connect`] with each attempt to one server bounded by `timeout` (an operator command's
/// `--timeout`).
///
/// A seed that completes the handshake and then answers nothing fails the connect's first
/// round trip; with several seeds each is then tried first in turn (the client otherwise
/// picks its first server at random, so a second try could land on the same one).
pub fn connect_within(
    cfg: &NatsConfig,
    metrics: Arc<Metrics>,
    denials: Arc<Denials>,
    timeout: Duration,
) -> Result<Connection, BrokerError> {
    check_advertised_servers(cfg, timeout)?;
    warn_cleartext_credentials(cfg);
    let attempt = |first: Option<&str>| {
        let mut opts = options(cfg, metrics.clone(), denials.clone(), timeout)?;
        if let Some(url) = first {
            opts = opts.try_first(url);
        }
        // The servers are named: "Connection refused" alone does not say which address was
        // tried. Validation keeps credentials out of the URLs, so they are safe to print.
        opts.connect(cfg.urls.join(",").as_str())
            .map_err(|e| BrokerError {
                action: "connect".into(),
                source: io::Error::new(e.kind(), format!("{e} (servers: {})", cfg.urls.join(", ")))
                    .into(),
            })
    };
    let first = attempt(None);
    let silent = |e: &BrokerError| {
        e.source
            .0
            .to_string()
            .starts_with(nats::FIRST_FLUSH_UNANSWERED)
    };
    match first {
        Err(e) if cfg.urls.len() > 1 && silent(&e) => {
            log::warn!(
                "{}; trying each server first in turn",
                crate::text::error_chain(&e)
            );
            let mut last = e;
            for url in &cfg.urls {
                match attempt(Some(url)) {
                    Ok(nc) => return Ok(nc),
                    Err(e) => last = e,
                }
            }
            Err(last)
        }
        other => other,
    }
}

/// The client's options: auth, TLS, the connect timeout and the callbacks that count
/// connection events into `metrics` and keep permission violations in `denials`.
fn options(
    cfg: &NatsConfig,
    metrics: Arc<Metrics>,
    denials: Arc<Denials>,
    timeout: Duration,
) -> Result<nats::Options, BrokerError> {
    let mut opts = match &cfg.auth {
        NatsAuth::None => nats::Options::new(),
        NatsAuth::UserPassword {
            username_env,
            password_env,
        } => nats::Options::with_user_pass(
            secret_from_env(username_env)?.expose(),
            secret_from_env(password_env)?.expose(),
        ),
        NatsAuth::Token { token_env } => {
            nats::Options::with_token(secret_from_env(token_env)?.expose())
        }
        NatsAuth::CredentialsFile { path } => credentials_options(path)?,
        NatsAuth::NKey { seed_file } => nkey_options(seed_file)?,
    };
    if let Some(ca) = &cfg.tls_ca_file {
        opts = opts.add_root_certificate(ca);
    }
    if let Some((cert, key)) = &cfg.tls_client_cert {
        let (cert_pem, key_pem) = client_identity(cert, key)?;
        opts = opts.client_identity_pem(cert_pem, key_pem);
    }
    // The crate decides TLS per connection from this flag, the URL's scheme and the server's
    // INFO; servers it learns from INFO `connect_urls` are added as `nats://`, so without
    // the flag a `tls://` seed could hand the client (and our credential) to a plaintext
    // address. `cfg.tls_required` is already true for every TLS trigger (config validation).
    opts = opts.tls_required(cfg.tls_required);
    let (m1, m2, m3) = (metrics.clone(), metrics.clone(), metrics);
    let ended = denials.clone();
    let budget = std::sync::Mutex::new(LogBudget::default());
    opts = opts
        .with_name(&cfg.connection_name)
        .connect_timeout(timeout)
        // Reconnect forever: an outage must not end the runner; unacked work is redelivered.
        .max_reconnects(None)
        .reconnect_delay_callback(connect_delay)
        .disconnect_callback(move || {
            Metrics::add(&m1.counters.broker_connection_disconnects_total, 1);
            log::warn!("broker: connection lost; reconnecting");
        })
        .reconnect_callback(move || {
            Metrics::add(&m2.counters.broker_connection_reconnects_total, 1);
            log::info!("broker: reconnected");
        })
        // The client's thread ends only when the connection is closed on purpose; if it ever
        // ends otherwise, the runner must stop rather than wait for a reconnect that never
        // comes.
        .close_callback(move || ended.note_client_ended())
        .error_callback(move |e| {
            Metrics::add(&m3.counters.broker_connection_errors_total, 1);
            let text = e.to_string();
            if denials.note(&text) {
                // Logged once by whoever stops on it (the runner: its fatal error).
                return;
            }
            // A broker can send `-ERR` lines as fast as it writes: 38 MiB of them once made
            // 3.7 million warn lines in 5 s. Counted all, logged within a budget.
            let Some(suppressed) = budget.lock().map_or(None, |mut b| b.admit(Instant::now()))
            else {
                return;
            };
            let more = if suppressed > 0 {
                format!(" ({suppressed} more before this were not logged)")
            } else {
                String::new()
            };
            // The server's `-ERR` text (and the crate's wording around it): peer text.
            log::warn!("broker: asynchronous error: {}{more}", PeerText::new(&text));
        });
    Ok(opts)
}

/// Largest client certificate chain read.
const MAX_CERT_FILE_BYTES: u64 = 1 << 20;

/// The client certificate (public, read bounded) and key (a private file: the payload keys'
/// rule) for mutual TLS, read once here and handed to the client as bytes.
fn client_identity(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), BrokerError> {
    use std::io::Read;
    let cert_error = |e: &dyn fmt::Display| {
        invalid(
            "connect",
            &format!("nats.tls_cert_file {}: {e}", cert.display()),
        )
    };
    // Not a secret, but opened as a key is (no link, never blocking on a FIFO planted there).
    let (file, _) = crate::files::owner::open_regular(cert).map_err(|e| cert_error(&e))?;
    let mut cert_pem = Vec::new();
    file.take(MAX_CERT_FILE_BYTES + 1)
        .read_to_end(&mut cert_pem)
        .map_err(|e| cert_error(&e))?;
    if cert_pem.len() as u64 > MAX_CERT_FILE_BYTES {
        return Err(invalid(
            "connect",
            &format!(
                "nats.tls_cert_file {}: larger than {MAX_CERT_FILE_BYTES} bytes",
                cert.display()
            ),
        ));
    }
    let key_pem = read_private_file(key).map_err(|e| {
        invalid(
            "connect",
            &format!("nats.tls_key_file {}: {e}", key.display()),
        )
    })?;
    // The client takes its own copy (kept for reconnects, not wiped); ours is wiped here.
    Ok((cert_pem, key_pem.expose().as_bytes().to_vec()))
}

/// Largest NATS credentials file read: a user JWT (a few KiB with many permissions) and the
/// seed.
pub const MAX_CREDS_FILE_BYTES: u64 = 64 * 1024;

/// Reads a NATS credentials file (user JWT and NKey seed) by the payload keys' rule (no link,
/// a regular file opened without blocking, owned by the service's user or root, readable by
/// its owner only, at most [`MAX_CREDS_FILE_BYTES`]), once: the client signs with what was
/// read and never opens the path itself (it used to, at every connect, following links and
/// blocking on a FIFO).
pub fn read_credentials_file(path: &Path) -> Result<SecretString, String> {
    read_private_file_up_to(path, MAX_CREDS_FILE_BYTES)
}

fn credentials_options(path: &Path) -> Result<nats::Options, BrokerError> {
    let what = |why: &str| {
        invalid(
            "connect",
            &format!("nats.auth.credentials_file {}: {why}", path.display()),
        )
    };
    let text = read_credentials_file(path).map_err(|e| what(&e))?;
    // The parse error is not shown: it could quote the file.
    nats::Options::with_static_credentials(text.expose())
        .map_err(|_| what("is not a NATS credentials file (a user JWT and an NKey seed)"))
}

/// NKey authentication: the seed (a private file: the payload keys' rule) signs the server's
/// nonce. Neither the seed nor anything derived from it but the public key leaves here.
fn nkey_options(seed_file: &Path) -> Result<nats::Options, BrokerError> {
    let what = |why: &str| {
        invalid(
            "connect",
            &format!("nats.auth.nkey_seed_file {}: {why}", seed_file.display()),
        )
    };
    let seed = read_private_file(seed_file).map_err(|e| what(&e))?;
    let pair = nkeys::KeyPair::from_seed(seed.expose().trim())
        .map_err(|_| what("is not an NKey seed (one line, starting with S)"))?;
    if !pair.public_key().starts_with('U') {
        return Err(what(
            "is not a user NKey seed (its public key must start with U)",
        ));
    }
    let public = pair.public_key();
    Ok(nats::Options::with_nkey(&public, move |nonce| {
        // Signing with a seed that parsed cannot fail; an empty signature is refused by the
        // server rather than panicking here.
        pair.sign(nonce).unwrap_or_default()
    }))
}

/// Retry delays of connection attempts to one server: exponential from 100 ms, doubling up
/// to 4 s, equal jitter (so runners that lost the same broker do not return in step).
const RECONNECT_BACKOFF: Backoff = Backoff {
    growth: Growth::Exponential,
    initial: Duration::from_millis(100),
    multiplier: 2.0,
    max: Duration::from_secs(4),
    jitter: Jitter::Equal,
};

/// Wait before connection attempt `attempt` to a server (0 = the first since the last
/// success). The crate's default sleeps a random 0-1 s even before the first attempt, which
/// delayed every start of `svc run` by half a second on average; the first attempt goes out
/// at once here.
fn connect_delay(attempt: usize) -> Duration {
    match attempt {
        0 => Duration::ZERO,
        n => RECONNECT_BACKOFF.delay(u32::try_from(n).unwrap_or(u32::MAX)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_connection_attempt_is_not_delayed() {
        for _ in 0..100 {
            assert_eq!(connect_delay(0), Duration::ZERO);
        }
    }

    #[test]
    fn retries_back_off_exponentially_with_jitter_up_to_four_seconds() {
        for (attempt, full_ms) in [
            (1, 100),
            (2, 200),
            (3, 400),
            (6, 3200),
            (7, 4000),
            (99, 4000),
        ] {
            for _ in 0..100 {
                let d = connect_delay(attempt).as_secs_f64() * 1000.0;
                let half = full_ms as f64 / 2.0;
                assert!(
                    (half - 1e-6..=full_ms as f64 + 1e-6).contains(&d),
                    "attempt {attempt}: {d} ms outside [{half}, {full_ms}]"
                );
            }
        }
        assert!(connect_delay(usize::MAX) <= Duration::from_secs(4));
    }
}
