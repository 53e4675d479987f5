//! Secrets an export resolves from the environment at export time (tokens, header values):
//! never stored, printed as `<redacted>`, exposed only where they go on the wire.

use std::collections::BTreeMap;
use std::fmt;

use super::{ExportError, Header};
use crate::policy::checks::RESERVED_HEADERS;
use svc_document::grammar::is_env_var_name;
use svc_text::secret_bytes::wipe_string;

/// A value resolved from the environment at export time (a token, a header value). It is
/// never stored in the policy, and its `Debug` and `Display` print `<redacted>`, so it cannot
/// reach a log line, an error or dry-run output by accident. Only [`Secret::expose`] gives the
/// value, for the one place that puts it on the wire.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    value: String,
    /// Where the credential itself starts (after a scheme prefix such as `Splunk `), so output
    /// can be scrubbed of the bare credential too: a receiver may echo it without the prefix.
    credential_at: usize,
}

/// What a secret prints as.
pub use svc_text::secrets::REDACTED;

impl Secret {
    /// Wraps a value (for values derived from secrets, e.g. `Splunk <token>`).
    pub fn new(value: String) -> Secret {
        Secret {
            value,
            credential_at: 0,
        }
    }

    /// The value, for the wire only.
    pub fn expose(&self) -> &str {
        &self.value
    }

    /// The credential without any scheme prefix; for scrubbing output only.
    pub(super) fn credential(&self) -> &str {
        &self.value[self.credential_at..]
    }

    /// A secret made of a prefix and this secret (`Splunk ` + token, `Bearer ` + token).
    pub fn prefixed(&self, prefix: &str) -> Secret {
        Secret {
            value: format!("{prefix}{}", self.value),
            credential_at: prefix.len() + self.credential_at,
        }
    }
}

impl Drop for Secret {
    /// Wiped when the last holder lets go (`svc_text::secret_bytes`; each clone is wiped
    /// when it drops).
    fn drop(&mut self) {
        wipe_string(&mut self.value);
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// Reads the environment variable `var` for the policy field `field` (e.g.
/// `siem_hec.token_env`). Unset, empty, non-UTF-8 or multi-line values are errors naming the
/// field and the variable, never the value.
pub fn resolve_env(field: &str, var: &str) -> Result<Secret, ExportError> {
    resolve_env_with(field, var, &|v| std::env::var_os(v))
}

/// [`resolve_env`] over any lookup (tests pass a map).
pub fn resolve_env_with(
    field: &str,
    var: &str,
    lookup: &dyn Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<Secret, ExportError> {
    let problem = |why: &str| ExportError::Environment(format!("{field}: {why}"));
    if !is_env_var_name(var) {
        return Err(problem("does not name a valid environment variable"));
    }
    let Some(raw) = lookup(var) else {
        return Err(problem(&format!("environment variable {var} is not set")));
    };
    let value = match raw.into_string() {
        Ok(v) => Secret::new(v),
        Err(raw) => {
            use std::os::unix::ffi::OsStringExt;
            svc_text::secret_bytes::wipe_vec(&mut raw.into_vec());
            return Err(problem(&format!(
                "environment variable {var} is not valid UTF-8"
            )));
        }
    };
    let value_text = value.expose();
    if value_text.is_empty() {
        return Err(problem(&format!("environment variable {var} is empty")));
    }
    // A header value must be one line of visible characters (CR/LF would split the request).
    if value_text
        .bytes()
        .any(|b| b == b'\r' || b == b'\n' || b == 0)
    {
        return Err(problem(&format!(
            "environment variable {var} contains a line break or NUL"
        )));
    }
    Ok(value)
}

/// Resolves a `headers_env` map (header name -> variable name) of block `block`. Headers in
/// `reserved` (compared case-insensitively) are refused here too, whatever validation said,
/// so a connector's own headers (`Authorization` of the SIEM, `Content-Type`) cannot be
/// overridden at send time.
pub fn resolve_headers(
    block: &str,
    headers_env: &BTreeMap<String, String>,
    reserved: &[&str],
) -> Result<Vec<Header>, ExportError> {
    let mut out = Vec::with_capacity(headers_env.len());
    for (name, var) in headers_env {
        let field = format!("{block}.headers_env.{name}");
        if reserved.iter().any(|r| r.eq_ignore_ascii_case(name))
            || RESERVED_HEADERS
                .iter()
                .any(|r| r.eq_ignore_ascii_case(name))
        {
            return Err(ExportError::Environment(format!(
                "{field}: is set by the connector and cannot be overridden"
            )));
        }
        out.push(Header::secret(name, resolve_env(&field, var)?));
    }
    Ok(out)
}
