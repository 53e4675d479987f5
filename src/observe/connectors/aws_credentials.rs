//! The AWS credential chain of the cloud-B connector, and the endpoint override variables.
//!
//! Covered, in order (the first source that has an access key wins):
//! 1. environment: `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY`, optional `AWS_SESSION_TOKEN`;
//! 2. the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`),
//!    section `[<profile>]`, keys `aws_access_key_id`, `aws_secret_access_key`,
//!    `aws_session_token`;
//! 3. the shared config file (`AWS_CONFIG_FILE`, else `~/.aws/config`), section
//!    `[profile <profile>]` (`[default]` for the default profile), the same keys.
//!
//! `<profile>` is `AWS_PROFILE`, else `default`. NOT covered (an honest list; each fails with a
//! message saying so when it is the only thing configured): instance metadata (IMDS), container
//! credentials (`AWS_CONTAINER_CREDENTIALS_*`), web identity (`AWS_WEB_IDENTITY_TOKEN_FILE`),
//! SSO, `credential_process` and `role_arn` profiles. On EC2, ECS or EKS, export temporary
//! credentials into the environment of the unit (e.g. from a credential helper) instead.
//!
//! Values are never printed: errors name the variable, file and key, never the value.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::sigv4::Credentials;
use crate::observe::policy::checks::{is_loopback_host, parse_endpoint};

/// Where the credentials came from (printed by `--dry-run`; no value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Environment,
    SharedCredentialsFile { path: PathBuf, profile: String },
    SharedConfigFile { path: PathBuf, profile: String },
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Environment => f.write_str("environment (AWS_ACCESS_KEY_ID)"),
            Source::SharedCredentialsFile { path, profile } => write!(
                f,
                "shared credentials file {} (profile {profile})",
                path.display()
            ),
            Source::SharedConfigFile { path, profile } => {
                write!(
                    f,
                    "shared config file {} (profile {profile})",
                    path.display()
                )
            }
        }
    }
}

/// The chain found nothing usable, or found something broken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialError(pub String);

impl std::fmt::Display for CredentialError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CredentialError {}

/// Environment lookups, injectable for tests.
pub trait Env {
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

impl Env for BTreeMap<&str, &str> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name)
            .map(|v| v.to_string())
            .filter(|v| !v.is_empty())
    }
}

/// Sections of an INI file: name -> key -> value (keys lower-cased, values trimmed).
pub fn parse_ini(text: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.trim().to_string();
            out.entry(name.clone()).or_default();
            current = Some(name);
            continue;
        }
        if let (Some(section), Some((k, v))) = (&current, line.split_once('=')) {
            out.entry(section.clone())
                .or_default()
                .insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    out
}

fn home(env: &dyn Env) -> Option<PathBuf> {
    env.var("HOME").map(PathBuf::from)
}

fn from_section(
    section: &BTreeMap<String, String>,
    what: &str,
) -> Result<Option<Credentials>, CredentialError> {
    let id = section.get("aws_access_key_id").filter(|v| !v.is_empty());
    let secret = section
        .get("aws_secret_access_key")
        .filter(|v| !v.is_empty());
    match (id, secret) {
        (Some(id), Some(secret)) => Ok(Some(Credentials {
            access_key_id: id.clone(),
            secret_access_key: secret.clone(),
            session_token: section
                .get("aws_session_token")
                .filter(|v| !v.is_empty())
                .cloned(),
        })),
        (Some(_), None) => Err(CredentialError(format!(
            "{what} has aws_access_key_id but no aws_secret_access_key"
        ))),
        (None, Some(_)) => Err(CredentialError(format!(
            "{what} has aws_secret_access_key but no aws_access_key_id"
        ))),
        (None, None) => {
            for key in [
                "role_arn",
                "credential_process",
                "sso_session",
                "sso_start_url",
                "web_identity_token_file",
            ] {
                if section.contains_key(key) {
                    return Err(CredentialError(format!(
                        "{what} uses {key}, which this release does not support; provide static or temporary keys (environment or shared credentials file)"
                    )));
                }
            }
            Ok(None)
        }
    }
}

fn read_optional(path: &Path) -> Result<Option<String>, CredentialError> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CredentialError(format!(
            "cannot read {}: {e}",
            path.display()
        ))),
    }
}

/// Resolves credentials through the chain.
pub fn resolve(env: &dyn Env) -> Result<(Credentials, Source), CredentialError> {
    let id = env.var("AWS_ACCESS_KEY_ID");
    let secret = env.var("AWS_SECRET_ACCESS_KEY");
    match (id, secret) {
        (Some(access_key_id), Some(secret_access_key)) => {
            return Ok((
                Credentials {
                    access_key_id,
                    secret_access_key,
                    session_token: env.var("AWS_SESSION_TOKEN"),
                },
                Source::Environment,
            ))
        }
        (Some(_), None) => {
            return Err(CredentialError(
                "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not".into(),
            ))
        }
        (None, Some(_)) => {
            return Err(CredentialError(
                "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not".into(),
            ))
        }
        (None, None) => {}
    }
    let profile = env.var("AWS_PROFILE").unwrap_or_else(|| "default".into());
    let creds_path = env
        .var("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| home(env).map(|h| h.join(".aws/credentials")));
    if let Some(path) = creds_path {
        if let Some(text) = read_optional(&path)? {
            let ini = parse_ini(&text);
            if let Some(section) = ini.get(&profile) {
                let what = format!("profile {profile} of {}", path.display());
                if let Some(c) = from_section(section, &what)? {
                    return Ok((c, Source::SharedCredentialsFile { path, profile }));
                }
            }
        }
    }
    let config_path = env
        .var("AWS_CONFIG_FILE")
        .map(PathBuf::from)
        .or_else(|| home(env).map(|h| h.join(".aws/config")));
    if let Some(path) = config_path {
        if let Some(text) = read_optional(&path)? {
            let ini = parse_ini(&text);
            let name = if profile == "default" {
                "default".to_string()
            } else {
                format!("profile {profile}")
            };
            if let Some(section) = ini.get(&name) {
                let what = format!("profile {profile} of {}", path.display());
                if let Some(c) = from_section(section, &what)? {
                    return Ok((c, Source::SharedConfigFile { path, profile }));
                }
            }
        }
    }
    let mut hint = String::new();
    for var in [
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ] {
        if env.var(var).is_some() {
            hint = format!(
                " ({var} is set, but container and web-identity credentials are not supported by this release)"
            );
        }
    }
    Err(CredentialError(format!(
        "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or provide profile {profile} in the shared credentials file; instance metadata (IMDS) is not used{hint}"
    )))
}

/// The endpoint to call: `AWS_ENDPOINT_URL_CLOUDWATCH`, else `AWS_ENDPOINT_URL`, else
/// `https://monitoring.<region>.amazonaws.com` (the variables are ignored when
/// `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS` is `true`). An override must be `http(s)://host[:port]`
/// with an empty or `/` path, no credentials, query or fragment; plain http only to loopback.
/// Returns `(base URL without trailing slash, Host header value, which variable)`.
pub fn endpoint(
    env: &dyn Env,
    region: &str,
) -> Result<(String, String, Option<&'static str>), CredentialError> {
    let ignore = env
        .var("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let chosen = if ignore {
        None
    } else {
        ["AWS_ENDPOINT_URL_CLOUDWATCH", "AWS_ENDPOINT_URL"]
            .into_iter()
            .find_map(|n| env.var(n).map(|v| (n, v)))
    };
    let Some((var, url)) = chosen else {
        let host = format!("monitoring.{region}.amazonaws.com");
        return Ok((format!("https://{host}"), host, None));
    };
    let ep = parse_endpoint(&url).map_err(|why| CredentialError(format!("{var} {why}")))?;
    if !(ep.path.is_empty() || ep.path == "/") {
        return Err(CredentialError(format!(
            "{var} must be scheme, host and optional port, without a path"
        )));
    }
    if !ep.https && !is_loopback_host(&ep.host) {
        return Err(CredentialError(format!(
            "{var}: plain http is allowed only for loopback hosts (localhost, 127.0.0.0/8, [::1]); use https"
        )));
    }
    let host = match ep.port {
        Some(p) => format!("{}:{p}", ep.host),
        None => ep.host.clone(),
    };
    let scheme = if ep.https { "https" } else { "http" };
    Ok((format!("{scheme}://{host}"), host, Some(var)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &[(&'a str, &'a str)]) -> BTreeMap<&'a str, &'a str> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn environment_first() {
        let (c, s) = resolve(&env(&[
            ("AWS_ACCESS_KEY_ID", "AKID"),
            ("AWS_SECRET_ACCESS_KEY", "SECRET"),
            ("AWS_SESSION_TOKEN", "TOKEN"),
            ("HOME", "/nonexistent"),
        ]))
        .unwrap();
        assert_eq!(s, Source::Environment);
        assert_eq!(
            (
                c.access_key_id.as_str(),
                c.secret_access_key.as_str(),
                c.session_token.as_deref()
            ),
            ("AKID", "SECRET", Some("TOKEN"))
        );
        let e = resolve(&env(&[("AWS_ACCESS_KEY_ID", "AKID")])).unwrap_err();
        assert_eq!(
            e.0,
            "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not"
        );
        let e = resolve(&env(&[("AWS_SECRET_ACCESS_KEY", "S3CR3T")])).unwrap_err();
        assert!(!e.0.contains("S3CR3T"));
    }

    #[test]
    fn shared_files_and_profiles() {
        let dir = tempfile::tempdir().unwrap();
        let aws = dir.path().join(".aws");
        std::fs::create_dir(&aws).unwrap();
        std::fs::write(
            aws.join("credentials"),
            "# comment\n[default]\naws_access_key_id = AKDEF\naws_secret_access_key = SDEF\n\n[ops]\naws_access_key_id=AKOPS\naws_secret_access_key=SOPS\naws_session_token=TOPS\n[role]\nrole_arn = arn:aws:iam::1:role/x\n[half]\naws_access_key_id = AKHALF\n",
        )
        .unwrap();
        std::fs::write(
            aws.join("config"),
            "[profile cfg]\naws_access_key_id = AKCFG\naws_secret_access_key = SCFG\n",
        )
        .unwrap();
        let home = dir.path().to_str().unwrap();
        let (c, s) = resolve(&env(&[("HOME", home)])).unwrap();
        assert_eq!(c.access_key_id, "AKDEF");
        assert!(
            matches!(s, Source::SharedCredentialsFile { ref profile, .. } if profile == "default")
        );
        let (c, _) = resolve(&env(&[("HOME", home), ("AWS_PROFILE", "ops")])).unwrap();
        assert_eq!(c.session_token.as_deref(), Some("TOPS"));
        let (c, s) = resolve(&env(&[("HOME", home), ("AWS_PROFILE", "cfg")])).unwrap();
        assert_eq!(c.secret_access_key, "SCFG");
        assert!(matches!(s, Source::SharedConfigFile { .. }));
        let e = resolve(&env(&[("HOME", home), ("AWS_PROFILE", "role")])).unwrap_err();
        assert!(
            e.0.contains("uses role_arn, which this release does not support"),
            "{e}"
        );
        let e = resolve(&env(&[("HOME", home), ("AWS_PROFILE", "half")])).unwrap_err();
        assert!(
            e.0.ends_with("has aws_access_key_id but no aws_secret_access_key"),
            "{e}"
        );
        let e = resolve(&env(&[("HOME", home), ("AWS_PROFILE", "nope")])).unwrap_err();
        assert!(e.0.starts_with("no AWS credentials found"), "{e}");
        assert!(e.0.contains("instance metadata (IMDS) is not used"));
        let other = dir.path().join("other");
        std::fs::write(
            &other,
            "[default]\naws_access_key_id=AKO\naws_secret_access_key=SO\n",
        )
        .unwrap();
        let (c, _) = resolve(&env(&[
            ("HOME", "/nonexistent"),
            ("AWS_SHARED_CREDENTIALS_FILE", other.to_str().unwrap()),
        ]))
        .unwrap();
        assert_eq!(c.access_key_id, "AKO");
    }

    #[test]
    fn endpoints() {
        assert_eq!(
            endpoint(&env(&[]), "eu-west-1").unwrap(),
            (
                "https://monitoring.eu-west-1.amazonaws.com".into(),
                "monitoring.eu-west-1.amazonaws.com".into(),
                None
            )
        );
        assert_eq!(
            endpoint(
                &env(&[
                    ("AWS_ENDPOINT_URL", "http://127.0.0.1:1"),
                    ("AWS_ENDPOINT_URL_CLOUDWATCH", "http://127.0.0.1:5000/")
                ]),
                "r"
            )
            .unwrap(),
            (
                "http://127.0.0.1:5000".into(),
                "127.0.0.1:5000".into(),
                Some("AWS_ENDPOINT_URL_CLOUDWATCH")
            )
        );
        let ignored = env(&[
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:1"),
            ("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true"),
        ]);
        assert_eq!(endpoint(&ignored, "r").unwrap().2, None);
        for (url, msg) in [
            (
                "http://monitoring.example:80",
                "AWS_ENDPOINT_URL: plain http is allowed only for loopback hosts (localhost, 127.0.0.0/8, [::1]); use https",
            ),
            (
                "https://u:p@example",
                "AWS_ENDPOINT_URL must not contain credentials; use the connector's environment-variable fields",
            ),
            (
                "https://example/x",
                "AWS_ENDPOINT_URL must be scheme, host and optional port, without a path",
            ),
        ] {
            assert_eq!(
                endpoint(&env(&[("AWS_ENDPOINT_URL", url)]), "r")
                    .unwrap_err()
                    .0,
                msg
            );
        }
    }
}
