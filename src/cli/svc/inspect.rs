//! `svc inspect <config>`: a read-only look at the configured stream. Each message is shown
//! with what the runner would make of it (payload format, priority, classification, labels,
//! the authenticity verdict, the governance stages' verdict and mission metadata, the fan-out
//! children it would go to), never acknowledged, never
//! decrypted; payloads only with `--payload`; secret-looking header values redacted.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::output;
use crate::broker::inspect::{self, Request, Start};
use crate::config::RuntimeConfig;
use crate::message::envelope::{normalize, normalize_payload, Envelope, PayloadFormat, RawMessage};
use crate::message::labels;
use crate::message::limits;
use crate::message::protection::authenticity::{AuthOutcome, Verifier};
use crate::message::protection::encryption::Action;
use crate::message::refusal::Refusal;
use crate::message::subject::SubjectPattern;
use crate::sink::SinkConfig;
use crate::text::peer::PeerText;
use crate::text::rfc3339::{format_rfc3339_nanos, parse_rfc3339_nanos};
use crate::text::secrets::is_secret_name;
use crate::text::terminal;

/// Most messages one run may show.
pub const MAX_MESSAGES: u64 = 10_000;
/// Longest `--timeout`.
pub const MAX_TIMEOUT_SECONDS: u64 = 300;
/// Characters of a payload shown in the text format (the JSON lines carry it whole).
const TEXT_PAYLOAD_CHARS: usize = 1024;
/// What a redacted header value reads as.
const REDACTED: &str = "<redacted>";

/// `svc inspect` options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub config: PathBuf,
    pub start: Start,
    pub subject: Option<String>,
    pub max: u64,
    pub timeout: Duration,
    pub jsonl: bool,
    pub payload: bool,
}

/// Parses what follows `inspect` (lexopt hands its parser on); `None`: help was asked for.
pub fn parse(p: &mut lexopt::Parser) -> Result<Option<Options>, lexopt::Error> {
    use lexopt::prelude::*;
    let mut config = None;
    let mut start = None;
    let mut subject = None;
    let (mut max, mut timeout_s, mut jsonl, mut payload) = (100, 5, false, false);
    let number = |v: std::ffi::OsString, flag: &str, lo: u64, hi: u64| {
        let s = v.string()?;
        match s.parse::<u64>() {
            Ok(n) if (lo..=hi).contains(&n) => Ok(n),
            _ => Err(lexopt::Error::from(format!(
                "{flag} must be an integer from {lo} to {hi}"
            ))),
        }
    };
    let set_start = |s: Start, start: &mut Option<Start>| {
        if start.replace(s).is_some() {
            return Err(lexopt::Error::from(
                "give at most one of --last, --start-seq, --since",
            ));
        }
        Ok(())
    };
    while let Some(arg) = p.next()? {
        match arg {
            Long("last") => {
                let n = number(p.value()?, "--last", 1, MAX_MESSAGES)?;
                set_start(Start::Last(n), &mut start)?
            }
            Long("start-seq") => {
                let n = number(p.value()?, "--start-seq", 1, u64::MAX)?;
                set_start(Start::Sequence(n), &mut start)?
            }
            Long("since") => {
                let text = p.value()?.string()?;
                let nanos = parse_rfc3339_nanos(&text)
                    .ok_or("--since must be an RFC 3339 time, e.g. 2026-11-26T14:00:00Z")?;
                if !crate::broker::config::is_broker_time(nanos) {
                    let why = crate::broker::config::BROKER_TIME_RANGE;
                    return Err(format!("--since {why}").into());
                }
                set_start(Start::Since(nanos), &mut start)?
            }
            Long("subject") => subject = Some(p.value()?.string()?),
            Long("max") => max = number(p.value()?, "--max", 1, MAX_MESSAGES)?,
            Long("timeout") => timeout_s = number(p.value()?, "--timeout", 1, MAX_TIMEOUT_SECONDS)?,
            Long("format") => {
                jsonl = match p.value()?.string()?.as_str() {
                    "text" => false,
                    "jsonl" => true,
                    _ => return Err("--format must be text or jsonl".into()),
                }
            }
            Long("payload") => payload = true,
            Short('h') | Long("help") => return Ok(None),
            Value(v) if config.is_none() => config = Some(PathBuf::from(v)),
            _ => return Err(arg.unexpected()),
        }
    }
    let config = config.ok_or("inspect: missing <config_file>")?;
    let start = start.unwrap_or(Start::Last(10));
    if let Start::Last(n) = start {
        max = max.min(n).max(1);
    }
    Ok(Some(Options {
        config,
        start,
        subject,
        max,
        timeout: Duration::from_secs(timeout_s),
        jsonl,
        payload,
    }))
}

/// Runs `svc inspect`: exit 0 after reading, 1 on a broker failure, 2 on invalid input.
pub fn run(cfg: &RuntimeConfig, opts: &Options) -> ExitCode {
    let filter = match narrowed(&cfg.nats.subjects, opts.subject.as_deref()) {
        Ok(f) => f,
        Err(why) => {
            eprintln!("svc: inspect: {why}");
            return ExitCode::from(2);
        }
    };
    // Keys come from the environment, as for `svc run`: a missing one is an input problem.
    let verifier = if cfg.authenticity.enabled {
        match Verifier::load(&cfg.authenticity) {
            Ok(v) => Some(v),
            Err(problems) => {
                for p in problems {
                    eprintln!("svc: inspect: {p}");
                }
                return ExitCode::from(2);
            }
        }
    } else {
        None
    };
    let metrics = Arc::new(crate::metrics::Metrics::default());
    let denials = Arc::new(crate::broker::Denials::default());
    let nc = match crate::broker::connect_within(&cfg.nats, metrics, denials.clone(), opts.timeout)
    {
        Ok(nc) => nc,
        Err(e) => {
            eprintln!("svc: {}", crate::text::error_chain(&e));
            return ExitCode::from(1);
        }
    };
    let req = Request {
        stream: cfg.nats.stream.clone(),
        subjects: filter,
        start: opts.start,
        max: opts.max,
        timeout: opts.timeout,
    };
    let mut out = std::io::stdout().lock();
    let mut write_error = None;
    let result = inspect::read(&nc, &req, |raw| {
        if write_error.is_some() {
            return;
        }
        let view = view(cfg, verifier.as_ref(), &raw, opts.payload);
        // Both formats pass the one terminal rule last (`text::terminal`), whatever the
        // parts did before.
        let line = if opts.jsonl {
            terminal::json_line(&view)
        } else {
            terminal::text_line(&text_line(&view)).into_owned()
        };
        if let Err(e) = writeln!(out, "{line}") {
            write_error = Some(e);
        }
    });
    if let Some(e) = write_error {
        return output::write_failed(&e);
    }
    match result {
        Ok(n) => {
            if !opts.jsonl {
                let _ = writeln!(out, "({n} message{} read)", if n == 1 { "" } else { "s" });
            }
            // Read, but something was denied on the way (the clean-up of its consumer).
            if let Some(denied) = denials.first() {
                eprintln!("svc: inspect: {denied}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("svc: {}", crate::text::error_chain(&e));
            if let Some(denied) = denials.first() {
                eprintln!("svc: inspect: {denied}");
            }
            ExitCode::from(1)
        }
    }
}

/// The configured subject, or `--subject` when it lies within it.
pub(super) fn narrowed(configured: &[String], asked: Option<&str>) -> Result<Vec<String>, String> {
    let Some(asked) = asked else {
        return Ok(configured.to_vec());
    };
    SubjectPattern::parse(asked).map_err(|e| format!("--subject: {e}"))?;
    if configured.iter().any(|c| within(asked, c)) {
        Ok(vec![asked.to_string()])
    } else {
        let (noun, shown) = match configured {
            [one] => ("subject", one.clone()),
            many => ("subjects", many.join(", ")),
        };
        Err(format!(
            "--subject {asked} is not within the configured {noun} {shown}"
        ))
    }
}

/// Does every subject `asked` matches also match `configured`? (Both valid patterns.)
fn within(asked: &str, configured: &str) -> bool {
    let mut a = asked.split('.');
    let mut c = configured.split('.');
    loop {
        match (a.next(), c.next()) {
            (_, Some(">")) => return true,
            (None, None) => return true,
            (Some(">"), _) | (None, Some(_)) | (Some(_), None) => return false,
            (Some("*"), Some(ct)) => {
                if ct != "*" {
                    return false;
                }
            }
            (Some(_), Some("*")) => {}
            (Some(at), Some(ct)) => {
                if at != ct {
                    return false;
                }
            }
        }
    }
}

/// One message as shown: a JSON object (the `jsonl` line; the text line is made from it).
fn view(
    cfg: &RuntimeConfig,
    verifier: Option<&Verifier>,
    raw: &RawMessage,
    payload: bool,
) -> Value {
    let headers: Vec<Value> = raw
        .headers
        .iter()
        .map(|(k, v)| {
            let value = if is_secret_name(k) {
                REDACTED
            } else {
                v.as_str()
            };
            json!([k, value])
        })
        .collect();
    let (_, info) = normalize_payload(&raw.data);
    let format = match info.original_format {
        PayloadFormat::Json => "json",
        PayloadFormat::Text => "text",
        PayloadFormat::Bytes => "bytes",
    };
    let resolved = cfg.message_metadata.resolve(raw);
    let metadata = match &resolved {
        Ok(m) => json!({"priority": m.priority, "classification": m.classification,
                        "labels": m.labels}),
        Err(e) => json!({"rejected": e.to_string()}),
    };
    let checked = verifier.map(|v| v.check(raw));
    let auth_refused = matches!(checked, Some(Err(_)));
    let authenticity = checked.map(|c| match c {
        Ok(AuthOutcome::Verified(alg)) => format!("verified ({})", alg.name()),
        Ok(AuthOutcome::Unsigned) => "unsigned (not required)".to_string(),
        Err(f) => format!("rejected: {f}"),
    });
    let mut v = json!({
        "stream_sequence": raw.stream_sequence,
        "time": raw.published_unix_nanos.map(format_rfc3339_nanos),
        "subject": raw.subject,
        "size": raw.data.len(),
        "headers": headers,
        "payload_format": format,
        "metadata": metadata,
    });
    if let Some(a) = authenticity {
        v["authenticity"] = json!(a);
    }
    // The runner's first check: a message over an input limit (or one the client could not
    // read as sent) is dead-lettered before any stage runs, so no stage verdict is shown.
    let fanout = match limits::check(raw, &cfg.envelope.keep_headers) {
        Err(limit) => {
            v["input"] = json!({"verdict": "refused", "stage": "input", "field": limit.field(),
                                "reason": limit.code(), "message": limit.to_string()});
            if governance_enabled(cfg) {
                v["governance"] = json!({"verdict": "not reached (input refused)"});
            }
            Err("input")
        }
        Ok(()) => {
            v["input"] = json!({"verdict": "accepted"});
            staged_view(cfg, raw, auth_refused, &mut v)
        }
    };
    if let SinkConfig::Fanout(f) = &cfg.sink {
        match fanout {
            Ok(env) => {
                let (targets, route) = fanout_route(f, &env);
                v["fanout"] = targets;
                if let Some(r) = route {
                    v["fanout_route"] = json!(r);
                }
            }
            Err(stage) => v["fanout"] = json!(format!("rejected before routing ({stage})")),
        }
    }
    if let Some(why) = raw.unreadable {
        v["unreadable"] = json!(why);
    }
    if payload {
        match std::str::from_utf8(&raw.data) {
            Ok(text) => v["payload"] = json!(text),
            Err(_) => {
                use base64::Engine;
                v["payload_base64"] =
                    json!(base64::engine::general_purpose::STANDARD.encode(&raw.data))
            }
        }
    }
    v
}

fn governance_enabled(cfg: &RuntimeConfig) -> bool {
    cfg.mission_metadata.enabled || cfg.pre_sink_policy.enabled || cfg.size_policy.enabled
}

/// The envelope the runner's normalize stages build before the governance stages (metadata,
/// its spelling, the label profile), or the stage that refuses the message.
fn staged_envelope(cfg: &RuntimeConfig, raw: &RawMessage) -> Result<Envelope, &'static str> {
    let (mut env, _) = normalize(raw, 0, &cfg.envelope);
    let mut meta = cfg
        .message_metadata
        .resolve(raw)
        .map_err(|_| "message metadata")?;
    cfg.security_labels.spell_metadata(&mut meta);
    let profile = cfg
        .security_labels
        .resolve(raw, &meta)
        .map_err(|_| "security labels")?;
    meta.apply_to(&mut env);
    labels::apply_to(&mut env, profile);
    Ok(env)
}

/// Runs the stages after the input check in the runner's order (the input size bounds, the
/// authenticity verdict `auth_refused`, metadata, labels, governance), sets the governance
/// verdict when a governance stage is enabled, and gives the envelope a fan-out would route, or
/// the stage that refused the message first.
fn staged_view(
    cfg: &RuntimeConfig,
    raw: &RawMessage,
    auth_refused: bool,
    v: &mut Value,
) -> Result<Envelope, &'static str> {
    let enabled = governance_enabled(cfg);
    if let Err(r) = cfg.size_policy.check_input(raw) {
        v["governance"] = refused(&r);
        return Err("governance");
    }
    let staged = if auth_refused {
        Err("authenticity")
    } else {
        staged_envelope(cfg, raw)
    };
    let mut env = match staged {
        Ok(env) => env,
        Err(stage) => {
            if enabled {
                // The failure itself is shown under "metadata" / by the runner's DLQ record;
                // the stages after it would not run.
                v["governance"] = json!({"verdict": format!("not reached ({stage} refused)")});
            }
            return Err(stage);
        }
    };
    if !enabled {
        return Ok(env);
    }
    match governance(cfg, raw, &mut env) {
        Ok(()) => {
            v["governance"] =
                json!({"verdict": "stored", "mission_metadata": env.mission_metadata});
            Ok(env)
        }
        Err(r) => {
            v["governance"] = refused(&r);
            Err("governance")
        }
    }
}

/// A governance refusal as shown: stage, field, reason (value-free).
fn refused(r: &Refusal) -> Value {
    let p = r.first();
    let mut v = json!({"verdict": "refused", "stage": r.stage, "field": p.field,
                       "reason": p.code, "message": r.to_string()});
    if let Some(m) = r.measured {
        v["size"] = json!({"measured": m.measured, "limit": m.limit});
    }
    v
}

/// The governance stages after the label profile (`docs/governance.md`): mission metadata, the
/// envelope's size bounds, the pre-sink policy. The record-bytes bound is left out: it needs
/// the encrypted, sealed record, so only the runner can measure it.
fn governance(cfg: &RuntimeConfig, raw: &RawMessage, env: &mut Envelope) -> Result<(), Refusal> {
    env.mission_metadata = cfg.mission_metadata.resolve(raw)?;
    let encrypted = cfg.payload_encryption.action_for(&raw.subject) == Action::Encrypt;
    cfg.size_policy
        .check_envelope(env, None)
        .and_then(|()| cfg.pre_sink_policy.check(env, encrypted))
}

/// One terminal line: `#42 2026-... orders.created 17 B json normal/unclassified [a,b] ...`.
/// Everything that came from the message is escaped and bounded.
fn text_line(v: &Value) -> String {
    let s = |v: &Value| {
        v.as_str()
            .map(str::to_string)
            .unwrap_or_else(|| v.to_string())
    };
    let mut line = format!(
        "#{} {} {} {} B {}",
        v["stream_sequence"],
        v["time"].as_str().unwrap_or("-"),
        PeerText::new(&s(&v["subject"])),
        v["size"],
        s(&v["payload_format"]),
    );
    let m = &v["metadata"];
    match m.get("rejected") {
        Some(why) => line.push_str(&format!(" metadata rejected ({})", PeerText::new(&s(why)))),
        None => {
            let labels: Vec<String> = m["labels"]
                .as_array()
                .map(|a| a.iter().map(s).collect())
                .unwrap_or_default();
            line.push_str(&format!(
                " {}/{} [{}]",
                PeerText::new(&s(&m["priority"])),
                PeerText::new(&s(&m["classification"])),
                PeerText::new(&labels.join(","))
            ));
        }
    }
    if let Some(i) = v.get("input").filter(|i| i["verdict"] == "refused") {
        line.push_str(&format!(
            " input refused {} ({})",
            s(&i["reason"]),
            PeerText::new(&s(&i["message"]))
        ));
    }
    if let Some(a) = v.get("authenticity") {
        line.push_str(&format!(" auth={}", PeerText::new(&s(a))));
    }
    if let Some(g) = v.get("governance") {
        let verdict = s(&g["verdict"]);
        match g.get("stage") {
            Some(stage) => line.push_str(&format!(
                " governance={verdict} {}/{} ({})",
                s(stage),
                s(&g["reason"]),
                s(&g["field"])
            )),
            None => line.push_str(&format!(" governance={}", PeerText::new(&verdict))),
        }
        if let Some(m) = g.get("mission_metadata").filter(|m| !m.is_null()) {
            line.push_str(&format!(
                " mission={}",
                PeerText::with_limit(&m.to_string(), TEXT_PAYLOAD_CHARS)
            ));
        }
    }
    if let Some(f) = v.get("fanout") {
        let shown = match f.as_array() {
            Some(a) => a.iter().map(s).collect::<Vec<_>>().join(","),
            None => s(f),
        };
        line.push_str(&format!(" fanout={shown}"));
    }
    if let Some(r) = v.get("fanout_route") {
        line.push_str(&format!(" fanout_route=\"{}\"", s(r)));
    }
    if let Some(h) = v["headers"].as_array().filter(|h| !h.is_empty()) {
        let shown: Vec<String> = h
            .iter()
            .map(|pair| format!("{}={}", s(&pair[0]), s(&pair[1])))
            .collect();
        line.push_str(&format!(" headers: {}", PeerText::new(&shown.join("; "))));
    }
    if let Some(p) = v.get("payload") {
        line.push_str(&format!(
            " payload: {}",
            PeerText::with_limit(&s(p), TEXT_PAYLOAD_CHARS)
        ));
    }
    if let Some(p) = v.get("payload_base64") {
        line.push_str(&format!(
            " payload (base64): {}",
            PeerText::with_limit(&s(p), TEXT_PAYLOAD_CHARS)
        ));
    }
    line
}

/// Which route a message takes, judged on the envelope the runner would route (its metadata,
/// label profile and kept headers): the targets and the route taken, if any.
fn fanout_route(f: &crate::sink::fanout::FanoutConfig, env: &Envelope) -> (Value, Option<String>) {
    use crate::sink::fanout::{Decision, Facts};
    match f.routing.decide(f.sinks.keys(), &Facts::of(env)) {
        Decision::Deliver { targets, via } => (
            json!(targets
                .iter()
                .map(|t| if t.required {
                    t.sink.clone()
                } else {
                    format!("{} (optional)", t.sink)
                })
                .collect::<Vec<_>>()),
            Some(via.describe()),
        ),
        Decision::Reject => (json!("rejected: no route matches"), None),
        Decision::Ignore => (
            json!("ignored: no route matches (acknowledged, stored nowhere)"),
            None,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(args: &[&str]) -> Result<Options, String> {
        let mut p = lexopt::Parser::from_iter(std::iter::once("x").chain(args.iter().copied()));
        parse(&mut p).map(Option::unwrap).map_err(|e| e.to_string())
    }

    #[test]
    fn options_and_their_bounds() {
        let o = opts(&["c.json"]).unwrap();
        assert_eq!(
            (o.start, o.max, o.jsonl, o.payload),
            (Start::Last(10), 10, false, false)
        );
        let o = opts(&[
            "c.json",
            "--start-seq",
            "5",
            "--max",
            "3",
            "--format",
            "jsonl",
        ])
        .unwrap();
        assert_eq!((o.start, o.max, o.jsonl), (Start::Sequence(5), 3, true));
        assert!(opts(&["c.json", "--last", "2", "--start-seq", "1"])
            .unwrap_err()
            .contains("at most one of"));
        assert!(opts(&["c.json", "--since", "yesterday"])
            .unwrap_err()
            .contains("RFC 3339"));
        assert!(opts(&["c.json", "--max", "0"]).is_err());
        assert!(opts(&["c.json", "--timeout", "301"]).is_err());
        assert!(opts(&["--max", "3"])
            .unwrap_err()
            .contains("missing <config_file>"));
    }

    #[test]
    fn subject_narrowing() {
        let one = |s: &str| vec![s.to_string()];
        assert_eq!(narrowed(&one("orders.>"), None).unwrap(), one("orders.>"));
        assert_eq!(
            narrowed(&one("orders.>"), Some("orders.eu.*")).unwrap(),
            one("orders.eu.*")
        );
        assert!(narrowed(&one("orders.>"), Some("payments.>")).is_err());
        // Several configured subjects: none narrowed reads them all, --subject one within any.
        let two = vec!["orders.a".to_string(), "payments.>".to_string()];
        assert_eq!(narrowed(&two, None).unwrap(), two);
        assert_eq!(
            narrowed(&two, Some("payments.eu")).unwrap(),
            one("payments.eu")
        );
        let why = narrowed(&two, Some("orders.b")).unwrap_err();
        assert!(
            why.contains("not within the configured subjects orders.a, payments.>"),
            "{why}"
        );
        assert!(within("orders.*.new", "orders.*.new") && within("a.b", "a.*"));
        assert!(!within("orders.*", "orders.eu") && !within("orders.>", "orders.*"));
        assert!(!within("a", "a.b") && !within("a.b", "a"));
    }
}
