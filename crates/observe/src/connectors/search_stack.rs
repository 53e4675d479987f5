//! `search-stack-export`: the OTLP export with the search stack's data-stream hints. The
//! stack's OTLP intake routes metrics to the data stream `metrics-<dataset>-<namespace>` named
//! by the `data_stream.dataset` and `data_stream.namespace` attributes; they are sent as
//! resource attributes (the lowest precedence level, so a collector in between may still
//! override them per scope or point). Only OTLP to a collector-style endpoint
//! (`ingestion_path` `otlp_collector`): never direct index or bulk writes.

use super::otlp::{otlp_plan, Target};
use super::{Action, Connector, Context, ExportError, Input, Plan};

pub const CONNECTOR: Connector = Connector {
    command: "search-stack-export",
    block: "search_stack",
    summary: "Send the approved metrics over OTLP with the search stack's data-stream hints.",
    help: "\
Usage: svc-observe search-stack-export <snapshot_file> <policy_file> [--dry-run] [--allow-stale]

POSTs the approved metrics as one OTLP/HTTP JSON request to search_stack.endpoint (needs
enabled and search_stack.enabled), with the resource attributes data_stream.dataset and
data_stream.namespace from the policy. Header values come from search_stack.headers_env.

Options:
  --dry-run      Print the request (header values redacted) instead of sending it
  --allow-stale  Send even if the snapshot is older than search_stack.stale_after_seconds

Exit codes: 0 sent (or disabled by policy), 1 not sent, 2 invalid policy, usage or environment.
",
    input: Input::SnapshotAndPolicy,
    enabled: |p| p.search_stack.enabled,
    push: |p| &p.search_stack.push,
    action: Action::Plan(plan),
};

/// Resource attribute carrying `data_stream_dataset`.
pub const DATASET_ATTRIBUTE: &str = "data_stream.dataset";
/// Resource attribute carrying `data_stream_namespace`.
pub const NAMESPACE_ATTRIBUTE: &str = "data_stream.namespace";

fn plan(ctx: &Context<'_>) -> Result<Plan, ExportError> {
    let s = &ctx.policy.search_stack;
    let target = Target {
        block: "search_stack",
        endpoint: s.endpoint.as_deref().unwrap_or_default(),
        push: &s.push,
        headers_env: &s.headers_env,
    };
    otlp_plan(
        ctx,
        &target,
        &[
            (DATASET_ATTRIBUTE, &s.data_stream_dataset),
            (NAMESPACE_ATTRIBUTE, &s.data_stream_namespace),
        ],
    )
}
