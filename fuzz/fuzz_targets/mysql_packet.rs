//! MySQL/MariaDB server packets (src/sink/relational/mysql/): the database server, or whatever
//! answers on its address, controls every byte the client reads.
//!
//! The input is a byte stream read as packets with `packet::read_packet` (framing, sequence
//! ids, 16 MiB continuation, the logical packet bound), and every packet goes through every
//! parser (`packet::parse_any`: handshake v10, OK, ERR, EOF, query answer head, text row).
//! Properties: no panic, no hang; every error renders without control characters and bounded;
//! no packet larger than `MAX_PACKET_BYTES` is returned; sequence ids advance by one per
//! fragment.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc::db::mysql::packet::{parse_any, read_packet, MAX_PACKET_BYTES};
use svc_fuzz::{assert_clean_display, MAX_ERROR_CHARS};

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    let mut seq = data.get(3).copied().unwrap_or(0);
    loop {
        let before = seq;
        match read_packet(&mut rest, &mut seq) {
            Ok(p) => {
                assert!(p.len() <= MAX_PACKET_BYTES);
                assert_ne!(before, seq, "the sequence id advances");
                parse_any(&p);
            }
            Err(e) => {
                assert_clean_display("mysql packet", &e.to_string(), MAX_ERROR_CHARS);
                return;
            }
        }
    }
});
