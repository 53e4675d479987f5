//! The `svc-observe` binary as this package builds it: the exporter's command line
//! (`svc_observe::cli`, a crate that does not depend on the runner) with the one thing it takes
//! from the runner, the runtime config that `init-scrape-policy` drafts a policy from.

use std::path::Path;
use std::process::ExitCode;

pub use svc_observe::cli::*;
use svc_observe::template::TemplateInput;

use crate::config::hints::subject_hints;
use crate::config::RuntimeConfig;

/// Entry point of the binary.
pub fn main() -> ExitCode {
    crate::cli::logging::init(log::LevelFilter::Warn);
    // Standard output as `svc` treats it: a reader that left (`| head`) ends quietly with the
    // shell's SIGPIPE status, any other failure (a full disk behind a redirection) is said.
    match svc_observe::cli::main(&template_input) {
        (_, Some(e)) => crate::cli::output::write_failed_as("svc-observe", &e),
        (code, None) => ExitCode::from(code),
    }
}

/// Reads the runtime config at `path` (validated whole, as `svc validate` does) into what
/// `init-scrape-policy` takes from it; the error is the config's report, one problem a line.
pub fn template_input(path: &Path) -> Result<TemplateInput, String> {
    let config = RuntimeConfig::load(path).map_err(|e| e.to_string())?;
    Ok(TemplateInput {
        namespace: config.metrics.namespace.clone(),
        subjects: subject_hints(&config)
            .into_iter()
            .map(|h| h.subject)
            .collect(),
    })
}
