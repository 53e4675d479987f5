//! `svc stream-plan <config>`: what the broker must hold for this configuration (stream,
//! durable consumer, dead-letter stream, the runner user's permissions), printed offline as
//! text or JSON; with `--apply`, created where missing.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use nats::jetstream::{DiscardPolicy, RetentionPolicy, StorageType};

use super::output;
use super::plan::{self, Plan, StreamSettings};
use super::plan_apply::{self, Outcome};
use crate::config::{ConsumerMode, RuntimeConfig};

/// Most replicas JetStream allows.
const MAX_REPLICAS: u64 = 5;

/// `svc stream-plan` options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub config: PathBuf,
    pub settings: StreamSettings,
    pub json: bool,
    /// The user name shown in the `authorization` block.
    pub user: String,
    pub apply: bool,
}

/// Parses what follows `stream-plan` (lexopt hands its parser on); `None`: help was asked for.
pub fn parse(p: &mut lexopt::Parser) -> Result<Option<Options>, lexopt::Error> {
    use lexopt::prelude::*;
    let mut config = None;
    let mut s = StreamSettings::default();
    let (mut json, mut apply, mut user) = (false, false, "svc".to_string());
    while let Some(arg) = p.next()? {
        match arg {
            Long("storage") => {
                s.storage = match p.value()?.string()?.as_str() {
                    "file" => StorageType::File,
                    "memory" => StorageType::Memory,
                    _ => return Err("--storage must be file or memory".into()),
                }
            }
            Long("replicas") => {
                let v = p.value()?.string()?;
                s.replicas = match v.parse::<u64>() {
                    Ok(n) if (1..=MAX_REPLICAS).contains(&n) => n as usize,
                    _ => return Err(format!("--replicas must be 1 to {MAX_REPLICAS}").into()),
                }
            }
            Long("retention") => {
                s.retention = match p.value()?.string()?.as_str() {
                    "limits" => RetentionPolicy::Limits,
                    "interest" => RetentionPolicy::Interest,
                    "workqueue" => RetentionPolicy::WorkQueue,
                    _ => return Err("--retention must be limits, interest or workqueue".into()),
                }
            }
            Long("discard") => {
                s.discard = match p.value()?.string()?.as_str() {
                    "old" => DiscardPolicy::Old,
                    "new" => DiscardPolicy::New,
                    _ => return Err("--discard must be old or new".into()),
                }
            }
            Long("duplicate-window") => {
                s.duplicate_window = duration(&p.value()?.string()?, "--duplicate-window")?
                    .ok_or("--duplicate-window cannot be unlimited")?
            }
            Long("max-age") => {
                s.max_age = duration(&p.value()?.string()?, "--max-age")?.unwrap_or_default()
            }
            Long("max-bytes") => s.max_bytes = bytes(&p.value()?.string()?)?,
            Long("max-msgs") => s.max_msgs = count(&p.value()?.string()?, "--max-msgs")?,
            Long("dlq-stream") => {
                let name = p.value()?.string()?;
                if !crate::broker::config::is_broker_name(&name) {
                    return Err("--dlq-stream must be 1 to 64 characters of A-Z a-z 0-9 _ -".into());
                }
                s.dead_letter_stream = Some(name)
            }
            Long("user") => user = p.value()?.string()?,
            Long("format") => {
                json = match p.value()?.string()?.as_str() {
                    "text" => false,
                    "json" => true,
                    _ => return Err("--format must be text or json".into()),
                }
            }
            Long("apply") => apply = true,
            Short('h') | Long("help") => return Ok(None),
            Value(v) if config.is_none() => config = Some(PathBuf::from(v)),
            _ => return Err(arg.unexpected()),
        }
    }
    let config = config.ok_or("stream-plan: missing <config_file>")?;
    Ok(Some(Options {
        config,
        settings: s,
        json,
        user,
        apply,
    }))
}

/// `<n>[s|m|h|d]` (seconds without a unit) or `unlimited` (None).
fn duration(text: &str, flag: &str) -> Result<Option<Duration>, lexopt::Error> {
    if text == "unlimited" {
        return Ok(None);
    }
    let (digits, unit) = match text.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&text[..i], c),
        _ => (text, 's'),
    };
    let scale = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => 0,
    };
    match digits.parse::<u64>() {
        Ok(n) if scale > 0 && n > 0 && n <= 3650 * 86_400 / scale => {
            Ok(Some(Duration::from_secs(n * scale)))
        }
        _ => Err(format!(
            "{flag} must be a positive number of seconds, optionally with s, m, h or d \
             (e.g. 7d), at most 10 years, or unlimited"
        )
        .into()),
    }
}

/// `<n>[K|M|G|T]` (powers of 1024) or `unlimited` (-1).
fn bytes(text: &str) -> Result<i64, lexopt::Error> {
    if text == "unlimited" {
        return Ok(-1);
    }
    let (digits, shift) = match text.char_indices().last() {
        Some((i, 'K')) => (&text[..i], 10),
        Some((i, 'M')) => (&text[..i], 20),
        Some((i, 'G')) => (&text[..i], 30),
        Some((i, 'T')) => (&text[..i], 40),
        _ => (text, 0),
    };
    match digits.parse::<i64>() {
        Ok(n) if n > 0 && n <= (i64::MAX >> shift) => Ok(n << shift),
        _ => Err(
            "--max-bytes must be a positive number of bytes, optionally with K, M, G or T \
                  (e.g. 10G), or unlimited"
                .into(),
        ),
    }
}

fn count(text: &str, flag: &str) -> Result<i64, lexopt::Error> {
    if text == "unlimited" {
        return Ok(-1);
    }
    match text.parse::<i64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{flag} must be a positive integer or unlimited").into()),
    }
}

/// Runs `svc stream-plan`: 0 printed (and applied, everything as planned), 1 a broker
/// failure or something existing that differs from the plan, 2 invalid input.
pub fn run(cfg: &RuntimeConfig, opts: &Options) -> ExitCode {
    let plan = match plan::plan(cfg, &opts.settings) {
        Ok(p) => p,
        Err(why) => {
            eprintln!("svc: stream-plan: {why}");
            return ExitCode::from(2);
        }
    };
    let printed = if opts.json {
        let text = serde_json::to_string_pretty(&plan::to_json(&plan, &opts.user))
            .expect("JSON values always serialize");
        output::print(format_args!("{text}\n"))
    } else {
        output::print(format_args!("{}", text(&plan)))
    };
    if let Err(e) = printed {
        return output::write_failed(&e);
    }
    if opts.apply {
        apply(cfg, &plan)
    } else {
        ExitCode::SUCCESS
    }
}

/// `--apply`: the report goes to standard error, so `--format json` output stays one document.
fn apply(cfg: &RuntimeConfig, plan: &Plan) -> ExitCode {
    let admin = match plan_apply::admin_config(&cfg.nats) {
        Ok(a) => a,
        Err(why) => {
            eprintln!("svc: stream-plan --apply: {why}");
            return ExitCode::from(2);
        }
    };
    let (nc, denials) = match plan_apply::connect_admin(&admin) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("svc: stream-plan --apply: {}", crate::text::error_chain(&e));
            return ExitCode::from(1);
        }
    };
    let applied = match plan_apply::apply(&nc, plan, &cfg.nats) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("svc: stream-plan --apply: {}", crate::text::error_chain(&e));
            // A denied request only times out: the broker's report says why.
            if let Some(denied) = denials.first() {
                eprintln!("svc: stream-plan --apply: {denied} (the administrator's user lacks it)");
            }
            return ExitCode::from(1);
        }
    };
    let mut differs = false;
    for a in applied {
        match a.outcome {
            Outcome::Created => eprintln!("applied: {} created", a.what),
            Outcome::Matches => eprintln!("applied: {} exists as planned", a.what),
            Outcome::Differs(d) => {
                differs = true;
                eprintln!(
                    "applied: {} exists and DIFFERS from the plan (left unchanged): {}",
                    a.what,
                    d.join("; ")
                );
            }
        }
    }
    if differs {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// The plan as an operator reads it.
fn text(plan: &Plan) -> String {
    let mut t = String::new();
    let _ = write_stream(&mut t, "Stream", &plan.stream);
    let c = &plan.consumer;
    let mode = match plan.consumer_mode {
        ConsumerMode::Bind => "bind: it must exist before `svc run`",
        ConsumerMode::Create => "create: `svc run` creates it when missing",
        ConsumerMode::Reconcile => "reconcile: `svc run` creates it or updates its settings",
    };
    let _ = writeln!(
        t,
        "\nDurable pull consumer {}/{} (nats.consumer_mode {mode})",
        plan.stream.name,
        c.durable_name.as_deref().unwrap_or_default()
    );
    let limit = |n: i64| match n {
        n if n < 0 => "unlimited".to_string(),
        n => n.to_string(),
    };
    let backoff = match c.backoff.as_slice() {
        [] => "none (ack wait each time)".to_string(),
        b => b
            .iter()
            .map(|d| format!("{} s", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", "),
    };
    let (filter_key, filter) = match c.filter_subjects.as_slice() {
        [] => ("filter subject", c.filter_subject.clone()),
        many => ("filter subjects", many.join(", ")),
    };
    let start = match plan.consumer_mode {
        ConsumerMode::Bind => "as the existing consumer has it (never changed)".to_string(),
        _ => format!(
            "{} (when created; an existing consumer is never moved)",
            plan.start
        ),
    };
    for (k, v) in [
        (filter_key, filter),
        ("deliver policy", start),
        ("ack policy", "explicit".into()),
        ("ack wait", format!("{} s", c.ack_wait.as_secs_f64())),
        ("max ack pending", limit(c.max_ack_pending)),
        ("max deliver", limit(c.max_deliver)),
        ("backoff", backoff),
    ] {
        let _ = writeln!(t, "  {k:<18}{v}");
    }
    if let Some(dlq) = &plan.dead_letter_stream {
        t.push('\n');
        let _ = write_stream(&mut t, "Dead-letter stream", dlq);
    }
    for (title, p) in [
        ("Permissions of the runner's NATS user", &plan.permissions),
        (
            "Permissions of a `svc replay` user (read-only; docs/replay.md)",
            &plan.replay_permissions,
        ),
        (
            "Permissions of a `svc dlq redrive` user (docs/replay.md)",
            &plan.redrive_permissions,
        ),
    ] {
        if p.publish.is_empty() && p.subscribe.is_empty() {
            continue;
        }
        let _ = writeln!(t, "\n{title}");
        let width = p
            .publish
            .iter()
            .chain(&p.subscribe)
            .map(|g| g.subject.len())
            .max();
        let width = width.unwrap_or(0);
        for (verb, grants) in [("publish", &p.publish), ("subscribe", &p.subscribe)] {
            for g in grants {
                let _ = writeln!(t, "  {verb:<10}{:<width$}  {}", g.subject, g.why);
            }
        }
    }
    if !plan.warnings.is_empty() {
        let _ = writeln!(t, "\nWarnings");
        for w in &plan.warnings {
            let _ = writeln!(t, "  - {w}");
        }
    }
    t
}

fn write_stream(
    t: &mut String,
    title: &str,
    s: &nats::jetstream::StreamConfig,
) -> std::fmt::Result {
    let limit = |n: i64| match n {
        n if n < 0 => "unlimited".to_string(),
        n => n.to_string(),
    };
    let age = match s.max_age.as_secs() {
        0 => "unlimited".to_string(),
        n if n % 86_400 == 0 => format!("{} d", n / 86_400),
        n => format!("{n} s"),
    };
    writeln!(t, "{title} {}", s.name)?;
    for (k, v) in [
        ("subjects", s.subjects.join(", ")),
        ("storage", plan::api_name(&s.storage)),
        ("replicas", s.num_replicas.to_string()),
        ("retention", plan::api_name(&s.retention)),
        ("discard", plan::api_name(&s.discard)),
        (
            "duplicate window",
            format!("{} s", s.duplicate_window / 1_000_000_000),
        ),
        ("max age", age),
        ("max bytes", limit(s.max_bytes)),
        ("max messages", limit(s.max_msgs)),
    ] {
        writeln!(t, "  {k:<18}{v}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Option<Options>, String> {
        let mut parser = lexopt::Parser::from_args(args.iter().copied());
        parse(&mut parser).map_err(|e| e.to_string())
    }

    #[test]
    fn flags_set_the_stream_and_defaults_are_safe() {
        let o = p(&["c.json"]).unwrap().unwrap();
        assert_eq!(o.settings, StreamSettings::default());
        assert_eq!((o.json, o.apply, o.user.as_str()), (false, false, "svc"));
        let o = p(&[
            "c.json",
            "--storage",
            "memory",
            "--replicas",
            "3",
            "--retention",
            "workqueue",
            "--discard",
            "old",
            "--duplicate-window",
            "5m",
            "--max-age",
            "unlimited",
            "--max-bytes",
            "10G",
            "--max-msgs",
            "1000",
            "--dlq-stream",
            "DL",
            "--format",
            "json",
            "--apply",
            "--user",
            "runner",
        ])
        .unwrap()
        .unwrap();
        let s = &o.settings;
        assert_eq!(s.storage, StorageType::Memory);
        assert_eq!(s.replicas, 3);
        assert_eq!(s.retention, RetentionPolicy::WorkQueue);
        assert_eq!(s.discard, DiscardPolicy::Old);
        assert_eq!(s.duplicate_window, Duration::from_secs(300));
        assert_eq!(s.max_age, Duration::ZERO);
        assert_eq!((s.max_bytes, s.max_msgs), (10 << 30, 1000));
        assert_eq!(s.dead_letter_stream.as_deref(), Some("DL"));
        assert!(o.json && o.apply && o.user == "runner");
        assert_eq!(p(&["c.json", "--help"]).unwrap(), None);
        for bad in [
            &["c.json", "--replicas", "0"][..],
            &["c.json", "--max-age", "7w"],
            &["c.json", "--max-bytes", "-1"],
            &["c.json", "--dlq-stream", "a.b"],
            &["c.json", "--format", "yaml"],
            &["c.json", "--duplicate-window", "unlimited"],
            &[],
        ] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn text_shows_each_part_the_permissions_and_the_warnings() {
        let cfg = RuntimeConfig::parse(
            r#"{"nats": {"url": "nats://127.0.0.1:4222", "stream": "ORDERS", "consumer": "svc",
                "subject": "orders.>"},
               "sink": {"type": "file", "directory": "/tmp/x"},
               "dead_letter": {"enabled": true, "subject": "dlq.orders"}}"#,
        )
        .unwrap();
        let settings = StreamSettings {
            storage: StorageType::Memory,
            ..Default::default()
        };
        let t = text(&plan::plan(&cfg, &settings).unwrap());
        for line in [
            "Stream ORDERS\n  subjects          orders.>\n  storage           memory\n",
            "  max age           7 d\n",
            "Durable pull consumer ORDERS/svc (nats.consumer_mode ",
            "  ack policy        explicit\n",
            "Dead-letter stream ORDERS_DLQ\n  subjects          dlq.orders\n",
            "  publish   $JS.ACK.ORDERS.svc.>  ",
            "  publish   dlq.orders  ",
            "  subscribe _INBOX.>  ",
            "Warnings\n  - replicas 1: ",
            "  - storage memory: ",
        ] {
            assert!(t.contains(line), "{line:?} missing from:\n{t}");
        }
    }
}
