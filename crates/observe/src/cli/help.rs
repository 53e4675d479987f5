//! The hand-written help texts of `svc-observe`: the global one (built from the connector
//! registry) and one per fixed command; export commands carry their own in their connector.

use crate::connectors::{self, Input};

const HELP_HEAD: &str = "\
svc-observe: export the runner's metrics through a reviewed observability policy

Usage: svc-observe <command> [arguments]

Commands:
  init-scrape-policy <config_file> <policy_file> [--output-file <path>] [--force]
        Write a disabled policy derived from the runtime config.
  validate-policy <policy_file>
        Check a policy and print its summary.
  show-effective-policy <policy_file>
        Print the policy as JSON with every default filled in.
  list-metrics [--format names]
        Print every metric suffix a policy may allow.
  list-subjects <policy_file> [--format shell]
        Print the policy's subject hints as shell variables.
  scrape-textfile <snapshot_file> <policy_file> [--dry-run] [--output <path>] [--allow-stale]
        Render the approved metrics into a textfile (atomically).
  scrape-http <snapshot_file> <policy_file> [--dry-run] [--allow-stale]
        Serve the approved metrics over HTTP.
  collector-agent-config <policy_file>
        Print the collector agent configuration for the collector_agent profile.
  broker-monitoring-poll <policy_file> [--dry-run] [--output <path>]
        Poll the broker server's monitoring endpoints into a textfile of their own.
";

const HELP_TAIL: &str = "
Options:
  -h, --help     Print help (also after a command)
  -V, --version  Print version

Exit codes: 0 success, 1 runtime failure, 2 invalid input or policy.
";

/// The global help: fixed commands, then one entry per export connector of the registry.
pub fn main_help() -> String {
    let mut s = HELP_HEAD.to_string();
    s.push_str(
        "\nExport commands (each needs the policy's enabled and the connector's enabled):\n",
    );
    for c in connectors::CONNECTORS {
        let args = match c.input {
            Input::SnapshotAndPolicy => "<snapshot_file> <policy_file>",
            Input::PolicyOnly => "<policy_file>",
        };
        s.push_str(&format!(
            "  {} {args} [--dry-run] [--allow-stale]\n        {}\n",
            c.command, c.summary
        ));
    }
    s.push_str(HELP_TAIL);
    s
}

pub(super) const HELP_INIT: &str = "\
Usage: svc-observe init-scrape-policy <config_file> <policy_file> [--output-file <path>] [--force]

Writes a disabled observability policy derived from the runtime config: every field with its
default, sharing switched off, and subject hints copied from the config's subject patterns.

Options:
  --output-file <path>  Set scrape.output_file (must end in .prom)
  --force               Replace an existing policy file
";

pub(super) const HELP_VALIDATE: &str = "\
Usage: svc-observe validate-policy <policy_file>

Checks the policy. Valid: prints `Observability policy is valid.` and key=value lines, exit 0.
Invalid: prints every problem with its field path, exit 2.
";

pub(super) const HELP_SHOW: &str = "\
Usage: svc-observe show-effective-policy <policy_file>

Prints the policy as JSON with every default filled in.
";

pub(super) const HELP_LIST_METRICS: &str = "\
Usage: svc-observe list-metrics [--format names]

Prints every metric suffix a policy may allow, one per line (runner metrics, then legacy
aliases, which need include_legacy).
";

pub(super) const HELP_LIST_SUBJECTS: &str = "\
Usage: svc-observe list-subjects <policy_file> [--format shell]

Prints one line per subject hint: SVC_SUBJECT_<index>_<NAME>='<pattern>' (index from 0; NAME
is the pattern in upper case, `*` as ANY, `>` as REST, other characters as `_`).
";

pub(super) const HELP_TEXTFILE: &str = "\
Usage: svc-observe scrape-textfile <snapshot_file> <policy_file> [--dry-run] [--output <path>] [--allow-stale]

Renders the approved metrics and writes them atomically to --output, else scrape.output_file.
A disabled policy needs no snapshot and writes one comment line.

Options:
  --dry-run        Print the rendering to stdout instead of writing
  --output <path>  Destination file (overrides scrape.output_file)
  --allow-stale    Render even if the snapshot is older than scrape.stale_after_seconds
";

pub(super) const HELP_HTTP: &str = "\
Usage: svc-observe scrape-http <snapshot_file> <policy_file> [--dry-run] [--allow-stale]

Serves the approved metrics on scrape.http_endpoint (needs enabled and
scrape.http_endpoint.enabled). Prints `Serving metrics on <host>:<port><path>`.

Options:
  --dry-run      Print one response body without opening a listener
  --allow-stale  Serve even if the snapshot is older than scrape.stale_after_seconds
";
