#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what is missing, then runs every test,
# the lints, and the check that the default build pulls in no async runtime.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
deps_test

# svc and its crates (crates/); the carried nats client has its own style and lints.
svc_crates=(-p svc -p svc-text -p svc-db -p svc-document -p svc-files -p svc-host -p svc-aws -p svc-subject -p svc-snapshot -p svc-observe)
echo "== cargo fmt --check"
cargo fmt "${svc_crates[@]}" --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy "${svc_crates[@]}" --all-targets --quiet -- -D warnings
echo "== cargo doc (warnings denied)"
# Private items are documented (the docs are for the people who work on the code), so a public
# module's comment may link to its private parts.
RUSTDOCFLAGS="-D warnings -A rustdoc::private_intra_doc_links" \
    cargo doc "${svc_crates[@]}" --no-deps --document-private-items --quiet
echo "== no async runtime in the default build"
if cargo tree -e normal --prefix none | grep -E '^(tokio|async-std|mio|async-io|smol) v'; then
    echo "an async runtime crate is in the default dependency tree" >&2
    exit 1
fi
echo "== the fuzz targets still build (fuzz/ is its own workspace: nothing else compiles it)"
cargo check --manifest-path fuzz/Cargo.toml --bins --quiet
echo "== supply chain: advisories, licences, bans, sources (deny.toml)"
bash scripts/audit.sh
echo "== cargo test"
# Every target: the unit tests, tests/main.rs and tests/wipe_probe.rs (the allocator probe of
# docs/security.md "Secrets in memory", its own binary for its global allocator).
cargo test "${svc_crates[@]}" --all-targets --no-fail-fast -- --test-threads="${SVC_TEST_THREADS:-4}"
echo "== the carried nats client's own unit tests"
cargo test -p nats --lib --quiet

# The test modules that run a real broker, again against the current nats-server release (the
# run above used Debian's 2.9.10): what either does, the runner must handle. Each name becomes
# the filter `<module>::` of the one integration test binary (tests/main.rs); libtest runs the
# tests that match any of them.
current="$TOOLS_DIR/venv/bin/nats-server"
echo "== broker-facing tests against $("$current" --version)"
broker_modules=(ack_confirmation aws_credentials broker_auth_tls clean_stop consumer_changes consumer_shapes consumer_start dashboard durability governance hostile_store
    http_sink jetstream_cluster labels_dlq logging_format object_store_e2e observe_broker_monitoring
    operator_commands payload_protection payload_protection_sinks custody_checkpoints relational runner shared_dirs
    replay replay_sinks redrive fanout_routing sink_permanent spool stream_plan atk46c atk46d atk46e
    atk47e atk50a atk50b atk51b atk51c atk51c_fixed custody_spool_sink atk52a atk52b atk52c
    custody_drained_head atk53a atk53b atk53c atk54 atk55 atk56 atk59)
SVC_NATS_SERVER="$current" cargo test --test main --no-fail-fast \
    -- "${broker_modules[@]/%/::}" --test-threads="${SVC_TEST_THREADS:-4}"
