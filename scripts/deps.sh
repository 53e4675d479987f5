#!/usr/bin/env bash
# Installs what the demo and the test suite need, only where missing. Sourced by the other
# scripts; safe to run again. Needs root (or sudo) for apt-get.
set -euo pipefail

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
APT_UPDATED=0

apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$APT_UPDATED" -eq 0 ]; then
        $SUDO apt-get update -qq
        APT_UPDATED=1
    fi
    echo "installing: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
}

need_rust() {
    if ! command -v cargo >/dev/null 2>&1; then
        echo "cargo is required (rustup toolchain)" >&2
        exit 1
    fi
}

deps_demo() {
    need_rust
    apt_install nats-server curl python3
}

# Where Python and Node test tools go (outside the repository).
TOOLS_DIR="${SVC_TEST_TOOLS:-$HOME/.cache/svc-test-tools}"

deps_test() {
    need_rust
    apt_install nats-server curl openssl ca-certificates python3 python3-venv \
        prometheus prometheus-node-exporter rsyslog wrk nodejs npm systemd
    # PostgreSQL: tests need a server on 127.0.0.1:5432 with trust auth.
    if ! pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; then
        apt_install postgresql
        local ver
        ver=$(ls /etc/postgresql | sort -n | tail -1)
        $SUDO pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
    fi
    mkdir -p "$TOOLS_DIR"
    if [ ! -x "$TOOLS_DIR/venv/bin/moto_server" ] || ! "$TOOLS_DIR/venv/bin/python" -c 'import opentelemetry.proto, boto3' 2>/dev/null; then
        python3 -m venv "$TOOLS_DIR/venv"
        "$TOOLS_DIR/venv/bin/pip" install -q 'moto[server]' boto3 opentelemetry-proto protobuf
    fi
    if [ ! -f "$TOOLS_DIR/node_modules/statsd/stats.js" ]; then
        (cd "$TOOLS_DIR" && npm install --silent --no-audit --no-fund statsd@0.9.0 >/dev/null)
    fi
    export SVC_TEST_VENV="$TOOLS_DIR/venv"
    export SVC_TEST_STATSD="$TOOLS_DIR/node_modules/statsd/stats.js"
}
