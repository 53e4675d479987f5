#!/usr/bin/env bash
# The fast tier, for developers between edits: the unit tests and the integration test modules
# that start no outside service (no broker, PostgreSQL, moto, openssl, Prometheus or Python),
# so it needs nothing but cargo. The whole suite is scripts/test.sh (what CI runs).
# Extra arguments go to both test runs (e.g. --test-threads=2).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== unit tests"
# svc and its crates (crates/), as scripts/test.sh names them.
svc_crates=(-p svc -p svc-text -p svc-db -p svc-document -p svc-files -p svc-host -p svc-aws -p svc-subject -p svc-snapshot -p svc-observe)
cargo test "${svc_crates[@]}" --lib --bins -- "$@"
# libtest filters match anywhere in a test's path: `cli::` also matches `observe_cli::`, which
# needs promtool, hence the --skip.
fast_modules=(cli hostile_http layers log_hygiene observe_cloud_c)
echo "== integration modules that need nothing but cargo: ${fast_modules[*]}"
cargo test --test main -- "${fast_modules[@]/%/::}" --skip observe_cli:: "$@"
