//! Reading `strace -f -y` output: one [`Call`] per system call (a call split by another
//! thread's line, `<unfinished ...>` then `<... resumed>`, is joined and placed where it
//! finished), its arguments split, the paths `-y` printed for its descriptors, its result.

/// The calls that change what a file system keeps: what the explorer kills at and what the
/// power-loss model replays. `openat` counts only with `O_CREAT` or `O_TMPFILE`.
pub const DURABLE: &[&str] = &[
    "openat",
    "write",
    "pwrite64",
    "fsync",
    "fdatasync",
    "rename",
    "renameat",
    "renameat2",
    "link",
    "linkat",
    "unlink",
    "unlinkat",
    "ftruncate",
    "mkdir",
    "mkdirat",
];

/// One argument as strace printed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg {
    /// A descriptor with the path `-y` printed (`5</tmp/x/spool>`, `AT_FDCWD</tmp/x>`).
    Fd(Option<i64>, String),
    /// A string (unescaped; strace shortens long ones unless `-s` says otherwise).
    Str(Vec<u8>),
    /// Anything else, as printed (flags, numbers).
    Other(String),
}

/// One finished (or killed) call.
#[derive(Debug, Clone)]
pub struct Call {
    /// Line number of the call in the trace (where it finished).
    pub line: usize,
    pub tid: u32,
    pub name: String,
    pub args: Vec<Arg>,
    /// The return value as printed: `0`, `-1 ENOENT (...)`, `?` for a call the kill cut.
    pub ret: String,
    /// The path of a returned descriptor (`openat`), when `-y` printed one.
    pub ret_path: Option<String>,
}

impl Call {
    /// The result as a number (`None` for `?`).
    pub fn value(&self) -> Option<i64> {
        self.ret.split_whitespace().next()?.parse().ok()
    }

    /// The call succeeded (a non-negative result).
    pub fn ok(&self) -> bool {
        self.value().is_some_and(|v| v >= 0)
    }

    /// The call was entered and never returned: the process was killed in it.
    pub fn cut(&self) -> bool {
        self.ret == "?"
    }

    pub fn fd_path(&self, i: usize) -> Option<&str> {
        match self.args.get(i) {
            Some(Arg::Fd(_, p)) => Some(p),
            _ => None,
        }
    }

    pub fn fd_num(&self, i: usize) -> Option<i64> {
        match self.args.get(i) {
            Some(Arg::Fd(n, _)) => *n,
            _ => None,
        }
    }

    pub fn str_arg(&self, i: usize) -> Option<&[u8]> {
        match self.args.get(i) {
            Some(Arg::Str(s)) => Some(s),
            _ => None,
        }
    }

    pub fn other(&self, i: usize) -> &str {
        match self.args.get(i) {
            Some(Arg::Other(s)) => s,
            _ => "",
        }
    }

    /// `dirfd` + `name` as one path (an absolute name stands alone; an empty one is the fd).
    fn at(&self, fd: usize, name: usize) -> Option<String> {
        let n = String::from_utf8_lossy(self.str_arg(name)?).into_owned();
        if n.starts_with('/') {
            return Some(n);
        }
        let dir = self.fd_path(fd)?;
        Some(if n.is_empty() {
            dir.to_string()
        } else {
            format!("{dir}/{n}")
        })
    }

    /// The file system paths the call changes (empty for calls outside [`DURABLE`], and for
    /// an `openat` that creates nothing).
    pub fn targets(&self) -> Vec<String> {
        let one = |p: Option<String>| p.into_iter().collect::<Vec<_>>();
        match self.name.as_str() {
            "openat" if self.creates() => one(self.ret_path.clone().or_else(|| self.at(0, 1))),
            "write" | "pwrite64" | "fsync" | "fdatasync" | "ftruncate" => {
                one(self.fd_path(0).map(str::to_string))
            }
            "mkdir" | "unlink" => one(self.at(usize::MAX, 0)),
            "mkdirat" | "unlinkat" => one(self.at(0, 1)),
            "rename" | "link" => [self.at(usize::MAX, 0), self.at(usize::MAX, 1)]
                .into_iter()
                .flatten()
                .collect(),
            "renameat" | "renameat2" | "linkat" => [self.at(0, 1), self.at(2, 3)]
                .into_iter()
                .flatten()
                .collect(),
            _ => Vec::new(),
        }
    }

    /// An `openat` with `O_CREAT` or `O_TMPFILE`.
    pub fn creates(&self) -> bool {
        self.name == "openat" && {
            let flags = self.other(2);
            flags.contains("O_CREAT") || flags.contains("O_TMPFILE")
        }
    }

    /// A durable call on a path below one of `roots`.
    pub fn touches(&self, roots: &[String]) -> bool {
        DURABLE.contains(&self.name.as_str()) && self.targets().iter().any(|t| below(t, roots))
    }
}

/// `path` is one of `roots` or inside one.
pub fn below(path: &str, roots: &[String]) -> bool {
    roots.iter().any(|r| {
        path == r
            || path
                .strip_prefix(r.as_str())
                .is_some_and(|t| t.starts_with('/'))
    })
}

/// Every call of a trace, in the order they finished.
pub fn parse(text: &str) -> Vec<Call> {
    let mut pending: std::collections::HashMap<u32, String> = Default::default();
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let Some((tid, rest)) = line.split_once(' ') else {
            continue;
        };
        let Ok(tid) = tid.parse::<u32>() else {
            continue;
        };
        let rest = rest.trim_start();
        if let Some(head) = rest.strip_suffix(" <unfinished ...>") {
            pending.insert(tid, head.to_string());
            continue;
        }
        let full = if let Some(r) = rest.strip_prefix("<... ") {
            let Some((_, tail)) = r.split_once(" resumed>") else {
                continue;
            };
            match pending.remove(&tid) {
                Some(head) => format!("{head}{tail}"),
                None => continue,
            }
        } else {
            rest.to_string()
        };
        if let Some(call) = parse_call(n, tid, &full) {
            out.push(call);
        }
    }
    // Calls the kill cut while another thread's line came between.
    for (tid, head) in pending {
        if let Some(call) = parse_call(usize::MAX, tid, &format!("{head}) = ?")) {
            out.push(call);
        }
    }
    out
}

/// The process was killed by SIGKILL while traced.
pub fn killed(text: &str) -> bool {
    text.lines()
        .any(|l| l.ends_with("+++ killed by SIGKILL +++"))
}

fn parse_call(line: usize, tid: u32, text: &str) -> Option<Call> {
    let open = text.find('(')?;
    let name = text[..open].to_string();
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return None;
    }
    let (body, ret) = split_body(&text[open + 1..])?;
    let ret = ret.trim();
    let (ret, ret_path) = match ret.split_once('<') {
        Some((v, p)) if v.trim().parse::<i64>().is_ok() => (
            v.trim().to_string(),
            Some(path_text(p.split_once('>').map_or(p, |x| x.0))),
        ),
        _ => (ret.to_string(), None),
    };
    Some(Call {
        line,
        tid,
        name,
        args: split_args(body).iter().map(|a| parse_arg(a)).collect(),
        ret,
        ret_path,
    })
}

/// Splits `args...) = ret` at the closing parenthesis of the argument list.
fn split_body(s: &str) -> Option<(&str, &str)> {
    let b = s.as_bytes();
    let (mut depth, mut quoted, mut i) = (0i32, false, 0);
    while i < b.len() {
        match b[i] {
            b'\\' if quoted => i += 1,
            b'"' => quoted = !quoted,
            b'(' | b'[' | b'{' if !quoted => depth += 1,
            b']' | b'}' if !quoted => depth -= 1,
            b')' if !quoted && depth == 0 => {
                let rest = s[i + 1..].trim_start();
                return Some((&s[..i], rest.strip_prefix('=').unwrap_or(rest)));
            }
            b')' if !quoted => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    None
}

fn split_args(s: &str) -> Vec<&str> {
    let b = s.as_bytes();
    let (mut depth, mut quoted, mut start, mut i) = (0i32, false, 0, 0);
    let mut out = Vec::new();
    while i < b.len() {
        match b[i] {
            b'\\' if quoted => i += 1,
            b'"' => quoted = !quoted,
            b'(' | b'[' | b'{' | b'<' if !quoted => depth += 1,
            b')' | b']' | b'}' | b'>' if !quoted => depth -= 1,
            b',' if !quoted && depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    if !s[start..].trim().is_empty() {
        out.push(s[start..].trim());
    }
    out
}

fn parse_arg(a: &str) -> Arg {
    if a.starts_with('"') {
        let end = a.rfind('"').filter(|&e| e > 0).unwrap_or(a.len());
        return Arg::Str(unescape(&a[1..end]));
    }
    if let Some((fd, rest)) = a.split_once('<') {
        if fd == "AT_FDCWD" || fd.parse::<i64>().is_ok() {
            let path = rest.split_once('>').map_or(rest, |x| x.0);
            return Arg::Fd(fd.parse().ok(), path_text(path));
        }
    }
    Arg::Other(a.to_string())
}

/// A `-y` path as text (`-x` prints some bytes of it escaped).
fn path_text(p: &str) -> String {
    String::from_utf8_lossy(&unescape(p)).into_owned()
}

/// strace's C-style escapes: `\xNN`, octal `\NNN`, `\n`, `\t`, `\r`, `\v`, `\f`, `\\`, `\"`.
pub fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 >= b.len() {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let c = b[i + 1];
        i += 2;
        match c {
            b'x' => {
                let hex = std::str::from_utf8(&b[i..(i + 2).min(b.len())]).unwrap_or("");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(0));
                i += 2;
            }
            b'0'..=b'7' => {
                let mut v = u32::from(c - b'0');
                let mut k = 0;
                while k < 2 && i < b.len() && (b'0'..=b'7').contains(&b[i]) {
                    v = v * 8 + u32::from(b[i] - b'0');
                    i += 1;
                    k += 1;
                }
                out.push(v as u8);
            }
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'v' => out.push(0x0b),
            b'f' => out.push(0x0c),
            other => out.push(other),
        }
    }
    out
}

/// A short name for a path below `roots`: the last root component and what follows
/// (`spool/segment-0000000000000002.spool`).
pub fn short(path: &str, roots: &[String]) -> String {
    for r in roots {
        if let Some(rest) = path.strip_prefix(r.as_str()) {
            let base = r.rsplit('/').next().unwrap_or(r);
            return format!("{base}{rest}");
        }
    }
    path.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_split_calls_and_reads_paths() {
        let text = "7 openat(5</t/spool>, \"segment-1\", O_WRONLY|O_CREAT|O_EXCL, 0600) = 8</t/spool/segment-1>\n\
                    9 fsync(3</t/state/#12>(deleted) <unfinished ...>\n\
                    7 write(8</t/spool/segment-1>, \"SV\\365\\x00\"..., 16224) = 16224\n\
                    9 <... fsync resumed>) = 0\n\
                    7 write(8</t/spool/segment-1>, \"a\", 1) = ?\n\
                    7 +++ killed by SIGKILL +++\n";
        let calls = parse(text);
        assert_eq!(calls.len(), 4);
        assert!(calls[0].creates());
        assert_eq!(calls[0].targets(), vec!["/t/spool/segment-1".to_string()]);
        assert_eq!(calls[1].str_arg(1).unwrap(), b"SV\xf5\x00");
        assert_eq!(calls[2].name, "fsync");
        assert_eq!(calls[2].fd_path(0), Some("/t/state/#12"));
        assert!(calls[3].cut());
        assert!(killed(text));
        let roots = vec!["/t/spool".to_string()];
        assert!(calls[0].touches(&roots) && !calls[2].touches(&roots));
    }
}
