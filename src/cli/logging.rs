//! Log setup shared by the binaries: level from config (RUST_LOG wins when set), and every
//! line names its thread, so a log reads like the pipeline design.
//!
//! Our own lines wrap peer text where it enters (`PeerText`); lines of the broker client crate
//! can quote the broker verbatim (an unknown protocol line, a whole JetStream API answer), so
//! they are bounded and escaped here as a whole when RUST_LOG turns them on.

use std::io::Write;

use crate::text::peer::PeerText;

/// Characters of one line of the broker client crate shown at most.
const CRATE_LINE_MAX_CHARS: usize = 1024;

pub fn init(level: log::LevelFilter) {
    let mut builder = env_logger::Builder::new();
    builder.filter_level(level);
    // The broker client logs every JetStream API error answer (e.g. "consumer not found")
    // at ERROR, even when we handle it; our own callbacks report connection events. Its
    // lines appear only when RUST_LOG asks for them.
    builder.filter_module("nats", log::LevelFilter::Off);
    if let Ok(spec) = std::env::var("RUST_LOG") {
        builder.parse_filters(&spec);
    }
    builder.format(|buf, record| {
        let ts = buf.timestamp_millis();
        let thread = std::thread::current();
        let (level, name) = (record.level(), thread.name().unwrap_or("main"));
        if record.target().starts_with("nats") {
            let text = record.args().to_string();
            let shown = PeerText::with_limit(&text, CRATE_LINE_MAX_CHARS);
            return writeln!(buf, "{ts} {level:<5} [{name}] {shown}");
        }
        writeln!(buf, "{ts} {level:<5} [{name}] {}", record.args())
    });
    let _ = builder.try_init();
}
