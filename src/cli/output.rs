//! Standard output of the commands that print: a closed pipe (`svc verify-custody ... | head`)
//! ends the command quietly with the shell's SIGPIPE status instead of a panic, which is what
//! `println!` does on a write error.

use std::io::{self, Write};
use std::process::ExitCode;

/// The status a shell shows for a process ended by SIGPIPE (128 + 13).
pub const EXIT_CLOSED_PIPE: u8 = 141;

/// Writes `text` to standard output.
pub fn print(text: std::fmt::Arguments<'_>) -> io::Result<()> {
    io::stdout().lock().write_fmt(text)
}

/// The exit of a command whose standard output failed: quiet for a reader that left, an
/// error otherwise (a full disk behind a redirection is worth saying).
pub fn write_failed(e: &io::Error) -> ExitCode {
    write_failed_as("svc", e)
}

/// [`write_failed`] for the program `program` (`svc-observe` treats its output the same way).
pub fn write_failed_as(program: &str, e: &io::Error) -> ExitCode {
    if e.kind() == io::ErrorKind::BrokenPipe {
        ExitCode::from(EXIT_CLOSED_PIPE)
    } else {
        eprintln!("{program}: cannot write to standard output: {e}");
        ExitCode::from(1)
    }
}

/// `println!` for a function returning `ExitCode`: returns [`write_failed`]'s exit when the
/// write fails.
macro_rules! say {
    ($($arg:tt)*) => {
        if let Err(e) = $crate::cli::output::print(format_args!("{}\n", format_args!($($arg)*))) {
            return $crate::cli::output::write_failed(&e);
        }
    };
}
pub(crate) use say;
