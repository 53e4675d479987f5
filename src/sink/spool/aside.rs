//! `svc spool set-aside`: the operator moves one record out of the drain's way, a record no
//! configuration should read (one put in the spool by someone who could write its directory:
//! sealed under a key id never configured, or stored in clear), which would otherwise stop
//! the drain, or the spool's opening, for good.
//!
//! Exactly the frame at the given segment and offset: its bytes are kept first in the
//! quarantine file of that place (written whole, fsynced, renamed in, the directory fsynced;
//! never deleted), then the frame is overwritten in place by a set-aside frame of the same
//! length (a valid frame whose body is [`FLAG_SET_ASIDE`] and zeros), fsynced. Every later
//! frame keeps its offset (sealed records are bound to theirs); every reader skips a set-aside
//! frame. A crash between the two steps leaves the record and its copy: running the command
//! again finds the copy with the same bytes and completes. A write torn by a power cut fails
//! the frame's checksum and is quarantined as damage; the record's bytes are kept already.
//! The spool's lock is held throughout: refused while a runner or a drain uses the spool.

use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;

use super::config::SpoolConfig;
use super::dir::{self, fail, SpoolError};
use super::frame::{self, Item};
use super::put::Follows;
use super::scan;
use super::seal::{is_checkpoint_frame, Crypt, Opened, Opener, Place};
use crate::message::protection::checkpoint::TrustedKeys;
use crate::sink::checkpoint::{claimed, CheckpointStore};
use crate::text::peer::PeerText;

/// First byte of the body of a set-aside frame (a plain body's flag byte is 0 or 1, a
/// sealed one's 0x80 or 0x81).
pub const FLAG_SET_ASIDE: u8 = 0xFE;

/// True for the body of a frame set aside (every reader skips it).
pub fn is_set_aside(body: &[u8]) -> bool {
    body.first() == Some(&FLAG_SET_ASIDE)
}

/// Sets aside the record at `offset` of segment `segment` of the spool of `cfg` (see the
/// module comment); returns the name of the quarantine file holding its bytes. A record the
/// configuration reads (an offset one line off) is refused: it would never be delivered.
pub fn set_aside(cfg: &SpoolConfig, segment: u64, offset: u64) -> Result<String, SpoolError> {
    set_aside_before(cfg, segment, offset, &DrainTarget::default())
}

/// What the configuration's drain does with a custody checkpoint frame: the target's
/// checkpoint store (`None`: its target keeps none) and the keys it checks frames with.
#[derive(Default)]
pub struct DrainTarget {
    pub store: Option<Box<dyn CheckpointStore>>,
    pub trusted: TrustedKeys,
}

/// [`set_aside`], also refusing a custody checkpoint frame `drain` would put into its target
/// (its target keeps checkpoints and holds no other checkpoint under its name: taking it out
/// would break the chain for good; atk51b finding 3). One the drain stops at (the target keeps
/// none, holds another checkpoint under that name, the frame does not follow its chain, or
/// its signature is not trusted) is taken.
pub fn set_aside_before(
    cfg: &SpoolConfig,
    segment: u64,
    offset: u64,
    drain: &DrainTarget,
) -> Result<String, SpoolError> {
    let path = cfg.dir.as_path();
    let dirfd = dir::open_dir(path, false)?;
    let _lock = dir::lock(&dirfd, path)?;
    let here = format!("segment {segment} offset {offset}");
    if let Some(p) = dir::read_position(&dirfd, path) {
        if (segment, offset) < (p.segment, p.offset) {
            return Err(fail(
                path,
                "set-aside",
                format!("{here} lies before the drain position (delivered already)"),
            ));
        }
    }
    let (file, bytes) = frame_at(&dirfd, path, segment, offset)?;
    let bytes = bytes.as_slice();
    let place = Place { segment, offset };
    let judged = read_as(cfg, &dirfd, place, &bytes[frame::FRAME_OVERHEAD..])?;
    let why = match &judged {
        Read::Record => Some(format!(
            "{here} holds a record this configuration reads (the drain delivers it): only a \
             record the drain or the opening stops at is set aside"
        )),
        Read::Checkpoint(plain, sealed) => drain_puts(drain, plain, *sealed).map(|why| {
            format!(
                "{here} holds a custody checkpoint frame {why}: taken out, it would break the \
                 chain for good; only a frame the drain stops at is set aside"
            )
        }),
        Read::Not => None,
    };
    if let Some(why) = why {
        return Err(fail(path, "set-aside", why));
    }
    let kept = take(&dirfd, path, (&file, place), bytes)?;
    // A checkpoint frame the drain stops at: the later frames that continue its chain can
    // never follow the target's chain now (atk52a finding 1): set aside with it.
    if let (Read::Checkpoint(plain, _), Some(_)) = (judged, drain.store.as_ref()) {
        let taken = take_chain_tail(cfg, &dirfd, place, &plain)?;
        if taken > 0 {
            log::warn!(
                "spool {}: {taken} later custody checkpoint frames continuing the chain of the \
                 one at {here} were set aside with it (each kept in its quarantine file)",
                path.display()
            );
        }
    }
    Ok(kept)
}

/// The intact frame starting at `offset` of segment `segment` (its file opened for writing,
/// its bytes with the frame's header); an error naming the place otherwise.
fn frame_at(
    dirfd: &OwnedFd,
    path: &std::path::Path,
    segment: u64,
    offset: u64,
) -> Result<(std::fs::File, Vec<u8>), SpoolError> {
    let here = format!("segment {segment} offset {offset}");
    let name = dir::segment_name(segment);
    let file = dir::open_file(dirfd, path, &name, true)?;
    let size = file.metadata().map_err(|e| fail(path, &name, e))?.len();
    let head = if offset < size {
        dir::read_at(&file, offset, frame::FRAME_OVERHEAD as u64)
            .map_err(|e| fail(path, &name, e))?
    } else {
        Vec::new()
    };
    let len = match head.get(4..8) {
        Some(b) => u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize,
        None => 0,
    };
    let whole = if offset < frame::HEADER_LEN as u64 || head[..head.len().min(4)] != frame::MARK {
        None
    } else {
        let want = (frame::FRAME_OVERHEAD + len.min(frame::MAX_BODY)) as u64;
        Some(dir::read_at(&file, offset, want).map_err(|e| fail(path, &name, e))?)
    };
    match whole {
        Some(b) => match frame::next(&b, 0) {
            Item::Record {
                start: 0,
                end,
                body,
            } if end == b.len() && !body.is_empty() => {
                if is_set_aside(body) {
                    return Err(fail(
                        path,
                        "set-aside",
                        format!("{here} is set aside already"),
                    ));
                }
                Ok((file, b))
            }
            _ => Err(no_record(path, &here)),
        },
        None => Err(no_record(path, &here)),
    }
}

fn no_record(path: &std::path::Path, here: &str) -> SpoolError {
    fail(
        path,
        "set-aside",
        format!(
            "no intact record starts at {here} (give the segment and offset the drain's or \
             the opening's error names, or `svc spool inspect` lists)"
        ),
    )
}

/// Keeps a frame's `bytes` in the quarantine file of its place, then overwrites the frame in
/// place by a set-aside frame of the same length, fsynced; returns the quarantine file's name.
fn take(
    dirfd: &OwnedFd,
    path: &std::path::Path,
    (file, place): (&std::fs::File, Place),
    bytes: &[u8],
) -> Result<String, SpoolError> {
    let name = dir::segment_name(place.segment);
    // The name the bytes went to: another file (planted, or other bytes) may hold the first.
    let (_, kept) = dir::keep(
        dirfd,
        path,
        &dir::quarantine_name(place.segment, place.offset),
        bytes,
    )?;
    let mut body = vec![0u8; bytes.len() - frame::FRAME_OVERHEAD];
    body[0] = FLAG_SET_ASIDE;
    let mut tomb = Vec::with_capacity(bytes.len());
    frame::encode(&mut tomb, &body);
    file.write_all_at(&tomb, place.offset)
        .and_then(|()| file.sync_data())
        .map_err(|e| fail(path, &format!("set aside in {name}"), e))?;
    log::warn!(
        "spool {}: the record at segment {} offset {} was set aside by the operator; its bytes \
         are kept in {kept}",
        path.display(),
        place.segment,
        place.offset
    );
    Ok(kept)
}

/// Sets aside the custody checkpoint frames after `from` (whose checkpoint, its plain frame
/// body `plain`, was just set aside) that continue its chain: each one's `previous` is the
/// digest of one set aside here, so it can never follow the target's chain. A frame that
/// links elsewhere (the genuine frame after a planted one set aside) stays. Returns how many.
fn take_chain_tail(
    cfg: &SpoolConfig,
    dirfd: &OwnedFd,
    from: Place,
    plain: &[u8],
) -> Result<usize, SpoolError> {
    let path = cfg.dir.as_path();
    let Some(first) = checkpoint_link(plain) else {
        return Ok(0);
    };
    let mut opener = Opener::new(std::sync::Arc::new(crypt_of(cfg, dirfd)?));
    let (mut cut, mut tail, mut opened) = (vec![first.0], Vec::new(), Vec::new());
    scan::walk(path, |seen| {
        let after = (seen.segment, seen.offset) > (from.segment, from.offset);
        if seen.rejected_in.is_some() || !after || !is_checkpoint_frame(seen.body) {
            return true;
        }
        opened.clear();
        let plain = match opener.open(seen.place, seen.body, &mut opened) {
            Ok(Opened::Clear) => seen.body,
            Ok(Opened::Sealed(r)) => &opened[r],
            Err(_) => return true,
        };
        if let Some((digest, previous)) = checkpoint_link(plain) {
            if cut.contains(&previous) {
                cut.push(digest);
                tail.push(seen.place);
            }
        }
        tail.len() < MAX_TAIL
    })?;
    for place in &tail {
        let (file, bytes) = frame_at(dirfd, path, place.segment, place.offset)?;
        take(dirfd, path, (&file, *place), &bytes)?;
    }
    Ok(tail.len())
}

/// Most frames one set-aside takes with the first (the chain tail of a week's outage at one
/// checkpoint a minute is about 10,000).
const MAX_TAIL: usize = 1_000_000;

/// A checkpoint frame body's (chain digest, previous), when it decodes.
fn checkpoint_link(plain: &[u8]) -> Option<(String, String)> {
    let cp = super::codec::decode_checkpoint(plain).ok()?;
    super::put::link(std::str::from_utf8(cp.bytes).ok()?)
}

/// How the drain reads a frame's body.
enum Read {
    /// A record it delivers.
    Record,
    /// A custody checkpoint frame, opened (plain body, whether it was sealed).
    Checkpoint(Vec<u8>, bool),
    /// Nothing it can read (it stops there).
    Not,
}

/// How `body`, stored at `place`, reads under `cfg`'s keys and the spool's meta file, as the
/// drain would read it.
fn read_as(
    cfg: &SpoolConfig,
    dirfd: &std::os::fd::OwnedFd,
    place: Place,
    body: &[u8],
) -> Result<Read, SpoolError> {
    let mut opener = Opener::new(std::sync::Arc::new(crypt_of(cfg, dirfd)?));
    let mut out = Vec::new();
    let read = |plain: &[u8], sealed: bool| {
        if super::codec::is_checkpoint(plain) {
            Read::Checkpoint(plain.to_vec(), sealed)
        } else if super::codec::decode(plain).is_ok() {
            Read::Record
        } else {
            Read::Not
        }
    };
    Ok(match opener.open(place, body, &mut out) {
        Ok(Opened::Clear) => read(body, false),
        Ok(Opened::Sealed(r)) => read(&out[r], true),
        Err(_) => Read::Not,
    })
}

/// The spool's keys as `cfg` configures them, bound to its meta file.
fn crypt_of(cfg: &SpoolConfig, dirfd: &OwnedFd) -> Result<Crypt, SpoolError> {
    let path = cfg.dir.as_path();
    let mut crypt = Crypt::load(cfg.encryption.as_ref(), cfg.allow_unencrypted)
        .map_err(|e| fail(path, "set-aside", e))?;
    let stored = super::meta::read(dirfd, path)?;
    crypt
        .bind_stored(stored.as_ref())
        .map_err(|e| fail(path, super::meta::NAME, e))?;
    Ok(crypt)
}

/// Why `drain` would put this checkpoint frame (its plain body) into its target, or `None`
/// when it stops at it (or quarantines it), as `sink::spool::put` decides: the target keeps
/// no checkpoints, the frame does not decode or names another checkpoint than its body, its
/// signature is not trusted, the target holds another checkpoint under its name, or it does
/// not follow the target's chain (`put::follows`).
fn drain_puts(drain: &DrainTarget, plain: &[u8], sealed: bool) -> Option<String> {
    let store = drain.store.as_ref()?;
    let cp = super::codec::decode_checkpoint(plain).ok()?;
    let text = std::str::from_utf8(cp.bytes).ok()?;
    if claimed(text) != Some((cp.runner_id.into(), Some(cp.index))) {
        return None;
    }
    super::put::check(&drain.trusted, text, sealed).ok()?;
    let name = format!(
        "(checkpoint {} of runner {})",
        cp.index,
        PeerText::new(cp.runner_id)
    );
    match super::put::follows(store.as_ref(), cp.runner_id, cp.index, text) {
        Ok(Follows::Yes) => Some(format!(
            "{name} the drain puts into the target's checkpoint store (it holds none under \
             that name, and it follows the target's chain)"
        )),
        Ok(Follows::Stored) => Some(format!(
            "{name} the target's checkpoint store holds already (the drain moves past it)"
        )),
        Ok(Follows::No(_)) => None,
        Err(e) => Some(format!(
            "{name} the drain may put: the target's checkpoint store cannot be read ({}); try \
             again once it can",
            PeerText::new(&e)
        )),
    }
}
