//! Startup and authentication of a PostgreSQL session: the state machine that decides what a
//! server may ask for and when, before anything else is accepted.
//!
//! Rules: a method not in `sink.require_auth` is refused before anything is sent for
//! it; one method per startup, in protocol order; SCRAM must complete (server signature
//! verified) before AuthenticationOk is accepted; nothing but authentication messages before
//! AuthenticationOk; channel binding as `sink.channel_binding` says. Every refusal is a
//! [`DbError::Protocol`], and [`Connection::connect`] marks the connection broken so nothing
//! more is written to the server.

use super::auth::{self, AuthMethod, ChannelBinding, ChannelBindingMode};
use super::codec::{AuthRequest, BackendMessage, Msg, PROTOCOL_VERSION};
use super::{ConnectParams, Connection};
use crate::error::DbError;
use svc_text::peer::PeerText;
use svc_text::secret_bytes::SecretBytes;

/// Where authentication stands during startup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No authentication request seen yet.
    Initial,
    ScramFirstSent,
    ScramFinalSent,
    /// The server proved it knows the password; AuthenticationOk must follow.
    ScramVerified,
    /// A cleartext or MD5 answer was sent; AuthenticationOk or an error must follow.
    PasswordSent,
    /// AuthenticationOk received: only parameters, key data and ReadyForQuery may follow.
    Authenticated,
}

impl Phase {
    fn describe(self) -> &'static str {
        match self {
            Phase::Initial => "before any exchange",
            Phase::ScramFirstSent => "after the scram client-first message",
            Phase::ScramFinalSent => "after the scram client-final message",
            Phase::ScramVerified => "after the scram server signature",
            Phase::PasswordSent => "after the password answer",
            Phase::Authenticated => "after authentication",
        }
    }
}

fn refuse(what: String) -> DbError {
    DbError::Protocol(what)
}

impl Connection {
    pub(super) fn startup(
        &mut self,
        p: &ConnectParams,
        password: Option<&[u8]>,
    ) -> Result<(), DbError> {
        let mut out = Vec::new();
        Msg::untagged()
            .i32(PROTOCOL_VERSION)
            .cstr("user")
            .cstr(&p.user)
            .cstr("database")
            .cstr(&p.database)
            .cstr("application_name")
            .cstr(&p.application_name)
            .cstr("client_encoding")
            .cstr("UTF8")
            .bytes(&[0])
            .finish_into(&mut out)?;
        self.send(&out)?;

        let mut scram: Option<auth::Scram> = None;
        let mut phase = Phase::Initial;
        loop {
            let msg = self.read_message()?;
            let request = match msg {
                BackendMessage::Authentication(r) => r,
                BackendMessage::ErrorResponse(e) => return Err(DbError::Server(e)),
                BackendMessage::NegotiateProtocolVersion if phase == Phase::Initial => continue,
                BackendMessage::BackendKeyData { pid, .. } if phase == Phase::Authenticated => {
                    self.backend_pid = pid;
                    continue;
                }
                BackendMessage::ReadyForQuery(status) if phase == Phase::Authenticated => {
                    self.tx_status = status;
                    return Ok(());
                }
                BackendMessage::ReadyForQuery(_) | BackendMessage::BackendKeyData { .. } => {
                    return Err(refuse(
                        "the server ended startup before authentication completed \
                         (not the expected server)"
                            .into(),
                    ))
                }
                other => {
                    return Err(refuse(format!(
                        "unexpected {} during startup",
                        other.name()
                    )))
                }
            };
            let mut out = Vec::new();
            phase = match (phase, request) {
                (Phase::Initial, AuthRequest::Ok) => {
                    self.method_allowed(p, AuthMethod::None)?;
                    Phase::Authenticated
                }
                (Phase::ScramVerified | Phase::PasswordSent, AuthRequest::Ok) => {
                    Phase::Authenticated
                }
                (Phase::ScramFirstSent | Phase::ScramFinalSent, AuthRequest::Ok) => {
                    return Err(refuse(
                        "the server ended scram authentication without proving it knows the \
                         password (not the expected server)"
                            .into(),
                    ))
                }
                (Phase::Initial, AuthRequest::CleartextPassword) => {
                    self.method_allowed(p, AuthMethod::Password)?;
                    // Sent from a buffer of its own, wiped when it drops.
                    self.send(password_message(need_password(password)?)?.expose())?;
                    Phase::PasswordSent
                }
                (Phase::Initial, AuthRequest::Md5Password { salt }) => {
                    self.method_allowed(p, AuthMethod::Md5)?;
                    let answer = auth::md5_password(&p.user, need_password(password)?, &salt);
                    Msg::new(b'p').cstr(&answer).finish_into(&mut out)?;
                    Phase::PasswordSent
                }
                (Phase::Initial, AuthRequest::Sasl(mechanisms)) => {
                    self.method_allowed(p, AuthMethod::ScramSha256)?;
                    need_password(password)?;
                    let binding = self.choose_binding(p, &mechanisms)?;
                    let mechanism = binding.mechanism();
                    let s = auth::Scram::new("", auth::new_nonce().map_err(refuse)?, binding)
                        .with_min_iterations(p.scram_min_iterations);
                    let first = s.client_first();
                    Msg::new(b'p')
                        .cstr(mechanism)
                        .i32(first.len() as i32)
                        .bytes(first.as_bytes())
                        .finish_into(&mut out)?;
                    scram = Some(s);
                    Phase::ScramFirstSent
                }
                (Phase::ScramFirstSent, AuthRequest::SaslContinue(data)) => {
                    let s = scram.as_mut().expect("scram started in ScramFirstSent");
                    let server_first = std::str::from_utf8(&data)
                        .map_err(|_| refuse("sasl data is not utf-8".into()))?;
                    let fin = s
                        .client_final(need_password(password)?, server_first)
                        .map_err(refuse)?;
                    Msg::new(b'p').bytes(fin.as_bytes()).finish_into(&mut out)?;
                    Phase::ScramFinalSent
                }
                (Phase::ScramFinalSent, AuthRequest::SaslFinal(data)) => {
                    let s = scram.as_ref().expect("scram started in ScramFinalSent");
                    let server_final = std::str::from_utf8(&data)
                        .map_err(|_| refuse("sasl data is not utf-8".into()))?;
                    s.verify_server_final(server_final).map_err(refuse)?;
                    Phase::ScramVerified
                }
                (_, AuthRequest::Unsupported(code)) => {
                    let name = match code {
                        2 => "kerberos v5",
                        6 => "scm credentials",
                        7 | 8 => "gssapi",
                        9 => "sspi",
                        _ => "unknown",
                    };
                    return Err(refuse(format!(
                        "server requires unsupported authentication method {code} ({name})"
                    )));
                }
                (phase, request) => {
                    return Err(refuse(format!(
                        "authentication request {} out of order ({})",
                        auth_request_name(&request),
                        phase.describe()
                    )))
                }
            };
            self.authenticated = phase == Phase::Authenticated;
            if !out.is_empty() {
                self.send(&out)?;
            }
        }
    }

    /// Refuses a method `sink.require_auth` does not list, before anything is sent for it; and
    /// any method but SCRAM when channel binding is required.
    fn method_allowed(&self, p: &ConnectParams, m: AuthMethod) -> Result<(), DbError> {
        let asked = match m {
            AuthMethod::None => "no authentication (trust)".to_string(),
            m => format!("{} authentication", m.name()),
        };
        if !p.require_auth.allows(m) {
            return Err(refuse(format!(
                "the server asked for {asked}, which sink.require_auth ({}) does not allow; \
                 nothing was sent",
                p.require_auth.names()
            )));
        }
        if m != AuthMethod::ScramSha256 && p.channel_binding == ChannelBindingMode::Require {
            return Err(refuse(format!(
                "the server asked for {asked}, but sink.channel_binding require needs \
                 SCRAM-SHA-256-PLUS; nothing was sent"
            )));
        }
        Ok(())
    }

    /// Picks SCRAM-SHA-256-PLUS (channel binding) or SCRAM-SHA-256 from the server's list.
    fn choose_binding(
        &self,
        p: &ConnectParams,
        mechanisms: &[String],
    ) -> Result<ChannelBinding, DbError> {
        let offered = |m: &str| mechanisms.iter().any(|x| x == m);
        let tls = self.io.get_ref().channel_binding();
        let binding = match (p.channel_binding, tls) {
            (ChannelBindingMode::Disable, _) | (ChannelBindingMode::Prefer, None) => {
                ChannelBinding::NotSupported
            }
            (mode, Some(hash)) if offered("SCRAM-SHA-256-PLUS") => match hash {
                Ok(hash) => ChannelBinding::TlsServerEndPoint(hash),
                // A certificate without a tls-server-end-point hash (Ed25519, RSASSA-PSS):
                // `n` is honest ("this client cannot bind"), unlike `y`, which the server would
                // rightly take for a downgrade.
                Err(_) if mode == ChannelBindingMode::Prefer => ChannelBinding::NotSupported,
                Err(e) => return Err(refuse(e)),
            },
            (ChannelBindingMode::Prefer, Some(_)) => ChannelBinding::NotOffered,
            (ChannelBindingMode::Require, tls) => {
                return Err(refuse(format!(
                    "sink.channel_binding require: {}; nothing was sent",
                    if tls.is_none() {
                        "the connection has no tls".to_string()
                    } else {
                        format!(
                            "the server does not offer SCRAM-SHA-256-PLUS (offers: {})",
                            PeerText::new(&mechanisms.join(", "))
                        )
                    }
                )))
            }
        };
        if !offered(binding.mechanism()) {
            return Err(refuse(format!(
                "server offers only unsupported sasl mechanisms: {}",
                PeerText::new(&mechanisms.join(", "))
            )));
        }
        Ok(binding)
    }
}

/// The cleartext password message (`p`, length, password, NUL), built in one allocation of
/// its exact size that is wiped on drop.
fn password_message(password: &[u8]) -> Result<SecretBytes, DbError> {
    let len = i32::try_from(4 + password.len() + 1)
        .map_err(|_| DbError::Protocol("the password is larger than 2 GiB".into()))?;
    let mut msg = SecretBytes::with_capacity(1 + 4 + password.len() + 1);
    let out = msg.expose_mut();
    out.push(b'p');
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(password);
    out.push(0);
    Ok(msg)
}

fn need_password(password: Option<&[u8]>) -> Result<&[u8], DbError> {
    password.ok_or_else(|| {
        DbError::Protocol("the server requires a password but sink.password_env is not set".into())
    })
}

fn auth_request_name(r: &AuthRequest) -> &'static str {
    match r {
        AuthRequest::Ok => "ok",
        AuthRequest::CleartextPassword => "cleartext password",
        AuthRequest::Md5Password { .. } => "md5 password",
        AuthRequest::Sasl(_) => "sasl",
        AuthRequest::SaslContinue(_) => "sasl continue",
        AuthRequest::SaslFinal(_) => "sasl final",
        AuthRequest::Unsupported(_) => "unsupported",
    }
}
