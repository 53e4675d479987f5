#!/usr/bin/env bash
# Supply-chain checks (deny.toml): RustSec advisories, licences, bans, sources. Part of
# scripts/test.sh. The advisory database is the offline snapshot in ../shared/audit (see its
# README); with SVC_LIVE_ADVISORIES=1, on a machine that reaches it, the live RustSec database
# instead. The output says which database was read, and its date. Without either, advisories
# are reported as not checked and the rest still runs.
set -euo pipefail
cd "$(dirname "$0")/.."

dbs="target/advisory-dbs"
db="$dbs/advisory-db-3157b0e258782691" # cargo-deny's directory name for the default URL
bundle="../shared/audit/rustsec-advisory-db.bundle"
checks=(advisories licenses bans sources)
mkdir -p "$dbs"
rm -rf "$db.new"
if [ "${SVC_LIVE_ADVISORIES:-0}" = 1 ] &&
    timeout 60 git clone -q --depth 1 https://github.com/rustsec/advisory-db "$db.new"; then
    source_of="the live RustSec database"
elif [ -f "$bundle" ] && git clone -q "$bundle" "$db.new" 2>/dev/null; then
    source_of="the RustSec snapshot in $bundle"
else
    source_of=""
fi
if [ -n "$source_of" ]; then
    rm -rf "$db" && mv "$db.new" "$db"
    date=$(git -C "$db" log -1 --format=%cs)
    echo "advisories: $source_of, commit $(git -C "$db" rev-parse --short HEAD) of $date"
else
    echo "advisories: NOT CHECKED (no advisory database reachable, no snapshot at $bundle)"
    checks=(licenses bans sources)
fi
# Offline: the metadata is computed first (cargo-deny's --offline also keeps cargo from
# resolving other targets' crates), the database is the one above.
cargo metadata --format-version 1 --locked >target/deny-metadata.json
cargo deny --offline --metadata-path target/deny-metadata.json check "${checks[@]}"
