//! The pre-flight look at what a plaintext broker advertises, for connections that carry
//! credentials.
//!
//! The client adds every server of the broker's INFO `connect_urls` to its reconnect list and
//! sends the configured credentials to whichever answers (it has no switch to ignore them).
//! Over TLS that is safe: each server must prove its name (see `connect`). Over plaintext,
//! which config validation allows with credentials only to loopback seeds (or by the
//! `nats.allow_plaintext_credentials` opt-in), an advertised non-loopback server would get
//! the credentials in clear on a reconnect. So before connecting, the runner reads each
//! seed's INFO line (sending nothing) and refuses to start when one advertises a plaintext
//! non-loopback server. Servers that join the cluster after start are not seen here: the
//! broker's `no_advertise` or TLS covers those (`docs/security.md`).

use std::io::{self, Read};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::config::is_loopback_url;

/// Longest INFO line read (a large cluster's `connect_urls` included).
const MAX_INFO_BYTES: usize = 64 * 1024;

/// The plaintext, non-loopback servers the broker at `url` advertises, read within
/// `timeout` (the whole operation: resolve, connect and read).
pub fn advertised_remote_plaintext(url: &str, timeout: Duration) -> io::Result<Vec<String>> {
    let deadline = Instant::now() + timeout;
    let authority = url
        .strip_prefix("nats://")
        .or_else(|| url.strip_prefix("tls://"))
        .unwrap_or(url);
    let (host, port) = split_host_port(authority);
    let addr = (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    let line = read_line(&mut stream, deadline)?;
    let info = line
        .strip_prefix(b"INFO")
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "the greeting is not INFO"))?;
    let info: serde_json::Value = serde_json::from_slice(info)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "INFO is not JSON"))?;
    Ok(remote_plaintext(&info))
}

/// The entries of INFO `connect_urls` that the client would reach in plaintext off the host.
fn remote_plaintext(info: &serde_json::Value) -> Vec<String> {
    info.get("connect_urls")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str())
        .filter(|u| !u.starts_with("tls://") && !is_loopback_url(u))
        .map(str::to_string)
        .collect()
}

/// `host[:port]` (IPv6 in brackets), port 4222 when absent, as the client reads it.
fn split_host_port(authority: &str) -> (&str, u16) {
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((h, rest)) => (h, rest.strip_prefix(':')),
            None => (v6, None),
        },
        None => match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        },
    };
    (host, port.and_then(|p| p.parse().ok()).unwrap_or(4222))
}

/// Reads up to the first `\r\n` (excluded), at most [`MAX_INFO_BYTES`], by `deadline`.
fn read_line(stream: &mut TcpStream, deadline: Instant) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "no INFO in time"));
        }
        stream.set_read_timeout(Some(left))?;
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed before INFO",
            ));
        }
        line.extend_from_slice(&buf[..n]);
        if let Some(end) = line.windows(2).position(|w| w == b"\r\n") {
            line.truncate(end);
            return Ok(line);
        }
        if line.len() > MAX_INFO_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "INFO is longer than 64 KiB",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn only_plaintext_servers_off_the_host_count() {
        let info = serde_json::json!({"connect_urls": [
            "127.0.0.1:4222", "localhost:4223", "[::1]:4222", "tls://10.0.0.2:4222",
            "10.0.0.1:4222", "[2001:db8::1]:4222", "nats.example.com:4222", 7
        ]});
        assert_eq!(
            remote_plaintext(&info),
            [
                "10.0.0.1:4222",
                "[2001:db8::1]:4222",
                "nats.example.com:4222"
            ]
        );
        assert!(remote_plaintext(&serde_json::json!({})).is_empty());
        assert_eq!(split_host_port("[::1]:4223"), ("::1", 4223));
        assert_eq!(split_host_port("127.0.0.1"), ("127.0.0.1", 4222));
    }

    /// A seed that greets with `greeting` and then holds the connection open.
    fn seed(greeting: Vec<u8>) -> (String, std::thread::JoinHandle<Vec<u8>>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("nats://{}", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let _ = s.write_all(&greeting);
            // What the probe sends (nothing), until it hangs up.
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut got = Vec::new();
            let _ = s.read_to_end(&mut got);
            got
        });
        (url, server)
    }

    #[test]
    fn the_probe_reads_info_and_sends_nothing() {
        let info = b"INFO {\"server_id\":\"x\",\"connect_urls\":[\"10.9.8.7:4222\"]}\r\n";
        let (url, server) = seed(info.to_vec());
        let found = advertised_remote_plaintext(&url, Duration::from_secs(10)).unwrap();
        assert_eq!(found, ["10.9.8.7:4222"]);
        assert!(server.join().unwrap().is_empty());
    }

    #[test]
    fn a_hostile_greeting_is_bounded_in_size_and_time() {
        // An endless line: refused after 64 KiB, not read on.
        let (url, _server) = seed(vec![b'I'; 1 << 20]);
        let e = advertised_remote_plaintext(&url, Duration::from_secs(10)).unwrap_err();
        assert_eq!(e.to_string(), "INFO is longer than 64 KiB");
        // Silence: the deadline holds for the whole operation.
        let (url, _server) = seed(b"INFO {".to_vec());
        let e = advertised_remote_plaintext(&url, Duration::from_millis(300)).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ),
            "{e}"
        );
    }
}
