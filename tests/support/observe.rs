//! Helpers of the `svc-observe` integration tests: temp dirs, snapshots made by the runner's
//! own registry, policies, the binary, real Prometheus tools, a raw HTTP client, and child
//! processes stopped by their own PID.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use svc::message::subject::SubjectPattern;
use svc::metrics::snapshot;
use svc::metrics::{Metrics, SubjectFamily};

/// Families `(subject pattern, label)`.
pub fn families(list: &[(&str, &str)]) -> Vec<SubjectFamily> {
    list.iter()
        .map(|(s, l)| SubjectFamily {
            pattern: SubjectPattern::parse(s).unwrap(),
            label: l.to_string(),
        })
        .collect()
}

/// A realistic snapshot written by the runner's registry: every counter non-zero, summaries
/// observed, the gauge set, and per-family counts (`written` = 10 * (index + 1)).
pub fn snapshot(fams: &[(&str, &str)], generated_ago_seconds: f64) -> String {
    let m = Metrics::new(families(fams));
    m.gauges
        .last_sink_success_epoch_seconds
        .store(1_700_000_000, Ordering::Relaxed);
    for n in svc::metrics::SummaryMetric::ALL {
        for v in [0.5, 0.25, 2.0] {
            m.observe(n, v);
        }
    }
    for (i, (subject, _)) in fams.iter().enumerate() {
        let probe = subject.replace('*', "x").replace('>', "y");
        let f = m.family_of(&probe);
        assert_eq!(f, Some(i), "probe subject {probe} must land in family {i}");
        m.add_family(f, svc::metrics::FamilyMetric::Written, 10 * (i as u64 + 1));
        m.add_family(f, svc::metrics::FamilyMetric::Acked, 10 * (i as u64 + 1));
        m.add_family(f, svc::metrics::FamilyMetric::Fetched, 11 * (i as u64 + 1));
    }
    let mut snap = snapshot::capture(&m, "svc", 1.0);
    for (name, v) in snap.counters.iter_mut() {
        *v = counter_value(name);
    }
    snap.generated_at_epoch_seconds -= generated_ago_seconds;
    serde_json::to_string_pretty(&snap).unwrap()
}

/// The value [`snapshot`] gives a counter: 100 + its position in the runner's declaration.
pub fn counter_value(name: &str) -> u64 {
    let i = svc::metrics::Counters::NAMES
        .iter()
        .position(|n| *n == name)
        .unwrap_or_else(|| panic!("unknown counter {name}"));
    100 + i as u64
}

/// An enabled policy sharing everything, with `extra` top-level fields (JSON object text)
/// merged over it (objects merged one level deep).
pub fn policy(extra: &str) -> String {
    let mut base = serde_json::json!({
        "schema": "svc.observability.policy.v1",
        "enabled": true,
        "namespace": "svc",
        "allowed_metric_patterns": ["*"],
        "include_observations": true,
        "scrape": {"enabled": true, "stale_after_seconds": 60,
                   "http_endpoint": {"enabled": true}}
    });
    let extra: serde_json::Value = serde_json::from_str(extra).unwrap();
    for (k, v) in extra.as_object().unwrap() {
        match (base.get_mut(k), v) {
            (Some(serde_json::Value::Object(b)), serde_json::Value::Object(p)) => {
                for (pk, pv) in p {
                    match (b.get_mut(pk), pv) {
                        (Some(serde_json::Value::Object(bb)), serde_json::Value::Object(pp)) => {
                            for (k3, v3) in pp {
                                bb.insert(k3.clone(), v3.clone());
                            }
                        }
                        _ => {
                            b.insert(pk.clone(), pv.clone());
                        }
                    }
                }
            }
            _ => {
                base[k] = v.clone();
            }
        }
    }
    serde_json::to_string_pretty(&base).unwrap()
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_svc-observe")
}

/// Runs `svc-observe` to completion.
pub fn observe(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut c = Command::new(bin());
    for a in args {
        c.arg(a.as_ref());
    }
    c.stdin(Stdio::null()).output().unwrap()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `promtool check metrics` over the text: (exit code, findings).
pub fn promtool(text: &str) -> (i32, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is installed (Debian package prometheus)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Asserts promtool accepts the text with zero findings.
pub fn assert_promtool_clean(text: &str) {
    let (code, findings) = promtool(text);
    assert_eq!(
        code, 0,
        "promtool findings:\n{findings}\n--- text ---\n{text}"
    );
}

/// A child process killed (by its own PID) and reaped when dropped.
pub struct ChildGuard(pub Child);

impl ChildGuard {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `f` until it returns `Some` or the deadline passes.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `svc-observe scrape-http` and waits for its `Serving metrics on` line and a
/// connectable port.
pub fn start_http(snapshot: &Path, policy: &Path, extra: &[&str], port: u16) -> ChildGuard {
    let mut child = Command::new(bin())
        .arg("scrape-http")
        .arg(snapshot)
        .arg(policy)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let guard = ChildGuard(child);
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).unwrap();
    assert!(
        line.starts_with("Serving metrics on 127.0.0.1:"),
        "unexpected first line {line:?}"
    );
    wait_for("the listener", Duration::from_secs(10), || {
        TcpStream::connect(("127.0.0.1", port)).ok()
    });
    guard
}

/// A parsed HTTP response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends raw request bytes and reads the whole response (the request should close).
pub fn raw_request(addr: SocketAddr, request: &[u8]) -> Response {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut bytes = Vec::new();
    s.read_to_end(&mut bytes).unwrap();
    parse_response(&bytes)
}

pub fn parse_response(bytes: &[u8]) -> Response {
    let text = String::from_utf8_lossy(bytes).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head in {text:?}"));
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let status = status_line.split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap();
            (n.trim().to_string(), v.trim().to_string())
        })
        .collect();
    Response {
        status,
        headers,
        body: body.to_string(),
    }
}

/// `GET path` with `Connection: close`.
pub fn get(addr: SocketAddr, path: &str) -> Response {
    raw_request(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
    )
}

/// Number of threads of a process.
pub fn thread_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count()
}

/// `GET` with HTTP/1.0 (no chunked encoding from Go servers): (status, body).
pub fn get10(addr: SocketAddr, target: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(format!("GET {target} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .ok()?;
    let mut bytes = Vec::new();
    s.read_to_end(&mut bytes).ok()?;
    let r = parse_response(&bytes);
    Some((r.status, r.body))
}

/// Percent-encodes a query value.
pub fn urlencode(v: &str) -> String {
    v.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
