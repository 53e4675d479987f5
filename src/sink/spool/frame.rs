//! The on-disk framing of spool segments: a fixed header, then records, each
//! `MARK | length | crc32 | body`.
//!
//! Pure functions over byte slices, so the reader is fuzzed and unit-tested without files.
//! The checksum (CRC-32, IEEE) covers the length and the body: a torn write, a flipped bit
//! or a length overwritten by garbage all fail it. The mark exists so that after a corrupt
//! frame the reader can find the next good one (a length cannot be trusted once its frame
//! failed). Nothing in a frame chooses how it is read: no algorithm, version or key is taken
//! from the data.

/// First bytes of every segment file.
pub const SEGMENT_MAGIC: &[u8; 8] = b"SVCSPL01";
/// Bytes before the first record.
pub const HEADER_LEN: usize = SEGMENT_MAGIC.len();
/// Start of every frame.
pub const MARK: [u8; 4] = [0xF5, b'S', b'R', 0x0A];
/// Mark, length and checksum.
pub const FRAME_OVERHEAD: usize = 12;
/// Largest body a frame may declare: a bound on what one read of the spool allocates, far
/// above any envelope the runner builds (payloads are bounded by the broker's max_payload).
pub const MAX_BODY: usize = 64 << 20;

/// Appends one frame holding `body` to `out`.
pub fn encode(out: &mut Vec<u8>, body: &[u8]) {
    let len = u32::try_from(body.len()).expect("bodies are bounded by MAX_BODY");
    out.extend_from_slice(&MARK);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&checksum(len, body).to_le_bytes());
    out.extend_from_slice(body);
}

fn checksum(len: u32, body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_le_bytes());
    h.update(body);
    h.finalize()
}

/// What the reader found at one place in a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item<'a> {
    /// A whole, intact record: `body` spans `start + FRAME_OVERHEAD .. end`.
    Record {
        start: usize,
        end: usize,
        body: &'a [u8],
    },
    /// Bytes that are no record, followed by an intact frame at `end`.
    Corrupt { start: usize, end: usize },
    /// From `start` to the end of the data nothing intact follows: a write cut short by a
    /// crash (in the segment being appended to), or damage reaching the end.
    Tail { start: usize },
}

/// Reads the frame at `pos` of `data`; `None` when none is intact there.
fn frame_at(data: &[u8], pos: usize) -> Option<(usize, &[u8])> {
    let head = data.get(pos..pos.checked_add(FRAME_OVERHEAD)?)?;
    if head[..4] != MARK {
        return None;
    }
    let len = u32::from_le_bytes(head[4..8].try_into().ok()?);
    let sum = u32::from_le_bytes(head[8..12].try_into().ok()?);
    if len as usize > MAX_BODY {
        return None;
    }
    let body_start = pos + FRAME_OVERHEAD;
    let end = body_start.checked_add(len as usize)?;
    let body = data.get(body_start..end)?;
    (checksum(len, body) == sum).then_some((end, body))
}

/// The item at `pos` (`pos < data.len()`): a record, or the damaged stretch up to the next
/// intact frame, or the tail.
pub fn next(data: &[u8], pos: usize) -> Item<'_> {
    if let Some((end, body)) = frame_at(data, pos) {
        return Item::Record {
            start: pos,
            end,
            body,
        };
    }
    let mut probe = pos + 1;
    while probe + FRAME_OVERHEAD <= data.len() {
        match data[probe..].windows(MARK.len()).position(|w| w == MARK) {
            None => break,
            Some(i) => {
                let at = probe + i;
                if frame_at(data, at).is_some() {
                    return Item::Corrupt {
                        start: pos,
                        end: at,
                    };
                }
                probe = at + 1;
            }
        }
    }
    Item::Tail { start: pos }
}

/// Every item of `data` from `pos` on, in order.
pub fn items(data: &[u8], mut pos: usize) -> impl Iterator<Item = Item<'_>> {
    std::iter::from_fn(move || {
        if pos >= data.len() {
            return None;
        }
        let item = next(data, pos);
        pos = match item {
            Item::Record { end, .. } | Item::Corrupt { end, .. } => end,
            Item::Tail { .. } => data.len(),
        };
        Some(item)
    })
}

/// True when the bytes from `start` to the end of `data` are the beginning of a frame that
/// runs past the end: its mark (or the part of it there is) and a declared length the data
/// cannot hold. Only that is a write cut short; a frame that would fit but fails its check,
/// or bytes without a mark, are damage.
pub fn runs_past_end(data: &[u8], start: usize) -> bool {
    let rest = data.get(start..).unwrap_or_default();
    if rest.len() < FRAME_OVERHEAD {
        let n = rest.len().min(MARK.len());
        return rest[..n] == MARK[..n];
    }
    if rest[..4] != MARK {
        return false;
    }
    let len = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes")) as usize;
    len <= MAX_BODY && FRAME_OVERHEAD + len > rest.len()
}

/// True when `data` starts with the segment header.
pub fn has_header(data: &[u8]) -> bool {
    data.starts_with(SEGMENT_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(bodies: &[&[u8]]) -> Vec<u8> {
        let mut out = SEGMENT_MAGIC.to_vec();
        for b in bodies {
            encode(&mut out, b);
        }
        out
    }

    fn bodies(data: &[u8]) -> Vec<Item<'_>> {
        items(data, HEADER_LEN).collect()
    }

    #[test]
    fn records_read_back_in_order() {
        let data = segment(&[b"one", b"", b"three"]);
        let got: Vec<&[u8]> = bodies(&data)
            .into_iter()
            .map(|i| match i {
                Item::Record { body, .. } => body,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(got, vec![&b"one"[..], b"", b"three"]);
    }

    #[test]
    fn a_torn_tail_is_reported_where_it_starts() {
        let mut data = segment(&[b"one", b"two"]);
        let whole = data.len();
        encode(&mut data, b"three-is-longer");
        for cut in whole + 1..data.len() {
            let items = bodies(&data[..cut]);
            assert_eq!(items.len(), 3, "cut at {cut}");
            assert_eq!(items[2], Item::Tail { start: whole });
        }
    }

    #[test]
    fn a_damaged_record_is_skipped_and_the_rest_read() {
        let mut data = segment(&[b"one", b"two", b"three"]);
        let second = HEADER_LEN + FRAME_OVERHEAD + 3;
        let third = second + FRAME_OVERHEAD + 3;
        // A flipped body byte, then a length overwritten with garbage.
        for damage in [third - 1, second + 5] {
            let mut d = data.clone();
            d[damage] ^= 0x55;
            let items = bodies(&d);
            assert_eq!(
                items[1],
                Item::Corrupt {
                    start: second,
                    end: third
                }
            );
            assert!(matches!(items[2], Item::Record { body: b"three", .. }));
        }
        data.truncate(third - 2);
        assert_eq!(bodies(&data)[1], Item::Tail { start: second });
    }

    #[test]
    fn only_a_frame_running_past_the_end_is_torn() {
        let mut data = segment(&[b"one", b"two"]);
        let last = HEADER_LEN + FRAME_OVERHEAD + 3;
        for cut in last + 1..data.len() {
            assert!(runs_past_end(&data[..cut], last), "cut at {cut}");
        }
        // Whole but damaged: the length fits, the checksum fails.
        let end = data.len();
        data[end - 1] ^= 0x01;
        assert!(!runs_past_end(&data, last));
        // No mark: damage.
        data[last] = 0;
        assert!(!runs_past_end(&data, last));
    }

    #[test]
    fn a_huge_declared_length_allocates_nothing() {
        let mut data = SEGMENT_MAGIC.to_vec();
        data.extend_from_slice(&MARK);
        data.extend_from_slice(&u32::MAX.to_le_bytes());
        data.extend_from_slice(&[0; 4]);
        assert_eq!(bodies(&data), vec![Item::Tail { start: HEADER_LEN }]);
    }
}
