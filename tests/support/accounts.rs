//! A second real account (`svc-attacker`) for the attacks on shared directories.

use std::process::Command;

/// A second local account for attacks on shared directories: `svc-attacker`, created once
/// (idempotent; the suite runs as root). Returns its uid.
pub fn attacker_uid() -> u32 {
    let id = || {
        Command::new("id")
            .args(["-u", "svc-attacker"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .parse::<u32>()
                    .unwrap()
            })
    };
    if let Some(uid) = id() {
        return uid;
    }
    // Exit 9: another test created it meanwhile.
    let status = Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
        ])
        .arg("svc-attacker")
        .status()
        .unwrap();
    assert!(matches!(status.code(), Some(0 | 9)), "useradd: {status}");
    id().expect("svc-attacker exists")
}

/// Runs `sh -c script` as the attacker: its own uid, group `gid` (0 to share root's group,
/// as a member of the service's group would), no supplementary groups.
pub fn as_attacker(gid: u32, script: &str) -> std::process::Output {
    let uid = attacker_uid();
    Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg("--clear-groups")
        .args(["sh", "-c", script])
        .output()
        .unwrap()
}

/// [`as_attacker`] that must succeed.
pub fn attacker_does(gid: u32, script: &str) {
    let out = as_attacker(gid, script);
    assert!(
        out.status.success(),
        "attacker `{script}`: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
