//! The per_event sink's file writers: `write_concurrency` named threads (`svc-file-0` ...) that
//! live as long as the sink and take one file at a time from one queue shared by every sink
//! worker.
//!
//! Why a pool that outlives batches: a new file's `fsync` waits for a journal commit, and
//! concurrent fsyncs share commits, so the file system's throughput grows with the number of
//! files in flight. Writers spawned per batch and given fixed shares of it (an earlier design)
//! kept that number up only until the first writer of a batch ran out of files:
//! every batch then waited for its slowest share, one sink worker's next batch could not use
//! the idle writers, and each batch paid for spawning its threads (measured in
//! docs/sinks/file.md). Taking files one at a time from a shared queue keeps every writer
//! busy as long as any sink worker has a file waiting.
//!
//! A sink worker hands over a whole batch at once and is woken once, when the batch's last
//! file is done ([`Results`]), not once per file: on a two-core host every wake-up is a
//! context switch taken from the writers, and per file they added up (measured in
//! docs/sinks/file.md).
//!
//! A task may leave a [`Finish`] behind: work on the same file that should wait a little (the
//! second fsync of a newly named file; durable_file.rs says why). The writer runs it after
//! [`FINISH_AFTER`] more tasks of its own, or at once when the queue is empty: a writer never
//! waits for work with a file unfinished, since a batch waits for each of its files.
//!
//! A task or finish that panics is caught here, so the writer survives it; its [`Slot`] is
//! dropped unfilled, which the sink reports as a transient failure of that file.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// One file's work, with the slot its result goes to; it may leave a [`Finish`] behind.
pub type Task = Box<dyn FnOnce() -> Option<Finish> + Send + 'static>;

/// What a task left to be done on its writer a few tasks later (see the module comment).
pub type Finish = Box<dyn FnOnce()>;

/// A writer runs a finish after this many more tasks of its own. Each waiting finish holds
/// one open file, so a writer holds at most this many plus the one it is writing. Why a few
/// tasks and not the rest of the batch: the runs of `benches/file_capacity.rs` in the commit
/// log that moved the second fsync.
pub const FINISH_AFTER: usize = 4;

/// The queue between sink workers and writers: a mutex and a condition variable rather than
/// a crossbeam channel, because a writer finding it empty should sleep at once. crossbeam's
/// receivers spin and then `sched_yield` before they sleep; sixteen writers doing that on two
/// cores compete with the pipeline and with a broker on the same host whenever deliveries
/// slow down. Measured with `cargo bench --bench file_capacity` in runs where deliveries were
/// slow: the writers spent 3.9-8.4 CPU seconds per 20,000 files with the channel, 1.5-1.6 s
/// with this queue (1.3-1.6 s in runs that were not slowed). It needs no bound: each sink
/// worker queues one batch and waits for it, so it never holds more than `sink_workers` x
/// `batch_size` tasks, whose records are in memory anyway.
struct Queue {
    state: Mutex<State>,
    /// A task was queued, or the queue closed.
    work: Condvar,
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

    /// The next task if one is queued, without waiting.
    fn try_take(&self) -> Option<Task> {
        self.lock().tasks.pop_front()
    }

    /// The next task, waiting for one; `None` once the queue is closed and empty.
    fn take(&self) -> Option<Task> {
        let mut state = self.lock();
        loop {
            if let Some(task) = state.tasks.pop_front() {
                return Some(task);
            }
            if state.closed {
                return None;
            }
            state = self.work.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// A writer's life: tasks from the queue, each one's finish [`FINISH_AFTER`] tasks later, and
/// every finish still waiting before the writer waits for work or ends.
fn work(queue: &Queue) {
    let mut finishes = Finishes::default();
    loop {
        let task = match queue.try_take() {
            Some(task) => task,
            None => {
                finishes.run_all();
                match queue.take() {
                    Some(task) => task,
                    None => break,
                }
            }
        };
        finishes.run_task(task);
    }
    finishes.run_all();
}

/// Runs `tasks` on the calling thread, by the writers' rules (when no writer could start).
pub fn run_here(tasks: Vec<Task>) {
    let mut finishes = Finishes::default();
    for task in tasks {
        finishes.run_task(task);
    }
    finishes.run_all();
}

/// The finishes one thread's tasks left, oldest first.
#[derive(Default)]
struct Finishes(VecDeque<Finish>);

impl Finishes {
    /// Runs `task`, keeps its finish, and runs the oldest one once more than
    /// [`FINISH_AFTER`] wait. A panic must not take the writer with it (module comment).
    fn run_task(&mut self, task: Task) {
        if let Ok(Some(finish)) = catch_unwind(AssertUnwindSafe(task)) {
            self.0.push_back(finish);
        }
        if self.0.len() > FINISH_AFTER {
            if let Some(finish) = self.0.pop_front() {
                let _ = catch_unwind(AssertUnwindSafe(finish));
            }
        }
    }

    fn run_all(&mut self) {
        while let Some(finish) = self.0.pop_front() {
            let _ = catch_unwind(AssertUnwindSafe(finish));
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
        });
        let mut handles = Vec::with_capacity(threads);
        for n in 0..threads {
            let queue = Arc::clone(&queue);
            let spawned = std::thread::Builder::new()
                .name(format!("svc-file-{n}"))
                .spawn(move || work(&queue));
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

    /// Queues the tasks, under one lock. Gives them back when the pool is closing.
    pub fn run_all(&self, tasks: Vec<Task>) -> Result<(), Vec<Task>> {
        let n = tasks.len();
        let mut state = self.queue.lock();
        if state.closed {
            return Err(tasks);
        }
        state.tasks.extend(tasks);
        drop(state);
        if n >= self.threads.len() {
            self.queue.work.notify_all();
        } else {
            for _ in 0..n {
                self.queue.work.notify_one();
            }
        }
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
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The results of one batch of tasks, by index. Whoever waits for them is woken once, when
/// the last one is in.
pub struct Results<T> {
    state: Mutex<Collected<T>>,
    all_in: Condvar,
}

struct Collected<T> {
    values: Vec<Option<T>>,
    outstanding: usize,
}

/// Where one task puts its result. Dropped unfilled (its task panicked, or never ran), it
/// still counts as in, with no value.
pub struct Slot<T> {
    results: Arc<Results<T>>,
    index: usize,
    value: Option<T>,
}

impl<T> Results<T> {
    /// Room for `n` results, one [`Slot`] each.
    pub fn new(n: usize) -> Arc<Results<T>> {
        Arc::new(Results {
            state: Mutex::new(Collected {
                values: (0..n).map(|_| None).collect(),
                outstanding: n,
            }),
            all_in: Condvar::new(),
        })
    }

    pub fn slot(self: &Arc<Self>, index: usize) -> Slot<T> {
        Slot {
            results: Arc::clone(self),
            index,
            value: None,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Collected<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until every slot is filled or dropped; `None` where a slot was dropped unfilled.
    pub fn wait(&self) -> Vec<Option<T>> {
        let mut state = self.lock();
        while state.outstanding > 0 {
            state = self.all_in.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        std::mem::take(&mut state.values)
    }
}

impl<T> Slot<T> {
    pub fn fill(mut self, value: T) {
        self.value = Some(value);
    }
}

impl<T> Drop for Slot<T> {
    fn drop(&mut self) {
        let mut state = self.results.lock();
        state.values[self.index] = self.value.take();
        state.outstanding -= 1;
        if state.outstanding == 0 {
            drop(state);
            self.results.all_in.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_outlive_tasks_and_panics() {
        let pool = WriterPool::start(3).unwrap();
        assert_eq!(pool.live_threads().len(), 3);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let results = Results::new(100);
        let tasks: Vec<Task> = (0..100)
            .map(|i| {
                let (seen, slot) = (Arc::clone(&seen), results.slot(i));
                Box::new(move || {
                    if i == 7 {
                        panic!("task 7 fails");
                    }
                    let name = std::thread::current().name().unwrap().to_string();
                    seen.lock().unwrap().push(name);
                    slot.fill(i);
                    None
                }) as Task
            })
            .collect();
        pool.run_all(tasks)
            .unwrap_or_else(|_| panic!("queue closed"));
        let done = results.wait();
        assert_eq!(done.len(), 100);
        for (i, r) in done.iter().enumerate() {
            assert_eq!(*r, (i != 7).then_some(i), "task {i}");
        }
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

    /// One writer, so the order is certain: each finish runs after `FINISH_AFTER` more tasks,
    /// the rest as soon as the queue is empty; the batch's results wait for the finishes.
    #[test]
    fn finishes_run_a_few_tasks_later_and_before_the_writer_waits() {
        let pool = WriterPool::start(1).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let results = Results::new(10);
        let tasks: Vec<Task> = (0..10)
            .map(|i| {
                let (log, slot) = (Arc::clone(&log), results.slot(i));
                Box::new(move || {
                    log.lock().unwrap().push(format!("t{i}"));
                    Some(Box::new(move || {
                        if i == 3 {
                            panic!("finish 3 fails");
                        }
                        log.lock().unwrap().push(format!("f{i}"));
                        slot.fill(i);
                    }) as Finish)
                }) as Task
            })
            .collect();
        pool.run_all(tasks)
            .unwrap_or_else(|_| panic!("queue closed"));
        let done = results.wait();
        let expected: Vec<Option<usize>> = (0..10).map(|i| (i != 3).then_some(i)).collect();
        assert_eq!(done, expected, "a panicking finish drops its slot only");
        let order = log.lock().unwrap().join(" ");
        assert_eq!(
            order, "t0 t1 t2 t3 t4 f0 t5 f1 t6 f2 t7 t8 f4 t9 f5 f6 f7 f8 f9",
            "FINISH_AFTER = {FINISH_AFTER}"
        );
        assert_eq!(
            pool.live_threads().len(),
            1,
            "the panic took no writer with it"
        );
    }

    #[test]
    fn run_here_runs_every_finish() {
        let ran = Arc::new(Mutex::new(0));
        let tasks: Vec<Task> = (0..3)
            .map(|_| {
                let ran = Arc::clone(&ran);
                Box::new(move || Some(Box::new(move || *ran.lock().unwrap() += 1) as Finish))
                    as Task
            })
            .collect();
        run_here(tasks);
        assert_eq!(*ran.lock().unwrap(), 3);
    }
}
