//! `svc`: the runner. All logic lives in the library; see `svc::cli::svc`.

fn main() -> std::process::ExitCode {
    svc::cli::svc::main(std::env::args_os())
}
