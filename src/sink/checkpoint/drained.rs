//! The start of a spool sink's runner while the target's checkpoint store cannot be read: the
//! spool's part of the chain is checked against the drained head (the last checkpoint the
//! drain put into the target, recorded in the spool directory by `sink::spool::drained`).
//!
//! The drain puts a checkpoint only where it continues the target's chain, and records it
//! before the position moves past its frame, so the target holds the chain up to the drained
//! head and the spool holds it from the drained head (a crash between the record and the
//! position's move) or from right after it. A spool's chain that begins later has a hole
//! the drain stopped at (a damaged frame quarantined, atk51b finding 2): refused, also with
//! the target out of reach. A spool holding none of the chain goes on from the drained head
//! when it is the head file's head (or the one right after it: a kill -9 between a frame's
//! append and the head file's write, drained since). The drained head is verified with the
//! runner's key: one that does not verify, or names another runner, is refused.

use super::head::Head;
use crate::message::protection::checkpoint::{self, TrustedKeys, Verified};
use crate::text::peer::PeerText;

/// The drained head read back: the file (its path, shown) and its text.
pub type Recorded = (String, String);

/// What a store says of its drained head ([`super::CheckpointStore::drained_head`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainedHead {
    /// None recorded (never drained, or drained by a version before the file).
    None,
    /// A file is there, which the store cannot vouch for (a spool that may keep frames in
    /// clear: atk52c finding 3); its path, shown. It still says a drain put checkpoints into
    /// the target (atk53a finding 3).
    Unvouched(String),
    /// A drained head the store vouches for.
    Vouched(Recorded),
}

/// Checks the spool's `chain` (a suffix, linked and verified) against the drained head
/// `recorded`; returns the drained head verified.
pub(super) fn check(
    chain: &[Verified],
    recorded: &Recorded,
    trusted: &TrustedKeys,
    runner_id: &str,
) -> Result<Verified, String> {
    let (file, text) = recorded;
    let shown = format!("the spool's drained head {file}");
    let v = checkpoint::verify(text, trusted).map_err(|e| {
        format!(
            "custody checkpoints: {shown} does not verify under this runner's key ({e}): the \
             drain writes only checkpoints the target holds, so this file was not written by \
             it; where the target's part of the chain ends cannot be checked while the target \
             cannot be read. Start again once the target can be read (the target then decides) \
             or audit with svc verify-custody --public-key FILE --head"
        )
    })?;
    if v.body.runner_id != runner_id {
        return Err(format!(
            "custody checkpoints: {shown} is a checkpoint of runner {}, not of this runner {}: \
             not written by the drain for this runner; start again once the target can be \
             read, or audit with svc verify-custody --public-key FILE --head",
            PeerText::new(&v.body.runner_id),
            PeerText::new(runner_id)
        ));
    }
    let Some(first) = chain.first() else {
        return Ok(v);
    };
    let (d, start) = (v.body.index, first.body.index);
    if start == d + 1 && first.body.previous == v.digest {
        return Ok(v); // the drain moved the position past the drained head's frame
    }
    let held = d
        .checked_sub(start)
        .and_then(|at| chain.get(at as usize))
        .is_some_and(|c| c.digest == v.digest);
    if held {
        return Ok(v); // put, the position not moved yet (a crash, or a drain step cut short)
    }
    let why = if start > d + 1 {
        format!(
            "begins at checkpoint {start}, but the drain put checkpoint {d} into the target \
             last ({shown}): checkpoint{} {} {} in neither (a damaged frame quarantined, the \
             drain stopped after it: a chain with a hole)",
            if start - d > 2 { "s" } else { "" },
            if start - d > 2 {
                format!("{} to {}", d + 1, start - 1)
            } else {
                (d + 1).to_string()
            },
            if start - d > 2 { "are" } else { "is" }
        )
    } else {
        format!(
            "(checkpoints {start} to {}) does not hold or follow checkpoint {d}, which the \
             drain put into the target last ({shown}): another chain",
            chain.last().map_or(start, |c| c.body.index)
        )
    };
    Err(format!(
        "custody checkpoints: the spool's chain of runner {} {why}; the target cannot be read \
         to check it: it is not continued. Audit with svc verify-custody --public-key FILE \
         --head once the target can be read",
        PeerText::new(runner_id)
    ))
}

/// The start while the target cannot be read and the spool records no drained head it can
/// vouch for: the spool's chain must begin at checkpoint 0, and an empty one beside a head
/// file is refused (where the chain ends cannot be checked).
pub(super) fn check_without(
    chain: &[Verified],
    unread: &str,
    stored: Option<&Head>,
) -> Result<(), String> {
    if let (true, Some(h)) = (chain.is_empty(), stored) {
        return Err(format!(
            "custody checkpoints: the spool holds no checkpoint of this runner \
                 (drained) and its target's checkpoint store cannot be read ({}), and it \
                 records no drained head it can vouch for (a spool drained by an older \
                 version, or one that may keep frames in clear): where the \
                 chain ends past the head file's head {} cannot be checked, and no \
                 checkpoint is signed under an index the drain may have put already; start \
                 again once the target can be read",
            PeerText::new(unread),
            PeerText::new(&h.arg())
        ));
    }
    // Nothing recorded as drained, yet the chain does not begin at 0: the checkpoints
    // before it are in neither place this start can read (a damaged frame
    // quarantined, a drained-head file removed: atk52c findings 1, 2, 4), or were
    // drained by a version before the file. Which cannot be told here: refused.
    if let Some(first) = chain.first().filter(|c| c.body.index > 0) {
        return Err(format!(
            "custody checkpoints: the spool's chain of this runner begins at checkpoint \
                 {}, and the spool records no drained head it can vouch for (none put \
                 into the target by a drain of this version, or the spool may keep frames \
                 in clear), while its target's checkpoint store \
                 cannot be read ({}): checkpoints 0 to {} are in neither place this start \
                 can read (a damaged frame quarantined, a drained-head file removed, or a \
                 drain by an older version); start again once the target can be read, or \
                 audit with svc verify-custody --public-key FILE --head",
            first.body.index,
            PeerText::new(unread),
            first.body.index - 1
        ));
    }
    Ok(())
}
