//! `svc spool drain|status|inspect <config_file>`: the operator's handle on a spool.
//!
//! `status` and `inspect` only read (no lock, nothing written), so they are safe while a
//! runner appends; `drain` takes the spool's lock, so it refuses to run beside a runner.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use super::output::say;
use crate::config::RuntimeConfig;
use crate::metrics::{now_epoch_seconds, Metrics};
use crate::sink::spool::drain::Drainer;
use crate::sink::spool::scan::{self, Seen};
use crate::sink::spool::{codec, Spool, SpoolConfig};
use crate::sink::SinkConfig;
use crate::text::terminal;

/// Transient sink failures in a row after which `drain` gives up (the pauses double up to
/// `max_backoff_seconds`).
const DRAIN_ATTEMPTS: u32 = 8;

/// A parsed `svc spool` command line.
#[derive(Debug, PartialEq, Eq)]
pub enum SpoolCommand {
    Drain(PathBuf),
    Status(PathBuf),
    Inspect { path: PathBuf, payload: bool },
}

/// Parses what follows `spool`; `None` for `--help`.
pub fn parse(parser: &mut lexopt::Parser) -> Result<Option<SpoolCommand>, lexopt::Error> {
    use lexopt::prelude::*;
    let mut action: Option<String> = None;
    let mut file: Option<PathBuf> = None;
    let mut payload = false;
    while let Some(arg) = parser.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(None),
            Long("payload") if action.as_deref() == Some("inspect") => payload = true,
            Value(v) if action.is_none() => action = Some(v.string()?),
            Value(v) if file.is_none() => file = Some(PathBuf::from(v)),
            _ => return Err(arg.unexpected()),
        }
    }
    let Some(action) = action else {
        return Err("spool: missing action (drain, status or inspect); see --help".into());
    };
    let path = file.ok_or_else(|| format!("spool {action}: missing <config_file>"))?;
    match action.as_str() {
        "drain" => Ok(Some(SpoolCommand::Drain(path))),
        "status" => Ok(Some(SpoolCommand::Status(path))),
        "inspect" => Ok(Some(SpoolCommand::Inspect { path, payload })),
        other => Err(format!("spool: unknown action {other:?}; see --help").into()),
    }
}

/// The spool of a config and the sink it drains into.
fn spool_of(cfg: &RuntimeConfig) -> Option<(&SpoolConfig, &SinkConfig)> {
    match (&cfg.sink, &cfg.spool) {
        (SinkConfig::Spool(s), _) => Some((&s.spool, &s.target)),
        (sink, Some(spool)) => Some((spool, sink)),
        _ => None,
    }
}

/// Runs a parsed `svc spool` command on a loaded config.
pub fn main(command: SpoolCommand, cfg: &RuntimeConfig) -> ExitCode {
    let Some((spool_cfg, target)) = spool_of(cfg) else {
        eprintln!(
            "svc: spool: the configuration has no spool (a `spool` block or sink.type spool)"
        );
        return ExitCode::from(2);
    };
    match command {
        SpoolCommand::Drain(_) => drain(spool_cfg, target),
        SpoolCommand::Status(_) => status(spool_cfg),
        SpoolCommand::Inspect { payload, .. } => inspect(spool_cfg, payload),
    }
}

fn drain(spool_cfg: &SpoolConfig, target: &SinkConfig) -> ExitCode {
    let metrics = Arc::new(Metrics::default());
    let spool = match Spool::open(spool_cfg, metrics.clone()) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("svc: {e}");
            return ExitCode::from(1);
        }
    };
    let sink = match target.build(metrics.clone()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("svc: spool drain: {e}");
            return ExitCode::from(1);
        }
    };
    let before = spool.records();
    let mut drainer = Drainer::new(spool.clone(), sink, metrics);
    match drainer.run_until_empty(DRAIN_ATTEMPTS) {
        Ok(n) => {
            say!(
                "Spool {}: {n} records delivered to sink {} ({before} were waiting); empty.",
                spool_cfg.dir.display(),
                target.kind()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("svc: {e}");
            ExitCode::from(1)
        }
    }
}

fn status(spool_cfg: &SpoolConfig) -> ExitCode {
    match scan::walk(&spool_cfg.dir, spool_cfg, |_| true) {
        Ok(s) => {
            let age = s
                .oldest_ms
                .map(|ms| (now_epoch_seconds() - ms as f64 / 1000.0).max(0.0));
            say!("spool: {}", spool_cfg.dir.display());
            say!("records: {}", s.records);
            say!("bytes: {} (max {})", s.bytes, spool_cfg.max_bytes);
            say!("segments: {}", s.segments);
            match age {
                Some(a) => say!("oldest_record_age_seconds: {a:.1}"),
                None => say!("oldest_record_age_seconds: none"),
            }
            say!("quarantined_files: {}", s.quarantine_files);
            say!("damaged_not_yet_quarantined: {}", s.damaged);
            say!("rejected_files: {}", s.rejected_files);
            say!(
                "drain_position: segment {} offset {}",
                s.position.segment,
                s.position.offset
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("svc: {e}");
            ExitCode::from(1)
        }
    }
}

/// Streams one line per record as the walk meets it: memory stays at one segment's bytes,
/// whatever the spool holds (collecting the lines first took 84 MiB for a 512 MiB spool).
fn inspect(spool_cfg: &SpoolConfig, payload: bool) -> ExitCode {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut failed: Option<std::io::Error> = None;
    let result = scan::walk(&spool_cfg.dir, spool_cfg, |seen: Seen<'_>| {
        match writeln!(out, "{}", describe(&seen, payload)) {
            Ok(()) => true,
            Err(e) => {
                failed = Some(e);
                false
            }
        }
    });
    if let Err(e) = out.flush() {
        failed = failed.or(Some(e));
    }
    drop(out);
    if let Some(e) = failed {
        return crate::cli::output::write_failed(&e);
    }
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("svc: {e}");
            ExitCode::from(1)
        }
    }
}

/// Characters of one string of a record shown at most (a subject, a message id, a string in
/// the payload): no line of `svc spool inspect` grows with what a publisher sent.
const SHOWN_STRING_CHARS: usize = 1024;

/// One JSON line per record: where it is and its headers; the payload only when asked.
fn describe(seen: &Seen<'_>, payload: bool) -> String {
    let mut doc = serde_json::json!({
        "segment": seen.segment,
        "offset": seen.offset,
        "bytes": seen.body.len(),
        "appended_unix_ms": codec::appended_unix_ms(seen.body),
    });
    match codec::decode(seen.body) {
        Ok(env) => {
            doc["stream"] = env.stream.as_ref().into();
            doc["stream_sequence"] = env.stream_sequence.into();
            doc["subject"] = env.subject.clone().into();
            doc["message_id"] = env.message_id.clone().into();
            doc["received_at"] = env.metadata.received_at.as_str().into();
            doc["payload_bytes"] = env.payload_info.size_bytes.into();
            if payload {
                doc["payload"] = serde_json::from_str(env.payload.json()).unwrap_or_default();
            }
        }
        Err(why) => doc["unreadable"] = why.into(),
    }
    // A record's strings are a publisher's: bounded, and escaped by the one terminal rule.
    terminal::bound_strings(&mut doc, SHOWN_STRING_CHARS);
    terminal::json_line(&doc)
}
