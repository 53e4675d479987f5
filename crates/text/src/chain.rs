//! An error and its causes on one line: each error's `Display` says only its own part and
//! `source()` hands on the cause, so the chain is printed once, where it is printed.

use std::error::Error;

/// `e` followed by each of its sources, joined with ": " (the line the cause used to be
/// flattened into).
pub fn error_chain(e: &dyn Error) -> String {
    let mut line = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        line.push_str(": ");
        line.push_str(&cause.to_string());
        next = cause.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt;
    use std::io;

    #[derive(Debug)]
    struct Outer(io::Error);

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("read ca_file")
        }
    }

    impl Error for Outer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn each_cause_is_printed_once_in_order() {
        let e = Outer(io::Error::new(io::ErrorKind::NotFound, "no such file"));
        assert_eq!(e.to_string(), "read ca_file");
        assert_eq!(error_chain(&e), "read ca_file: no such file");
        let plain = io::Error::other("disk full");
        assert_eq!(error_chain(&plain), "disk full");
    }
}
