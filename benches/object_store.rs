//! Object-store sink benchmark against moto (started here, signature checking enforced).
//!
//! Prints, measured in the same run against the same server:
//! 1. raw PUT capacity: objects/s of plain signed PUTs at concurrency C (our client, pooled);
//! 2. sink `write_batch`: objects/s of the sink at the same concurrency, and the ratio to 1;
//! 3. local ports: TIME_WAIT sockets towards the server after N PUTs with keep-alive (the
//!    sink's client) and with one connection per request (what rust-s3's sync backend does).
//!
//! Run: `cargo bench --bench object_store` (env: SVC_BENCH_OBJECTS, default 2000;
//! SVC_BENCH_CONCURRENCY, default 16; SVC_TEST_PYTHON, default python3).

#[path = "../tests/moto/mod.rs"]
mod moto;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use svc::config::RuntimeConfig;
use svc::envelope::{normalize, EnvelopeConfig, RawMessage};
use svc::metrics::Metrics;
use svc::sink::object_store::client::{ClientOptions, Endpoint, S3Client};
use svc::sink::object_store::config::AddressingStyle;
use svc::sink::object_store::credentials::Credentials;
use svc::sink::object_store::ObjectStoreSink;
use svc::sink::{Sink, SinkConfig};

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn client(m: &moto::Moto, bucket: &str, pool: usize) -> S3Client {
    S3Client::new(
        Endpoint {
            https: false,
            authority: format!("127.0.0.1:{}", m.port),
            default: false,
        },
        bucket,
        "us-east-1",
        AddressingStyle::Path,
        Credentials {
            access_key_id: m.key_id.clone(),
            secret_access_key: m.secret.clone(),
            session_token: None,
            source: "bench".into(),
        },
        ClientOptions {
            timeout: Duration::from_secs(30),
            pool_per_host: pool,
            ca_pem: None,
        },
    )
    .unwrap()
}

/// `n` PUTs of `body` from `threads` threads; objects/s.
fn raw_puts(c: &S3Client, tag: &str, n: usize, threads: usize, body: &[u8]) -> f64 {
    let next = AtomicUsize::new(0);
    let headers = vec![
        ("content-type".to_string(), "application/json".to_string()),
        ("if-none-match".to_string(), "*".to_string()),
    ];
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (next, headers) = (&next, &headers);
            std::thread::Builder::new()
                .name(format!("bench-put-{t}"))
                .spawn_scoped(s, move || loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    c.put_object(&format!("raw-{tag}/{i}.json"), body, headers)
                        .expect("raw put");
                })
                .unwrap();
        }
    });
    n as f64 / start.elapsed().as_secs_f64()
}

/// TIME_WAIT sockets whose peer is the server's port.
fn time_wait(port: u16) -> usize {
    let out = Command::new("ss")
        .args(["-tan", "state", "time-wait"])
        .arg(format!("( dport = :{port} )"))
        .output()
        .expect("ss");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .count()
}

fn main() {
    let n = env_num("SVC_BENCH_OBJECTS", 2000);
    let conc = env_num("SVC_BENCH_CONCURRENCY", 16);
    let m = moto::Moto::start();
    m.create_bucket("bench", false);
    let envelope = |seq: u64| {
        normalize(
            &RawMessage {
                subject: "orders.created".into(),
                stream: "ORDERS".into(),
                consumer: "svc".into(),
                stream_sequence: seq,
                consumer_sequence: seq,
                delivery_count: 1,
                published_unix_nanos: Some(1_700_000_000_000_000_000),
                headers: vec![],
                data: format!(r#"{{"order": {seq}, "note": "{}"}}"#, "x".repeat(120)).into_bytes(),
            },
            1_700_000_001_000_000_000,
            &EnvelopeConfig::default(),
        )
        .0
    };
    let sample = serde_json::to_vec(&svc::sink::object_store::body::StoredObject::new(
        &envelope(1),
    ))
    .unwrap();

    println!(
        "object_store bench: {n} objects, concurrency {conc}, body {} bytes",
        sample.len()
    );
    let pooled = client(&m, "bench", conc + 2);
    // Warm-up (moto's first requests are slower).
    raw_puts(&pooled, "warm", 100, conc, &sample);

    let raw = raw_puts(&pooled, "cap", n, conc, &sample);
    println!("raw PUT capacity:        {raw:8.0} objects/s");

    let doc = json!({
        "nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c", "subject": "a.>"},
        "sink": {"type": "object_store", "bucket": "bench", "endpoint_url": m.endpoint(),
                 "allow_http_for_local_testing": true, "credential_mode": "environment",
                 "access_key_id_env": "T_KEY_ID", "secret_access_key_env": "T_SECRET",
                 "key_strategy": "stream_sequence", "max_concurrent_puts": conc},
    });
    let SinkConfig::ObjectStore(cfg) = RuntimeConfig::parse(&doc.to_string()).unwrap().sink else {
        unreachable!()
    };
    let sink = ObjectStoreSink::with_env(*cfg, Arc::new(Metrics::default()), &m.env()).unwrap();
    let batch_size = 256;
    let start = Instant::now();
    let mut seq = 1u64;
    while (seq as usize) <= n {
        let end = (seq + batch_size).min(n as u64 + 1);
        let batch: Vec<_> = (seq..end).map(envelope).collect();
        for o in sink.write_batch(&batch) {
            assert!(o.is_durable(), "{o:?}");
        }
        seq = end;
    }
    let sink_rate = n as f64 / start.elapsed().as_secs_f64();
    let raw_after = raw_puts(&pooled, "cap2", n, conc, &sample);
    println!("raw PUT capacity again:  {raw_after:8.0} objects/s");
    let raw = (raw + raw_after) / 2.0;
    println!(
        "sink write_batch:        {sink_rate:8.0} objects/s (batch {batch_size}), ratio {:.2}",
        sink_rate / raw
    );

    // Local ports: keep-alive versus one connection per request.
    let before = time_wait(m.port);
    raw_puts(&client(&m, "bench", conc + 2), "tw-pool", n, conc, &sample);
    let after_pooled = time_wait(m.port);
    raw_puts(&client(&m, "bench", 0), "tw-nopool", n, conc, &sample);
    let after_unpooled = time_wait(m.port);
    println!(
        "TIME_WAIT towards the server after {n} PUTs: keep-alive pool {}, connection per \
         request {}",
        after_pooled.saturating_sub(before),
        after_unpooled.saturating_sub(after_pooled)
    );
}
