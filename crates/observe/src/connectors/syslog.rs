//! `syslog-export`: one RFC 5424 message per approved metric (and per subject-family row) to
//! a syslog daemon over UDP or a Unix datagram socket:
//!
//! ```text
//! <134>1 2024-06-10T06:13:20.250000Z - svc - metrics [svc name="svc_messages_acked_total" type="counter" value="1200"] svc_messages_acked_total=1200
//! ```
//!
//! - PRI = facility * 8 + severity (policy `facility`, `severity`); VERSION 1;
//! - TIMESTAMP = the snapshot's generation time, RFC 3339 in UTC with microseconds and `Z`;
//! - HOSTNAME, APP-NAME, PROCID, MSGID from the policy (validated printable ASCII);
//! - one SD-ELEMENT `[<structured_data_id> ...]` with PARAM-NAMEs `name`, `type`, `value` (a
//!   summary: `count`, `sum` and, once observed, `min`, `max`, `last`; a subject-family row
//!   adds `subject_family`); in PARAM-VALUE `"`, `\` and `]` are escaped with `\`;
//! - MSG: the same fact in short text (`name=value`) for readers that ignore structured data.
//!
//! A message over `max_message_bytes` fails the export before anything is sent. Best effort
//! like the StatsD connectors: failures are counted and reported (exit 1).

use super::{
    metric_name, Action, Connector, Context, DatagramTarget, Delivery, ExportError, Input, Limit,
    Plan, Retry,
};
use crate::catalogue::Kind;
use crate::exposition::format_value;
use crate::families::LABEL_NAME;
use crate::policy::checks::Transport;
use crate::policy::syslog::Syslog;
use crate::select::Sample;

pub const CONNECTOR: Connector = Connector {
    command: "syslog-export",
    block: "syslog",
    summary: "Send the approved metrics as RFC 5424 syslog messages with structured data.",
    help: "\
Usage: svc-observe syslog-export <snapshot_file> <policy_file> [--dry-run] [--allow-stale]

Sends one RFC 5424 message per approved metric, its value in structured data
`[<structured_data_id> name=\"...\" type=\"...\" value=\"...\"]`, to syslog.host:port (UDP) or
syslog.socket_path (unixgram); needs enabled and syslog.enabled. Best effort: failed messages
are counted (syslog.max_retries attempts after the first).

Options:
  --dry-run      Print the messages, one per line, instead of sending them
  --allow-stale  Send even if the snapshot is older than syslog.stale_after_seconds

Exit codes: 0 all sent (or disabled by policy), 1 some or all not sent (or snapshot
missing, invalid or stale, or a message over syslog.max_message_bytes), 2 invalid policy or
usage.
",
    input: Input::SnapshotAndPolicy,
    enabled: |p| p.syslog.enabled,
    push: |p| &p.syslog.push,
    action: Action::Plan(plan),
};

fn target(s: &Syslog) -> DatagramTarget {
    match s.transport {
        Transport::Udp => DatagramTarget::Udp {
            host: s.host.clone(),
            port: s.port,
        },
        Transport::Unixgram => DatagramTarget::Unix {
            path: s.socket_path.clone().unwrap_or_default().into(),
        },
    }
}

fn plan(ctx: &Context<'_>) -> Result<Plan, ExportError> {
    let s = &ctx.policy.syslog;
    let p = ctx.prepared();
    let header = format!(
        "<{}>1 {} {} {} {} {}",
        s.priority(),
        rfc5424_timestamp(p.snapshot.generated_at_epoch_seconds),
        s.hostname,
        s.app_name,
        s.procid,
        s.msgid
    );
    let mut datagrams = Vec::new();
    let mut metrics = 0;
    for m in &p.selection.metrics {
        let name = metric_name(ctx.policy, &m.suffix);
        let mut counted = false;
        let mut params: Vec<(&str, String)> = vec![("name", name.clone())];
        let text = match &m.sample {
            Some(Sample::Counter(v)) => {
                params.push(("type", "counter".into()));
                params.push(("value", v.to_string()));
                Some(format!("{name}={v}"))
            }
            Some(Sample::Gauge(v)) => {
                params.push(("type", "gauge".into()));
                params.push(("value", format_value(*v)));
                Some(format!("{name}={}", format_value(*v)))
            }
            Some(Sample::Summary(sm)) => {
                params.push(("type", "summary".into()));
                params.push(("count", sm.count.to_string()));
                params.push(("sum", format_value(sm.sum)));
                if sm.count > 0 {
                    params.push(("min", format_value(sm.min)));
                    params.push(("max", format_value(sm.max)));
                    params.push(("last", format_value(sm.last)));
                }
                Some(format!(
                    "{name} count={} sum={}",
                    sm.count,
                    format_value(sm.sum)
                ))
            }
            None => None,
        };
        if let Some(text) = text {
            datagrams.push((
                name.clone(),
                message(&header, &s.structured_data_id, &params, &text).into_bytes(),
            ));
            counted = true;
        }
        if m.kind == Kind::Counter {
            for (label, v) in &m.labeled {
                let params = vec![
                    ("name", name.clone()),
                    ("type", "counter".to_string()),
                    (LABEL_NAME, label.clone()),
                    ("value", format_value(*v)),
                ];
                let text = format!("{name}{{{LABEL_NAME}={label}}}={}", format_value(*v));
                datagrams.push((
                    format!("{name} {LABEL_NAME}={label}"),
                    message(&header, &s.structured_data_id, &params, &text).into_bytes(),
                ));
                counted = true;
            }
        }
        if counted {
            metrics += 1;
        }
    }
    Ok(Plan {
        delivery: Delivery::Datagrams {
            target: target(s),
            datagrams,
            timeout: s.push.timeout(),
        },
        limit: Limit::of("syslog", &s.push),
        retry: Retry::of(&s.push),
        metrics,
        redact: Vec::new(),
    })
}

/// One message: header, one SD-ELEMENT, MSG.
pub fn message(header: &str, sd_id: &str, params: &[(&str, String)], text: &str) -> String {
    let mut sd = format!("[{sd_id}");
    for (k, v) in params {
        sd.push_str(&format!(" {k}=\"{}\"", escape_param_value(v)));
    }
    sd.push(']');
    // MSG must not carry line breaks (one message per datagram, and receivers split on them).
    let text: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    format!("{header} {sd} {text}")
}

/// RFC 5424 PARAM-VALUE escaping: `"`, `\` and `]` get a backslash; control characters
/// (never produced by the exporter, but a raw label could in theory hold one) become spaces.
pub fn escape_param_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '"' | '\\' | ']' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// Is `name` a valid SD-NAME (1 to 32 printable US-ASCII, no `=`, space, `]`, `"`)?
pub fn is_sd_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| (33..=126).contains(&b) && !b"= ]\"".contains(&b))
}

/// RFC 3339 in UTC with six fractional digits and `Z` (RFC 5424 TIMESTAMP; at most six digits
/// of TIME-SECFRAC are allowed).
pub fn rfc5424_timestamp(epoch_seconds: f64) -> String {
    let micros = if epoch_seconds.is_finite() && epoch_seconds > 0.0 {
        (epoch_seconds * 1e6).round() as i128
    } else {
        0
    };
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(micros * 1000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.microsecond()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn param_values_are_escaped() {
        assert_eq!(escape_param_value(r#"a"b]c\d"#), r#"a\"b\]c\\d"#);
        assert_eq!(escape_param_value("x\ny"), "x y");
        assert_eq!(escape_param_value("plain.value-1"), "plain.value-1");
    }

    #[test]
    fn sd_names() {
        for n in [
            "name", "type", "value", "count", "sum", "min", "max", "last", LABEL_NAME,
        ] {
            assert!(is_sd_name(n), "{n}");
        }
        for n in ["", "a=b", "a b", "a]", "a\"", &"x".repeat(33)] {
            assert!(!is_sd_name(n), "{n}");
        }
    }

    #[test]
    fn timestamps() {
        assert_eq!(
            rfc5424_timestamp(1_718_000_000.25),
            "2024-06-10T06:13:20.250000Z"
        );
        assert_eq!(
            rfc5424_timestamp(1_718_000_000.0),
            "2024-06-10T06:13:20.000000Z"
        );
        assert_eq!(rfc5424_timestamp(f64::NAN), "1970-01-01T00:00:00.000000Z");
    }

    #[test]
    fn whole_message() {
        let m = message(
            "<134>1 2024-06-10T06:13:20.250000Z - svc - metrics",
            "svc@32473",
            &[("name", "svc_x_total".into()), ("value", "3".into())],
            "svc_x_total=3\n",
        );
        assert_eq!(
            m,
            "<134>1 2024-06-10T06:13:20.250000Z - svc - metrics [svc@32473 name=\"svc_x_total\" value=\"3\"] svc_x_total=3 "
        );
    }
}
