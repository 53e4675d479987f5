//! The public-key audit of a sink's records against its custody checkpoints (pure: the
//! caller reads the store, bounded). Findings, worst first: refused checkpoints (unknown
//! key, forged, leaves altered, malformed), broken or forked chains, records missing from a
//! signed checkpoint (by sequence), altered records, records present in no checkpoint yet.
//!
//! Chains are joined per runner id: each runner's checkpoints must run 0, 1, 2, ... with each
//! `previous` the digest of the one before; a sequence is covered when any valid checkpoint of
//! any chain lists it as a leaf for the record's stream and stream incarnation (a sequence
//! alone names a message only within one incarnation of one stream). A chain that goes on
//! into another incarnation (the stream was created again) is noted, not failed.

use std::collections::{BTreeMap, BTreeSet};

use super::checkpoint::{verify, TrustedKeys, Verified};
use crate::text::peer::PeerText;

/// One stored record as the store reader found it.
#[derive(Debug, Clone)]
pub struct StoredRecord {
    /// Where it was read (a path, an object key, a row's sequence).
    pub place: String,
    /// What a checkpoint signs of it, or why that cannot be read.
    pub read: Result<RecordRead, String>,
}

/// A stored record as a checkpoint names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordRead {
    pub stream: String,
    /// The stream's incarnation; empty when the record has none.
    pub incarnation: String,
    pub sequence: u64,
    /// The runner id of its custody block.
    pub runner_id: String,
    /// Its public custody digest.
    pub digest: [u8; 32],
}

impl RecordRead {
    /// Reads `stream` (a string) and `stream_incarnation` (a string, or null or absent when
    /// not known) beside the custody digest's (sequence, runner id, digest).
    pub fn of(
        stored: &crate::document::canonical::Json<'_>,
        (sequence, runner_id, digest): (u64, String, [u8; 32]),
    ) -> Result<RecordRead, String> {
        use crate::document::canonical::Json;
        let stream = stored
            .get("stream")
            .and_then(Json::as_str)
            .ok_or("no stream (a string)")?;
        let incarnation = match stored.get("stream_incarnation") {
            None | Some(Json::Null) => "",
            Some(j) => j.as_str().ok_or("stream_incarnation is not a string")?,
        };
        Ok(RecordRead {
            stream: stream.to_string(),
            incarnation: incarnation.to_string(),
            sequence,
            runner_id,
            digest,
        })
    }
}

/// Which stream and incarnation a checkpoint or record is of, for a report line.
fn origin_text(stream: &str, incarnation: &str) -> String {
    match incarnation {
        "" => format!("stream {}, incarnation not known", shown(stream)),
        i => format!("stream {} incarnation {}", shown(stream), shown(i)),
    }
}

/// One finding line and whether it fails the audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub failed: bool,
    pub line: String,
}

/// What the audit found, with the counts the summary line gives.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub findings: Vec<Finding>,
    pub intact: usize,
    pub altered: Vec<u64>,
    pub missing: Vec<u64>,
    pub uncovered: Vec<u64>,
    pub checkpoints: usize,
    pub refused: usize,
    pub chain_problems: usize,
    pub gaps: usize,
}

impl Report {
    fn fail(&mut self, line: String) {
        self.findings.push(Finding { failed: true, line });
    }

    pub fn complete(&self) -> bool {
        !self.findings.iter().any(|f| f.failed)
    }

    pub fn summary(&self) -> String {
        format!(
            "{} checkpoints ({} refused, {} chain problems), {} records intact, {} altered, \
             {} missing, {} in no checkpoint yet, {} runner-caused gaps: {}",
            self.checkpoints,
            self.refused,
            self.chain_problems,
            self.intact,
            self.altered.len(),
            self.missing.len(),
            self.uncovered.len(),
            self.gaps,
            if self.complete() {
                "COMPLETE"
            } else {
                "NOT complete"
            }
        )
    }
}

fn shown(s: &str) -> PeerText<'_> {
    PeerText::new(s)
}

/// A sequence as a checkpoint names it: (stream, incarnation, sequence).
type Named = (String, String, u64);
/// Where it is signed: (digest, runner id, checkpoint index).
type Signed = ([u8; 32], String, u64);

/// Checks every checkpoint, then every chain, then every record.
pub fn audit(
    records: &[StoredRecord],
    checkpoints: &[(String, String)],
    trusted: &TrustedKeys,
) -> Report {
    audit_to_heads(records, checkpoints, trusted, &[])
}

/// A chain head an auditor holds outside the sink: (runner id, index, body digest), from the
/// runner's `custody checkpoint head` log lines or its head file.
pub type HeldHead = (String, u64, String);

/// [`audit`], and each chain must reach the held head of its runner: a chain that ends
/// before it is TRUNCATED, a runner with no chain at all MISSING, another checkpoint at that
/// index DIFFERS.
pub fn audit_to_heads(
    records: &[StoredRecord],
    checkpoints: &[(String, String)],
    trusted: &TrustedKeys,
    heads: &[HeldHead],
) -> Report {
    let mut r = Report {
        checkpoints: checkpoints.len(),
        ..Report::default()
    };
    let mut chains: BTreeMap<String, Vec<(String, Verified)>> = BTreeMap::new();
    for (name, text) in checkpoints {
        match verify(text, trusted) {
            Ok(v) => chains
                .entry(v.body.runner_id.clone())
                .or_default()
                .push((name.clone(), v)),
            Err(e) => {
                r.refused += 1;
                r.fail(format!("checkpoint {}: refused: {e}", shown(name)));
            }
        }
    }
    let mut covered: BTreeMap<Named, Signed> = BTreeMap::new();
    // A message refused on several deliveries may be listed more than once: one gap.
    let mut gapped: BTreeSet<Named> = BTreeSet::new();
    for (runner, chain) in &mut chains {
        chain.sort_by_key(|(_, v)| v.body.index);
        check_chain(&mut r, runner, chain);
        for (_, v) in chain.iter() {
            let b = &v.body;
            for (seq, _) in &b.gaps {
                gapped.insert((b.stream.clone(), b.stream_incarnation.clone(), *seq));
            }
            for (seq, d) in &v.leaves {
                covered
                    .entry((b.stream.clone(), b.stream_incarnation.clone(), *seq))
                    .or_insert((*d, runner.clone(), b.index));
            }
        }
    }
    r.gaps = gapped.len();
    for head in heads {
        check_held_head(&mut r, &chains, head);
    }
    let mut present = BTreeSet::new();
    for rec in records {
        match &rec.read {
            Err(e) => r.fail(format!("{}: unverifiable ({e})", shown(&rec.place))),
            Ok(read) => {
                let (seq, d) = (&read.sequence, &read.digest);
                let key = (read.stream.clone(), read.incarnation.clone(), *seq);
                let covered_here = covered.get(&key);
                present.insert(key);
                match covered_here {
                    Some((want, _, _)) if want == d => r.intact += 1,
                    Some((_, runner, index)) => {
                        r.altered.push(*seq);
                        r.fail(format!(
                            "sequence {seq} ({}): ALTERED (differs from checkpoint {index} of \
                             runner {})",
                            shown(&rec.place),
                            shown(runner)
                        ));
                    }
                    None => {
                        r.uncovered.push(*seq);
                        r.fail(format!(
                            "sequence {seq} ({}, {}): present, in no checkpoint yet",
                            shown(&rec.place),
                            origin_text(&read.stream, &read.incarnation)
                        ));
                    }
                }
            }
        }
    }
    for (key, (_, runner, index)) in &covered {
        if !present.contains(key) {
            let (stream, incarnation, seq) = key;
            r.missing.push(*seq);
            r.fail(format!(
                "sequence {seq}: MISSING (signed in checkpoint {index} of runner {} for {}, no \
                 record)",
                shown(runner),
                origin_text(stream, incarnation)
            ));
        }
    }
    r
}

/// Reports a chain that does not reach a held head.
fn check_held_head(
    r: &mut Report,
    chains: &BTreeMap<String, Vec<(String, Verified)>>,
    (runner, index, digest): &HeldHead,
) {
    let who = format!("chain of runner {}", shown(runner));
    let chain = chains.get(runner).map(Vec::as_slice).unwrap_or_default();
    let at = chain.iter().find(|(_, v)| v.body.index == *index);
    let problem = match (chain.last(), at) {
        (None, _) => format!(
            "MISSING: no valid checkpoint of this runner in the sink; the held head is \
             checkpoint {index} (the chain was removed, with its records?)"
        ),
        (Some(_), Some((_, v))) if v.digest == *digest => return,
        (Some(_), Some((name, _))) => format!(
            "DIFFERS: checkpoint {index} ({}) is not the held head {}",
            shown(name),
            shown(digest)
        ),
        (Some((_, last)), None) if last.body.index < *index => format!(
            "TRUNCATED: the chain ends at checkpoint {}, the held head is checkpoint {index} \
             (checkpoints and their records removed?)",
            last.body.index
        ),
        (Some(_), None) => format!("TRUNCATED: checkpoint {index}, the held head, is missing"),
    };
    r.chain_problems += 1;
    r.fail(format!("{who}: {problem}"));
}

/// Reports a chain that does not run 0, 1, 2, ... with each `previous` the digest before.
fn check_chain(r: &mut Report, runner: &str, chain: &[(String, Verified)]) {
    let mut expect_index = 0u64;
    let mut expect_prev = String::new();
    let mut last_digest: Option<&str> = None;
    let mut previous: Option<(u64, &super::checkpoint::Body)> = None;
    for (name, v) in chain {
        let b = &v.body;
        let problem = if Some(b.index) == expect_index.checked_sub(1) {
            Some(format!(
                "FORKED: a second checkpoint {} ({})",
                b.index,
                shown(name)
            ))
        } else if b.index != expect_index {
            Some(format!(
                "BROKEN: checkpoints {expect_index} to {} are missing (removed?) before {}",
                b.index - 1,
                shown(name)
            ))
        } else if b.previous != expect_prev {
            Some(format!(
                "BROKEN: checkpoint {} ({}) does not follow the checkpoint before it",
                b.index,
                shown(name)
            ))
        } else {
            None
        };
        if let Some(p) = problem {
            r.chain_problems += 1;
            r.fail(format!("chain of runner {}: {p}", shown(runner)));
        }
        if let Some((_, before)) = previous.filter(|(i, _)| b.index == i + 1) {
            let now = (b.stream.as_str(), b.stream_incarnation.as_str());
            if (before.stream.as_str(), before.stream_incarnation.as_str()) != now {
                r.findings.push(Finding {
                    failed: false,
                    line: format!(
                        "chain of runner {}: note: checkpoint {} ({}) is of {}, the one before \
                         it of {} (the stream was created again, or the runner bound another)",
                        shown(runner),
                        b.index,
                        shown(name),
                        origin_text(now.0, now.1),
                        origin_text(&before.stream, &before.stream_incarnation)
                    ),
                });
            }
        }
        previous = Some((b.index, b));
        if last_digest.is_none() || b.index >= expect_index {
            expect_index = b.index + 1;
            expect_prev = v.digest.clone();
        }
        last_digest = Some(&v.digest);
    }
}
