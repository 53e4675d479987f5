//! Log setup shared by the binaries: level from config (RUST_LOG wins when set), and every
//! line names its thread, so a log reads like the pipeline design.

use std::io::Write;

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
        writeln!(
            buf,
            "{ts} {:<5} [{}] {}",
            record.level(),
            thread.name().unwrap_or("main"),
            record.args()
        )
    });
    let _ = builder.try_init();
}
