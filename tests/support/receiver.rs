//! The Python HTTP receiver (`receivers/http_receiver.py`) as a child process: it stores
//! every request it answers in a JSONL file, for the HTTP sink's tests and the spool's.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::python::{python, script};
use super::{free_port, wait_until};

/// The Python receiver on its own port, killed on drop.
pub struct Receiver {
    pub port: u16,
    out: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

impl Receiver {
    pub fn start(dir: &Path, args: &[&str]) -> Receiver {
        let mut r = Receiver {
            port: free_port(),
            out: dir.join(format!("received-{}.jsonl", free_port())),
            args: args.iter().map(|a| a.to_string()).collect(),
            child: None,
        };
        r.launch();
        r
    }

    /// Starts the receiver on its port (again, after `kill`).
    pub fn launch(&mut self) {
        let script = script("receivers/http_receiver.py");
        let child = Command::new(python())
            .arg(script)
            .args(["--port", &self.port.to_string()])
            .arg("--out")
            .arg(&self.out)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python of the test venv (scripts/deps.sh)");
        self.child = Some(child);
        let port = self.port;
        wait_until(Duration::from_secs(20), "receiver listening", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }

    /// Stops the receiver and starts it again on the same port with other arguments (an
    /// operator fixing the receiver's side).
    pub fn relaunch_with(&mut self, args: &[&str]) {
        self.kill();
        self.args = args.iter().map(|a| a.to_string()).collect();
        self.launch();
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    /// Every stored request.
    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The records of every request answered `status`, as JSON values.
    pub fn records(&self, status: u64) -> Vec<Value> {
        self.requests()
            .iter()
            .filter(|r| r["status"] == status)
            .flat_map(records_of)
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The records of one stored request: a JSON array, ndjson lines, or one record.
pub fn records_of(req: &Value) -> Vec<Value> {
    let body = req["body"].as_str().unwrap_or_default();
    match serde_json::from_str::<Value>(body) {
        Ok(Value::Array(items)) => items,
        Ok(one) => vec![one],
        Err(_) => body
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect(),
    }
}
