//! `credential_process`: runs the command a profile names and reads the credentials JSON it
//! prints ([`super::parse::parse_process_credentials`]).
//!
//! No shell. The SDKs differ here: botocore (the AWS CLI, boto3) splits the line with POSIX
//! shell-word rules (`shlex.split`) and runs it directly; the Rust, Go and Java SDKs hand it
//! to `sh -c`. This follows botocore: quotes and backslashes group words as in a shell, and
//! nothing else is interpreted (no variables, globs, pipes or redirections), so a command
//! written for the CLI works unchanged, and a profile file cannot smuggle shell syntax. A
//! command that needs a shell says so itself (`credential_process = sh -c '...'`).
//!
//! The process gets no stdin and its stderr is discarded (a helper's diagnostics may hold
//! secrets); it must finish within [`PROCESS_DEADLINE`] and print at most
//! [`MAX_PROCESS_OUTPUT`] bytes, else it is killed and the fetch fails.
//!
//! Its environment is [`PASSED_ENV`] only, not the runner's: the runner's holds payload keys,
//! custody and authenticity secrets, the database password and the broker token, none of
//! which a credential helper needs. A helper that needs another variable is given it on its
//! own line (`credential_process = env VAR=value helper ...`).

use std::fmt;
use std::io::{self, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::parse::{parse_process_credentials, Issued};
use svc_text::secret_bytes::SecretBytes;

/// Whole run of the command, start to exit.
pub const PROCESS_DEADLINE: Duration = Duration::from_secs(30);
/// Largest output read (a real answer is under 4 KiB).
pub const MAX_PROCESS_OUTPUT: u64 = 64 * 1024;

/// The variables passed on to the helper, when set: what finds programs, the home directory
/// and locale, and the AWS variables that choose a profile, its files and the region (what
/// the SDKs pass that a helper acts on). Never a credential variable.
pub const PASSED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
];

/// Splits a command line into words by POSIX shell quoting rules (as Python's `shlex.split`):
/// blanks separate words, `'...'` is literal, `"..."` keeps blanks and honours `\` before
/// `"`, `\`, `$`, `` ` `` and newline, `\` outside quotes escapes the next character.
pub fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err("unterminated single quote".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => word.push(c),
                            Some('\n') => {}
                            Some(c) => {
                                word.push('\\');
                                word.push(c);
                            }
                            None => return Err("unterminated double quote".into()),
                        },
                        Some(c) => word.push(c),
                        None => return Err("unterminated double quote".into()),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some('\n') => {}
                    Some(c) => word.push(c),
                    None => return Err("trailing backslash".into()),
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

/// A `credential_process` that gave no credentials. `Display` names the profile and what
/// failed, never the command line; an I/O failure (starting it, reading its output, waiting
/// for it) is its `source()`, printed once by whoever prints the chain
/// ([`svc_text::error_chain`]).
#[derive(Debug)]
pub struct ProcessError {
    message: String,
    source: Option<io::Error>,
}

impl ProcessError {
    fn new(message: String) -> Self {
        ProcessError {
            message,
            source: None,
        }
    }

    fn io(message: String, source: io::Error) -> Self {
        ProcessError {
            message,
            source: Some(source),
        }
    }
}

impl fmt::Display for ProcessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ProcessError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Runs `command` (the profile's `credential_process` line) and parses what it prints.
/// `what` names the profile in errors; the command line itself is never repeated (it may
/// carry an argument the operator considers secret).
pub fn run(command: &str, what: &str) -> Result<Issued, ProcessError> {
    run_with(command, what, PROCESS_DEADLINE)
}

/// [`run`] with the deadline given (tests).
pub fn run_with(command: &str, what: &str, deadline: Duration) -> Result<Issued, ProcessError> {
    let words = split_words(command)
        .map_err(|e| ProcessError::new(format!("{what}: credential_process: {e}")))?;
    let Some((program, args)) = words.split_first() else {
        return Err(ProcessError::new(format!(
            "{what}: credential_process is empty"
        )));
    };
    let start = Instant::now();
    let mut child = Command::new(program)
        .args(args)
        .env_clear()
        .envs(
            PASSED_ENV
                .iter()
                .filter_map(|k| Some((k, std::env::var_os(k)?))),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| {
            ProcessError::io(
                format!("{what}: cannot start credential_process {program}"),
                e,
            )
        })?;
    let stdout = child.stdout.take();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::Builder::new()
        .name("svc-aws-credproc".into())
        .spawn(move || {
            // The output holds the credentials: a wiping owner reserved once for the bound
            // (64 KiB + 1), so no reallocation leaves an unwiped copy.
            let mut buf = SecretBytes::with_capacity(MAX_PROCESS_OUTPUT as usize + 1);
            let r = match stdout {
                Some(s) => s
                    .take(MAX_PROCESS_OUTPUT + 1)
                    .read_to_end(buf.expose_mut())
                    .map(|_| ()),
                None => Ok(()),
            };
            let _ = tx.send(r.map(|_| buf));
        });
    let kill = |child: &mut std::process::Child| {
        let _ = child.kill();
        let _ = child.wait();
    };
    if let Err(e) = reader {
        kill(&mut child);
        return Err(ProcessError::io(
            format!("{what}: cannot start a reader thread"),
            e,
        ));
    }
    let out = match rx.recv_timeout(deadline.saturating_sub(start.elapsed())) {
        Ok(Ok(buf)) => buf,
        Ok(Err(e)) => {
            kill(&mut child);
            return Err(ProcessError::io(
                format!("{what}: credential_process output"),
                e,
            ));
        }
        Err(_) => {
            kill(&mut child);
            return Err(ProcessError::new(format!(
                "{what}: credential_process did not finish within {:.0} s; killed",
                deadline.as_secs_f64()
            )));
        }
    };
    if out.len() as u64 > MAX_PROCESS_OUTPUT {
        kill(&mut child);
        return Err(ProcessError::new(format!(
            "{what}: credential_process printed more than {MAX_PROCESS_OUTPUT} bytes; killed"
        )));
    }
    // Its stdout is closed: wait for the exit, still under the deadline.
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if start.elapsed() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                kill(&mut child);
                return Err(ProcessError::new(format!(
                    "{what}: credential_process did not exit within {:.0} s; killed",
                    deadline.as_secs_f64()
                )));
            }
            Err(e) => return Err(ProcessError::io(format!("{what}: credential_process"), e)),
        }
    };
    if !status.success() {
        return Err(ProcessError::new(format!(
            "{what}: credential_process failed ({status})"
        )));
    }
    parse_process_credentials(out.expose()).map_err(|e| ProcessError::new(format!("{what}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line an operator sees: the error and its cause.
    fn failed(r: Result<Issued, ProcessError>) -> String {
        svc_text::error_chain(&r.unwrap_err())
    }

    #[test]
    fn words_as_shlex_splits_them() {
        let w = |s: &str| split_words(s).unwrap();
        assert_eq!(
            w("  /bin/helper --profile  x "),
            ["/bin/helper", "--profile", "x"]
        );
        assert_eq!(
            w(r#"a 'b c' "d \"e\" \n" f\ g"#),
            ["a", "b c", "d \"e\" \\n", "f g"]
        );
        assert_eq!(
            w("a $HOME `x` | y > z"),
            ["a", "$HOME", "`x`", "|", "y", ">", "z"]
        );
        assert_eq!(w("''"), [""]);
        assert!(split_words("a 'b").is_err());
        assert!(split_words("a \"b").is_err());
        assert!(w("").is_empty());
    }

    #[test]
    fn runs_without_a_shell_with_bounds() {
        let ok = run(
            r#"printf '{"Version": 1, "AccessKeyId": "AKID", "SecretAccessKey": "s3cr3t"}'"#,
            "profile p",
        )
        .unwrap();
        assert_eq!(ok.credentials.access_key_id, "AKID");
        // No shell: `;` is an argument of echo, not a second command.
        let e = failed(run("echo hi; true", "profile p"));
        assert!(
            e.starts_with("profile p: credential_process output: not JSON"),
            "{e}"
        );
        let e = failed(run("false", "profile p"));
        assert!(
            e.contains("credential_process failed (exit status: 1)"),
            "{e}"
        );
        let e = failed(run_with("sleep 5", "profile p", Duration::from_millis(200)));
        assert!(e.contains("did not finish within"), "{e}");
        let e = failed(run("head -c 100000 /dev/zero", "profile p"));
        assert!(e.contains("more than 65536 bytes"), "{e}");
        let e = failed(run("/nonexistent/helper", "profile p"));
        assert!(
            e.starts_with("profile p: cannot start credential_process"),
            "{e}"
        );
    }

    /// The runner's environment holds payload keys, the database password, the broker token:
    /// the helper sees only [`PASSED_ENV`] (and what `sh` itself adds).
    #[test]
    fn the_helper_gets_only_the_passed_variables() {
        let dir = tempfile::tempdir().unwrap();
        let dump = dir.path().join("env");
        let command = format!(
            r#"sh -c 'env > {}; printf "{{\"Version\": 1, \"AccessKeyId\": \"AKID\", \"SecretAccessKey\": \"s\"}}"'"#,
            dump.display()
        );
        run(&command, "profile p").unwrap();
        let seen = std::fs::read_to_string(&dump).unwrap();
        let names: Vec<&str> = seen.lines().filter_map(|l| l.split('=').next()).collect();
        assert!(names.contains(&"PATH"), "{names:?}");
        let sh_own = ["PWD", "SHLVL", "_", "OLDPWD"];
        let foreign: Vec<&&str> = names
            .iter()
            .filter(|n| !PASSED_ENV.contains(n) && !sh_own.contains(n))
            .collect();
        assert!(foreign.is_empty(), "passed on: {foreign:?}");
        // The test process itself has more (cargo's own variables at least).
        assert!(std::env::vars_os().count() > names.len());
    }

    #[test]
    fn a_missing_program_is_named() {
        let e = failed(run("/nonexistent/helper", "profile p"));
        assert!(
            e.starts_with("profile p: cannot start credential_process"),
            "{e}"
        );
    }
}
