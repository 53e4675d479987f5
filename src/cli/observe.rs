//! The `svc-observe` command line: lexopt parsing into [`Command`], then [`run`].
//!
//! Exit codes: 0 success; 1 runtime failure (snapshot missing, invalid or stale, subject-family
//! overflow with `fail_closed`, a write or listen failure); 2 invalid input (usage error,
//! unreadable or invalid policy or config, no output destination, refusing to overwrite).

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use crate::config::RuntimeConfig;
use crate::files::atomic::write_atomically;
use crate::observe::catalogue;
use crate::observe::connectors::{
    self, broker_monitoring, collector_agent, Connector, ExportArgs, Input,
};
use crate::observe::exposition;
use crate::observe::http::{Reply, Server, ServerConfig, SnapshotSource, Source};
use crate::observe::policy::{LoadError, Policy};
use crate::observe::template;
use crate::observe::textfile::{self, Outcome, TextfileError};

pub const EXIT_OK: u8 = 0;
pub const EXIT_FAILURE: u8 = 1;
pub const EXIT_INVALID: u8 = 2;

const HELP_HEAD: &str = "\
svc-observe: export the runner's metrics through a reviewed observability policy

Usage: svc-observe <command> [arguments]

Commands:
  init-scrape-policy <config_file> <policy_file> [--output-file <path>] [--force]
        Write a disabled policy derived from the runtime config.
  validate-policy <policy_file>
        Check a policy and print its summary.
  show-effective-policy <policy_file>
        Print the policy as JSON with every default filled in.
  list-metrics [--format names]
        Print every metric suffix a policy may allow.
  list-subjects <policy_file> [--format shell]
        Print the policy's subject hints as shell variables.
  scrape-textfile <snapshot_file> <policy_file> [--dry-run] [--output <path>] [--allow-stale]
        Render the approved metrics into a textfile (atomically).
  scrape-http <snapshot_file> <policy_file> [--dry-run] [--allow-stale]
        Serve the approved metrics over HTTP.
  collector-agent-config <policy_file>
        Print the collector agent configuration for the collector_agent profile.
  broker-monitoring-poll <policy_file> [--dry-run] [--output <path>]
        Poll the broker server's monitoring endpoints into a textfile of their own.
";

const HELP_TAIL: &str = "
Options:
  -h, --help     Print help (also after a command)
  -V, --version  Print version

Exit codes: 0 success, 1 runtime failure, 2 invalid input or policy.
";

/// The global help: fixed commands, then one entry per export connector of the registry.
pub fn main_help() -> String {
    let mut s = HELP_HEAD.to_string();
    s.push_str(
        "\nExport commands (each needs the policy's enabled and the connector's enabled):\n",
    );
    for c in connectors::CONNECTORS {
        let args = match c.input {
            Input::SnapshotAndPolicy => "<snapshot_file> <policy_file>",
            Input::PolicyOnly => "<policy_file>",
        };
        s.push_str(&format!(
            "  {} {args} [--dry-run] [--allow-stale]\n        {}\n",
            c.command, c.summary
        ));
    }
    s.push_str(HELP_TAIL);
    s
}

const HELP_INIT: &str = "\
Usage: svc-observe init-scrape-policy <config_file> <policy_file> [--output-file <path>] [--force]

Writes a disabled observability policy derived from the runtime config: every field with its
default, sharing switched off, and subject hints copied from the config's subject patterns.

Options:
  --output-file <path>  Set scrape.output_file (must end in .prom)
  --force               Replace an existing policy file
";

const HELP_VALIDATE: &str = "\
Usage: svc-observe validate-policy <policy_file>

Checks the policy. Valid: prints `Observability policy is valid.` and key=value lines, exit 0.
Invalid: prints every problem with its field path, exit 2.
";

const HELP_SHOW: &str = "\
Usage: svc-observe show-effective-policy <policy_file>

Prints the policy as JSON with every default filled in.
";

const HELP_LIST_METRICS: &str = "\
Usage: svc-observe list-metrics [--format names]

Prints every metric suffix a policy may allow, one per line (runner metrics, then legacy
aliases, which need include_legacy).
";

const HELP_LIST_SUBJECTS: &str = "\
Usage: svc-observe list-subjects <policy_file> [--format shell]

Prints one line per subject hint: SVC_SUBJECT_<index>_<NAME>='<pattern>' (index from 0; NAME
is the pattern in upper case, `*` as ANY, `>` as REST, other characters as `_`).
";

const HELP_TEXTFILE: &str = "\
Usage: svc-observe scrape-textfile <snapshot_file> <policy_file> [--dry-run] [--output <path>] [--allow-stale]

Renders the approved metrics and writes them atomically to --output, else scrape.output_file.
A disabled policy needs no snapshot and writes one comment line.

Options:
  --dry-run        Print the rendering to stdout instead of writing
  --output <path>  Destination file (overrides scrape.output_file)
  --allow-stale    Render even if the snapshot is older than scrape.stale_after_seconds
";

const HELP_HTTP: &str = "\
Usage: svc-observe scrape-http <snapshot_file> <policy_file> [--dry-run] [--allow-stale]

Serves the approved metrics on scrape.http_endpoint (needs enabled and
scrape.http_endpoint.enabled). Prints `Serving metrics on <host>:<port><path>`.

Options:
  --dry-run      Print one response body without opening a listener
  --allow-stale  Serve even if the snapshot is older than scrape.stale_after_seconds
";

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
    /// One of the push connectors of [`connectors::CONNECTORS`].
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

fn path(v: OsString) -> PathBuf {
    PathBuf::from(v)
}

fn utf8(v: OsString, what: &str) -> Result<String, UsageError> {
    v.into_string()
        .map_err(|_| UsageError(format!("{what} must be valid UTF-8")))
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, UsageError> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let sub = match p.next()? {
        Some(Short('h') | Long("help")) => return Ok(Command::Help(main_help())),
        Some(Short('V') | Long("version")) => return Ok(Command::Version),
        Some(Value(v)) => utf8(v, "the command")?,
        Some(arg) => return Err(arg.unexpected().into()),
        None => return Err(UsageError("a command is required".into())),
    };
    let help = match sub.as_str() {
        "init-scrape-policy" => HELP_INIT,
        "validate-policy" => HELP_VALIDATE,
        "show-effective-policy" => HELP_SHOW,
        "list-metrics" => HELP_LIST_METRICS,
        "list-subjects" => HELP_LIST_SUBJECTS,
        "scrape-textfile" => HELP_TEXTFILE,
        "scrape-http" => HELP_HTTP,
        "collector-agent-config" => collector_agent::CONFIG_HELP,
        "broker-monitoring-poll" => broker_monitoring::HELP,
        other => match connectors::find(other) {
            Some(c) => c.help,
            None => return Err(UsageError(format!("unknown command {other:?}"))),
        },
    };
    let export = connectors::find(&sub);
    let mut positional: Vec<OsString> = Vec::new();
    let (mut output_file, mut output, mut format) = (None, None, None);
    let (mut force, mut dry_run, mut allow_stale) = (false, false, false);
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Command::Help(help.to_string())),
            Short('V') | Long("version") => return Ok(Command::Version),
            Long("output-file") if sub == "init-scrape-policy" => {
                output_file = Some(utf8(p.value()?, "--output-file")?)
            }
            Long("force") if sub == "init-scrape-policy" => force = true,
            Long("format") if sub == "list-metrics" || sub == "list-subjects" => {
                format = Some(utf8(p.value()?, "--format")?)
            }
            Long("dry-run")
                if sub == "scrape-textfile"
                    || sub == "scrape-http"
                    || sub == "broker-monitoring-poll"
                    || export.is_some() =>
            {
                dry_run = true
            }
            Long("allow-stale")
                if sub == "scrape-textfile" || sub == "scrape-http" || export.is_some() =>
            {
                allow_stale = true
            }
            Long("output") if sub == "scrape-textfile" || sub == "broker-monitoring-poll" => {
                output = Some(path(p.value()?))
            }
            Value(v) => positional.push(v),
            _ => return Err(arg.unexpected().into()),
        }
    }
    let want = match (sub.as_str(), export) {
        ("list-metrics", _) => 0,
        ("validate-policy" | "show-effective-policy" | "list-subjects", _) => 1,
        ("collector-agent-config", _) => 1,
        ("broker-monitoring-poll", _) => 1,
        (_, Some(c)) if c.input == Input::PolicyOnly => 1,
        _ => 2,
    };
    if positional.len() != want {
        return Err(UsageError(format!(
            "{sub} takes {want} argument{}, got {}",
            if want == 1 { "" } else { "s" },
            positional.len()
        )));
    }
    let expected_format = match sub.as_str() {
        "list-metrics" => Some("names"),
        "list-subjects" => Some("shell"),
        _ => None,
    };
    if let (Some(f), Some(want)) = (&format, expected_format) {
        if f != want {
            return Err(UsageError(format!("--format must be {want}")));
        }
    }
    let mut pos = positional.into_iter().map(path);
    let mut next = || pos.next().expect("argument count checked");
    if let Some(connector) = export {
        let snapshot = (connector.input == Input::SnapshotAndPolicy).then(&mut next);
        return Ok(Command::Export {
            connector,
            args: ExportArgs {
                snapshot,
                policy: next(),
                dry_run,
                allow_stale,
            },
        });
    }
    Ok(match sub.as_str() {
        "init-scrape-policy" => Command::InitScrapePolicy {
            config: next(),
            policy: next(),
            output_file,
            force,
        },
        "validate-policy" => Command::ValidatePolicy { policy: next() },
        "show-effective-policy" => Command::ShowEffectivePolicy { policy: next() },
        "list-metrics" => Command::ListMetrics,
        "list-subjects" => Command::ListSubjects { policy: next() },
        "collector-agent-config" => Command::CollectorAgentConfig { policy: next() },
        "broker-monitoring-poll" => Command::BrokerMonitoringPoll {
            policy: next(),
            dry_run,
            output,
        },
        "scrape-textfile" => Command::ScrapeTextfile {
            snapshot: next(),
            policy: next(),
            dry_run,
            output,
            allow_stale,
        },
        _ => Command::ScrapeHttp {
            snapshot: next(),
            policy: next(),
            dry_run,
            allow_stale,
        },
    })
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    crate::cli::logging::init(log::LevelFilter::Warn);
    // Unlocked handles: `scrape-http` runs for the life of the process and its worker threads
    // log to stderr, so holding the lock here would block them.
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    let code = match parse(std::env::args_os().skip(1)) {
        Ok(cmd) => run(cmd, &mut stdout, &mut stderr),
        Err(e) => {
            let _ = writeln!(
                stderr,
                "svc-observe: {e}\nRun `svc-observe --help` for usage."
            );
            EXIT_INVALID
        }
    };
    ExitCode::from(code)
}

/// Loads a policy, printing every problem on failure.
fn load_policy(path: &Path, err: &mut dyn Write) -> Result<Policy, u8> {
    match Policy::load(path) {
        Ok(p) => Ok(p),
        Err(LoadError::Invalid(inv)) => {
            let _ = writeln!(err, "Observability policy is invalid:");
            for p in &inv.0 {
                let _ = writeln!(err, "  {p}");
            }
            Err(EXIT_INVALID)
        }
        Err(e @ LoadError::Read { .. }) => {
            let _ = writeln!(err, "svc-observe: {e}");
            Err(EXIT_INVALID)
        }
    }
}

/// The `NAME` part of a `list-subjects` variable.
pub fn subject_var_name(pattern: &str) -> String {
    pattern
        .split('.')
        .map(|t| match t {
            "*" => "ANY".to_string(),
            ">" => "REST".to_string(),
            t => t
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() {
                        c.to_ascii_uppercase()
                    } else {
                        '_'
                    }
                })
                .collect(),
        })
        .collect::<Vec<_>>()
        .join("_")
}

/// Single-quotes a value for POSIX shells.
pub fn shell_quote(v: &str) -> String {
    format!("'{}'", v.replace('\'', "'\\''"))
}

/// Runs a command; returns the exit code.
pub fn run(cmd: Command, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    match cmd {
        Command::Help(text) => {
            let _ = out.write_all(text.as_bytes());
            EXIT_OK
        }
        Command::Version => {
            let _ = writeln!(out, "svc-observe {}", env!("CARGO_PKG_VERSION"));
            EXIT_OK
        }
        Command::InitScrapePolicy {
            config,
            policy,
            output_file,
            force,
        } => init(&config, &policy, output_file.as_deref(), force, out, err),
        Command::ValidatePolicy { policy } => match load_policy(&policy, err) {
            Ok(p) => {
                let _ = writeln!(out, "Observability policy is valid.");
                for line in p.summary_lines() {
                    let _ = writeln!(out, "{line}");
                }
                EXIT_OK
            }
            Err(code) => code,
        },
        Command::ShowEffectivePolicy { policy } => match load_policy(&policy, err) {
            Ok(p) => {
                let _ = writeln!(out, "{}", p.to_json_pretty());
                EXIT_OK
            }
            Err(code) => code,
        },
        Command::ListMetrics => {
            for n in catalogue::allowable_names() {
                let _ = writeln!(out, "{n}");
            }
            EXIT_OK
        }
        Command::ListSubjects { policy } => match load_policy(&policy, err) {
            Ok(p) => {
                for (i, s) in p.subjects.iter().enumerate() {
                    let _ = writeln!(
                        out,
                        "SVC_SUBJECT_{i}_{}={}",
                        subject_var_name(&s.subject),
                        shell_quote(&s.subject)
                    );
                }
                EXIT_OK
            }
            Err(code) => code,
        },
        Command::ScrapeTextfile {
            snapshot,
            policy,
            dry_run,
            output,
            allow_stale,
        } => {
            let p = match load_policy(&policy, err) {
                Ok(p) => p,
                Err(code) => return code,
            };
            let req = textfile::Request {
                snapshot: &snapshot,
                policy: &p,
                dry_run,
                output: output.as_deref(),
                allow_stale,
            };
            match textfile::run(&req, out) {
                Ok(Outcome::Written { path, bytes }) => {
                    log::info!("wrote {bytes} bytes to {}", path.display());
                    EXIT_OK
                }
                Ok(Outcome::Printed) => EXIT_OK,
                Ok(Outcome::Disabled { .. }) => EXIT_OK,
                Err(e @ TextfileError::NoOutput) => {
                    let _ = writeln!(err, "svc-observe: {e}");
                    EXIT_INVALID
                }
                Err(e) => {
                    let _ = writeln!(err, "svc-observe: {e}");
                    EXIT_FAILURE
                }
            }
        }
        Command::ScrapeHttp {
            snapshot,
            policy,
            dry_run,
            allow_stale,
        } => {
            let p = match load_policy(&policy, err) {
                Ok(p) => p,
                Err(code) => return code,
            };
            scrape_http(snapshot, p, dry_run, allow_stale, out, err)
        }
        Command::Export { connector, args } => connectors::main_export(connector, &args, out, err),
        Command::CollectorAgentConfig { policy } => {
            let p = match load_policy(&policy, err) {
                Ok(p) => p,
                Err(code) => return code,
            };
            match collector_agent::alloy_config(&p.collector_agent) {
                Ok(text) => {
                    let _ = out.write_all(text.as_bytes());
                    EXIT_OK
                }
                Err(e) => {
                    let _ = writeln!(err, "svc-observe collector-agent-config: {e}");
                    e.exit_code()
                }
            }
        }
        Command::BrokerMonitoringPoll {
            policy,
            dry_run,
            output,
        } => match load_policy(&policy, err) {
            Ok(p) => broker_monitoring::run_poll(&p, dry_run, output.as_deref(), out, err),
            Err(code) => code,
        },
    }
}

fn init(
    config: &Path,
    policy: &Path,
    output_file: Option<&str>,
    force: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let cfg = match RuntimeConfig::load(config) {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(err, "svc-observe: runtime config {}:", config.display());
            for line in e.to_string().lines() {
                let _ = writeln!(err, "  {line}");
            }
            return EXIT_INVALID;
        }
    };
    if policy.exists() && !force {
        let _ = writeln!(
            err,
            "svc-observe: {} already exists; pass --force to replace it",
            policy.display()
        );
        return EXIT_INVALID;
    }
    let doc = template::render(&template::template_policy(&cfg, output_file));
    // The template must be a valid policy (an --output-file without .prom is caught here).
    if let Err(inv) = Policy::parse(&doc) {
        let _ = writeln!(err, "Observability policy is invalid:");
        for p in &inv.0 {
            let _ = writeln!(err, "  {p}");
        }
        return EXIT_INVALID;
    }
    // The policy keeps the mode it had (the exporter's user must go on reading it).
    let mode = std::fs::metadata(policy)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777)
        .unwrap_or(0o644);
    if let Err(e) = write_atomically(policy, doc.as_bytes(), mode) {
        let _ = writeln!(err, "svc-observe: cannot write {}: {e}", policy.display());
        return EXIT_FAILURE;
    }
    let _ = writeln!(out, "Wrote observability policy {}", policy.display());
    let _ = writeln!(
        out,
        "Export stays disabled until the policy enables sharing: set \"enabled\": true and a connector's \"enabled\": true."
    );
    EXIT_OK
}

fn scrape_http(
    snapshot: PathBuf,
    p: Policy,
    dry_run: bool,
    allow_stale: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let disabled = if !p.enabled {
        Some("enabled=false")
    } else if !p.scrape.http_endpoint.enabled {
        Some("scrape.http_endpoint.enabled=false")
    } else {
        None
    };
    if let Some(reason) = disabled {
        if dry_run {
            let _ = out.write_all(exposition::disabled_line(reason).as_bytes());
        } else {
            let _ = writeln!(
                err,
                "svc-observe: the HTTP endpoint is disabled by policy ({reason}); not listening"
            );
        }
        return EXIT_OK;
    }
    let ep = p.scrape.http_endpoint.clone();
    let source = SnapshotSource {
        snapshot,
        policy: p,
        allow_stale,
    };
    if dry_run {
        return match source.render() {
            Reply::Metrics(body) if body.len() as u64 > ep.response_max_bytes => {
                let _ = writeln!(
                    err,
                    "svc-observe: rendered {} bytes, over scrape.http_endpoint.response_max_bytes {}",
                    body.len(),
                    ep.response_max_bytes
                );
                EXIT_FAILURE
            }
            Reply::Metrics(body) => {
                let _ = out.write_all(body.as_bytes());
                EXIT_OK
            }
            Reply::Unavailable(why) | Reply::Failed(why) => {
                let _ = writeln!(err, "svc-observe: {why}");
                EXIT_FAILURE
            }
        };
    }
    let cfg = ServerConfig {
        bind: ep.bind_address(),
        path: ep.path.clone(),
        request_timeout: std::time::Duration::from_secs_f64(ep.request_timeout_seconds),
        response_max_bytes: ep.response_max_bytes,
        workers: crate::observe::http::DEFAULT_WORKERS,
        max_connections: crate::observe::http::DEFAULT_MAX_CONNECTIONS,
    };
    let server = match Server::start(cfg, Arc::new(source)) {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(
                err,
                "svc-observe: cannot listen on {}: {e}",
                ep.bind_address()
            );
            return EXIT_FAILURE;
        }
    };
    let _ = writeln!(out, "Serving metrics on {}:{}{}", ep.host, ep.port, ep.path);
    let _ = out.flush();
    server.wait();
    EXIT_OK
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    #[test]
    fn parses_every_command() {
        assert_eq!(parse(args("--help")).unwrap(), Command::Help(main_help()));
        assert_eq!(parse(args("--version")).unwrap(), Command::Version);
        assert_eq!(
            parse(args("scrape-http --help")).unwrap(),
            Command::Help(HELP_HTTP.to_string())
        );
        assert_eq!(parse(args("list-metrics -V")).unwrap(), Command::Version);
        assert_eq!(
            parse(args(
                "init-scrape-policy c.json p.json --output-file /x/svc.prom"
            ))
            .unwrap(),
            Command::InitScrapePolicy {
                config: "c.json".into(),
                policy: "p.json".into(),
                output_file: Some("/x/svc.prom".into()),
                force: false
            }
        );
        assert_eq!(
            parse(args(
                "scrape-textfile s.json p.json --dry-run --allow-stale"
            ))
            .unwrap(),
            Command::ScrapeTextfile {
                snapshot: "s.json".into(),
                policy: "p.json".into(),
                dry_run: true,
                output: None,
                allow_stale: true
            }
        );
        assert_eq!(
            parse(args("list-metrics --format names")).unwrap(),
            Command::ListMetrics
        );
        assert_eq!(
            parse(args("list-subjects p.json --format shell")).unwrap(),
            Command::ListSubjects {
                policy: "p.json".into()
            }
        );
    }

    #[test]
    fn usage_errors() {
        for (a, msg) in [
            ("", "a command is required"),
            ("frobnicate", "unknown command \"frobnicate\""),
            ("validate-policy", "validate-policy takes 1 argument, got 0"),
            ("scrape-http s.json", "scrape-http takes 2 arguments, got 1"),
            ("list-metrics --format json", "--format must be names"),
            ("scrape-http s p --output x", "invalid option '--output'"),
        ] {
            assert_eq!(parse(args(a)).unwrap_err().0, msg, "{a}");
        }
    }

    #[test]
    fn subject_names() {
        assert_eq!(subject_var_name("orders.>"), "ORDERS_REST");
        assert_eq!(subject_var_name("orders.*.created"), "ORDERS_ANY_CREATED");
        assert_eq!(subject_var_name("a-b.c"), "A_B_C");
        assert_eq!(shell_quote("orders.>"), "'orders.>'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }
}
