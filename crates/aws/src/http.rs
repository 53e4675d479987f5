//! HTTP calls of the credential chain (STS, the container credentials endpoint, instance
//! metadata) on a `ureq` agent, the HTTP client the S3 client already uses (rustls on ring, no
//! async runtime, no AWS SDK).
//!
//! Every answer is untrusted: each call reads at most a given number of bytes, the whole
//! operation (all its requests, connect and body included) runs against one [`Deadline`], and
//! errors carry the peer's text only through [`PeerText`], never a request header (tokens and
//! signatures travel in headers), and with every secret the request carried scrubbed first: a
//! peer that echoes the request (a container endpoint quoting its `Authorization` header)
//! cannot put a token in a log line.

use std::io::Read;
use std::time::{Duration, Instant};

use ureq::tls::{RootCerts, TlsConfig, TlsProvider};
use ureq::Agent;

use svc_text::peer::PeerText;
use svc_text::secret_bytes::{wipe_vec, SecretBytes};
use svc_text::secrets::Secrets;

/// The end of a whole operation (e.g. IMDS: token, role name, credentials).
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    end: Instant,
    total: Duration,
}

impl Deadline {
    pub fn after(total: Duration) -> Deadline {
        Deadline {
            end: Instant::now() + total,
            total,
        }
    }

    /// Time left, or an error naming the operation's limit.
    pub fn remaining(&self, what: &str) -> Result<Duration, String> {
        let left = self.end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(format!(
                "{what}: no answer within the deadline of {:.1} s",
                self.total.as_secs_f64()
            ))
        } else {
            Ok(left)
        }
    }
}

/// One answer: status and at most the bounded body.
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
    /// The secrets the request carried in its headers.
    secrets: Secrets,
}

impl Reply {
    /// The body when the status is 2xx, else an error with the status and the peer's text.
    pub fn ok(&self, what: &str) -> Result<&[u8], String> {
        if (200..300).contains(&self.status) {
            Ok(&self.body)
        } else {
            let lossy = String::from_utf8_lossy(&self.body);
            Err(format!(
                "{what}: HTTP {}: {}",
                self.status,
                PeerText::new(&self.secrets.scrub(&lossy))
            ))
        }
    }

    /// `text` (built from this answer) with the request's secrets scrubbed.
    pub fn hide(&self, text: String) -> String {
        self.secrets.scrub(&text).into_owned()
    }
}

impl Drop for Reply {
    /// The body holds issued credentials or a token: wiped.
    fn drop(&mut self) {
        wipe_vec(&mut self.body);
    }
}

/// The secrets among request headers: the `Authorization` value (whole, and a SigV4 key id
/// and signature on their own), session and metadata tokens.
fn header_secrets(headers: &[(&str, &str)]) -> Secrets {
    let mut s = Secrets::new();
    for (k, v) in headers {
        if k.eq_ignore_ascii_case("authorization") {
            s.add_authorization(v);
        } else if k.eq_ignore_ascii_case("x-amz-security-token")
            || k.eq_ignore_ascii_case("x-aws-ec2-metadata-token")
        {
            s.add(v);
        }
    }
    s
}

/// One request of [`Http::call`].
pub struct Call<'a> {
    pub method: &'a str,
    pub url: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
    pub body: Option<&'a [u8]>,
    /// Largest answer body read.
    pub limit: u64,
}

/// The agent of the credential calls: no redirects (a metadata or STS answer that redirects is
/// refused, not followed), HTTP statuses as values, web PKI roots, a connect timeout.
pub struct Http {
    agent: Agent,
}

impl Http {
    /// `proxy`: use the proxy of the environment (STS, a public endpoint) or never (link-local
    /// and loopback endpoints, which a proxy could not reach and must not see). `connect`:
    /// the SDKs use 1 s for instance metadata (off EC2 the address does not answer at all)
    /// and about 3 s for STS.
    pub fn new(proxy: bool, connect: Duration) -> Http {
        let tls = TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .root_certs(RootCerts::WebPki)
            .build();
        let mut config = Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_connect(Some(connect))
            .max_response_header_size(16 * 1024)
            .user_agent(concat!("svc/", env!("CARGO_PKG_VERSION")))
            .tls_config(tls);
        if !proxy {
            config = config.proxy(None);
        }
        Http {
            agent: config.build().into(),
        }
    }

    /// One request. `body` `Some` sends it (POST/PUT), `None` sends none. At most `limit`
    /// bytes of the answer are read; the request gets what is left of `deadline`.
    pub fn call(&self, c: Call<'_>, deadline: &Deadline, what: &str) -> Result<Reply, String> {
        let Call {
            method,
            url,
            headers,
            body,
            limit,
        } = c;
        let left = deadline.remaining(what)?;
        let mut req = ureq::http::Request::builder().method(method).uri(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let result = match body {
            Some(b) => {
                let req = req
                    .body(b)
                    .map_err(|e| format!("{what}: cannot build the request: {e}"))?;
                let req = self
                    .agent
                    .configure_request(req)
                    .timeout_global(Some(left))
                    .build();
                self.agent.run(req)
            }
            None => {
                let req = req
                    .body(())
                    .map_err(|e| format!("{what}: cannot build the request: {e}"))?;
                let req = self
                    .agent
                    .configure_request(req)
                    .timeout_global(Some(left))
                    .build();
                self.agent.run(req)
            }
        };
        let secrets = header_secrets(headers);
        let failed = |e| secrets.scrub(&describe(e, what, deadline)).into_owned();
        let mut resp = result.map_err(failed)?;
        let status = resp.status().as_u16();
        // One byte over the bound tells a body at the bound from a larger one. A 2xx body over
        // it is refused; an error answer keeps its status (what the caller acts on) and the
        // start of its body.
        // Credentials come back in the body: read into a wiping owner reserved once for the
        // bound (at most 64 KiB here), so no reallocation leaves an unwiped copy.
        let room = usize::try_from(limit.saturating_add(1)).unwrap_or(usize::MAX);
        let mut body = SecretBytes::with_capacity(room.min(1 << 20));
        resp.body_mut()
            .as_reader()
            .take(limit.saturating_add(1))
            .read_to_end(body.expose_mut())
            .map_err(|e| {
                let text = if e.kind() == std::io::ErrorKind::TimedOut {
                    format!(
                        "{what}: no answer within the deadline of {:.1} s",
                        deadline.total.as_secs_f64()
                    )
                } else {
                    format!("{what}: reading the answer: {e}")
                };
                secrets.scrub(&text).into_owned()
            })?;
        if body.len() as u64 > limit {
            if (200..300).contains(&status) {
                return Err(format!("{what}: answer larger than {limit} bytes; refused"));
            }
            body.expose_mut().truncate(limit as usize);
        }
        Ok(Reply {
            status,
            body: std::mem::take(body.expose_mut()),
            secrets,
        })
    }
}

fn describe(e: ureq::Error, what: &str, deadline: &Deadline) -> String {
    match e {
        ureq::Error::Timeout(_) => format!(
            "{what}: no answer within the deadline of {:.1} s",
            deadline.total.as_secs_f64()
        ),
        ureq::Error::BodyExceedsLimit(n) => {
            format!("{what}: answer larger than {n} bytes; refused")
        }
        ureq::Error::StatusCode(s) => format!("{what}: HTTP {s}"),
        other => format!("{what}: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// A hostile peer: an answer larger than the bound, then one that never comes.
    #[test]
    fn size_bound_and_whole_operation_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/x", listener.local_addr().unwrap());
        let server = std::thread::Builder::new()
            .name("hostile-peer".into())
            .spawn(move || {
                let mut buf = [0u8; 4096];
                let (mut big, _) = listener.accept().unwrap();
                let _ = big.read(&mut buf);
                let _ = big.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n");
                let _ = big.write_all(&[b'a'; 100_000]);
                let (mut silent, _) = listener.accept().unwrap();
                let _ = silent.read(&mut buf);
                // Holds the connection without answering until the client gives up.
                let _ = silent.read(&mut buf);
                // An error answer quoting the request's token, then 100 KB more.
                let (mut echo, _) = listener.accept().unwrap();
                let _ = echo.read(&mut buf);
                let _ = echo.write_all(b"HTTP/1.1 500 X\r\nContent-Length: 100047\r\n\r\n");
                let _ = echo.write_all(b"denied: Authorization was container/tok+en=001 ");
                let _ = echo.write_all(&[b'b'; 100_000]);
            })
            .unwrap();
        let http = Http::new(false, Duration::from_secs(1));
        let call = || Call {
            method: "GET",
            url: &url,
            headers: &[],
            body: None,
            limit: 1000,
        };
        let e = http
            .call(call(), &Deadline::after(Duration::from_secs(30)), "peer")
            .err()
            .unwrap();
        assert_eq!(e, "peer: answer larger than 1000 bytes; refused");
        let e = http
            .call(call(), &Deadline::after(Duration::from_millis(300)), "peer")
            .err()
            .unwrap();
        assert_eq!(e, "peer: no answer within the deadline of 0.3 s");
        // Status first: an error answer over the bound keeps its status, scrubbed and cut.
        let reply = http
            .call(
                Call {
                    headers: &[("Authorization", "container/tok+en=001")],
                    ..call()
                },
                &Deadline::after(Duration::from_secs(30)),
                "peer",
            )
            .unwrap();
        assert_eq!((reply.status, reply.body.len()), (500, 1000));
        let e = reply.ok("peer").unwrap_err();
        assert!(
            e.starts_with("peer: HTTP 500: denied: Authorization was <redacted> bbb"),
            "{e}"
        );
        assert!(!e.contains("tok+en") && e.len() < 400, "{e}");
        drop(http);
        server.join().unwrap();
    }
}
