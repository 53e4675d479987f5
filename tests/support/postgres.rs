//! PostgreSQL for the tests: connection parameters for the shared server on 127.0.0.1:5432
//! (trust auth, so `require_auth` is `none` explicitly) and a database of a test's own,
//! dropped at the end.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::json;
use svc::db::postgres::{AuthPolicy, ChannelBindingMode, ConnectParams, Connection, TlsMode};
use svc::message::envelope::{normalize, Envelope, EnvelopeConfig, RawMessage};
use svc::metrics::Metrics;
use svc::sink::relational::{RelationalConfig, RelationalSink};

pub fn pg_params(database: &str) -> ConnectParams {
    ConnectParams {
        host: "127.0.0.1".into(),
        port: 5432,
        user: "postgres".into(),
        database: database.into(),
        application_name: "svc-e2e".into(),
        tls: TlsMode::Disable,
        tls_config: None,
        // The shared test server trusts loopback: it asks for no authentication.
        require_auth: AuthPolicy::parse("none").unwrap(),
        channel_binding: ChannelBindingMode::Prefer,
        scram_min_iterations: 4096,
        connect_timeout: Duration::from_secs(5),
        io_timeout: Duration::from_secs(60),
    }
}

/// A database of its own, dropped with its connections at the end.
pub struct TestDb {
    pub name: String,
}

impl TestDb {
    pub fn new(tag: &str) -> TestDb {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "svc_e2e_{tag}_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let mut admin = Connection::connect(&pg_params("postgres"), None)
            .expect("PostgreSQL on 127.0.0.1:5432 (scripts/test.sh installs it)");
        admin
            .simple(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .unwrap();
        admin
            .simple(&format!("CREATE DATABASE \"{name}\""))
            .unwrap();
        TestDb { name }
    }

    pub fn conn(&self) -> Connection {
        Connection::connect(&pg_params(&self.name), None).unwrap()
    }

    pub fn rows(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        self.conn().query(sql, &[]).unwrap().rows
    }

    pub fn int(&self, sql: &str) -> i64 {
        self.rows(sql)[0][0].as_deref().unwrap().parse().unwrap()
    }

    /// Every row of `events` as `row_to_json` gives it, by stream sequence.
    pub fn events_by_sequence(&self) -> std::collections::BTreeMap<u64, serde_json::Value> {
        self.rows("SELECT row_to_json(e)::text FROM events e")
            .into_iter()
            .map(|r| {
                let v: serde_json::Value =
                    serde_json::from_str(r[0].as_deref().expect("a row")).expect("JSON");
                (v["stream_sequence"].as_u64().expect("a sequence"), v)
            })
            .collect()
    }

    pub fn count(&self, table: &str) -> i64 {
        self.int(&format!("SELECT count(*) FROM {table}"))
    }

    pub fn sink(&self, extra: serde_json::Value) -> serde_json::Value {
        let mut v = json!({
            "type": "relational_db",
            "dsn": format!("postgresql://postgres@127.0.0.1:5432/{}", self.name),
            "tls_mode": "disable",
            "require_auth": "none",
            "table": "events",
        });
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    }

    /// The sink itself, in-process, on this database (with `extra` sink fields).
    pub fn relational_sink(
        &self,
        extra: serde_json::Value,
    ) -> (RelationalSink, std::sync::Arc<Metrics>) {
        let metrics = std::sync::Arc::new(Metrics::default());
        let sink = RelationalSink::new(parse_cfg(&self.sink(extra)), metrics.clone()).unwrap();
        (sink, metrics)
    }

    /// Creates the tables of a sink block with the DDL the docs show.
    pub fn create_tables(&self, sink: &serde_json::Value) {
        let cfg = svc::config::RuntimeConfig::parse(
            &json!({"nats": {"url": "nats://127.0.0.1:1", "stream": "S", "consumer": "c",
                             "subject": "a"},
                    "sink": sink})
            .to_string(),
        )
        .unwrap();
        let svc::sink::SinkConfig::RelationalDb(rc) = cfg.sink else {
            panic!("not a relational sink")
        };
        self.conn()
            .simple(&svc::sink::relational::ddl(&rc))
            .unwrap();
    }

    /// Kills the runner's sessions in this database; returns how many.
    pub fn kill_runner_sessions(&self) -> usize {
        self.conn()
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND application_name = 'svc'",
                &[],
            )
            .unwrap()
            .rows
            .len()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Ok(mut admin) = Connection::connect(&pg_params("postgres"), None) {
            let _ = admin.simple(&format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.name
            ));
        }
    }
}

/// A sink block read as `svc` reads it; panics on any problem.
pub fn parse_cfg(v: &serde_json::Value) -> RelationalConfig {
    use svc::document::reader::{ObjectReader, Problems};
    let problems = Problems::new();
    let mut r = ObjectReader::at("sink".into(), v, &problems);
    r.req_string("type");
    let cfg = RelationalConfig::read(&mut r);
    r.finish();
    assert!(problems.is_empty(), "{:?}", problems.into_vec());
    cfg
}

/// A normalized message with security labels, priority and classification set, so a row
/// fills every column.
pub fn envelope(subject: &str, seq: u64, data: &[u8]) -> Envelope {
    let (mut e, _) = normalize(
        &RawMessage {
            published_unix_nanos: Some(1_700_000_000_000_000_000),
            headers: vec![("Nats-Msg-Id".into(), format!("msg-{seq}"))],
            ..RawMessage::sample(subject, seq, data)
        },
        1_700_000_001_000_000_000,
        &EnvelopeConfig::default(),
    );
    let labels = json!({
        "profile": "svc.security-label.v1",
        "classification": "restricted",
        "releasability": ["team-a"],
        "owner": "ops",
    });
    e.priority = "high".into();
    e.classification = "restricted".into();
    e.labels_list = vec!["pii".into(), "eu".into()];
    e.labels = "pii;eu".into();
    e.security_labels = Some(labels.clone());
    e.metadata.security_labels = Some(labels);
    e
}
