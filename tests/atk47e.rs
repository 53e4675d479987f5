//! Attack review atk47e of custody checkpoints with a fallback spool (issue 47): reproductions
//! with a real broker, runner and file sink. Each test states what it did and what it saw.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::custody_checkpoints::*;
use crate::support::protection::*;
use crate::support::*;
use serde_json::{json, Value};

/// A file sink with a fallback spool spooling at the first transient failure, with more
/// config blocks (`extra`); returns the case, its output and spool directories.
fn spooled_with(every_records: u64, extra: Value) -> (Case, PathBuf, PathBuf) {
    let mut blocks = json!({"spool": {"max_bytes": 64 << 20, "after_seconds": 0,
                                      "allow_unencrypted": true, "max_backoff_seconds": 1,
                                      "dir": "SPOOL"}});
    for (k, v) in extra.as_object().unwrap() {
        blocks[k] = v.clone();
    }
    let c = case_with(
        every_records,
        |dir| {
            std::fs::create_dir(dir.join("out")).unwrap();
            json!({"type": "file", "directory": dir.join("out")})
        },
        blocks,
    );
    let spool = c.dir.path().join("spool");
    let text = std::fs::read_to_string(&c.cfg).unwrap();
    std::fs::write(&c.cfg, text.replace("\"SPOOL\"", &json!(spool).to_string())).unwrap();
    let out = c.dir.path().join("out");
    (c, out, spool)
}

/// The records' directory of the file sink replaced by a file: record writes fail
/// (transient), the checkpoint store (`out/.svc-checkpoints`) still takes checkpoints.
pub(crate) fn block_records(out: &Path) -> PathBuf {
    let away = out.with_file_name("idempotency-key.away");
    std::fs::rename(out.join("idempotency-key"), &away).unwrap();
    std::fs::write(out.join("idempotency-key"), b"in the way").unwrap();
    away
}

pub(crate) fn unblock_records(out: &Path, away: &Path) {
    std::fs::remove_file(out.join("idempotency-key")).unwrap();
    std::fs::rename(away, out.join("idempotency-key")).unwrap();
}

/// Finding 1 (fixed). A gap (here `refused_before_sink`: a publisher's oversize message)
/// signed while earlier records wait in the spool raised the chain's covered range past them:
/// the next runner's restart rescan signs only sequences after it, so the records `svc spool
/// drain` delivered (3 to 6) were never signed by any runner ("4 in no checkpoint yet" for
/// good). The bound now counts leaves only.
#[test]
fn spooled_records_below_a_signed_gap_are_signed_by_the_next_runner() {
    let (c, out, _spool) = spooled_with(
        1000,
        json!({"size_policy": {"enabled": true, "max_payload_bytes": 20}}),
    );
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 2);
    wait_acked(&c.server, 2);
    let away = block_records(&out);
    publish_range(&c.server, 3, 6);
    wait_acked(&c.server, 6);
    assert!(runner.log_text().contains("committed to the spool"));
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(100));
    c.server
        .publish_with_headers("orders.big", &[], big.as_bytes());
    wait_until(Duration::from_secs(30), "7 refused before the sink", || {
        runner
            .log_text()
            .contains("stream sequence 7 failed permanently")
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    // The stop's checkpoint: leaves 1 and 2, the gap 7 (3 to 6 still spooled).
    assert_eq!(gaps_in(&out), vec![json!([7, "refused_before_sink"])]);

    unblock_records(&out, &away);
    let (code, stdout, err) = svc_env(&["spool", "drain", c.cfg.to_str().unwrap()], None);
    assert_eq!(code, 0, "{stdout}{err}");
    assert_eq!(records_in(&out), 6);
    // The next runner: its rescan should sign 3 to 6.
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc2.log"));
    wait_until(Duration::from_secs(30), "7 refused again", || {
        runner
            .log_text()
            .contains("stream sequence 7 failed permanently")
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let (code, text) = verify(&c, &[c.public.to_str().unwrap()]);
    assert!(!text.contains("MISSING"), "{text}");
    assert_eq!(code, 0, "records 3 to 6 never signed: {text}");
    assert!(
        text.contains("6 records intact, 0 altered, 0 missing, 0 in no checkpoint yet"),
        "{text}"
    );
}

/// The gaps every checkpoint file of `out` lists.
fn gaps_in(out: &Path) -> Vec<Value> {
    checkpoint_files(out)
        .iter()
        .flat_map(|f| {
            let cp: Value = serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap();
            let body: Value = serde_json::from_str(cp["signed"].as_str().unwrap()).unwrap();
            body["gaps"].as_array().unwrap().clone()
        })
        .collect()
}

/// Finding 2. The sink worker tells the checkpoint thread `dead_lettered` as soon as the sink
/// refused a message for good with a DLQ on (src/pipeline/sink_worker.rs tell_checkpoint),
/// before `svc-ack` has published the dead letter. When that publish fails (here the DLQ
/// stream is gone) the message is NAKed and not dead-lettered, yet the signed checkpoint says
/// the runner dead-lettered sequence 2, and the audit is COMPLETE: an auditor is told to look
/// for it in the DLQ, which holds nothing.
#[test]
fn a_message_whose_dead_letter_failed_is_not_signed_as_dead_lettered() {
    let c = case_with(
        1000,
        |dir| {
            std::fs::create_dir(dir.join("out")).unwrap();
            json!({"type": "file", "directory": dir.join("out"), "max_record_bytes": 2048})
        },
        json!({"dead_letter": {"enabled": true, "subject": DLQ_SUBJECT,
                               "expected_stream": "DLQ", "publish_timeout_ms": 1000}}),
    );
    c.server.create_stream("DLQ", &[DLQ_SUBJECT]);
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    wait_acked(&c.server, 1);
    c.server.js().delete_stream("DLQ").unwrap();
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(4000));
    c.server
        .publish_with_headers("orders.big", &[], big.as_bytes());
    wait_until(Duration::from_secs(60), "the dead letter failed", || {
        runner
            .log_text()
            .contains("stream sequence 2: permanent pre-sink failure")
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let log = runner.log_text();
    assert!(!log.contains("dead-lettered as"), "{log}");
    let out = c.dir.path().join("out");
    assert_eq!(records_in(&out), 1);
    let gaps = gaps_in(&out);
    assert!(
        !gaps.contains(&json!([2, "dead_lettered"])),
        "signed as dead-lettered, never dead-lettered: {gaps:?}"
    );
}

/// Finding 5 (fixed). A drain step the sink took in part (some records `Durable`, one `Transient`) is
/// refused whole: the position does not move and nothing is told to the checkpoint thread
/// (src/sink/spool/drain.rs, `step` returns before `tell_checkpoints`). The next step finds
/// the records already stored (`AlreadyDurable`), which the drain never tells ("told when
/// first written": they never were). So spooled records 2 and 4 are in the sink, signed by
/// no checkpoint of the running runner, and not by the next one either (its rescan signs only
/// sequences after 5, which the stop's checkpoint covered): the audit never completes.
#[test]
fn records_stored_by_a_drain_step_that_failed_in_part_are_signed() {
    let (c, out, _spool) = spooled_with(1000, json!({}));
    let text = std::fs::read_to_string(&c.cfg).unwrap();
    let mut cfg: Value = serde_json::from_str(&text).unwrap();
    cfg["sink"]["per_subject_directories"] = json!(true);
    std::fs::write(&c.cfg, cfg.to_string()).unwrap();
    let publish = |seq: u64, family: &str| {
        c.server.publish_with_headers(
            &format!("orders.{family}"),
            &[],
            format!("{{\"n\":{seq}}}").as_bytes(),
        )
    };
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish(1, "a");
    wait_acked(&c.server, 1);
    let away = c.dir.path().join("out.away");
    std::fs::rename(&out, &away).unwrap();
    for (seq, family) in [(2, "a"), (3, "b"), (4, "a"), (5, "b")] {
        publish(seq, family);
    }
    wait_acked(&c.server, 5);
    assert!(runner.log_text().contains("committed to the spool"));
    // Records of orders.b fail (a file in the way of their directory), orders.a's are stored.
    std::fs::write(away.join("orders.b"), b"in the way").unwrap();
    std::fs::rename(&away, &out).unwrap();
    wait_until(Duration::from_secs(30), "2 and 4 stored", || {
        records_in(&out) == 3
    });
    wait_until(Duration::from_secs(30), "the step refused", || {
        runner.log_text().contains("drain probe")
    });
    std::fs::remove_file(out.join("orders.b")).unwrap();
    wait_until(Duration::from_secs(30), "the spool drained", || {
        records_in(&out) == 5
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let public = c.public.to_str().unwrap();
    let (_, first) = verify(&c, &[public]);
    // The next runner: a restart rescan does not sign them either.
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc2.log"));
    publish(6, "a");
    wait_acked(&c.server, 6);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let (code, text) = verify(&c, &[public]);
    assert!(!text.contains("MISSING"), "{text}");
    assert_eq!(
        code, 0,
        "after the first runner:\n{first}\nafter the second:\n{text}"
    );
}

/// Finding 6 (brief item 2; the kill -9 part fixed: the rescan takes leaves only as covered). A message refused before the sink without a DLQ is listed as a
/// `refused_before_sink` gap on its first refusal, though it is only NAKed, not given up. The
/// operator raises the limit and restarts: the redelivery is stored (a leaf), and the audit
/// says COMPLETE with "1 runner-caused gaps" for a message that is stored. A kill -9 after it
/// was stored and before its checkpoint: the restart rescan treats the gap's sequence as
/// covered and never signs the record, `in no checkpoint yet` for good.
#[test]
fn a_message_listed_as_a_gap_then_stored_is_signed_after_a_kill_9() {
    let delivery = json!({"batch_size": 16, "fetch_expiry_ms": 200, "max_in_flight_batches": 2,
                          "sink_workers": 1, "shutdown_timeout_seconds": 10,
                          "nak_backoff": {"mode": "fixed", "initial_ms": 100,
                                          "jitter": "none"}});
    let c = case_with(
        1000,
        |dir| {
            std::fs::create_dir(dir.join("out")).unwrap();
            json!({"type": "file", "directory": dir.join("out")})
        },
        json!({"size_policy": {"enabled": true, "max_payload_bytes": 20},
               "delivery": delivery}),
    );
    let out = c.dir.path().join("out");
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc.log"));
    publish_range(&c.server, 1, 1);
    wait_acked(&c.server, 1);
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(100));
    c.server
        .publish_with_headers("orders.big", &[], big.as_bytes());
    wait_until(Duration::from_secs(30), "2 refused", || {
        runner
            .log_text()
            .contains("stream sequence 2 failed permanently")
    });
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    assert_eq!(gaps_in(&out), vec![json!([2, "refused_before_sink"])]);

    // The operator raises the limit; the redelivery is stored, then kill -9.
    let text = std::fs::read_to_string(&c.cfg).unwrap();
    let mut cfg: Value = serde_json::from_str(&text).unwrap();
    cfg["size_policy"]["max_payload_bytes"] = json!(10_000);
    std::fs::write(&c.cfg, cfg.to_string()).unwrap();
    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc2.log"));
    wait_acked(&c.server, 2);
    assert_eq!(records_in(&out), 2);
    runner.sigkill();

    let mut runner = start_runner(&c.cfg, &c.dir.path().join("svc3.log"));
    publish_range(&c.server, 3, 3);
    wait_acked(&c.server, 3);
    runner.signal("TERM");
    assert!(runner.wait_timeout(Duration::from_secs(30)).is_some());
    let (code, text) = verify(&c, &[c.public.to_str().unwrap()]);
    assert!(!text.contains("MISSING"), "{text}");
    assert_eq!(code, 0, "the stored sequence 2 never signed: {text}");
}
