// Copyright 2020-2022 The NATS Authors
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
// http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

use lazy_static::__Deref;
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::convert::TryFrom;
use std::io::prelude::*;
use std::io::{self, BufReader, Error, ErrorKind};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::str::FromStr;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};
use url::{Host, Url};

use crate::auth_utils;
use crate::proto::{self, ClientOp, ServerOp};
use crate::rustls::{ClientConfig, ClientConnection};
use crate::secure_wipe::SecureString;
use crate::{connect::ConnectInfo, inject_io_failure, AuthStyle, Options, ServerInfo};

/// Maintains a list of servers and establishes connections.
///
/// Clients use this helper to hold a list of known servers discovered through
/// INFO messages, reconnect when the connection is lost, and do exponential
/// backoff after failed connect attempts.
pub(crate) struct Connector {
    /// A map of servers and number of connect attempts: the configured ones, and at most
    /// [`MAX_SERVERS`] in all with those the servers advertise.
    attempts: HashMap<ServerAddress, usize>,
    /// An advertised server was dropped because the map was full (reported once).
    warned_full: bool,

    /// Configured options for establishing connections.
    options: Arc<Options>,

    /// TLS config.
    tls_config: Arc<ClientConfig>,

    /// Entries of the servers' INFO `connect_urls` that were not server addresses, skipped.
    skipped_urls: usize,

    /// [`Options::try_first`], until the first pass over the servers.
    try_first: Option<ServerAddress>,
}

fn configure_tls(options: &Arc<Options>) -> Result<ClientConfig, Error> {
    let mut root_store = rustls::RootCertStore::empty();

    // load native system certs only if user did not specify them
    if options.tls_client_config.is_some() || options.certificates.is_empty() {
        let native = rustls_native_certs::load_native_certs();
        if native.certs.is_empty() {
            if let Some(err) = native.errors.first() {
                return Err(io::Error::new(
                    ErrorKind::Other,
                    format!("could not load platform certs: {err}"),
                ));
            }
        }
        let native_certs = native.certs;

        root_store.add_parsable_certificates(native_certs);
    }

    if let Some(config) = &options.tls_client_config {
        Ok(config.to_owned())
    } else {
        // Include user-provided certificates
        for path in &options.certificates {
            for cert in auth_utils::load_certs(path)? {
                root_store.add(cert).map_err(|err| {
                    io::Error::new(
                        ErrorKind::InvalidInput,
                        format!("could not load certs: {err}"),
                    )
                })?;
            }
        }

        // One explicit provider, as everywhere in svc: no process-wide default needed.
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| io::Error::new(ErrorKind::Other, format!("tls: {e}")))?
        .with_root_certificates(root_store);

        if let Some(identity) = &options.client_identity_pem {
            use rustls::pki_types::pem::PemObject;
            use rustls::pki_types::{CertificateDer, PrivateKeyDer};
            let (cert_pem, key_pem) = &**identity;
            let certs = CertificateDer::pem_slice_iter(cert_pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| {
                    io::Error::new(ErrorKind::InvalidInput, "the client certificate is not PEM")
                })?;
            if certs.is_empty() {
                return Err(io::Error::new(
                    ErrorKind::InvalidInput,
                    "the client certificate file holds no certificate",
                ));
            }
            let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|_| {
                io::Error::new(
                    ErrorKind::InvalidInput,
                    "the client key file holds no PEM private key",
                )
            })?;
            return builder.with_client_auth_cert(certs, key).map_err(|_| {
                io::Error::new(
                    ErrorKind::InvalidInput,
                    "the client certificate and key do not go together",
                )
            });
        }

        if let Some(cert) = &options.client_cert {
            if let Some(key) = &options.client_key {
                let cert = auth_utils::load_certs(cert)?;
                let key = auth_utils::load_key(key)?;

                return builder.with_client_auth_cert(cert, key).map_err(|_| {
                    io::Error::new(ErrorKind::Other, "could not add certificate or key")
                });
            } else {
                return Err(io::Error::new(
                    ErrorKind::Other,
                    "found certificate, but no key",
                ));
            }
        }

        // if there are no client certs provided, connect with just TLS.
        Ok(builder.with_no_client_auth())
    }
}

impl Connector {
    /// Creates a new connector with the URLs and options.
    pub(crate) fn new(urls: Vec<ServerAddress>, options: Arc<Options>) -> io::Result<Connector> {
        let tls_config = configure_tls(&options)?;

        let try_first = match &options.try_first {
            Some(url) => Some(url.parse()?),
            None => None,
        };
        let connector = Connector {
            try_first,
            attempts: urls.into_iter().map(|url| (url, 0)).collect(),
            options,
            tls_config: Arc::new(tls_config),
            skipped_urls: 0,
            warned_full: false,
        };

        Ok(connector)
    }

    /// Adds an URL to the list of servers.
    pub(crate) fn add_server(&mut self, url: ServerAddress) {
        self.attempts.insert(url, 0);
    }

    /// Adds the servers a server advertises (INFO `connect_urls`). An entry that is not a
    /// server address is skipped and counted; the first one is reported through the error
    /// callback, once. (Returning its parse error here once ended the client's thread for
    /// good: the client never connected again.)
    pub(crate) fn add_advertised(&mut self, urls: &[String], client: &crate::client::Client) {
        for url in urls {
            match url.parse() {
                Ok(address) if self.attempts.contains_key(&address) => {}
                Ok(address) if self.attempts.len() >= MAX_SERVERS => {
                    self.skipped_urls += 1;
                    if !self.warned_full {
                        self.warned_full = true;
                        let why = format!(
                            "the server advertised more than {MAX_SERVERS} servers \
                             (connect_urls); the others are not kept"
                        );
                        let error = Error::new(ErrorKind::InvalidData, why);
                        self.options.error_callback.call(client, error);
                    }
                }
                Ok(address) => self.add_server(address),
                Err(_) => {
                    self.skipped_urls += 1;
                    if self.skipped_urls == 1 {
                        let why = format!(
                            "skipped a connect_urls entry of the server's INFO that is not a \
                             server address: {url}"
                        );
                        let error = Error::new(ErrorKind::InvalidData, why);
                        self.options.error_callback.call(client, error);
                    }
                }
            }
        }
    }

    pub(crate) fn get_options(&self) -> Arc<Options> {
        self.options.clone()
    }

    /// Get the list of servers with enough reconnection attempts left
    fn get_servers(&mut self) -> io::Result<Vec<ServerAddress>> {
        let servers: Vec<_> = self
            .attempts
            .iter()
            .filter_map(
                |(server, reconnects)| match self.options.max_reconnects.as_ref() {
                    None => Some(server),
                    Some(max) if reconnects < max => Some(server),
                    Some(_) => None,
                },
            )
            .cloned()
            .collect();

        if servers.is_empty() {
            Err(Error::new(
                ErrorKind::NotFound,
                "no servers remaining to connect to",
            ))
        } else {
            Ok(servers)
        }
    }

    /// Creates a new connection to one of the known URLs.
    ///
    /// If `use_backoff` is `true`, this method will try connecting in a loop
    /// and will back off after failed connect attempts.
    pub(crate) fn connect(
        &mut self,
        use_backoff: bool,
        client: &crate::client::Client,
    ) -> io::Result<(ServerInfo, NatsStream)> {
        // The last seen error, which gets returned if all connect attempts
        // fail.
        let mut last_err = Error::new(ErrorKind::AddrNotAvailable, "no socket addresses");

        loop {
            // Shuffle the list of servers.
            let mut servers = self.get_servers()?;
            fastrand::shuffle(&mut servers);
            if let Some(first) = self.try_first.take() {
                if let Some(at) = servers.iter().position(|s| *s == first) {
                    servers[..=at].rotate_right(1);
                }
            }

            // Iterate over the server list in random order.
            for server in &servers {
                // A client being closed stops trying: its owner waits for this thread.
                client.check_shutdown()?;
                // Calculate sleep duration for exponential backoff and bump the
                // reconnect counter.
                let reconnects = self.attempts.get_mut(server).unwrap();
                let sleep_duration = self.options.reconnect_delay_callback.call(*reconnects);
                *reconnects += 1;

                let lookup_res = server.socket_addrs();

                let mut addrs = match lookup_res {
                    Ok(addrs) => addrs.collect::<Vec<_>>(),
                    Err(err) => {
                        last_err = err;
                        continue;
                    }
                };

                // Shuffle the resolved socket addresses.
                fastrand::shuffle(&mut addrs);

                for addr in addrs {
                    // Sleep for some time if this is not the first connection
                    // attempt for this server (in slices, to see a close at once).
                    sleep_unless_closed(sleep_duration, client)?;

                    // Try connecting to this address.
                    let res = self.connect_addr(addr, server);

                    // Check if connecting worked out.
                    let (server_info, stream) = match res {
                        Ok(val) => val,
                        Err(err) => {
                            last_err = err;
                            continue;
                        }
                    };

                    // Add URLs discovered through the INFO message.
                    self.add_advertised(&server_info.connect_urls, client);

                    *self.attempts.get_mut(server).unwrap() = 0;
                    return Ok((server_info, stream));
                }
            }

            if !use_backoff {
                // All connect attempts have failed.
                return Err(last_err);
            }
        }
    }

    /// Attempts to establish a connection to a single socket address, within the options'
    /// `connect_timeout` for the whole of it: a server that accepts and then stays silent,
    /// sends an endless INFO line, never answers the PING or floods PINGs costs that long at
    /// most, and the caller goes on to the next server.
    fn connect_addr(
        &self,
        addr: SocketAddr,
        server: &ServerAddress,
    ) -> io::Result<(ServerInfo, NatsStream)> {
        // Inject random I/O failures when testing.
        inject_io_failure()?;
        let deadline = Instant::now() + self.options.connect_timeout;

        // Connect to the remote socket.
        let stream = TcpStream::connect_timeout(&addr, left(deadline)?)?;
        stream.set_nodelay(true)?;
        let server_info = read_info(&stream, deadline)?;

        // Check if TLS authentication is required:
        // - Has `self.options.tls_required(true)` been set?
        // - Was the server address prefixed with `tls://`?
        // - Does the INFO line contain `tls_required: true`?
        let tls_required =
            self.options.tls_required || server.tls_required() || server_info.tls_required;

        // Upgrade to TLS if required.
        let session = if tls_required {
            // Inject random I/O failures when testing.
            inject_io_failure()?;

            // Connect using TLS.
            let server_name = rustls::pki_types::ServerName::try_from(server.host().to_string())
                .map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "cannot determine hostname for TLS connection",
                    )
                })?;

            Some(
                ClientConnection::new(self.tls_config.clone(), server_name)
                    .map_err(|err| io::Error::new(io::ErrorKind::InvalidInput, err))?,
            )
        } else {
            None
        };
        let mut stream = NatsStream::new(stream, session)?;
        // Every read and write of the handshake (the TLS one included) ends by the deadline.
        stream.set_deadline(Some(deadline))?;

        let connect_info = self.connect_info(server, &server_info, tls_required)?;
        // Send CONNECT and PING messages.
        proto::encode(&mut stream, ClientOp::Connect(&connect_info))?;
        proto::encode(&mut stream, ClientOp::Ping)?;
        stream.flush()?;
        await_pong(&mut stream)?;
        stream.set_deadline(None)?;
        stream.set_write_timeout(Some(WRITE_STALL_TIMEOUT))?;
        Ok((server_info, stream))
    }

    /// The CONNECT message's content: options, and the credentials for `server`.
    fn connect_info(
        &self,
        server: &ServerAddress,
        server_info: &ServerInfo,
        tls_required: bool,
    ) -> io::Result<ConnectInfo> {
        // Data that will be formatted as a CONNECT message.
        let mut connect_info = ConnectInfo {
            tls_required,
            name: self.options.name.clone().map(SecureString::from),
            pedantic: false,
            verbose: false,
            lang: crate::LANG.to_string(),
            version: crate::VERSION.to_string(),
            protocol: crate::connect::Protocol::Dynamic,
            user: None,
            pass: None,
            auth_token: None,
            user_jwt: None,
            nkey: None,
            signature: None,
            echo: !self.options.no_echo,
            headers: true,
            no_responders: true,
        };

        let server_auth = server.auth();
        let auth = if let AuthStyle::NoAuth = server_auth {
            &self.options.auth
        } else {
            &server_auth
        };

        // Fill in the info that authenticates the client.
        match auth {
            AuthStyle::NoAuth => {}
            AuthStyle::UserPass(user, pass) => {
                connect_info.user = Some(SecureString::from(user.to_string()));
                connect_info.pass = Some(SecureString::from(pass.to_string()));
            }
            AuthStyle::Token(token) => {
                connect_info.auth_token = Some(token.to_string().into());
            }
            AuthStyle::Credentials { jwt_cb, sig_cb } => {
                let jwt = jwt_cb()?;
                let sig = sig_cb(server_info.nonce.as_bytes())?;
                connect_info.user_jwt = Some(jwt);
                connect_info.signature = Some(sig);
            }
            AuthStyle::NKey { nkey_cb, sig_cb } => {
                let nkey = nkey_cb()?;
                let sig = sig_cb(server_info.nonce.as_bytes())?;
                connect_info.nkey = Some(nkey);
                connect_info.signature = Some(sig);
            }
        }
        Ok(connect_info)
    }
}

/// Sleeps `duration`, returning early with an error once `client` is being closed.
fn sleep_unless_closed(duration: Duration, client: &crate::client::Client) -> io::Result<()> {
    const SLICE: Duration = Duration::from_millis(50);
    let until = Instant::now() + duration;
    loop {
        client.check_shutdown()?;
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        thread::sleep(left.min(SLICE));
    }
}

/// Longest INFO line read while connecting (a large cluster's `connect_urls` fit many times
/// over); a longer one is a broken or hostile server, not a reason to grow without bound.
pub(crate) const MAX_INFO_LINE: usize = 64 * 1024;

/// Servers kept to connect to (svc): a hostile server's INFO lines, each naming thousands of
/// new `connect_urls`, once grew the list by hundreds of MiB in seconds.
pub(crate) const MAX_SERVERS: usize = 64;

/// A write that makes no progress for this long fails, and the connection is dropped (and
/// reconnected): a server that stops reading while it floods us with PINGs once kept the
/// client's write lock, and with it every publish, flush and stop, forever.
pub(crate) const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Most PINGs answered while waiting for the first PONG: a server asks once, if at all.
const MAX_CONNECT_PINGS: usize = 8;

/// The time left until `deadline`, or the error that ends the attempt.
fn left(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(connect_timed_out());
    }
    Ok(left)
}

fn connect_timed_out() -> Error {
    Error::new(
        ErrorKind::TimedOut,
        "the server did not complete the handshake in time",
    )
}

/// Reads the server's INFO line byte by byte (a TLS handshake may follow right after it, so
/// nothing past the line may be read), at most [`MAX_INFO_LINE`] bytes, by `deadline`.
fn read_info(mut stream: &TcpStream, deadline: Instant) -> io::Result<ServerInfo> {
    let mut line = crate::SecureVec::with_capacity(1024);
    while !line.ends_with(b"\r\n") {
        if line.len() >= MAX_INFO_LINE {
            return Err(Error::new(
                ErrorKind::InvalidData,
                "the server's INFO line is longer than 64 KiB",
            ));
        }
        stream.set_read_timeout(Some(left(deadline)?))?;
        let byte = &mut [0];
        match stream.read_exact(byte) {
            Ok(()) => line.push(byte[0]),
            Err(e) if timed_out(&e) => return Err(connect_timed_out()),
            Err(e) => return Err(e),
        }
    }
    stream.set_read_timeout(None)?;
    match proto::decode(&line[..])? {
        Some(ServerOp::Info(server_info)) => Ok(server_info),
        Some(op) => Err(Error::new(
            ErrorKind::Other,
            format!("expected INFO, received {}", op.describe()),
        )),
        None => Err(Error::new(ErrorKind::UnexpectedEof, "connection closed")),
    }
}

/// Whether a socket error is a read or write timeout (`WouldBlock` on Unix).
fn timed_out(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Waits for the PONG that answers the client's first PING, answering at most
/// [`MAX_CONNECT_PINGS`] of the server's PINGs meanwhile (the stream's deadline bounds the
/// wait).
fn await_pong(stream: &mut NatsStream) -> io::Result<()> {
    let mut reader = BufReader::new(stream.clone());
    let mut pings = 0;
    loop {
        match proto::decode(&mut reader)? {
            // If we get PONG, the server is happy and we're done connecting.
            Some(ServerOp::Pong) => return Ok(()),

            // Respond to a PING with a PONG.
            Some(ServerOp::Ping) if pings < MAX_CONNECT_PINGS => {
                pings += 1;
                proto::encode(&mut *stream, ClientOp::Pong)?;
                stream.flush()?;
            }
            Some(ServerOp::Ping) => {
                return Err(Error::new(
                    ErrorKind::InvalidData,
                    "the server sent PINGs but no PONG",
                ));
            }

            // No other operations should arrive at this time.
            Some(op) => {
                return Err(Error::new(
                    ErrorKind::InvalidData,
                    format!("the server answered {} while connecting", op.describe()),
                ));
            }

            // Error if the connection was closed.
            None => {
                return Err(Error::new(
                    ErrorKind::UnexpectedEof,
                    "connection closed while waiting for the first PONG",
                ));
            }
        }
    }
}

/// A raw NATS stream of bytes.
///
/// The stream uses the TCP protocol, optionally secured by TLS.
#[derive(Clone)]
pub(crate) struct NatsStream {
    flavor: Arc<Flavor>,
    /// When set (while connecting), every read and write ends by this instant with
    /// `TimedOut`, whatever the peer sends or withholds.
    deadline: Arc<Mutex<Option<Instant>>>,
}

enum Flavor {
    Tcp(TcpStream),
    Tls(Box<Mutex<TlsStream>>),
}

struct TlsStream {
    tcp: TcpStream,
    session: ClientConnection,
}

impl NatsStream {
    /// Creates a NATS stream from a TCP stream and an optional TLS session.
    fn new(tcp: TcpStream, session: Option<ClientConnection>) -> io::Result<NatsStream> {
        let flavor = match session {
            None => Flavor::Tcp(tcp),
            Some(session) => {
                tcp.set_nonblocking(true)?;
                Flavor::Tls(Box::new(Mutex::new(TlsStream { tcp, session })))
            }
        };
        let flavor = Arc::new(flavor);
        let deadline = Arc::new(Mutex::new(None));
        Ok(NatsStream { flavor, deadline })
    }

    /// Bounds every read and write by `deadline` (`None`: no bound, as after connecting).
    pub(crate) fn set_deadline(&self, deadline: Option<Instant>) -> io::Result<()> {
        *self.deadline.lock() = deadline;
        if deadline.is_none() {
            if let Flavor::Tcp(tcp) = &*self.flavor {
                tcp.set_read_timeout(None)?;
                tcp.set_write_timeout(None)?;
            }
        }
        Ok(())
    }

    /// The deadline, and for a plain TCP stream the socket timeouts set to what is left.
    fn arm(&self, write: bool) -> io::Result<Option<Instant>> {
        let deadline = *self.deadline.lock();
        if let (Some(deadline), Flavor::Tcp(tcp)) = (deadline, &*self.flavor) {
            let left = left(deadline)?;
            if write {
                tcp.set_write_timeout(Some(left))?;
            } else {
                tcp.set_read_timeout(Some(left))?;
            }
        }
        Ok(deadline)
    }

    pub(crate) fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match &*self.flavor {
            Flavor::Tcp(tcp) => tcp.set_write_timeout(timeout),
            Flavor::Tls(tls) => tls.lock().tcp.set_write_timeout(timeout),
        }
    }

    /// Will attempt to shutdown the underlying stream.
    pub(crate) fn shutdown(&self) {
        match &*self.flavor {
            Flavor::Tcp(tcp) => tcp.shutdown(Shutdown::Both),
            Flavor::Tls(tls) => tls.lock().tcp.shutdown(Shutdown::Both),
        }
        .ok();
    }
}

impl Read for NatsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        <&NatsStream as Read>::read(&mut &*self, buf)
    }
}

impl Read for &NatsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let deadline = self.arm(false)?;
        let res = match &*self.flavor {
            Flavor::Tcp(tcp) => (tcp.deref()).read(buf),
            Flavor::Tls(tls) => tls_op(tls, deadline, |session, eof| {
                match session.reader().read(buf) {
                    Ok(0) if !eof => Err(io::ErrorKind::WouldBlock.into()),
                    res => res,
                }
            }),
        };
        within(res, deadline)
    }
}

impl Write for NatsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        <&NatsStream as Write>::write(&mut &*self, buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        <&NatsStream as Write>::flush(&mut &*self)
    }
}

impl Write for &NatsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let deadline = self.arm(true)?;
        let res = match &*self.flavor {
            Flavor::Tcp(tcp) => (tcp.deref()).write(buf),
            Flavor::Tls(tls) => tls_op(tls, deadline, |session, _| session.writer().write(buf)),
        };
        within(res, deadline)
    }

    fn flush(&mut self) -> io::Result<()> {
        let deadline = self.arm(true)?;
        let res = match &*self.flavor {
            Flavor::Tcp(tcp) => (tcp.deref()).flush(),
            Flavor::Tls(tls) => tls_op(tls, deadline, |session, _| session.writer().flush()),
        };
        within(res, deadline)
    }
}

/// A socket timeout under a deadline is the deadline's `TimedOut`.
fn within<T>(res: io::Result<T>, deadline: Option<Instant>) -> io::Result<T> {
    match res {
        Err(e) if deadline.is_some() && timed_out(&e) => Err(connect_timed_out()),
        res => res,
    }
}

/// Performs a blocking operation on a TLS stream.
///
/// However, note that the inner TCP stream is in non-blocking mode.
fn tls_op<T: std::fmt::Debug>(
    tls: &Mutex<TlsStream>,
    deadline: Option<Instant>,
    mut op: impl FnMut(&mut ClientConnection, bool) -> io::Result<T>,
) -> io::Result<T> {
    loop {
        let mut tls = tls.lock();
        let TlsStream { tcp, session } = &mut *tls;
        let mut eof = false;

        // If necessary, read TLS messages.
        if session.wants_read() {
            match session.read_tls(tcp) {
                Ok(0) => eof = true,
                Ok(_) => {
                    session
                        .process_new_packets()
                        .map_err(|err| Error::new(ErrorKind::Other, format!("TLS error: {err}")))?;
                }
                Err(err) if err.kind() == ErrorKind::WouldBlock => {}
                Err(err) => return Err(err),
            }
        }

        // If necessary, write TLS messages.
        if session.wants_write() {
            match session.write_tls(tcp) {
                Ok(_) => {}
                Err(err) if err.kind() == ErrorKind::WouldBlock => {}
                Err(err) => return Err(err),
            }
        }

        // Try the non-blocking read/write/flush operation.
        match op(session, eof) {
            Err(err) if err.kind() == ErrorKind::WouldBlock => {}
            res => return res,
        }

        tls_wait(tls, deadline)?;
    }
}

/// Waits until the TLS stream becomes ready.
fn tls_wait(mut tls: MutexGuard<'_, TlsStream>, deadline: Option<Instant>) -> io::Result<()> {
    #[cfg(unix)]
    use {
        libc::{self as sys, poll, pollfd},
        std::os::unix::io::AsRawFd,
    };
    #[cfg(windows)]
    use {
        std::os::windows::io::AsRawSocket,
        winapi::um::winsock2::{self as sys, WSAPoll as poll, WSAPOLLFD as pollfd},
    };

    let TlsStream { tcp, session } = &mut *tls;

    // Initialize a pollfd object with readiness events we're looking for.
    #[allow(trivial_numeric_casts)]
    let mut pollfd = pollfd {
        #[cfg(unix)]
        fd: tcp.as_raw_fd() as _,
        #[cfg(windows)]
        fd: tcp.as_raw_socket() as _,
        #[cfg(unix)]
        events: sys::POLLERR,
        #[cfg(windows)]
        events: 0,
        revents: 0,
    };
    if session.wants_read() {
        pollfd.events |= sys::POLLIN;
    }
    if session.wants_write() {
        pollfd.events |= sys::POLLOUT;
    }

    // Make sure to drop the lock before blocking on `poll()`!
    // This way concurrent operations on the TLS stream won't block each other.
    drop(tls);

    // Wait until the TCP stream becomes ready, or the deadline passes.
    loop {
        let timeout_ms = match deadline {
            None => -1,
            Some(deadline) => {
                let left = left(deadline)?;
                i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX)
            }
        };
        #[allow(unsafe_code)]
        match unsafe { poll(&mut pollfd, 1, timeout_ms) } {
            -1 => {
                let err = Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
            0 => return Err(connect_timed_out()),
            _ => return Ok(()),
        }
    }
}

/// Address of a NATS server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServerAddress(Url);

/// Capability to convert into a list of NATS server addresses.
///
/// There are several implementations ensuring the easy passing of one or more server addresses to
/// functions like [`crate::connect()`].
pub trait IntoServerList {
    /// Convert the instance into a list of [`ServerAddress`]es.
    fn into_server_list(self) -> io::Result<Vec<ServerAddress>>;
}

impl FromStr for ServerAddress {
    type Err = Error;

    /// Parse an address of a NATS server.
    ///
    /// If not stated explicitly the `nats://` schema and port `4222` is assumed.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let url: Url = if input.contains("://") {
            input.parse()
        } else {
            format!("nats://{input}").parse()
        }
        .map_err(|e| {
            Error::new(
                ErrorKind::InvalidInput,
                format!("NATS server URL is invalid: {e}"),
            )
        })?;

        Self::from_url(url)
    }
}

impl ServerAddress {
    /// Check if the URL is a valid NATS server address.
    pub fn from_url(url: Url) -> io::Result<Self> {
        if url.scheme() != "nats" && url.scheme() != "tls" {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("invalid scheme for NATS server URL: {}", url.scheme()),
            ));
        }

        Ok(Self(url))
    }

    /// Turn the server address into a standard URL.
    pub fn into_inner(self) -> Url {
        self.0
    }

    /// Returns if tls is required by the client for this server.
    pub fn tls_required(&self) -> bool {
        self.0.scheme() == "tls"
    }

    /// Returns if the server url had embedded username and password.
    pub fn has_user_pass(&self) -> bool {
        self.0.username() != ""
    }

    pub(crate) fn auth(&self) -> AuthStyle {
        if let Some(password) = self.0.password() {
            if self.0.username() == "" {
                AuthStyle::NoAuth
            } else {
                AuthStyle::UserPass(self.0.username().to_string(), password.to_string())
            }
        } else if "" != self.0.username() {
            AuthStyle::Token(self.0.username().to_string())
        } else {
            AuthStyle::NoAuth
        }
    }

    /// Returns the host.
    pub fn host(&self) -> &str {
        match self.0.host() {
            Some(Host::Domain(_)) | Some(Host::Ipv4 { .. }) => self.0.host_str().unwrap(),
            // `host_str()` for Ipv6 includes the []s
            Some(Host::Ipv6 { .. }) => {
                let host = self.0.host_str().unwrap();
                &host[1..host.len() - 1]
            }
            None => "",
        }
    }

    /// Returns the port.
    pub fn port(&self) -> u16 {
        self.0.port().unwrap_or(4222)
    }

    /// Returns the optional username in the url.
    pub fn username(&self) -> Option<SecureString> {
        let user = self.0.username();
        if user.is_empty() {
            None
        } else {
            Some(SecureString::from(user.to_string()))
        }
    }

    /// Returns the optional password in the url.
    pub fn password(&self) -> Option<SecureString> {
        self.0
            .password()
            .map(|password| SecureString::from(password.to_string()))
    }

    /// Return the sockets from resolving the server address.
    ///
    /// # Fault injection
    ///
    /// If compiled with the `"fault_injection"` feature this method might fail artificially.
    pub fn socket_addrs(&self) -> io::Result<impl Iterator<Item = SocketAddr>> {
        inject_io_failure().and_then(|_| (self.host(), self.port()).to_socket_addrs())
    }
}

impl<'s> IntoServerList for &'s str {
    fn into_server_list(self) -> io::Result<Vec<ServerAddress>> {
        self.split(',').map(|url| url.parse()).collect()
    }
}

impl<'s> IntoServerList for &'s [&'s str] {
    fn into_server_list(self) -> io::Result<Vec<ServerAddress>> {
        self.iter().map(|url| url.parse()).collect()
    }
}

impl<'s, const N: usize> IntoServerList for &'s [&'s str; N] {
    fn into_server_list(self) -> io::Result<Vec<ServerAddress>> {
        self.as_ref().into_server_list()
    }
}

impl IntoServerList for String {
    fn into_server_list(self) -> io::Result<Vec<ServerAddress>> {
        self.as_str().into_server_list()
    }
}

impl<'s> IntoServerList for &'s String {
    fn into_server_list(self) -> io::Result<Vec<ServerAddress>> {
        self.as_str().into_server_list()
    }
}

impl IntoServerList for ServerAddress {
    fn into_server_list(self) -> io::Result<Vec<ServerAddress>> {
        Ok(vec![self])
    }
}

impl IntoServerList for Vec<ServerAddress> {
    fn into_server_list(self) -> io::Result<Vec<ServerAddress>> {
        Ok(self)
    }
}

impl IntoServerList for io::Result<Vec<ServerAddress>> {
    fn into_server_list(self) -> io::Result<Vec<ServerAddress>> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_address_ipv6() {
        let address = ServerAddress::from_str("nats://[::]").unwrap();
        assert_eq!(address.host(), "::")
    }

    #[test]
    fn server_address_ipv4() {
        let address = ServerAddress::from_str("nats://127.0.0.1").unwrap();
        assert_eq!(address.host(), "127.0.0.1")
    }

    #[test]
    fn server_address_domain() {
        let address = ServerAddress::from_str("nats://example.com").unwrap();
        assert_eq!(address.host(), "example.com")
    }

    #[test]
    fn server_address_no_auth() {
        let address = ServerAddress::from_str("nats://localhost").unwrap();
        assert!(matches!(address.auth(), AuthStyle::NoAuth));
    }

    #[test]
    fn server_address_token_auth() {
        let address = ServerAddress::from_str("nats://mytoken@localhost").unwrap();
        assert!(matches!(address.auth(), AuthStyle::Token(token) if &token == "mytoken"));
    }

    #[test]
    fn server_address_user_auth() {
        let address = ServerAddress::from_str("nats://myuser:mypass@localhost").unwrap();
        assert!(
            matches!(address.auth(), AuthStyle::UserPass(username, password) if &username == "myuser" && &password == "mypass")
        );
    }
}
