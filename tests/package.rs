//! `scripts/package.sh`: builds the two Debian packages from this test build's binaries
//! (`--bin-dir`, no release build), checks metadata and contents with `dpkg-deb -I/-c`,
//! runs lintian, unpacks them into a scratch root (`dpkg-deb -x`) and runs what was
//! unpacked: `--help`, `--version`, the install guide's validate commands on the shipped
//! config and policy, `systemd-sysusers --dry-run` on the shipped sysusers.d entries.
//! Nothing is installed on the host.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::kit::repo;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Commands of the README's "Install on a host", run here on the unpacked files.
const ENABLE_POLICY: &str = r#"s/^  "enabled": false,/  "enabled": true,/"#;
const ADD_RULES: &str = r"s|^rule_files:$|rule_files:\n  - svc-rules.yml|";

#[test]
fn the_install_guide_uses_the_tested_commands() {
    let readme = std::fs::read_to_string(repo("README.md")).unwrap();
    let guide = readme
        .split("## Install on a host")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("README has an install section");
    for line in [
        "scripts/package.sh ".to_string(),
        "svc validate /etc/svc/config.json".to_string(),
        format!("sed -i '{ENABLE_POLICY}' /etc/svc/observability-policy.json"),
        "svc-observe validate-policy /etc/svc/observability-policy.json".to_string(),
        "cp /usr/share/doc/svc-observe/examples/prometheus/svc-rules.yml /etc/prometheus/"
            .to_string(),
        format!("sed -i '{ADD_RULES}' /etc/prometheus/prometheus.yml"),
        "systemctl enable --now svc.service svc-observe-textfile.timer".to_string(),
    ] {
        assert!(guide.contains(&line), "the guide lacks {line}");
    }
    let commands = guide
        .split("```sh\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap()
        .lines()
        .count();
    assert!(
        (8..=12).contains(&commands),
        "about ten commands: {commands}"
    );
}

fn version() -> String {
    format!("{}-1", env!("CARGO_PKG_VERSION"))
}

struct Built {
    svc: PathBuf,
    observe: PathBuf,
    _dir: tempfile::TempDir,
}

fn build() -> Built {
    let dir = tempfile::tempdir().unwrap();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_svc")).parent().unwrap();
    let out = run(Command::new(repo("scripts/package.sh"))
        .arg("--bin-dir")
        .arg(bin_dir)
        .arg("--out-dir")
        .arg(dir.path())
        .args(["--compress", "gzip"]));
    let debs: Vec<PathBuf> = out.lines().map(PathBuf::from).collect();
    let arch = run(Command::new("dpkg").arg("--print-architecture"));
    let arch = arch.trim();
    let v = version();
    assert_eq!(
        debs,
        [
            dir.path().join(format!("svc_{v}_{arch}.deb")),
            dir.path().join(format!("svc-observe_{v}_{arch}.deb"))
        ]
    );
    Built {
        svc: debs[0].clone(),
        observe: debs[1].clone(),
        _dir: dir,
    }
}

fn field(control: &str, name: &str) -> String {
    control
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{name}: ")))
        .unwrap_or_else(|| panic!("no {name} in\n{control}"))
        .to_string()
}

/// (mode and owner, path) of every entry.
fn contents(deb: &Path) -> Vec<(String, String)> {
    run(Command::new("dpkg-deb").arg("-c").arg(deb))
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                format!("{} {}", f[0], f[1]),
                f[5].trim_start_matches('.').to_string(),
            )
        })
        .collect()
}

fn has(list: &[(String, String)], path: &str, mode: &str) {
    let entry = list
        .iter()
        .find(|(_, p)| p == path)
        .unwrap_or_else(|| panic!("{path} is not in the package: {list:?}"));
    assert_eq!(entry.0, mode, "{path}");
}

#[test]
fn packages_have_the_metadata_contents_and_run_unpacked() {
    let built = build();
    let v = version();

    // Metadata.
    let c = run(Command::new("dpkg-deb").arg("-I").arg(&built.svc));
    assert_eq!(field(&c, "Package"), "svc");
    assert_eq!(field(&c, "Version"), v);
    let deps = field(&c, "Depends");
    assert!(
        deps.contains("libc6 (>= ") && deps.contains("systemd"),
        "{deps}"
    );
    assert!(c.contains("postinst"), "{c}");
    let o = run(Command::new("dpkg-deb").arg("-I").arg(&built.observe));
    assert_eq!(field(&o, "Package"), "svc-observe");
    assert!(
        field(&o, "Depends").contains(&format!("svc (= {v})")),
        "{o}"
    );
    let conffiles = |deb: &Path| {
        run(Command::new("sh").arg("-c").arg(format!(
            "dpkg-deb --ctrl-tarfile '{}' | tar -xOf - ./conffiles",
            deb.display()
        )))
    };
    assert_eq!(conffiles(&built.svc), "/etc/svc/config.json\n");
    assert_eq!(
        conffiles(&built.observe),
        "/etc/svc/observability-policy.json\n"
    );

    // Contents: owners root, modes as Debian wants them.
    let exe = "-rwxr-xr-x root/root";
    let file = "-rw-r--r-- root/root";
    let s = contents(&built.svc);
    has(&s, "/usr/bin/svc", exe);
    has(&s, "/lib/systemd/system/svc.service", file);
    has(&s, "/usr/lib/sysusers.d/svc.conf", file);
    has(&s, "/usr/lib/tmpfiles.d/svc.conf", file);
    has(&s, "/etc/svc/config.json", file);
    has(&s, "/usr/share/man/man1/svc.1.gz", file);
    has(&s, "/usr/share/doc/svc/copyright", file);
    has(&s, "/usr/share/doc/svc/changelog.Debian.gz", file);
    has(&s, "/usr/share/doc/svc/observe.md", file);
    has(&s, "/usr/share/doc/svc/observe/oci-monitoring.md", file);
    let ob = contents(&built.observe);
    has(&ob, "/usr/bin/svc-observe", exe);
    for u in [
        "svc-observe-textfile.service",
        "svc-observe-textfile.timer",
        "svc-observe-http.service",
    ] {
        has(&ob, &format!("/lib/systemd/system/{u}"), file);
    }
    has(&ob, "/usr/lib/sysusers.d/svc-observe.conf", file);
    has(&ob, "/usr/lib/tmpfiles.d/svc-observe.conf", file);
    has(&ob, "/etc/svc/observability-policy.json", file);
    has(&ob, "/usr/share/man/man1/svc-observe.1.gz", file);
    has(
        &ob,
        "/usr/share/doc/svc-observe/examples/prometheus/svc-rules.yml",
        file,
    );
    has(
        &ob,
        "/usr/share/doc/svc-observe/examples/grafana/svc-dashboard.json",
        file,
    );
    for list in [&s, &ob] {
        assert!(list.iter().all(|(m, _)| m.ends_with(" root/root")));
    }

    // lintian: no error, no warning (the one override is documented in docs/operations.md).
    let lint = Command::new("lintian")
        .args(["--info", "--pedantic"])
        .arg(&built.svc)
        .arg(&built.observe)
        .output()
        .expect("lintian is installed (scripts/deps.sh deps_test)");
    let text = String::from_utf8_lossy(&lint.stdout);
    let tags: Vec<&str> = text
        .lines()
        .filter(|l| l.len() > 2 && l.as_bytes()[1] == b':' && !l.starts_with("N:"))
        .collect();
    assert!(lint.status.success() && tags.is_empty(), "lintian:\n{text}");

    // Unpacked into a scratch root and run from there.
    let root = tempfile::tempdir().unwrap();
    for deb in [&built.svc, &built.observe] {
        run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(root.path()));
    }
    let r = |p: &str| root.path().join(p.trim_start_matches('/'));
    // Stripped: no symbol table, no debug information (`.debug_gdb_scripts` is a loaded
    // section, kept by strip).
    for b in ["/usr/bin/svc", "/usr/bin/svc-observe"] {
        let sections = run(Command::new("readelf").arg("-SW").arg(r(b)));
        assert!(
            !sections.contains(".symtab") && !sections.contains(".debug_info"),
            "{b} is not stripped"
        );
    }
    // Each package's SBOM: valid CycloneDX 1.5, the binary's run-time dependencies, no dev or
    // build dependency.
    for (package, binary) in [("svc", "svc"), ("svc-observe", "svc-observe")] {
        let path = r(&format!("/usr/share/doc/{package}/sbom.cdx.json"));
        assert_valid_cyclonedx(&path);
        let sbom: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(sbom["metadata"]["component"]["name"], binary, "{package}");
        let names: Vec<&str> = sbom["components"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        for needed in ["nats", "rustls", "ring", "serde_json", "crossbeam-channel"] {
            assert!(
                names.contains(&needed),
                "{package}: {needed} missing: {names:?}"
            );
        }
        for absent in ["tempfile", "cc"] {
            assert!(
                !names.contains(&absent),
                "{package}: {absent} is not a run-time dependency"
            );
        }
    }
    let help = run(Command::new(r("/usr/bin/svc")).arg("--help"));
    assert!(help.contains("svc validate <config_file>"), "{help}");
    let ver = run(Command::new(r("/usr/bin/svc")).arg("--version"));
    assert!(ver.contains(env!("CARGO_PKG_VERSION")), "{ver}");
    let help = run(Command::new(r("/usr/bin/svc-observe")).arg("--help"));
    assert!(help.contains("scrape-textfile"), "{help}");

    // The install guide's commands (README, "Install on a host"), on the unpacked files.
    let valid = run(Command::new(r("/usr/bin/svc"))
        .arg("validate")
        .arg(r("/etc/svc/config.json")));
    assert!(valid.starts_with("Configuration is valid."), "{valid}");
    let policy = r("/etc/svc/observability-policy.json");
    let shipped = run(Command::new(r("/usr/bin/svc-observe"))
        .arg("validate-policy")
        .arg(&policy));
    assert!(
        shipped.contains("\nenabled=false\n"),
        "shares nothing as shipped: {shipped}"
    );
    run(Command::new("sed").args(["-i", ENABLE_POLICY]).arg(&policy));
    let enabled = run(Command::new(r("/usr/bin/svc-observe"))
        .arg("validate-policy")
        .arg(&policy));
    assert!(
        enabled.contains("\nenabled=true\n") && enabled.contains("\nscrape_enabled=true\n"),
        "{enabled}"
    );
    // The rules file loads into Debian's default prometheus.yml with the guide's `sed`.
    let prom = tempfile::tempdir().unwrap();
    let conf = prom.path().join("prometheus.yml");
    std::fs::copy("/etc/prometheus/prometheus.yml", &conf)
        .expect("the prometheus package's default /etc/prometheus/prometheus.yml");
    std::fs::copy(
        r("/usr/share/doc/svc-observe/examples/prometheus/svc-rules.yml"),
        prom.path().join("svc-rules.yml"),
    )
    .unwrap();
    run(Command::new("sed").args(["-i", ADD_RULES]).arg(&conf));
    let check = run(Command::new("promtool")
        .args(["check", "config"])
        .arg(&conf));
    let rules = std::fs::read_to_string(repo("contrib/prometheus/svc-rules.yml"))
        .unwrap()
        .lines()
        .filter(|l| {
            l.trim_start().starts_with("- alert:") || l.trim_start().starts_with("- record:")
        })
        .count();
    assert!(
        check.contains(&format!("SUCCESS: {rules} rules found")),
        "{rules} rules in the file:\n{check}"
    );
    // The config's snapshot path is the one the exporter units read.
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(r("/etc/svc/config.json")).unwrap()).unwrap();
    assert_eq!(cfg["metrics"]["snapshot_file"], "/var/lib/svc/metrics.json");
    let unit =
        std::fs::read_to_string(r("/lib/systemd/system/svc-observe-textfile.service")).unwrap();
    assert!(unit
        .contains("scrape-textfile /var/lib/svc/metrics.json /etc/svc/observability-policy.json"));
    // The packaged units are the repository's.
    for u in [
        "svc.service",
        "svc-observe-textfile.service",
        "svc-observe-textfile.timer",
        "svc-observe-http.service",
    ] {
        assert_eq!(
            std::fs::read(r(&format!("/lib/systemd/system/{u}"))).unwrap(),
            std::fs::read(repo(&format!("contrib/systemd/{u}"))).unwrap(),
            "{u}"
        );
    }

    // sysusers.d: users and the group membership the units rely on (dry run: writes nothing).
    let dry = Command::new("systemd-sysusers")
        .arg(format!("--root={}", root.path().display()))
        .arg("--dry-run")
        .output()
        .unwrap();
    assert!(dry.status.success());
    // systemd-sysusers reports on stderr.
    let users = String::from_utf8_lossy(&dry.stderr).into_owned();
    assert!(users.contains("Would write /etc/passwd"), "{users}");
    let users = users
        + &run(Command::new("systemd-sysusers")
            .arg(format!("--root={}", root.path().display()))
            .args(["--dry-run", "--cat-config"]));
    for needle in [
        "Creating user 'svc'",
        "Creating user 'svc-observe'",
        "m svc-observe svc",
    ] {
        assert!(users.contains(needle), "{needle} in\n{users}");
    }
    // tmpfiles.d: the state directory mode the units document, and the textfile ACL.
    let t = std::fs::read_to_string(r("/usr/lib/tmpfiles.d/svc.conf")).unwrap();
    assert!(t.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()
        == ["d", "/var/lib/svc", "0750", "svc", "svc", "-"]));
    let t = std::fs::read_to_string(r("/usr/lib/tmpfiles.d/svc-observe.conf")).unwrap();
    assert!(t.contains("a+ /var/lib/prometheus/node-exporter - - - - u:svc-observe:rwx"));

    // Man pages render without warnings.
    for page in ["svc.1.gz", "svc-observe.1.gz"] {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "zcat '{}' | MANWIDTH=80 man --warnings -l - 2>&1 >/dev/null",
                r(&format!("/usr/share/man/man1/{page}")).display()
            ))
            .output()
            .unwrap();
        let warnings = String::from_utf8_lossy(&out.stdout);
        assert!(warnings.trim().is_empty(), "{page}: {warnings}");
    }
}

#[test]
fn bad_arguments_are_refused() {
    for args in [
        &["--profile", "fast"][..],
        &["--compress", "zstd"],
        &["--frobnicate"],
    ] {
        let out = Command::new(repo("scripts/package.sh"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).starts_with("package.sh: "));
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(repo("scripts/package.sh"))
        .arg("--bin-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no executable"));
}

/// Validates a CycloneDX 1.5 JSON document with the CycloneDX project's own Python library
/// (scripts/deps.sh installs it in the test venv).
fn assert_valid_cyclonedx(path: &Path) {
    let out = Command::new(crate::support::python::python())
        .args([
            "-c",
            "import sys\n\
             from cyclonedx.schema import SchemaVersion\n\
             from cyclonedx.validation.json import JsonStrictValidator\n\
             error = JsonStrictValidator(SchemaVersion.V1_5).validate_str(open(sys.argv[1]).read())\n\
             sys.exit(f'invalid: {error}' if error else 0)",
        ])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Binaries built by the packaging script carry their dependency list (cargo auditable's
/// `.dep-v0` section), kept through stripping; the test build's own binaries do not, so this
/// packages a build of its own (the debug profile: the auditable link takes seconds).
#[test]
fn built_binaries_carry_their_dependency_list() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(Command::new(repo("scripts/package.sh"))
        .args(["--profile", "debug", "--compress", "gzip", "--out-dir"])
        .arg(dir.path()));
    let root = tempfile::tempdir().unwrap();
    for deb in out.lines() {
        run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(root.path()));
    }
    for b in ["usr/bin/svc", "usr/bin/svc-observe"] {
        let sections = run(Command::new("readelf").arg("-SW").arg(root.path().join(b)));
        assert!(
            sections.contains(".dep-v0"),
            "{b} has no .dep-v0 section:\n{sections}"
        );
    }
}
