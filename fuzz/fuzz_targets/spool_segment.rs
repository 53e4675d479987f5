//! Spool segments read back at start-up, by the drain and by `svc spool status|inspect`
//! (src/sink/spool/frame.rs, codec.rs): files the service owns, but a crash may leave any
//! prefix of a write in them and the disk (or an operator with an editor) any damage.
//!
//! The input is a segment's bytes after its header. Every item the reader yields is walked;
//! each record body goes through the codec's decoder, and a decoded envelope is encoded again.
//!
//! Properties: no panic; items tile the input exactly (each starts where the last ended, the
//! last ends at the input's end); a `Record` is a frame that encodes back to the same bytes; a
//! `Corrupt` stretch is followed by an intact record; a decoded envelope encodes to a body
//! that decodes to the same envelope (the drain writes what was spooled); the decoder's error
//! is a short fixed text (never the data).
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc::sink::spool::{codec, frame};

fuzz_target!(|data: &[u8]| {
    let mut seg = frame::SEGMENT_MAGIC.to_vec();
    seg.extend_from_slice(data);
    let mut pos = frame::HEADER_LEN;
    let items: Vec<frame::Item<'_>> = frame::items(&seg, pos).collect();
    for (i, item) in items.iter().enumerate() {
        match *item {
            frame::Item::Record { start, end, body } => {
                assert_eq!(start, pos);
                let mut again = Vec::new();
                frame::encode(&mut again, body);
                assert_eq!(&seg[start..end], &again[..]);
                pos = end;
                match codec::decode(body) {
                    Ok(env) => {
                        let ms = codec::appended_unix_ms(body).expect("a decoded body has a prefix");
                        let mut out = Vec::new();
                        codec::encode(&mut out, &env, ms).expect("a decoded envelope encodes");
                        assert_eq!(codec::decode(&out).expect("re-encoded body decodes"), env);
                    }
                    Err(why) => assert!(why.len() < 40 && !why.is_empty()),
                }
            }
            frame::Item::Corrupt { start, end } => {
                assert_eq!(start, pos);
                assert!(end > start);
                assert!(matches!(items.get(i + 1), Some(frame::Item::Record { start: s, .. }) if *s == end));
                pos = end;
            }
            frame::Item::Tail { start } => {
                assert_eq!(start, pos);
                assert_eq!(i + 1, items.len());
                pos = seg.len();
            }
        }
    }
    assert_eq!(pos, seg.len().max(frame::HEADER_LEN));
});
