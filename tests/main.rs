//! The integration tests: one test binary (`cargo test --test main`), one module per area, one
//! [`support`] module they share. One binary links the library once, where a binary per file
//! linked it about forty times. The one other test binary, `tests/wipe_probe.rs`, has its own
//! global allocator (secrets freed without a wipe).
//!
//! Areas and their modules:
//! - the runner against a real broker: `runner`, `ack_confirmation`, `durability`, `clean_stop`,
//!   `consumer_changes`, `consumer_shapes`, `consumer_start`,
//!   `stream_plan`, `operator_commands`, `logging_format`, `labels_dlq` (with priority lanes),
//!   `replay`, `redrive`,
//!   `governance`, `sink_permanent`, `broker_auth_tls`, `jetstream_cluster`, `shared_dirs`,
//!   `spool`
//! - sinks: `object_store_sink`, `object_store_e2e`, `aws_credentials`, `http_sink`,
//!   `relational`, `relational_client` (the PostgreSQL client and sink on the local server),
//!   `relational_cluster` (password authentication and TLS on a private server),
//!   `mysql_client`, `mysql_sink` (the MySQL engine on the local MariaDB), `mysql_private`
//!   (TLS and authentication plugins on a private MariaDB),
//!   `payload_protection`, `payload_protection_sinks`
//! - hostile peers: `hostile_nats`, `hostile_postgres`, `hostile_mysql`, `hostile_store`, `hostile_http`,
//!   `hostile_receivers`
//! - the exporter (`svc-observe`): `observe_cli`, `observe_http`, `observe_prometheus`,
//!   `observe_push`, `observe_cloud_a`, `observe_cloud_b`, `observe_cloud_c`,
//!   `observe_cloud_tls`, `observe_broker_monitoring`
//! - the shipped kit: `package`, `systemd_units`, `alert_rules`, `dashboard`
//! - the source tree and the command line: `layers`, `log_hygiene`, `cli`
//! - crash consistency: `crash` (the explorer in `support::crash`: a kill at every durable
//!   call and every power-loss state of each durable component; a sample of the points here,
//!   all of them with `SVC_CRASH_FULL=1`, which `scripts/crash-explore.sh` sets)
//!
//! Two tiers. The fast one needs nothing but cargo: `bash scripts/test-fast.sh` runs the unit
//! tests and the modules listed in it, which start no outside service (no broker, PostgreSQL,
//! moto, openssl, Prometheus or Python). The full one is `bash scripts/test.sh` (what CI runs):
//! it installs the tools, runs everything, then runs the broker-facing modules again against
//! the current nats-server release. One module alone: `cargo test --test main -- spool::`.
//!
//! Tests share one process and run on several threads: a test never changes the process's
//! environment or working directory (it passes variables to the child it starts, or runs
//! itself in a child of this binary as `relational_cluster` does), names its scratch files by
//! more than the process id, and never counts what the whole process holds (threads,
//! descriptors) as if it were alone.

mod support;

mod ack_confirmation;
mod alert_rules;
mod atk46c;
mod atk46d;
mod atk46e;
mod atk46f;
mod atk47e;
mod atk50a;
mod atk50b;
mod atk51a;
mod atk51b;
mod atk51c;
mod atk51c_fixed;
mod atk51d;
mod atk52a;
mod atk52b;
mod atk52c;
mod atk53a;
mod atk53b;
mod atk53c;
mod atk54;
mod atk55;
mod atk56;
mod atk58;
mod atk59;
mod atk60;
mod aws_credentials;
mod broker_auth_tls;
mod clean_stop;
mod cli;
mod consumer_changes;
mod consumer_shapes;
mod consumer_start;
mod crash;
mod custody_checkpoints;
mod custody_drained_head;
mod custody_spool_sink;
mod dashboard;
mod durability;
mod fanout_routing;
mod governance;
mod h51wfix;
mod hostile_http;
mod hostile_mysql;
mod hostile_nats;
mod hostile_postgres;
mod hostile_receivers;
mod hostile_store;
mod http_sink;
mod jetstream_cluster;
mod labels_dlq;
mod layers;
mod log_hygiene;
mod logging_format;
mod mysql_client;
mod mysql_private;
mod mysql_sink;
mod object_store_e2e;
mod object_store_sink;
mod observe_broker_monitoring;
mod observe_cli;
mod observe_cloud_a;
mod observe_cloud_b;
mod observe_cloud_c;
mod observe_cloud_tls;
mod observe_http;
mod observe_prometheus;
mod observe_push;
mod operator_commands;
mod package;
mod payload_protection;
mod payload_protection_sinks;
mod redrive;
mod relational;
mod relational_client;
mod relational_cluster;
mod replay;
mod replay_sinks;
mod runner;
mod shared_dirs;
mod sink_permanent;
mod spool;
mod stream_plan;
mod systemd_units;
