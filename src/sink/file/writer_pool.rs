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

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, Sender};

/// One file's work, with the channel its result goes back on.
pub type Task = Box<dyn FnOnce() + Send + 'static>;

/// Files queued per writer thread: enough that a writer finishing a file always finds the
/// next one, few enough that a sink worker's enqueueing stays close to what is being written.
const QUEUED_PER_WRITER: usize = 4;

pub struct WriterPool {
    tasks: Option<Sender<Task>>,
    threads: Vec<JoinHandle<()>>,
}

impl WriterPool {
    /// Starts up to `threads` writers. `None` when not even one thread could be spawned
    /// (resource limits): the caller then writes on its own thread.
    pub fn start(threads: usize) -> Option<WriterPool> {
        let (tx, rx) = bounded::<Task>(threads * QUEUED_PER_WRITER);
        let mut handles = Vec::with_capacity(threads);
        for n in 0..threads {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("svc-file-{n}"))
                .spawn(move || {
                    for task in rx {
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
            tasks: Some(tx),
            threads: handles,
        })
    }

    /// Queues a task, waiting while the queue is full. Gives the task back when no writer is
    /// left to run it.
    pub fn run(&self, task: Task) -> Result<(), Task> {
        match &self.tasks {
            Some(tx) => tx.send(task).map_err(|e| e.into_inner()),
            None => Err(task),
        }
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
        self.tasks.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

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
