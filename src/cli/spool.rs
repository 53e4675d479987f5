//! `svc spool drain|status|inspect|set-aside <config_file>`: the operator's handle on a spool.
//!
//! `status` and `inspect` only read (no lock, nothing written), so they are safe while a
//! runner appends; `drain` and `set-aside` take the spool's lock, so they refuse to run beside
//! a runner.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use super::output::say;
use crate::config::RuntimeConfig;
use crate::message::protection::checkpoint::TrustedKeys;
use crate::metrics::{now_epoch_seconds, Metrics};
use crate::sink::spool::aside::DrainTarget;
use crate::sink::spool::dir as fs_dir;
use crate::sink::spool::drain::Drainer;
use crate::sink::spool::meta;
use crate::sink::spool::scan::{self, Seen};
use crate::sink::spool::seal::{self, Crypt, Opened, Opener};
use crate::sink::spool::{codec, Spool, SpoolConfig};
use crate::sink::SinkConfig;
use crate::text::terminal;

/// Transient sink failures in a row after which `drain` gives up (the pauses double up to
/// `max_backoff_seconds`).
const DRAIN_ATTEMPTS: u32 = 8;

/// A parsed `svc spool` command line.
#[derive(Debug, PartialEq, Eq)]
pub enum SpoolCommand {
    Drain {
        path: PathBuf,
        /// `--public-key [ID=]FILE`: the keys checkpoint frames are checked with.
        public_keys: Vec<String>,
    },
    Status {
        path: PathBuf,
        json: bool,
    },
    Inspect {
        path: PathBuf,
        payload: bool,
    },
    SetAside {
        path: PathBuf,
        segment: u64,
        offset: u64,
    },
}

/// Parses what follows `spool`; `None` for `--help`.
pub fn parse(parser: &mut lexopt::Parser) -> Result<Option<SpoolCommand>, lexopt::Error> {
    use lexopt::prelude::*;
    let mut action: Option<String> = None;
    let mut file: Option<PathBuf> = None;
    let mut payload = false;
    let mut json = false;
    let mut public_keys = Vec::new();
    let (mut segment, mut offset): (Option<u64>, Option<u64>) = (None, None);
    while let Some(arg) = parser.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(None),
            Long("segment") if action.as_deref() == Some("set-aside") => {
                segment = Some(parser.value()?.parse()?);
            }
            Long("offset") if action.as_deref() == Some("set-aside") => {
                offset = Some(parser.value()?.parse()?);
            }
            Long("payload") if action.as_deref() == Some("inspect") => payload = true,
            Long("public-key") if action.as_deref() == Some("drain") => {
                public_keys.push(parser.value()?.string()?);
            }
            Long("json") if action.as_deref() == Some("status") => json = true,
            Value(v) if action.is_none() => action = Some(v.string()?),
            Value(v) if file.is_none() => file = Some(PathBuf::from(v)),
            _ => return Err(arg.unexpected()),
        }
    }
    let Some(action) = action else {
        return Err(
            "spool: missing action (drain, status, inspect or set-aside); see --help".into(),
        );
    };
    let path = file.ok_or_else(|| format!("spool {action}: missing <config_file>"))?;
    match action.as_str() {
        "drain" => Ok(Some(SpoolCommand::Drain { path, public_keys })),
        "status" => Ok(Some(SpoolCommand::Status { path, json })),
        "inspect" => Ok(Some(SpoolCommand::Inspect { path, payload })),
        "set-aside" => match (segment, offset) {
            (Some(segment), Some(offset)) => Ok(Some(SpoolCommand::SetAside {
                path,
                segment,
                offset,
            })),
            _ => Err(
                "spool set-aside: --segment N and --offset N are required (the place \
                      the drain's or the opening's error names)"
                    .into(),
            ),
        },
        other => {
            let shown = terminal::text_line(other);
            Err(format!("spool: unknown action \"{shown}\"; see --help").into())
        }
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
        SpoolCommand::Drain { public_keys, .. } => match drain_trust(cfg, &public_keys) {
            Ok(trusted) => drain(spool_cfg, target, trusted),
            Err(e) => {
                eprintln!("svc: spool drain: {e}");
                ExitCode::from(2)
            }
        },
        SpoolCommand::Status { json, .. } => status(spool_cfg, json),
        SpoolCommand::Inspect { payload, .. } => inspect(spool_cfg, target, payload),
        SpoolCommand::SetAside {
            segment, offset, ..
        } => set_aside(spool_cfg, segment, offset, drain_target(cfg, target)),
    }
}

/// What this configuration's drain does with a checkpoint frame (set-aside refuses one it
/// would put): the target's checkpoint store when it keeps one, the keys `svc spool drain`
/// checks frames with when no `--public-key` is given.
fn drain_target(cfg: &RuntimeConfig, target: &SinkConfig) -> DrainTarget {
    let keeps = crate::sink::checkpoint::unavailable(target).is_none();
    DrainTarget {
        store: keeps
            .then(|| crate::sink::checkpoint::store_for(target).ok())
            .flatten(),
        trusted: drain_trust(cfg, &[]).unwrap_or_default(),
    }
}

fn set_aside(spool_cfg: &SpoolConfig, segment: u64, offset: u64, drain: DrainTarget) -> ExitCode {
    match crate::sink::spool::aside::set_aside_before(spool_cfg, segment, offset, &drain) {
        Ok(kept) => {
            say!(
                "Spool {}: the record at segment {segment} offset {offset} is set aside; its \
                 bytes are kept in {kept}. The drain moves past it.",
                terminal::text_line(&spool_cfg.dir.display().to_string())
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("svc: {e}");
            ExitCode::from(1)
        }
    }
}

/// The keys checkpoint frames are checked with before the drain puts them: the given
/// `--public-key [ID=]FILE`s, else the configuration's own `custody.checkpoints` key when
/// checkpoints are on (see `crate::sink::spool::drain::Drainer::with_trusted_keys`).
fn drain_trust(cfg: &RuntimeConfig, keys: &[String]) -> Result<TrustedKeys, String> {
    let own = &cfg.custody.checkpoints;
    let mut trusted = TrustedKeys::default();
    for k in keys {
        trusted.add(k, &own.key_id)?;
    }
    if keys.is_empty() && cfg.custody.enabled && own.enabled {
        trusted = TrustedKeys::own(own).map_err(|e| {
            format!("{e} (the drain checks checkpoint frames with it; or give --public-key)")
        })?;
    }
    Ok(trusted)
}

/// Drains the spool into `target`; when `target` keeps checkpoints, each custody checkpoint
/// frame is put into its checkpoint store (the spool as the sink, or an edge spool handed to
/// a fallback `spool` block in front of that target: atk50b finding 6).
fn drain(spool_cfg: &SpoolConfig, target: &SinkConfig, trusted: TrustedKeys) -> ExitCode {
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
            eprintln!("svc: spool drain: {}", crate::text::error_chain(&e));
            return ExitCode::from(1);
        }
    };
    let before = spool.records();
    let mut drainer = Drainer::new(spool.clone(), sink, metrics).with_trusted_keys(trusted);
    if crate::sink::checkpoint::unavailable(target).is_none() {
        match crate::sink::checkpoint::store_for(target) {
            Ok(store) => drainer = drainer.with_checkpoint_store(store),
            Err(e) => {
                eprintln!("svc: spool drain: {e}");
                return ExitCode::from(1);
            }
        }
    }
    match drainer.run_until_empty(DRAIN_ATTEMPTS) {
        Ok(n) => {
            let put = drainer.checkpoints_put();
            let checkpoints = match put {
                0 => String::new(),
                n => format!(", {n} custody checkpoints put into its checkpoint store"),
            };
            say!(
                "Spool {}: {n} records delivered to sink {}{checkpoints} ({before} frames were \
                 waiting); empty.",
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

fn status(spool_cfg: &SpoolConfig, json: bool) -> ExitCode {
    match scan::walk(&spool_cfg.dir, |_| true) {
        Ok(s) if json => {
            say!("{}", terminal::json_line(&status_json(spool_cfg, &s)));
            ExitCode::SUCCESS
        }
        Ok(s) => {
            let age = s
                .oldest_ms
                .map(|ms| (now_epoch_seconds() - ms as f64 / 1000.0).max(0.0));
            say!(
                "spool: {}",
                terminal::text_line(&spool_cfg.dir.display().to_string())
            );
            say!("records: {}", s.records);
            say!("checkpoints: {}", s.checkpoints);
            say!("bytes: {} (max {})", s.bytes, spool_cfg.max_bytes);
            say!("segments: {}", s.segments);
            match age {
                Some(a) => say!("oldest_record_age_seconds: {a:.1}"),
                None => say!("oldest_record_age_seconds: none"),
            }
            say!("quarantined_files: {}", s.quarantine_files);
            say!("damaged_not_yet_quarantined: {}", s.damaged);
            say!("rejected_files: {}", s.rejected_files);
            say!("rejected_records: {}", s.rejected_records);
            say!("set_aside_records: {}", s.set_aside);
            say!(
                "drain_position: segment {} offset {}",
                s.position.segment,
                s.position.offset
            );
            // File names are shown escaped: anything may have been put in the directory.
            for (name, records) in &s.rejected {
                say!(
                    "rejected_file: {} ({records} records)",
                    terminal::text_line(name)
                );
            }
            for (name, bytes) in &s.quarantined {
                say!(
                    "quarantined_file: {} ({bytes} bytes)",
                    terminal::text_line(name)
                );
            }
            for d in &s.damage {
                say!(
                    "damaged: segment {} offset {} ({} bytes, not yet quarantined)",
                    d.segment,
                    d.offset,
                    d.bytes
                );
            }
            let listed = s.rejected.len() + s.quarantined.len() + s.damage.len();
            let all = s.rejected_files + s.quarantine_files + s.damaged;
            if (listed as u64) < all {
                say!(
                    "(listed {listed} of {all}; the first {} of each kind)",
                    scan::LISTED
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("svc: {e}");
            ExitCode::from(1)
        }
    }
}

/// `svc spool status --json`: what the text says, as one JSON object, escaped as inspect's
/// lines are.
fn status_json(spool_cfg: &SpoolConfig, s: &scan::Survey) -> serde_json::Value {
    use serde_json::json;
    let age = s
        .oldest_ms
        .map(|ms| (now_epoch_seconds() - ms as f64 / 1000.0).max(0.0));
    let rejected: Vec<_> = s
        .rejected
        .iter()
        .map(|(file, records)| json!({"file": file, "records": records}))
        .collect();
    let quarantined: Vec<_> = s
        .quarantined
        .iter()
        .map(|(file, bytes)| json!({"file": file, "bytes": bytes}))
        .collect();
    let damaged: Vec<_> = s
        .damage
        .iter()
        .map(|d| json!({"segment": d.segment, "offset": d.offset, "bytes": d.bytes}))
        .collect();
    json!({
        "spool": spool_cfg.dir.display().to_string(),
        "records": s.records,
        "checkpoints": s.checkpoints,
        "bytes": s.bytes,
        "max_bytes": spool_cfg.max_bytes,
        "segments": s.segments,
        "oldest_record_age_seconds": age,
        "quarantined_files": s.quarantine_files,
        "damaged_not_yet_quarantined": s.damaged,
        "rejected_files": s.rejected_files,
        "rejected_records": s.rejected_records,
        "set_aside_records": s.set_aside,
        "drain_position": {"segment": s.position.segment, "offset": s.position.offset},
        "rejected": rejected,
        "quarantined": quarantined,
        "damaged": damaged,
        "listed_at_most": scan::LISTED,
    })
}

/// Streams one line per record as the walk meets it: memory stays at one segment's bytes,
/// whatever the spool holds (collecting the lines first took 84 MiB for a 512 MiB spool).
/// Waiting records first (`"state": "waiting"`), then the records of rejected files
/// (`"rejected"`), then a line per quarantine file (`"quarantined"`) and per damaged stretch
/// not yet quarantined (`"damaged"`), then one `"summary"` line with the counts.
fn inspect(spool_cfg: &SpoolConfig, target: &SinkConfig, payload: bool) -> ExitCode {
    use std::io::Write;
    let crypt = match reader_crypt(spool_cfg) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("svc: {e}");
            return ExitCode::from(1);
        }
    };
    let mut opener = Opener::new(Arc::new(crypt));
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut failed: Option<std::io::Error> = None;
    let result = scan::walk(&spool_cfg.dir, |seen: Seen<'_>| {
        match writeln!(out, "{}", describe(&seen, &mut opener, target, payload)) {
            Ok(()) => true,
            Err(e) => {
                failed = Some(e);
                false
            }
        }
    });
    if let (Ok(s), None) = (&result, &failed) {
        for line in inventory(s) {
            if let Err(e) = writeln!(out, "{}", terminal::json_line(&line)) {
                failed = Some(e);
                break;
            }
        }
    }
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

/// The keys of a spool and its identity (its `meta` file, read without the lock: only read),
/// to open its records as the drain would.
fn reader_crypt(spool_cfg: &SpoolConfig) -> Result<Crypt, String> {
    let dir = &spool_cfg.dir;
    let mut crypt = Crypt::load(spool_cfg.encryption.as_ref(), spool_cfg.allow_unencrypted)
        .map_err(|e| format!("spool {}: {e}", dir.display()))?;
    let fd = fs_dir::open_dir(dir, false).map_err(|e| e.to_string())?;
    let stored = meta::read(&fd, dir).map_err(|e| e.to_string())?;
    crypt
        .bind_stored(stored.as_ref())
        .map_err(|e| fs_dir::fail(dir, meta::NAME, e).to_string())?;
    Ok(crypt)
}

/// The lines after the records: quarantine files, damage not yet quarantined, the counts.
fn inventory(s: &scan::Survey) -> Vec<serde_json::Value> {
    use serde_json::json;
    let mut lines: Vec<serde_json::Value> = s
        .quarantined
        .iter()
        .map(|(name, bytes)| json!({"state": "quarantined", "file": name, "bytes": bytes}))
        .collect();
    lines.extend(s.damage.iter().map(
        |d| json!({"state": "damaged", "segment": d.segment, "offset": d.offset, "bytes": d.bytes}),
    ));
    lines.push(json!({
        "state": "summary",
        "records": s.records,
        "checkpoints": s.checkpoints,
        "rejected_files": s.rejected_files,
        "rejected_records": s.rejected_records,
        "set_aside_records": s.set_aside,
        "quarantined_files": s.quarantine_files,
        "damaged_not_yet_quarantined": s.damaged,
    }));
    lines
}

/// Characters of one string of a record shown at most (a subject, a message id, a string in
/// the payload): no line of `svc spool inspect` grows with what a publisher sent.
const SHOWN_STRING_CHARS: usize = 1024;

/// One JSON line per record: where it is and its headers; the payload only when asked; for a
/// waiting record the sink would refuse for good (the HTTP sink's `max_request_bytes`), why.
fn describe(seen: &Seen<'_>, opener: &mut Opener, target: &SinkConfig, payload: bool) -> String {
    let mut doc = serde_json::json!({
        "state": if seen.rejected_in.is_some() { "rejected" } else { "waiting" },
        "segment": seen.segment,
        "offset": seen.offset,
        "bytes": seen.body.len(),
        "appended_unix_ms": codec::appended_unix_ms(seen.body),
    });
    if let Some(file) = seen.rejected_in {
        doc["file"] = file.into();
    }
    // Reported by its id (a key is never shown); a record under a key id not configured is
    // listed and left where it is.
    if let Some(key_id) = seal::key_id(seen.body) {
        doc["key_id"] = key_id.into();
    }
    let mut opened = Vec::new();
    let plain = match opener.open(seen.place, seen.body, &mut opened) {
        Ok(Opened::Clear) => seen.body,
        Ok(Opened::Sealed(r)) => &opened[r],
        Err(why) => {
            doc["unreadable"] = why.to_string().into();
            terminal::bound_strings(&mut doc, SHOWN_STRING_CHARS);
            return terminal::json_line(&doc);
        }
    };
    if codec::is_checkpoint(plain) {
        // A custody checkpoint frame (`sink.type` spool): named, its text not shown.
        doc["kind"] = "checkpoint".into();
        match codec::decode_checkpoint(plain) {
            Ok(c) => {
                doc["runner_id"] = c.runner_id.into();
                doc["checkpoint_index"] = c.index.into();
                doc["checkpoint_bytes"] = c.bytes.len().into();
            }
            Err(why) => doc["unreadable"] = why.into(),
        }
        terminal::bound_strings(&mut doc, SHOWN_STRING_CHARS);
        return terminal::json_line(&doc);
    }
    match codec::decode(plain) {
        Ok(env) => {
            doc["stream"] = env.stream.as_ref().into();
            doc["stream_sequence"] = env.stream_sequence.into();
            doc["subject"] = env.subject.clone().into();
            doc["message_id"] = env.message_id.clone().into();
            doc["received_at"] = env.metadata.received_at.as_str().into();
            doc["payload_bytes"] = env.payload_info.size_bytes.into();
            if seen.rejected_in.is_none() {
                if let Some(why) = target.refuses_for_good(&env) {
                    doc["sink_refuses"] = why.into();
                }
            }
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
