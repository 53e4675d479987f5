//! The replay's durable progress: a small JSON file (`svc.replay.state.v1`) naming the range it
//! belongs to and the next stream sequence to read. It is replaced atomically and fsynced
//! (`files::atomic`) after every batch whose messages are all settled (stored, already present,
//! dead-lettered or counted as refused), so `--resume` starts at the first message not settled:
//! a message may be written twice after a crash (a keyed sink then says "already present"),
//! never skipped.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The state file's schema name.
pub const SCHEMA: &str = "svc.replay.state.v1";
/// Largest state file read (it is a few hundred bytes; a larger one is not ours).
const MAX_STATE_BYTES: u64 = 64 * 1024;

/// What a state file belongs to: a resumed replay must ask for exactly this.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeKey {
    /// The configuration file, as given (made absolute).
    pub config: String,
    pub stream: String,
    pub subjects: Vec<String>,
    /// `configured` or the `--sink` file (made absolute).
    pub sink: String,
    pub start_seq: Option<u64>,
    pub end_seq: Option<u64>,
    /// `--since` / `--until` as Unix nanoseconds.
    pub since: Option<i128>,
    pub until: Option<i128>,
    /// `svc dlq redrive`'s record filter (`--reason`, `--class`, `--subject`), as one text;
    /// absent for a replay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// The read stream's incarnation (its creation time) when the replay started: a stream
    /// deleted and created again numbers from 1, so the recorded position means other
    /// messages. Filled in from the broker, not by the caller.
    #[serde(default)]
    pub incarnation: String,
    /// [`shape_digest`] of the configuration the replay started with: a resumed replay must
    /// write into the same sink, the same way.
    #[serde(default)]
    pub shape: String,
}

/// SHA-256 (hex) over everything that decides where a record goes and what it holds: the
/// sink block (after `--sink` / `--fanout-child`), the envelope, metadata, label, mission and
/// size settings, the pre-sink policy, the dead-letter settings and payload protection. Not
/// the broker connection, delivery tuning, metrics or logging: those may change between a
/// crash and `--resume`. Read from the parsed configuration (its `Debug` form: ordered, and
/// every secret in it shown redacted), so layout and comments in the file do not count.
pub fn shape_digest(cfg: &crate::config::RuntimeConfig) -> String {
    use sha2::{Digest, Sha256};
    let shaping = format!(
        "{:?}",
        (
            &cfg.sink,
            &cfg.envelope,
            &cfg.message_metadata,
            &cfg.security_labels,
            &cfg.mission_metadata,
            &cfg.pre_sink_policy,
            &cfg.size_policy,
            &cfg.dead_letter,
            &cfg.payload_encryption,
            &cfg.authenticity,
            &cfg.custody,
        )
    );
    crate::text::hex::lower(&Sha256::digest(shaping.as_bytes()))
}

/// The counters a summary shows; kept in the state file so a resumed replay reports the whole.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub read: u64,
    pub bytes: u64,
    pub stored: u64,
    pub already_present: u64,
    pub refused_governance: u64,
    pub refused_sink: u64,
    pub dead_lettered: u64,
    /// `svc dlq redrive`: records whose original the stream no longer holds (kept).
    #[serde(default)]
    pub original_missing: u64,
    /// `svc dlq redrive`: records kept for another reason (not a record, another stream, the
    /// sequence holds another message).
    #[serde(default)]
    pub kept: u64,
    /// `svc dlq redrive`: dead-letter records removed after their message was settled.
    #[serde(default)]
    pub removed: u64,
}

impl Counts {
    /// The first count above `max`, by its field name.
    fn beyond(&self, max: u64) -> Option<&'static str> {
        [
            ("read", self.read),
            ("bytes", self.bytes),
            ("stored", self.stored),
            ("already_present", self.already_present),
            ("refused_governance", self.refused_governance),
            ("refused_sink", self.refused_sink),
            ("dead_lettered", self.dead_lettered),
            ("original_missing", self.original_missing),
            ("kept", self.kept),
            ("removed", self.removed),
        ]
        .into_iter()
        .find(|(_, n)| *n > max)
        .map(|(name, _)| name)
    }

    /// Messages neither stored nor already present.
    pub fn refused(&self) -> u64 {
        self.refused_governance + self.refused_sink
    }

    /// The final summary line of `svc replay` (`redrive` false) or `svc dlq redrive` (with
    /// its record counts too).
    pub fn summary_line(&self, redrive: bool, dry_run: bool) -> String {
        let command = if redrive { "redrive" } else { "replay" };
        let stored = if dry_run { "would store" } else { "stored" };
        let mut line = format!(
            "{command}: read {}, {stored} {}, already present {}, refused by governance {}, \
             refused by the sink {}, dead-lettered {}",
            self.read,
            self.stored,
            self.already_present,
            self.refused_governance,
            self.refused_sink,
            self.dead_lettered,
        );
        if redrive {
            line.push_str(&format!(
                ", original missing {}, kept {}, removed {}",
                self.original_missing, self.kept, self.removed
            ));
        }
        format!("{line} ({})", super::progress::human_bytes(self.bytes))
    }
}

/// The state file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    pub schema: String,
    pub range: RangeKey,
    /// The last stream sequence of the range, fixed when the replay first started.
    pub last_seq: u64,
    /// The first stream sequence not yet settled.
    pub next_seq: u64,
    pub done: bool,
    pub counts: Counts,
    /// Records sealed so far under each payload key by this replay's runs (`--resume` goes on
    /// counting from here: the per-key bound holds across them). Empty without encryption.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub sealed: std::collections::BTreeMap<String, u64>,
}

/// The lock of one replay on its state file ([`StateFile::lock`]), released when dropped.
#[derive(Debug)]
pub struct Lock {
    _file: std::fs::File,
    _name: std::os::unix::net::UnixListener,
}

/// Who holds the lock name `addr`: the process that bound it, as the kernel says
/// (`SO_PEERCRED` of a connection to it), or the name alone when it cannot be asked.
fn holder(addr: &std::os::unix::net::SocketAddr, name: &str) -> String {
    let asked = std::os::unix::net::UnixStream::connect_addr(addr)
        .and_then(|s| rustix::net::sockopt::socket_peercred(&s).map_err(Into::into));
    match asked {
        Ok(cred) => format!(
            "its lock name @{name} is held by pid {} (uid {})",
            cred.pid.as_raw_nonzero(),
            cred.uid.as_raw()
        ),
        Err(_) => format!("its lock name @{name} is held by another process"),
    }
}

/// The largest count a state file may hold (2^53: far beyond any replay, far below overflow).
const MAX_COUNT: u64 = 1 << 53;

/// Where the state lives and how it is written.
pub struct StateFile {
    pub path: PathBuf,
}

impl StateFile {
    /// The default place: next to the configuration, `<config>.replay-state`.
    pub fn default_for(config: &Path) -> PathBuf {
        let mut name = config.file_name().unwrap_or_default().to_os_string();
        name.push(".replay-state");
        config.with_file_name(name)
    }

    /// Refuses a state file whose directory another account can change: one that others may
    /// write without the sticky bit (they could rename the service's own files there: put a
    /// finished state of an earlier run back under the name, and make `--resume` end a range
    /// it never delivered), or one owned by another account (which could make it so). The same
    /// holds for every directory on its path, walked as the kernel resolves it (an ancestor others
    /// may write lets them rename the whole state directory and put an old one back, atk46f
    /// finding 2), and for every symbolic link on the way (its owner could point it elsewhere).
    fn check_directory(&self) -> Result<(), String> {
        crate::files::owner::file_directory_changeable_by_others(&self.path).map_err(
            |(dir, why)| {
                format!(
                    "replay state {}: its directory {}: {why}: another account could put an old \
                 state back and make --resume skip messages; give --state in a directory only \
                 the service's user (or root) can write, on a path only they can change",
                    self.path.display(),
                    dir.display()
                )
            },
        )
    }

    /// Reads the state, `None` when there is none. A file that is not a state file is an
    /// error naming the file and the reason.
    pub fn read(&self) -> Result<Option<State>, String> {
        self.check_directory()?;
        let shown = self.path.display();
        // Another account may write the directory: only the service's own private file.
        let Some(text) = crate::files::owner::read_private(&self.path, MAX_STATE_BYTES)
            .map_err(|e| format!("replay state {shown}: {e}"))?
        else {
            return Ok(None);
        };
        let state: State = serde_json::from_slice(&text)
            .map_err(|e| format!("replay state {shown}: not a replay state file ({e})"))?;
        if state.schema != SCHEMA {
            return Err(format!(
                "replay state {shown}: schema \"{}\", expected {SCHEMA}",
                crate::text::peer::PeerText::new(&state.schema)
            ));
        }
        // Counts a replay could reach (its adds are not saturating): an edited or damaged file
        // must not make every `--resume` overflow.
        if let Some(field) = state.counts.beyond(MAX_COUNT) {
            return Err(format!(
                "replay state {shown}: counts.{field} is beyond any count a replay reaches"
            ));
        }
        if state.next_seq == 0 || state.next_seq > state.last_seq.saturating_add(1) {
            return Err(format!(
                "replay state {shown}: next_seq {} outside the range (last_seq {})",
                state.next_seq, state.last_seq
            ));
        }
        Ok(Some(state))
    }

    /// Takes the lock a replay (or redrive) holds on its state file for its whole run, so two
    /// `--resume` of one file cannot both write: `<state>.lock`, created 0600 if missing, never
    /// through a link, a regular file of the service's user. The lock goes with the returned
    /// file (and with the process, however it ends).
    pub fn lock(&self) -> Result<Lock, String> {
        use rustix::fs::{FileType, Mode, OFlags};
        self.check_directory()?;
        let mut name = self.path.as_os_str().to_os_string();
        name.push(".lock");
        let path = PathBuf::from(name);
        let shown = path.display();
        let flags = OFlags::RDWR
            | OFlags::CREATE
            | OFlags::NOFOLLOW
            | OFlags::NONBLOCK
            | OFlags::CLOEXEC
            | OFlags::NOCTTY;
        let fd =
            rustix::fs::open(&path, flags, Mode::from_raw_mode(0o600)).map_err(|e| match e {
                rustix::io::Errno::LOOP => format!("replay lock {shown}: is a symbolic link"),
                e => format!(
                    "replay lock {shown}: cannot open: {}",
                    std::io::Error::from(e)
                ),
            })?;
        let stat = rustix::fs::fstat(&fd)
            .map_err(|e| format!("replay lock {shown}: {}", std::io::Error::from(e)))?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(format!("replay lock {shown}: not a regular file"));
        }
        crate::files::owner::check_owner(&stat, false)
            .map_err(|e| format!("replay lock {shown}: {e}"))?;
        // flock, not `File::try_lock` (Rust 1.89; the crate's MSRV is 1.85).
        use rustix::fs::FlockOperation;
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Lock {
                _file: std::fs::File::from(fd),
                _name: self.lock_name()?,
            }),
            Err(rustix::io::Errno::WOULDBLOCK) => Err(format!(
                "replay state {}: another replay or redrive is using it (it holds {shown}); \
                 wait for it to end, or give another --state",
                self.path.display()
            )),
            Err(e) => Err(format!(
                "replay lock {shown}: cannot lock: {}",
                std::io::Error::from(e)
            )),
        }
    }

    /// The second half of [`StateFile::lock`]: a name no file system holds, an abstract Unix
    /// socket named after the state file's full path, bound for the run. Another account that
    /// can write the directory can unlink `<state>.lock` under a running replay (the next one
    /// would create and lock a new file), but cannot unbind this name; the kernel releases it
    /// when the process ends, however it ends.
    fn lock_name(&self) -> Result<std::os::unix::net::UnixListener, String> {
        use sha2::Digest;
        use std::os::linux::net::SocketAddrExt;
        // One name per state file: the directory's real path (no `..`, no links) and the file
        // name, so two spellings of one file cannot take two locks.
        let shown = self.path.display();
        let parent = match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let real =
            std::fs::canonicalize(parent).map_err(|e| format!("replay state {shown}: {e}"))?;
        let full = real.join(self.path.file_name().unwrap_or_default());
        let digest = sha2::Sha256::digest(full.as_os_str().as_encoded_bytes());
        let name = format!("svc-replay-state:{}", crate::text::hex::lower(&digest));
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .map_err(|e| format!("replay lock: {e}"))?;
        std::os::unix::net::UnixListener::bind_addr(&addr).map_err(|e| match e.kind() {
            std::io::ErrorKind::AddrInUse => format!(
                "replay state {shown}: another replay or redrive is using it: {}; wait for it \
                 to end (if that is no svc replay, another account holds the name), or give \
                 another --state",
                holder(&addr, &name)
            ),
            _ => format!("replay lock @{name}: {e}"),
        })
    }

    /// Replaces the state atomically and durably (file and directory fsynced).
    pub fn write(&self, state: &State) -> Result<(), String> {
        let mut bytes = serde_json::to_vec_pretty(state).unwrap_or_default();
        bytes.push(b'\n');
        crate::files::atomic::write_atomically(&self.path, &bytes, 0o600).map_err(|e| {
            format!(
                "replay state {}: cannot be written: {e}",
                self.path.display()
            )
        })
    }
}

/// Why a state file cannot be continued by this request, naming what differs.
pub fn mismatch(stored: &RangeKey, asked: &RangeKey) -> Option<String> {
    let differs = [
        ("configuration file", stored.config != asked.config),
        ("stream", stored.stream != asked.stream),
        ("subjects (--subject)", stored.subjects != asked.subjects),
        ("sink (--sink)", stored.sink != asked.sink),
        ("--start-seq", stored.start_seq != asked.start_seq),
        ("--end-seq", stored.end_seq != asked.end_seq),
        ("--since", stored.since != asked.since),
        ("--until", stored.until != asked.until),
        ("filters", stored.filter != asked.filter),
        (
            "the stream's incarnation (it was deleted and created again: its sequences are \
             other messages now)",
            stored.incarnation != asked.incarnation,
        ),
        (
            "the sink or the settings that shape a record (sink, envelope, metadata, labels, \
             policies, dead letters, payload protection)",
            stored.shape != asked.shape,
        ),
    ];
    let names: Vec<&str> = differs.iter().filter(|d| d.1).map(|d| d.0).collect();
    (!names.is_empty()).then(|| names.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> RangeKey {
        RangeKey {
            config: "/etc/svc.json".into(),
            stream: "S".into(),
            subjects: vec!["o.>".into()],
            sink: "configured".into(),
            start_seq: Some(3),
            end_seq: None,
            since: None,
            until: None,
            filter: None,
            incarnation: "2026-11-28T10:00:00Z".into(),
            shape: "ab".repeat(32),
        }
    }

    #[test]
    fn round_trip_and_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile {
            path: StateFile::default_for(&dir.path().join("svc.json")),
        };
        assert!(file.path.ends_with("svc.json.replay-state"));
        assert_eq!(file.read().unwrap(), None);
        let state = State {
            schema: SCHEMA.into(),
            range: key(),
            last_seq: 10,
            next_seq: 5,
            done: false,
            counts: Counts::default(),
            sealed: Default::default(),
        };
        file.write(&state).unwrap();
        assert_eq!(file.read().unwrap(), Some(state.clone()));
        let mut other = key();
        other.end_seq = Some(9);
        other.subjects = vec!["o.a".into()];
        assert_eq!(
            mismatch(&state.range, &other).unwrap(),
            "subjects (--subject), --end-seq"
        );
        assert_eq!(mismatch(&state.range, &key()), None);
        let mut recreated = key();
        recreated.incarnation = "2026-11-28T11:00:00Z".into();
        assert!(mismatch(&state.range, &recreated)
            .unwrap()
            .starts_with("the stream's incarnation"));
        let mut reshaped = key();
        reshaped.shape = "cd".repeat(32);
        assert!(mismatch(&state.range, &reshaped)
            .unwrap()
            .starts_with("the sink or the settings"));
        std::fs::write(&file.path, "{}").unwrap();
        assert!(file.read().unwrap_err().contains("not a replay state file"));
        let mut bad = state;
        bad.next_seq = 12;
        file.write(&bad).unwrap();
        assert!(file.read().unwrap_err().contains("outside the range"));
    }

    /// A state file another account planted (found by the attack on replay: a symlink to its
    /// own file made `--resume` skip 14 messages, a FIFO blocked forever) is refused, never
    /// read; only the service's own 0600 file with one name is.
    /// A directory others may write without the sticky bit, or one another account owns, is
    /// refused before the state is read or locked (atk46e finding 6).
    #[test]
    fn a_state_directory_other_accounts_can_change_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile {
            path: dir.path().join("c.json.replay-state"),
        };
        let set = |m| std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(m));
        set(0o777).unwrap();
        let e = file.read().unwrap_err();
        assert!(e.contains("(mode 0777) and is not sticky"), "{e}");
        assert!(e.contains(&dir.path().display().to_string()), "{e}");
        assert!(file.lock().is_err());
        set(0o770).unwrap();
        assert!(file.read().unwrap_err().contains("mode 0770"));
        set(0o1777).unwrap();
        assert_eq!(
            file.read().unwrap(),
            None,
            "sticky: others cannot rename our files"
        );
        set(0o755).unwrap();
        assert_eq!(file.read().unwrap(), None);
        if crate::files::owner::service_uid() == 0 {
            rustix::fs::chown(dir.path(), Some(rustix::fs::Uid::from_raw(4242)), None).unwrap();
            let e = file.read().unwrap_err();
            assert!(e.contains("owned by uid 4242"), "{e}");
        }
    }

    /// An ancestor of the state directory others may write (no sticky bit) is refused: they
    /// could rename the whole directory and put an old one back (atk46f finding 2); so is a
    /// symbolic link on the path owned by another account.
    #[test]
    fn a_path_other_accounts_can_change_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        let own = shared.join("own");
        std::fs::create_dir(&own).unwrap();
        std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o700)).unwrap();
        let file = StateFile {
            path: own.join("s"),
        };
        let set = |m| std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(m));
        set(0o777).unwrap();
        let e = file.read().unwrap_err();
        assert!(e.contains("shared can be written by other accounts"), "{e}");
        assert!(file.lock().is_err());
        set(0o1777).unwrap();
        assert_eq!(file.read().unwrap(), None);
        set(0o755).unwrap();
        assert_eq!(file.read().unwrap(), None);
        // Through a link: the resolved path counts, and so does the link's owner.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&own, &link).unwrap();
        let linked = StateFile {
            path: link.join("s"),
        };
        assert_eq!(linked.read().unwrap(), None);
        set(0o777).unwrap();
        assert!(linked
            .read()
            .unwrap_err()
            .contains("can be written by other accounts"));
        set(0o755).unwrap();
        if crate::files::owner::service_uid() == 0 {
            let other = Some(rustix::fs::Uid::from_raw(4242));
            rustix::fs::chownat(
                rustix::fs::CWD,
                &link,
                other,
                None,
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            )
            .unwrap();
            let e = linked.read().unwrap_err();
            assert!(e.contains("link is owned by uid 4242"), "{e}");
        }
    }

    #[test]
    fn planted_state_files_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let at = |name: &str| StateFile {
            path: dir.path().join(name),
        };
        let state = State {
            schema: SCHEMA.into(),
            range: key(),
            last_seq: 20,
            next_seq: 15,
            done: false,
            counts: Counts::default(),
            sealed: Default::default(),
        };
        let real = at("real");
        real.write(&state).unwrap();
        assert_eq!(real.read().unwrap(), Some(state));
        std::os::unix::fs::symlink(&real.path, &at("link").path).unwrap();
        assert!(at("link").read().unwrap_err().contains("symbolic link"));
        std::fs::hard_link(&real.path, &at("second").path).unwrap();
        assert!(real.read().unwrap_err().contains("has 2 hard links"));
        std::fs::remove_file(&at("second").path).unwrap();
        std::fs::set_permissions(&real.path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(real.read().unwrap_err().contains("mode 644"));
        let fifo = at("fifo");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo.path,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .unwrap();
        assert!(fifo.read().unwrap_err().contains("not a regular file"));
    }

    /// Two replays of one state file: the second is refused while the first holds it; a
    /// planted link at the lock's name is refused, never followed.
    #[test]
    fn one_replay_at_a_time_per_state_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile {
            path: dir.path().join("s"),
        };
        let held = file.lock().unwrap();
        assert!(file
            .lock()
            .unwrap_err()
            .contains("another replay or redrive"));
        // The lock file unlinked under the holder (another account can write the directory):
        // the name it cannot remove still says the state is taken.
        std::fs::remove_file(dir.path().join("s.lock")).unwrap();
        assert!(file
            .lock()
            .unwrap_err()
            .contains("another replay or redrive"));
        drop(held);
        drop(file.lock().unwrap());
        let linked = StateFile {
            path: dir.path().join("l"),
        };
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), dir.path().join("l.lock"))
            .unwrap();
        assert!(linked.lock().unwrap_err().contains("symbolic link"));
        assert!(!dir.path().join("elsewhere").exists());
    }
}
