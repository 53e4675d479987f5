//! Live pipeline state for people who debug with thread dumps: what each named thread is
//! doing, channel depths, batches in flight, and the time since the last fetch, write and ACK.
//! Updated per batch (never per message); read by `svc-signal` on SIGUSR1 without pausing
//! delivery. See `docs/operations.md` for how to read the report.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

type Depth = Box<dyn Fn() -> (usize, Option<usize>) + Send + Sync>;

#[derive(Default)]
pub struct Monitor {
    threads: Mutex<BTreeMap<String, (Cow<'static, str>, Instant)>>,
    channels: Mutex<Vec<(&'static str, Depth)>>,
    batches: Mutex<BTreeMap<u64, (Instant, usize, u64)>>,
    origin: Option<Instant>,
    last_fetch_ms: AtomicU64,
    last_write_ms: AtomicU64,
    last_ack_ms: AtomicU64,
}

impl Monitor {
    pub fn new() -> Monitor {
        Monitor {
            origin: Some(Instant::now()),
            ..Default::default()
        }
    }

    /// Records what the calling (named) thread is doing now.
    pub fn activity(&self, what: &'static str) {
        self.set_activity(Cow::Borrowed(what));
    }

    pub fn activity_owned(&self, what: String) {
        self.set_activity(Cow::Owned(what));
    }

    fn set_activity(&self, what: Cow<'static, str>) {
        let current = std::thread::current();
        let name = current.name().unwrap_or("unnamed");
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        match threads.get_mut(name) {
            Some(slot) if slot.0 == what => {}
            Some(slot) => *slot = (what, Instant::now()),
            None => {
                threads.insert(name.to_string(), (what, Instant::now()));
            }
        }
    }

    /// Registers a channel whose depth the report shows (a receiver clone only reads `len`).
    pub fn watch<T: Send + 'static>(&self, name: &'static str, rx: &Receiver<T>) {
        let rx = rx.clone();
        self.watch_fn(name, move || (rx.len(), rx.capacity()));
    }

    /// Registers any (depth, capacity) reading, e.g. the credit pool.
    pub fn watch_fn(
        &self,
        name: &'static str,
        depth: impl Fn() -> (usize, Option<usize>) + Send + Sync + 'static,
    ) {
        self.channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name, Box::new(depth)));
    }

    pub fn batch_started(&self, id: u64, size: usize, max_delivery: u64) {
        self.batches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, (Instant::now(), size, max_delivery));
    }

    pub fn batch_settled(&self, id: u64) {
        self.batches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }

    fn now_ms(&self) -> u64 {
        self.ms_at(Instant::now())
    }

    fn ms_at(&self, at: Instant) -> u64 {
        self.origin
            .map(|o| at.saturating_duration_since(o).as_millis() as u64 + 1)
            .unwrap_or(1)
    }

    /// A delivery arrived at `at` (the fetcher reads the clock once per delivery and shares
    /// the reading).
    pub fn mark_fetch(&self, at: Instant) {
        self.last_fetch_ms.store(self.ms_at(at), Ordering::Relaxed);
    }
    pub fn mark_write(&self) {
        self.last_write_ms.store(self.now_ms(), Ordering::Relaxed);
    }
    pub fn mark_ack(&self) {
        self.last_ack_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    fn since(&self, mark: &AtomicU64) -> String {
        match mark.load(Ordering::Relaxed) {
            0 => "never".to_string(),
            t => format!(
                "{:.3}s ago",
                Duration::from_millis(self.now_ms().saturating_sub(t)).as_secs_f64()
            ),
        }
    }

    /// The multi-line report logged on SIGUSR1.
    pub fn report(&self) -> String {
        let mut out = String::from("pipeline dump\n");
        out.push_str("threads:\n");
        for (name, (what, since)) in self
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "  {name:<16} {what} (for {:.3}s)",
                since.elapsed().as_secs_f64()
            );
        }
        out.push_str("channels (depth/capacity):\n");
        for (name, depth) in self
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let (len, cap) = depth();
            let cap = cap
                .map(|c| c.to_string())
                .unwrap_or_else(|| "unbounded".into());
            let _ = writeln!(out, "  {name:<28} {len}/{cap}");
        }
        let batches = self.batches.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "batches in flight: {}", batches.len());
        for (id, (started, size, max_delivery)) in batches.iter() {
            let _ = writeln!(
                out,
                "  batch {id}: {size} messages, age {:.3}s, highest delivery count {max_delivery}",
                started.elapsed().as_secs_f64()
            );
        }
        let _ = write!(
            out,
            "last fetch {}, last sink write {}, last ack {}",
            self.since(&self.last_fetch_ms),
            self.since(&self.last_write_ms),
            self.since(&self.last_ack_ms)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_names_threads_channels_and_batches() {
        let m = std::sync::Arc::new(Monitor::new());
        let (tx, rx) = crossbeam_channel::bounded::<u8>(4);
        tx.send(1).unwrap();
        m.watch("a -> b", &rx);
        let m2 = m.clone();
        std::thread::Builder::new()
            .name("svc-test".into())
            .spawn(move || m2.activity("testing"))
            .unwrap()
            .join()
            .unwrap();
        m.batch_started(7, 10, 3);
        m.mark_ack();
        let r = m.report();
        assert!(r.contains("svc-test") && r.contains("testing"), "{r}");
        assert!(r.contains("a -> b") && r.contains("1/4"), "{r}");
        assert!(
            r.contains("batch 7: 10 messages") && r.contains("highest delivery count 3"),
            "{r}"
        );
        assert!(
            r.contains("last fetch never") && r.contains("last ack 0."),
            "{r}"
        );
        m.batch_settled(7);
        assert!(m.report().contains("batches in flight: 0"));
    }
}
