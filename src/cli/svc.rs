//! `svc`: validate, run, test-sink, init-db, decrypt, verify-custody.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use super::output::{self, say};
use crate::config::{LoadError, RuntimeConfig};

pub const HELP: &str = "\
svc - message-delivery runner: JetStream pull consumer -> one sink, commit first, ACK last

USAGE:
    svc validate <config_file>    check the configuration (no network access)
    svc run <config_file>         deliver until SIGTERM/SIGINT (SIGUSR1 logs a pipeline dump)
    svc test-sink <config_file>   initialize the configured sink and prove it is usable
    svc init-db <config_file> [--print]
                                  create the relational sink's tables (every relational_db
                                  sink, fan-out children included); --print only prints the DDL
    svc decrypt <config_file> <record_file | ->
                                  print the plaintext payload of each stored record (file
                                  record, object-store object, relational row as JSON; one per
                                  line in JSON lines); any configured key, rotated ones included
    svc verify-custody <config_file> <record_file>...
                                  recompute each record's custody digest and report it intact
                                  or altered (exit 1 when any is altered or unverifiable)
    svc spool status <config_file>
                                  the spool's records, bytes, oldest record's age, segments,
                                  quarantined files (read-only; safe beside a runner)
    svc spool inspect <config_file> [--payload]
                                  one JSON line per waiting record: stream, sequence,
                                  subject, sizes; the payload only with --payload (read-only)
    svc spool drain <config_file>
                                  deliver the spool to its sink (the configured sink, or
                                  sink.target when sink.type is spool) and exit when empty;
                                  refused while a runner holds the spool (docs/spool.md)

OPTIONS:
    -h, --help       print this help
    -V, --version    print the version

EXIT CODES:
    0  success (run: clean stop after a signal)
    1  runtime failure (broker, sink, test-sink verdict)
    2  invalid configuration or usage

Configuration reference: docs/configuration.md
";

/// A parsed command line.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Validate(PathBuf),
    Run(PathBuf),
    TestSink(PathBuf),
    /// `init-db`: create (or, with `--print`, print) the relational tables.
    InitDb {
        path: PathBuf,
        print_only: bool,
    },
    /// `decrypt`: the plaintext payloads of stored records (`-` = standard input).
    Decrypt {
        path: PathBuf,
        record: PathBuf,
    },
    /// `verify-custody`: check the custody digests of stored records.
    VerifyCustody {
        path: PathBuf,
        records: Vec<PathBuf>,
    },
    /// `spool drain|status|inspect`.
    Spool(super::spool::SpoolCommand),
    Help,
    Version,
}

/// Parses `argv` (program name first, as `std::env::args_os` yields it).
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, lexopt::Error> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_iter(args);
    let mut command: Option<String> = None;
    let mut file: Option<PathBuf> = None;
    let mut print_only = false;
    let mut records: Vec<PathBuf> = Vec::new();
    while let Some(arg) = parser.next()? {
        let takes_records = matches!(command.as_deref(), Some("decrypt" | "verify-custody"));
        match arg {
            Short('h') | Long("help") => return Ok(Command::Help),
            Long("print") if command.as_deref() == Some("init-db") => print_only = true,
            Short('V') | Long("version") => return Ok(Command::Version),
            Value(v) if command.is_none() => {
                command = Some(v.string()?);
                if command.as_deref() == Some("spool") {
                    return super::spool::parse(&mut parser).map(Command::Spool);
                }
            }
            Value(v) if file.is_none() => file = Some(PathBuf::from(v)),
            Value(v) if takes_records => records.push(PathBuf::from(v)),
            _ => return Err(arg.unexpected()),
        }
    }
    let Some(command) = command else {
        return Err("missing command (validate, run or test-sink); see --help".into());
    };
    let need_file = || -> Result<PathBuf, lexopt::Error> {
        file.clone()
            .ok_or_else(|| format!("{command}: missing <config_file>").into())
    };
    match command.as_str() {
        "validate" => Ok(Command::Validate(need_file()?)),
        "run" => Ok(Command::Run(need_file()?)),
        "test-sink" => Ok(Command::TestSink(need_file()?)),
        "init-db" => Ok(Command::InitDb {
            path: need_file()?,
            print_only,
        }),
        "decrypt" => {
            let path = need_file()?;
            match <[PathBuf; 1]>::try_from(records) {
                Ok([record]) => Ok(Command::Decrypt { path, record }),
                Err(_) => Err("decrypt: give exactly one <record_file> (or - for stdin)".into()),
            }
        }
        "verify-custody" => {
            let path = need_file()?;
            if records.is_empty() {
                return Err("verify-custody: missing <record_file>".into());
            }
            Ok(Command::VerifyCustody { path, records })
        }
        "help" => Ok(Command::Help),
        other => Err(format!("unknown command {other:?}; see --help").into()),
    }
}

/// Runs a command line; returns the process exit code.
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let command = match parse(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("svc: {e}");
            return ExitCode::from(2);
        }
    };
    match command {
        Command::Help => {
            if let Err(e) = output::print(format_args!("{HELP}")) {
                return output::write_failed(&e);
            }
            ExitCode::SUCCESS
        }
        Command::Version => {
            say!("svc {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Validate(path) => match load(&path) {
            Ok(cfg) => {
                say!("Configuration is valid.");
                say!("Active sink: {}", cfg.sink.kind());
                say!("ACK policy: commit-then-acknowledge");
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        Command::TestSink(path) => {
            let cfg = match load(&path) {
                Ok(c) => c,
                Err(code) => return code,
            };
            super::logging::init_from(&cfg.logging);
            let metrics = std::sync::Arc::new(crate::metrics::Metrics::default());
            match cfg.sink.build(metrics).and_then(|s| s.check()) {
                Ok(verdict) => {
                    say!("Sink {} is usable: {verdict}", cfg.sink.kind());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("Sink {} is NOT usable: {e}", cfg.sink.kind());
                    ExitCode::from(1)
                }
            }
        }
        Command::InitDb { path, print_only } => {
            let cfg = match load(&path) {
                Ok(c) => c,
                Err(code) => return code,
            };
            super::logging::init_from(&cfg.logging);
            init_db(&cfg.sink, print_only)
        }
        Command::Decrypt { path, record } => match load(&path) {
            Ok(cfg) => super::protect::decrypt(&cfg, &record),
            Err(code) => code,
        },
        Command::VerifyCustody { path, records } => match load(&path) {
            Ok(cfg) => super::protect::verify_custody(&cfg, &records),
            Err(code) => code,
        },
        Command::Spool(sub) => {
            use super::spool::SpoolCommand;
            let path = match &sub {
                SpoolCommand::Drain(p) | SpoolCommand::Status(p) => p.clone(),
                SpoolCommand::Inspect { path, .. } => path.clone(),
            };
            let cfg = match load(&path) {
                Ok(c) => c,
                Err(code) => return code,
            };
            super::logging::init_from(&cfg.logging);
            super::spool::main(sub, &cfg)
        }
        Command::Run(path) => {
            let cfg = match load(&path) {
                Ok(c) => c,
                Err(code) => return code,
            };
            super::logging::init_from(&cfg.logging);
            match crate::pipeline::run(cfg) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    log::error!("{e}");
                    eprintln!("svc: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

/// `svc init-db`: the DDL of every relational sink in the config, printed or executed.
fn init_db(sink: &crate::sink::SinkConfig, print_only: bool) -> ExitCode {
    use crate::sink::relational;
    let targets = relational::configs_in(sink);
    if targets.is_empty() {
        eprintln!(
            "svc: init-db: the configured sink ({}) has no relational_db sink",
            sink.kind()
        );
        return ExitCode::from(2);
    }
    let mut failed = false;
    for (name, cfg) in targets {
        if print_only {
            say!("-- sink {name}");
            if let Err(e) = output::print(format_args!("{}", relational::ddl(cfg))) {
                return output::write_failed(&e);
            }
            continue;
        }
        let metrics = std::sync::Arc::new(crate::metrics::Metrics::default());
        let result =
            relational::RelationalSink::new(cfg.clone(), metrics).and_then(|s| s.create_tables());
        let tables: Vec<String> = cfg.tables().iter().map(|t| t.to_string()).collect();
        match result {
            Ok(()) => say!(
                "Sink {name}: tables ready in {}:{}/{}: {}",
                cfg.dsn.host,
                cfg.dsn.port,
                cfg.dsn.database,
                tables.join(", ")
            ),
            Err(e) => {
                eprintln!("Sink {name}: tables NOT created: {e}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Loads the config, printing every problem on failure.
fn load(path: &std::path::Path) -> Result<RuntimeConfig, ExitCode> {
    RuntimeConfig::load(path).map_err(|e| {
        match e {
            LoadError::Read { .. } => eprintln!("svc: {e}"),
            LoadError::Invalid(inv) => {
                eprintln!("Configuration is invalid ({} problems):", inv.0.len());
                for p in &inv.0 {
                    eprintln!("  {p}");
                }
            }
        }
        ExitCode::from(2)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Command, String> {
        let argv = std::iter::once("svc").chain(args.iter().copied());
        parse(argv.map(OsString::from)).map_err(|e| e.to_string())
    }

    #[test]
    fn parses_commands_and_flags() {
        assert_eq!(
            p(&["validate", "c.json"]),
            Ok(Command::Validate("c.json".into()))
        );
        assert_eq!(p(&["run", "c.json"]), Ok(Command::Run("c.json".into())));
        assert_eq!(
            p(&["test-sink", "c.json"]),
            Ok(Command::TestSink("c.json".into()))
        );
        assert_eq!(p(&["--help"]), Ok(Command::Help));
        assert_eq!(p(&["run", "--help"]), Ok(Command::Help));
        assert_eq!(p(&["-V"]), Ok(Command::Version));
        assert!(p(&[]).unwrap_err().contains("missing command"));
        assert!(p(&["run"]).unwrap_err().contains("missing <config_file>"));
        assert!(p(&["fly", "x"]).unwrap_err().contains("unknown command"));
        assert!(p(&["run", "a", "b"]).is_err());
        assert!(p(&["run", "--bogus"]).is_err());
        assert_eq!(
            p(&["init-db", "c.json", "--print"]),
            Ok(Command::InitDb {
                path: "c.json".into(),
                print_only: true
            })
        );
        assert_eq!(
            p(&["init-db", "c.json"]),
            Ok(Command::InitDb {
                path: "c.json".into(),
                print_only: false
            })
        );
        assert!(
            p(&["run", "c.json", "--print"]).is_err(),
            "--print is init-db's"
        );
        assert_eq!(
            p(&["decrypt", "c.json", "-"]),
            Ok(Command::Decrypt {
                path: "c.json".into(),
                record: "-".into()
            })
        );
        assert!(p(&["decrypt", "c.json"]).is_err());
        assert!(p(&["decrypt", "c.json", "a", "b"]).is_err());
        assert_eq!(
            p(&["verify-custody", "c.json", "a", "b"]),
            Ok(Command::VerifyCustody {
                path: "c.json".into(),
                records: vec!["a".into(), "b".into()]
            })
        );
        assert!(p(&["verify-custody", "c.json"]).is_err());
        use super::super::spool::SpoolCommand;
        assert_eq!(
            p(&["spool", "drain", "c.json"]),
            Ok(Command::Spool(SpoolCommand::Drain("c.json".into())))
        );
        assert_eq!(
            p(&["spool", "inspect", "c.json", "--payload"]),
            Ok(Command::Spool(SpoolCommand::Inspect {
                path: "c.json".into(),
                payload: true
            }))
        );
        assert!(p(&["spool", "status"]).is_err());
        assert!(p(&["spool", "fly", "c.json"]).is_err());
        assert!(p(&["spool", "status", "c.json", "--payload"]).is_err());
    }
}
