//! What a connection is opened with: plain data, shared by the transport, the startup and the
//! connection itself (`wire.rs`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::error::DbError;
use super::postgres::auth::{AuthPolicy, ChannelBindingMode};
use svc_text::secret_bytes::{env_secret, SecretString};

/// How the connection is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain TCP (the config allows it only for loopback hosts).
    Disable,
    /// TLS required; the certificate chain and the host name are verified.
    VerifyFull,
}

/// Everything needed to open a connection. Holds no secret: the password is resolved by the
/// caller at connect time and passed separately.
#[derive(Clone)]
pub struct ConnectParams {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub database: String,
    pub application_name: String,
    pub tls: TlsMode,
    /// Trust anchors for `VerifyFull` (from the configured CA file or the system store).
    pub tls_config: Option<Arc<rustls::ClientConfig>>,
    /// Authentication methods the server may ask for (`sink.require_auth`).
    pub require_auth: AuthPolicy,
    /// SCRAM channel binding (`sink.channel_binding`).
    pub channel_binding: ChannelBindingMode,
    /// Fewest SCRAM iterations accepted from the server (`sink.scram_min_iterations`).
    pub scram_min_iterations: u32,
    /// One deadline for TCP connect, TLS handshake and authentication together.
    pub connect_timeout: Duration,
    /// One deadline for each operation after connect (a statement's whole round trip).
    pub io_timeout: Duration,
}

impl fmt::Debug for ConnectParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectParams")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("database", &self.database)
            .field("tls", &self.tls)
            .field("require_auth", &self.require_auth.names())
            .finish_non_exhaustive()
    }
}

/// The password named by `sink.password_env`, read at each connect into a wiping owner
/// (`svc_text::secret_bytes`): the caller drops it right after the handshake, which wipes
/// it. Unset, empty or non-UTF-8 is an error naming the variable.
pub fn password_from_env(password_env: Option<&str>) -> Result<Option<SecretString>, DbError> {
    let Some(name) = password_env else {
        return Ok(None);
    };
    match env_secret(name) {
        Ok(v) if !v.is_empty() => Ok(Some(v)),
        _ => Err(DbError::Protocol(format!(
            "environment variable {name} named by sink.password_env is not set"
        ))),
    }
}
