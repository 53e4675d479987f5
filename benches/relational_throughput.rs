//! Rows per second into PostgreSQL and into MariaDB (`engine: "mysql"`), end to end, against
//! baselines measured in the same run.
//!
//! ```text
//! cargo bench --bench relational_throughput            # N = 50000 messages of ~205 bytes
//! cargo bench --bench relational_throughput -- 20000   # smaller N
//! ```
//!
//! Under `cargo test --all-targets` it runs a smoke pass of 1000 messages.
//!
//! Prints (a) the raw fetch+ack rate of the broker client with no sink (the broker limit),
//! (b) the relational sink alone: `RelationalSink::write_batch` from two threads in batches of
//! 256, no broker (the database limit for this sink), (c) `svc run` into the relational sink,
//! and the ratios of (c) to (a) and (b); also (c) counted from the first ACK (without the
//! runner's start-up: process, broker bind, database connect), and (d) PostgreSQL's bulk path
//! for the same rows: one `COPY ... FROM STDIN (FORMAT csv)` through `psql`, with the ratio of
//! (b) to (d). Then the same for MariaDB on 127.0.0.1:3306, where (d) is the sink's multi-row
//! INSERTs (256 rows, one transaction each) piped through the `mariadb` command-line client.
//! (b) and (c) also print CPU microseconds per row of the writer, the broker and the database,
//! to show where the time goes on a host where all three share two cores.
//! `SVC_BENCH_WRAPPER="valgrind --tool=callgrind"` runs `svc` under that tool.

mod sinkbench;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sinkbench::mysql::MyDb;
use sinkbench::postgres::TestDb;
use sinkbench::{support, SIZE};
use svc::message::envelope::{normalize, EnvelopeConfig, RawMessage};

/// What one measurement cost: its rate and the CPU seconds of the writer (the bench's own
/// threads, or `svc`), the broker and the database (its sessions of this run's database).
struct Cost {
    rate: f64,
    writer_cpu_s: f64,
    broker_cpu_s: f64,
    db_cpu_s: f64,
}

impl Cost {
    /// CPU microseconds per row: writer, broker, database, and the sum.
    fn per_row(&self, n: usize) -> String {
        let us = |s: f64| s * 1e6 / n as f64;
        format!(
            "CPU per row: writer {:.1} us, broker {:.1} us, database {:.1} us, all {:.1} us",
            us(self.writer_cpu_s),
            us(self.broker_cpu_s),
            us(self.db_cpu_s),
            us(self.writer_cpu_s + self.broker_cpu_s + self.db_cpu_s)
        )
    }
}

/// The sink alone: `n` envelopes written by two threads in batches of 256.
fn sink_alone(sink_json: serde_json::Value, n: usize, db_cpu: &dyn Fn() -> f64) -> Cost {
    let cfg = svc::config::RuntimeConfig::parse(
        &serde_json::json!({
            "nats": {"url": "nats://127.0.0.1:1", "stream": "S", "consumer": "c", "subject": "a"},
            "sink": sink_json,
        })
        .to_string(),
    )
    .unwrap();
    let sink = cfg
        .sink
        .build(Arc::new(svc::metrics::Metrics::default()))
        .unwrap();
    sink.check().unwrap(); // creates the table and warms a connection
    let envelopes = envelopes(n);
    let (own_before, db_before) = (support::process_cpu_seconds(std::process::id()), db_cpu());
    let start = Instant::now();
    std::thread::scope(|s| {
        for half in envelopes.chunks(n.div_ceil(2)) {
            let sink = &sink;
            s.spawn(move || {
                for batch in half.chunks(256) {
                    let out = sink.write_batch(batch);
                    assert!(out.iter().all(|o| o.is_durable()), "{:?}", out[0]);
                }
            });
        }
    });
    Cost {
        rate: n as f64 / start.elapsed().as_secs_f64(),
        writer_cpu_s: support::process_cpu_seconds(std::process::id()) - own_before,
        broker_cpu_s: 0.0,
        db_cpu_s: db_cpu() - db_before,
    }
}

/// A run of `svc` as a [`Cost`].
fn cost_of(run: &sinkbench::Run) -> Cost {
    Cost {
        rate: run.rate,
        writer_cpu_s: run.svc_cpu_s,
        broker_cpu_s: run.broker_cpu_s,
        db_cpu_s: run.db_cpu_s,
    }
}

/// Lines (a) to (c) with their ratios and CPU per row.
fn print_parts(raw: f64, alone: &Cost, e2e: &Cost, run: &sinkbench::Run, n: usize) {
    println!("  (a) raw fetch+ack, no sink (broker limit)       {raw:>9.0} msg/s");
    println!(
        "  (b) relational sink alone, 2 threads x 256/tx   {:>9.0} rows/s",
        alone.rate
    );
    println!("      {}", alone.per_row(n));
    println!(
        "  (c) svc run -> relational_db, end to end        {:>9.0} rows/s   ratio {:.2}x of (a), {:.2}x of (b)",
        e2e.rate,
        e2e.rate / raw,
        e2e.rate / alone.rate
    );
    println!("      {}", e2e.per_row(n));
    let steady = n as f64 / (n as f64 / e2e.rate - run.first_ack_s).max(1e-9);
    println!(
        "      after the first ACK: {steady:>9.0} rows/s   ratio {:.2}x of (b)",
        steady / alone.rate
    );
    println!(
        "      (first ACK after {:.2} s; {} sink batches, mean {:.1} rows and {:.1} ms per batch)",
        run.first_ack_s,
        run.batches,
        n as f64 / run.batches.max(1) as f64,
        run.mean_batch_ms
    );
}

/// PostgreSQL's bulk path for the same rows: one `COPY ... FROM STDIN (FORMAT csv)` of all `n`
/// through `psql` (one connection, one transaction), into a table made by the sink's DDL.
fn psql_copy(db: &TestDb, n: usize, dir: &std::path::Path) -> f64 {
    db.create_tables(&db.sink(serde_json::json!({"table": "copied"})));
    let mut names = Vec::new();
    let mut csv = String::new();
    for env in envelopes(n) {
        let (cols, row) = svc::sink::relational::row_columns_and_object(&env);
        let fields: Vec<String> = cols.iter().map(|c| csv_field(c, &row[*c])).collect();
        csv.push_str(&fields.join(","));
        csv.push('\n');
        names = cols;
    }
    let file = dir.join("copy.csv");
    std::fs::write(&file, csv).unwrap();
    let copy = format!(
        "COPY copied ({}) FROM STDIN WITH (FORMAT csv)",
        names.join(", ")
    );
    let start = Instant::now();
    let status = std::process::Command::new("psql")
        .args([
            "-q",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            &db.name,
            "-c",
            &copy,
        ])
        .stdin(std::fs::File::open(&file).unwrap())
        .status()
        .expect("psql (scripts/deps.sh)");
    let secs = start.elapsed().as_secs_f64();
    assert!(status.success());
    assert_eq!(db.count("copied"), n as i64);
    n as f64 / secs
}

/// One CSV field as `COPY` reads it: NULL unquoted and empty; text, JSON and arrays quoted.
fn csv_field(column: &str, v: &serde_json::Value) -> String {
    let jsonb = column == "payload" || column.ends_with("_json");
    let text = match v {
        _ if jsonb && (column == "payload" || !v.is_null()) => v.to_string(),
        serde_json::Value::Null => return String::new(),
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Bool(b) => b.to_string(),
        serde_json::Value::Number(n) => n.to_string(),
        // `labels_list` (text[]): PostgreSQL's array literal.
        serde_json::Value::Array(items) if items.iter().all(|i| i.is_string()) => {
            let quoted: Vec<String> = items
                .iter()
                .map(|i| serde_json::to_string(i).unwrap())
                .collect();
            format!("{{{}}}", quoted.join(","))
        }
        other => other.to_string(),
    };
    format!("\"{}\"", text.replace('"', "\"\""))
}

/// The bench's `n` envelopes of `SIZE`-byte JSON payloads.
fn envelopes(n: usize) -> Vec<svc::message::envelope::Envelope> {
    (0..n)
        .map(|i| {
            normalize(
                &RawMessage {
                    stream: "DIRECT".into(),
                    consumer: "bench".into(),
                    ..RawMessage::sample("direct.orders", i as u64 + 1, &support::body(i, SIZE))
                },
                svc::message::envelope::now_unix_nanos(),
                &EnvelopeConfig::default(),
            )
            .0
        })
        .collect()
}

/// A `relational_db` block for the MariaDB database `db` (engine mysql).
fn my_sink(db: &MyDb, table: &str) -> serde_json::Value {
    serde_json::json!({
        "type": "relational_db", "engine": "mysql",
        "dsn": format!("mysql://root@127.0.0.1:3306/{}", db.name),
        "tls_mode": "disable", "table": table, "auto_create_tables": true,
    })
}

fn my_count(db: &MyDb, table: &str) -> usize {
    db.rows(&format!("SELECT COUNT(*) FROM `{table}`"))[0][0]
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

/// The engine's bulk path: the same rows as the sink's multi-row INSERTs (256 rows, one
/// transaction each) piped through the `mariadb` command-line client.
fn mariadb_cli(db: &MyDb, n: usize, dir: &std::path::Path) -> f64 {
    let table = svc::sink::relational::TableName::parse("cli").unwrap();
    let mut sql = String::from("SET autocommit = 0;\n");
    for batch in envelopes(n).chunks(256) {
        sql.push_str(
            &svc::sink::relational::my_sink::insert_statement(&table, batch, false).unwrap(),
        );
        sql.push_str(";\nCOMMIT;\n");
    }
    let file = dir.join("cli.sql");
    std::fs::write(&file, sql).unwrap();
    let start = Instant::now();
    let status = std::process::Command::new("mariadb")
        .args(["-uroot", "-h127.0.0.1", "-P3306", &db.name])
        .stdin(std::fs::File::open(&file).unwrap())
        .status()
        .expect("the mariadb client (scripts/deps.sh)");
    let secs = start.elapsed().as_secs_f64();
    assert!(status.success());
    assert_eq!(my_count(db, "cli"), n);
    n as f64 / secs
}

/// The MariaDB half: (b) the sink alone, (c) end to end, (d) the `mariadb` client.
fn mysql_part(broker: &support::Broker, n: usize, raw: f64, dir: &std::path::Path) {
    let db = MyDb::new("bench");
    // The CLI baseline's table: the sink's DDL.
    let probe = svc::sink::relational::my_sink::MySqlSink::new(
        sinkbench::postgres::parse_cfg(&my_sink(&db, "cli")),
        Arc::new(svc::metrics::Metrics::default()),
    )
    .unwrap();
    svc::sink::Sink::check(&probe).unwrap();
    let cli = mariadb_cli(&db, n, dir);
    let mariadbd = || sinkbench::cpu_of_processes("/usr/sbin/mariadbd", "");
    let alone = sink_alone(my_sink(&db, "direct"), n, &mariadbd);
    assert_eq!(my_count(&db, "direct"), n);
    let run = sinkbench::run_svc(
        &broker.url,
        Some(broker),
        "REL",
        "rel.>",
        "svc-my",
        n,
        my_sink(&db, "events"),
        dir,
        &[],
        &mariadbd,
    );
    let e2e = cost_of(&run);
    assert_eq!(my_count(&db, "events"), n, "every message is one row");
    println!();
    println!("relational sink throughput, engine mysql, {SIZE}-byte JSON payloads, MariaDB + broker + svc on one 2-core host");
    print_parts(raw, &alone, &e2e, &run, n);
    println!(
        "  (d) mariadb client, same INSERTs, 256/tx        {cli:>9.0} rows/s   (b) is {:.2}x of (d)",
        alone.rate / cli
    );
    println!("      (MariaDB's CPU is the whole server's: other clients of it count too)");
}

fn taskset(args: &[&str], pid: u32) -> bool {
    std::process::Command::new("taskset")
        .args(args)
        .arg(pid.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Keeps the PostgreSQL backends of one database on `cpu` while it lives: each new backend
/// (they are forked by the shared server's postmaster, which stays unpinned) is moved within
/// 10 ms of appearing.
struct PinBackends {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PinBackends {
    fn start(cpu: usize, database: &str) -> PinBackends {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, needle) = (stop.clone(), format!(" {database} "));
        let thread = std::thread::spawn(move || {
            let mut pinned = std::collections::HashSet::new();
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                for pid in sinkbench::pids_of("postgres: ", &needle) {
                    if !pinned.contains(&pid) && taskset(&["-pc", &cpu.to_string()], pid) {
                        pinned.insert(pid);
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        PinBackends {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for PinBackends {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Moves every thread of the shared `mariadbd` to `cpu`, the last one (new connection threads
/// inherit it), and back to every CPU when dropped.
struct PinMariadbd(Vec<u32>, usize);

impl PinMariadbd {
    fn start(cpu: usize) -> PinMariadbd {
        let pids = sinkbench::pids_of("/usr/sbin/mariadbd", "");
        for &pid in &pids {
            taskset(&["-apc", &cpu.to_string()], pid);
        }
        PinMariadbd(pids, cpu)
    }
}

impl Drop for PinMariadbd {
    fn drop(&mut self) {
        // Not `available_parallelism`: it counts only this (pinned) process's CPUs.
        let all = format!("0-{}", self.1);
        for &pid in &self.0 {
            taskset(&["-apc", &all], pid);
        }
    }
}

fn main() {
    // Under `cargo test` this runs unoptimized as a smoke pass: its ratios and rates are not
    // measurements, and printed bare they contradict the published figures.
    if cfg!(debug_assertions) || !std::env::args().any(|a| a == "--bench") {
        println!(
            "== SMOKE PASS, NOT A MEASUREMENT (debug build or no --bench): the figures below \
             only prove the bench runs; measure with `cargo bench --bench relational_throughput`"
        );
    }
    // SVC_BENCH_PIN=1: the database on the last CPU, as on a host of its own.
    let pin = support::pin_off_last_cpu();
    let n = sinkbench::arg_n(50_000, 1_000);
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::new("rel");
    let pg_pin = pin.map(|cpu| PinBackends::start(cpu, &db.name));
    let broker = sinkbench::start_broker();
    support::create_stream(&broker.url, "REL", &["rel.>"]).unwrap();
    let p = support::publish(&broker.url, "REL", "rel.orders", n, SIZE).unwrap();
    println!("published {n} messages of {SIZE} bytes ({p:.0} msg/s)");

    support::create_consumer(&broker.url, "REL", "raw", "rel.>", Duration::from_secs(60)).unwrap();
    let (broker_before, own_before) = (
        broker.cpu_seconds(),
        support::process_cpu_seconds(std::process::id()),
    );
    let raw =
        support::raw_fetch_ack(&broker.url, "REL", "raw", "rel.>", n, 256, Duration::ZERO).unwrap();
    let raw_cpu = (
        (support::process_cpu_seconds(std::process::id()) - own_before) * 1e6 / n as f64,
        (broker.cpu_seconds() - broker_before) * 1e6 / n as f64,
    );
    let copy = psql_copy(&db, n, dir.path());
    let backends = || sinkbench::cpu_of_processes("postgres: ", &format!(" {} ", db.name));
    let alone = sink_alone(
        db.sink(serde_json::json!({"table": "direct", "auto_create_tables": true})),
        n,
        &backends,
    );
    assert_eq!(db.count("direct"), n as i64);
    let run = sinkbench::run_svc(
        &broker.url,
        Some(&broker),
        "REL",
        "rel.>",
        "svc-rel",
        n,
        db.sink(serde_json::json!({"auto_create_tables": true})),
        dir.path(),
        &[],
        &backends,
    );
    let e2e = cost_of(&run);
    assert_eq!(db.count("events"), n as i64, "every message is one row");

    println!();
    match pin {
        Some(cpu) => println!(
            "pinned (SVC_BENCH_PIN=1): the database on CPU {cpu}, the bench, nats-server and svc \
             on the other CPUs"
        ),
        None => println!("not pinned: database, broker and svc share every CPU"),
    }
    println!("relational sink throughput, {SIZE}-byte JSON payloads, PostgreSQL + broker + svc on one 2-core host");
    print_parts(raw, &alone, &e2e, &run, n);
    println!(
        "      (a) cost CPU per message: client {:.1} us, broker {:.1} us",
        raw_cpu.0, raw_cpu.1
    );
    println!(
        "  (d) COPY ... FROM STDIN (csv) through psql      {copy:>9.0} rows/s   (b) is {:.2}x of (d)",
        alone.rate / copy
    );
    println!("      (database CPU: the backends of this run's database only)");
    drop(pg_pin);
    let _my_pin = pin.map(PinMariadbd::start);
    mysql_part(&broker, n, raw, dir.path());
}
