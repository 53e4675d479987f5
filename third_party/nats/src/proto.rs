// Copyright 2020-2022 The NATS Authors
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
// http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

use std::convert::TryFrom;
use std::io::prelude::*;
use std::io::{self, Error, ErrorKind};
use std::str::{self, FromStr};

use crate::connect::ConnectInfo;
use crate::{header::HeaderMap, inject_io_failure, ServerInfo};

/// A protocol operation sent by the server.
#[derive(Debug)]
pub(crate) enum ServerOp {
    /// `INFO {["option_name":option_value],...}`
    Info(ServerInfo),

    /// `MSG <subject> <sid> [reply-to] <#bytes>\r\n[payload]\r\n`
    Msg {
        subject: String,
        sid: u64,
        reply_to: Option<String>,
        payload: Vec<u8>,
        /// What could not be read as sent (see [`crate::Message::unreadable`]).
        unreadable: Option<&'static str>,
    },

    /// `HMSG <subject> <sid> [reply-to] <# header bytes> <# total
    /// bytes>\r\n<version line>\r\n[headers]\r\n\r\n[payload]\r\n`
    Hmsg {
        subject: String,
        headers: HeaderMap,
        sid: u64,
        reply_to: Option<String>,
        payload: Vec<u8>,
        /// What could not be read as sent (see [`crate::Message::unreadable`]).
        unreadable: Option<&'static str>,
    },

    /// `PING`
    Ping,

    /// `PONG`
    Pong,

    /// `-ERR <error message>`
    Err(String),

    /// Unknown protocol message.
    Unknown(String),
}

impl ServerOp {
    /// What the operation is, for an error an operator reads: its name, and for `-ERR` and an
    /// unknown operation the server's text, which the caller shows as peer text (escaped and
    /// bounded), never with `Debug`.
    pub(crate) fn describe(&self) -> String {
        match self {
            ServerOp::Info(_) => "INFO".into(),
            ServerOp::Msg { .. } => "MSG".into(),
            ServerOp::Hmsg { .. } => "HMSG".into(),
            ServerOp::Ping => "PING".into(),
            ServerOp::Pong => "PONG".into(),
            ServerOp::Err(text) => format!("-ERR '{text}'"),
            ServerOp::Unknown(line) => format!("an unknown operation: {line}"),
        }
    }
}

/// Longest control line read from the server (`MSG`/`HMSG` carry the subject and the reply
/// subject). A publisher's subject can be as long as the server's `max_control_line` allows
/// for its own `PUB` line (4 KiB by default), so the server's line to us is longer than that;
/// a fixed 4 KiB buffer made such a message drop the connection, again on every redelivery.
pub(crate) const MAX_CONTROL_LINE: u64 = 1024 * 1024;

/// Largest payload (headers included) read for one message: the server's own hard limit on
/// `max_payload` is 64 MiB. A larger announced size is a broken or hostile server.
pub(crate) const MAX_MESSAGE_BYTES: u32 = 64 * 1024 * 1024;

fn invalid(what: &'static str) -> Error {
    Error::new(ErrorKind::InvalidInput, what)
}

/// Most arguments a control line that is read has (`HMSG` with a reply subject).
const MAX_ARGS: usize = 6;

/// The first [`MAX_ARGS`] arguments of a control line and how many it has in all (no list
/// allocated per line: one per delivered message added up). The protocol's argument
/// separators are ASCII space and tab only: a subject may hold any other byte (a non-breaking
/// space in `orders.café menu` is not a separator).
fn args(line: &[u8]) -> ([&[u8]; MAX_ARGS], usize) {
    let mut out: [&[u8]; MAX_ARGS] = [&[]; MAX_ARGS];
    let mut count = 0;
    for arg in line
        .split(|b| *b == b' ' || *b == b'\t')
        .filter(|a| !a.is_empty())
    {
        if let Some(slot) = out.get_mut(count) {
            *slot = arg;
        }
        count += 1;
    }
    (out, count)
}

fn number<T: FromStr>(arg: &[u8], what: &'static str) -> io::Result<T> {
    str::from_utf8(arg)
        .ok()
        .and_then(|a| T::from_str(a).ok())
        .ok_or_else(|| invalid(what))
}

/// A subject as text; one that is not UTF-8 is kept lossily, with the reason.
fn subject_text(arg: &[u8], what: &'static str, unreadable: &mut Option<&'static str>) -> String {
    match str::from_utf8(arg) {
        Ok(s) => s.to_string(),
        Err(_) => {
            unreadable.get_or_insert(what);
            String::from_utf8_lossy(arg).into_owned()
        }
    }
}

/// Decodes a single operation from the server.
///
/// If the connection is closed, `None` will be returned. A message whose subject, reply
/// subject or headers cannot be read as this client reads them is still returned, marked
/// `unreadable` with the reason: the connection is never dropped for what a publisher sent.
pub(crate) fn decode(stream: impl BufRead) -> io::Result<Option<ServerOp>> {
    decode_with(stream, &mut Vec::with_capacity(256))
}

/// Largest control-line buffer [`decode_with`] keeps from one line to the next.
const KEPT_LINE_CAPACITY: usize = 16 * 1024;

/// [`decode`] with the control line read into `line` (cleared first): the client's reader
/// keeps one buffer for every line rather than allocating one per delivered message.
pub(crate) fn decode_with(
    mut stream: impl BufRead,
    line: &mut Vec<u8>,
) -> io::Result<Option<ServerOp>> {
    // Inject random I/O failures when testing.
    inject_io_failure()?;

    if line.capacity() > KEPT_LINE_CAPACITY {
        // One long subject must not pin a megabyte for the connection's life.
        *line = Vec::with_capacity(256);
    }
    line.clear();
    let read = (&mut stream)
        .take(MAX_CONTROL_LINE)
        .read_until(b'\n', line)?;
    if read == 0 {
        // If zero bytes were read, the connection is closed.
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        return Err(if read as u64 == MAX_CONTROL_LINE {
            invalid("received command exceeded the control line limit")
        } else {
            Error::new(
                ErrorKind::UnexpectedEof,
                "connection closed inside a command",
            )
        });
    }
    while matches!(line.last(), Some(b'\n' | b'\r')) {
        line.pop();
    }
    let line: &[u8] = line;
    let (arguments, count) = args(line);
    // The operation's name, compared without case (no upper-cased copy per line).
    let op = if count > 0 { arguments[0] } else { b"" };
    let named = |name: &[u8]| op.eq_ignore_ascii_case(name);
    let with_headers = named(b"HMSG");

    match () {
        _ if with_headers || named(b"MSG") => {}
        _ if named(b"PING") => return Ok(Some(ServerOp::Ping)),
        _ if named(b"PONG") => return Ok(Some(ServerOp::Pong)),
        _ if named(b"INFO") => {
            // The handshake's bound holds for every INFO: a server's asynchronous INFO lines
            // (cluster changes) are as small as its first one.
            if line.len() >= crate::connector::MAX_INFO_LINE {
                return Err(invalid("server info exceeded 64 KiB"));
            }
            let text = str::from_utf8(line).map_err(|_| invalid("server info is not UTF-8"))?;
            // Parse the JSON-formatted server information.
            let server_info = ServerInfo::parse(text["INFO".len()..].trim_start())
                .ok_or_else(|| invalid("cannot parse server info"))?;
            return Ok(Some(ServerOp::Info(server_info)));
        }
        _ if named(b"-ERR") => {
            // Extract the message argument (the server's text, shown escaped by callers).
            let text = String::from_utf8_lossy(line);
            let msg = text["-ERR".len()..].trim().trim_matches('\'').to_string();
            return Ok(Some(ServerOp::Err(msg)));
        }
        _ => {
            return Ok(Some(ServerOp::Unknown(
                String::from_utf8_lossy(line).into_owned(),
            )))
        }
    }

    // `MSG <subject> <sid> [reply-to] <#bytes>` or
    // `HMSG <subject> <sid> [reply-to] <# header bytes> <# total bytes>`
    let fixed = if with_headers { 5 } else { 4 };
    // Invariant: `count` is at most `fixed + 1` <= MAX_ARGS below, so every argument is held.
    let (subject, sid, reply_to, sizes) = match count {
        n if n == fixed => (arguments[1], arguments[2], None, &arguments[3..n]),
        n if n == fixed + 1 => (
            arguments[1],
            arguments[2],
            Some(arguments[3]),
            &arguments[4..n],
        ),
        _ => return Err(invalid("invalid number of arguments after MSG or HMSG")),
    };
    let mut unreadable = None;
    let subject = subject_text(subject, "the subject is not UTF-8", &mut unreadable);
    let sid: u64 = number(sid, "cannot parse sid argument after MSG or HMSG")?;
    let reply_to =
        reply_to.map(|r| subject_text(r, "the reply subject is not UTF-8", &mut unreadable));
    let (num_header_bytes, num_bytes): (u32, u32) = if with_headers {
        (
            number(
                sizes[0],
                "cannot parse the number of header bytes after HMSG",
            )?,
            number(sizes[1], "cannot parse the number of bytes after HMSG")?,
        )
    } else {
        (
            0,
            number(sizes[0], "cannot parse the number of bytes after MSG")?,
        )
    };
    if num_bytes < num_header_bytes {
        return Err(invalid(
            "number of header bytes was greater than the total number of bytes after HMSG",
        ));
    }
    if num_bytes > MAX_MESSAGE_BYTES {
        return Err(invalid("message larger than the server's 64 MiB maximum"));
    }

    let mut header_payload = vec![0_u8; num_header_bytes as usize];
    stream.read_exact(&mut header_payload[..])?;
    let mut payload = vec![0_u8; (num_bytes - num_header_bytes) as usize];
    stream.read_exact(&mut payload[..])?;
    // Read "\r\n".
    stream.read_exact(&mut [0_u8; 2])?;

    if !with_headers {
        return Ok(Some(ServerOp::Msg {
            subject,
            sid,
            reply_to,
            payload,
            unreadable,
        }));
    }
    let (headers, why) = crate::header::read_headers(&header_payload);
    if let Some(why) = why {
        unreadable.get_or_insert(why);
    }
    Ok(Some(ServerOp::Hmsg {
        subject,
        headers,
        sid,
        reply_to,
        payload,
        unreadable,
    }))
}

/// A protocol operation sent by the client.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ClientOp<'a> {
    /// `CONNECT {["option_name":option_value],...}`
    Connect(&'a ConnectInfo),

    /// `PUB <subject> [reply-to] <#bytes>\r\n[payload]\r\n`
    Pub {
        subject: &'a str,
        reply_to: Option<&'a str>,
        payload: &'a [u8],
    },

    /// `HPUB <subject> [reply-to] <#bytes>\r\n[payload]\r\n`
    Hpub {
        subject: &'a str,
        reply_to: Option<&'a str>,
        headers: &'a HeaderMap,
        payload: &'a [u8],
    },

    /// `SUB <subject> [queue group] <sid>\r\n`
    Sub {
        subject: &'a str,
        queue_group: Option<&'a str>,
        sid: u64,
    },

    /// `UNSUB <sid> [max_msgs]`
    Unsub { sid: u64, max_msgs: Option<u64> },

    /// `PING`
    Ping,

    /// `PONG`
    Pong,
}

/// Encodes a single operation from the client.
pub(crate) fn encode(mut stream: impl Write, op: ClientOp<'_>) -> io::Result<()> {
    match &op {
        ClientOp::Connect(connect_info) => {
            let op = format!(
                "CONNECT {}\r\n",
                connect_info.dump().ok_or_else(|| Error::new(
                    ErrorKind::InvalidData,
                    "cannot serialize connect info"
                ))?
            );
            stream.write_all(op.as_bytes())?;
        }

        ClientOp::Pub {
            subject,
            reply_to,
            payload,
        } => {
            stream.write_all(b"PUB ")?;
            stream.write_all(subject.as_bytes())?;
            stream.write_all(b" ")?;

            if let Some(reply_to) = reply_to {
                stream.write_all(reply_to.as_bytes())?;
                stream.write_all(b" ")?;
            }

            let mut buf = itoa::Buffer::new();
            stream.write_all(buf.format(payload.len()).as_bytes())?;
            stream.write_all(b"\r\n")?;

            stream.write_all(payload)?;
            stream.write_all(b"\r\n")?;
        }

        ClientOp::Hpub {
            subject,
            reply_to,
            headers,
            payload,
        } => {
            stream.write_all(b"HPUB ")?;
            stream.write_all(subject.as_bytes())?;
            stream.write_all(b" ")?;

            if let Some(reply_to) = reply_to {
                stream.write_all(reply_to.as_bytes())?;
                stream.write_all(b" ")?;
            }

            let header_bytes = headers.to_bytes();

            let header_len = header_bytes.len();
            let total_len = header_len + payload.len();

            let mut hlen_buf = itoa::Buffer::new();
            stream.write_all(hlen_buf.format(header_len).as_bytes())?;

            stream.write_all(b" ")?;

            let mut tlen_buf = itoa::Buffer::new();
            stream.write_all(tlen_buf.format(total_len).as_bytes())?;

            stream.write_all(b"\r\n")?;

            stream.write_all(&header_bytes)?;
            stream.write_all(payload)?;
            stream.write_all(b"\r\n")?;
        }

        ClientOp::Sub {
            subject,
            queue_group,
            sid,
        } => {
            let op = if let Some(queue_group) = queue_group {
                format!("SUB {subject} {queue_group} {sid}\r\n")
            } else {
                format!("SUB {subject} {sid}\r\n")
            };
            stream.write_all(op.as_bytes())?;
        }

        ClientOp::Unsub { sid, max_msgs } => {
            let op = if let Some(max_msgs) = max_msgs {
                format!("UNSUB {sid} {max_msgs}\r\n")
            } else {
                format!("UNSUB {sid}\r\n")
            };
            stream.write_all(op.as_bytes())?;
        }

        ClientOp::Ping => {
            stream.write_all(b"PING\r\n")?;
        }

        ClientOp::Pong => {
            stream.write_all(b"PONG\r\n")?;
        }
    }

    Ok(())
}

/// A message as [`decode`] returned it, for svc's tests and fuzz target: subject, reply
/// subject, the `unreadable` reason, header pairs and the payload's length.
#[doc(hidden)]
pub type DecodedMessage = (
    String,
    Option<String>,
    Option<&'static str>,
    Vec<(String, String)>,
    usize,
);

/// Decodes every operation in `bytes`, read through a buffer of `chunk` bytes (so a command
/// arrives split across reads as it does from a socket), and returns the messages, or the
/// error that would close the connection. Not an API: svc's hostile-input tests and fuzz
/// target call it.
#[doc(hidden)]
pub fn decode_all(bytes: &[u8], chunk: usize) -> io::Result<Vec<DecodedMessage>> {
    let mut reader = io::BufReader::with_capacity(chunk.max(1), bytes);
    let mut out = Vec::new();
    while let Some(op) = decode(&mut reader)? {
        match op {
            ServerOp::Msg {
                subject,
                reply_to,
                payload,
                unreadable,
                ..
            } => out.push((subject, reply_to, unreadable, Vec::new(), payload.len())),
            ServerOp::Hmsg {
                subject,
                reply_to,
                payload,
                unreadable,
                headers,
                ..
            } => {
                let mut pairs: Vec<(String, String)> = headers
                    .iter()
                    .flat_map(|(k, vs)| vs.iter().map(move |v| (k.clone(), v.clone())))
                    .collect();
                pairs.sort();
                if let Some(status) = headers.status() {
                    pairs.insert(0, ("(status)".into(), status.to_string()));
                }
                out.push((subject, reply_to, unreadable, pairs, payload.len()))
            }
            _ => {}
        }
    }
    Ok(out)
}
