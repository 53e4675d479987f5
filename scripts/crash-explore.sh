#!/usr/bin/env bash
# The whole crash exploration (issue 48; docs/delivery-semantics.md, "Crash model"): every
# crash point of every workload in tests/crash.rs, and every power-loss state (up to 5000 per
# recorded run), instead of the sample the test suite runs. Needs root (a tmpfs for ENOSPC),
# strace and nats-server (scripts/deps.sh). Prints one summary line per component and one
# VIOLATION line per broken invariant, naming the call and the invariant.
# Extra arguments go to libtest (e.g. a test name to explore one component).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v strace >/dev/null || { echo "strace is required" >&2; exit 2; }
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
started=$(date +%s)
status=0
SVC_CRASH_FULL=1 cargo test --test main -- crash:: --skip support:: --test-threads=1 --nocapture "$@" \
    2>&1 | grep --line-buffered -E '^(crash explorer|VIOLATION|test |test result)' || status=$?
echo "crash exploration took $(( $(date +%s) - started )) s"
exit "$status"
