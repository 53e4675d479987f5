//! `svc dlq list|show|redrive <config>`: a look at the dead-letter stream, and bringing its
//! records home (`redrive`: the engine is `pipeline::replay::redrive`; docs/replay.md). `list` reads its
//! records through an ephemeral consumer of its own (as `svc inspect` reads the source stream:
//! nothing acknowledged, nothing deleted) and counts them by stage and reason and by original
//! subject, with the oldest and newest; `show SEQ` prints one record, read back by its
//! sequence. What the records hold was written by publishers' messages (subjects, header
//! values): everything printed passes the terminal rule (`text::terminal`), and the counts by
//! subject are bounded.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::output;
use crate::broker::dead_letter::{self, DeadLetterPublisher};
use crate::broker::inspect::{self, Request, Start};
use crate::broker::Connection;
use crate::config::RuntimeConfig;
use crate::message::subject::SubjectPattern;
use crate::text::rfc3339::parse_rfc3339_nanos;
use crate::text::terminal;

/// Most records one `list` reads.
pub const MAX_RECORDS: u64 = 1_000_000;
/// Distinct original subjects counted one by one; the rest are counted together.
const MAX_SUBJECTS: usize = 1_000;
/// Distinct `stage/reason` pairs counted one by one; the rest are counted together.
const MAX_REASONS: usize = 1_000;
/// Longest reason, subject or time kept from a record (publishers' text): longer ones are cut
/// and marked, so forged records cannot make the tally hold them whole.
const MAX_KEY_CHARS: usize = 256;
/// Exit status of a `list` whose counts are partial (`--max` reached with records left, the
/// broker silent for `--timeout`, or deliveries skipped): the counts are printed, stderr says
/// why.
pub const EXIT_PARTIAL: u8 = 3;
/// Subjects shown in the text format (the JSON carries every one counted).
const TEXT_SUBJECTS: usize = 20;
/// Longest `--timeout`.
const MAX_TIMEOUT_SECONDS: u64 = 300;

/// Which records `list` counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub stage: Option<String>,
    pub reason: Option<String>,
    /// A pattern the original subject must match.
    pub subject: Option<String>,
    /// Records stored at or after this time (Unix nanoseconds).
    pub since: Option<i128>,
}

/// `svc dlq redrive`'s own flags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redrive {
    pub sink: Option<PathBuf>,
    /// `--fanout-child NAME`: into that child of the configured fan-out sink only.
    pub fanout_child: Option<String>,
    pub state: Option<PathBuf>,
    pub resume: bool,
    pub dry_run: bool,
    pub max_rate: Option<u32>,
}

/// A parsed `svc dlq` command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub config: PathBuf,
    /// `show`: the record's sequence in the dead-letter stream; `list`: `None`.
    pub show: Option<u64>,
    /// `redrive`: its flags; `list`, `show`: `None`.
    pub redrive: Option<Redrive>,
    pub filter: Filter,
    pub max: u64,
    pub timeout: Duration,
    pub json: bool,
}

/// Parses what follows `dlq` (lexopt hands its parser on); `None`: help was asked for.
pub fn parse(p: &mut lexopt::Parser) -> Result<Option<Options>, lexopt::Error> {
    use lexopt::prelude::*;
    let mut action: Option<String> = None;
    let mut config = None;
    let mut seq = None;
    let mut filter = Filter::default();
    let mut redrive = Redrive::default();
    let (mut max, mut timeout_s, mut json) = (MAX_RECORDS, 5, false);
    let number =
        |v: std::ffi::OsString, flag: &str, lo: u64, hi: u64| match v.string()?.parse::<u64>() {
            Ok(n) if (lo..=hi).contains(&n) => Ok(n),
            _ => Err(lexopt::Error::from(format!(
                "{flag} must be an integer from {lo} to {hi}"
            ))),
        };
    while let Some(arg) = p.next()? {
        match arg {
            Long("stage") | Long("class") => filter.stage = Some(p.value()?.string()?),
            Long("sink") => redrive.sink = Some(PathBuf::from(p.value()?)),
            Long("fanout-child") => redrive.fanout_child = Some(p.value()?.string()?),
            Long("state") => redrive.state = Some(PathBuf::from(p.value()?)),
            Long("resume") => redrive.resume = true,
            Long("dry-run") => redrive.dry_run = true,
            Long("max-rate") => {
                redrive.max_rate = Some(number(p.value()?, "--max-rate", 1, 1_000_000)? as u32)
            }
            Long("reason") => filter.reason = Some(p.value()?.string()?),
            Long("subject") => {
                let s = p.value()?.string()?;
                SubjectPattern::parse(&s).map_err(|e| format!("--subject: {e}"))?;
                filter.subject = Some(s);
            }
            Long("since") => {
                let text = p.value()?.string()?;
                let nanos = parse_rfc3339_nanos(&text)
                    .ok_or("--since must be an RFC 3339 time, e.g. 2026-11-26T14:00:00Z")?;
                if !crate::broker::config::is_broker_time(nanos) {
                    let why = crate::broker::config::BROKER_TIME_RANGE;
                    return Err(format!("--since {why}").into());
                }
                filter.since = Some(nanos);
            }
            Long("max") => max = number(p.value()?, "--max", 1, MAX_RECORDS)?,
            Long("timeout") => timeout_s = number(p.value()?, "--timeout", 1, MAX_TIMEOUT_SECONDS)?,
            Long("format") => {
                json = match p.value()?.string()?.as_str() {
                    "text" => false,
                    "json" => true,
                    _ => return Err("--format must be text or json".into()),
                }
            }
            Short('h') | Long("help") => return Ok(None),
            Value(v) if action.is_none() => action = Some(v.string()?),
            Value(v) if config.is_none() => config = Some(PathBuf::from(v)),
            Value(v) if action.as_deref() == Some("show") && seq.is_none() => {
                seq = Some(number(v, "show: <sequence>", 1, u64::MAX)?)
            }
            _ => return Err(arg.unexpected()),
        }
    }
    let show = match action.as_deref() {
        Some("list") | Some("redrive") => None,
        Some("show") => Some(seq.ok_or("dlq show: missing <sequence>")?),
        Some(other) => {
            let shown = crate::text::terminal::text_line(other);
            return Err(format!("dlq: unknown action \"{shown}\": list, show or redrive").into());
        }
        None => return Err("dlq: missing action: list, show or redrive".into()),
    };
    let redriving = action.as_deref() == Some("redrive");
    if !redriving && redrive != Redrive::default() {
        return Err(
            "dlq: --sink, --fanout-child, --state, --resume, --dry-run and --max-rate are \
             redrive's"
                .into(),
        );
    }
    if redriving && (max != MAX_RECORDS || json) {
        return Err("dlq redrive: --max and --format are list's".into());
    }
    if redrive.sink.is_some() && redrive.fanout_child.is_some() {
        return Err("dlq redrive: give at most one of --sink, --fanout-child".into());
    }
    if redrive.resume && redrive.dry_run {
        return Err("--dry-run writes no state: it cannot --resume".into());
    }
    let listing_only = filter != Filter::default() || max != MAX_RECORDS;
    if show.is_some() && listing_only {
        return Err("dlq show: --stage, --reason, --subject, --since and --max are list's".into());
    }
    Ok(Some(Options {
        config: config.ok_or("dlq: missing <config_file>")?,
        show,
        redrive: redriving.then_some(redrive),
        filter,
        max,
        timeout: Duration::from_secs(timeout_s),
        json,
    }))
}

/// Runs `svc dlq`: exit 0 after reading, 1 on a broker failure or a record not found, 2 on
/// invalid input (`dead_letter` not enabled).
pub fn run(cfg: &RuntimeConfig, opts: &Options) -> ExitCode {
    if !cfg.dead_letter.enabled {
        eprintln!("svc: dlq: dead_letter.enabled is false in this configuration");
        return ExitCode::from(2);
    }
    if let Some(flags) = &opts.redrive {
        return redrive(cfg, opts, flags);
    }
    let metrics = Arc::new(crate::metrics::Metrics::default());
    let denials = Arc::new(crate::broker::Denials::default());
    let nc = match crate::broker::connect_within(&cfg.nats, metrics, denials, opts.timeout) {
        Ok(nc) => nc,
        Err(e) => {
            eprintln!("svc: {}", crate::text::error_chain(&e));
            return ExitCode::from(1);
        }
    };
    let stream = match dlq_stream(&nc, cfg) {
        Ok(s) => s,
        Err(why) => {
            eprintln!("svc: dlq: {why}");
            return ExitCode::from(1);
        }
    };
    let shown = match opts.show {
        Some(seq) => show(&nc, &stream, &cfg.dead_letter.subject, seq, opts).map(|l| (l, None)),
        None => list(&nc, &stream, &cfg.dead_letter.subject, opts),
    };
    match shown {
        Ok((lines, partial)) => {
            let mut out = std::io::stdout().lock();
            for line in lines {
                if let Err(e) = writeln!(out, "{line}") {
                    return output::write_failed(&e);
                }
            }
            match partial {
                Some(why) => {
                    eprintln!("svc: dlq list: the counts are partial: {why}");
                    ExitCode::from(EXIT_PARTIAL)
                }
                None => ExitCode::SUCCESS,
            }
        }
        Err(why) => {
            eprintln!("svc: dlq: {why}");
            ExitCode::from(1)
        }
    }
}

/// Runs `svc dlq redrive`: exit 0 when every selected record was settled and removed, 3 when
/// some were refused again (dead-lettered anew) or kept (original missing, invalid), 4 when
/// stopped by a signal (`--resume` continues), 1 on a failure, 2 on invalid input.
fn redrive(cfg: &RuntimeConfig, opts: &Options, flags: &Redrive) -> ExitCode {
    use crate::pipeline::replay::{self, redrive, state::RangeKey, Finish};
    let cfg = match &flags.sink {
        Some(path) => match super::replay::with_sink(&opts.config, path) {
            Ok(c) => c,
            Err(why) => {
                eprintln!("svc: dlq redrive: --sink {}: {why}", path.display());
                return ExitCode::from(2);
            }
        },
        None => cfg.clone(),
    };
    let cfg = match &flags.fanout_child {
        Some(name) => match super::replay::fanout_child(cfg, name) {
            Ok(c) => c,
            Err(why) => {
                eprintln!(
                    "svc: dlq redrive: --fanout-child {}: {why}",
                    terminal::text_line(name)
                );
                return ExitCode::from(2);
            }
        },
        None => cfg,
    };
    let metrics = Arc::new(crate::metrics::Metrics::default());
    let denials = Arc::new(crate::broker::Denials::default());
    let stream = match crate::broker::connect_within(&cfg.nats, metrics, denials, opts.timeout)
        .map_err(|e| crate::text::error_chain(&e))
        .and_then(|nc| dlq_stream(&nc, &cfg))
    {
        Ok(s) => s,
        Err(why) => {
            eprintln!("svc: dlq redrive: {why}");
            return ExitCode::from(1);
        }
    };
    let filter = redrive::Filter {
        reason: opts.filter.reason.clone(),
        class: opts.filter.stage.clone(),
        subject: opts
            .filter
            .subject
            .as_deref()
            .and_then(|s| SubjectPattern::parse(s).ok()),
    };
    let absolute = |p: &std::path::Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let range = RangeKey {
        config: absolute(&opts.config).display().to_string(),
        stream: stream.clone(),
        subjects: vec![cfg.dead_letter.subject.clone()],
        sink: match (&flags.sink, &flags.fanout_child) {
            (Some(s), _) => absolute(s).display().to_string(),
            (None, Some(child)) => format!("fanout child {child}"),
            (None, None) => "configured".into(),
        },
        start_seq: None,
        end_seq: None,
        since: opts.filter.since,
        until: None,
        filter: Some(filter.key()),
        incarnation: String::new(),
        shape: replay::state::shape_digest(&cfg),
    };
    let state = flags.state.clone().unwrap_or_else(|| {
        let mut name = opts.config.file_name().unwrap_or_default().to_os_string();
        name.push(".redrive-state");
        opts.config.with_file_name(name)
    });
    let engine = redrive::Options {
        replay: replay::Options {
            range,
            state: state.clone(),
            resume: flags.resume,
            dry_run: flags.dry_run,
            removes_settled: true,
            max_rate: flags.max_rate,
            // Each broker request and the wait for each record (`--timeout`, 5 s by default).
            timeout: opts.timeout,
        },
        dead_letter_stream: stream,
        filter,
    };
    let (counts, finish) = match redrive::run(cfg, &engine) {
        Ok(report) => (report.counts, Ok(report.finish)),
        Err(failed) => (failed.counts, Err(failed.error)),
    };
    if let Err(e) = redrive_summary(&counts, flags.dry_run) {
        return output::write_failed(&e);
    }
    match finish {
        Err(error) => {
            eprintln!("svc: dlq redrive: {error}");
            ExitCode::from(1)
        }
        Ok(Finish::Interrupted) => {
            eprintln!(
                "svc: dlq redrive: stopped by a signal; `svc dlq redrive {} ... --resume` \
                 continues (state: {})",
                opts.config.display(),
                state.display()
            );
            ExitCode::from(super::replay::EXIT_INTERRUPTED)
        }
        Ok(Finish::Done) if counts.refused() + counts.original_missing + counts.kept > 0 => {
            ExitCode::from(super::replay::EXIT_REFUSALS)
        }
        Ok(Finish::Done) => ExitCode::SUCCESS,
    }
}

/// The redrive's summary line (standard output).
fn redrive_summary(
    c: &crate::pipeline::replay::state::Counts,
    dry_run: bool,
) -> std::io::Result<()> {
    let line = c.summary_line(true, dry_run);
    output::print(format_args!("{line}\n"))
}

/// The one stream that captures the dead-letter subject.
fn dlq_stream(nc: &Connection, cfg: &RuntimeConfig) -> Result<String, String> {
    let publisher = DeadLetterPublisher::new(nc.clone(), cfg.dead_letter.clone());
    let streams = publisher.capturing_streams().map_err(|e| e.to_string())?;
    match streams.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(format!(
            "no stream captures the dead-letter subject {}",
            cfg.dead_letter.subject
        )),
        many => Err(format!(
            "{} streams capture the dead-letter subject {}",
            many.len(),
            cfg.dead_letter.subject
        )),
    }
}

/// `dlq show SEQ`: the record as stored, one JSON document (pretty in the text format).
fn show(
    nc: &Connection,
    stream: &str,
    subject: &str,
    seq: u64,
    opts: &Options,
) -> Result<Vec<String>, String> {
    let stored = dead_letter::read_back(nc, stream, seq, opts.timeout)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("stream {stream} holds no message at sequence {seq}"))?;
    // The stream may hold other subjects too: only a record on the dead-letter subject is one.
    if stored.subject != subject {
        return Err(format!(
            "{stream} sequence {seq} is not on the dead-letter subject {subject} (its subject: \"{}\")",
            crate::text::peer::PeerText::new(&stored.subject)
        ));
    }
    let record: Value = serde_json::from_slice(&stored.data)
        .ok()
        .filter(|r: &Value| r["schema"] == "svc.dead-letter.v1")
        .ok_or_else(|| format!("{stream} sequence {seq} is not a svc.dead-letter.v1 record"))?;
    let v = json!({"stream": stream, "sequence": seq, "subject": stored.subject,
                   "record": record});
    if opts.json {
        return Ok(vec![terminal::json_line(&v)]);
    }
    let pretty = serde_json::to_string_pretty(&v).unwrap_or_default();
    Ok(pretty
        .lines()
        .map(|l| terminal::text_line(l).into_owned())
        .collect())
}

/// `dlq list`: the counts of the records `opts.filter` selects, and why they are partial when
/// they are.
fn list(
    nc: &Connection,
    stream: &str,
    subject: &str,
    opts: &Options,
) -> Result<(Vec<String>, Option<String>), String> {
    let req = Request {
        stream: stream.to_string(),
        subjects: vec![subject.to_string()],
        start: opts.filter.since.map_or(Start::Sequence(1), Start::Since),
        max: opts.max,
        timeout: opts.timeout,
    };
    let subject_pattern = opts
        .filter
        .subject
        .as_deref()
        .and_then(|s| SubjectPattern::parse(s).ok());
    let mut tally = Tally::default();
    let mut left = 0;
    let (read, ended) = inspect::read_while(nc, &req, "svc dlq list", None, |raw, pending| {
        left = pending;
        tally.add(
            raw.stream_sequence,
            &raw.data,
            &opts.filter,
            subject_pattern.as_ref(),
        );
        true
    })
    .map_err(|e| crate::text::error_chain(&e))?;
    let partial = match ended {
        inspect::Ended::Max if left > 0 => Some(format!(
            "--max {} reached with {left} more messages on the dead-letter subject not read",
            opts.max
        )),
        inspect::Ended::TimedOut { pending } => Some(format!(
            "nothing arrived for {} s after {read} messages, with {pending} still pending",
            opts.timeout.as_secs()
        )),
        inspect::Ended::Gap { expected, got } => Some(format!(
            "deliveries {expected} to {} were skipped by the client after {read} messages",
            got.saturating_sub(1)
        )),
        _ => None,
    };
    let v = tally.to_json(stream);
    let lines = if opts.json {
        vec![terminal::json_line(&v)]
    } else {
        tally.text(stream)
    };
    Ok((lines, partial))
}

/// `text` cut at [`MAX_KEY_CHARS`] characters, marked when cut.
fn bounded(text: &str) -> String {
    match text.char_indices().nth(MAX_KEY_CHARS) {
        Some((end, _)) => format!("{}...(cut)", &text[..end]),
        None => text.to_string(),
    }
}

/// Counts `key` in `map` when it is there or the map holds fewer than `most` keys; false when
/// it is counted nowhere (the caller counts it among the others).
fn count_in(map: &mut BTreeMap<String, u64>, key: String, most: usize) -> bool {
    if let Some(n) = map.get_mut(&key) {
        *n += 1;
    } else if map.len() < most {
        map.insert(key, 1);
    } else {
        return false;
    }
    true
}

/// A record's place: its sequence in the dead-letter stream and when it failed.
#[derive(Debug, Clone, Default, PartialEq)]
struct Seen {
    sequence: u64,
    failed_at: String,
}

/// The counts of one `list`.
#[derive(Debug, Default)]
struct Tally {
    records: u64,
    /// Messages on the subject that are not dead-letter records.
    not_records: u64,
    by_reason: BTreeMap<String, u64>,
    /// Records whose `stage/reason` came after [`MAX_REASONS`] distinct ones.
    other_reasons: u64,
    by_subject: BTreeMap<String, u64>,
    /// Records whose subject came after [`MAX_SUBJECTS`] distinct ones.
    other_subjects: u64,
    oldest: Option<Seen>,
    newest: Option<Seen>,
}

impl Tally {
    fn add(&mut self, seq: u64, data: &[u8], f: &Filter, pattern: Option<&SubjectPattern>) {
        let Some(r) = serde_json::from_slice::<Value>(data)
            .ok()
            .filter(|r| r["schema"] == "svc.dead-letter.v1")
        else {
            self.not_records += 1;
            return;
        };
        let raw = |v: &Value| v.as_str().unwrap_or("?").to_string();
        let text = |v: &Value| bounded(v.as_str().unwrap_or("?"));
        let (stage, reason) = (raw(&r["failure"]["stage"]), raw(&r["failure"]["reason"]));
        let subject = raw(&r["original"]["subject"]);
        // The filter sees the whole values, as `dlq redrive`'s does; only the tally cuts them.
        let wanted = f.stage.as_ref().is_none_or(|s| *s == stage)
            && f.reason.as_ref().is_none_or(|s| *s == reason)
            && pattern.is_none_or(|p| p.matches(&subject));
        if !wanted {
            return;
        }
        let (stage, reason, subject) = (bounded(&stage), bounded(&reason), bounded(&subject));
        self.records += 1;
        if !count_in(
            &mut self.by_reason,
            format!("{stage}/{reason}"),
            MAX_REASONS,
        ) {
            self.other_reasons += 1;
        }
        if !count_in(&mut self.by_subject, subject, MAX_SUBJECTS) {
            self.other_subjects += 1;
        }
        let seen = Seen {
            sequence: seq,
            failed_at: text(&r["failed_at"]),
        };
        self.oldest.get_or_insert_with(|| seen.clone());
        self.newest = Some(seen);
    }

    fn to_json(&self, stream: &str) -> Value {
        let seen = |s: &Option<Seen>| {
            s.as_ref()
                .map(|s| json!({"sequence": s.sequence, "failed_at": s.failed_at}))
        };
        json!({"stream": stream, "records": self.records, "not_records": self.not_records,
               "oldest": seen(&self.oldest), "newest": seen(&self.newest),
               "by_reason": self.by_reason, "other_reasons": self.other_reasons,
               "by_subject": self.by_subject,
               "other_subjects": self.other_subjects})
    }

    fn text(&self, stream: &str) -> Vec<String> {
        let mut lines = vec![format!(
            "dead-letter stream {stream}: {} records",
            self.records
        )];
        if self.not_records > 0 {
            lines.push(format!(
                "  ({} messages on the subject are not dead-letter records)",
                self.not_records
            ));
        }
        for (what, s) in [("oldest", &self.oldest), ("newest", &self.newest)] {
            if let Some(s) = s {
                lines.push(format!(
                    "{what}: sequence {}, failed at {}",
                    s.sequence, s.failed_at
                ));
            }
        }
        lines.push("by stage/reason:".into());
        let mut reasons: Vec<_> = self.by_reason.iter().collect();
        reasons.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        lines.extend(reasons.iter().map(|(r, n)| format!("  {n:>9}  {r}")));
        if self.other_reasons > 0 {
            lines.push(format!("  {:>9}  (other reasons)", self.other_reasons));
        }
        lines.push(format!("by original subject (first {TEXT_SUBJECTS}):"));
        let mut subjects: Vec<_> = self.by_subject.iter().collect();
        subjects.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        lines.extend(
            subjects
                .iter()
                .take(TEXT_SUBJECTS)
                .map(|(s, n)| format!("  {n:>9}  {s}")),
        );
        if subjects.len() > TEXT_SUBJECTS || self.other_subjects > 0 {
            let rest: u64 = subjects.iter().skip(TEXT_SUBJECTS).map(|(_, n)| **n).sum();
            lines.push(format!(
                "  {:>9}  (other subjects)",
                rest + self.other_subjects
            ));
        }
        lines
            .into_iter()
            .map(|l| terminal::text_line(&l).into_owned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(stage: &str, reason: &str, subject: &str, at: &str) -> Vec<u8> {
        json!({"schema": "svc.dead-letter.v1", "failed_at": at,
               "failure": {"stage": stage, "reason": reason},
               "original": {"subject": subject}})
        .to_string()
        .into_bytes()
    }

    #[test]
    fn records_are_counted_by_reason_and_subject_within_the_filter() {
        let mut t = Tally::default();
        let f = Filter::default();
        t.add(1, &record("sink", "too_large", "a.b", "t1"), &f, None);
        t.add(
            2,
            &record("security_labels", "missing", "a.c", "t2"),
            &f,
            None,
        );
        t.add(3, &record("sink", "too_large", "a.b", "t3"), &f, None);
        t.add(4, b"not json", &f, None);
        let v = t.to_json("DLQ");
        assert_eq!(v["records"], 3);
        assert_eq!(v["not_records"], 1);
        assert_eq!(v["by_reason"]["sink/too_large"], 2);
        assert_eq!(v["by_subject"]["a.b"], 2);
        assert_eq!(v["oldest"]["sequence"], 1);
        assert_eq!(v["newest"]["failed_at"], "t3");

        let mut only = Tally::default();
        let f = Filter {
            stage: Some("sink".into()),
            ..Filter::default()
        };
        let p = SubjectPattern::parse("a.*").unwrap();
        only.add(1, &record("sink", "too_large", "a.b", "t1"), &f, Some(&p));
        only.add(
            2,
            &record("security_labels", "x", "a.b", "t2"),
            &f,
            Some(&p),
        );
        only.add(3, &record("sink", "too_large", "b.b", "t3"), &f, Some(&p));
        assert_eq!(only.records, 1);
    }

    #[test]
    fn subjects_past_the_bound_are_counted_together_and_text_is_escaped() {
        let mut t = Tally::default();
        let f = Filter::default();
        for i in 0..MAX_SUBJECTS + 5 {
            t.add(
                i as u64,
                &record("s", "r", &format!("x.{i}"), "t"),
                &f,
                None,
            );
        }
        t.add(9, &record("s", "r\u{1b}[2J", "x.0", "t"), &f, None);
        assert_eq!(t.by_subject.len(), MAX_SUBJECTS);
        assert_eq!(t.other_subjects, 5);
        let text = t.text("DLQ").join("\n");
        assert!(!text.contains('\u{1b}'), "{text}");
        assert!(text.contains("(other subjects)"), "{text}");
    }

    #[test]
    fn show_takes_a_sequence_and_no_list_options() {
        let parse = |args: &[&str]| {
            let mut p = lexopt::Parser::from_args(args.iter().copied());
            parse(&mut p).map_err(|e| e.to_string())
        };
        let o = parse(&["show", "c.json", "42"]).unwrap().unwrap();
        assert_eq!(o.show, Some(42));
        assert!(parse(&["show", "c.json"])
            .unwrap_err()
            .contains("<sequence>"));
        assert!(parse(&["show", "c.json", "4", "--reason", "x"])
            .unwrap_err()
            .contains("list's"));
        assert!(parse(&["list", "c.json", "--max", "0"])
            .unwrap_err()
            .contains("--max must be"));
        assert!(parse(&["purge", "c.json"])
            .unwrap_err()
            .contains("list, show or redrive"));
        let o = parse(&[
            "redrive",
            "c.json",
            "--class",
            "sink",
            "--dry-run",
            "--max-rate",
            "5",
        ])
        .unwrap()
        .unwrap();
        let flags = o.redrive.unwrap();
        assert!(flags.dry_run && flags.max_rate == Some(5));
        assert_eq!(o.filter.stage.as_deref(), Some("sink"));
        for (args, needle) in [
            (&["list", "c.json", "--dry-run"][..], "redrive's"),
            (&["redrive", "c.json", "--format", "json"], "list's"),
            (
                &["redrive", "c.json", "--dry-run", "--resume"],
                "cannot --resume",
            ),
            (
                &["redrive", "c.json", "--max-rate", "0"],
                "--max-rate must be",
            ),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
        let o = parse(&[
            "list",
            "c.json",
            "--subject",
            "orders.*",
            "--format",
            "json",
        ])
        .unwrap()
        .unwrap();
        assert!(o.json && o.show.is_none());
    }
}
