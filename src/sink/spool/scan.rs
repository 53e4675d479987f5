//! Reading a whole spool directory: recovery when a runner or `svc spool drain` opens it
//! (writes allowed), and the read-only survey behind `svc spool status` (safe while a runner
//! appends: the tail of the last segment may be a write in progress and is not counted).

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::Path;

use super::dir::{self, fail, Position, SpoolError};
use super::frame::{self, Item};
use super::seal::{self, Crypt, OpenError};
use super::{aside, codec};
use crate::metrics::Metrics;

/// One segment file as the spool knows it.
#[derive(Debug, Clone)]
pub struct Segment {
    pub id: u64,
    /// Bytes known durable: everything a reader may look at.
    pub len: u64,
    /// Its directory entry is durable (the directory was fsynced since it was created): until
    /// then no record in it may be reported durable.
    pub entry_durable: bool,
}

/// What recovery found.
pub struct Found {
    pub segments: Vec<Segment>,
    pub position: Position,
    pub records: u64,
    pub oldest_ms: Option<u64>,
    /// Why records cannot be read with this configuration (a key id not configured, a key
    /// file changed under its id), with the records of each (the first
    /// [`UNKNOWN_KEYS_LISTED`]).
    pub unknown_keys: Vec<(OpenError, u64)>,
    /// Records sealed in version 2 (bound to the spool id of the `meta` file).
    pub sealed_v2: u64,
    /// The lowest segment holding a sealed record: encryption began there at the latest,
    /// whatever the `meta` file says (a record in clear at or after it was not written by
    /// this spool).
    pub first_sealed_seen: Option<u64>,
    /// Records stored in clear, and where the first of them is (segment, offset).
    pub clear: u64,
    pub first_clear: Option<(u64, u64)>,
    /// Records tried against the meta's spool id at the opening.
    pub trial: Trial,
}

/// The opening's trial decryption: the first record of each segment sealed in version 2
/// under a configured key is opened with the bound meta. When none of them opens, the meta's
/// spool id is not the one they were sealed under (the `meta` of another spool under the
/// same key, or one rewritten with another id): the spool refuses to open instead of letting
/// the drain quarantine every record (issue 47 attack finding 4). A spool with some segments
/// from elsewhere still opens, and the drain quarantines those.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trial {
    pub tried: u64,
    pub opened: u64,
}

impl Trial {
    /// Every record tried failed to open.
    pub fn none_opened(&self) -> bool {
        self.tried > 0 && self.opened == 0
    }
}

/// Bytes of a segment read at a time by recovery and the survey; the buffer grows past it
/// only to hold one frame (at most [`frame::MAX_BODY`]) or to judge damage. A segment is
/// never read whole: one larger than any the spool writes (a bug, or a file put there) costs
/// no more memory than a normal one.
const WINDOW: usize = 4 << 20;
/// Most bytes held of one segment at once: the largest frame and a window behind it.
pub const MAX_HELD: usize = frame::MAX_BODY + frame::FRAME_OVERHEAD + WINDOW;

#[cfg(test)]
thread_local! {
    /// The most bytes [`read_frames`] held at once on this thread.
    pub static HELD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// True when `item` of `buf` is judged on what `buf` holds (always at the end of the file):
/// an intact record; or damage where neither the frame its stretch starts with nor any frame
/// a mark inside the stretch declares would run past the end of `buf` (such a frame may be
/// whole in the file, and a false frame inside its body would end the stretch wrongly).
pub fn ready(buf: &[u8], item: Item<'_>, eof: bool) -> bool {
    let cut_off = |at: usize| match buf.get(at..at + frame::FRAME_OVERHEAD) {
        None => buf[at..].iter().zip(&frame::MARK).all(|(a, b)| a == b),
        Some(head) => {
            let len = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes")) as usize;
            head[..4] == frame::MARK
                && len <= frame::MAX_BODY
                && at + frame::FRAME_OVERHEAD + len > buf.len()
        }
    };
    match item {
        Item::Record { .. } => true,
        _ if eof => true,
        Item::Tail { .. } => false,
        Item::Corrupt { start, end } => {
            !cut_off(start)
                && !buf[start + 1..(end + 3).min(buf.len())]
                    .windows(frame::MARK.len())
                    .enumerate()
                    .any(|(i, w)| w == frame::MARK && cut_off(start + 1 + i))
        }
    }
}

/// Where the damage at the start of a full buffer (`MAX_HELD` bytes from it) is cut when no
/// item there is judged: no intact frame starts before `intact` in the first part (one would
/// lie wholly in the buffer), so that part is damage, handed over in one piece.
pub fn damage_piece_end(buf: &[u8], intact: usize) -> usize {
    intact.min(buf.len() - (frame::MAX_BODY + frame::FRAME_OVERHEAD))
}

/// Reads the items of a segment from byte `from` on with bounded memory, handing each to
/// `visit` with the bytes held now and the file offset where they begin: a `Record`, a
/// `Corrupt` stretch (damage; a stretch longer than the buffer comes in pieces, each with no
/// frame start in it), and at the end of the file a `Tail`. Stops when `visit` returns false.
pub fn read_frames(
    file: &File,
    from: u64,
    (path, name): (&Path, &str),
    mut visit: impl FnMut(u64, &[u8], Item<'_>) -> Result<bool, SpoolError>,
) -> Result<(), SpoolError> {
    let io = |e: std::io::Error| fail(path, &format!("read {name}"), e);
    let mut size = file.metadata().map_err(io)?.len();
    let mut base = from;
    let mut buf = dir::read_at(file, base, WINDOW as u64).map_err(io)?;
    loop {
        #[cfg(test)]
        HELD.with(|h| h.set(h.get().max(buf.len())));
        let eof = base + buf.len() as u64 >= size;
        // Where the items not yet judged begin, and where the first intact frame after them is.
        let (mut pos, mut intact) = (buf.len(), buf.len());
        for item in frame::items(&buf, 0) {
            if !ready(&buf, item, eof) {
                (pos, intact) = match item {
                    Item::Corrupt { start, end } => (start, end),
                    Item::Tail { start } => (start, buf.len()),
                    Item::Record { .. } => unreachable!("records are ready"),
                };
                break;
            }
            if !visit(base, &buf, item)? {
                return Ok(());
            }
        }
        if eof && pos == buf.len() {
            return Ok(());
        }
        if pos == 0 && buf.len() >= MAX_HELD {
            let end = damage_piece_end(&buf, intact);
            if !visit(base, &buf, Item::Corrupt { start: 0, end })? {
                return Ok(());
            }
            pos = end;
        }
        buf.drain(..pos);
        base += pos as u64;
        let want = (buf.len() * 2).clamp(WINDOW, MAX_HELD);
        let more =
            dir::read_at(file, base + buf.len() as u64, (want - buf.len()) as u64).map_err(io)?;
        if more.is_empty() {
            // The file shrank since: what is held is all there is.
            size = base + buf.len() as u64;
        }
        buf.extend_from_slice(&more);
    }
}

/// The segment ids in the directory, and the drain position (the oldest segment's start when
/// none was written).
fn layout(dir: &OwnedFd, path: &Path) -> Result<(Vec<u64>, Position, Vec<String>), SpoolError> {
    let names = dir::names(dir, path)?;
    let ids: Vec<u64> = names.iter().filter_map(|n| dir::segment_id(n)).collect();
    let position = dir::read_position(dir, path).unwrap_or(Position {
        segment: ids.first().copied().unwrap_or(0),
        offset: 0,
    });
    Ok((ids, position, names))
}

fn start_in(id: u64, position: Position) -> usize {
    if id == position.segment {
        (position.offset as usize).max(frame::HEADER_LEN)
    } else {
        frame::HEADER_LEN
    }
}

/// Recovers the spool of an open, locked directory (see `Spool::open`).
/// A record stored in clear is refused (the open fails, naming it) unless `crypt` allows
/// such records; records under a key id `crypt` does not hold are counted and logged by id.
pub fn recover(
    dir: &OwnedFd,
    path: &Path,
    metrics: &Metrics,
    crypt: &Crypt,
) -> Result<Found, SpoolError> {
    let (ids, position, _) = layout(dir, path)?;
    let mut found = Found {
        segments: Vec::new(),
        position,
        records: 0,
        oldest_ms: None,
        unknown_keys: Vec::new(),
        sealed_v2: 0,
        first_sealed_seen: None,
        clear: 0,
        first_clear: None,
        trial: Trial::default(),
    };
    let mut removed = false;
    for (i, &id) in ids.iter().enumerate() {
        let name = dir::segment_name(id);
        if id < position.segment {
            // Drained before a crash cut its removal short.
            dir::remove(dir, path, &name)?;
            removed = true;
            continue;
        }
        let last = i + 1 == ids.len();
        let file = dir::open_file(dir, path, &name, true)?;
        let head =
            dir::read_at(&file, 0, frame::HEADER_LEN as u64).map_err(|e| fail(path, &name, e))?;
        if head.len() < frame::HEADER_LEN {
            // Too short to hold a record: a creation the crash interrupted, or damage.
            if !frame::SEGMENT_MAGIC.starts_with(&head) {
                quarantine(dir, path, metrics, id, 0, &head);
            }
            dir::remove(dir, path, &name)?;
            removed = true;
            continue;
        }
        if !frame::has_header(&head) {
            // The header decides nothing about how frames are read: keep the damaged bytes,
            // write the header again and read on by the frame marks.
            quarantine(dir, path, metrics, id, 0, &head);
            repair_header(&file).map_err(|e| fail(path, &name, e))?;
        }
        let len = recover_frames(
            (dir, path, metrics),
            (id, &name),
            (&file, crypt),
            start_in(id, position) as u64,
            last,
            &mut found,
        )?;
        found.segments.push(Segment {
            id,
            len,
            entry_durable: false,
        });
    }
    if removed {
        dir::sync(dir, path)?;
    }
    for (why, n) in &found.unknown_keys {
        log::error!(
            "spool {}: {n} records are {why}: they are kept, and the drain stops at the first \
             of them until the configuration can read them",
            path.display(),
        );
    }
    Ok(found)
}

/// Refuses a record stored in clear unless allowed (one in a segment written after
/// encryption was turned on is left to the drain, which quarantines it); notes a record
/// the configuration cannot read (a key id not configured, a key file changed).
fn check_sealing(
    crypt: &Crypt,
    body: &[u8],
    (path, id, offset): (&Path, u64, u64),
    found: &mut Found,
) -> Result<(), SpoolError> {
    if !seal::is_sealed(body) {
        return match crypt.clear_allowed(id) {
            Ok(()) | Err(OpenError::ClearAfterSealing) => Ok(()),
            Err(_) => Err(fail(
                path,
                "open",
                format!(
                    "{} offset {offset} holds a record stored unencrypted (a spool written by \
                     a version before spool encryption, or run with allow_unencrypted: true); \
                     set spool.allow_unencrypted: true beside spool.encryption to drain it \
                     (new records are still encrypted) and remove it once the spool is empty; \
                     {}",
                    dir::segment_name(id),
                    set_aside_hint(id, offset)
                ),
            )),
        };
    }
    let Some(why) = crypt.kept(body) else {
        // Readable, or malformed: the drain finds it and quarantines it.
        return Ok(());
    };
    let listed = found.unknown_keys.len();
    match found.unknown_keys.iter_mut().find(|(w, _)| *w == why) {
        Some((_, n)) => *n += 1,
        None if listed < UNKNOWN_KEYS_LISTED => found.unknown_keys.push((why, 1)),
        None => {}
    }
    Ok(())
}

/// The operator's way past one record the spool keeps and no configuration should read.
pub fn set_aside_hint(segment: u64, offset: u64) -> String {
    format!(
        "if this spool did not write it (a record put there), move it to a quarantine file \
         with `svc spool set-aside <config_file> --segment {segment} --offset {offset}` (the \
         spool's runner stopped)"
    )
}

/// Key ids not configured that the opening scan names at most.
const UNKNOWN_KEYS_LISTED: usize = 16;

/// Quarantines damage found by the opening scan; one that cannot be kept is logged and left
/// in the segment, where the drain finds it again (and stops until it can keep it).
fn quarantine(dir: &OwnedFd, path: &Path, metrics: &Metrics, id: u64, at: u64, bytes: &[u8]) {
    if let Err(e) = dir::quarantine(dir, path, metrics, id, at, bytes) {
        log::error!("{e}");
    }
}

/// Counts the records of one segment from `from` and quarantines its damage; returns the
/// length to keep. Only a last frame running past the end of the last segment (a write the
/// crash interrupted, never acknowledged) is cut off (see [`recover_tail`]): a whole frame
/// that fails its check was written, and maybe acknowledged, and is quarantined like damage
/// anywhere else.
fn recover_frames(
    (dir, path, metrics): (&OwnedFd, &Path, &Metrics),
    (id, name): (u64, &str),
    (file, crypt): (&File, &Crypt),
    from: u64,
    last: bool,
    found: &mut Found,
) -> Result<u64, SpoolError> {
    let mut len = file.metadata().map_err(|e| fail(path, name, e))?.len();
    let mut tried_here = false;
    read_frames(file, from, (path, name), |base, data, item| {
        let at = |start: usize| base + start as u64;
        match item {
            // Moved out of the way by the operator (`svc spool set-aside`), who always leaves
            // the record's bytes in its quarantine file first: a marker without one was written
            // by someone else over a record, which is said and counted (the marker kept).
            Item::Record { start, end, body } if aside::is_set_aside(body) => {
                let kept = dir::quarantine_name(id, at(start));
                if rustix::fs::statat(dir, kept.as_str(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                    .is_err()
                {
                    log::error!(
                        "spool {}: a set-aside frame at {name} offset {} has no quarantine copy: \
                         a record was overwritten by someone who can write the spool directory",
                        path.display(),
                        at(start)
                    );
                    quarantine(dir, path, metrics, id, at(start), &data[start..end]);
                }
            }
            Item::Record { start, body, .. } => {
                check_sealing(crypt, body, (path, id, at(start)), found)?;
                found.records += 1;
                let v2 = matches!(
                    body.first(),
                    Some(&seal::FLAG_SEALED_V2 | &seal::FLAG_SEALED_CHECKPOINT)
                );
                found.sealed_v2 += u64::from(v2);
                if v2 && !tried_here && crypt.kept(body).is_none() {
                    tried_here = true;
                    let place = seal::Place {
                        segment: id,
                        offset: at(start),
                    };
                    found.trial.tried += 1;
                    found.trial.opened += u64::from(crypt.trial_open(place, body).is_ok());
                }
                if !seal::is_sealed(body) {
                    found.clear += 1;
                    found.first_clear.get_or_insert((id, at(start)));
                } else if found.first_sealed_seen.is_none_or(|f| id < f) {
                    found.first_sealed_seen = Some(id);
                }
                if found.oldest_ms.is_none() {
                    found.oldest_ms = codec::appended_unix_ms(body);
                }
            }
            Item::Corrupt { start, end } => {
                quarantine(dir, path, metrics, id, at(start), &data[start..end]);
            }
            Item::Tail { start } if last => {
                let ctx = (dir, path, metrics);
                len = recover_tail(ctx, (id, name), file, (base, data), start)?;
            }
            Item::Tail { start } => {
                quarantine(dir, path, metrics, id, at(start), &data[start..]);
            }
        }
        Ok(true)
    })?;
    Ok(len)
}

/// The end of the last segment from `start`, where no intact frame follows; returns the
/// length to keep. A whole frame whose length field alone is damaged (its checksum matches
/// the length the file holds, up to the next mark or the end) was written and maybe
/// acknowledged: quarantined. What runs past the end after that is a write the crash cut
/// short: cut off, its bytes first kept in a quarantine file (damage to both the length and
/// the contents of the last record looks the same). Anything else is damage: quarantined.
fn recover_tail(
    (dir, path, metrics): (&OwnedFd, &Path, &Metrics),
    (id, name): (u64, &str),
    file: &File,
    (base, data): (u64, &[u8]),
    start: usize,
) -> Result<u64, SpoolError> {
    let end_of_file = base + data.len() as u64;
    let mut at = start;
    while let Some(end) = frame::whole_frame_end(data, at) {
        quarantine(dir, path, metrics, id, base + at as u64, &data[at..end]);
        at = end;
    }
    if at >= data.len() {
        return Ok(end_of_file);
    }
    let offset = base + at as u64;
    if !frame::runs_past_end(data, at) {
        quarantine(dir, path, metrics, id, offset, &data[at..]);
        return Ok(end_of_file);
    }
    let kept = match dir::keep(dir, path, &dir::quarantine_name(id, offset), &data[at..]) {
        Ok((_, kept)) => kept,
        Err(e) => {
            // Left in place: the drain finds the bytes and quarantines them once it can.
            log::error!(
                "spool {}: a torn tail of {} bytes at offset {offset} of {name} cannot be kept \
             ({e}); left in place",
                path.display(),
                data.len() - at
            );
            return Ok(end_of_file);
        }
    };
    log::warn!(
        "spool {}: cut a torn tail of {} bytes at offset {offset} of {name}: a write the crash \
         interrupted, never acknowledged, unless damage hit both the length and the contents \
         of the segment's last record (the bytes are kept in {kept})",
        path.display(),
        data.len() - at
    );
    truncate(file, offset).map_err(|e| fail(path, name, e))?;
    Ok(offset)
}

fn repair_header(file: &File) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.write_all_at(frame::SEGMENT_MAGIC, 0)?;
    file.sync_data()
}

fn truncate(file: &File, len: u64) -> std::io::Result<()> {
    file.set_len(len)?;
    file.sync_all()
}

/// Damaged stretches, quarantine files and rejected files listed by name at most (all of
/// them are counted): what `svc spool status` and `inspect` print stays bounded.
pub const LISTED: usize = 1000;

/// A damaged stretch found by [`walk`] and not yet quarantined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub segment: u64,
    pub offset: u64,
    pub bytes: u64,
}

/// What `svc spool status` reports.
#[derive(Debug, Default)]
pub struct Survey {
    /// Records waiting to be drained (checkpoint frames not included).
    pub records: u64,
    /// Custody checkpoint frames waiting to be drained (`sink.type` = `spool`).
    pub checkpoints: u64,
    pub bytes: u64,
    pub segments: u64,
    pub oldest_ms: Option<u64>,
    /// Damaged stretches found now and not yet quarantined (the next open quarantines them):
    /// a damaged header, damage between frames, and a tail that is no write in progress.
    pub damaged: u64,
    /// The first [`LISTED`] of them.
    pub damage: Vec<Damage>,
    pub quarantine_files: u64,
    /// The first [`LISTED`] quarantine files: name and bytes.
    pub quarantined: Vec<(String, u64)>,
    pub rejected_files: u64,
    /// Records kept in rejected files (refused by the sink for good).
    pub rejected_records: u64,
    /// The first [`LISTED`] rejected files: name and records.
    pub rejected: Vec<(String, u64)>,
    /// Frames set aside by the operator (`svc spool set-aside`) not yet drained past: each
    /// one's record is kept in its quarantine file.
    pub set_aside: u64,
    pub position: Position,
}

impl Survey {
    fn note_damage(&mut self, segment: u64, offset: u64, bytes: usize) {
        self.damaged += 1;
        if self.damage.len() < LISTED {
            self.damage.push(Damage {
                segment,
                offset,
                bytes: bytes as u64,
            });
        }
    }
}

/// One record seen by [`walk`].
pub struct Seen<'a> {
    /// The segment it waits in; for a rejected record, the segment its file names.
    pub segment: u64,
    /// Its offset in the segment; for a rejected record, in its rejected file.
    pub offset: u64,
    /// Where it was sealed (a sealed record opens only there): for a rejected record, the
    /// segment and offset its file's name gives.
    pub place: seal::Place,
    pub body: &'a [u8],
    /// The rejected file holding it; `None` for a record waiting to be drained.
    pub rejected_in: Option<&'a str>,
}

/// Reads the spool without changing it, calling `visit` for every record not yet drained,
/// then for every record kept in a rejected file, with bounded memory (see
/// [`read_frames`]); stops early (with the survey so far) when `visit` returns false.
pub fn walk(path: &Path, mut visit: impl FnMut(Seen<'_>) -> bool) -> Result<Survey, SpoolError> {
    let dir = dir::open_dir(path, false)?;
    let (ids, position, names) = layout(&dir, path)?;
    let mut survey = Survey {
        position,
        ..Survey::default()
    };
    let last = ids.last().copied();
    for &id in ids.iter().filter(|&&id| id >= position.segment) {
        if !survey_segment((&dir, path), id, Some(id) == last, &mut survey, &mut visit)? {
            return Ok(survey);
        }
    }
    for name in &names {
        if name.starts_with("quarantine-") {
            survey.quarantine_files += 1;
            if survey.quarantined.len() < LISTED {
                let bytes =
                    rustix::fs::statat(&dir, name.as_str(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                        .map_or(0, |st| st.st_size as u64);
                survey.quarantined.push((name.clone(), bytes));
            }
        } else if name.starts_with("rejected-")
            && !survey_rejected((&dir, path), name, &mut survey, &mut visit)?
        {
            return Ok(survey);
        }
    }
    Ok(survey)
}

/// Surveys one segment; false when `visit` asked to stop.
fn survey_segment(
    (dir, path): (&OwnedFd, &Path),
    id: u64,
    last: bool,
    survey: &mut Survey,
    visit: &mut impl FnMut(Seen<'_>) -> bool,
) -> Result<bool, SpoolError> {
    let name = dir::segment_name(id);
    let file = match dir::open_file(dir, path, &name, false) {
        Ok(f) => f,
        // Removed by the drain since the listing.
        Err(_) => return Ok(true),
    };
    survey.segments += 1;
    survey.bytes += file.metadata().map_or(0, |m| m.len());
    let head =
        dir::read_at(&file, 0, frame::HEADER_LEN as u64).map_err(|e| fail(path, &name, e))?;
    if head.len() >= frame::HEADER_LEN && !frame::has_header(&head) {
        // Read on by the frame marks, as recovery does.
        survey.note_damage(id, 0, frame::HEADER_LEN);
    }
    let mut more = true;
    let from = start_in(id, survey.position) as u64;
    read_frames(&file, from, (path, &name), |base, data, item| {
        let at = |start: usize| base + start as u64;
        match item {
            Item::Record { body, .. } if aside::is_set_aside(body) => survey.set_aside += 1,
            Item::Record { start, body, .. } => {
                if seal::is_checkpoint_frame(body) {
                    survey.checkpoints += 1;
                } else {
                    survey.records += 1;
                }
                if survey.oldest_ms.is_none() {
                    survey.oldest_ms = codec::appended_unix_ms(body);
                }
                more = visit(Seen {
                    segment: id,
                    offset: at(start),
                    place: seal::Place {
                        segment: id,
                        offset: at(start),
                    },
                    body,
                    rejected_in: None,
                });
            }
            Item::Corrupt { start, end } => survey.note_damage(id, at(start), end - start),
            // The last segment's tail may be a write in progress (a runner appends beside
            // this survey): damage only when it cannot be one.
            Item::Tail { start } if last && frame::runs_past_end(data, start) => {}
            Item::Tail { start } => survey.note_damage(id, at(start), data.len() - start),
        }
        Ok(more)
    })?;
    Ok(more)
}

/// Counts (and visits) the records of one rejected file; false when `visit` asked to stop.
fn survey_rejected(
    (dir, path): (&OwnedFd, &Path),
    name: &str,
    survey: &mut Survey,
    visit: &mut impl FnMut(Seen<'_>) -> bool,
) -> Result<bool, SpoolError> {
    survey.rejected_files += 1;
    let file = match dir::open_file(dir, path, name, false) {
        Ok(f) => f,
        Err(e) => {
            log::warn!("{e}");
            return Ok(true);
        }
    };
    let segment = dir::rejected_segment(name).unwrap_or(0);
    let origin = dir::rejected_offset(name).unwrap_or(0);
    let (mut records, mut more) = (0, true);
    read_frames(&file, 0, (path, name), |base, _, item| {
        if let Item::Record { start, body, .. } = item {
            records += 1;
            more = visit(Seen {
                segment,
                offset: base + start as u64,
                place: seal::Place {
                    segment,
                    offset: origin.saturating_add(base + start as u64),
                },
                body,
                rejected_in: Some(name),
            });
        }
        Ok(more)
    })?;
    survey.rejected_records += records;
    if survey.rejected.len() < LISTED {
        survey.rejected.push((name.to_string(), records));
    }
    Ok(more)
}
