//! The `svc-observe` command line: lexopt parsing into [`Command`], then [`run()`].
//!
//! Exit codes: 0 success; 1 runtime failure (snapshot missing, invalid or stale, subject-family
//! overflow with `fail_closed`, a write or listen failure); 2 invalid input (usage error,
//! unreadable or invalid policy or config, no output destination, refusing to overwrite).
//!
//! Laid out like ripgrep's `flags/`: [`help`] holds the texts, [`mod@parse`] turns arguments into
//! a [`Command`] (no I/O), [`mod@run`] executes it and prints; this file holds the types they share
//! and the binary's entry point.

mod help;
mod parse;
mod run;

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::connectors::{Connector, ExportArgs};
use crate::template::TemplateInput;

pub use help::main_help;
pub use parse::parse;
pub use run::{run, shell_quote, subject_var_name};

pub const EXIT_OK: u8 = 0;
pub const EXIT_FAILURE: u8 = 1;
pub const EXIT_INVALID: u8 = 2;

/// A parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Help(String),
    Version,
    InitScrapePolicy {
        config: PathBuf,
        policy: PathBuf,
        output_file: Option<String>,
        force: bool,
    },
    ValidatePolicy {
        policy: PathBuf,
    },
    ShowEffectivePolicy {
        policy: PathBuf,
    },
    ListMetrics,
    ListSubjects {
        policy: PathBuf,
    },
    ScrapeTextfile {
        snapshot: PathBuf,
        policy: PathBuf,
        dry_run: bool,
        output: Option<PathBuf>,
        allow_stale: bool,
    },
    ScrapeHttp {
        snapshot: PathBuf,
        policy: PathBuf,
        dry_run: bool,
        allow_stale: bool,
    },
    /// One of the push connectors of [`crate::connectors::CONNECTORS`].
    Export {
        connector: &'static Connector,
        args: ExportArgs,
    },
    CollectorAgentConfig {
        policy: PathBuf,
    },
    BrokerMonitoringPoll {
        policy: PathBuf,
        dry_run: bool,
        output: Option<PathBuf>,
    },
}

/// A usage error, printed with a pointer to `--help`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<lexopt::Error> for UsageError {
    fn from(e: lexopt::Error) -> Self {
        UsageError(e.to_string())
    }
}

/// What `init-scrape-policy` takes from the runtime config at a path, or the config's own
/// report (one problem a line). The runtime config's reader is the runner's, which this crate
/// does not link: the binary passes it in (`svc::cli::observe`).
pub type ReadConfig<'a> = &'a dyn Fn(&Path) -> Result<TemplateInput, String>;

/// Entry point of the binary (after it set up logging): parses the arguments and runs the
/// command. Returns the exit code and the first error standard output had, which the binary
/// reports as `svc` does (a reader that left ends quietly with the shell's SIGPIPE status, any
/// other failure, a full disk behind a redirection, is said).
pub fn main(read_config: ReadConfig<'_>) -> (u8, Option<std::io::Error>) {
    // Unlocked handles: `scrape-http` runs for the life of the process and its worker threads
    // log to stderr, so holding the lock here would block them.
    let mut stdout = FirstError::new(std::io::stdout());
    let mut stderr = std::io::stderr();
    let code = match parse(std::env::args_os().skip(1)) {
        Ok(cmd) => run(cmd, read_config, &mut stdout, &mut stderr),
        Err(e) => {
            let _ = writeln!(
                stderr,
                "svc-observe: {e}\nRun `svc-observe --help` for usage."
            );
            EXIT_INVALID
        }
    };
    let _ = stdout.flush();
    (code, stdout.error)
}

/// A writer that keeps the first error of its inner writer, so that the many
/// `let _ = writeln!(out, ..)` of [`fn@run`] cannot lose a failed standard output.
pub struct FirstError<W> {
    inner: W,
    pub error: Option<std::io::Error>,
}

impl<W: Write> FirstError<W> {
    pub fn new(inner: W) -> FirstError<W> {
        FirstError { inner, error: None }
    }

    fn keep<T>(&mut self, r: std::io::Result<T>) -> std::io::Result<T> {
        if let Err(e) = &r {
            if self.error.is_none() {
                self.error = Some(std::io::Error::new(e.kind(), e.to_string()));
            }
        }
        r
    }
}

impl<W: Write> Write for FirstError<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let r = self.inner.write(buf);
        self.keep(r)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let r = self.inner.flush();
        self.keep(r)
    }
}
