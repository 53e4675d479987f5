//! The carried `nats` client's protocol parser (third_party/nats/src/proto.rs, header.rs)
//! against what a publisher can put into a message: every message the broker delivers comes
//! out, readable or marked `unreadable` with a reason; nothing a publisher sends closes the
//! connection or panics the reader, whatever the read sizes.

use nats::decode_all;

/// `HMSG` as the server writes it: subject, sid 1, an ack reply subject, a header block, a
/// payload.
fn hmsg(subject: &[u8], headers: &[u8], payload: &[u8]) -> Vec<u8> {
    let reply = b"$JS.ACK.S.c.1.7.7.1700000000000000000.0";
    let mut out = b"HMSG ".to_vec();
    out.extend_from_slice(subject);
    out.extend_from_slice(b" 1 ");
    out.extend_from_slice(reply);
    out.extend_from_slice(
        format!(" {} {}\r\n", headers.len(), headers.len() + payload.len()).as_bytes(),
    );
    out.extend_from_slice(headers);
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
    out
}

fn msg(subject: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut out = b"MSG ".to_vec();
    out.extend_from_slice(subject);
    out.extend_from_slice(format!(" 1 $JS.ACK.S.c.1.8.8.0.0 {}\r\n", payload.len()).as_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
    out
}

/// Each case, then a plain message: both come out, at every read size.
fn decoded(frame: &[u8]) -> nats::DecodedMessage {
    let mut stream = frame.to_vec();
    stream.extend_from_slice(&msg(b"orders.after", b"{}"));
    let mut first = None;
    for chunk in [1, 7, 4096, 1 << 20] {
        let out = decode_all(&stream, chunk).unwrap_or_else(|e| panic!("chunk {chunk}: {e}"));
        assert_eq!(out.len(), 2, "chunk {chunk}");
        assert_eq!(out[1].0, "orders.after");
        assert!(out[1].2.is_none());
        first = Some(out[0].clone());
    }
    first.unwrap()
}

#[test]
fn long_subjects_come_out_whole_even_across_reads() {
    for len in [4_077, 10_000, 100_000] {
        let subject = format!("orders.{}", "x".repeat(len));
        let m = decoded(&msg(subject.as_bytes(), b"{}"));
        assert_eq!(m.0, subject);
        assert_eq!(m.2, None);
    }
    // Beyond the control-line bound: a connection error, never a panic.
    let huge = msg(&vec![b'x'; 2 << 20], b"{}");
    for chunk in [7, 4096] {
        assert!(decode_all(&huge, chunk).is_err());
    }
}

#[test]
fn only_ascii_space_and_tab_separate_arguments() {
    let subject = "orders.caf\u{e9}\u{a0}menu";
    let m = decoded(&hmsg(subject.as_bytes(), b"NATS/1.0\r\nA: b\r\n\r\n", b"x"));
    assert_eq!((m.0.as_str(), m.2), (subject, None));
    assert_eq!(m.3, [("A".to_string(), "b".to_string())]);
}

#[test]
fn what_cannot_be_read_is_delivered_with_its_reason() {
    for (frame, why) in [
        (msg(b"orders.\xff", b"{}"), "the subject is not UTF-8"),
        (
            hmsg(b"orders.a", b"NATS/1.0\r\nX: \xff\r\n\r\n", b"{}"),
            "a header is not UTF-8",
        ),
        (
            hmsg(b"orders.a", b"NATS/1.0\r\nno colon here\r\n\r\n", b"{}"),
            "a header line has no ':'",
        ),
        (
            hmsg(b"orders.a", b"NATS/1.0\r\n folded first\r\n\r\n", b"{}"),
            "a header line is folded (starts with a space or tab)",
        ),
        (
            hmsg(b"orders.a", b"HTTP/1.1\r\nX: a\r\n\r\n", b"{}"),
            "the version line does not begin with NATS/1.0",
        ),
    ] {
        let m = decoded(&frame);
        assert_eq!(m.2, Some(why));
        assert!(
            m.3.is_empty(),
            "headers of an unreadable message: {:?}",
            m.3
        );
        assert_eq!(m.4, 2, "the payload still comes out");
    }
    assert_eq!(decoded(&msg(b"orders.\xff", b"{}")).0, "orders.\u{fffd}");
}

/// The broker reads `Nats-Msg-Id` where its bytes first appear, and only at a line start
/// followed by `:`; a block where it and this client would read different ids is refused.
#[test]
fn the_message_id_is_read_as_the_broker_reads_it_or_refused() {
    let differently = Some("the broker and this client would read Nats-Msg-Id differently");
    for (block, want) in [
        (&b"NATS/1.0\r\nNats-Msg-Id: a\r\nX: b\r\n\r\n"[..], None),
        (b"NATS/1.0\r\nX: b\r\n\r\n", None),
        (
            b"NATS/1.0\r\nX-Note: Nats-Msg-Id\r\nNats-Msg-Id: real\r\n\r\n",
            differently,
        ),
        (
            b"NATS/1.0\r\nNats-Msg-Id: a\r\nNats-Msg-Id: b\r\n\r\n",
            differently,
        ),
        (
            b"NATS/1.0\r\nNats-Msg-Id-Extra: x\r\nNats-Msg-Id: y\r\n\r\n",
            differently,
        ),
        (b"NATS/1.0\r\nNats-Msg-Id : y\r\n\r\n", differently),
        (b"NATS/1.0\r\nNats-Msg-Id: a\r\n b\r\n\r\n", differently),
        (b"NATS/1.0\r\nX: a\nNats-Msg-Id: b\r\n\r\n", differently),
        (b"NATS/1.0\r\nNats-Msg-Id: a\rb\r\n\r\n", differently),
    ] {
        assert_eq!(
            decoded(&hmsg(b"orders.a", block, b"{}")).2,
            want,
            "{}",
            String::from_utf8_lossy(block)
        );
    }
}

/// The client folds a header value holding a line break when it publishes: such a value is
/// unfolded as before (only a folded message id is refused, above).
#[test]
fn folded_values_are_unfolded() {
    for block in [
        &b"NATS/1.0\r\nX: one,\r\n  two\r\n\r\n"[..],
        // As the client publishes a value holding a line break.
        b"NATS/1.0\r\nX: one,\n  two\r\n\r\n",
    ] {
        let m = decoded(&hmsg(b"orders.a", block, b"{}"));
        assert_eq!(m.2, None);
        assert_eq!(m.3, [("X".to_string(), "one, two".to_string())]);
    }
}

/// Only the server's version line carries a status: a publisher's `Status: 404` header is a
/// header (the published crate read it as "no messages" and dropped the message).
#[test]
fn a_publishers_status_header_is_not_a_status() {
    let m = decoded(&hmsg(b"orders.a", b"NATS/1.0\r\nStatus: 404\r\n\r\n", b""));
    assert_eq!(m.3, [("Status".to_string(), "404".to_string())]);
    let m = decoded(&hmsg(
        b"_INBOX.x",
        b"NATS/1.0 408 Request Timeout\r\n\r\n",
        b"",
    ));
    assert_eq!(m.3, [("(status)".to_string(), "408".to_string())]);
}

#[test]
fn a_server_announcing_more_than_64_mib_is_refused() {
    let frame = b"MSG a 1 67108865\r\n".to_vec();
    let e = decode_all(&frame, 4096).unwrap_err();
    assert!(e.to_string().contains("64 MiB"), "{e}");
}

/// Any bytes a publisher chooses for the subject (no separator or line end) and the header
/// block (no CRLF CRLF inside) decode to a message, at random read sizes.
#[test]
fn random_publisher_bytes_never_close_the_connection() {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..3_000 {
        let len = (next() % 40) as usize + 1;
        let subject: Vec<u8> = (0..len)
            .map(|_| next() as u8)
            .map(|b| if b" \t\r\n".contains(&b) { b'_' } else { b })
            .collect();
        let mut block = b"NATS/1.0\r\n".to_vec();
        for _ in 0..(next() % 6) {
            block.extend((0..(next() % 20)).map(|_| next() as u8));
            block.extend_from_slice(b"\r\n");
        }
        block.extend_from_slice(b"\r\n");
        if block.windows(4).filter(|w| w == b"\r\n\r\n").count() > 1 {
            continue;
        }
        let frame = hmsg(&subject, &block, b"p");
        let chunk = (next() % 64) as usize + 1;
        let out = decode_all(&frame, chunk).unwrap_or_else(|e| {
            panic!("{e}: {:?}", String::from_utf8_lossy(&frame));
        });
        assert_eq!(out.len(), 1);
        // A header block that cannot be read yields no headers at all.
        if out[0].2.is_some() && std::str::from_utf8(&subject).is_ok() {
            assert!(out[0].3.is_empty(), "{:?}", out[0]);
        }
    }
}

/// A header block of many small lines: lines and bytes are counted as sent (a repeated line
/// each time), and over svc's input limits no map is built at all.
#[test]
fn header_lines_are_counted_as_sent_and_no_map_is_built_over_the_bound() {
    let block = |lines: &[String]| {
        let mut b = "NATS/1.0\r\n".to_string();
        for l in lines {
            b.push_str(l);
            b.push_str("\r\n");
        }
        b.push_str("\r\n");
        b.into_bytes()
    };
    // 8,000 distinct one-byte values: refused before the map, the count says how many.
    let many: Vec<String> = (0..8_000).map(|i| format!("a:{i}")).collect();
    let (map, why) = nats::header::read_headers(&block(&many));
    assert_eq!(why, Some(nats::header::TOO_MANY_LINES));
    assert!(map.is_empty());
    assert_eq!(map.counted().lines, 8_000);
    // 1,000 identical lines: one pair in a map would pass a bound on pairs; the count is 1,000.
    let same = vec!["X-Same: 1".to_string(); 1_000];
    let (map, why) = nats::header::read_headers(&block(&same));
    assert_eq!(why, Some(nats::header::TOO_MANY_LINES));
    assert!(map.is_empty());
    assert_eq!(map.counted().lines, 1_000);
    assert_eq!(map.counted().bytes, 1_000 * 7);
    // Three identical lines are read (one pair), and counted three times.
    let (map, why) = nats::header::read_headers(&block(&same[..3]));
    assert_eq!(why, None);
    assert_eq!(map.len(), 1);
    assert_eq!(map.counted().lines, 3);
    // Bytes: 40,000 in one value is over the bytes bound, whatever the line count.
    let big = vec![format!("X-Big: {}", "b".repeat(40_000))];
    let (map, why) = nats::header::read_headers(&block(&big));
    assert_eq!(why, Some(nats::header::TOO_MANY_BYTES));
    assert!(map.is_empty());
    // At the bounds a block is still read.
    let at: Vec<String> = (0..256).map(|i| format!("a:{i}")).collect();
    assert_eq!(nats::header::read_headers(&block(&at)).1, None);
}
