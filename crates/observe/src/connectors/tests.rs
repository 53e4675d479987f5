//! Unit tests of the shared connector machinery: secrets, environment resolution, the retry
//! loop, the size guard, dry-run redaction, the registry.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::time::{Duration, Instant};

use super::*;
use svc_text::secrets::Secrets;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
    let map: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).map(OsString::from)
}

#[test]
fn secrets_never_print() {
    let s = Secret::new("hunter2".into());
    assert_eq!(format!("{s}"), "<redacted>");
    assert_eq!(format!("{s:?}"), "<redacted>");
    assert_eq!(s.expose(), "hunter2");
    let p = s.prefixed("Splunk ");
    assert_eq!(p.expose(), "Splunk hunter2");
    assert_eq!(format!("{p:?}"), "<redacted>");
    let h = Header::secret("Authorization", p);
    assert!(!format!("{h:?}").contains("hunter2"));
    assert_eq!(h.wire_value(), "Splunk hunter2");
}

#[test]
fn environment_resolution_names_field_and_variable_never_the_value() {
    let lookup = env(&[("TOKEN", "s3cr3t"), ("EMPTY", ""), ("MULTI", "a\nb")]);
    assert_eq!(
        resolve_env_with("siem_hec.token_env", "TOKEN", &lookup)
            .unwrap()
            .expose(),
        "s3cr3t"
    );
    for (var, msg) in [
        (
            "MISSING",
            "siem_hec.token_env: environment variable MISSING is not set",
        ),
        (
            "EMPTY",
            "siem_hec.token_env: environment variable EMPTY is empty",
        ),
        (
            "MULTI",
            "siem_hec.token_env: environment variable MULTI contains a line break or NUL",
        ),
        (
            "bad name",
            "siem_hec.token_env: does not name a valid environment variable",
        ),
    ] {
        let e = resolve_env_with("siem_hec.token_env", var, &lookup).unwrap_err();
        assert_eq!(e.to_string(), msg);
        assert_eq!(e.exit_code(), EXIT_INVALID);
        assert!(!e.to_string().contains("a\nb"));
    }
}

#[test]
fn reserved_headers_are_refused_at_send_time() {
    let map = BTreeMap::from([("authorization".to_string(), "X".to_string())]);
    let e = resolve_headers("siem_hec", &map, &["Authorization", "Content-Type"]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "siem_hec.headers_env.authorization: is set by the connector and cannot be overridden"
    );
    let map = BTreeMap::from([("Host".to_string(), "X".to_string())]);
    let e = resolve_headers("otlp", &map, &[]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "otlp.headers_env.Host: is set by the connector and cannot be overridden"
    );
}

#[test]
fn retries_are_bounded_and_spaced() {
    let retry = Retry::new(3, 0.02);
    assert_eq!(retry.attempts(), 4);
    let calls = Cell::new(0);
    let start = Instant::now();
    let r: Result<(), _> = with_retries("t", &retry, |n| {
        calls.set(calls.get() + 1);
        assert_eq!(n, calls.get());
        Err(Failure::Retryable(format!("attempt {n}")))
    });
    let (f, attempts) = r.unwrap_err();
    assert_eq!((attempts, calls.get()), (4, 4));
    assert_eq!(f, Failure::Retryable("attempt 4".into()));
    assert!(start.elapsed() >= Duration::from_millis(60), "3 pauses");

    // A permanent failure stops at once; a success after failures returns the value.
    let calls = Cell::new(0);
    let r: Result<(), _> = with_retries("t", &retry, |_| {
        calls.set(calls.get() + 1);
        Err(Failure::Permanent("400".into()))
    });
    assert_eq!(r.unwrap_err().1, 1);
    assert_eq!(calls.get(), 1);
    let r = with_retries("t", &Retry::new(2, 0.0), |n| {
        if n < 3 {
            Err(Failure::Retryable("x".into()))
        } else {
            Ok(n)
        }
    });
    assert_eq!(r.unwrap(), 3);
    // No retries configured: exactly one attempt.
    let calls = Cell::new(0);
    let _ = with_retries::<()>("t", &Retry::new(0, 0.25), |_| {
        calls.set(calls.get() + 1);
        Err(Failure::Retryable("x".into()))
    });
    assert_eq!(calls.get(), 1);
}

#[test]
fn size_guard() {
    assert!(check_size("otlp.max_request_bytes", "OTLP request", 1024, 1024).is_ok());
    let e = check_size("otlp.max_request_bytes", "OTLP request", 1025, 1024).unwrap_err();
    assert_eq!(
        e.to_string(),
        "OTLP request is 1025 bytes, over otlp.max_request_bytes 1024; nothing was sent"
    );
    assert_eq!(e.exit_code(), EXIT_FAILURE);
}

fn http_plan(body: &str, limit: u64) -> Plan {
    Plan {
        delivery: Delivery::Http {
            requests: vec![HttpRequest {
                method: Method::Post,
                url: "https://siem.example/services/collector/event".into(),
                headers: vec![
                    Header::secret(
                        "Authorization",
                        Secret::new("tok-1".into()).prefixed("Splunk "),
                    ),
                    Header::plain("Content-Type", "application/json"),
                ],
                body: body.as_bytes().to_vec(),
                check: None,
                what: "HEC event (2 metrics)".into(),
            }],
            timeout: Duration::from_secs(1),
            max_response_bytes: 1024,
        },
        limit: Limit::new("siem_hec", "max_request_bytes", limit),
        retry: Retry::new(0, 0.0),
        metrics: 2,
        redact: vec!["ocid1.compartment.oc1..aaaa".into()],
    }
}

#[test]
fn echoed_bare_credentials_are_scrubbed_too() {
    // A receiver may echo the token without its `Splunk ` / `Bearer ` scheme.
    let plan = http_plan("{}", 4096);
    let echoed = "403 from receiver: token tok-1 is invalid (header was Splunk tok-1)";
    let text = plan_secrets(&plan).scrub(echoed).into_owned();
    assert_eq!(
        text,
        "403 from receiver: token <redacted> is invalid (header was <redacted>)"
    );
}

#[test]
fn dry_run_redacts_header_secrets_and_listed_strings() {
    let plan = http_plan(
        r#"{"compartment":"ocid1.compartment.oc1..aaaa","echo":"Splunk tok-1"}"#,
        4096,
    );
    let mut out = Vec::new();
    write_dry_run("siem-hec-export", &plan, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(
        text,
        "# svc-observe siem-hec-export --dry-run: 1 request, 2 metrics; nothing sent\n\
         POST https://siem.example/services/collector/event\n\
         Authorization: <redacted>\n\
         Content-Type: application/json\n\
         \n\
         {\"compartment\":\"<redacted>\",\"echo\":\"<redacted>\"}\n"
    );
}

#[test]
fn whole_plan_is_size_checked_before_sending() {
    assert!(check_sizes(&http_plan("{}", 1024)).is_ok());
    let big = "x".repeat(2000);
    let e = check_sizes(&http_plan(&big, 1024)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "HEC event (2 metrics) is 2000 bytes, over siem_hec.max_request_bytes 1024; nothing was sent"
    );
    let plan = Plan {
        delivery: Delivery::Datagrams {
            target: DatagramTarget::Udp {
                host: "127.0.0.1".into(),
                port: 9,
            },
            datagrams: vec![
                ("a".into(), vec![b'a'; 10]),
                ("svc.b".into(), vec![b'b'; 65]),
            ],
            timeout: Duration::from_secs(1),
        },
        limit: Limit::new("statsd", "max_datagram_bytes", 64),
        retry: Retry::new(0, 0.0),
        metrics: 2,
        redact: Vec::new(),
    };
    assert_eq!(
        check_sizes(&plan).unwrap_err().to_string(),
        "svc.b is 65 bytes, over statsd.max_datagram_bytes 64; nothing was sent"
    );
}

#[test]
fn registry_commands_are_unique_and_consistent() {
    let mut seen = Vec::new();
    for c in CONNECTORS {
        assert!(c.command.ends_with("-export"), "{}", c.command);
        // `<block>-export`; the monitoring blocks drop `_monitoring` (`cloud-a-export`).
        let derived = c.command.trim_end_matches("-export").replace('-', "_");
        assert!(
            c.block == derived || c.block == format!("{derived}_monitoring"),
            "{} / {}",
            c.command,
            c.block
        );
        assert!(!seen.contains(&c.command), "{} twice", c.command);
        seen.push(c.command);
        assert!(c
            .help
            .starts_with(&format!("Usage: svc-observe {} ", c.command)));
        assert_eq!(find(c.command), Some(*c));
    }
    assert_eq!(find("scrape-http"), None);
}

#[test]
fn disabled_connectors_read_nothing() {
    let policy = Policy::parse(
        r#"{"schema": "svc.observability.policy.v1", "enabled": true,
            "otlp": {"endpoint": "http://127.0.0.1:4318/v1/metrics"}}"#,
    )
    .unwrap();
    let args = ExportArgs {
        snapshot: Some("/nonexistent/snapshot.json".into()),
        policy: "/nonexistent/policy.json".into(),
        dry_run: false,
        allow_stale: false,
    };
    let mut out = Vec::new();
    assert_eq!(
        run_with_policy(&otlp::CONNECTOR, &policy, &args, &mut out).unwrap(),
        Outcome::Disabled("otlp.enabled=false".into())
    );
    let off = Policy::disabled();
    assert_eq!(
        run_with_policy(&syslog::CONNECTOR, &off, &args, &mut out).unwrap(),
        Outcome::Disabled("enabled=false".into())
    );
}

#[test]
fn epoch_conversion() {
    assert_eq!(epoch_nanos(1_718_000_000.25), 1_718_000_000_250_000_000);
    assert_eq!(epoch_nanos(-1.0), 0);
    assert_eq!(epoch_nanos(f64::NAN), 0);
}

/// A receiver answering every request on one connection with `status` and `body`.
fn hostile_receiver(status: u16, body: Vec<u8>) -> (String, std::thread::JoinHandle<()>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/collect", listener.local_addr().unwrap());
    let server = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let (mut line, mut length) = (String::new(), 0usize);
        while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
            line.clear();
        }
        let _ = reader.read_exact(&mut vec![0; length]);
        let mut out = stream;
        let head = format!(
            "HTTP/1.1 {status} No\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let _ = out.write_all(head.as_bytes());
        let _ = out.write_all(&body);
    });
    (url, server)
}

#[test]
fn a_hostile_answer_is_bounded_escaped_and_scrubbed_in_the_failure() {
    let forged = "denied for tok-1\n2026-01-01T00:00:00.000Z INFO  [main] exported\x1b[2J\u{202e}";
    let mut body = forged.as_bytes().to_vec();
    body.extend(std::iter::repeat_n(b'z', 1 << 20));
    let (url, server) = hostile_receiver(400, body);
    let mut plan = http_plan("{}", 4096);
    let Delivery::Http { requests, .. } = &mut plan.delivery else {
        unreachable!()
    };
    let mut req = requests.remove(0);
    req.url = url;
    let agent = transport::http_agent(Duration::from_secs(10)).unwrap();
    let failure = transport::send_http(
        &agent,
        &req,
        2 << 20,
        &Secrets::of(["tok-1"]),
        Duration::from_secs(10),
    )
    .unwrap_err();
    server.join().unwrap();
    let Failure::Permanent(text) = failure else {
        panic!("a 400 is permanent: {failure:?}")
    };
    assert!(
        text.starts_with("HTTP 400: denied for <redacted>\\n2026-01-01"),
        "{text}"
    );
    assert!(!text.contains(['\n', '\x1b', '\u{202e}']), "{text}");
    assert!(text.len() < 300, "{} bytes", text.len());

    // A 2xx whose body check quotes the receiver: the same bounds.
    let hec = format!(
        r#"{{"code": 7, "text": {}}}"#,
        serde_json::json!(forged.repeat(500))
    );
    let why = siem_hec::check_answer(hec.as_bytes()).unwrap_err();
    assert!(
        !why.contains(['\n', '\x1b', '\u{202e}']) && why.len() < 400,
        "{why}"
    );
}

/// OCI's 2xx answer quoting a secret where the check's 200-character cut falls inside it: the
/// body is scrubbed before the check cuts it, so no part of the secret shows.
#[test]
fn a_check_cut_never_leaves_part_of_a_secret() {
    let secret = "oci/secret+token-0123456789";
    let body = format!(
        r#"{{"failedMetricsCount": 1, "failedMetrics": [{{"message": "{}{secret} {}"}}]}}"#,
        "m".repeat(190),
        secret.replace('/', "\\/")
    );
    let (url, server) = hostile_receiver(200, body.into_bytes());
    let mut plan = http_plan("{}", 4096);
    let Delivery::Http { requests, .. } = &mut plan.delivery else {
        unreachable!()
    };
    let mut req = requests.remove(0);
    req.url = url;
    req.check = Some(oci::check_answer);
    let agent = transport::http_agent(Duration::from_secs(10)).unwrap();
    let failure = transport::send_http(
        &agent,
        &req,
        1 << 20,
        &Secrets::of([secret]),
        Duration::from_secs(10),
    )
    .unwrap_err();
    server.join().unwrap();
    let Failure::Permanent(text) = failure else {
        panic!("a rejection is permanent: {failure:?}")
    };
    assert!(
        text.starts_with("OCI rejected 1 metric of the batch"),
        "{text}"
    );
    assert!(!text.contains(&secret[..4]), "{text}");
}

/// The wait before another attempt never runs past the deadline.
#[test]
fn retries_never_wait_past_the_deadline() {
    let started = Instant::now();
    let end = Some(started + Duration::from_millis(200));
    let r: Result<(), _> = with_retries_until("t", &Retry::new(1, 30.0), end, |_| {
        Err(Failure::Retryable("busy".into()))
    });
    assert_eq!(r.unwrap_err().1, 2);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}
