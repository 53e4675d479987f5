//! `agent-statsd-export`: the StatsD export in the tagged dialect of a local metrics agent
//! (DogStatsD): `<prefix>.<metric>:<value>|g|#k:v,...` with the policy's static `tags`, and,
//! with `include_metric_labels_as_tags`, one more datagram per prepared subject-family row
//! tagged `subject_family:<value>`. Datagram building, transport, size guard and best-effort
//! delivery are [`super::statsd`]'s.

use super::statsd::{datagram_plan, Dialect};
use super::{Action, Connector, Context, ExportError, Input, Plan};

pub const CONNECTOR: Connector = Connector {
    command: "agent-statsd-export",
    block: "agent_statsd",
    summary: "Send the approved metrics as tagged StatsD (DogStatsD) gauges.",
    help: "\
Usage: svc-observe agent-statsd-export <snapshot_file> <policy_file> [--dry-run] [--allow-stale]

Sends one tagged datagram per approved aggregate metric (`<prefix>.<metric>:<value>|g|#k:v`)
to the agent at agent_statsd.host:port (UDP) or agent_statsd.socket_path (unixgram); needs
enabled and agent_statsd.enabled. Static tags come from agent_statsd.tags; with
include_metric_labels_as_tags each subject-family row is sent too, tagged subject_family.

Options:
  --dry-run      Print the datagrams, one per line, instead of sending them
  --allow-stale  Send even if the snapshot is older than agent_statsd.stale_after_seconds

Exit codes: 0 all sent (or disabled by policy), 1 some or all not sent, 2 invalid policy or
usage.
",
    input: Input::SnapshotAndPolicy,
    enabled: |p| p.agent_statsd.base.enabled,
    push: |p| &p.agent_statsd.base.push,
    action: Action::Plan(plan),
};

fn plan(ctx: &Context<'_>) -> Result<Plan, ExportError> {
    let a = &ctx.policy.agent_statsd;
    let dialect = Dialect::Tagged {
        tags: a.tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        family_rows: a.include_metric_labels_as_tags,
    };
    datagram_plan(ctx, "agent_statsd", &a.base, &dialect)
}
