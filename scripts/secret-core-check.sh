#!/usr/bin/env bash
# Not part of the suite: counts where two known passwords are left in the memory of a running
# `svc run` (docs/security.md, "Secrets in memory"). A throwaway nats-server with a user and
# password; a private PostgreSQL cluster (initdb in a scratch directory, its own port) whose
# pg_hba.conf demands scram-sha-256 of the sink's role, so the password really goes through
# the SCRAM exchange (SASLprep, PBKDF2, proofs); the relational sink reads it from
# `sink.password_env` with `require_auth: scram-sha-256`. Once 5 messages are committed, `gcore`
# dumps the process and every occurrence of each password in the dump is counted, next to the
# process's environment block (which always holds both: the service reads them from there).
# `CORE_CHECK_PG_AUTH=md5` or `password` (cleartext) measures those methods instead.
#
# Usage: scripts/secret-core-check.sh [SVC_BINARY]   (default target/debug/svc)
# Needs gdb (gcore), psql, PostgreSQL's server binaries (/usr/lib/postgresql/*/bin), runuser
# and a `postgres` account (the cluster runs as it: run this as root), nats-server, python3,
# and the right to ptrace the child.
set -euo pipefail
cd "$(dirname "$0")/.."
svc=$(realpath "${1:-target/debug/svc}")
nats_server=${SVC_NATS_SERVER:-$(command -v nats-server)}
pg_auth=${CORE_CHECK_PG_AUTH:-scram-sha-256}
case "$pg_auth" in scram-sha-256 | md5 | password) ;; *)
    echo "CORE_CHECK_PG_AUTH must be scram-sha-256, md5 or password" >&2; exit 2 ;;
esac
pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
work=$(mktemp -d /tmp/svc-core-check.XXXXXX)
chmod 755 "$work"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
pg_port=$(free_port)
cleanup() {
    [ -n "${svc_pid:-}" ] && kill "$svc_pid" 2>/dev/null || true
    [ -n "${nats_pid:-}" ] && kill "$nats_pid" 2>/dev/null || true
    # runuser does not forward signals: the postmaster by the PID it wrote (fast shutdown).
    if [ -f "$work/pg/postmaster.pid" ]; then
        kill -INT "$(head -n 1 "$work/pg/postmaster.pid")" 2>/dev/null || true
        for _ in $(seq 100); do [ -f "$work/pg/postmaster.pid" ] || break; sleep 0.1; done
    fi
    rm -rf "$work"
}
trap cleanup EXIT
psql_admin() { psql -h 127.0.0.1 -p "$pg_port" -U postgres -d postgres "$@"; }

# Long and unique: a short string could be clobbered by the allocator's own bookkeeping or
# occur by chance.
pg_pw="pg-core-check-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
nats_pw="nats-core-check-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
table="core_check_$$"

# The private cluster: the admin role trusted, the sink's role only with $pg_auth.
mkdir "$work/pg" && chown postgres:postgres "$work/pg"
runuser -u postgres -- "$pg_bin/initdb" -D "$work/pg" -U postgres --auth=trust --no-sync \
    >"$work/initdb.log" 2>&1
printf 'local all all trust\nhost all postgres 127.0.0.1/32 trust\nhost all svc_core 127.0.0.1/32 %s\n' \
    "$pg_auth" >"$work/pg/pg_hba.conf"
runuser -u postgres -- "$pg_bin/postgres" -D "$work/pg" -p "$pg_port" -k "$work/pg" \
    -c listen_addresses=127.0.0.1 -c fsync=off >"$work/postgres.log" 2>&1 &
for _ in $(seq 300); do
    [ "$(psql_admin -tAc 'SELECT 1' 2>/dev/null)" = 1 ] && break
    sleep 0.1
done
encryption=scram-sha-256
[ "$pg_auth" = md5 ] && encryption=md5
psql_admin -qc "SET password_encryption = '$encryption'; CREATE ROLE svc_core LOGIN SUPERUSER PASSWORD '$pg_pw'" >/dev/null

"$nats_server" -a 127.0.0.1 -p "$port" -js -sd "$work/nats" --user svc --pass "$nats_pw" \
    >"$work/nats.log" 2>&1 &
nats_pid=$!
for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
done

# A stream and 5 messages, over the plain NATS protocol.
python3 - "$port" "$nats_pw" <<'PY'
import json, socket, sys
port, pw = int(sys.argv[1]), sys.argv[2]
s = socket.create_connection(("127.0.0.1", port), timeout=5)
s.recv(4096)
def send(line, body=None):
    s.sendall(line.encode() + b"\r\n" + (body + b"\r\n" if body is not None else b""))
send("CONNECT " + json.dumps({"user": "svc", "pass": pw, "verbose": False, "headers": True}))
send("SUB _INBOX.core 1")
cfg = json.dumps({"name": "CORE", "subjects": ["core.>"], "storage": "memory"}).encode()
send(f"PUB $JS.API.STREAM.CREATE.CORE _INBOX.core {len(cfg)}", cfg)
for i in range(5):
    body = json.dumps({"n": i}).encode()
    send(f"PUB core.check _INBOX.core {len(body)}", body)
send("PING")
got = b""
while got.count(b"MSG _INBOX.core") < 6 and b"-ERR" not in got:
    got += s.recv(65536)
assert b"-ERR" not in got and b'"error"' not in got, got
PY

cat >"$work/config.json" <<JSON
{
  "nats": {"url": "nats://127.0.0.1:$port", "stream": "CORE", "consumer": "core-check",
           "subject": "core.>", "consumer_mode": "create",
           "auth": {"mode": "user_password", "username_env": "CORE_NATS_USER",
                    "password_env": "CORE_NATS_PW"}},
  "delivery": {"batch_size": 16, "fetch_expiry_ms": 200},
  "sink": {"type": "relational_db", "dsn": "postgresql://svc_core@127.0.0.1:$pg_port/postgres",
           "tls_mode": "disable", "table": "$table", "auto_create_tables": true,
           "password_env": "CORE_PG_PW", "require_auth": "$pg_auth"},
  "logging": {"level": "info"}
}
JSON
CORE_NATS_USER=svc CORE_NATS_PW="$nats_pw" CORE_PG_PW="$pg_pw" \
    "$svc" run "$work/config.json" >"$work/svc.log" 2>&1 &
svc_pid=$!
rows=0
for _ in $(seq 300); do
    rows=$(psql_admin -tAc "SELECT count(*) FROM $table" 2>/dev/null || echo 0)
    [ "$rows" = 5 ] && break
    sleep 0.1
done
[ "$rows" = 5 ] || { echo "svc did not commit the 5 messages:"; cat "$work/svc.log"; exit 1; }
sleep 1
gcore -o "$work/core" "$svc_pid" >/dev/null 2>&1
python3 - "$work/core.$svc_pid" "/proc/$svc_pid/environ" "$pg_pw" "$nats_pw" "$pg_auth" <<'PY'
import sys
core = open(sys.argv[1], "rb").read()
environ = open(sys.argv[2], "rb").read()
# glibc's free() writes its list pointers over the first 16 bytes of a freed block: a copy left
# in freed memory keeps only its tail, so the last 24 characters are counted too.
for name, pw in ((f"sink.password_env (PostgreSQL, {sys.argv[5]})", sys.argv[3]),
                 ("nats auth.password_env", sys.argv[4])):
    whole, tail = pw.encode(), pw.encode()[-24:]
    print(f"{name}: {core.count(whole)} whole copies and {core.count(tail)} copies of its last "
          f"24 characters in the core ({environ.count(whole)} in the environment block)")
PY
