//! Rows per second into PostgreSQL and into MariaDB (`engine: "mysql"`), end to end, against
//! baselines measured in the same run, in rounds: a host whose load moves during the run moves
//! the measurements of one round alike, and the medians over rounds are the figures to quote.
//!
//! ```text
//! cargo bench --bench relational_throughput             # 5 rounds of 20000 messages (~205 bytes)
//! cargo bench --bench relational_throughput -- 10000 5  # 5 rounds of 10000
//! ```
//!
//! Under `cargo test --all-targets` it runs a smoke pass of 3 rounds of 500 messages.
//!
//! Per engine and round: (a) the raw fetch+ack rate of the broker client with no sink (the
//! broker limit), then, in an order that rotates by round (b c d, c d b, d b c) so that no
//! measurement always comes first, (b) the relational sink alone: `RelationalSink::write_batch`
//! from two threads in batches of 256, no broker (the database limit for this sink), (c) `svc
//! run` into the relational sink (also counted from the first ACK, without the runner's
//! start-up: process, broker bind, database connect), and (d) the engine's bulk path for the
//! same rows: for PostgreSQL one `COPY ... FROM STDIN (FORMAT csv)` through `psql`, for MariaDB
//! the sink's multi-row INSERTs (256 rows, one transaction each) piped through the `mariadb`
//! command-line client. Each round prints the ratios of (c) to (b) and of (b) to (d), and CPU
//! microseconds per row of the writer, the broker and the database (where the time goes on a
//! host where all three share two cores); then the median of each over the rounds. Every round
//! writes new tables and reads the same published messages through new durable consumers.
//! `SVC_BENCH_WRAPPER="valgrind --tool=callgrind"` runs `svc` under that tool;
//! `SVC_BENCH_PIN=1` puts the database on the last CPU.

mod sinkbench;

use std::path::Path;
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

/// What one round measured.
struct Round {
    /// (a) and its CPU microseconds per message: the client's, the broker's.
    raw: f64,
    raw_cpu_us: (f64, f64),
    alone: Cost,
    e2e: Cost,
    run: sinkbench::Run,
    bulk: f64,
}

impl Round {
    /// (c) counted from the first ACK.
    fn steady(&self, n: usize) -> f64 {
        n as f64 / (n as f64 / self.e2e.rate - self.run.first_ack_s).max(1e-9)
    }
}

/// One engine as the rounds use it: its sink block for a table, its row count, its bulk path
/// into a new table, and the CPU seconds of its database so far.
struct Engine<'a> {
    /// The consumers' and tables' tag.
    tag: &'static str,
    title: &'static str,
    bulk_line: &'static str,
    sink: &'a dyn Fn(&str) -> serde_json::Value,
    count: &'a dyn Fn(&str) -> usize,
    bulk: &'a dyn Fn(usize, &str) -> f64,
    db_cpu: &'a dyn Fn() -> f64,
}

/// The measurement after (a), in the order the round takes them.
#[derive(Clone, Copy)]
enum Step {
    Alone,
    EndToEnd,
    Bulk,
}

/// `rounds` rounds of (a) then (b), (c), (d) in rotating order; prints each round and the
/// medians.
fn measure(engine: &Engine, broker: &support::Broker, n: usize, rounds: usize, dir: &Path) {
    println!();
    println!("{}", engine.title);
    let mut done = Vec::new();
    for r in 0..rounds {
        let mut order = [Step::Alone, Step::EndToEnd, Step::Bulk];
        order.rotate_left(r % 3);
        let (raw, raw_cpu_us) = raw_round(broker, &format!("raw-{}-{r}", engine.tag), n);
        let (mut alone, mut e2e, mut bulk) = (None, None, None);
        for step in order {
            match step {
                Step::Alone => {
                    let table = format!("direct_r{r}");
                    alone = Some(sink_alone((engine.sink)(&table), n, engine.db_cpu));
                    assert_eq!((engine.count)(&table), n);
                }
                Step::EndToEnd => {
                    let table = format!("events_r{r}");
                    e2e = Some(sinkbench::run_svc(
                        &broker.url,
                        Some(broker),
                        "REL",
                        "rel.>",
                        &format!("svc-{}-{r}", engine.tag),
                        n,
                        (engine.sink)(&table),
                        dir,
                        &[],
                        engine.db_cpu,
                    ));
                    assert_eq!((engine.count)(&table), n, "every message is one row");
                }
                Step::Bulk => bulk = Some((engine.bulk)(n, &format!("bulk_r{r}"))),
            }
        }
        let run = e2e.expect("measured");
        let round = Round {
            raw,
            raw_cpu_us,
            alone: alone.expect("measured"),
            e2e: cost_of(&run),
            run,
            bulk: bulk.expect("measured"),
        };
        print_round(engine, r, &order, &round, n);
        done.push(round);
    }
    print_medians(&done, n);
}

/// (a) on a new consumer: the rate and the CPU microseconds per message of the client (this
/// process) and the broker.
fn raw_round(broker: &support::Broker, consumer: &str, n: usize) -> (f64, (f64, f64)) {
    support::create_consumer(
        &broker.url,
        "REL",
        consumer,
        "rel.>",
        Duration::from_secs(60),
    )
    .unwrap();
    let (broker_before, own_before) = (
        broker.cpu_seconds(),
        support::process_cpu_seconds(std::process::id()),
    );
    let raw = support::raw_fetch_ack(
        &broker.url,
        "REL",
        consumer,
        "rel.>",
        n,
        256,
        Duration::ZERO,
    )
    .unwrap();
    let us = |s: f64| s * 1e6 / n as f64;
    (
        raw,
        (
            us(support::process_cpu_seconds(std::process::id()) - own_before),
            us(broker.cpu_seconds() - broker_before),
        ),
    )
}

fn print_round(engine: &Engine, r: usize, order: &[Step; 3], x: &Round, n: usize) {
    let names: Vec<&str> = order
        .iter()
        .map(|s| match s {
            Step::Alone => "b",
            Step::EndToEnd => "c",
            Step::Bulk => "d",
        })
        .collect();
    println!("round {} (a, then {}):", r + 1, names.join(", "));
    println!(
        "  (a) raw fetch+ack, no sink (broker limit)       {:>9.0} msg/s   CPU per message: client {:.1} us, broker {:.1} us",
        x.raw, x.raw_cpu_us.0, x.raw_cpu_us.1
    );
    println!(
        "  (b) relational sink alone, 2 threads x 256/tx   {:>9.0} rows/s",
        x.alone.rate
    );
    println!("      {}", x.alone.per_row(n));
    println!(
        "  (c) svc run -> relational_db, end to end        {:>9.0} rows/s   {:.2}x of (b), {:.2}x of (a)",
        x.e2e.rate,
        x.e2e.rate / x.alone.rate,
        x.e2e.rate / x.raw
    );
    println!("      {}", x.e2e.per_row(n));
    println!(
        "      after the first ACK: {:>9.0} rows/s, {:.2}x of (b) (first ACK after {:.2} s; {} sink batches, mean {:.1} rows and {:.1} ms per batch)",
        x.steady(n),
        x.steady(n) / x.alone.rate,
        x.run.first_ack_s,
        x.run.batches,
        n as f64 / x.run.batches.max(1) as f64,
        x.run.mean_batch_ms
    );
    println!(
        "  (d) {:<44}{:>9.0} rows/s   (b) is {:.2}x of (d)",
        engine.bulk_line,
        x.bulk,
        x.alone.rate / x.bulk
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        l if l % 2 == 1 => v[l / 2],
        l => (v[l / 2 - 1] + v[l / 2]) / 2.0,
    }
}

fn print_medians(rounds: &[Round], n: usize) {
    let m = |f: &dyn Fn(&Round) -> f64| median(rounds.iter().map(f).collect());
    let us = |s: f64| s * 1e6 / n as f64;
    println!(
        "median of {} rounds: (c) {:.2}x of (b), {:.2}x after the first ACK; (b) {:.2}x of (d)",
        rounds.len(),
        m(&|x| x.e2e.rate / x.alone.rate),
        m(&|x| x.steady(n) / x.alone.rate),
        m(&|x| x.alone.rate / x.bulk)
    );
    println!(
        "  rates: (a) {:.0} msg/s, (b) {:.0}, (c) {:.0} ({:.0} after the first ACK), (d) {:.0} rows/s",
        m(&|x| x.raw),
        m(&|x| x.alone.rate),
        m(&|x| x.e2e.rate),
        m(&|x| x.steady(n)),
        m(&|x| x.bulk)
    );
    println!(
        "  CPU per row of (c): svc {:.1} us, broker {:.1} us, database {:.1} us; of (b): writer {:.1} us, database {:.1} us",
        m(&|x| us(x.e2e.writer_cpu_s)),
        m(&|x| us(x.e2e.broker_cpu_s)),
        m(&|x| us(x.e2e.db_cpu_s)),
        m(&|x| us(x.alone.writer_cpu_s)),
        m(&|x| us(x.alone.db_cpu_s))
    );
}

/// PostgreSQL's bulk path for the same rows: one `COPY ... FROM STDIN (FORMAT csv)` of all `n`
/// through `psql` (one connection, one transaction), into a new `table` made by the sink's DDL.
fn psql_copy(db: &TestDb, n: usize, dir: &Path, table: &str) -> f64 {
    db.create_tables(&db.sink(serde_json::json!({ "table": table })));
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
        "COPY {table} ({}) FROM STDIN WITH (FORMAT csv)",
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
    assert_eq!(db.count(table), n as i64);
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
/// transaction each) piped through the `mariadb` command-line client, into a new `table` made
/// by the sink's DDL.
fn mariadb_cli(db: &MyDb, n: usize, dir: &Path, table: &str) -> f64 {
    let probe = svc::sink::relational::my_sink::MySqlSink::new(
        sinkbench::postgres::parse_cfg(&my_sink(db, table)),
        Arc::new(svc::metrics::Metrics::default()),
    )
    .unwrap();
    svc::sink::Sink::check(&probe).unwrap();
    let name = svc::sink::relational::TableName::parse(table).unwrap();
    let mut sql = String::from("SET autocommit = 0;\n");
    for batch in envelopes(n).chunks(256) {
        sql.push_str(
            &svc::sink::relational::my_sink::insert_statement(&name, batch, false).unwrap(),
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
    assert_eq!(my_count(db, table), n);
    n as f64 / secs
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

/// Messages per round and rounds: the first two numeric arguments, else 20000 and 5 (500 and
/// 3 in the smoke pass).
fn args() -> (usize, usize) {
    let numbers: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let n = numbers
        .first()
        .copied()
        .unwrap_or(if sinkbench::full() { 20_000 } else { 500 });
    let rounds = if sinkbench::full() { 5 } else { 3 };
    (n, numbers.get(1).copied().unwrap_or(rounds).max(1))
}

fn main() {
    // Under `cargo test` this runs unoptimized as a smoke pass: its ratios and rates are not
    // measurements, and printed bare they contradict the published figures.
    if cfg!(debug_assertions) || !sinkbench::full() {
        println!(
            "== SMOKE PASS, NOT A MEASUREMENT (debug build or no --bench): the figures below \
             only prove the bench runs; measure with `cargo bench --bench relational_throughput`"
        );
    }
    // SVC_BENCH_PIN=1: the database on the last CPU, as on a host of its own.
    let pin = support::pin_off_last_cpu();
    let (n, rounds) = args();
    let dir = tempfile::tempdir().unwrap();
    let broker = sinkbench::start_broker();
    support::create_stream(&broker.url, "REL", &["rel.>"]).unwrap();
    let p = support::publish(&broker.url, "REL", "rel.orders", n, SIZE).unwrap();
    println!("published {n} messages of {SIZE} bytes ({p:.0} msg/s); {rounds} rounds per engine, each reading all {n}");
    match pin {
        Some(cpu) => println!(
            "pinned (SVC_BENCH_PIN=1): the database on CPU {cpu}, the bench, nats-server and svc \
             on the other CPUs"
        ),
        None => println!("not pinned: database, broker and svc share every CPU"),
    }

    let db = TestDb::new("rel");
    let pg_pin = pin.map(|cpu| PinBackends::start(cpu, &db.name));
    let backends = || sinkbench::cpu_of_processes("postgres: ", &format!(" {} ", db.name));
    measure(
        &Engine {
            tag: "pg",
            title: "engine postgres: PostgreSQL + broker + svc on one 2-core host (database CPU: \
                    the backends of this run's database only)",
            bulk_line: "COPY ... FROM STDIN (csv) through psql",
            sink: &|t| db.sink(serde_json::json!({"table": t, "auto_create_tables": true})),
            count: &|t| db.count(t) as usize,
            bulk: &|n, t| psql_copy(&db, n, dir.path(), t),
            db_cpu: &backends,
        },
        &broker,
        n,
        rounds,
        dir.path(),
    );
    drop(pg_pin);

    let _my_pin = pin.map(PinMariadbd::start);
    let my = MyDb::new("bench");
    let mariadbd = || sinkbench::cpu_of_processes("/usr/sbin/mariadbd", "");
    measure(
        &Engine {
            tag: "my",
            title: "engine mysql: MariaDB + broker + svc on one 2-core host (database CPU: the \
                    whole mariadbd, other clients of it included)",
            bulk_line: "mariadb client, same INSERTs, 256/tx",
            sink: &|t| my_sink(&my, t),
            count: &|t| my_count(&my, t),
            bulk: &|n, t| mariadb_cli(&my, n, dir.path(), t),
            db_cpu: &mariadbd,
        },
        &broker,
        n,
        rounds,
        dir.path(),
    );
}
