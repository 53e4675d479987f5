//! Custody checkpoint frames the drain reaches (`sink.type` = `spool`, or an edge spool handed
//! to a fallback `spool` block): each is put into the target's checkpoint store once the
//! records before it are delivered.
//!
//! A frame is put only under the name its signed body claims, and only once its signature is
//! checked where it has to be: a frame stored in clear (a spool with `allow_unencrypted` and
//! no key) proves nothing about who wrote it, since any account that could write the spool's
//! directory could plant one; a sealed frame is bound to its spool, segment and offset by the
//! spool's key. So a frame in clear must verify under a trusted key (the configuration's own
//! `custody.checkpoints` key, or `svc spool drain --public-key`), and a sealed one is checked
//! when its key id is trusted here. A frame that is no readable checkpoint is quarantined (its
//! bytes kept) and the drain goes on. One whose signature or leaves do not check out under a
//! trusted key, and one in clear under a key id not trusted here, stop the drain, kept where
//! they are, naming why: a wrong key given to the drain must not move genuine checkpoints out
//! of the chain (atk51c finding 3), so the operator decides (`svc spool set-aside` for a
//! planted frame, the right `--public-key` otherwise). Nothing is put unchecked.

use super::dir::{fail, SpoolError};
use super::seal::Place;
use super::store::Spool;
use crate::message::protection::checkpoint::{self, Refused, TrustedKeys};
use crate::sink::checkpoint::{claimed, CheckpointStore};
use crate::text::peer::PeerText;

/// What became of a checkpoint frame the drain reached.
pub(super) enum Put {
    /// In the target's store (put now, or by a run a crash stopped).
    Stored,
    /// Not the checkpoint it claims to be (its header names another checkpoint than its
    /// signed body, or its signature, leaves or text do not check out): quarantined, never
    /// stored.
    Refused(String),
}

/// The target's checkpoint store, the keys frames are checked with, and what was put.
pub(super) struct CheckpointPut {
    store: Option<Box<dyn CheckpointStore>>,
    trusted: TrustedKeys,
    /// Frames put into the store (and drained past) by this drainer.
    pub(super) put: u64,
}

impl CheckpointPut {
    pub(super) fn new() -> CheckpointPut {
        CheckpointPut {
            store: None,
            trusted: TrustedKeys::default(),
            put: 0,
        }
    }

    pub(super) fn set_store(&mut self, store: Box<dyn CheckpointStore>) {
        self.store = Some(store);
    }

    pub(super) fn set_trusted(&mut self, trusted: TrustedKeys) {
        self.trusted = trusted;
    }

    /// Puts one checkpoint frame (`plain`, opened from a sealed frame when `sealed`) into the
    /// target's store. Idempotent for a step repeated after a crash: the same runner id and
    /// index already stored with the same bytes counts as stored; other bytes under that name
    /// stop the drain (kept where it is).
    pub(super) fn put(
        &self,
        spool: &Spool,
        place: Place,
        (plain, sealed): (&[u8], bool),
    ) -> Result<Put, SpoolError> {
        let at = format!("segment {} offset {}", place.segment, place.offset);
        let stuck = |why: String| fail(spool.path(), "drain stuck", why);
        let Some(store) = &self.store else {
            return Err(stuck(format!(
                "the frame at {at} is a custody checkpoint, and the target keeps no \
                 checkpoints: it is kept where it is"
            )));
        };
        let cp = super::codec::decode_checkpoint(plain)
            .map_err(|why| stuck(format!("the checkpoint frame at {at}: {why}")))?;
        let text = std::str::from_utf8(cp.bytes).unwrap_or_default();
        let name = format!(
            "checkpoint {} of runner {}",
            cp.index,
            PeerText::new(cp.runner_id)
        );
        // The name it is stored under is the one its signed body claims, or it is not stored.
        if claimed(text) != Some((cp.runner_id.into(), Some(cp.index))) {
            return Ok(Put::Refused(format!(
                "a custody checkpoint frame that is not the checkpoint its frame names (runner \
                 {}, index {}): never stored under that name",
                PeerText::new(cp.runner_id),
                cp.index
            )));
        }
        if let Err(refused) = self.check(text, sealed) {
            return match refused {
                Refused::UnknownKey(id) => Err(stuck(format!(
                    "{name} at {at} is stored in clear and signed by key id {}, which this \
                     drain does not trust: nothing in clear is put unchecked; give its public \
                     key (svc spool drain --public-key ID=FILE), or set the frame aside (svc \
                     spool set-aside); it is kept where it is",
                    PeerText::new(&id)
                ))),
                // Not a checkpoint at all: no key makes it one.
                Refused::Malformed(why) => Ok(Put::Refused(format!(
                    "a custody checkpoint frame ({name}) that is not a readable checkpoint \
                     ({why}); never stored"
                ))),
                // A wrong key given to the drain reads as a forgery too: the frame stays where
                // it is (atk51c finding 3: quarantined, genuine checkpoints were lost to the
                // target), and the operator decides.
                other => Err(stuck(format!(
                    "{name} at {at} does not verify under the key this drain trusts for its key \
                     id: {other}. If that key is right, the runner did not write this frame: \
                     set it aside (svc spool set-aside); else give the right key (svc spool \
                     drain --public-key ID=FILE). It is kept where it is"
                ))),
            };
        }
        // Only after the checkpoint before it, under the name and digest it links to: a chain
        // with a hole is never moved into the target (atk51b finding 2).
        match follows(store.as_ref(), cp.runner_id, cp.index, text) {
            Ok(Follows::Stored) => {
                let end = self.target_end(store.as_ref(), cp.runner_id, cp.index, text);
                return drained_again(spool, (&name, &at), cp, end);
            }
            Ok(Follows::Yes) => {}
            Ok(Follows::No(why)) => {
                log::error!(
                    "spool {}: {name} (at {at}) {why}; the drain stops here, the frame is kept",
                    spool.path().display()
                );
                return Err(stuck(format!(
                    "{name} at {at} {why}: not put (a chain with a hole is never moved into \
                     the target); the frame is kept and the drain moves no further (audit \
                     with svc verify-custody --public-key)"
                )));
            }
            Err(e) => {
                return Err(stuck(format!(
                    "{name} (at {at}): the target's checkpoints cannot be read ({e}); the \
                     drain retries this step"
                )))
            }
        }
        match put_new(store.as_ref(), spool, (&name, &at), (cp, text))? {
            Put::Stored => drained(spool, (&name, &at), cp),
            refused => Ok(refused),
        }
    }

    /// Checks a frame's checkpoint (see the module comment): a frame in clear always, a
    /// sealed one when keys are trusted here (a sealed frame under a key id not trusted here
    /// is taken on the spool key's word).
    fn check(&self, text: &str, sealed: bool) -> Result<(), Refused> {
        check(&self.trusted, text, sealed)
    }

    /// The target's chain past a checkpoint it holds already (`text`, index `index`): each
    /// next index the target holds that verifies under the drain's keys and links to the one
    /// before, at most [`MAX_END_WALK`]; the last one's (index, text), `None` when there is
    /// none past it or nothing can be verified (no keys). A spool restored from an older copy
    /// and drained again then records the target's end as its drained head, not the copy's
    /// (atk53a finding 4).
    fn target_end(
        &self,
        store: &dyn CheckpointStore,
        runner_id: &str,
        index: u64,
        text: &str,
    ) -> Option<(u64, String)> {
        let mut digest = checkpoint::verify(text, &self.trusted).ok()?.digest;
        let mut end = None;
        for next in index + 1..=index + MAX_END_WALK {
            let Some(t) = store.get(runner_id, next).ok().flatten() else {
                break;
            };
            let Ok(v) = checkpoint::verify(&t, &self.trusted) else {
                break;
            };
            if v.body.runner_id != runner_id || v.body.previous != digest {
                break;
            }
            digest = v.digest;
            end = Some((next, t));
        }
        end
    }
}

/// Checkpoints past one found stored already that the drain reads to find the target's end.
const MAX_END_WALK: u64 = 1024;

/// [`CheckpointPut::check`] with the given keys (also `svc spool set-aside`'s: which frames
/// the drain would put).
pub(super) fn check(trusted: &TrustedKeys, text: &str, sealed: bool) -> Result<(), Refused> {
    if sealed && trusted.0.is_empty() {
        return Ok(());
    }
    match checkpoint::verify(text, trusted) {
        Ok(_) => Ok(()),
        Err(Refused::UnknownKey(_)) if sealed => Ok(()),
        Err(refused) => Err(refused),
    }
}

/// Records a checkpoint the target now holds as its runner's drained head (`super::drained`),
/// before the drain position moves past its frame; the drain retries the step when it cannot
/// (the frame stays: a start that cannot read the target must find the spool's chain holding
/// the drained head or beginning right after it).
fn drained(
    spool: &Spool,
    (name, at): (&str, &str),
    cp: super::codec::CheckpointBody<'_>,
) -> Result<Put, SpoolError> {
    spool.record_drained(cp.runner_id, cp.bytes).map_err(|e| {
        fail(
            spool.path(),
            "drain stuck",
            format!(
                "{name} (at {at}) is in the target, but its drained head could not be \
                     recorded ({e}); the frame is kept and the drain retries this step"
            ),
        )
    })?;
    Ok(Put::Stored)
}

/// A checkpoint the target held already (a step repeated after a crash, or a spool restored
/// from an older copy and drained again): the drained head becomes the target's end past it
/// (`end`, when the target holds more of the chain), else it, unless the one recorded is a
/// later checkpoint of its runner: the drained head never moves back (atk53a finding 4: a
/// re-drained older copy left it behind the target and the head file, and a start that could
/// not read the target was refused as TRUNCATED).
fn drained_again(
    spool: &Spool,
    (name, at): (&str, &str),
    cp: super::codec::CheckpointBody<'_>,
    end: Option<(u64, String)>,
) -> Result<Put, SpoolError> {
    let index = end.as_ref().map_or(cp.index, |e| e.0);
    let later = spool
        .drained_head(cp.runner_id)
        .ok()
        .flatten()
        .and_then(|(_, text)| claimed(&text))
        .is_some_and(|(runner, i)| runner == cp.runner_id && i.is_some_and(|i| i > index));
    if later {
        return Ok(Put::Stored);
    }
    match &end {
        Some((_, text)) => {
            let body = super::codec::CheckpointBody {
                runner_id: cp.runner_id,
                index,
                bytes: text.as_bytes(),
            };
            drained(spool, (name, at), body)
        }
        None => drained(spool, (name, at), cp),
    }
}

/// Whether a checkpoint may be put into a store, by what the store holds.
pub(super) enum Follows {
    /// The same text is stored under its name already.
    Stored,
    /// It follows the store's checkpoint before it (or is index 0 of a runner with none).
    Yes,
    /// Why not: another checkpoint under its name, or it does not follow the one before it.
    No(String),
}

/// Whether checkpoint `index` of `runner` (its `text`) may be put into `store`: the same text
/// under its name counts as stored; another is refused; index 0 only while none of the
/// runner's checkpoints is stored; index N only when N-1 is stored and its body's digest is
/// N's `previous` (read by name: [`CheckpointStore::get`]). An error when the store cannot be
/// read.
pub(super) fn follows(
    store: &dyn CheckpointStore,
    runner: &str,
    index: u64,
    text: &str,
) -> Result<Follows, String> {
    match store.get(runner, index)? {
        Some(t) if t == text => return Ok(Follows::Stored),
        Some(_) => {
            return Ok(Follows::No(
                "differs from the checkpoint the target holds under that name".into(),
            ))
        }
        None => {}
    }
    let previous = link(text).map(|l| l.1).unwrap_or_default();
    if index == 0 {
        let own = store
            .chain(runner)?
            .into_iter()
            .any(|(_, t)| claimed(&t).is_some_and(|c| c.0 == runner));
        return Ok(if own {
            Follows::No(
                "does not follow the target's chain (it holds checkpoints of that runner \
                 already)"
                    .into(),
            )
        } else {
            Follows::Yes
        });
    }
    Ok(match store.get(runner, index - 1)? {
        Some(t) if link(&t).is_some_and(|l| l.0 == previous) => Follows::Yes,
        Some(_) => Follows::No(format!(
            "does not follow the target's checkpoint {} (its digest is not this one's \
             previous)",
            index - 1
        )),
        None => Follows::No(format!(
            "does not follow the target's chain: it holds no checkpoint {} of that runner",
            index - 1
        )),
    })
}

/// A stored checkpoint's chain digest and the `previous` its body names (read, not verified:
/// the link is checked here, the signature by [`check`]).
pub(super) fn link(text: &str) -> Option<(String, String)> {
    let outer: serde_json::Value = serde_json::from_str(text).ok()?;
    let signed = outer.get("signed")?.as_str()?;
    let body: serde_json::Value = serde_json::from_str(signed).ok()?;
    let previous = body.get("previous").and_then(|p| p.as_str()).unwrap_or("");
    Some((
        checkpoint::body_digest(signed.as_bytes()),
        previous.to_string(),
    ))
}

/// Puts a checkpoint the store holds nothing of under its name yet ([`follows`]); when the put
/// is refused (a put beside it, or by a run a crash stopped), the row under its name is read
/// back: the same text counts as stored, another stops the drain.
fn put_new(
    store: &dyn CheckpointStore,
    spool: &Spool,
    (name, at): (&str, &str),
    (cp, text): (super::codec::CheckpointBody<'_>, &str),
) -> Result<Put, SpoolError> {
    let stuck = |why: String| fail(spool.path(), "drain stuck", why);
    let Err(put_error) = store.put(cp.runner_id, cp.index, cp.bytes) else {
        return Ok(Put::Stored);
    };
    // Only the row of that name is read back (never the whole store: a shared table
    // may hold more than one statement can read).
    let stored = store.get(cp.runner_id, cp.index).map_err(|e| {
        stuck(format!(
            "{name} (at {at}) not put into the target ({put_error}), nor could the \
             checkpoint under its name be read ({e}); the drain retries this step"
        ))
    })?;
    if stored.as_deref() == Some(text) {
        return Ok(Put::Stored); // put by the run a crash stopped before its position moved
    }
    if stored.is_some() {
        log::error!(
            "spool {}: {name} (at {at}) differs from the one the target holds under its \
             name; the drain stops here, the frame is kept",
            spool.path().display()
        );
        return Err(stuck(format!(
            "{name} at {at} differs from the checkpoint the target holds under that name: \
             not overwritten; the frame is kept and the drain moves no further (audit with \
             svc verify-custody --public-key)"
        )));
    }
    Err(stuck(format!(
        "{name} (at {at}) not put into the target: {put_error}; the target holds no \
         identical copy (a checkpoint stored under that name with other bytes is never \
         overwritten); the frame is kept and the drain retries this step"
    )))
}
