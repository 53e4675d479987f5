//! What a replay shows while it runs: on a terminal one line redrawn every second (messages
//! and bytes settled, rate, sequence position, time left); elsewhere a plain line every
//! [`PLAIN_EVERY`]. Written to standard error; the summary goes to standard output.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often a plain progress line is written when standard error is not a terminal.
pub const PLAIN_EVERY: Duration = Duration::from_secs(10);

/// Counters the writer updates and the progress line reads.
#[derive(Default)]
pub struct Progress {
    pub messages: AtomicU64,
    pub bytes: AtomicU64,
    /// The last stream sequence settled.
    pub position: AtomicU64,
}

/// Draws the progress of one replay of sequences `first..=last`.
pub struct Display {
    /// `replay` or `redrive`: what a plain progress line starts with.
    pub command: &'static str,
    pub first: u64,
    pub last: u64,
    pub terminal: bool,
    started: Instant,
    last_shown: Option<Instant>,
    shown_len: usize,
}

impl Display {
    pub fn new(command: &'static str, first: u64, last: u64, terminal: bool) -> Display {
        Display {
            command,
            first,
            last,
            terminal,
            started: Instant::now(),
            last_shown: None,
            shown_len: 0,
        }
    }

    /// Draws the line when it is time (every call on a terminal, every [`PLAIN_EVERY`] else).
    pub fn tick(&mut self, p: &Progress) {
        let due = match self.last_shown {
            None => true,
            Some(t) => self.terminal || t.elapsed() >= PLAIN_EVERY,
        };
        if !due {
            return;
        }
        self.last_shown = Some(Instant::now());
        let line = self.line(p);
        let mut err = std::io::stderr().lock();
        if self.terminal {
            let pad = self.shown_len.saturating_sub(line.len());
            let _ = write!(err, "\r{line}{:pad$}", "");
            self.shown_len = line.len();
        } else {
            let _ = writeln!(err, "{}: {line}", self.command);
        }
        let _ = err.flush();
    }

    /// Ends the terminal line so the summary starts on its own.
    pub fn finish(&mut self, p: &Progress) {
        if self.terminal {
            self.last_shown = None;
            self.tick(p);
            eprintln!();
        }
    }

    /// `1200 msgs, 1.2 MB, 350 msg/s, seq 1250/5000 (25%), ~11s left`.
    pub fn line(&self, p: &Progress) -> String {
        let msgs = p.messages.load(Ordering::Relaxed);
        let bytes = p.bytes.load(Ordering::Relaxed);
        let pos = p
            .position
            .load(Ordering::Relaxed)
            .max(self.first.saturating_sub(1));
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let rate = msgs as f64 / secs;
        let span = self.last.saturating_sub(self.first) + 1;
        let done_seqs = pos.saturating_sub(self.first.saturating_sub(1)).min(span);
        let percent = done_seqs as f64 * 100.0 / span as f64;
        let left = match done_seqs {
            0 => "time left unknown".to_string(),
            d => {
                let rest = (span - d) as f64 * secs / d as f64;
                format!("~{}s left", rest.round() as u64)
            }
        };
        format!(
            "{msgs} msgs, {}, {rate:.0} msg/s, seq {pos}/{} ({percent:.0}%), {left}",
            human_bytes(bytes),
            self.last
        )
    }
}

/// `532 B`, `1.2 KB`, `3.4 MB`, `1.0 GB` (powers of 1000).
pub fn human_bytes(n: u64) -> String {
    let units = [(1e9, "GB"), (1e6, "MB"), (1e3, "KB")];
    for (size, unit) in units {
        if n as f64 >= size {
            return format!("{:.1} {unit}", n as f64 / size);
        }
    }
    format!("{n} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_messages_bytes_position_and_time_left() {
        let p = Progress::default();
        let d = Display::new("replay", 11, 20, false);
        assert!(d.line(&p).contains("seq 10/20 (0%), time left unknown"));
        p.messages.store(5, Ordering::Relaxed);
        p.bytes.store(2500, Ordering::Relaxed);
        p.position.store(15, Ordering::Relaxed);
        let line = d.line(&p);
        assert!(line.starts_with("5 msgs, 2.5 KB, "), "{line}");
        assert!(line.contains("seq 15/20 (50%), ~"), "{line}");
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_bytes(3_400_000), "3.4 MB");
    }
}

/// `--max-rate`: at most `rate` messages a second, as a ceiling at every moment, not an
/// average since the start (after a stall, a sink retrying or a slow broker, the read does not
/// catch up at full speed: that is the starvation the flag is there to prevent).
pub struct Pacer {
    interval: std::time::Duration,
    next: std::time::Instant,
}

impl Pacer {
    pub fn new(rate: u32) -> Pacer {
        Pacer {
            interval: std::time::Duration::from_secs_f64(1.0 / f64::from(rate.max(1))),
            next: std::time::Instant::now(),
        }
    }

    /// Called after each message: waits until an interval has passed since the later of the
    /// last message's turn and now.
    pub fn wait(&mut self) {
        let now = std::time::Instant::now();
        self.next = self.next.max(now) + self.interval;
        std::thread::sleep(self.next.saturating_duration_since(now));
    }
}

#[cfg(test)]
mod pacer_tests {
    use super::Pacer;
    use std::time::{Duration, Instant};

    /// After a pause the pace stays the ceiling: 5 messages at 50/s take 100 ms at least,
    /// however long the caller paused before.
    #[test]
    fn a_pause_earns_no_burst() {
        let mut p = Pacer::new(50);
        p.wait();
        std::thread::sleep(Duration::from_millis(300));
        let start = Instant::now();
        for _ in 0..5 {
            p.wait();
        }
        assert!(
            start.elapsed() >= Duration::from_millis(95),
            "{:?}",
            start.elapsed()
        );
    }
}
