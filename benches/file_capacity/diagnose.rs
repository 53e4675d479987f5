//! Diagnostics of `file_capacity`: what the broker costs without svc, and the scheduler
//! states of svc's threads during a run (a summed thread dump).

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::{records, support, Settings, FILES};

/// The broker's CPU per delivery without svc: the raw pull loop of `support::raw_fetch_ack`
/// (two outstanding requests of `batch_size`, flush after each), acknowledging each batch at
/// once or only after a pause, as a sink that takes that long per batch would, with and
/// without threads creating files, and with the consumer's info asked every 25 ms (what the
/// benches did before `support::AckWatch`). Each variant runs on a new consumer of the
/// per_event stream, alternating.
pub fn broker_alone(broker: &support::Broker, work: &Path, n: usize, s: &Settings) {
    println!(
        "broker alone: pull {} per request, ack each batch after a pause (no sink):",
        s.batch_size
    );
    let records = records(FILES, 1);
    let body = &records[0].1;
    for round in 1..=2 {
        let variants = [
            (0u64, false, false),
            (15, false, false),
            (15, true, false),
            (15, false, true),
        ];
        for (pause_ms, files, ask) in variants {
            let name = format!("raw-{round}-{pause_ms}-{files}-{ask}");
            support::create_consumer(
                &broker.url,
                FILES,
                &name,
                "files.>",
                Duration::from_secs(30),
            )
            .unwrap();
            let before = broker.cpu_seconds();
            let start = Instant::now();
            let stop = AtomicBool::new(false);
            let written = AtomicUsize::new(0);
            // Removed with the work directory at the end, not before: see the module comment.
            let dir = work.join(format!("load-{name}"));
            std::thread::scope(|scope| {
                if ask {
                    let (stop, name) = (&stop, &name);
                    let js = nats::jetstream::new(support::connect(&broker.url).unwrap());
                    scope.spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            let _ = js.consumer_info(FILES, name);
                            std::thread::sleep(Duration::from_millis(25));
                        }
                    });
                }
                if files {
                    fs::create_dir_all(&dir).unwrap();
                    for t in 0..s.write_concurrency {
                        let (stop, written, dir) = (&stop, &written, &dir);
                        scope.spawn(move || {
                            let mut i = 0;
                            while !stop.load(Ordering::Relaxed) {
                                let mut f = File::create(dir.join(format!("{t}-{i}"))).unwrap();
                                f.write_all(body).unwrap();
                                f.sync_all().unwrap();
                                written.fetch_add(1, Ordering::Relaxed);
                                i += 1;
                            }
                        });
                    }
                }
                // The helpers stop even if the pull loop panics (else the scope waits forever).
                let _stop_helpers = SetOnDrop(&stop);
                let pause = Duration::from_millis(pause_ms);
                support::raw_fetch_ack(
                    &broker.url,
                    FILES,
                    &name,
                    "files.>",
                    n,
                    s.batch_size,
                    pause,
                )
                .unwrap();
            });
            let secs = start.elapsed().as_secs_f64();
            let load = if files {
                format!(
                    "{} threads creating files ({:.0}/s)",
                    s.write_concurrency,
                    written.load(Ordering::Relaxed) as f64 / secs
                )
            } else {
                "no file load".to_string()
            };
            let asking = if ask {
                ", consumer info every 25 ms"
            } else {
                ""
            };
            println!(
                "  round {round}, pause {pause_ms:>2} ms per batch, {load}{asking}: {:>7.0} msg/s, broker {:.2} CPU-s",
                n as f64 / secs,
                broker.cpu_seconds() - before
            );
        }
    }
}

/// Sets its flag when dropped, on success and on panic alike.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Counts the scheduler state (R running, S sleeping, D in uninterruptible I/O wait) of the
/// threads of `pid`, by name: a thread dump, summed.
pub fn sample_states(pid: u32, into: &mut std::collections::BTreeMap<String, usize>) {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for t in tasks.flatten() {
        let Ok(stat) = fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].trim_end_matches(|c: char| c.is_ascii_digit());
        let state = stat[close + 2..].chars().next().unwrap_or('?');
        *into.entry(format!("{name}{state}")).or_default() += 1;
    }
}
