//! Runs a parsed [`Command`]: loads the policy, calls the exporter, prints the outcome and
//! picks the exit code. Every error is printed here, once.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Command, ReadConfig, EXIT_FAILURE, EXIT_INVALID, EXIT_OK};
use crate::catalogue;
use crate::connectors::{self, broker_monitoring, collector_agent};
use crate::exposition;
use crate::http::{Reply, Server, ServerConfig, SnapshotSource, Source};
use crate::policy::{LoadError, Policy};
use crate::template;
use crate::textfile::{self, Outcome, TextfileError};
use svc_files::atomic::write_atomically;

/// Loads a policy, printing every problem on failure.
fn load_policy(path: &Path, err: &mut dyn Write) -> Result<Policy, u8> {
    match Policy::load(path) {
        Ok(p) => Ok(p),
        Err(LoadError::Invalid(inv)) => {
            let _ = writeln!(err, "Observability policy is invalid:");
            for p in &inv.0 {
                let _ = writeln!(err, "  {p}");
            }
            Err(EXIT_INVALID)
        }
        Err(e @ LoadError::Read { .. }) => {
            let _ = writeln!(err, "svc-observe: {e}");
            Err(EXIT_INVALID)
        }
    }
}

/// The `NAME` part of a `list-subjects` variable.
pub fn subject_var_name(pattern: &str) -> String {
    pattern
        .split('.')
        .map(|t| match t {
            "*" => "ANY".to_string(),
            ">" => "REST".to_string(),
            t => t
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() {
                        c.to_ascii_uppercase()
                    } else {
                        '_'
                    }
                })
                .collect(),
        })
        .collect::<Vec<_>>()
        .join("_")
}

/// Single-quotes a value for POSIX shells.
pub fn shell_quote(v: &str) -> String {
    format!("'{}'", v.replace('\'', "'\\''"))
}

/// Runs a command; returns the exit code. `read_config` reads the runtime config of
/// `init-scrape-policy`.
pub fn run(
    cmd: Command,
    read_config: ReadConfig<'_>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    match cmd {
        Command::Help(text) => {
            let _ = out.write_all(text.as_bytes());
            EXIT_OK
        }
        Command::Version => {
            let _ = writeln!(out, "svc-observe {}", env!("CARGO_PKG_VERSION"));
            EXIT_OK
        }
        Command::InitScrapePolicy {
            config,
            policy,
            output_file,
            force,
        } => init(
            read_config,
            &config,
            &policy,
            output_file.as_deref(),
            force,
            out,
            err,
        ),
        Command::ValidatePolicy { policy } => match load_policy(&policy, err) {
            Ok(p) => {
                let _ = writeln!(out, "Observability policy is valid.");
                for line in p.summary_lines() {
                    let _ = writeln!(out, "{line}");
                }
                EXIT_OK
            }
            Err(code) => code,
        },
        Command::ShowEffectivePolicy { policy } => match load_policy(&policy, err) {
            Ok(p) => {
                let _ = writeln!(out, "{}", p.to_json_pretty());
                EXIT_OK
            }
            Err(code) => code,
        },
        Command::ListMetrics => {
            for n in catalogue::allowable_names() {
                let _ = writeln!(out, "{n}");
            }
            EXIT_OK
        }
        Command::ListSubjects { policy } => match load_policy(&policy, err) {
            Ok(p) => {
                for (i, s) in p.subjects.iter().enumerate() {
                    let _ = writeln!(
                        out,
                        "SVC_SUBJECT_{i}_{}={}",
                        subject_var_name(&s.subject),
                        shell_quote(&s.subject)
                    );
                }
                EXIT_OK
            }
            Err(code) => code,
        },
        Command::ScrapeTextfile {
            snapshot,
            policy,
            dry_run,
            output,
            allow_stale,
        } => {
            let p = match load_policy(&policy, err) {
                Ok(p) => p,
                Err(code) => return code,
            };
            let req = textfile::Request {
                snapshot: &snapshot,
                policy: &p,
                dry_run,
                output: output.as_deref(),
                allow_stale,
            };
            match textfile::run(&req, out) {
                Ok(Outcome::Written { path, bytes }) => {
                    log::info!("wrote {bytes} bytes to {}", path.display());
                    EXIT_OK
                }
                Ok(Outcome::Printed) => EXIT_OK,
                Ok(Outcome::Disabled { .. }) => EXIT_OK,
                Err(e @ TextfileError::NoOutput) => {
                    let _ = writeln!(err, "svc-observe: {e}");
                    EXIT_INVALID
                }
                Err(e) => {
                    let _ = writeln!(err, "svc-observe: {e}");
                    EXIT_FAILURE
                }
            }
        }
        Command::ScrapeHttp {
            snapshot,
            policy,
            dry_run,
            allow_stale,
        } => {
            let p = match load_policy(&policy, err) {
                Ok(p) => p,
                Err(code) => return code,
            };
            scrape_http(snapshot, p, dry_run, allow_stale, out, err)
        }
        Command::Export { connector, args } => connectors::main_export(connector, &args, out, err),
        Command::CollectorAgentConfig { policy } => {
            let p = match load_policy(&policy, err) {
                Ok(p) => p,
                Err(code) => return code,
            };
            match collector_agent::alloy_config(&p.collector_agent) {
                Ok(text) => {
                    let _ = out.write_all(text.as_bytes());
                    EXIT_OK
                }
                Err(e) => {
                    let _ = writeln!(err, "svc-observe collector-agent-config: {e}");
                    e.exit_code()
                }
            }
        }
        Command::BrokerMonitoringPoll {
            policy,
            dry_run,
            output,
        } => match load_policy(&policy, err) {
            Ok(p) => broker_monitoring::run_poll(&p, dry_run, output.as_deref(), out, err),
            Err(code) => code,
        },
    }
}

#[allow(clippy::too_many_arguments)]
fn init(
    read_config: ReadConfig<'_>,
    config: &Path,
    policy: &Path,
    output_file: Option<&str>,
    force: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let input = match read_config(config) {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(err, "svc-observe: runtime config {}:", config.display());
            for line in e.lines() {
                let _ = writeln!(err, "  {line}");
            }
            return EXIT_INVALID;
        }
    };
    if policy.exists() && !force {
        let _ = writeln!(
            err,
            "svc-observe: {} already exists; pass --force to replace it",
            policy.display()
        );
        return EXIT_INVALID;
    }
    let doc = template::render(&template::template_policy(&input, output_file));
    // The template must be a valid policy (an --output-file without .prom is caught here).
    if let Err(inv) = Policy::parse(&doc) {
        let _ = writeln!(err, "Observability policy is invalid:");
        for p in &inv.0 {
            let _ = writeln!(err, "  {p}");
        }
        return EXIT_INVALID;
    }
    // The policy keeps the mode it had (the exporter's user must go on reading it).
    let mode = std::fs::metadata(policy)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777)
        .unwrap_or(0o644);
    if let Err(e) = write_atomically(policy, doc.as_bytes(), mode) {
        let _ = writeln!(err, "svc-observe: cannot write {}: {e}", policy.display());
        return EXIT_FAILURE;
    }
    let _ = writeln!(out, "Wrote observability policy {}", policy.display());
    let _ = writeln!(
        out,
        "Export stays disabled until the policy enables sharing: set \"enabled\": true and a connector's \"enabled\": true."
    );
    EXIT_OK
}

fn scrape_http(
    snapshot: PathBuf,
    p: Policy,
    dry_run: bool,
    allow_stale: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let disabled = if !p.enabled {
        Some("enabled=false")
    } else if !p.scrape.http_endpoint.enabled {
        Some("scrape.http_endpoint.enabled=false")
    } else {
        None
    };
    if let Some(reason) = disabled {
        if dry_run {
            let _ = out.write_all(exposition::disabled_line(reason).as_bytes());
        } else {
            let _ = writeln!(
                err,
                "svc-observe: the HTTP endpoint is disabled by policy ({reason}); not listening"
            );
        }
        return EXIT_OK;
    }
    let ep = p.scrape.http_endpoint.clone();
    let source = SnapshotSource {
        snapshot,
        policy: p,
        allow_stale,
    };
    if dry_run {
        return match source.render() {
            Reply::Metrics(body) if body.len() as u64 > ep.response_max_bytes => {
                let _ = writeln!(
                    err,
                    "svc-observe: rendered {} bytes, over scrape.http_endpoint.response_max_bytes {}",
                    body.len(),
                    ep.response_max_bytes
                );
                EXIT_FAILURE
            }
            Reply::Metrics(body) => {
                let _ = out.write_all(body.as_bytes());
                EXIT_OK
            }
            Reply::Unavailable(why) | Reply::Failed(why) => {
                let _ = writeln!(err, "svc-observe: {why}");
                EXIT_FAILURE
            }
        };
    }
    let cfg = ServerConfig {
        bind: ep.bind_address(),
        path: ep.path.clone(),
        request_timeout: std::time::Duration::from_secs_f64(ep.request_timeout_seconds),
        response_max_bytes: ep.response_max_bytes,
        workers: crate::http::DEFAULT_WORKERS,
        max_connections: crate::http::DEFAULT_MAX_CONNECTIONS,
    };
    let server = match Server::start(cfg, Arc::new(source)) {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(
                err,
                "svc-observe: cannot listen on {}: {e}",
                ep.bind_address()
            );
            return EXIT_FAILURE;
        }
    };
    let _ = writeln!(out, "Serving metrics on {}:{}{}", ep.host, ep.port, ep.path);
    let _ = out.flush();
    server.wait();
    EXIT_OK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_names() {
        assert_eq!(subject_var_name("orders.>"), "ORDERS_REST");
        assert_eq!(subject_var_name("orders.*.created"), "ORDERS_ANY_CREATED");
        assert_eq!(subject_var_name("a-b.c"), "A_B_C");
        assert_eq!(shell_quote("orders.>"), "'orders.>'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }
}
