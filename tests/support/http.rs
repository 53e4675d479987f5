//! A strict local HTTP/1.1 receiver for the cloud connector tests (no real Azure Monitor or OCI
//! Monitoring can run here): one named accept thread, requests parsed byte-exactly
//! (`Content-Length` bodies only, no chunking accepted), every request recorded, the reply
//! chosen by the test's validator. Each reply closes the connection. Also the hostile object
//! stores and credential endpoints (`start_raw`: any content type, binary bodies).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// One received request. Header names are lower-cased, in arrival order.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub target: String,
    pub version: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Received {
    /// The single value of a header; panics when it is repeated.
    pub fn header(&self, name: &str) -> Option<&str> {
        let all: Vec<&str> = self
            .headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect();
        assert!(all.len() <= 1, "header {name} repeated: {all:?}");
        all.first().copied()
    }
}

/// The test's decision for a request: `(status, body)`.
pub type Validator = dyn Fn(&Received) -> (u16, String) + Send + Sync;

/// The test's decision with any body: `(status, content type, body)`.
pub type RawValidator = dyn Fn(&Received) -> (u16, &'static str, Vec<u8>) + Send + Sync;

pub struct Receiver {
    pub addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Reads a request or response head up to and including its empty line, byte by byte so
/// nothing after it is consumed (a proxy forwards the rest as it comes).
pub fn read_head(s: &mut TcpStream) -> Result<String, String> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(0) => return Err("connection closed inside the head".into()),
            Ok(_) => buf.push(byte[0]),
            Err(e) => return Err(format!("read: {e}")),
        }
        if buf.len() > 64 * 1024 {
            return Err("head over 64 KiB".into());
        }
    }
    String::from_utf8(buf).map_err(|_| "head is not UTF-8".to_string())
}

/// Reads one request strictly: a three-part request line, `name: value` header lines, no
/// `Transfer-Encoding`, at most one `Content-Length` and a body of exactly that length.
pub fn read_request(s: &mut TcpStream) -> Result<Received, String> {
    let head = read_head(s)?;
    let mut lines = head.trim_end_matches("\r\n\r\n").split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let parts: Vec<&str> = request_line.split(' ').collect();
    if parts.len() != 3 {
        return Err(format!("bad request line {request_line:?}"));
    }
    let mut headers = Vec::new();
    for l in lines {
        let (n, v) = l
            .split_once(':')
            .ok_or_else(|| format!("bad header line {l:?}"))?;
        if n.is_empty() || n.contains(' ') {
            return Err(format!("bad header name {n:?}"));
        }
        headers.push((n.to_ascii_lowercase(), v.trim().to_string()));
    }
    if headers.iter().any(|(n, _)| n == "transfer-encoding") {
        return Err("transfer-encoding is not expected".into());
    }
    let lengths: Vec<&String> = headers
        .iter()
        .filter(|(n, _)| n == "content-length")
        .map(|(_, v)| v)
        .collect();
    let len: usize = match lengths.as_slice() {
        [] => 0,
        [one] => one.parse().map_err(|_| "bad content-length".to_string())?,
        _ => return Err("content-length repeated".into()),
    };
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)
        .map_err(|e| format!("body shorter than content-length: {e}"))?;
    Ok(Received {
        method: parts[0].to_string(),
        target: parts[1].to_string(),
        version: parts[2].to_string(),
        headers,
        body,
    })
}

impl Receiver {
    /// Starts the receiver; `validator` answers each well-formed request (malformed ones get
    /// `400` and are recorded nowhere).
    pub fn start(validator: Box<Validator>) -> Receiver {
        Receiver::start_raw(Box::new(move |r| {
            let (status, body) = validator(r);
            (status, "application/json", body.into_bytes())
        }))
    }

    /// [`Receiver::start`] with replies of any content type and bytes.
    pub fn start_raw(validator: Box<RawValidator>) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (rx, st) = (received.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("test-cloud-receiver".into())
            .spawn(move || {
                while !st.load(Ordering::SeqCst) {
                    let (mut s, _) = match listener.accept() {
                        Ok(c) => c,
                        Err(_) => {
                            std::thread::sleep(Duration::from_millis(1));
                            continue;
                        }
                    };
                    s.set_nonblocking(false).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    let (status, ctype, body) = match read_request(&mut s) {
                        Ok(r) => {
                            let reply = validator(&r);
                            rx.lock().unwrap().push(r);
                            reply
                        }
                        Err(why) => (400, "text/plain", why.into_bytes()),
                    };
                    let _ = write!(
                        s,
                        "HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = s.write_all(&body);
                    let _ = s.flush();
                }
            })
            .unwrap();
        Receiver {
            addr,
            received,
            stop,
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Checks that a JSON object has exactly the `required` keys plus only `optional` ones.
pub fn keys_exactly(
    v: &serde_json::Value,
    what: &str,
    required: &[&str],
    optional: &[&str],
) -> Result<(), String> {
    let obj = v
        .as_object()
        .ok_or_else(|| format!("{what} is not an object"))?;
    for k in required {
        if !obj.contains_key(*k) {
            return Err(format!("{what}: missing {k}"));
        }
    }
    for k in obj.keys() {
        if !required.contains(&k.as_str()) && !optional.contains(&k.as_str()) {
            return Err(format!("{what}: unexpected field {k}"));
        }
    }
    Ok(())
}

/// Parses an RFC 3339 timestamp and returns its age in seconds (negative in the future).
pub fn rfc3339_age(text: &str) -> Result<f64, String> {
    let t = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map_err(|e| format!("{text:?} is not RFC 3339: {e}"))?;
    Ok((time::OffsetDateTime::now_utc() - t).as_seconds_f64())
}
