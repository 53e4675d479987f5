#!/usr/bin/env bash
# Builds the Debian packages `svc` (the runner) and `svc-observe` (the exporter) with
# dpkg-deb: stripped binaries, systemd units, sysusers.d and tmpfiles.d entries, the example
# config and policy as conffiles in /etc/svc, man pages generated from the binaries' --help,
# docs, the operator kit (alert rules, dashboard) as examples, and a CycloneDX SBOM of each
# binary's dependencies (/usr/share/doc/<package>/sbom.cdx.json). Binaries this script builds
# carry their dependency list in a `.dep-v0` section (cargo auditable: read by `cargo audit bin`
# and similar scanners; nothing of it runs). Needs cargo-cyclonedx and cargo-auditable
# (scripts/deps.sh installs both).
#
#   scripts/package.sh [--profile release|debug] [--bin-dir DIR] [--out-dir DIR]
#                      [--compress xz|gzip|none]
#
# --profile  cargo profile to build and package (default: release; `debug` reuses the test
#            build, which is what tests/package.rs does: a release build takes minutes here).
# --bin-dir  package the binaries found in DIR instead of building (no cargo call at all).
# --out-dir  where the .deb files go (default: target/debian).
# --compress dpkg-deb compression (default: xz; gzip is level 1, for the test: xz of a debug
#            build takes most of a minute on two busy cores; none is for inspection only).
#
# Prints the path of each package built. Installs nothing.
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")/.."

profile=release
bin_dir=
out_dir=target/debian
compress=xz
while [ $# -gt 0 ]; do
    case "$1" in
        --profile) profile=${2:?--profile needs a value}; shift 2 ;;
        --bin-dir) bin_dir=${2:?--bin-dir needs a value}; shift 2 ;;
        --out-dir) out_dir=${2:?--out-dir needs a value}; shift 2 ;;
        --compress) compress=${2:?--compress needs a value}; shift 2 ;;
        -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "package.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
# Paths given on the command line are the caller's, not the repository's.
abs() { case "$1" in /*) echo "$1" ;; *) echo "$caller/$1" ;; esac; }
[ -n "$bin_dir" ] && bin_dir=$(abs "$bin_dir")
[ "$out_dir" = target/debian ] || out_dir=$(abs "$out_dir")
case "$compress" in
    xz|gzip|none) ;;
    *) echo "package.sh: --compress must be xz, gzip or none" >&2; exit 2 ;;
esac
case "$profile" in
    release) target_sub=release ;;
    debug|dev) profile=dev; target_sub=debug ;;
    *) echo "package.sh: --profile must be release or debug" >&2; exit 2 ;;
esac

for tool in cyclonedx auditable; do
    cargo "$tool" --version >/dev/null 2>&1 || {
        echo "package.sh: cargo $tool is missing (scripts/deps.sh installs it)" >&2
        exit 1
    }
done
if [ -z "$bin_dir" ]; then
    cargo auditable build --locked --profile "$profile" --bin svc --bin svc-observe
    bin_dir="${CARGO_TARGET_DIR:-target}/$target_sub"
fi
for b in svc svc-observe; do
    [ -x "$bin_dir/$b" ] || { echo "package.sh: no executable $bin_dir/$b" >&2; exit 1; }
done

upstream=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
version="$upstream-1"
arch=$(dpkg --print-architecture)
# Reproducible dates: the last commit's, else now.
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
export SOURCE_DATE_EPOCH=$epoch
maintainer="${DEBFULLNAME:-svc maintainers} <${DEBEMAIL:-svc-maintainers@example.org}>"

mkdir -p "$out_dir"
out_dir=$(cd "$out_dir" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/svc-package.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Shared-library dependencies of the binaries, as dpkg-shlibdeps computes them (it wants a
# debian/control beside it).
mkdir -p "$work/shlibs/debian/svc/usr/bin"
printf 'Source: svc\n\nPackage: svc\nArchitecture: any\n' > "$work/shlibs/debian/control"
shlibs() { # stripped binary
    local name
    name=$(basename "$1")
    cp "$1" "$work/shlibs/debian/svc/usr/bin/$name"
    # Its one warning (the binary is not in an installed package's directory) is expected.
    (cd "$work/shlibs" && dpkg-shlibdeps -O "debian/svc/usr/bin/$name" 2>"$work/shlibs.err") \
        | sed -n 's/^shlibs:Depends=//p'
    if grep -v 'should already be installed' "$work/shlibs.err" >&2; then return 1; fi
}

# roff-escapes preformatted text: backslashes, minus signs, leading dots and quotes.
roff_text() {
    sed -e 's/\\/\\e/g' -e 's/-/\\-/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"
}

# Man page section 1 (gzip -9n) generated from the binary's --help, so it cannot drift.
write_man() { # dest name summary files see
    local dest=$1; shift
    manpage_to() {
        local name=$1 summary=$2 files=$3 see=$4 date
        date=$(date -u -d "@$epoch" +%Y-%m-%d)
        local tname
        tname=$(echo "$name" | tr a-z A-Z | sed 's/-/\\-/g')
        printf '.TH %s 1 "%s" "%s %s" "User Commands"\n' "$tname" "$date" "$(echo "$name" | sed 's/-/\\-/g')" "$upstream"
        printf '.SH NAME\n%s \\- %s\n' "$(echo "$name" | sed 's/-/\\-/g')" "$summary"
        printf '.SH SYNOPSIS\n.B %s\n.I command\n.RI [ arguments ]\n' "$(echo "$name" | sed 's/-/\\-/g')"
        printf '.SH DESCRIPTION\nThe usage below is the program'"'"'s own \\fB\\-\\-help\\fR output.\n.PP\n.nf\n'
        "$bin_dir/$name" --help | roff_text
        printf '.fi\n.SH FILES\n%s\n' "$files"
        printf '.SH SEE ALSO\n%s\n' "$see"
    }
    manpage_to "$@" | gzip -9n > "$dest"
}

# changelog.Debian.gz for this version.
write_changelog() { # dest package
    {
        printf '%s (%s) unstable; urgency=medium\n\n' "$2" "$version"
        printf '  * Built by scripts/package.sh from the svc source tree.\n\n'
        printf ' -- %s  %s\n' "$maintainer" "$(date -u -R -d "@$epoch")"
    } | gzip -9n > "$1"
}

# Common skeleton: binary, copyright, changelog, control, md5sums, build.
finish_package() { # root package depends description
    local root=$1 pkg=$2 depends=$3 description=$4
    # The one lintian tag left: it asks for the Debian archive's ITP bug, which a package
    # built outside the archive does not have (docs/operations.md, "Debian packages").
    install -D -m 0644 /dev/null "$root/usr/share/lintian/overrides/$pkg"
    printf '%s: initial-upload-closes-no-bugs\n' "$pkg" > "$root/usr/share/lintian/overrides/$pkg"
    find "$root" -type d -exec chmod 0755 {} +
    find "$root" -type f -exec chmod 0644 {} +
    chmod 0755 "$root/usr/bin/"*
    mkdir -p "$root/DEBIAN"
    install -m 0755 "contrib/debian/$pkg.postinst" "$root/DEBIAN/postinst"
    if [ -d "$root/etc" ]; then
        (cd "$root" && find etc -type f | sed 's|^|/|' | sort) > "$root/DEBIAN/conffiles"
        chmod 0644 "$root/DEBIAN/conffiles"
    fi
    (cd "$root" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -printf '%P\0' \
        | sort -z | xargs -0 md5sum) > "$root/DEBIAN/md5sums"
    chmod 0644 "$root/DEBIAN/md5sums"
    local size
    size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
    {
        printf 'Package: %s\nVersion: %s\nArchitecture: %s\nMaintainer: %s\n' \
            "$pkg" "$version" "$arch" "$maintainer"
        printf 'Installed-Size: %s\nDepends: %s\nSection: net\nPriority: optional\n' \
            "$size" "$depends"
        printf 'Description: %s\n' "$description"
    } > "$root/DEBIAN/control"
    chmod 0644 "$root/DEBIAN/control"
    find "$root" -newermt "@$epoch" -exec touch -h -d "@$epoch" {} +
    local deb="$out_dir/${pkg}_${version}_${arch}.deb"
    local level=()
    # gzip is the quick choice (the test's): its fastest level.
    [ "$compress" = gzip ] && level=(-z1)
    dpkg-deb --root-owner-group "-Z$compress" "${level[@]}" --build "$root" "$deb" >/dev/null
    echo "$deb"
}

# The SBOMs: one per binary, run-time dependencies only (no build or dev dependencies), made
# reproducible (the timestamp from SOURCE_DATE_EPOCH, the serial number from the content).
sbom_dir="$work/sbom"
mkdir -p "$sbom_dir"
cargo cyclonedx --quiet --format json --describe binaries --no-build-deps --spec-version 1.5
for b in svc svc-observe; do
    mv "${b}_bin.cdx.json" "$sbom_dir/$b.cdx.json"
done
python3 - "$sbom_dir" "$epoch" <<'PY'
import datetime, json, pathlib, sys, uuid
directory, epoch = pathlib.Path(sys.argv[1]), int(sys.argv[2])
stamp = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
for path in sorted(directory.glob("*.cdx.json")):
    doc = json.loads(path.read_text())
    doc["metadata"]["timestamp"] = stamp
    doc.pop("serialNumber", None)
    body = json.dumps(doc, sort_keys=True)
    doc["serialNumber"] = "urn:uuid:" + str(uuid.uuid5(uuid.NAMESPACE_URL, body))
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
PY

strip_into() { # binary dest
    install -D -m 0755 "$bin_dir/$1" "$2"
    strip --remove-section=.comment --remove-section=.note --strip-unneeded "$2"
}

# --- svc: the runner ---
r="$work/svc"
strip_into svc "$r/usr/bin/svc"
install -D -m 0644 contrib/systemd/svc.service "$r/lib/systemd/system/svc.service"
install -D -m 0644 contrib/debian/svc.sysusers "$r/usr/lib/sysusers.d/svc.conf"
install -D -m 0644 contrib/debian/svc.tmpfiles "$r/usr/lib/tmpfiles.d/svc.conf"
install -D -m 0644 contrib/debian/config.json "$r/etc/svc/config.json"
doc="$r/usr/share/doc/svc"
install -D -m 0644 contrib/debian/copyright "$doc/copyright"
write_changelog "$doc/changelog.Debian.gz" svc
install -m 0644 "$sbom_dir/svc.cdx.json" "$doc/sbom.cdx.json"
install -m 0644 README.md docs/configuration.md docs/operations.md docs/observe.md \
    docs/metrics-snapshot.md docs/delivery-semantics.md docs/dead-letter.md "$doc/"
mkdir -p "$doc/observe"
install -m 0644 docs/observe/*.md "$doc/observe/"
mkdir -p "$r/usr/share/man/man1"
write_man "$r/usr/share/man/man1/svc.1.gz" svc \
    "message\\-delivery runner: JetStream pull consumer to one sink, commit first, ACK last" \
    "$(printf '.TP\n.I /etc/svc/config.json\nruntime configuration (conffile; /usr/share/doc/svc/configuration.md)\n.TP\n.I /var/lib/svc/metrics.json\nmetrics snapshot read by svc\\-observe\n.TP\n.I /lib/systemd/system/svc.service\nthe systemd unit')" \
    ".BR svc\\-observe (1),\n.BR systemctl (1),\n.BR journalctl (1)"
svc_deps="$(shlibs "$r/usr/bin/svc"), systemd"
finish_package "$r" svc "$svc_deps" \
    "$(printf 'message-delivery runner for NATS JetStream\n svc pulls messages from a JetStream consumer, writes them to one sink (files,\n a relational database, an object store or a fan-out of those) and\n acknowledges each message only after the sink reported it durable.\n Runs as a hardened systemd service under its own user.')"

# --- svc-observe: the exporter ---
r="$work/svc-observe"
strip_into svc-observe "$r/usr/bin/svc-observe"
for u in svc-observe-textfile.service svc-observe-textfile.timer svc-observe-http.service; do
    install -D -m 0644 "contrib/systemd/$u" "$r/lib/systemd/system/$u"
done
install -D -m 0644 contrib/debian/svc-observe.sysusers "$r/usr/lib/sysusers.d/svc-observe.conf"
install -D -m 0644 contrib/debian/svc-observe.tmpfiles "$r/usr/lib/tmpfiles.d/svc-observe.conf"
install -D -m 0644 contrib/debian/observability-policy.json "$r/etc/svc/observability-policy.json"
doc="$r/usr/share/doc/svc-observe"
install -D -m 0644 contrib/debian/copyright "$doc/copyright"
write_changelog "$doc/changelog.Debian.gz" svc-observe
install -m 0644 "$sbom_dir/svc-observe.cdx.json" "$doc/sbom.cdx.json"
install -D -m 0644 contrib/prometheus/svc-rules.yml "$doc/examples/prometheus/svc-rules.yml"
install -D -m 0644 contrib/prometheus/svc-rules.test.yml "$doc/examples/prometheus/svc-rules.test.yml"
install -D -m 0644 contrib/grafana/svc-dashboard.json "$doc/examples/grafana/svc-dashboard.json"
install -D -m 0644 contrib/grafana/svc-dashboards.yaml "$doc/examples/grafana/svc-dashboards.yaml"
mkdir -p "$r/usr/share/man/man1"
write_man "$r/usr/share/man/man1/svc-observe.1.gz" svc-observe \
    "export the svc runner's metrics through a reviewed observability policy" \
    "$(printf '.TP\n.I /etc/svc/observability\\-policy.json\nthe observability policy (conffile; shares nothing until enabled)\n.TP\n.I /var/lib/prometheus/node\\-exporter/svc.prom\nthe textfile written by svc\\-observe\\-textfile.service\n.TP\n.I /usr/share/doc/svc\\-observe/examples/\nPrometheus alert rules and a Grafana dashboard')" \
    ".BR svc (1),\n.BR prometheus\\-node\\-exporter (1)"
obs_deps="$(shlibs "$r/usr/bin/svc-observe"), systemd, svc (= $version)"
finish_package "$r" svc-observe "$obs_deps" \
    "$(printf 'metrics exporter for the svc message-delivery runner\n svc-observe reads the runner'"'"'s metrics snapshot and exports only what an\n observability policy approves: a textfile for the Prometheus node exporter, a\n native HTTP scrape endpoint, or push connectors. Ships Prometheus alert\n rules and a Grafana dashboard as examples.')"
