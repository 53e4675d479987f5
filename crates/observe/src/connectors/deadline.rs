//! The one deadline of an export run (`<block>.export_deadline_seconds`): it starts before the
//! snapshot is read and covers every network step after it (identity requests, each request
//! or datagram, every attempt and every wait between attempts). Without it one run could take
//! items x (1 + `max_retries`) x `timeout_seconds`, and a timer-driven export would overlap
//! the next.

use std::time::{Duration, Instant};

/// When an export run must be over, and the policy field that says so.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Deadline {
    end: Instant,
    seconds: f64,
    block: &'static str,
}

impl Deadline {
    /// Starts the clock now: the run ends `seconds` from here.
    pub fn start(block: &'static str, seconds: f64) -> Deadline {
        // Invariant: the policy bounds the value (greater than 0, at most an hour); the clamp
        // only keeps a hand-built value from panicking in `from_secs_f64`.
        let d = Duration::from_secs_f64(seconds.clamp(0.0, 86_400.0));
        Deadline {
            end: Instant::now() + d,
            seconds,
            block,
        }
    }

    /// The instant the run must be over.
    pub fn end(&self) -> Instant {
        self.end
    }

    /// Time left, zero once passed.
    pub fn left(&self) -> Duration {
        self.end.saturating_duration_since(Instant::now())
    }

    /// `timeout` cut to what is left; the error once nothing is left.
    pub fn cap(&self, timeout: Duration) -> Result<Duration, String> {
        let left = self.left();
        if left.is_zero() {
            Err(self.reached())
        } else {
            Ok(left.min(timeout))
        }
    }

    /// `export deadline of 3 s reached (otlp.export_deadline_seconds)`.
    pub fn reached(&self) -> String {
        format!(
            "export deadline of {} s reached ({}.export_deadline_seconds)",
            self.seconds, self.block
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_timeouts_and_names_the_field_once_passed() {
        let d = Deadline::start("otlp", 30.0);
        assert_eq!(d.cap(Duration::from_secs(5)), Ok(Duration::from_secs(5)));
        assert!(d.cap(Duration::from_secs(60)).unwrap() <= Duration::from_secs(30));
        let gone = Deadline::start("syslog", 0.0);
        assert_eq!(
            gone.cap(Duration::from_secs(1)),
            Err("export deadline of 0 s reached (syslog.export_deadline_seconds)".into())
        );
        assert_eq!(
            Deadline::start("cloud_c_monitoring", 2.5).reached(),
            "export deadline of 2.5 s reached (cloud_c_monitoring.export_deadline_seconds)"
        );
    }
}
