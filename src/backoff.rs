//! Retry delays: fixed, linear or exponential growth, a cap, and jitter.
//!
//! Shared by the NAK delays of the ACK thread and the in-sink retries of network sinks, so an
//! operator configures the same shape in both places.

use std::time::Duration;

use rand::Rng;

use crate::document::reader::ObjectReader;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Growth {
    Fixed,
    Linear,
    Exponential,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// Exactly the computed delay.
    None,
    /// Uniform in `[0, delay]`.
    Full,
    /// `delay/2` plus uniform in `[0, delay/2]`.
    Equal,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub growth: Growth,
    pub initial: Duration,
    pub multiplier: f64,
    pub max: Duration,
    pub jitter: Jitter,
}

impl Backoff {
    /// Delay before retry number `attempt` (1 = first retry), before jitter.
    fn base_delay(&self, attempt: u32) -> Duration {
        let attempt = attempt.max(1);
        let initial = self.initial.as_secs_f64();
        let secs = match self.growth {
            Growth::Fixed => initial,
            Growth::Linear => initial * attempt as f64,
            Growth::Exponential => {
                initial
                    * self
                        .multiplier
                        .powi(attempt.saturating_sub(1).min(1000) as i32)
            }
        };
        let capped = secs.min(self.max.as_secs_f64());
        Duration::from_secs_f64(if capped.is_finite() {
            capped.max(0.0)
        } else {
            self.max.as_secs_f64()
        })
    }

    /// Delay before retry number `attempt`, with jitter applied.
    pub fn delay(&self, attempt: u32) -> Duration {
        let base = self.base_delay(attempt);
        let mut rng = rand::thread_rng();
        match self.jitter {
            Jitter::None => base,
            Jitter::Full => base.mul_f64(rng.gen_range(0.0..=1.0)),
            Jitter::Equal => base / 2 + (base / 2).mul_f64(rng.gen_range(0.0..=1.0)),
        }
    }

    /// Reads the shape from fields named `<prefix>mode`, `<prefix>..`; used by the NAK block.
    /// Field names: `mode`, `initial_ms`, `multiplier`, `max_ms`, `jitter`.
    pub fn read(r: &mut ObjectReader<'_>, default: Backoff) -> Backoff {
        Backoff {
            growth: r.one_of("mode", default.growth, GROWTHS),
            initial: Duration::from_millis(r.int_in(
                "initial_ms",
                default.initial.as_millis() as i64,
                0,
                3_600_000,
            ) as u64),
            multiplier: r.number_in("multiplier", default.multiplier, 1.0, false, 10.0),
            max: Duration::from_millis(r.int_in(
                "max_ms",
                default.max.as_millis() as i64,
                0,
                3_600_000,
            ) as u64),
            jitter: r.one_of("jitter", default.jitter, JITTERS),
        }
    }

    /// A sink's in-call retry shape, from `retry_backoff_ms` (250), `retry_max_backoff_ms`
    /// (5000, at least the first), `retry_backoff_mode`, `retry_backoff_multiplier` and
    /// `retry_jitter` (`jitter` by default); `min_ms` is the least either delay may be.
    pub fn read_sink_retry(r: &mut ObjectReader<'_>, min_ms: i64, jitter: Jitter) -> Backoff {
        let initial_ms = r.int_in("retry_backoff_ms", 250, min_ms, 60_000);
        let max_ms = r.int_in("retry_max_backoff_ms", 5000, min_ms, 300_000);
        if max_ms < initial_ms {
            r.problem("retry_max_backoff_ms", "must be at least retry_backoff_ms");
        }
        Backoff {
            growth: r.one_of("retry_backoff_mode", Growth::Exponential, GROWTHS),
            initial: Duration::from_millis(initial_ms as u64),
            multiplier: r.number_in("retry_backoff_multiplier", 2.0, 1.0, false, 10.0),
            max: Duration::from_millis(max_ms as u64),
            jitter: r.one_of("retry_jitter", jitter, JITTERS),
        }
    }
}

pub const GROWTHS: &[(&str, Growth)] = &[
    ("fixed", Growth::Fixed),
    ("linear", Growth::Linear),
    ("exponential", Growth::Exponential),
];

pub const JITTERS: &[(&str, Jitter)] = &[
    ("none", Jitter::None),
    ("full", Jitter::Full),
    ("equal", Jitter::Equal),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn b(growth: Growth, jitter: Jitter) -> Backoff {
        Backoff {
            growth,
            initial: Duration::from_millis(100),
            multiplier: 3.0,
            max: Duration::from_millis(1000),
            jitter,
        }
    }

    #[test]
    fn growth_shapes_and_cap() {
        let ms = |g, a| b(g, Jitter::None).delay(a).as_millis();
        assert_eq!((ms(Growth::Fixed, 1), ms(Growth::Fixed, 5)), (100, 100));
        assert_eq!((ms(Growth::Linear, 1), ms(Growth::Linear, 3)), (100, 300));
        assert_eq!(
            (
                ms(Growth::Exponential, 1),
                ms(Growth::Exponential, 2),
                ms(Growth::Exponential, 3)
            ),
            (100, 300, 900)
        );
        assert_eq!(ms(Growth::Exponential, 4), 1000, "capped");
        assert_eq!(ms(Growth::Exponential, u32::MAX), 1000, "no overflow");
    }

    #[test]
    fn jitter_stays_in_range() {
        for _ in 0..1000 {
            let full = b(Growth::Fixed, Jitter::Full).delay(1).as_millis();
            assert!(full <= 100);
            let equal = b(Growth::Fixed, Jitter::Equal).delay(1).as_millis();
            assert!((50..=100).contains(&equal));
        }
    }
}
