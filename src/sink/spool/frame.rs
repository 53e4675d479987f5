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

/// Appends one frame whose body `fill` appends to `out` (a body sealed in place, without a
/// copy); on error `out` is left as it was.
pub fn encode_with<E>(
    out: &mut Vec<u8>,
    fill: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) -> Result<(), E> {
    let start = out.len();
    out.extend_from_slice(&MARK);
    out.extend_from_slice(&[0; 8]);
    if let Err(e) = fill(out) {
        out.truncate(start);
        return Err(e);
    }
    let body = start + FRAME_OVERHEAD;
    let len = u32::try_from(out.len() - body).expect("bodies are bounded by MAX_BODY");
    let crc = checksum(len, &out[body..]);
    out[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
    out[start + 8..body].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

fn checksum(len: u32, body: &[u8]) -> u32 {
    #[cfg(test)]
    count_hashed(body.len());
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_le_bytes());
    h.update(body);
    h.finalize()
}

#[cfg(test)]
thread_local! {
    /// Body bytes checksummed on this thread: the cost the resync tests bound.
    pub static HASHED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
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
    match frame_at(data, pos) {
        Some((end, body)) => Item::Record {
            start: pos,
            end,
            body,
        },
        None => after_damage(pos, Resync::new(pos + 1).after(data, pos)),
    }
}

fn after_damage(pos: usize, next_intact: Option<usize>) -> Item<'static> {
    match next_intact {
        Some(end) => Item::Corrupt { start: pos, end },
        None => Item::Tail { start: pos },
    }
}

/// Every item of `data` from `pos` on, in order. The intact frames after damage are found
/// by one [`Resync`], which serves every later resync of the scan.
pub fn items(data: &[u8], mut pos: usize) -> impl Iterator<Item = Item<'_>> {
    let mut resync: Option<Resync> = None;
    std::iter::from_fn(move || {
        if pos >= data.len() {
            return None;
        }
        let item = match frame_at(data, pos) {
            Some((end, body)) => Item::Record {
                start: pos,
                end,
                body,
            },
            None => {
                let r = resync.get_or_insert_with(|| Resync::new(pos + 1));
                after_damage(pos, r.after(data, pos))
            }
        };
        pos = match item {
            Item::Record { end, .. } | Item::Corrupt { end, .. } => end,
            Item::Tail { .. } => data.len(),
        };
        Some(item)
    })
}

/// Bytes of marks checked by a resync's first pass; each further pass checks four times as
/// many.
const FIRST_REGION: usize = 4 << 10;

/// The intact frame starts after damage, found region by region as resyncs ask for them: a
/// region's marks are checked in one pass (see [`intact_starts_in`]); a resync's regions
/// grow fourfold while none holds an intact frame, so a resync costs about the distance to
/// the next intact frame (a few passes over it at most), and the regions already checked
/// serve the scan's later resyncs.
struct Resync {
    /// Every intact start from `from` to `covered` is in `starts`, in order.
    covered: usize,
    starts: Vec<usize>,
}

impl Resync {
    fn new(from: usize) -> Resync {
        Resync {
            covered: from,
            starts: Vec::new(),
        }
    }

    /// The first intact frame start after `pos` (the positions asked for only grow).
    fn after(&mut self, data: &[u8], pos: usize) -> Option<usize> {
        // Each resync starts small: the next intact frame is usually near.
        let mut region = FIRST_REGION;
        loop {
            let i = self.starts.partition_point(|&s| s <= pos);
            if let Some(&s) = self.starts.get(i) {
                return Some(s);
            }
            let from = self.covered.max(pos + 1);
            if from + FRAME_OVERHEAD > data.len() {
                return None;
            }
            let to = from.saturating_add(region).min(data.len());
            self.starts.extend(intact_starts_in(data, from, to));
            self.covered = to;
            region = region.saturating_mul(4);
        }
    }
}

/// Reflected CRC-32 (IEEE) polynomial.
const POLY: u32 = 0xEDB8_8320;

/// a(x) times b(x) modulo the CRC polynomial, bits reflected (zlib's `multmodp`).
const fn multmodp(a: u32, mut b: u32) -> u32 {
    if a == 0 {
        return 0;
    }
    let mut m = 1u32 << 31;
    let mut p = 0;
    loop {
        if a & m != 0 {
            p ^= b;
            if a & (m - 1) == 0 {
                return p;
            }
        }
        m >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
}

/// x^(2^k) modulo the polynomial.
const X2N: [u32; 32] = {
    let mut t = [0u32; 32];
    let mut p = 1u32 << 30;
    let mut k = 0;
    while k < 32 {
        t[k] = p;
        p = multmodp(p, p);
        k += 1;
    }
    t
};

/// x^(8n) modulo the polynomial: multiplying a checksum by it appends n zero bytes.
fn x8n(mut n: u64) -> u32 {
    let mut p = 1u32 << 31;
    let mut k = 3;
    while n != 0 {
        if n & 1 != 0 {
            p = multmodp(X2N[k & 31], p);
        }
        n >>= 1;
        k += 1;
    }
    p
}

/// The CRC-32 of `a || b` from the CRC-32s of `a` and `b` and the length of `b`.
fn combine(a: u32, b: u32, len_b: usize) -> u32 {
    multmodp(x8n(len_b as u64), a) ^ b
}

#[cfg(test)]
fn count_hashed(n: usize) {
    HASHED.with(|h| h.set(h.get() + n as u64));
}

#[cfg(not(test))]
fn count_hashed(_: usize) {}

/// Every position from `from` on where an intact frame starts, in order.
#[cfg(test)]
pub(crate) fn intact_starts(data: &[u8], from: usize) -> Vec<usize> {
    intact_starts_in(data, from, data.len())
}

/// Every position in `from..to` where an intact frame (which may end past `to`) starts, in
/// order, in time linear in the bytes checked: the marks are found in one pass, the data is
/// checksummed once (the running checksum is taken at every point where a candidate's body
/// starts or ends), and each candidate's checksum is combined from those. Checking every
/// mark by checksumming the length it declares cost a damaged stretch with a mark every few
/// bytes, each declaring megabytes, the square of its size. Memory: about 24 bytes per mark
/// whose length fits.
fn intact_starts_in(data: &[u8], from: usize, to: usize) -> Vec<usize> {
    // (start, body length, stored checksum) of every mark whose declared length fits.
    let mut candidates: Vec<(usize, usize, u32)> = Vec::new();
    let mut probe = from;
    let search_end = to.saturating_add(MARK.len() - 1).min(data.len());
    while probe < to && probe + FRAME_OVERHEAD <= data.len() {
        let Some(i) = data[probe..search_end]
            .windows(MARK.len())
            .position(|w| w == MARK)
        else {
            break;
        };
        let at = probe + i;
        probe = at + 1;
        let Some(head) = data.get(at..at + FRAME_OVERHEAD) else {
            break;
        };
        let len = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes")) as usize;
        let sum = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
        if len <= MAX_BODY && at + FRAME_OVERHEAD + len <= data.len() {
            candidates.push((at, len, sum));
        }
    }
    let mut points: Vec<usize> = candidates
        .iter()
        .flat_map(|&(at, len, _)| [at + FRAME_OVERHEAD, at + FRAME_OVERHEAD + len])
        .collect();
    points.sort_unstable();
    points.dedup();
    // CRC-32 of data[from..p] at every point p.
    let mut running = Vec::with_capacity(points.len());
    let mut hasher = crc32fast::Hasher::new();
    let mut done = from;
    for &p in &points {
        hasher.update(&data[done..p]);
        count_hashed(p - done);
        done = p;
        running.push(hasher.clone().finalize());
    }
    let at_point = |p: usize| running[points.binary_search(&p).expect("every point was taken")];
    candidates
        .into_iter()
        .filter(|&(at, len, sum)| {
            let body_start = at + FRAME_OVERHEAD;
            let shift = x8n(len as u64);
            // crc(data[s..e]) = crc(data[from..e]) ^ crc(data[from..s]) shifted by e - s.
            let body = at_point(body_start + len) ^ multmodp(shift, at_point(body_start));
            let head = crc32fast::hash(&(len as u32).to_le_bytes());
            multmodp(shift, head) ^ body == sum
        })
        .map(|(at, _, _)| at)
        .collect()
}

/// The end of a frame at `start` that is whole but whose length field is damaged: the first
/// point after its header, where a mark begins or at the end of `data`, at which the checksum
/// matches the length the bytes up to there give. `None` when there is none: no mark at
/// `start`, or the beginning of a frame that a crash cut short (no length makes a cut frame's
/// checksum match, short of a 1 in 2^32 chance).
pub fn whole_frame_end(data: &[u8], start: usize) -> Option<usize> {
    let head = data.get(start..start.checked_add(FRAME_OVERHEAD)?)?;
    if head[..4] != MARK {
        return None;
    }
    let sum = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
    let body_start = start + FRAME_OVERHEAD;
    let limit = data.len().min(body_start + MAX_BODY);
    let mut ends = Vec::new();
    let mut probe = body_start;
    while let Some(i) = data[probe..limit]
        .windows(MARK.len())
        .position(|w| w == MARK)
    {
        ends.push(probe + i);
        probe += i + 1;
    }
    if data.len() == limit {
        ends.push(limit);
    }
    let mut hasher = crc32fast::Hasher::new();
    let mut done = body_start;
    for end in ends {
        hasher.update(&data[done..end]);
        count_hashed(end - done);
        done = end;
        let len = end - body_start;
        let head = crc32fast::hash(&(len as u32).to_le_bytes());
        if combine(head, hasher.clone().finalize(), len) == sum {
            return Some(end);
        }
    }
    None
}

/// True when the bytes from `start` to the end of `data` are the beginning of a frame that
/// runs past the end: its mark (or the part of it there is) and a declared length the data
/// cannot hold, and no other length making them a whole frame (see [`whole_frame_end`]: a
/// whole frame whose length field was damaged is damage). Only that is a write cut short; a
/// frame that would fit but fails its check, or bytes without a mark, are damage.
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
    len <= MAX_BODY && FRAME_OVERHEAD + len > rest.len() && whole_frame_end(data, start).is_none()
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
    fn a_body_filled_in_place_frames_as_a_copied_one() {
        let (mut copied, mut filled) = (b"head".to_vec(), b"head".to_vec());
        encode(&mut copied, b"body bytes");
        encode_with(&mut filled, |out| {
            out.extend_from_slice(b"body bytes");
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(filled, copied);
        let failed = encode_with(&mut filled, |out| {
            out.extend_from_slice(b"partial");
            Err("no")
        });
        assert_eq!((failed, filled), (Err("no"), copied));
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

    /// A damaged segment full of marks whose declared lengths fit: each one is checked once,
    /// at a cost that does not grow with the length it declares (the resync is linear).
    #[test]
    fn resync_over_megabytes_of_false_marks_is_linear() {
        let mut data = SEGMENT_MAGIC.to_vec();
        let fakes = 4 << 20;
        while data.len() < fakes {
            data.extend_from_slice(&MARK);
            data.extend_from_slice(&(1u32 << 20).to_le_bytes());
            data.extend_from_slice(&[0xAB; 8]);
        }
        let last = data.len();
        encode(&mut data, b"the one intact record");
        HASHED.with(|h| h.set(0));
        let got = bodies(&data);
        let hashed = HASHED.with(|h| h.get());
        assert_eq!(
            got[0],
            Item::Corrupt {
                start: HEADER_LEN,
                end: last
            }
        );
        assert!(matches!(
            got[1],
            Item::Record {
                body: b"the one intact record",
                ..
            }
        ));
        assert_eq!(got.len(), 2);
        assert!(
            hashed <= 4 * data.len() as u64,
            "{hashed} bytes checksummed for a segment of {}",
            data.len()
        );
    }

    /// The resync finds exactly the frames a check of every mark would find.
    #[test]
    fn resync_agrees_with_checking_every_mark() {
        let mut data = segment(&[b"one", b"two", b"three", b"four", b"five"]);
        // A false mark inside a body, a true frame inside a body, damage between frames.
        encode(
            &mut data,
            &[&MARK[..], &[3, 0, 0, 0, 9, 9, 9, 9, 1, 2, 3]].concat(),
        );
        let mut inner = Vec::new();
        encode(&mut inner, b"inner");
        encode(&mut data, &inner);
        encode(&mut data, b"six");
        for at in HEADER_LEN..data.len() {
            let mut d = data.clone();
            d[at] ^= 0x41;
            let slow: Vec<usize> = (0..d.len())
                .filter(|&p| frame_at(&d, p).is_some())
                .collect();
            for from in [HEADER_LEN, at.saturating_sub(5).max(HEADER_LEN)] {
                let fast = intact_starts(&d, from);
                let want: Vec<usize> = slow.iter().copied().filter(|&p| p >= from).collect();
                assert_eq!(fast, want, "flip at {at}, from {from}");
            }
        }
    }

    /// The last frame's length damaged so that it runs past the end: the frame is whole (its
    /// checksum matches the length the file holds), so it is damage, not a torn write.
    #[test]
    fn a_damaged_length_in_the_last_frame_is_not_a_torn_tail() {
        let data = segment(&[b"one", b"two-and-more"]);
        let last = HEADER_LEN + FRAME_OVERHEAD + 3;
        for bit in [0x01u8, 0x10, 0x80] {
            for byte in 4..8 {
                let mut d = data.clone();
                d[last + byte] ^= bit;
                let len = u32::from_le_bytes(d[last + 4..last + 8].try_into().unwrap()) as usize;
                if len > MAX_BODY || FRAME_OVERHEAD + len <= d.len() - last {
                    continue;
                }
                assert!(!runs_past_end(&d, last), "bit {bit:#x} of byte {byte}");
                assert_eq!(whole_frame_end(&d, last), Some(d.len()));
            }
        }
        // The same frame followed by a torn append: the frame ends where the next mark is.
        let mut d = data.clone();
        d[last + 6] ^= 0x01;
        let end = d.len();
        encode(&mut d, b"torn-append");
        d.truncate(d.len() - 4);
        assert_eq!(whole_frame_end(&d, last), Some(end));
        assert!(runs_past_end(&d, end));
        // A true torn tail: no length makes its checksum match.
        for cut in last + 1..data.len() {
            assert!(runs_past_end(&data[..cut], last), "cut at {cut}");
            assert_eq!(whole_frame_end(&data[..cut], last), None);
        }
    }

    #[test]
    fn combining_checksums_matches_hashing_the_whole() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for split in [0, 1, 4, 100, 4095, 5000] {
            let (a, b) = data.split_at(split);
            let joined = combine(crc32fast::hash(a), crc32fast::hash(b), b.len());
            assert_eq!(joined, crc32fast::hash(&data), "split at {split}");
        }
    }

    /// A drain reads a segment a step at a time, each step a fresh scan: with damage in every
    /// step, each resync costs about the distance to the next intact frame, not the rest of
    /// the data (which made the drain's steps together quadratic).
    #[test]
    fn resyncs_step_after_step_cost_the_distance_not_the_rest() {
        let mut data = SEGMENT_MAGIC.to_vec();
        while data.len() < 1 << 20 {
            encode(&mut data, &[b'r'; 100]);
        }
        let starts: Vec<usize> = bodies(&data)
            .iter()
            .map(|i| match i {
                Item::Record { start, .. } => *start,
                other => panic!("{other:?}"),
            })
            .collect();
        // Every tenth record's body damaged.
        let damaged = starts.iter().skip(5).step_by(10).count();
        for &start in starts.iter().skip(5).step_by(10) {
            data[start + FRAME_OVERHEAD] ^= 1;
        }
        HASHED.with(|h| h.set(0));
        let (mut pos, mut records) = (HEADER_LEN, 0);
        while pos < data.len() {
            let mut step = 0;
            for item in items(&data, pos) {
                pos = match item {
                    Item::Record { end, .. } => end,
                    Item::Corrupt { end, .. } => end,
                    Item::Tail { .. } => data.len(),
                };
                if matches!(item, Item::Record { .. }) {
                    (records, step) = (records + 1, step + 1);
                }
                if step == 50 {
                    break;
                }
            }
        }
        let hashed = HASHED.with(|h| h.get());
        assert_eq!(records, starts.len() - damaged);
        assert!(
            hashed <= 4 * data.len() as u64,
            "{hashed} bytes checksummed for {}",
            data.len()
        );
    }
}
