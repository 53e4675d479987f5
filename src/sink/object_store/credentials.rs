//! Credential resolution for the three `credential_mode`s. Resolved once when the sink is
//! built (restart the runner to pick up rotated static keys).
//!
//! What `default_chain` covers, in order:
//! 1. `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ optional `AWS_SESSION_TOKEN`);
//! 2. the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`),
//!    profile `AWS_PROFILE` or `default`;
//! 3. the shared config file (`AWS_CONFIG_FILE`, else `~/.aws/config`), section
//!    `[profile NAME]` (or `[default]`), static keys only.
//!
//! Not covered (say so to operators): instance metadata (IMDS), container credentials
//! (`AWS_CONTAINER_CREDENTIALS_*`), web identity / IRSA, SSO, `credential_process` and
//! `role_arn` assume-role chains. A profile using those is reported as unsupported.
//!
//! Secret values never appear in an error, a log line or `Debug` output.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;

use super::config::CredentialMode;

/// Resolved credentials. `Debug` redacts the secret parts.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
    /// Where they came from, safe to print (`environment variables`, `profile default of
    /// /root/.aws/credentials`).
    pub source: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &"<redacted>")
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .field("source", &self.source)
            .finish()
    }
}

/// Reads the process environment; a seam so tests can pass a map.
pub trait Env {
    fn var(&self, name: &str) -> Option<String>;
}

/// The real process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

impl Env for HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).filter(|v| !v.is_empty()).cloned()
    }
}

/// Resolves credentials for a mode. Errors name variables, files and profiles, never values.
pub fn resolve(mode: &CredentialMode, env: &dyn Env) -> Result<Credentials, String> {
    match mode {
        CredentialMode::Environment {
            access_key_id_env,
            secret_access_key_env,
            session_token_env,
        } => {
            let get = |name: &str| {
                env.var(name).ok_or_else(|| {
                    format!("credential_mode environment: variable {name} is not set or empty")
                })
            };
            Ok(Credentials {
                access_key_id: get(access_key_id_env)?,
                secret_access_key: get(secret_access_key_env)?,
                session_token: match session_token_env {
                    Some(n) => Some(get(n)?),
                    None => None,
                },
                source: format!(
                    "environment variables {access_key_id_env}/{secret_access_key_env}"
                ),
            })
        }
        CredentialMode::Profile { profile_name } => {
            from_files(profile_name, env)?.ok_or_else(|| {
                format!(
                    "credential_mode profile: profile {profile_name} not found in {} or {}",
                    credentials_file(env).display(),
                    config_file(env).display()
                )
            })
        }
        CredentialMode::DefaultChain => {
            let id = env.var("AWS_ACCESS_KEY_ID");
            let secret = env.var("AWS_SECRET_ACCESS_KEY");
            match (id, secret) {
                (Some(access_key_id), Some(secret_access_key)) => {
                    return Ok(Credentials {
                        access_key_id,
                        secret_access_key,
                        session_token: env.var("AWS_SESSION_TOKEN"),
                        source: "environment variables AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
                            .into(),
                    })
                }
                (Some(_), None) | (None, Some(_)) => {
                    return Err("credential_mode default_chain: AWS_ACCESS_KEY_ID and \
                                AWS_SECRET_ACCESS_KEY must be set together"
                        .into())
                }
                (None, None) => {}
            }
            let profile = env.var("AWS_PROFILE").unwrap_or_else(|| "default".into());
            from_files(&profile, env)?.ok_or_else(|| {
                format!(
                    "credential_mode default_chain: no credentials found (checked \
                     AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, then profile {profile} in {} and \
                     {}; instance metadata is not consulted)",
                    credentials_file(env).display(),
                    config_file(env).display()
                )
            })
        }
    }
}

fn home(env: &dyn Env) -> PathBuf {
    PathBuf::from(env.var("HOME").unwrap_or_else(|| "/root".into()))
}

fn credentials_file(env: &dyn Env) -> PathBuf {
    env.var("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .unwrap_or_else(|| home(env).join(".aws/credentials"))
}

fn config_file(env: &dyn Env) -> PathBuf {
    env.var("AWS_CONFIG_FILE")
        .map(PathBuf::from)
        .unwrap_or_else(|| home(env).join(".aws/config"))
}

/// Looks the profile up in the credentials file, then the config file.
fn from_files(profile: &str, env: &dyn Env) -> Result<Option<Credentials>, String> {
    let sources = [
        (credentials_file(env), profile.to_string()),
        (
            config_file(env),
            if profile == "default" {
                "default".to_string()
            } else {
                format!("profile {profile}")
            },
        ),
    ];
    for (path, section) in sources {
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        let Some(fields) = ini_section(&text, &section) else {
            continue;
        };
        let id = fields.get("aws_access_key_id").filter(|v| !v.is_empty());
        let secret = fields
            .get("aws_secret_access_key")
            .filter(|v| !v.is_empty());
        match (id, secret) {
            (Some(id), Some(secret)) => {
                return Ok(Some(Credentials {
                    access_key_id: id.clone(),
                    secret_access_key: secret.clone(),
                    session_token: fields.get("aws_session_token").cloned(),
                    source: format!("profile {profile} of {}", path.display()),
                }))
            }
            _ => {
                let unsupported = [
                    "role_arn",
                    "credential_process",
                    "sso_session",
                    "sso_start_url",
                    "web_identity_token_file",
                ];
                if let Some(k) = unsupported.iter().find(|k| fields.contains_key(**k)) {
                    return Err(format!(
                        "profile {profile} of {} uses {k}, which this sink does not support \
                         (use static keys or credential_mode environment)",
                        path.display()
                    ));
                }
                if id.is_some() || secret.is_some() {
                    return Err(format!(
                        "profile {profile} of {} must set both aws_access_key_id and \
                         aws_secret_access_key",
                        path.display()
                    ));
                }
            }
        }
    }
    Ok(None)
}

/// The `key = value` pairs of one `[section]` of an INI document (keys lowercased).
fn ini_section(text: &str, section: &str) -> Option<HashMap<String, String>> {
    let mut current: Option<bool> = None;
    let mut found: Option<HashMap<String, String>> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
            let hit = name == section;
            if hit && found.is_none() {
                found = Some(HashMap::new());
            }
            current = Some(hit);
            continue;
        }
        if current == Some(true) {
            if let Some((k, v)) = line.split_once('=') {
                if let Some(map) = found.as_mut() {
                    map.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn environment_mode_names_the_missing_variable_only() {
        let mode = CredentialMode::Environment {
            access_key_id_env: "MY_ID".into(),
            secret_access_key_env: "MY_SECRET".into(),
            session_token_env: None,
        };
        let e = resolve(&mode, &env(&[("MY_ID", "AKID")])).unwrap_err();
        assert_eq!(
            e,
            "credential_mode environment: variable MY_SECRET is not set or empty"
        );
        let c = resolve(&mode, &env(&[("MY_ID", "AKID"), ("MY_SECRET", "s3cr3t")])).unwrap();
        assert_eq!(c.secret_access_key, "s3cr3t");
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("s3cr3t") && !dbg.contains("AKID"), "{dbg}");
    }

    #[test]
    fn default_chain_env_then_files() {
        let dir = std::env::temp_dir().join(format!("svc-creds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let creds = dir.join("credentials");
        std::fs::write(
            &creds,
            "# c\n[default]\naws_access_key_id = FILEID\naws_secret_access_key=FILESECRET\n\n\
             [other]\naws_access_key_id=O\naws_secret_access_key=OS\naws_session_token=T\n",
        )
        .unwrap();
        let cfg = dir.join("config");
        std::fs::write(
            &cfg,
            "[profile cfgonly]\naws_access_key_id=C\naws_secret_access_key=CS\n\
             [profile sso]\nsso_session=x\n",
        )
        .unwrap();
        let files = [
            ("AWS_SHARED_CREDENTIALS_FILE", creds.to_str().unwrap()),
            ("AWS_CONFIG_FILE", cfg.to_str().unwrap()),
        ];
        let mut e = env(&files);
        e.insert("AWS_ACCESS_KEY_ID".into(), "ENVID".into());
        e.insert("AWS_SECRET_ACCESS_KEY".into(), "ENVSECRET".into());
        let c = resolve(&CredentialMode::DefaultChain, &e).unwrap();
        assert_eq!(c.access_key_id, "ENVID");
        let c = resolve(&CredentialMode::DefaultChain, &env(&files)).unwrap();
        assert_eq!(
            (c.access_key_id.as_str(), c.session_token),
            ("FILEID", None)
        );
        let mut e = env(&files);
        e.insert("AWS_PROFILE".into(), "other".into());
        let c = resolve(&CredentialMode::DefaultChain, &e).unwrap();
        assert_eq!(c.session_token.as_deref(), Some("T"));
        let p = |name: &str| CredentialMode::Profile {
            profile_name: name.into(),
        };
        assert_eq!(
            resolve(&p("cfgonly"), &env(&files)).unwrap().access_key_id,
            "C"
        );
        let err = resolve(&p("sso"), &env(&files)).unwrap_err();
        assert!(err.contains("uses sso_session"), "{err}");
        let err = resolve(&p("missing"), &env(&files)).unwrap_err();
        assert!(
            err.starts_with("credential_mode profile: profile missing not found"),
            "{err}"
        );
        let none = env(&[("HOME", dir.join("nohome").to_str().unwrap())]);
        let err = resolve(&CredentialMode::DefaultChain, &none).unwrap_err();
        assert!(err.contains("instance metadata is not consulted"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
