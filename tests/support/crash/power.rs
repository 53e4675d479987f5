//! Power-loss states: from one recorded run (`strace -f -y -s <big> -xx`), the on-disk states
//! a power cut could leave at each point, under a stated conservative model
//! (docs/delivery-semantics.md, "Crash model"):
//!
//! - a write, `pwrite64` or `ftruncate` is durable once an `fsync`/`fdatasync` of the same
//!   file finished after it; before that it may be lost, or kept in part (torn), whatever
//!   happened to the file's other unsynced writes;
//! - a directory entry (a create, `link`, `rename`, `unlink`, `mkdir`) is durable once an
//!   `fsync` of its directory (both directories for a `rename`) finished after it; before that
//!   it may be lost, independently of the file's data;
//! - a `rename` is atomic: the old entry or the new one, never neither.
//!
//! At each cut (just before each durable call, and at the end) the states taken are: every
//! unsynced change kept (what a kill leaves), every one lost, each unsynced directory entry
//! lost alone, each file's unsynced data lost alone, and each file's last unsynced write torn
//! in half. States equal to one already checked are skipped. "ACKed before the cut" is read
//! from the same trace: the `+ACK` the runner sent on its socket before the cut.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::trace::{self, Call};

/// One change to the file system, resolved to inodes.
#[derive(Debug, Clone)]
enum Op {
    Create(String, usize),
    Link(String, usize),
    Rename(String, String),
    Unlink(String),
    Mkdir(String, usize),
    Write(usize, u64, Vec<u8>),
    Truncate(usize, u64),
    SyncFile(usize),
    SyncDir(String),
}

impl Op {
    /// Directories whose fsync makes this entry durable.
    fn dirs(&self) -> Vec<String> {
        match self {
            Op::Create(p, _) | Op::Link(p, _) | Op::Unlink(p) | Op::Mkdir(p, _) => vec![parent(p)],
            Op::Rename(a, b) => vec![parent(a), parent(b)],
            _ => Vec::new(),
        }
    }

    fn data_of(&self) -> Option<usize> {
        match self {
            Op::Write(i, ..) | Op::Truncate(i, _) => Some(*i),
            _ => None,
        }
    }
}

fn parent(p: &str) -> String {
    p.rsplit_once('/').map_or("", |x| x.0).to_string()
}

/// A recorded run, replayable to any cut.
pub struct Recording {
    ops: Vec<(usize, Op, String)>,
    /// Per op: the index of the first op at which it is durable (`usize::MAX`: never).
    durable_at: Vec<usize>,
    /// Files and directories below the roots when the run began.
    initial: BTreeMap<String, Option<Vec<u8>>>,
    inodes: usize,
    /// (trace line, stream sequence) of every `+ACK` sent.
    acks: Vec<(usize, u64)>,
}

/// A state to check: the files below the roots, and what was ACKed before its cut.
pub struct State {
    pub label: String,
    pub files: BTreeMap<String, Option<Vec<u8>>>,
    pub acked: BTreeSet<u64>,
}

/// Reads the roots' files as they are before a recorded run (directories as `None`).
pub fn snapshot(roots: &[String]) -> BTreeMap<String, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    for r in roots {
        for rel in crate::support::files_below(Path::new(r)) {
            let p = Path::new(r).join(&rel);
            out.insert(p.to_string_lossy().into_owned(), std::fs::read(&p).ok());
        }
        out.insert(r.clone(), None);
    }
    out
}

/// Where parsing stands: names to inodes, descriptors to (inode, append, offset).
struct Parser<'a> {
    roots: &'a [String],
    names: HashMap<String, usize>,
    /// Directories (a descriptor of one is synced as a directory, however it was opened).
    dirs: HashSet<String>,
    tmp: HashMap<String, usize>,
    fds: HashMap<i64, (usize, bool, u64)>,
    sizes: Vec<u64>,
    ops: Vec<(usize, Op, String)>,
}

impl Parser<'_> {
    fn inode(&mut self) -> usize {
        self.sizes.push(0);
        self.sizes.len() - 1
    }

    fn push(&mut self, c: &Call, op: Op) {
        let label = super::explore::label(c, self.roots);
        self.ops.push((c.line, op, label));
    }

    fn open(&mut self, c: &Call) {
        let (Some(p), Some(fd)) = (c.ret_path.clone(), c.value()) else {
            return;
        };
        let flags = c.other(2).to_string();
        // The number is this file's now, whatever it was before.
        self.fds.remove(&fd);
        if !trace::below(&p, self.roots) || flags.contains("O_DIRECTORY") || self.dirs.contains(&p)
        {
            return;
        }
        let append = flags.contains("O_APPEND");
        let ino = if flags.contains("O_TMPFILE") {
            let i = self.inode();
            self.tmp.insert(p.clone(), i);
            i
        } else if let Some(&i) = self.names.get(&p) {
            if flags.contains("O_TRUNC") {
                self.sizes[i] = 0;
                self.push(c, Op::Truncate(i, 0));
            }
            i
        } else {
            let i = self.inode();
            self.names.insert(p.clone(), i);
            self.push(c, Op::Create(p, i));
            i
        };
        self.fds.insert(fd, (ino, append, 0));
    }

    fn write(&mut self, c: &Call, at: Option<u64>) {
        let (Some(fd), Some(n)) = (c.fd_num(0), c.value()) else {
            return;
        };
        let Some(&(ino, append, off)) = self.fds.get(&fd) else {
            return;
        };
        let data = c.str_arg(1).unwrap_or_default();
        assert!(
            data.len() >= n as usize,
            "the trace cut a write's data: record with a larger -s"
        );
        let at = at.unwrap_or(if append { self.sizes[ino] } else { off });
        self.sizes[ino] = self.sizes[ino].max(at + n as u64);
        self.fds.insert(fd, (ino, append, at + n as u64));
        self.push(c, Op::Write(ino, at, data[..n as usize].to_vec()));
    }

    fn call(&mut self, c: &Call) {
        if !c.ok() {
            return;
        }
        let fd = |i| c.fd_num(i).and_then(|f| self.fds.get(&f).map(|x| x.0));
        match c.name.as_str() {
            "openat" => self.open(c),
            "write" => self.write(c, None),
            "pwrite64" => self.write(c, c.other(3).parse().ok()),
            "lseek" => {
                if let (Some(f), Some(v)) = (c.fd_num(0), c.value()) {
                    if let Some(e) = self.fds.get_mut(&f) {
                        e.2 = v as u64;
                    }
                }
            }
            "ftruncate" => {
                if let (Some(i), Ok(len)) = (fd(0), c.other(1).parse::<u64>()) {
                    self.sizes[i] = len;
                    self.push(c, Op::Truncate(i, len));
                }
            }
            "fsync" | "fdatasync" => match (c.fd_path(0), fd(0)) {
                (Some(p), _) if self.dirs.contains(p) => {
                    let p = p.to_string();
                    self.push(c, Op::SyncDir(p))
                }
                (_, Some(i)) => self.push(c, Op::SyncFile(i)),
                _ => {}
            },
            _ => self.namespace(c),
        }
    }

    fn namespace(&mut self, c: &Call) {
        let t = c.targets();
        if !t.iter().any(|p| trace::below(p, self.roots)) {
            return;
        }
        match c.name.as_str() {
            "mkdir" | "mkdirat" => {
                let i = self.inode();
                self.names.insert(t[0].clone(), i);
                self.dirs.insert(t[0].clone());
                self.push(c, Op::Mkdir(t[0].clone(), i));
            }
            "unlink" | "unlinkat" => {
                self.names.remove(&t[0]);
                self.push(c, Op::Unlink(t[0].clone()));
            }
            "rename" | "renameat" | "renameat2" if t.len() == 2 => {
                if let Some(i) = self.names.remove(&t[0]) {
                    self.names.insert(t[1].clone(), i);
                }
                self.push(c, Op::Rename(t[0].clone(), t[1].clone()));
            }
            "link" | "linkat" if t.len() == 2 => {
                let from = c.fd_path(0).filter(|_| c.str_arg(1) == Some(b""));
                let ino = from
                    .and_then(|p| self.tmp.get(p).copied())
                    .or_else(|| self.names.get(&t[0]).copied());
                if let Some(i) = ino {
                    self.names.insert(t[1].clone(), i);
                    self.push(c, Op::Link(t[1].clone(), i));
                }
            }
            _ => {}
        }
    }
}

impl Recording {
    /// Reads a trace recorded from a state equal to `initial` ([`snapshot`]).
    pub fn parse(
        text: &str,
        roots: &[String],
        initial: BTreeMap<String, Option<Vec<u8>>>,
    ) -> Recording {
        let calls = trace::parse(text);
        let mut p = Parser {
            roots,
            names: HashMap::new(),
            dirs: HashSet::new(),
            tmp: HashMap::new(),
            fds: HashMap::new(),
            sizes: Vec::new(),
            ops: Vec::new(),
        };
        for (path, content) in &initial {
            let i = p.inode();
            p.sizes[i] = content.as_ref().map_or(0, |c| c.len() as u64);
            p.names.insert(path.clone(), i);
            if content.is_none() {
                p.dirs.insert(path.clone());
            }
        }
        let mut acks = Vec::new();
        for c in &calls {
            acks.extend(acks_sent(c).into_iter().map(|s| (c.line, s)));
            p.call(c);
        }
        let durable_at = durability(&p.ops);
        Recording {
            inodes: p.sizes.len(),
            ops: p.ops,
            durable_at,
            initial,
            acks,
        }
    }

    /// Durable calls recorded.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Every distinct state of every cut; `limit` bounds how many are returned (evenly spread
    /// over the cuts, the last cut always among them).
    pub fn states(&self, limit: usize) -> Vec<State> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for cut in 0..=self.ops.len() {
            let (line, at) = match self.ops.get(cut) {
                Some((line, _, label)) => (*line, format!("power cut before {label}")),
                None => (usize::MAX, "power cut after the run".to_string()),
            };
            let acked: BTreeSet<u64> = self
                .acks
                .iter()
                .filter(|a| a.0 < line)
                .map(|a| a.1)
                .collect();
            for (what, lost) in self.choices(cut) {
                let files = self.replay(cut, &lost);
                if seen.insert(format!("{files:?}{acked:?}")) {
                    out.push(State {
                        label: format!("{at}, {what}"),
                        files,
                        acked: acked.clone(),
                    });
                }
            }
        }
        if out.len() > limit && limit > 0 {
            let step = out.len() as f64 / limit as f64;
            let last = out.len() - 1;
            let mut keep: Vec<usize> = (0..limit).map(|k| (k as f64 * step) as usize).collect();
            keep.push(last);
            keep.dedup();
            let mut all: Vec<Option<State>> = out.into_iter().map(Some).collect();
            return keep.into_iter().filter_map(|k| all[k].take()).collect();
        }
        out
    }

    /// The choices at a cut: (description, op -> 0 keep, 1 lose, 2 tear).
    fn choices(&self, cut: usize) -> Vec<(String, HashMap<usize, u8>)> {
        let pending: Vec<usize> = (0..cut)
            .filter(|&i| self.durable_at[i] >= cut)
            .filter(|&i| !matches!(self.ops[i].1, Op::SyncFile(_) | Op::SyncDir(_)))
            .collect();
        let mut out = vec![("every unsynced change kept".to_string(), HashMap::new())];
        if pending.is_empty() {
            return out;
        }
        out.push((
            "every unsynced change lost".into(),
            pending.iter().map(|&i| (i, 1)).collect(),
        ));
        let mut by_inode: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for &i in &pending {
            match self.ops[i].1.data_of() {
                Some(ino) => by_inode.entry(ino).or_default().push(i),
                None => out.push((
                    format!("directory entry of {} lost", self.ops[i].2),
                    HashMap::from([(i, 1)]),
                )),
            }
        }
        for ops in by_inode.values() {
            let last = *ops.last().expect("non-empty");
            let what = &self.ops[last].2;
            out.push((
                format!("unsynced data lost ({what})"),
                ops.iter().map(|&i| (i, 1)).collect(),
            ));
            if matches!(self.ops[last].1, Op::Write(..)) {
                out.push((format!("torn: {what}"), HashMap::from([(last, 2)])));
            }
        }
        out
    }

    /// The files below the roots after ops `..cut`, `lost` ones left out (or torn).
    fn replay(&self, cut: usize, lost: &HashMap<usize, u8>) -> BTreeMap<String, Option<Vec<u8>>> {
        let mut names: BTreeMap<String, usize> = BTreeMap::new();
        let mut data: Vec<Option<Vec<u8>>> = vec![Some(Vec::new()); self.inodes];
        for (i, (path, content)) in self.initial.iter().enumerate() {
            names.insert(path.clone(), i);
            data[i] = content.clone();
        }
        for (i, (_, op, _)) in self.ops[..cut].iter().enumerate() {
            let how = lost.get(&i).copied().unwrap_or(0);
            if how == 1 {
                continue;
            }
            apply(op, how == 2, &mut names, &mut data);
        }
        names
            .into_iter()
            .map(|(p, i)| (p, data[i].clone()))
            .collect()
    }
}

fn apply(op: &Op, torn: bool, names: &mut BTreeMap<String, usize>, data: &mut [Option<Vec<u8>>]) {
    match op {
        Op::Create(p, i) | Op::Link(p, i) => {
            names.insert(p.clone(), *i);
        }
        Op::Mkdir(p, i) => {
            data[*i] = None;
            names.insert(p.clone(), *i);
        }
        Op::Unlink(p) => {
            names.remove(p);
        }
        Op::Rename(a, b) => {
            if let Some(i) = names.remove(a) {
                names.insert(b.clone(), i);
            }
        }
        Op::Write(i, at, bytes) => {
            let d = data[*i].get_or_insert_with(Vec::new);
            let bytes = if torn {
                &bytes[..bytes.len() / 2]
            } else {
                bytes
            };
            let end = *at as usize + bytes.len();
            if d.len() < end {
                d.resize(end, 0);
            }
            d[*at as usize..end].copy_from_slice(bytes);
        }
        Op::Truncate(i, len) => {
            data[*i]
                .get_or_insert_with(Vec::new)
                .resize(*len as usize, 0);
        }
        Op::SyncFile(_) | Op::SyncDir(_) => {}
    }
}

/// Per op, the index of the first op at which it is durable: the next sync of its file (data)
/// or of every directory it changed (entries); syncs themselves at once.
fn durability(ops: &[(usize, Op, String)]) -> Vec<usize> {
    let mut out = vec![usize::MAX; ops.len()];
    let mut waiting: Vec<(usize, Option<usize>, Vec<String>)> = Vec::new();
    for (i, (_, op, _)) in ops.iter().enumerate() {
        match op {
            Op::SyncFile(ino) => {
                out[i] = i;
                waiting.retain(|(k, data, _)| {
                    let done = *data == Some(*ino);
                    if done {
                        out[*k] = i;
                    }
                    !done
                });
            }
            Op::SyncDir(d) => {
                out[i] = i;
                waiting.retain_mut(|(k, data, dirs)| {
                    if data.is_some() {
                        return true;
                    }
                    dirs.retain(|x| x != d);
                    if dirs.is_empty() {
                        out[*k] = i;
                    }
                    !dirs.is_empty()
                });
            }
            op => waiting.push((i, op.data_of(), op.dirs())),
        }
    }
    out
}

/// Stream sequences of the `+ACK`s a socket write of this call carries.
fn acks_sent(c: &Call) -> Vec<u64> {
    if !matches!(c.name.as_str(), "sendto" | "write" | "writev" | "sendmsg") {
        return Vec::new();
    }
    let mut bytes = Vec::new();
    for a in &c.args {
        match a {
            trace::Arg::Str(s) => bytes.extend_from_slice(s),
            trace::Arg::Other(o) => {
                for part in o.split("iov_base=\"").skip(1) {
                    let end = part.find("\", iov_len").unwrap_or(part.len());
                    bytes.extend_from_slice(&trace::unescape(&part[..end]));
                }
            }
            _ => {}
        }
    }
    let text = String::from_utf8_lossy(&bytes);
    let mut out = Vec::new();
    for piece in text.split("PUB $JS.ACK.").skip(1) {
        let Some((subject, rest)) = piece.split_once(' ') else {
            continue;
        };
        let payload = rest.split_once("\r\n").map_or("", |x| x.1);
        let acked = payload.starts_with("+ACK") || payload.starts_with("\r\n");
        let tokens: Vec<&str> = subject.split('.').collect();
        // v1: <stream>.<consumer>.<delivered>.<sseq>...; v2 adds domain and account hash.
        let at = if tokens.len() >= 9 { 5 } else { 3 };
        if let (true, Some(Ok(seq))) = (acked, tokens.get(at).map(|t| t.parse::<u64>())) {
            out.push(seq);
        }
    }
    out
}

/// Writes a state's files below `dest`, each path moved from below `base` to below `dest`.
pub fn materialize(state: &State, base: &Path, dest: &Path) -> Vec<PathBuf> {
    let mut written = Vec::new();
    for (path, content) in &state.files {
        let Ok(rel) = Path::new(path).strip_prefix(base) else {
            continue;
        };
        let to = dest.join(rel);
        match content {
            None => std::fs::create_dir_all(&to).unwrap(),
            Some(bytes) => {
                if to.parent().is_some_and(Path::exists) {
                    // Owner-only, as the service creates its files: the model keeps no modes,
                    // and a file it reads only when private (the spool's meta) would be
                    // refused at the umask's 0644.
                    use std::io::Write as _;
                    use std::os::unix::fs::OpenOptionsExt as _;
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .mode(0o600)
                        .open(&to)
                        .and_then(|mut f| f.write_all(bytes))
                        .unwrap();
                    written.push(to);
                }
            }
        }
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_without_a_directory_fsync_may_be_lost() {
        let text = "1 openat(3</r>, \"a\", O_WRONLY|O_CREAT|O_EXCL, 0600) = 4</r/a>\n\
                    1 write(4</r/a>, \"xy\", 2) = 2\n\
                    1 fdatasync(4</r/a>) = 0\n\
                    1 sendto(5<TCP:[1]>, \"PUB $JS.ACK.S.C.1.7.7.1.0 4\\r\\n+ACK\\r\\n\", 36, MSG_NOSIGNAL, NULL, 0) = 36\n";
        let roots = vec!["/r".to_string()];
        let rec = Recording::parse(text, &roots, BTreeMap::from([("/r".into(), None)]));
        let states = rec.states(100);
        let last: Vec<&State> = states.iter().filter(|s| s.acked.contains(&7)).collect();
        assert!(
            last.iter().any(|s| !s.files.contains_key("/r/a")),
            "entry lost"
        );
        assert!(last
            .iter()
            .any(|s| s.files.get("/r/a") == Some(&Some(b"xy".to_vec()))));
    }
}
