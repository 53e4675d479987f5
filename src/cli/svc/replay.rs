//! `svc replay <config>`: delivers a range of the stream again (the engine is
//! `pipeline::replay`; docs/replay.md). Parsing, the `--sink` override and the summary here.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use crate::config::RuntimeConfig;
use crate::pipeline::replay::{self, state::Counts, state::RangeKey, Finish};
use crate::text::rfc3339::parse_rfc3339_nanos;
use crate::text::terminal::text_line;

/// Exit code of a replay that finished with messages refused (governance or sink).
pub const EXIT_REFUSALS: u8 = 3;
/// Exit code of a replay stopped by SIGINT/SIGTERM (`--resume` continues it).
pub const EXIT_INTERRUPTED: u8 = 4;
/// Largest `--sink` file read.
const MAX_SINK_FILE_BYTES: u64 = 1024 * 1024;
/// Longest `--timeout`.
const MAX_TIMEOUT_SECONDS: u64 = 300;

/// `svc replay` options as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub config: PathBuf,
    pub start_seq: Option<u64>,
    pub end_seq: Option<u64>,
    pub since: Option<i128>,
    pub until: Option<i128>,
    pub subject: Option<String>,
    pub sink: Option<PathBuf>,
    /// One child of the configured fan-out sink, by name.
    pub fanout_child: Option<String>,
    pub state: Option<PathBuf>,
    pub resume: bool,
    pub dry_run: bool,
    pub max_rate: Option<u32>,
    pub timeout: Duration,
}

/// Parses what follows `replay`; `None`: help was asked for.
pub fn parse(p: &mut lexopt::Parser) -> Result<Option<Options>, lexopt::Error> {
    use lexopt::prelude::*;
    let mut o = Options {
        config: PathBuf::new(),
        start_seq: None,
        end_seq: None,
        since: None,
        until: None,
        subject: None,
        sink: None,
        fanout_child: None,
        state: None,
        resume: false,
        dry_run: false,
        max_rate: None,
        timeout: Duration::from_secs(10),
    };
    let mut config = None;
    let number = |v: std::ffi::OsString, flag: &str, lo: u64, hi: u64| {
        let s = v.string()?;
        match s.parse::<u64>() {
            Ok(n) if (lo..=hi).contains(&n) => Ok(n),
            _ => Err(lexopt::Error::from(format!(
                "{flag} must be an integer from {lo} to {hi}, not \"{}\"",
                crate::text::terminal::text_line(&s)
            ))),
        }
    };
    let time = |v: std::ffi::OsString, flag: &str| -> Result<i128, lexopt::Error> {
        let s = v.string()?;
        let nanos = parse_rfc3339_nanos(&s).ok_or_else(|| {
            lexopt::Error::from(format!(
                "{flag} must be an RFC 3339 time, e.g. 2026-11-26T14:00:00Z"
            ))
        })?;
        if !crate::broker::config::is_broker_time(nanos) {
            let why = crate::broker::config::BROKER_TIME_RANGE;
            return Err(format!("{flag} {why}").into());
        }
        Ok(nanos)
    };
    while let Some(arg) = p.next()? {
        match arg {
            Long("start-seq") => {
                o.start_seq = Some(number(p.value()?, "--start-seq", 1, u64::MAX)?)
            }
            Long("end-seq") => o.end_seq = Some(number(p.value()?, "--end-seq", 1, u64::MAX)?),
            Long("since") => o.since = Some(time(p.value()?, "--since")?),
            Long("until") => o.until = Some(time(p.value()?, "--until")?),
            Long("subject") => o.subject = Some(p.value()?.string()?),
            Long("sink") => o.sink = Some(PathBuf::from(p.value()?)),
            Long("fanout-child") => o.fanout_child = Some(p.value()?.string()?),
            Long("state") => o.state = Some(PathBuf::from(p.value()?)),
            Long("resume") => o.resume = true,
            Long("dry-run") => o.dry_run = true,
            Long("max-rate") => {
                o.max_rate = Some(number(p.value()?, "--max-rate", 1, 1_000_000)? as u32)
            }
            Long("timeout") => {
                o.timeout =
                    Duration::from_secs(number(p.value()?, "--timeout", 1, MAX_TIMEOUT_SECONDS)?)
            }
            Short('h') | Long("help") => return Ok(None),
            Value(v) if config.is_none() => config = Some(PathBuf::from(v)),
            _ => return Err(arg.unexpected()),
        }
    }
    o.config = config.ok_or("replay: missing <config_file>")?;
    check(&o)?;
    Ok(Some(o))
}

/// The flag combinations that cannot mean anything.
fn check(o: &Options) -> Result<(), lexopt::Error> {
    if o.start_seq.is_some() && o.since.is_some() {
        return Err("give at most one of --start-seq, --since".into());
    }
    if let (Some(s), Some(e)) = (o.start_seq, o.end_seq) {
        if e < s {
            return Err(format!("--end-seq {e} is before --start-seq {s}").into());
        }
    }
    if let (Some(s), Some(u)) = (o.since, o.until) {
        if u < s {
            return Err("--until is before --since".into());
        }
    }
    if o.sink.is_some() && o.fanout_child.is_some() {
        return Err("give at most one of --sink, --fanout-child".into());
    }
    if o.resume && o.dry_run {
        return Err("--dry-run writes no state: it cannot --resume".into());
    }
    Ok(())
}

/// Runs `svc replay` (exit codes: docs/replay.md and the command's help).
pub fn run(opts: &Options) -> ExitCode {
    let cfg = match super::load(&opts.config) {
        Ok(c) => c,
        Err(code) => return code,
    };
    super::super::logging::init_from(&cfg.logging);
    let cfg = match &opts.sink {
        Some(path) => match with_sink(&opts.config, path) {
            Ok(c) => c,
            Err(why) => {
                eprintln!("svc: replay: --sink {}: {why}", path.display());
                return ExitCode::from(2);
            }
        },
        None => cfg,
    };
    let cfg = match &opts.fanout_child {
        Some(name) => match fanout_child(cfg, name) {
            Ok(c) => c,
            Err(why) => {
                eprintln!("svc: replay: --fanout-child {}: {why}", text_line(name));
                return ExitCode::from(2);
            }
        },
        None => cfg,
    };
    let subjects = match super::inspect::narrowed(&cfg.nats.subjects, opts.subject.as_deref()) {
        Ok(s) => s,
        Err(why) => {
            eprintln!("svc: replay: --subject: {why}");
            return ExitCode::from(2);
        }
    };
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let range = RangeKey {
        config: absolute(&opts.config).display().to_string(),
        stream: cfg.nats.stream.clone(),
        subjects,
        sink: match (&opts.sink, &opts.fanout_child) {
            (Some(s), _) => absolute(s).display().to_string(),
            (None, Some(child)) => format!("fanout child {child}"),
            (None, None) => "configured".into(),
        },
        start_seq: opts.start_seq,
        end_seq: opts.end_seq,
        since: opts.since,
        until: opts.until,
        filter: None,
        incarnation: String::new(),
        shape: replay::state::shape_digest(&cfg),
    };
    let engine = replay::Options {
        range,
        state: opts
            .state
            .clone()
            .unwrap_or_else(|| replay::state::StateFile::default_for(&opts.config)),
        resume: opts.resume,
        dry_run: opts.dry_run,
        removes_settled: false,
        max_rate: opts.max_rate,
        timeout: opts.timeout,
    };
    match replay::run(cfg, &engine) {
        Ok(report) => {
            if let Some(code) = summary(&report.counts, report.dry_run) {
                return code;
            }
            let counts = &report.counts;
            match report.finish {
                Finish::Interrupted => {
                    eprintln!(
                        "svc: replay: stopped by a signal; `svc replay {} ... --resume` continues \
                         (state: {})",
                        opts.config.display(),
                        engine.state.display()
                    );
                    ExitCode::from(EXIT_INTERRUPTED)
                }
                Finish::Done if counts.refused() > 0 => ExitCode::from(EXIT_REFUSALS),
                Finish::Done => ExitCode::SUCCESS,
            }
        }
        Err(failed) => {
            let _ = summary(&failed.counts, opts.dry_run);
            eprintln!("svc: replay: {}", failed.error);
            ExitCode::from(1)
        }
    }
}

/// The final summary (standard output).
fn summary(c: &Counts, dry_run: bool) -> Option<ExitCode> {
    let line = c.summary_line(false, dry_run);
    super::output::print(format_args!("{line}\n"))
        .err()
        .map(|e| super::output::write_failed(&e))
}

/// The configuration with its fan-out sink replaced by the child `name` of it: what the
/// replay stores goes into that child only.
pub(super) fn fanout_child(mut cfg: RuntimeConfig, name: &str) -> Result<RuntimeConfig, String> {
    use crate::sink::SinkConfig;
    let SinkConfig::Fanout(fanout) = &cfg.sink else {
        return Err(format!(
            "the configured sink is of type {}, not fanout",
            cfg.sink.kind()
        ));
    };
    let Some(child) = fanout.sinks.get(name) else {
        let known: Vec<&str> = fanout.sinks.keys().map(String::as_str).collect();
        return Err(format!(
            "the fan-out sink has no such child; its children: {}",
            known.join(", ")
        ));
    };
    cfg.sink = child.clone();
    Ok(cfg)
}

/// The configuration with its `sink` block replaced by the one in `sink_file` (a JSON object,
/// as the `sink` block of a configuration), validated as a whole.
pub(super) fn with_sink(config: &Path, sink_file: &Path) -> Result<RuntimeConfig, String> {
    use std::io::Read;
    // The sink file decides where records go: no link followed, no FIFO waited on, and
    // only one the service's user (or root) owns and no other account may write (one
    // planted in a shared directory such as /tmp would redirect the replay). The
    // configuration is opened as `svc run` opens it.
    let read = |p: &Path, strict: bool| -> Result<String, String> {
        let f = if strict {
            let (f, stat) = crate::files::owner::open_regular(p).map_err(|e| e.to_string())?;
            // Its directory too: in one others may write, another file of the service's user
            // (an older sink block) could be renamed in under the name.
            let dir = match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            if let Some(why) = crate::files::owner::changeable_by_others(dir) {
                return Err(format!("its directory {}: {why}", dir.display()));
            }
            crate::files::owner::check_owner(&stat, true).map_err(|e| e.to_string())?;
            if stat.st_mode & 0o022 != 0 {
                return Err(format!(
                    "is writable by other accounts (mode {:04o}); make it 0600 or 0644",
                    stat.st_mode & 0o7777
                ));
            }
            f
        } else {
            std::fs::File::open(p).map_err(|e| format!("cannot open {}: {e}", p.display()))?
        };
        let mut text = String::new();
        f.take(MAX_SINK_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
        if text.len() as u64 > MAX_SINK_FILE_BYTES {
            return Err(format!("larger than {MAX_SINK_FILE_BYTES} bytes"));
        }
        Ok(text)
    };
    let sink: serde_json::Value = serde_json::from_str(&read(sink_file, true)?)
        .map_err(|e| format!("not valid JSON: {e}"))?;
    if !sink.is_object() {
        return Err(
            "must hold one JSON object: a sink block, e.g. {\"type\": \"file\", ...}".into(),
        );
    }
    let mut doc: serde_json::Value =
        serde_json::from_str(&read(config, false)?).map_err(|e| format!("configuration: {e}"))?;
    doc["sink"] = sink;
    RuntimeConfig::parse(&doc.to_string()).map_err(|inv| {
        let lines: Vec<String> = inv.0.iter().map(|p| p.to_string()).collect();
        format!(
            "the configuration with this sink is invalid: {}",
            lines.join("; ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(args: &[&str]) -> Result<Options, String> {
        let mut p = lexopt::Parser::from_iter(std::iter::once("x").chain(args.iter().copied()));
        parse(&mut p).map(Option::unwrap).map_err(|e| e.to_string())
    }

    #[test]
    fn flags_and_their_errors_name_the_flag() {
        let o = opts(&[
            "c.json",
            "--start-seq",
            "5",
            "--end-seq",
            "9",
            "--max-rate",
            "20",
        ])
        .unwrap();
        assert_eq!(
            (o.start_seq, o.end_seq, o.max_rate),
            (Some(5), Some(9), Some(20))
        );
        let o = opts(&["c.json", "--since", "2026-11-26T14:00:00Z", "--resume"]).unwrap();
        assert!(o.since.is_some() && o.resume);
        for (args, needle) in [
            (
                &["c.json", "--start-seq", "x"][..],
                "--start-seq must be an integer",
            ),
            (
                &["c.json", "--end-seq", "0"],
                "--end-seq must be an integer from 1",
            ),
            (
                &["c.json", "--since", "yesterday"],
                "--since must be an RFC 3339 time",
            ),
            (
                &["c.json", "--until", "12:00"],
                "--until must be an RFC 3339 time",
            ),
            (
                &["c.json", "--max-rate", "0"],
                "--max-rate must be an integer",
            ),
            (
                &["c.json", "--timeout", "301"],
                "--timeout must be an integer",
            ),
            (
                &["c.json", "--start-seq", "9", "--end-seq", "3"],
                "--end-seq 3 is before",
            ),
            (
                &[
                    "c.json",
                    "--start-seq",
                    "1",
                    "--since",
                    "2026-11-26T14:00:00Z",
                ],
                "at most one",
            ),
            (&["c.json", "--dry-run", "--resume"], "cannot --resume"),
            (
                &["c.json", "--sink", "s.json", "--fanout-child", "a"],
                "at most one of --sink, --fanout-child",
            ),
            (&["--start-seq", "1"], "missing <config_file>"),
            (&["c.json", "--bogus"], "--bogus"),
        ] {
            let e = opts(args).unwrap_err();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
    }

    /// A `--sink` file another account could have written is never read: its sink block
    /// would decide where the replayed records go.
    #[test]
    fn a_sink_file_another_account_could_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("svc-sink-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sink = dir.join("sink.json");
        std::fs::write(&sink, br#"{"type": "file", "directory": "/nonexistent"}"#).unwrap();
        let config = dir.join("missing-config.json");
        let set_mode = |m| std::fs::set_permissions(&sink, std::fs::Permissions::from_mode(m));
        set_mode(0o666).unwrap();
        let e = with_sink(&config, &sink).unwrap_err();
        assert!(e.contains("writable by other accounts (mode 0666)"), "{e}");
        set_mode(0o620).unwrap();
        let e = with_sink(&config, &sink).unwrap_err();
        assert!(e.contains("writable by other accounts (mode 0620)"), "{e}");
        set_mode(0o644).unwrap();
        // Past the sink file: the (missing) configuration is what fails now.
        let e = with_sink(&config, &sink).unwrap_err();
        assert!(e.contains("missing-config.json"), "{e}");
        if crate::files::owner::service_uid() == 0 {
            rustix::fs::chown(&sink, Some(rustix::fs::Uid::from_raw(4242)), None).unwrap();
            let e = with_sink(&config, &sink).unwrap_err();
            assert!(e.contains("owned by uid 4242"), "{e}");
            rustix::fs::chown(&sink, Some(rustix::fs::Uid::from_raw(0)), None).unwrap();
        }
        // Its directory: writable by others without the sticky bit is refused.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = with_sink(&config, &sink).unwrap_err();
        assert!(e.contains("(mode 0777) and is not sticky"), "{e}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = with_sink(&config, &sink).unwrap_err();
        assert!(e.contains("missing-config.json"), "sticky is fine: {e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
