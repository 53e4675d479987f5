#!/usr/bin/env bash
# Builds and runs every fuzz target (fuzz/, cargo-fuzz, nightly toolchain) one after the other,
# one job each, and prints executions, exec/s and crashes per target.
#
#   scripts/fuzz.sh [seconds-per-target] [target...]
#
# Default 60 s per target, every target. Each run starts from the committed seeds
# (fuzz/corpus/<target>/seed-*) plus whatever it grew before (the grown corpus stays local:
# .gitignore). Crashes land in fuzz/artifacts/<target>/; reproduce one with
# `cargo +nightly fuzz run -s none <target> <file>`.
# FUZZ_RUNS=N also stops each target after N executions (whichever comes first).
# Not part of scripts/test.sh or the default build: the fuzz crate is its own workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${1:-60}"
shift || true
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "the nightly toolchain is required: rustup toolchain install nightly" >&2
    exit 2
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz is required: cargo install cargo-fuzz" >&2
    exit 2
fi

# No sanitizer: the svc crate forbids unsafe code, so ASan would mostly slow the runs down
# (about 2x); overflow checks and debug assertions stay on (cargo fuzz's default build).
flags=(-s none)

targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi

cargo +nightly fuzz build "${flags[@]}"

logdir="fuzz/logs"
mkdir -p "$logdir"
summary=()
status=0
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
    before=$(find "fuzz/artifacts/$t" -type f | wc -l)
    log="$logdir/$t.log"
    echo "== $t (${secs}s)"
    # One process, one job (libFuzzer's default; `-jobs=1` would fork a child that logs to
    # ./fuzz-0.log instead). The default -max_len (4096) covers these formats: heads, headers
    # and answers are small; the limits on large inputs are unit-tested.
    limits=(-max_total_time="$secs")
    if [ -n "${FUZZ_RUNS:-}" ]; then
        limits+=(-runs="$FUZZ_RUNS")
    fi
    if cargo +nightly fuzz run "${flags[@]}" "$t" -- \
        "${limits[@]}" -print_final_stats=1 >"$log" 2>&1; then
        :
    else
        status=1
    fi
    # libFuzzer's final statistics.
    execs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
    rate=$(grep -m1 'stat::average_exec_per_sec' "$log" | awk '{print $2}')
    after=$(find "fuzz/artifacts/$t" -type f | wc -l)
    crashes=$((after - before))
    line=$(printf '%-20s execs %12s  exec/s %8s  new crashes %d' "$t" "${execs:-?}" "${rate:-?}" "$crashes")
    echo "$line"
    summary+=("$line")
    if [ "$crashes" -gt 0 ]; then
        status=1
        ls -t "fuzz/artifacts/$t" | head -n "$crashes" | sed "s|^|  fuzz/artifacts/$t/|"
    fi
done

echo
echo "== summary (${secs}s per target; logs in $logdir/)"
printf '%s\n' "${summary[@]}"
exit "$status"
