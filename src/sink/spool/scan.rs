//! Reading a whole spool directory: recovery when a runner or `svc spool drain` opens it
//! (writes allowed), and the read-only survey behind `svc spool status` (safe while a runner
//! appends: the tail of the last segment may be a write in progress and is not counted).

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::Path;

use super::codec;
use super::config::SpoolConfig;
use super::dir::{self, fail, Position, SpoolError};
use super::frame::{self, Item};
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
}

/// Most bytes read of one segment: segments close at `segment_bytes`, and the batch that
/// passed it is bounded by the spool's size.
fn read_cap(cfg: &SpoolConfig) -> u64 {
    cfg.segment_bytes
        .saturating_add(cfg.max_bytes)
        .saturating_add(frame::MAX_BODY as u64)
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
pub fn recover(
    dir: &OwnedFd,
    path: &Path,
    cfg: &SpoolConfig,
    metrics: &Metrics,
) -> Result<Found, SpoolError> {
    let (ids, position, _) = layout(dir, path)?;
    let mut found = Found {
        segments: Vec::new(),
        position,
        records: 0,
        oldest_ms: None,
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
        let data = dir::read_at(&file, 0, read_cap(cfg)).map_err(|e| fail(path, &name, e))?;
        if data.len() < frame::HEADER_LEN {
            // Too short to hold a record: a creation the crash interrupted, or damage.
            if !frame::SEGMENT_MAGIC.starts_with(&data) {
                quarantine(dir, path, metrics, id, 0, &data);
            }
            dir::remove(dir, path, &name)?;
            removed = true;
            continue;
        }
        if !frame::has_header(&data) {
            // The header decides nothing about how frames are read: keep the damaged bytes,
            // write the header again and read on by the frame marks.
            quarantine(dir, path, metrics, id, 0, &data[..frame::HEADER_LEN]);
            repair_header(&file).map_err(|e| fail(path, &name, e))?;
        }
        let len = recover_frames(
            (dir, path, metrics),
            (id, &name),
            &file,
            &data,
            start_in(id, position),
            last,
            &mut found,
        )?;
        found.segments.push(Segment {
            id,
            len: len as u64,
            entry_durable: false,
        });
    }
    if removed {
        dir::sync(dir, path)?;
    }
    Ok(found)
}

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
    file: &File,
    data: &[u8],
    from: usize,
    last: bool,
    found: &mut Found,
) -> Result<usize, SpoolError> {
    let mut len = data.len();
    for item in frame::items(data, from.min(data.len())) {
        match item {
            Item::Record { body, .. } => {
                found.records += 1;
                if found.oldest_ms.is_none() {
                    found.oldest_ms = codec::appended_unix_ms(body);
                }
            }
            Item::Corrupt { start, end } => {
                quarantine(dir, path, metrics, id, start as u64, &data[start..end]);
            }
            Item::Tail { start } if last => {
                len = recover_tail((dir, path, metrics), (id, name), file, data, start)?;
            }
            Item::Tail { start } => {
                quarantine(dir, path, metrics, id, start as u64, &data[start..]);
            }
        }
    }
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
    data: &[u8],
    start: usize,
) -> Result<usize, SpoolError> {
    let mut at = start;
    while let Some(end) = frame::whole_frame_end(data, at) {
        quarantine(dir, path, metrics, id, at as u64, &data[at..end]);
        at = end;
    }
    if at >= data.len() {
        return Ok(data.len());
    }
    if !frame::runs_past_end(data, at) {
        quarantine(dir, path, metrics, id, at as u64, &data[at..]);
        return Ok(data.len());
    }
    let kept = dir::quarantine_name(id, at as u64);
    if let Err(e) = dir::keep(dir, path, &kept, &data[at..]) {
        // Left in place: the drain finds the bytes and quarantines them once it can.
        log::error!(
            "spool {}: a torn tail of {} bytes at offset {at} of {name} cannot be kept ({e}); \
             left in place",
            path.display(),
            data.len() - at
        );
        return Ok(data.len());
    }
    log::warn!(
        "spool {}: cut a torn tail of {} bytes at offset {at} of {name}: a write the crash \
         interrupted, never acknowledged, unless damage hit both the length and the contents \
         of the segment's last record (the bytes are kept in {kept})",
        path.display(),
        data.len() - at
    );
    truncate(file, at as u64).map_err(|e| fail(path, name, e))?;
    Ok(at)
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

/// What `svc spool status` reports.
#[derive(Debug, Default)]
pub struct Survey {
    pub records: u64,
    pub bytes: u64,
    pub segments: u64,
    pub oldest_ms: Option<u64>,
    /// Damaged stretches found now and not yet quarantined (the next open quarantines them).
    pub damaged: u64,
    pub quarantine_files: u64,
    pub rejected_files: u64,
    pub position: Position,
}

/// One record seen by [`walk`].
pub struct Seen<'a> {
    pub segment: u64,
    pub offset: usize,
    pub body: &'a [u8],
}

/// Reads the spool without changing it, calling `visit` for every record not yet drained,
/// one segment in memory at a time; stops early (with the survey so far) when `visit`
/// returns false.
pub fn walk(
    path: &Path,
    cfg: &SpoolConfig,
    mut visit: impl FnMut(Seen<'_>) -> bool,
) -> Result<Survey, SpoolError> {
    let dir = dir::open_dir(path, false)?;
    let (ids, position, names) = layout(&dir, path)?;
    let mut survey = Survey {
        position,
        quarantine_files: names
            .iter()
            .filter(|n| n.starts_with("quarantine-"))
            .count() as u64,
        rejected_files: names.iter().filter(|n| n.starts_with("rejected-")).count() as u64,
        ..Survey::default()
    };
    for &id in ids.iter().filter(|&&id| id >= position.segment) {
        let name = dir::segment_name(id);
        let file = match dir::open_file(&dir, path, &name, false) {
            Ok(f) => f,
            // Removed by the drain since the listing.
            Err(_) => continue,
        };
        let data = dir::read_at(&file, 0, read_cap(cfg)).map_err(|e| fail(path, &name, e))?;
        survey.segments += 1;
        survey.bytes += data.len() as u64;
        if data.len() >= frame::HEADER_LEN && !frame::has_header(&data) {
            // Read on by the frame marks, as recovery does.
            survey.damaged += 1;
        }
        for item in frame::items(&data, start_in(id, position).min(data.len())) {
            match item {
                Item::Record { start, body, .. } => {
                    survey.records += 1;
                    if survey.oldest_ms.is_none() {
                        survey.oldest_ms = codec::appended_unix_ms(body);
                    }
                    let more = visit(Seen {
                        segment: id,
                        offset: start,
                        body,
                    });
                    if !more {
                        return Ok(survey);
                    }
                }
                Item::Corrupt { .. } => survey.damaged += 1,
                Item::Tail { .. } => {}
            }
        }
    }
    Ok(survey)
}
