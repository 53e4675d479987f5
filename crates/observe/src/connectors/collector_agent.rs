//! `collector-agent-export`: the OTLP export to a local collector agent (path `/v1/metrics`),
//! and `collector-agent-config`: the minimal Grafana Alloy configuration that receives those
//! metrics, batches them and forwards them upstream over OTLP/HTTP.
//!
//! The snippet is built from the policy's component labels and environment-variable NAMES
//! only: the upstream endpoint and (with `upstream_auth_mode` `basic`) the credentials are
//! read by Alloy itself through `sys.env(...)`, so the runner and the exporter never hold
//! upstream credentials and the snippet contains no secret.

use super::otlp::{otlp_plan, Target};
use super::{Action, Connector, Context, ExportError, Input, Plan};
use crate::policy::checks::parse_endpoint;
use crate::policy::collector_agent::{CollectorAgent, UpstreamAuthMode};

pub const CONNECTOR: Connector = Connector {
    command: "collector-agent-export",
    block: "collector_agent",
    summary: "Hand the approved metrics to a local collector agent over OTLP/HTTP JSON.",
    help: "\
Usage: svc-observe collector-agent-export <snapshot_file> <policy_file> [--dry-run] [--allow-stale]

POSTs the approved metrics as one OTLP/HTTP JSON request to the local collector at
collector_agent.endpoint (path /v1/metrics; needs enabled and collector_agent.enabled).
`svc-observe collector-agent-config <policy_file>` prints the collector configuration.

Options:
  --dry-run      Print the request (header values redacted) instead of sending it
  --allow-stale  Send even if the snapshot is older than collector_agent.stale_after_seconds

Exit codes: 0 sent (or disabled by policy), 1 not sent, 2 invalid policy, usage or environment.
",
    input: Input::SnapshotAndPolicy,
    enabled: |p| p.collector_agent.enabled,
    push: |p| &p.collector_agent.push,
    action: Action::Plan(plan),
};

/// Help of `collector-agent-config`.
pub const CONFIG_HELP: &str = "\
Usage: svc-observe collector-agent-config <policy_file>

Prints the minimal Grafana Alloy configuration for the collector_agent profile: an OTLP
receiver on the host and port of collector_agent.endpoint (127.0.0.1:4318 when unset), a batch
processor, and an OTLP/HTTP exporter whose endpoint (and, with upstream_auth_mode basic, basic
auth credentials) Alloy reads from the environment variables the policy names. No secret
values appear in it.
";

fn plan(ctx: &Context<'_>) -> Result<Plan, ExportError> {
    let c = &ctx.policy.collector_agent;
    let target = Target {
        block: "collector_agent",
        endpoint: c.endpoint.as_deref().unwrap_or_default(),
        push: &c.push,
        headers_env: &c.headers_env,
    };
    otlp_plan(ctx, &target, &[])
}

/// Receiver listen address when the policy names no endpoint (the OTLP/HTTP default port).
pub const DEFAULT_RECEIVER: &str = "127.0.0.1:4318";

/// `host:port` the receiver listens on: the endpoint's host and port (scheme default port when
/// the URL has none).
pub fn receiver_address(c: &CollectorAgent) -> String {
    let Some(ep) = c.endpoint.as_deref().and_then(|u| parse_endpoint(u).ok()) else {
        return DEFAULT_RECEIVER.to_string();
    };
    let port = ep.port.unwrap_or(if ep.https { 443 } else { 80 });
    format!("{}:{port}", ep.host)
}

/// The Alloy configuration snippet. With `upstream_auth_mode` `basic` both variable names
/// are needed (validation requires them only for an enabled profile).
pub fn alloy_config(c: &CollectorAgent) -> Result<String, ExportError> {
    let basic = c.upstream_auth_mode == UpstreamAuthMode::Basic;
    if basic {
        let mut missing = Vec::new();
        if c.upstream_auth_username_env.is_none() {
            missing.push("collector_agent.upstream_auth_username_env");
        }
        if c.upstream_auth_password_env.is_none() {
            missing.push("collector_agent.upstream_auth_password_env");
        }
        if !missing.is_empty() {
            return Err(ExportError::Environment(format!(
                "{}: required with upstream_auth_mode basic",
                missing.join(", ")
            )));
        }
    }
    let mut s = String::new();
    s.push_str("// Grafana Alloy configuration for svc-observe collector-agent-export.\n");
    s.push_str("// Receives OTLP/HTTP metrics locally, batches them and forwards them upstream.\n");
    s.push_str("// Upstream endpoint and credentials come from Alloy's own environment.\n\n");
    s.push_str(&format!(
        "otelcol.receiver.otlp \"{}\" {{\n",
        c.receiver_label
    ));
    s.push_str("  http {\n");
    s.push_str(&format!("    endpoint = \"{}\"\n", receiver_address(c)));
    if c.endpoint
        .as_deref()
        .and_then(|u| parse_endpoint(u).ok())
        .is_some_and(|e| e.https)
    {
        s.push_str("    // The endpoint uses https: add a tls block (cert_file, key_file) here.\n");
    }
    s.push_str("  }\n\n");
    s.push_str("  output {\n");
    s.push_str(&format!(
        "    metrics = [otelcol.processor.batch.{}.input]\n",
        c.batch_label
    ));
    s.push_str("  }\n}\n\n");
    s.push_str(&format!(
        "otelcol.processor.batch \"{}\" {{\n",
        c.batch_label
    ));
    s.push_str("  output {\n");
    s.push_str(&format!(
        "    metrics = [otelcol.exporter.otlphttp.{}.input]\n",
        c.exporter_label
    ));
    s.push_str("  }\n}\n\n");
    s.push_str(&format!(
        "otelcol.exporter.otlphttp \"{}\" {{\n",
        c.exporter_label
    ));
    s.push_str("  client {\n");
    s.push_str(&format!(
        "    endpoint = sys.env(\"{}\")\n",
        c.upstream_endpoint_env
    ));
    if basic {
        s.push_str(&format!(
            "    auth     = otelcol.auth.basic.{}.handler\n",
            c.auth_label
        ));
    }
    s.push_str("  }\n}\n");
    if basic {
        s.push_str(&format!("\notelcol.auth.basic \"{}\" {{\n", c.auth_label));
        s.push_str(&format!(
            "  username = sys.env(\"{}\")\n",
            c.upstream_auth_username_env.as_deref().unwrap_or_default()
        ));
        s.push_str(&format!(
            "  password = sys.env(\"{}\")\n",
            c.upstream_auth_password_env.as_deref().unwrap_or_default()
        ));
        s.push_str("}\n");
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

    fn agent(block: &str) -> CollectorAgent {
        Policy::parse(&format!(
            r#"{{"schema": "svc.observability.policy.v1", "collector_agent": {block}}}"#
        ))
        .unwrap()
        .collector_agent
    }

    #[test]
    fn receiver_address_follows_the_endpoint() {
        assert_eq!(receiver_address(&agent("{}")), "127.0.0.1:4318");
        assert_eq!(
            receiver_address(&agent(
                r#"{"endpoint": "http://localhost:14318/v1/metrics"}"#
            )),
            "localhost:14318"
        );
        assert_eq!(
            receiver_address(&agent(r#"{"endpoint": "http://[::1]/v1/metrics"}"#)),
            "[::1]:80"
        );
        let tls = agent(r#"{"endpoint": "https://127.0.0.1/v1/metrics"}"#);
        assert_eq!(receiver_address(&tls), "127.0.0.1:443");
        assert!(alloy_config(&tls)
            .unwrap()
            .contains("// The endpoint uses https: add a tls block"));
    }
}
