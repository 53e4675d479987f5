//! The per_event sink's file writers: `write_concurrency` named threads (`svc-file-0` ...) that
//! live as long as the sink and take one file at a time from one queue shared by every sink
//! worker.
//!
//! Why a pool that outlives batches: a new file's `fsync` waits for a journal commit, and
//! concurrent fsyncs share commits, so the file system's throughput grows with the number of
//! files in flight. Writers spawned per batch and given fixed shares of it (the design before
//! 2026-11-25) kept that number up only until the first writer of a batch ran out of files:
//! every batch then waited for its slowest share, one sink worker's next batch could not use
//! the idle writers, and each batch paid for spawning its threads (measured in
//! docs/sinks/file.md). Taking files one at a time from a shared queue keeps every writer
//! busy as long as any sink worker has a file waiting.
//!
//! A task that panics is caught here, so the writer survives it; the task's result channel is
//! dropped with it, which the sink reports as a transient failure of that file.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// One file's work, with the channel its result goes back on.
pub type Task = Box<dyn FnOnce() + Send + 'static>;

/// Files queued per writer thread: enough that a writer finishing a file always finds the
/// next one, few enough that a sink worker's enqueueing stays close to what is being written.
const QUEUED_PER_WRITER: usize = 4;

/// The queue between sink workers and writers: a mutex and two condition variables rather than
/// a crossbeam channel, because a writer finding it empty should sleep at once. crossbeam's
/// receivers spin and then `sched_yield` before they sleep; sixteen writers doing that on two
/// cores compete with the pipeline and with a broker on the same host whenever deliveries
/// slow down. Measured with `cargo bench --bench file_capacity` in runs where deliveries were
/// slow: the writers spent 3.9-8.4 CPU seconds per 20,000 files with the channel, 1.5-1.6 s
/// with this queue (1.3-1.6 s in runs that were not slowed).
struct Queue {
    state: Mutex<State>,
    /// A task was queued, or the queue closed.
    work: Condvar,
    /// A task was taken: there is room again.
    room: Condvar,
    capacity: usize,
}

struct State {
    tasks: VecDeque<Task>,
    closed: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Tasks run outside the lock, so no panic can poison it; recover regardless.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next task, waiting for one; `None` once the queue is closed and empty.
    fn take(&self) -> Option<Task> {
        let mut state = self.lock();
        loop {
            if let Some(task) = state.tasks.pop_front() {
                drop(state);
                self.room.notify_one();
                return Some(task);
            }
            if state.closed {
                return None;
            }
            state = self.work.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }
}

pub struct WriterPool {
    queue: Arc<Queue>,
    threads: Vec<JoinHandle<()>>,
}

impl WriterPool {
    /// Starts up to `threads` writers. `None` when not even one thread could be spawned
    /// (resource limits): the caller then writes on its own thread.
    pub fn start(threads: usize) -> Option<WriterPool> {
        let queue = Arc::new(Queue {
            state: Mutex::new(State {
                tasks: VecDeque::new(),
                closed: false,
            }),
            work: Condvar::new(),
            room: Condvar::new(),
            capacity: threads * QUEUED_PER_WRITER,
        });
        let mut handles = Vec::with_capacity(threads);
        for n in 0..threads {
            let queue = Arc::clone(&queue);
            let spawned = std::thread::Builder::new()
                .name(format!("svc-file-{n}"))
                .spawn(move || {
                    while let Some(task) = queue.take() {
                        // A panic must not take the writer with it; see the module comment.
                        let _ = catch_unwind(AssertUnwindSafe(task));
                    }
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    log::warn!("file sink: started {n} of {threads} file writer threads: {e}");
                    break;
                }
            }
        }
        if handles.is_empty() {
            return None;
        }
        Some(WriterPool {
            queue,
            threads: handles,
        })
    }

    /// Queues a task, waiting while the queue is full. Gives the task back when the pool is
    /// closing.
    pub fn run(&self, task: Task) -> Result<(), Task> {
        let mut state = self.queue.lock();
        while state.tasks.len() >= self.queue.capacity && !state.closed {
            state = self
                .queue
                .room
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
        if state.closed {
            return Err(task);
        }
        state.tasks.push_back(task);
        drop(state);
        self.queue.work.notify_one();
        Ok(())
    }

    /// The writers still running, with their names (tests).
    #[cfg(test)]
    pub fn live_threads(&self) -> Vec<(std::thread::ThreadId, String)> {
        self.threads
            .iter()
            .filter(|h| !h.is_finished())
            .map(|h| {
                let t = h.thread();
                (t.id(), t.name().unwrap_or_default().to_string())
            })
            .collect()
    }
}

impl Drop for WriterPool {
    /// Closes the queue and waits for the writers to finish what was queued.
    fn drop(&mut self) {
        self.queue.lock().closed = true;
        self.queue.work.notify_all();
        self.queue.room.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::bounded;

    #[test]
    fn writers_outlive_tasks_and_panics() {
        let pool = WriterPool::start(3).unwrap();
        assert_eq!(pool.live_threads().len(), 3);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = bounded(100);
        for i in 0..100 {
            let seen = Arc::clone(&seen);
            let tx = tx.clone();
            pool.run(Box::new(move || {
                if i == 7 {
                    panic!("task 7 fails");
                }
                let name = std::thread::current().name().unwrap().to_string();
                seen.lock().unwrap().push(name);
                tx.send(i).unwrap();
            }))
            .unwrap_or_else(|_| panic!("queue closed"));
        }
        drop(tx);
        let mut done: Vec<i32> = rx.iter().collect();
        done.sort();
        assert_eq!(done.len(), 99, "all but the panicking task reported");
        assert!(!done.contains(&7));
        let names = seen.lock().unwrap();
        assert!(
            names.iter().all(|n| n.starts_with("svc-file-")),
            "{names:?}"
        );
        assert_eq!(
            pool.live_threads().len(),
            3,
            "the panic took no writer with it"
        );
    }
}
