//! `svc-observe`: the metrics exporter. Reads the runner's snapshot and the observability
//! policy only. See `docs/observe.md`.

fn main() -> std::process::ExitCode {
    svc::cli::observe::main()
}
