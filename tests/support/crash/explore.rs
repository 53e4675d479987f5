//! The kill explorer: a dry run under strace counts the durable calls on a workload's files;
//! then, for each crash point, a fresh copy of the workload runs under
//! `strace -e inject=<call>:signal=SIGKILL:when=<n>`, and the workload recovers and checks its
//! invariants.
//!
//! strace counts `when=` per call name and per thread, among the calls the trace filter lets
//! through ([`DURABLE`]). So a crash point is a (call, n) pair: for every durable call of the
//! dry run on a path below the workload's roots, the n it has among the calls of its name in
//! its thread. Log writes and the like are counted (strace counts them) but never chosen.
//! Threads interleave differently from run to run, so the call a kill really lands on is read
//! back from that run's own trace, and that is what the report names.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::trace::{self, Call, DURABLE};

/// One crash point: kill at the `n`-th `syscall` of a thread.
#[derive(Debug, Clone)]
pub struct Point {
    pub syscall: String,
    pub n: u32,
    /// The dry run's call at this point (`write spool/segment-0000000000000001.spool`).
    pub label: String,
    /// The label with digit runs and random parts folded (`write spool/segment-#.spool`):
    /// the sample takes points from every class.
    pub class: String,
}

/// How a workload is started: `svc` arguments, environment, the directories whose files are
/// its durable state.
pub struct Setup {
    pub args: Vec<OsString>,
    pub env: Vec<(String, String)>,
    pub roots: Vec<PathBuf>,
}

impl Setup {
    pub fn roots(&self) -> Vec<String> {
        self.roots
            .iter()
            .map(|r| r.to_string_lossy().into_owned())
            .collect()
    }
}

/// A scripted run of one component that a kill may cut anywhere.
pub trait Workload {
    fn component(&self) -> String;
    /// Makes a fresh state in `dir` (empty, its own) and says how to start the run.
    fn prepare(&mut self, dir: &Path) -> Setup;
    /// The run did all its work (when no kill came): the explorer stops it with SIGTERM.
    fn complete(&self, dir: &Path) -> bool;
    /// After the run ended (killed or not): restart or drain until done, and return every
    /// invariant broken, each as `<invariant>: <details>`.
    fn check(&mut self, dir: &Path) -> Vec<String>;
    /// Points the fast tier runs at most (spread evenly over the sample). Defaults to 6.
    fn fast_points(&self) -> usize {
        6
    }
}

/// What one workload's exploration found.
pub struct Report {
    pub component: String,
    /// Crash points of the dry run.
    pub points: usize,
    /// Points run (all of them, or the sample).
    pub explored: usize,
    /// Runs the kill ended at a durable call on the component's files.
    pub killed: usize,
    /// `kill at <call>: <invariant>: <details>`.
    pub violations: Vec<String>,
    pub elapsed: Duration,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "crash explorer {}: {} crash points, {} explored, {} killed at a durable call on \
             its files, {} violations, {:.1} s",
            self.component,
            self.points,
            self.explored,
            self.killed,
            self.violations.len(),
            self.elapsed.as_secs_f64()
        )?;
        for v in &self.violations {
            writeln!(f, "VIOLATION {}: {v}", self.component)?;
        }
        Ok(())
    }
}

/// Every point (`SVC_CRASH_FULL=1`, what scripts/crash-explore.sh sets) or the fast tier's
/// sample: from each class of points the first and the last.
pub fn full() -> bool {
    std::env::var("SVC_CRASH_FULL").is_ok_and(|v| v == "1")
}

/// Explores `w`: the dry run in `scratch/dry`, then each point in `scratch/<k>`.
pub fn explore(w: &mut dyn Workload, scratch: &Path) -> Report {
    let started = Instant::now();
    let dry = scratch.join("dry");
    std::fs::create_dir_all(&dry).unwrap();
    let setup = w.prepare(&dry);
    let text = run(&setup, &dry, None, w);
    let roots = setup.roots();
    let all = points(&trace::parse(&text), &roots);
    let mut violations: Vec<String> = w
        .check(&dry)
        .into_iter()
        .map(|v| format!("without a kill: {v}"))
        .collect();
    assert!(
        !all.is_empty(),
        "the dry run made no durable call below {roots:?}"
    );
    let chosen = if full() {
        all.clone()
    } else {
        sample(&all, w.fast_points())
    };
    let mut killed = 0;
    for (k, p) in chosen.iter().enumerate() {
        let dir = scratch.join(k.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        let setup = w.prepare(&dir);
        let text = run(&setup, &dir, Some(p), w);
        let hit = landed(&text, p, &setup.roots());
        if hit.as_ref().is_some_and(|h| h.1) {
            killed += 1;
        }
        let at = match &hit {
            Some((label, _)) => format!("kill at {label} ({} #{})", p.syscall, p.n),
            None => format!(
                "run not killed ({} #{} not reached; the dry run had {} there)",
                p.syscall, p.n, p.label
            ),
        };
        for v in w.check(&dir) {
            violations.push(format!("{at}: {v}"));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    Report {
        component: w.component(),
        points: all.len(),
        explored: chosen.len(),
        killed,
        violations,
        elapsed: started.elapsed(),
    }
}

/// One (call, n) per durable call of the trace below `roots`, in trace order, each pair once.
pub fn points(calls: &[Call], roots: &[String]) -> Vec<Point> {
    let mut count: std::collections::HashMap<(u32, String), u32> = Default::default();
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for c in calls {
        let n = count.entry((c.tid, c.name.clone())).or_insert(0);
        *n += 1;
        if !c.touches(roots) || !seen.insert((c.name.clone(), *n)) {
            continue;
        }
        let label = label(c, roots);
        out.push(Point {
            syscall: c.name.clone(),
            n: *n,
            class: fold(&label),
            label,
        });
    }
    out
}

/// `write spool/segment-0000000000000001.spool` (targets joined by ` -> `).
pub fn label(c: &Call, roots: &[String]) -> String {
    let targets: Vec<String> = c.targets().iter().map(|t| trace::short(t, roots)).collect();
    format!("{} {}", c.name, targets.join(" -> "))
}

/// Digit runs become `#`, hexadecimal runs of 8 or more too.
fn fold(label: &str) -> String {
    let mut out = String::new();
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if run.len() >= 8 || (!run.is_empty() && run.bytes().all(|b| b.is_ascii_digit())) {
            out.push('#');
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for ch in label.chars() {
        if ch.is_ascii_hexdigit() {
            run.push(ch);
        } else {
            flush(&mut run, &mut out);
            out.push(ch);
        }
    }
    flush(&mut run, &mut out);
    out
}

/// The fast tier's points: the first and the last of each class, at most `cap` of them. The
/// first call of each class comes before the lasts (a file's first write is where creation
/// windows lie: an empty `position` left by a kill at its first `pwrite64`); when even those
/// are more than `cap`, they are spread evenly.
pub fn sample(all: &[Point], cap: usize) -> Vec<Point> {
    let mut classes: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, p) in all.iter().enumerate() {
        match classes.iter_mut().find(|c| c.0 == p.class) {
            Some(c) => c.1.push(i),
            None => classes.push((p.class.clone(), vec![i])),
        }
    }
    let spread = |mut v: Vec<usize>| {
        if v.len() > cap && cap > 1 {
            let step = (v.len() - 1) as f64 / (cap - 1) as f64;
            v = (0..cap)
                .map(|k| v[(k as f64 * step).round() as usize])
                .collect();
        }
        v
    };
    let mut keep = spread(classes.iter().map(|(_, idx)| idx[0]).collect());
    let lasts: Vec<usize> = classes
        .iter()
        .map(|(_, idx)| idx[idx.len() - 1])
        .filter(|i| !keep.contains(i))
        .collect();
    let room = cap.saturating_sub(keep.len());
    if room > 0 {
        let step = lasts.len().div_ceil(room).max(1);
        keep.extend(lasts.iter().step_by(step).take(room));
    }
    keep.sort_unstable();
    keep.dedup();
    keep.into_iter().map(|i| all[i].clone()).collect()
}

/// The call the kill landed on, and whether it is a durable call below the roots.
fn landed(text: &str, p: &Point, roots: &[String]) -> Option<(String, bool)> {
    if !trace::killed(text) {
        return None;
    }
    let calls = trace::parse(text);
    let cut: Vec<&Call> = calls
        .iter()
        .filter(|c| c.cut() && c.name == p.syscall)
        .collect();
    if let Some(c) = cut.iter().find(|c| c.touches(roots)) {
        return Some((label(c, roots), true));
    }
    Some(match cut.first() {
        Some(c) => (
            format!("{} (not a file of the component)", label(c, roots)),
            false,
        ),
        None => ("an unknown call".into(), false),
    })
}

/// Runs the workload under strace (with the kill when `point` is given) until it exits, or
/// until the workload is complete (then SIGTERM), or 60 s (then SIGKILL). Returns the trace.
fn run(setup: &Setup, dir: &Path, point: Option<&Point>, w: &dyn Workload) -> String {
    let trace_file = dir.join("strace.txt");
    let mut cmd = strace(&trace_file, point);
    cmd.arg(env!("CARGO_BIN_EXE_svc")).args(&setup.args);
    cmd.envs(setup.env.iter().map(|(k, v)| (k, v)));
    let log = std::fs::File::create(dir.join("traced.log")).unwrap();
    let mut traced = Traced(
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("strace must be installed (scripts/deps.sh installs it)"),
    );
    let child = &mut traced.0;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        let late = Instant::now() >= deadline;
        if late || w.complete(dir) {
            stop(child, if late { "KILL" } else { "TERM" });
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::read_to_string(&trace_file).unwrap_or_default()
}

/// `strace -f -qq -y -o <file> -e trace=<durable calls>` and, for a point, its kill.
pub fn strace(trace_file: &Path, point: Option<&Point>) -> Command {
    let mut cmd = Command::new("strace");
    cmd.args(["-f", "-qq", "-y", "-o"])
        .arg(trace_file)
        .arg("-e")
        .arg(format!("trace={}", DURABLE.join(",")));
    if let Some(p) = point {
        cmd.arg("-e")
            .arg(format!("inject={}:signal=SIGKILL:when={}", p.syscall, p.n));
    }
    cmd
}

/// strace and the `svc` it runs, stopped with SIGKILL when dropped still running: a test
/// that panics leaves no runner behind (holding its tmpfs busy).
pub struct Traced(pub Child);

impl Drop for Traced {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            stop(&mut self.0, "KILL");
        }
    }
}

/// Signals the traced process (strace's child) and waits for strace to exit.
pub fn stop(child: &mut Child, sig: &str) {
    let pid = child.id();
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    for c in children.split_whitespace() {
        let _ = Command::new("kill").args([&format!("-{sig}"), c]).status();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
