//! The one scheme rule for a sink's endpoint URL: https always; plain http only when the
//! operator set `allow_http_for_local_testing` and the host is a loopback name, so a local
//! test double runs without a certificate and nothing else can send data in the clear.

/// The hosts plain http may name.
pub const LOOPBACK_HOSTS: &[&str] = &["localhost", "127.0.0.1", "[::1]"];

/// Why a URL with this scheme and host is not allowed, if it is not.
pub fn scheme_problem(
    scheme: &str,
    host: &str,
    allow_http_for_local_testing: bool,
) -> Option<String> {
    match scheme {
        "https" => None,
        "http" if !allow_http_for_local_testing => Some(
            "must use https (http is allowed only with allow_http_for_local_testing = true \
             and a loopback host)"
                .into(),
        ),
        "http" if !LOOPBACK_HOSTS.contains(&host) => Some(
            "http is allowed only for the loopback hosts localhost, 127.0.0.1 and [::1]".into(),
        ),
        "http" => None,
        _ => Some("must be an https URL".into()),
    }
}
