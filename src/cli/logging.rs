//! Log setup shared by the binaries: level from config (RUST_LOG wins when set), and every
//! line names its thread, so a log reads like the pipeline design.
//!
//! Two formats (`logging.format`): `text`, `2026-11-22T00:28:51.803Z INFO  [svc-ack] ...`, and
//! `json`, one object per line with `time`, `level`, `thread`, `target` and `message`, for log
//! shippers (Loki, Elastic) that would otherwise parse the text with a regular expression.
//! Under systemd the journal stamps every line itself, so the text format drops its own
//! timestamp there (`logging.timestamps: auto`); the JSON format always carries `time`, which
//! belongs to the record.
//!
//! Our own lines wrap peer text where it enters (`PeerText`); lines of the broker client crate
//! can quote the broker verbatim (an unknown protocol line, a whole JetStream API answer), so
//! they are bounded and escaped here as a whole when RUST_LOG turns them on.

use std::io::Write;

use crate::config::{LogFormat, LogTimestamps, LoggingConfig};
use crate::text::peer::PeerText;

/// Characters of one line of the broker client crate shown at most.
const CRATE_LINE_MAX_CHARS: usize = 1024;

/// Dependencies whose trace lines carry what a request holds, capped at debug whatever
/// `logging.level` says (an operator who names one in `RUST_LOG` still gets its trace):
/// - `ureq` logs the URL with its query at trace (an HTTP sink's token), and the redirect
///   `Location`; at debug it prints `/******` and redacts header values;
/// - `ureq_proto` hex-dumps every byte sent and received at trace: `Authorization`, the
///   object store's `X-Amz-Security-Token`, signatures, payloads;
/// - `rustls` prints handshake messages at trace (session tickets, PSK identities).
const REQUEST_BYTE_LOGGERS: &[&str] = &["ureq", "ureq_proto", "rustls"];

/// The defaults (text, journal-aware timestamps) at `level`: for commands without a config.
pub fn init(level: log::LevelFilter) {
    init_from(&LoggingConfig::with_level(level));
}

/// As the config's `logging` block says.
pub fn init_from(cfg: &LoggingConfig) {
    let mut builder = env_logger::Builder::new();
    builder.filter_level(cfg.level);
    // The broker client logs every JetStream API error answer (e.g. "consumer not found")
    // at ERROR, even when we handle it; our own callbacks report connection events. Its
    // lines appear only when RUST_LOG asks for them.
    builder.filter_module("nats", log::LevelFilter::Off);
    let spec = std::env::var("RUST_LOG").ok();
    if let Some(spec) = &spec {
        builder.parse_filters(spec);
    }
    for target in REQUEST_BYTE_LOGGERS {
        if let Some(level) = capped_level(spec.as_deref(), cfg.level, target) {
            builder.filter_module(target, level);
        }
    }
    match cfg.format {
        LogFormat::Json => {
            builder.format(|buf, record| {
                let thread = std::thread::current();
                let line = JsonLine {
                    time: buf.timestamp_millis().to_string(),
                    level: record.level().as_str(),
                    thread: thread.name().unwrap_or("main"),
                    target: record.target(),
                    message: message(record),
                };
                // serde_json escapes quotes, backslashes and control characters: a message
                // can never break the one-object-per-line framing.
                serde_json::to_writer(&mut *buf, &line)?;
                buf.write_all(b"\n")
            });
        }
        LogFormat::Text => {
            let stamped = match cfg.timestamps {
                LogTimestamps::Always => true,
                LogTimestamps::Never => false,
                LogTimestamps::Auto => !stderr_is_journal(),
            };
            builder.format(move |buf, record| {
                let thread = std::thread::current();
                let thread = thread.name().unwrap_or("main");
                if stamped {
                    let ts = buf.timestamp_millis();
                    writeln!(
                        buf,
                        "{ts} {:<5} [{thread}] {}",
                        record.level(),
                        message(record)
                    )
                } else {
                    writeln!(buf, "{:<5} [{thread}] {}", record.level(), message(record))
                }
            });
        }
    }
    let _ = builder.try_init();
}

/// The level of a [`REQUEST_BYTE_LOGGERS`] module: the level everything else gets (a bare
/// level in `RUST_LOG`, else `logging.level`), at most debug; `None` when `RUST_LOG` names
/// the module (`ureq_proto=trace`, `ureq::run=trace`): the operator asked for its lines.
fn capped_level(
    spec: Option<&str>,
    config: log::LevelFilter,
    target: &str,
) -> Option<log::LevelFilter> {
    let mut base = config;
    // `RUST_LOG` is `directive,directive/regex`; a directive is `level`, `module` or
    // `module=level` (env_filter's grammar).
    let directives = spec
        .unwrap_or_default()
        .split('/')
        .next()
        .unwrap_or_default();
    for d in directives
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
    {
        let name = d.split('=').next().unwrap_or_default().trim();
        if let Ok(level) = name.parse::<log::LevelFilter>() {
            if !d.contains('=') {
                base = level;
                continue;
            }
        }
        let names_it = name == target
            || name
                .strip_prefix(target)
                .is_some_and(|rest| rest.starts_with("::"));
        if names_it {
            return None;
        }
    }
    Some(base.min(log::LevelFilter::Debug))
}

fn message(record: &log::Record<'_>) -> String {
    let text = record.args().to_string();
    if record.target().starts_with("nats") {
        return PeerText::with_limit(&text, CRATE_LINE_MAX_CHARS).to_string();
    }
    text
}

#[derive(serde::Serialize)]
struct JsonLine<'a> {
    time: String,
    level: &'a str,
    thread: &'a str,
    target: &'a str,
    message: String,
}

/// systemd sets `JOURNAL_STREAM=<device>:<inode>` for a service whose stderr is connected to
/// the journal. The variable is inherited by children that may have redirected stderr, so it
/// counts only when it names the file stderr actually is (systemd.exec(5)).
fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(var) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    match std::fs::metadata("/proc/self/fd/2") {
        Ok(m) => names_stream(&var, m.dev(), m.ino()),
        Err(_) => false,
    }
}

fn names_stream(var: &str, dev: u64, ino: u64) -> bool {
    var.split_once(':')
        .and_then(|(d, i)| Some((d.parse::<u64>().ok()?, i.parse::<u64>().ok()?)))
        == Some((dev, ino))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_stream_must_name_stderr() {
        assert!(names_stream("8:12345", 8, 12345));
        assert!(!names_stream("8:12345", 8, 12346));
        assert!(!names_stream("9:12345", 8, 12345));
        assert!(!names_stream("", 8, 12345));
        assert!(!names_stream("8", 8, 12345));
        assert!(!names_stream("x:12345", 8, 12345));
    }

    #[test]
    fn broker_client_lines_are_bounded_and_escaped() {
        let long = format!("-ERR '\u{1b}[31m{}'", "x".repeat(5000));
        let args = format_args!("{long}");
        let record = log::Record::builder()
            .target("nats::jetstream")
            .args(args)
            .build();
        let shown = message(&record);
        assert!(shown.chars().count() < 1100, "{}", shown.len());
        assert!(!shown.contains('\u{1b}'));
        let args = format_args!("{long}");
        let ours = log::Record::builder()
            .target("svc::pipeline")
            .args(args)
            .build();
        assert_eq!(message(&ours), long);
    }

    #[test]
    fn request_byte_loggers_stay_below_trace_unless_named() {
        use log::LevelFilter as L;
        let cap = |spec: Option<&str>, level| capped_level(spec, level, "ureq_proto");
        assert_eq!(cap(None, L::Trace), Some(L::Debug));
        assert_eq!(cap(None, L::Info), Some(L::Info));
        assert_eq!(cap(Some("trace"), L::Info), Some(L::Debug));
        assert_eq!(cap(Some("svc=trace,warn"), L::Trace), Some(L::Warn));
        assert_eq!(cap(Some("ureq=trace"), L::Trace), Some(L::Debug));
        assert_eq!(cap(Some("debug,ureq_proto=trace"), L::Info), None);
        assert_eq!(cap(Some("ureq_proto::util=trace"), L::Info), None);
        assert_eq!(cap(Some("ureq_proto"), L::Info), None);
        assert_eq!(cap(Some("trace/secret"), L::Info), Some(L::Debug));
    }

    #[test]
    fn json_line_escapes_the_message() {
        let line = JsonLine {
            time: "2026-11-22T00:28:51.803Z".into(),
            level: "WARN",
            thread: "svc-ack",
            target: "svc::pipeline::ack",
            message: "a \"quoted\"\nsecond line \\ \u{1b}[31m".into(),
        };
        let text = serde_json::to_string(&line).unwrap();
        assert!(!text.contains('\n'));
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["message"], "a \"quoted\"\nsecond line \\ \u{1b}[31m");
        assert_eq!(back["thread"], "svc-ack");
    }
}
