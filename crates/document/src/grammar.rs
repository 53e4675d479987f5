//! Small grammars shared by the runtime config, the message modules and the observability
//! policy: header, metric, label and environment-variable names, and the secret-looking-name
//! check. They sit below all of them so that none imports another to reach a name rule.

/// A header name: printable ASCII without spaces or `:`, 1 to 128 bytes.
pub fn is_header_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic() && b != b':')
}

/// Metric-name grammar of the scrapers: `[a-zA-Z_][a-zA-Z0-9_]*`.
pub fn is_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// A reviewed label value: `[a-z][a-z0-9_-]*`, at most 64 bytes, not secret-looking.
pub fn is_family_label(s: &str) -> bool {
    let mut chars = s.chars();
    s.len() <= 64
        && matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
        && !looks_secret(s)
}

/// True for names that usually carry secrets; used to reject header, metadata, tag and
/// dimension names. Compared case-insensitively on the name's words.
pub fn looks_secret(name: &str) -> bool {
    const WORDS: &[&str] = &[
        "authorization",
        "auth",
        "password",
        "passwd",
        "pwd",
        "secret",
        "token",
        "apikey",
        "api_key",
        "api-key",
        "credential",
        "credentials",
        "cookie",
        "private_key",
        "privatekey",
        "private-key",
        "session",
        "bearer",
        "signature",
        "x-amz-security-token",
    ];
    let lower = name.to_ascii_lowercase();
    if WORDS.iter().any(|w| lower == *w) {
        return true;
    }
    let compact: String = lower
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    [
        "password",
        "passwd",
        "secret",
        "token",
        "apikey",
        "credential",
        "privatekey",
        "authorization",
        "cookie",
        "bearer",
    ]
    .iter()
    .any(|w| compact.contains(w))
}

/// Environment-variable name rule: `[A-Za-z_][A-Za-z0-9_]*`, at most 128 bytes.
pub fn is_env_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
        && name.len() <= 128
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_looking_names() {
        for n in [
            "Authorization",
            "X-Api-Key",
            "db_password",
            "SECRET",
            "session",
            "my-token",
        ] {
            assert!(looks_secret(n), "{n}");
        }
        for n in ["team", "source", "region", "content-type", "env"] {
            assert!(!looks_secret(n), "{n}");
        }
    }
}
