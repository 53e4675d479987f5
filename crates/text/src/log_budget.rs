//! A budget for log lines a peer can cause at its own pace (a broker's `-ERR` lines, a sink
//! failing every batch of a redelivery loop): a few lines per window, the rest counted and
//! their number said in the next line logged.

use std::time::{Duration, Instant};

/// Lines of one kind logged per [`LogBudget::WINDOW`]; the rest are counted and the number is
/// said in the next line logged.
#[derive(Default)]
pub struct LogBudget {
    window_start: Option<Instant>,
    used: u32,
    suppressed: u64,
}

impl LogBudget {
    pub const WINDOW: Duration = Duration::from_secs(10);
    pub const LINES: u32 = 5;

    /// `Some(lines suppressed since the last one logged)` when a line may be logged now.
    pub fn admit(&mut self, now: Instant) -> Option<u64> {
        if self
            .window_start
            .is_none_or(|start| now.duration_since(start) >= Self::WINDOW)
        {
            self.window_start = Some(now);
            self.used = 0;
        }
        if self.used >= Self::LINES {
            self.suppressed += 1;
            return None;
        }
        self.used += 1;
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_logged_five_lines_a_window_and_counted() {
        let mut b = LogBudget::default();
        let t0 = Instant::now();
        let logged: Vec<Option<u64>> = (0..1000).map(|_| b.admit(t0)).collect();
        assert_eq!(logged.iter().filter(|l| l.is_some()).count(), 5);
        assert_eq!(b.admit(t0 + LogBudget::WINDOW), Some(995));
        assert_eq!(b.admit(t0 + LogBudget::WINDOW), Some(0));
    }
}
