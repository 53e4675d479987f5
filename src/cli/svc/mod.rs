//! `svc`: validate, show-effective-config, run, inspect, replay, stream-plan, test-sink,
//! init-db, decrypt, verify-custody, spool, dlq. Parsing (lexopt) and
//! running live here; the help texts in [`help`], the `validate` summary in [`summary`].

mod dlq;
mod help;
mod inspect;
mod plan;
mod plan_apply;
mod replay;
mod stream_plan;
mod summary;

pub use help::{COMMANDS, HELP};

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use super::output::{self, say};
use crate::config::{LoadError, RuntimeConfig};
use crate::text::error_chain;

/// A parsed command line.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Validate(PathBuf),
    /// `show-effective-config`: the whole configuration with every default filled in.
    ShowEffectiveConfig(PathBuf),
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
        /// `--public-key [ID=]FILE`: audit the sink's records against its checkpoints.
        public_keys: Vec<String>,
        /// `--head RUNNER:INDEX:DIGEST`: chain heads held outside the sink.
        heads: Vec<String>,
    },
    /// `inspect`: a read-only look at the stream.
    Inspect(inspect::Options),
    /// `replay`: deliver a range of the stream again.
    Replay(replay::Options),
    /// `stream-plan`: what the broker must hold for the config (and `--apply`: create it).
    StreamPlan(stream_plan::Options),
    /// `spool drain|status|inspect`.
    Spool(super::spool::SpoolCommand),
    /// `dlq list|show`: a read-only look at the dead-letter stream.
    Dlq(dlq::Options),
    /// The global help or one command's.
    Help(&'static str),
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
    let mut public_keys: Vec<String> = Vec::new();
    let mut heads: Vec<String> = Vec::new();
    while let Some(arg) = parser.next()? {
        let takes_records = matches!(command.as_deref(), Some("decrypt" | "verify-custody"));
        match arg {
            Short('h') | Long("help") => return Ok(Command::Help(help::of(command.as_deref()))),
            Long("print") if command.as_deref() == Some("init-db") => print_only = true,
            Long("public-key") if command.as_deref() == Some("verify-custody") => {
                public_keys.push(parser.value()?.string()?)
            }
            Long("head") if command.as_deref() == Some("verify-custody") => {
                heads.push(parser.value()?.string()?)
            }
            Short('V') | Long("version") => return Ok(Command::Version),
            Value(v) if command.is_none() => {
                let name = v.string()?;
                if name == "inspect" {
                    // Its options are its own: the parser is handed on.
                    return Ok(match inspect::parse(&mut parser)? {
                        Some(o) => Command::Inspect(o),
                        None => Command::Help(help::of(Some("inspect"))),
                    });
                }
                if name == "replay" {
                    return Ok(match replay::parse(&mut parser)? {
                        Some(o) => Command::Replay(o),
                        None => Command::Help(help::of(Some("replay"))),
                    });
                }
                if name == "stream-plan" {
                    return Ok(match stream_plan::parse(&mut parser)? {
                        Some(o) => Command::StreamPlan(o),
                        None => Command::Help(help::of(Some("stream-plan"))),
                    });
                }
                if name == "dlq" {
                    return Ok(match dlq::parse(&mut parser)? {
                        Some(o) => Command::Dlq(o),
                        None => Command::Help(help::of(Some("dlq"))),
                    });
                }
                if name == "spool" {
                    return Ok(match super::spool::parse(&mut parser)? {
                        Some(c) => Command::Spool(c),
                        None => Command::Help(help::of(Some("spool"))),
                    });
                }
                command = Some(name)
            }
            Value(v) if file.is_none() => file = Some(PathBuf::from(v)),
            Value(v) if takes_records => records.push(PathBuf::from(v)),
            _ => return Err(arg.unexpected()),
        }
    }
    let Some(command) = command else {
        return Err(format!(
            "missing command: one of {} (svc --help describes them)",
            COMMANDS.join(", ")
        )
        .into());
    };
    let need_file = || -> Result<PathBuf, lexopt::Error> {
        file.clone()
            .ok_or_else(|| format!("{command}: missing <config_file>").into())
    };
    match command.as_str() {
        "validate" => Ok(Command::Validate(need_file()?)),
        "show-effective-config" => Ok(Command::ShowEffectiveConfig(need_file()?)),
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
            if records.is_empty() && public_keys.is_empty() {
                return Err("verify-custody: missing <record_file> (or --public-key FILE)".into());
            }
            if !heads.is_empty() && public_keys.is_empty() {
                return Err("verify-custody: --head needs --public-key".into());
            }
            if !records.is_empty() && !public_keys.is_empty() {
                return Err(
                    "verify-custody: --public-key audits the configured sink; give no <record_file>"
                        .into(),
                );
            }
            Ok(Command::VerifyCustody {
                path,
                records,
                public_keys,
                heads,
            })
        }
        // `svc help <command>`: the file slot holds the command's name.
        "help" => Ok(Command::Help(help::of(
            file.as_deref().and_then(|f| f.to_str()),
        ))),
        other => Err(format!(
            "unknown command \"{}\": one of {} (svc --help describes them)",
            crate::text::terminal::text_line(other),
            COMMANDS.join(", ")
        )
        .into()),
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
    let Some(path) = command.config_path() else {
        return run_without_config(command);
    };
    let cfg = match load(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if command.logs() {
        super::logging::init_from(&cfg.logging);
    }
    run_with_config(command, cfg)
}

impl Command {
    /// The configuration file a command loads first (as `validate` does: exit code 2 when it
    /// is invalid); `None` for those that load none, or read it their own way.
    fn config_path(&self) -> Option<&std::path::Path> {
        use super::spool::SpoolCommand;
        match self {
            Command::Validate(path)
            | Command::Run(path)
            | Command::TestSink(path)
            | Command::InitDb { path, .. }
            | Command::Decrypt { path, .. }
            | Command::VerifyCustody { path, .. } => Some(path),
            Command::Spool(
                SpoolCommand::Drain { path, .. }
                | SpoolCommand::Status { path, .. }
                | SpoolCommand::Inspect { path, .. }
                | SpoolCommand::SetAside { path, .. },
            ) => Some(path),
            Command::Inspect(o) => Some(&o.config),
            Command::Dlq(o) => Some(&o.config),
            Command::StreamPlan(o) => Some(&o.config),
            Command::ShowEffectiveConfig(_)
            | Command::Replay(_)
            | Command::Help(_)
            | Command::Version => None,
        }
    }

    /// Whether the command logs through the configuration's `logging` block (the checks that
    /// only print a verdict do not).
    fn logs(&self) -> bool {
        !matches!(
            self,
            Command::Validate(_) | Command::Decrypt { .. } | Command::VerifyCustody { .. }
        )
    }
}

/// The commands that load no configuration first.
fn run_without_config(command: Command) -> ExitCode {
    match command {
        Command::Help(text) => match output::print(format_args!("{text}")) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => output::write_failed(&e),
        },
        Command::Version => {
            say!("svc {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Replay(opts) => replay::run(&opts),
        Command::ShowEffectiveConfig(path) => {
            match crate::document::reader::load_document(&path, "", crate::config::effective_json) {
                Ok(json) => match output::print(format_args!("{json}")) {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => output::write_failed(&e),
                },
                Err(e) => report(e),
            }
        }
        // Every other command names a configuration (`Command::config_path`).
        _ => ExitCode::from(2),
    }
}

/// The commands that run on a loaded configuration.
fn run_with_config(command: Command, cfg: RuntimeConfig) -> ExitCode {
    match command {
        Command::Validate(_) => validate(&cfg),
        Command::Inspect(opts) => inspect::run(&cfg, &opts),
        Command::Dlq(opts) => dlq::run(&cfg, &opts),
        Command::StreamPlan(opts) => stream_plan::run(&cfg, &opts),
        Command::TestSink(_) => test_sink(&cfg),
        Command::InitDb { print_only, .. } => {
            init_db(&cfg.sink, print_only, cfg.custody.checkpoints.enabled)
        }
        Command::Decrypt { record, .. } => super::protect::decrypt(&cfg, &record),
        Command::VerifyCustody {
            records,
            public_keys,
            heads,
            ..
        } => match public_keys.is_empty() {
            true => super::protect::verify_custody(&cfg, &records),
            false => super::protect::verify_checkpoints(&cfg, &public_keys, &heads),
        },
        Command::Spool(sub) => super::spool::main(sub, &cfg),
        Command::Run(_) => run(cfg),
        // Loads no configuration (`Command::config_path`).
        other => run_without_config(other),
    }
}

/// `svc validate`: the verdict, the active sink, a summary and the warnings.
fn validate(cfg: &RuntimeConfig) -> ExitCode {
    say!("Configuration is valid.");
    say!("Active sink: {}", cfg.sink.kind());
    say!("ACK policy: commit-then-acknowledge");
    say!("");
    say!("{}", summary::paragraph(cfg));
    for w in summary::warnings(cfg) {
        say!("Warning: {w}");
    }
    ExitCode::SUCCESS
}

/// `svc test-sink`: builds the sink and asks it whether it is usable.
fn test_sink(cfg: &RuntimeConfig) -> ExitCode {
    let metrics = std::sync::Arc::new(crate::metrics::Metrics::default());
    match cfg.sink.build(metrics).and_then(|s| s.check()) {
        Ok(verdict) => {
            say!("Sink {} is usable: {verdict}", cfg.sink.kind());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "Sink {} is NOT usable: {}",
                cfg.sink.kind(),
                error_chain(&e)
            );
            ExitCode::from(1)
        }
    }
}

/// `svc run`: the pipeline until SIGTERM/SIGINT or a fatal error.
fn run(cfg: RuntimeConfig) -> ExitCode {
    match crate::pipeline::run(cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let e = error_chain(&e);
            // Once: through the configured log format when it shows errors (a JSON log
            // shipper must see it), else as a plain line.
            if log::log_enabled!(log::Level::Error) {
                log::error!("{e}");
            } else {
                eprintln!("svc: {e}");
            }
            ExitCode::from(1)
        }
    }
}

/// `svc init-db`: the DDL of every relational sink in the config, printed or executed.
fn init_db(sink: &crate::sink::SinkConfig, print_only: bool, checkpoints: bool) -> ExitCode {
    use crate::sink::relational;
    // The spool as the sink: the tables of its target, which `svc spool drain` fills.
    let targets = match sink {
        crate::sink::SinkConfig::Spool(s) => relational::configs_in(&s.target),
        sink => relational::configs_in(sink),
    };
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
            let ddl = match cfg.engine {
                relational::config::Engine::Mysql => {
                    let mut ddl = relational::my_sink::ddl(cfg);
                    if checkpoints {
                        if let Ok(s) = crate::sink::checkpoint::MyStore::new(cfg) {
                            ddl.push_str(&s.ddl());
                        }
                    }
                    ddl
                }
                relational::config::Engine::PostgreSql => {
                    let mut ddl = relational::ddl(cfg);
                    if checkpoints {
                        if let Ok(s) = crate::sink::checkpoint::PgStore::new(cfg) {
                            ddl.push_str(&s.ddl());
                        }
                    }
                    ddl
                }
            };
            if let Err(e) = output::print(format_args!("{ddl}")) {
                return output::write_failed(&e);
            }
            continue;
        }
        let metrics = std::sync::Arc::new(crate::metrics::Metrics::default());
        let result = match cfg.engine {
            relational::config::Engine::Mysql => {
                relational::my_sink::MySqlSink::new(cfg.clone(), metrics)
                    .and_then(|s| s.create_tables())
                    .and_then(|()| {
                        if !checkpoints {
                            return Ok(());
                        }
                        crate::sink::checkpoint::MyStore::new(cfg)
                            .and_then(|s| s.create_table())
                            .map_err(|e| crate::sink::SinkError::new("relational_db", e))
                    })
            }
            relational::config::Engine::PostgreSql => {
                relational::RelationalSink::new(cfg.clone(), metrics)
                    .and_then(|s| s.create_tables())
                    .and_then(|()| {
                        if !checkpoints {
                            return Ok(());
                        }
                        crate::sink::checkpoint::PgStore::new(cfg)
                            .and_then(|s| s.create_table())
                            .map_err(|e| crate::sink::SinkError::new("relational_db", e))
                    })
            }
        };
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
                eprintln!("Sink {name}: tables NOT created: {}", error_chain(&e));
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
    RuntimeConfig::load(path).map_err(report)
}

/// Prints why a config could not be loaded, as `validate` does; exit code 2.
fn report(e: LoadError) -> ExitCode {
    match e {
        LoadError::Read { .. } => eprintln!("svc: {e}"),
        LoadError::Invalid(inv) => {
            let n = inv.0.len();
            let s = if n == 1 { "" } else { "s" };
            eprintln!("Configuration is invalid ({n} problem{s}):");
            for p in &inv.0 {
                eprintln!("  {p}");
            }
        }
    }
    ExitCode::from(2)
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
        assert_eq!(p(&["--help"]), Ok(Command::Help(HELP)));
        assert_eq!(
            p(&["run", "--help"]),
            Ok(Command::Help(help::of(Some("run"))))
        );
        assert!(p(&["init-db", "-h"]).unwrap() != Command::Help(HELP));
        assert_eq!(
            p(&["help", "decrypt"]),
            Ok(Command::Help(help::of(Some("decrypt"))))
        );
        for c in COMMANDS {
            let Ok(Command::Help(text)) = p(&[c, "--help"]) else {
                panic!("{c}")
            };
            assert!(
                text.starts_with(&format!("Usage: svc {c} "))
                    && text.lines().next().unwrap().contains("<config_file>"),
                "{c}"
            );
            assert!(HELP.contains(&format!("    svc {c} ")), "{c}");
        }
        assert_eq!(p(&["-V"]), Ok(Command::Version));
        assert_eq!(
            p(&[]).unwrap_err(),
            "missing command: one of validate, show-effective-config, run, inspect, replay, \
             stream-plan, test-sink, init-db, decrypt, verify-custody, spool, dlq (svc --help \
             describes them)"
        );
        assert!(p(&["run"]).unwrap_err().contains("missing <config_file>"));
        assert!(p(&["fly", "x"]).unwrap_err().contains("unknown command"));
        // Operator input is quoted with Display, its terminal controls escaped.
        assert_eq!(
            p(&["\u{1b}[2Jfly", "x"]).unwrap_err().split(':').next(),
            Some("unknown command \"\\u{1b}[2Jfly\"")
        );
        assert!(p(&["spool", "\u{9b}x", "c.json"])
            .unwrap_err()
            .contains("unknown action \"\\u{9b}x\""));
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
                records: vec!["a".into(), "b".into()],
                public_keys: vec![],
                heads: vec![],
            })
        );
        assert!(p(&["verify-custody", "c.json"]).is_err());
        assert_eq!(
            p(&["verify-custody", "c.json", "--public-key", "k.pub"]),
            Ok(Command::VerifyCustody {
                path: "c.json".into(),
                records: vec![],
                public_keys: vec!["k.pub".into()],
                heads: vec![],
            })
        );
        use super::super::spool::SpoolCommand;
        assert_eq!(
            p(&["spool", "drain", "c.json"]),
            Ok(Command::Spool(SpoolCommand::Drain {
                path: "c.json".into(),
                public_keys: vec![]
            }))
        );
        assert_eq!(
            p(&["spool", "drain", "c.json", "--public-key", "k1=a.pub"]),
            Ok(Command::Spool(SpoolCommand::Drain {
                path: "c.json".into(),
                public_keys: vec!["k1=a.pub".into()]
            }))
        );
        assert_eq!(
            p(&["spool", "inspect", "c.json", "--payload"]),
            Ok(Command::Spool(SpoolCommand::Inspect {
                path: "c.json".into(),
                payload: true
            }))
        );
        assert_eq!(
            p(&[
                "spool",
                "set-aside",
                "c.json",
                "--segment",
                "3",
                "--offset",
                "8"
            ]),
            Ok(Command::Spool(SpoolCommand::SetAside {
                path: "c.json".into(),
                segment: 3,
                offset: 8
            }))
        );
        assert!(p(&["spool", "set-aside", "c.json", "--segment", "3"]).is_err());
        assert!(p(&[
            "spool",
            "set-aside",
            "c.json",
            "--segment",
            "x",
            "--offset",
            "8"
        ])
        .is_err());
        assert!(p(&["spool", "drain", "c.json", "--segment", "3"]).is_err());
        assert!(p(&["spool", "status"]).is_err());
        assert!(p(&["spool", "fly", "c.json"]).is_err());
        assert!(p(&["spool", "status", "c.json", "--payload"]).is_err());
    }
}
