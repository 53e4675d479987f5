//! The built binaries as child processes: a running `svc run` with its log captured, and
//! one-shot `svc <args>` calls.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// A running `svc run`, logs captured to a file. Killed on drop.
pub struct Runner {
    pub child: Child,
    pub log: PathBuf,
}

impl Runner {
    /// `svc run <config>` at log level info.
    pub fn start(config: &Path, log: &Path) -> Runner {
        Runner::spawn(svc_run(config).env("RUST_LOG", "info"), log)
    }

    /// [`Runner::start`] with variables for the child's environment (credentials, secrets; a
    /// `RUST_LOG` among them wins).
    pub fn start_env<K, V>(
        config: &Path,
        log: &Path,
        env: impl IntoIterator<Item = (K, V)>,
    ) -> Runner
    where
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        Runner::spawn(svc_run(config).env("RUST_LOG", "info").envs(env), log)
    }

    /// Starts `command` (an `svc run` however prepared: [`svc_run`], or under a shell that sets
    /// its umask) with stdout and stderr in `log`.
    pub fn spawn(command: &mut Command, log: &Path) -> Runner {
        let out = std::fs::File::create(log).unwrap();
        let child = command
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        Runner {
            child,
            log: log.to_path_buf(),
        }
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// Waits for exit up to `timeout`; None if still running.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn sigkill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `svc run <config>`, not started yet.
pub fn svc_run(config: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_svc"));
    c.arg("run").arg(config);
    c
}

/// Runs `svc <args>` to completion: (exit code, stdout, stderr).
pub fn svc(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`svc`] with extra environment variables for the child only: the test process's own
/// environment is shared by every test thread of the one test binary, so it is never changed.
pub fn svc_with_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
