//! lexopt parsing of the `svc-observe` arguments into a [`Command`]: which options each
//! command takes, how many positional arguments, and the `--format` values. No I/O.

use std::ffi::OsString;
use std::path::PathBuf;

use super::help::{
    main_help, HELP_HTTP, HELP_INIT, HELP_LIST_METRICS, HELP_LIST_SUBJECTS, HELP_SHOW,
    HELP_TEXTFILE, HELP_VALIDATE,
};
use super::{Command, UsageError};
use crate::connectors::{self, broker_monitoring, collector_agent, ExportArgs, Input};

fn path(v: OsString) -> PathBuf {
    PathBuf::from(v)
}

fn utf8(v: OsString, what: &str) -> Result<String, UsageError> {
    v.into_string()
        .map_err(|_| UsageError(format!("{what} must be valid UTF-8")))
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, UsageError> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let sub = match p.next()? {
        Some(Short('h') | Long("help")) => return Ok(Command::Help(main_help())),
        Some(Short('V') | Long("version")) => return Ok(Command::Version),
        Some(Value(v)) => utf8(v, "the command")?,
        Some(arg) => return Err(arg.unexpected().into()),
        None => return Err(UsageError("a command is required".into())),
    };
    let help = match sub.as_str() {
        "init-scrape-policy" => HELP_INIT,
        "validate-policy" => HELP_VALIDATE,
        "show-effective-policy" => HELP_SHOW,
        "list-metrics" => HELP_LIST_METRICS,
        "list-subjects" => HELP_LIST_SUBJECTS,
        "scrape-textfile" => HELP_TEXTFILE,
        "scrape-http" => HELP_HTTP,
        "collector-agent-config" => collector_agent::CONFIG_HELP,
        "broker-monitoring-poll" => broker_monitoring::HELP,
        other => match connectors::find(other) {
            Some(c) => c.help,
            None => {
                let shown = svc_text::terminal::text_line(other);
                return Err(UsageError(format!("unknown command \"{shown}\"")));
            }
        },
    };
    let export = connectors::find(&sub);
    let mut positional: Vec<OsString> = Vec::new();
    let (mut output_file, mut output, mut format) = (None, None, None);
    let (mut force, mut dry_run, mut allow_stale) = (false, false, false);
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Command::Help(help.to_string())),
            Short('V') | Long("version") => return Ok(Command::Version),
            Long("output-file") if sub == "init-scrape-policy" => {
                output_file = Some(utf8(p.value()?, "--output-file")?)
            }
            Long("force") if sub == "init-scrape-policy" => force = true,
            Long("format") if sub == "list-metrics" || sub == "list-subjects" => {
                format = Some(utf8(p.value()?, "--format")?)
            }
            Long("dry-run")
                if sub == "scrape-textfile"
                    || sub == "scrape-http"
                    || sub == "broker-monitoring-poll"
                    || export.is_some() =>
            {
                dry_run = true
            }
            Long("allow-stale")
                if sub == "scrape-textfile" || sub == "scrape-http" || export.is_some() =>
            {
                allow_stale = true
            }
            Long("output") if sub == "scrape-textfile" || sub == "broker-monitoring-poll" => {
                output = Some(path(p.value()?))
            }
            Value(v) => positional.push(v),
            _ => return Err(arg.unexpected().into()),
        }
    }
    let want = match (sub.as_str(), export) {
        ("list-metrics", _) => 0,
        ("validate-policy" | "show-effective-policy" | "list-subjects", _) => 1,
        ("collector-agent-config", _) => 1,
        ("broker-monitoring-poll", _) => 1,
        (_, Some(c)) if c.input == Input::PolicyOnly => 1,
        _ => 2,
    };
    if positional.len() != want {
        return Err(UsageError(format!(
            "{sub} takes {want} argument{}, got {}",
            if want == 1 { "" } else { "s" },
            positional.len()
        )));
    }
    let expected_format = match sub.as_str() {
        "list-metrics" => Some("names"),
        "list-subjects" => Some("shell"),
        _ => None,
    };
    if let (Some(f), Some(want)) = (&format, expected_format) {
        if f != want {
            return Err(UsageError(format!("--format must be {want}")));
        }
    }
    let mut pos = positional.into_iter().map(path);
    let mut next = || pos.next().expect("argument count checked");
    if let Some(connector) = export {
        let snapshot = (connector.input == Input::SnapshotAndPolicy).then(&mut next);
        return Ok(Command::Export {
            connector,
            args: ExportArgs {
                snapshot,
                policy: next(),
                dry_run,
                allow_stale,
            },
        });
    }
    Ok(match sub.as_str() {
        "init-scrape-policy" => Command::InitScrapePolicy {
            config: next(),
            policy: next(),
            output_file,
            force,
        },
        "validate-policy" => Command::ValidatePolicy { policy: next() },
        "show-effective-policy" => Command::ShowEffectivePolicy { policy: next() },
        "list-metrics" => Command::ListMetrics,
        "list-subjects" => Command::ListSubjects { policy: next() },
        "collector-agent-config" => Command::CollectorAgentConfig { policy: next() },
        "broker-monitoring-poll" => Command::BrokerMonitoringPoll {
            policy: next(),
            dry_run,
            output,
        },
        "scrape-textfile" => Command::ScrapeTextfile {
            snapshot: next(),
            policy: next(),
            dry_run,
            output,
            allow_stale,
        },
        _ => Command::ScrapeHttp {
            snapshot: next(),
            policy: next(),
            dry_run,
            allow_stale,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    #[test]
    fn parses_every_command() {
        assert_eq!(parse(args("--help")).unwrap(), Command::Help(main_help()));
        assert_eq!(parse(args("--version")).unwrap(), Command::Version);
        assert_eq!(
            parse(args("scrape-http --help")).unwrap(),
            Command::Help(HELP_HTTP.to_string())
        );
        assert_eq!(parse(args("list-metrics -V")).unwrap(), Command::Version);
        assert_eq!(
            parse(args(
                "init-scrape-policy c.json p.json --output-file /x/svc.prom"
            ))
            .unwrap(),
            Command::InitScrapePolicy {
                config: "c.json".into(),
                policy: "p.json".into(),
                output_file: Some("/x/svc.prom".into()),
                force: false
            }
        );
        assert_eq!(
            parse(args(
                "scrape-textfile s.json p.json --dry-run --allow-stale"
            ))
            .unwrap(),
            Command::ScrapeTextfile {
                snapshot: "s.json".into(),
                policy: "p.json".into(),
                dry_run: true,
                output: None,
                allow_stale: true
            }
        );
        assert_eq!(
            parse(args("list-metrics --format names")).unwrap(),
            Command::ListMetrics
        );
        assert_eq!(
            parse(args("list-subjects p.json --format shell")).unwrap(),
            Command::ListSubjects {
                policy: "p.json".into()
            }
        );
    }

    #[test]
    fn usage_errors() {
        for (a, msg) in [
            ("", "a command is required"),
            ("frobnicate", "unknown command \"frobnicate\""),
            ("validate-policy", "validate-policy takes 1 argument, got 0"),
            ("scrape-http s.json", "scrape-http takes 2 arguments, got 1"),
            ("list-metrics --format json", "--format must be names"),
            ("scrape-http s p --output x", "invalid option '--output'"),
        ] {
            assert_eq!(parse(args(a)).unwrap_err().0, msg, "{a}");
        }
    }
}
