//! Real receivers for the push-connector tests, each started per test on free loopback ports
//! and stopped by its own PID: the OTLP protobuf decoder and the strict HEC receiver
//! (`tests/support/receivers/*.py`, run with the test venv), a private rsyslogd with mmpstrucdata, and
//! the npm StatsD daemon with its management port.
//!
//! Tools: `SVC_TEST_VENV` (a venv with opentelemetry-proto and protobuf; default
//! `$HOME/.cache/svc-test-tools/venv`) and `SVC_TEST_STATSD` (the daemon's `stats.js`; default
//! `$HOME/.cache/svc-test-tools/node_modules/statsd/stats.js`), as `scripts/test.sh` exports.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use super::observe::{bin, wait_for, ChildGuard};
use super::python::python;
use super::temp::TempDir;

/// A number no other call in this process got: receivers of one test share its directory.
fn unique() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::SeqCst)
}

fn tools_dir() -> PathBuf {
    PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
        .join(".cache/svc-test-tools")
}

/// `stats.js` of the StatsD daemon.
pub fn statsd_js() -> PathBuf {
    let p = std::env::var_os("SVC_TEST_STATSD")
        .map(PathBuf::from)
        .unwrap_or_else(|| tools_dir().join("node_modules/statsd/stats.js"));
    assert!(
        p.exists(),
        "{} missing: run scripts/test.sh (npm install statsd@0.9.0)",
        p.display()
    );
    p
}

/// A Python receiver: its process, port and record file (one JSON line per request).
pub struct Receiver {
    // Held for its Drop: the receiver stops with this value.
    _guard: ChildGuard,
    pub port: u16,
    pub record: PathBuf,
}

impl Receiver {
    /// Starts `script` with `--port 0 --record <file>` plus `args`, waits for `LISTENING`.
    pub fn start(dir: &TempDir, script: &str, args: &[&str], env: &[(&str, &str)]) -> Receiver {
        let record = dir.join(&format!("{script}.{}.jsonl", unique()));
        let mut cmd = Command::new(python());
        cmd.arg(super::python::script(&format!("receivers/{script}")))
            .args(["--port", "0", "--record"])
            .arg(&record)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("python of the test venv starts");
        let out = child.stdout.take().unwrap();
        let guard = ChildGuard(child);
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line).unwrap();
        let port = line
            .strip_prefix("LISTENING ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("receiver {script} did not start: {line:?}"));
        Receiver {
            _guard: guard,
            port,
            record,
        }
    }

    /// The requests recorded so far.
    pub fn records(&self) -> Vec<serde_json::Value> {
        match std::fs::read_to_string(&self.record) {
            Ok(text) => text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

/// Runs `svc-observe <args>` with extra environment variables (and `RUST_LOG=trace` so that
/// any leak through a library's logging would show).
pub fn run(args: &[&dyn AsRef<std::ffi::OsStr>], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin());
    for a in args {
        c.arg(a.as_ref());
    }
    c.env("RUST_LOG", "trace");
    for (k, v) in env {
        c.env(k, v);
    }
    c.stdin(Stdio::null()).output().unwrap()
}

/// A free UDP port on loopback (bound then released).
pub fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A private rsyslogd: UDP input on a free port and a Unix socket input, both into one
/// ruleset writing the RFC 5424 fields (`raw.log`) and mmpstrucdata's parse of the structured
/// data as JSON (`sd.log`).
pub struct Rsyslog {
    // Held for its Drop: the receiver stops with this value.
    _guard: ChildGuard,
    pub port: u16,
    pub socket: PathBuf,
    pub raw: PathBuf,
    pub sd: PathBuf,
}

impl Rsyslog {
    pub fn start(dir: &TempDir) -> Rsyslog {
        let work = dir.join("rsyslog");
        std::fs::create_dir_all(&work).unwrap();
        let port = free_udp_port();
        let socket = work.join("log.sock");
        let raw = work.join("raw.log");
        let sd = work.join("sd.log");
        let conf = work.join("rsyslog.conf");
        std::fs::write(
            &conf,
            format!(
                r#"global(workDirectory="{w}")
module(load="imudp")
module(load="imuxsock" SysSock.Use="off")
module(load="mmpstrucdata")
template(name="raw" type="string" string="%PRI% %PROTOCOL-VERSION% %TIMESTAMP:::date-rfc3339% %HOSTNAME% %APP-NAME% %PROCID% %MSGID% %STRUCTURED-DATA% %msg%\n")
template(name="sd" type="string" string="%$!rfc5424-sd%\n")
ruleset(name="r") {{
  action(type="omfile" file="{raw}" template="raw")
  action(type="mmpstrucdata")
  action(type="omfile" file="{sd}" template="sd")
}}
input(type="imudp" address="127.0.0.1" port="{port}" ruleset="r")
input(type="imuxsock" Socket="{sock}" UseSpecialParser="off" ParseHostname="on" IgnoreTimestamp="off" ruleset="r")
"#,
                w = work.display(),
                raw = raw.display(),
                sd = sd.display(),
                sock = socket.display(),
            ),
        )
        .unwrap();
        let check = Command::new("rsyslogd")
            .arg("-N1")
            .arg("-f")
            .arg(&conf)
            .output()
            .expect("rsyslogd is installed (Debian package rsyslog)");
        assert!(check.status.success(), "{check:?}");
        let child = Command::new("rsyslogd")
            .arg("-n")
            .arg("-f")
            .arg(&conf)
            .arg("-i")
            .arg(work.join("rsyslogd.pid"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let r = Rsyslog {
            _guard: ChildGuard(child),
            port,
            socket,
            raw,
            sd,
        };
        wait_for("the rsyslog socket", Duration::from_secs(10), || {
            r.socket.exists().then_some(())
        });
        // Ready when a probe over UDP has been written (imudp may bind after the socket).
        let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
        wait_for("rsyslog's UDP input", Duration::from_secs(10), || {
            let _ = probe.send_to(
                b"<13>1 2024-01-01T00:00:00Z probe probe - probe - probe",
                ("127.0.0.1", port),
            );
            std::thread::sleep(Duration::from_millis(50));
            r.raw_lines()
                .iter()
                .any(|l| l.contains("probe"))
                .then_some(())
        });
        r
    }

    fn read(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Written messages, probes excluded.
    pub fn raw_lines(&self) -> Vec<String> {
        Rsyslog::read(&self.raw)
    }

    /// `(raw line, structured data JSON)` of every non-probe message, waiting for `n`.
    pub fn wait_messages(&self, n: usize) -> Vec<(String, serde_json::Value)> {
        wait_for(
            &format!("{n} syslog messages"),
            Duration::from_secs(10),
            || {
                let raw = self.raw_lines();
                let sd = Rsyslog::read(&self.sd);
                let pairs: Vec<(String, serde_json::Value)> = raw
                    .into_iter()
                    .zip(sd)
                    .filter(|(r, _)| !r.contains(" probe "))
                    .map(|(r, s)| (r, serde_json::from_str(&s).unwrap()))
                    .collect();
                (pairs.len() >= n).then_some(pairs)
            },
        )
    }
}

/// The npm StatsD daemon: UDP on a free port, management on another, flush interval long
/// enough that its counters are not reset during a test.
pub struct Statsd {
    // Held for its Drop: the receiver stops with this value.
    _guard: ChildGuard,
    pub port: u16,
    pub mgmt: u16,
}

impl Statsd {
    pub fn start(dir: &TempDir) -> Statsd {
        let port = free_udp_port();
        let mgmt = super::net::free_port();
        let conf = dir.join(&format!("statsd.{}.js", unique()));
        std::fs::write(
            &conf,
            format!(
                r#"{{address: "127.0.0.1", port: {port}, mgmt_address: "127.0.0.1", mgmt_port: {mgmt},
  backends: ["./backends/console"], flushInterval: 3600000, dumpMessages: true,
  console: {{prettyprint: false}}}}"#
            ),
        )
        .unwrap();
        let js = statsd_js();
        let child = Command::new("node")
            .arg(&js)
            .arg(&conf)
            .current_dir(js.parent().unwrap())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("node is installed");
        let s = Statsd {
            _guard: ChildGuard(child),
            port,
            mgmt,
        };
        wait_for(
            "the statsd management port",
            Duration::from_secs(15),
            || TcpStream::connect(("127.0.0.1", mgmt)).ok(),
        );
        s
    }

    /// Sends a management command and returns its answer up to `END`.
    pub fn admin(&self, command: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.mgmt)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(format!("{command}\n").as_bytes()).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&out).contains("END\n") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "statsd closed the management connection");
            out.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// `key: value` pairs of a `util.inspect`ed object (`gauges`, `counters`).
    pub fn inspected(&self, command: &str) -> BTreeMap<String, f64> {
        let text = self.admin(command);
        let body = text.split("END").next().unwrap();
        let body = body.trim().trim_start_matches('{').trim_end_matches('}');
        let mut out = BTreeMap::new();
        for part in body.split(",\n").flat_map(|l| l.split(", ")) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (k, v) = part
                .rsplit_once(": ")
                .unwrap_or_else(|| panic!("cannot parse {part:?} in {text}"));
            let k = k.trim().trim_matches('\'').to_string();
            out.insert(k, v.trim().parse().unwrap_or(f64::NAN));
        }
        out
    }

    /// A line `group.metric: value` of the `stats` command.
    pub fn stat(&self, name: &str) -> f64 {
        let text = self.admin("stats");
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("{name} not in {text}"))
            .trim()
            .parse()
            .unwrap()
    }

    /// Waits until the daemon has received `n` packets; returns its gauges.
    pub fn wait_packets(&self, n: usize) -> BTreeMap<String, f64> {
        wait_for(
            &format!("{n} statsd packets"),
            Duration::from_secs(10),
            || {
                let c = self.inspected("counters");
                (c.get("statsd.packets_received").copied().unwrap_or(0.0) >= n as f64).then_some(())
            },
        );
        self.inspected("gauges")
    }
}
