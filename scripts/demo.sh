#!/usr/bin/env bash
# Local demo: a throwaway JetStream server in a temp dir, sample messages, `svc run` into the
# file sink, then what landed and the metrics snapshot. Installs nats-server if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
deps_demo

work=$(mktemp -d /tmp/svc-demo.XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mon=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cleanup() {
    [ -n "${svc_pid:-}" ] && kill "$svc_pid" 2>/dev/null || true
    [ -n "${nats_pid:-}" ] && kill "$nats_pid" 2>/dev/null || true
}
trap cleanup EXIT

# The first release build takes about ten minutes on two cores: cargo's progress stays visible.
echo "== building (release; the first build takes about ten minutes on two cores)"
cargo build --release --bin svc --bin svc-observe
cargo bench --bench jsctl --no-run
jsctl() { cargo bench --quiet --bench jsctl -- "$@" 2>/dev/null; }

echo "== starting a throwaway nats-server -js on 127.0.0.1:$port (store: $work/nats)"
/usr/sbin/nats-server -a 127.0.0.1 -p "$port" -m "$mon" -js -sd "$work/nats" >"$work/nats.log" 2>&1 &
nats_pid=$!
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$mon/healthz" >/dev/null 2>&1 && break
    sleep 0.1
done
url="nats://127.0.0.1:$port"
jsctl stream "$url" ORDERS 'orders.>'
jsctl publish "$url" ORDERS orders.created 20 48

# The spool (used only if the sink fails for 30 s) is encrypted at rest: a key file of 32
# random bytes, base64, mode 0600 (docs/spool.md, "Encryption at rest").
(umask 077; head -c 32 /dev/urandom | base64 >"$work/spool-1.key")
cat >"$work/config.json" <<JSON
{
  "nats": {"url": "$url", "stream": "ORDERS", "consumer": "svc-demo", "subject": "orders.>",
           "consumer_mode": "create"},
  "delivery": {"batch_size": 16, "fetch_expiry_ms": 200},
  "sink": {"type": "file", "directory": "$work/out"},
  "spool": {"dir": "$work/spool", "max_bytes": 67108864,
            "encryption": {"key_id": "spool-1", "key_file": "$work/spool-1.key"}},
  "metrics": {"enabled": true, "namespace": "svc", "snapshot_file": "$work/metrics.json",
              "write_interval_seconds": 1},
  "logging": {"level": "info"}
}
JSON
echo "== svc validate"
target/release/svc validate "$work/config.json"
echo "== svc run (until every message is acknowledged)"
target/release/svc run "$work/config.json" >"$work/svc.log" 2>&1 &
svc_pid=$!
for _ in $(seq 200); do
    state=$(jsctl state "$url" ORDERS svc-demo 2>/dev/null || true)
    case "$state" in *"ack_floor=20 "*"ack_pending=0"*) break ;; esac
    sleep 0.1
done
kill -TERM "$svc_pid"; wait "$svc_pid" || true; svc_pid=""
echo "consumer: $(jsctl state "$url" ORDERS svc-demo)"
echo "== what landed in $work/out"
find "$work/out" -type f | sort | head -5
echo "... $(find "$work/out" -type f | wc -l) files"
echo "== one record"
first=$(find "$work/out" -type f | sort | head -1)
python3 -m json.tool "$first"
echo "== metrics snapshot ($work/metrics.json), counters"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); [print(f"  {k} = {v}") for k,v in d["counters"].items() if v]' "$work/metrics.json"
echo "== svc spool status (empty: the sink never failed)"
target/release/svc spool status "$work/config.json"
echo "== svc-observe: what a policy allowing messages_* would share (Prometheus text)"
cat >"$work/policy.json" <<JSON
{"schema": "svc.observability.policy.v1", "enabled": true, "namespace": "svc",
 "allowed_metric_patterns": ["messages_*"], "scrape": {"enabled": true}}
JSON
target/release/svc-observe scrape-textfile "$work/metrics.json" "$work/policy.json" --dry-run
echo "== runner log"
cat "$work/svc.log"
echo "demo files kept in $work"
