//! AWS credentials: the chain (environment, then the shared credentials and config files) and
//! the credential modes of the object-store sink, one implementation for every AWS caller.
//! Resolved once when the caller starts (restart it to pick up rotated static keys).
//!
//! The chain ([`resolve_chain`], and the sink's `default_chain` mode), first source that has an
//! access key wins:
//! 1. environment: `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY`, optional `AWS_SESSION_TOKEN`
//!    (one of the first two without the other is an error);
//! 2. the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`),
//!    section `[<profile>]`, keys `aws_access_key_id`, `aws_secret_access_key`,
//!    `aws_session_token`;
//! 3. the shared config file (`AWS_CONFIG_FILE`, else `~/.aws/config`), section
//!    `[profile <profile>]` (`[default]` for the default profile), the same keys.
//!
//! `<profile>` is `AWS_PROFILE`, else `default`. The sink's other modes: `environment` (the
//! variables named in its config) and `profile` (steps 2 and 3 for a named profile).
//! Without `HOME`, only the files named by the variables are read.
//!
//! NOT covered (an honest list; each fails with a message saying so when it is the only thing
//! configured): instance metadata (IMDS), container credentials
//! (`AWS_CONTAINER_CREDENTIALS_*`), web identity (`AWS_WEB_IDENTITY_TOKEN_FILE`), SSO,
//! `credential_process` and `role_arn` profiles. On EC2, ECS or EKS, export temporary
//! credentials into the environment of the unit (e.g. from a credential helper) instead.
//!
//! Values are never printed: errors name the variable, file, profile and key, never the value,
//! and `Debug` of [`Credentials`] redacts them.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::{parse_ini, Env};

/// The credentials a request is signed with. `Debug` never shows the key id, the secret or
/// the token.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
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
            .finish()
    }
}

/// Where the credentials came from; safe to print (names, never values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`.
    Environment,
    /// Variables named by the caller's configuration (the sink's `environment` mode).
    Variables {
        access_key_id: String,
        secret_access_key: String,
    },
    SharedCredentialsFile {
        path: PathBuf,
        profile: String,
    },
    SharedConfigFile {
        path: PathBuf,
        profile: String,
    },
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Environment => {
                f.write_str("environment variables AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY")
            }
            Source::Variables {
                access_key_id,
                secret_access_key,
            } => write!(
                f,
                "environment variables {access_key_id}/{secret_access_key}"
            ),
            Source::SharedCredentialsFile { path, profile }
            | Source::SharedConfigFile { path, profile } => {
                write!(f, "profile {profile} of {}", path.display())
            }
        }
    }
}

/// The chain found nothing usable, or found something broken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialError(pub String);

impl fmt::Display for CredentialError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CredentialError {}

/// Where credentials come from, as the object-store sink's config names it. The config only
/// ever names their source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialMode {
    /// Environment variables `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN`,
    /// then the shared credentials and config files (profile `AWS_PROFILE` or `default`).
    DefaultChain,
    /// Variables named here, resolved when the sink starts.
    Environment {
        access_key_id_env: String,
        secret_access_key_env: String,
        session_token_env: Option<String>,
    },
    /// A named profile of the shared credentials (or config) file.
    Profile { profile_name: String },
}

/// Resolves the credentials of a sink `credential_mode`. Errors start with the mode and name
/// variables, files and profiles, never values.
pub fn resolve(mode: &CredentialMode, env: &dyn Env) -> Result<(Credentials, Source), String> {
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
            let creds = Credentials {
                access_key_id: get(access_key_id_env)?,
                secret_access_key: get(secret_access_key_env)?,
                session_token: match session_token_env {
                    Some(n) => Some(get(n)?),
                    None => None,
                },
            };
            let source = Source::Variables {
                access_key_id: access_key_id_env.clone(),
                secret_access_key: secret_access_key_env.clone(),
            };
            Ok((creds, source))
        }
        CredentialMode::Profile { profile_name } => {
            from_profile(profile_name, env)?.ok_or_else(|| {
                format!(
                    "credential_mode profile: profile {profile_name} not found in {} or {}",
                    shown(credentials_file(env), "~/.aws/credentials"),
                    shown(config_file(env), "~/.aws/config")
                )
            })
        }
        CredentialMode::DefaultChain => {
            if let Some(found) =
                from_environment(env).map_err(|e| format!("credential_mode default_chain: {e}"))?
            {
                return Ok(found);
            }
            let profile = chain_profile(env);
            from_profile(&profile, env)?.ok_or_else(|| {
                format!(
                    "credential_mode default_chain: no credentials found (checked \
                     AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, then profile {profile} in {} and \
                     {}; instance metadata is not consulted)",
                    shown(credentials_file(env), "~/.aws/credentials"),
                    shown(config_file(env), "~/.aws/config")
                )
            })
        }
    }
}

/// Resolves credentials through the chain (what the AWS CLI calls the default chain, without
/// the sources listed as not covered).
pub fn resolve_chain(env: &dyn Env) -> Result<(Credentials, Source), CredentialError> {
    if let Some(found) = from_environment(env).map_err(CredentialError)? {
        return Ok(found);
    }
    let profile = chain_profile(env);
    if let Some(found) = from_profile(&profile, env).map_err(CredentialError)? {
        return Ok(found);
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

/// `AWS_PROFILE`, else `default`.
fn chain_profile(env: &dyn Env) -> String {
    env.var("AWS_PROFILE").unwrap_or_else(|| "default".into())
}

/// Step 1: `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`).
fn from_environment(env: &dyn Env) -> Result<Option<(Credentials, Source)>, String> {
    match (
        env.var("AWS_ACCESS_KEY_ID"),
        env.var("AWS_SECRET_ACCESS_KEY"),
    ) {
        (Some(access_key_id), Some(secret_access_key)) => Ok(Some((
            Credentials {
                access_key_id,
                secret_access_key,
                session_token: env.var("AWS_SESSION_TOKEN"),
            },
            Source::Environment,
        ))),
        (Some(_), None) => Err("AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not".into()),
        (None, Some(_)) => Err("AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not".into()),
        (None, None) => Ok(None),
    }
}

fn home(env: &dyn Env) -> Option<PathBuf> {
    env.var("HOME").map(PathBuf::from)
}

/// `AWS_SHARED_CREDENTIALS_FILE`, else `$HOME/.aws/credentials`.
pub fn credentials_file(env: &dyn Env) -> Option<PathBuf> {
    env.var("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| home(env).map(|h| h.join(".aws/credentials")))
}

/// `AWS_CONFIG_FILE`, else `$HOME/.aws/config`.
pub fn config_file(env: &dyn Env) -> Option<PathBuf> {
    env.var("AWS_CONFIG_FILE")
        .map(PathBuf::from)
        .or_else(|| home(env).map(|h| h.join(".aws/config")))
}

fn shown(path: Option<PathBuf>, default: &str) -> String {
    match path {
        Some(p) => p.display().to_string(),
        None => format!("{default} (HOME is not set)"),
    }
}

/// Steps 2 and 3 for one profile: its section of the credentials file, then of the config
/// file. `Ok(None)` when neither file has keys for it.
fn from_profile(profile: &str, env: &dyn Env) -> Result<Option<(Credentials, Source)>, String> {
    if let Some(path) = credentials_file(env) {
        if let Some(c) = from_file(&path, profile, profile)? {
            let profile = profile.to_string();
            return Ok(Some((c, Source::SharedCredentialsFile { path, profile })));
        }
    }
    if let Some(path) = config_file(env) {
        let section = if profile == "default" {
            "default".to_string()
        } else {
            format!("profile {profile}")
        };
        if let Some(c) = from_file(&path, &section, profile)? {
            let profile = profile.to_string();
            return Ok(Some((c, Source::SharedConfigFile { path, profile })));
        }
    }
    Ok(None)
}

fn from_file(path: &Path, section: &str, profile: &str) -> Result<Option<Credentials>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    match parse_ini(&text).get(section) {
        Some(fields) => from_section(fields, &format!("profile {profile} of {}", path.display())),
        None => Ok(None),
    }
}

fn from_section(
    section: &BTreeMap<String, String>,
    what: &str,
) -> Result<Option<Credentials>, String> {
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
        (Some(_), None) => Err(format!(
            "{what} has aws_access_key_id but no aws_secret_access_key"
        )),
        (None, Some(_)) => Err(format!(
            "{what} has aws_secret_access_key but no aws_access_key_id"
        )),
        (None, None) => {
            for key in [
                "role_arn",
                "credential_process",
                "sso_session",
                "sso_start_url",
                "web_identity_token_file",
            ] {
                if section.contains_key(key) {
                    return Err(format!(
                        "{what} uses {key}, which this release does not support; provide static or temporary keys (in environment variables or in the profile)"
                    ));
                }
            }
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The sink's tests pass owned maps, the connector's borrowed ones: both are [`Env`]s.
    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn benv<'a>(pairs: &[(&'a str, &'a str)]) -> BTreeMap<&'a str, &'a str> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn debug_hides_secrets() {
        const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
        let c = Credentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: SECRET.into(),
            session_token: Some("tok-123".into()),
        };
        let text = format!("{c:?}");
        assert!(!text.contains(SECRET) && !text.contains("tok-123") && !text.contains("AKID"));
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
        let (c, s) = resolve(&mode, &env(&[("MY_ID", "AKID"), ("MY_SECRET", "s3cr3t")])).unwrap();
        assert_eq!(c.secret_access_key, "s3cr3t");
        assert_eq!(s.to_string(), "environment variables MY_ID/MY_SECRET");
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
        let (c, _) = resolve(&CredentialMode::DefaultChain, &e).unwrap();
        assert_eq!(c.access_key_id, "ENVID");
        let (c, _) = resolve(&CredentialMode::DefaultChain, &env(&files)).unwrap();
        assert_eq!(
            (c.access_key_id.as_str(), c.session_token),
            ("FILEID", None)
        );
        let mut e = env(&files);
        e.insert("AWS_PROFILE".into(), "other".into());
        let (c, _) = resolve(&CredentialMode::DefaultChain, &e).unwrap();
        assert_eq!(c.session_token.as_deref(), Some("T"));
        let p = |name: &str| CredentialMode::Profile {
            profile_name: name.into(),
        };
        assert_eq!(
            resolve(&p("cfgonly"), &env(&files))
                .unwrap()
                .0
                .access_key_id,
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
        let err = resolve(
            &CredentialMode::DefaultChain,
            &env(&[("AWS_ACCESS_KEY_ID", "AKID")]),
        )
        .unwrap_err();
        assert_eq!(
            err,
            "credential_mode default_chain: AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not"
        );
        let err = resolve(&p("missing"), &env(&[])).unwrap_err();
        assert_eq!(
            err,
            "credential_mode profile: profile missing not found in ~/.aws/credentials \
             (HOME is not set) or ~/.aws/config (HOME is not set)"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn environment_first() {
        let (c, s) = resolve_chain(&benv(&[
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
        let e = resolve_chain(&benv(&[("AWS_ACCESS_KEY_ID", "AKID")])).unwrap_err();
        assert_eq!(
            e.0,
            "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not"
        );
        let e = resolve_chain(&benv(&[("AWS_SECRET_ACCESS_KEY", "S3CR3T")])).unwrap_err();
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
        let (c, s) = resolve_chain(&benv(&[("HOME", home)])).unwrap();
        assert_eq!(c.access_key_id, "AKDEF");
        assert!(
            matches!(s, Source::SharedCredentialsFile { ref profile, .. } if profile == "default")
        );
        let (c, _) = resolve_chain(&benv(&[("HOME", home), ("AWS_PROFILE", "ops")])).unwrap();
        assert_eq!(c.session_token.as_deref(), Some("TOPS"));
        let (c, s) = resolve_chain(&benv(&[("HOME", home), ("AWS_PROFILE", "cfg")])).unwrap();
        assert_eq!(c.secret_access_key, "SCFG");
        assert!(matches!(s, Source::SharedConfigFile { .. }));
        let e = resolve_chain(&benv(&[("HOME", home), ("AWS_PROFILE", "role")])).unwrap_err();
        assert!(
            e.0.contains("uses role_arn, which this release does not support"),
            "{e}"
        );
        let e = resolve_chain(&benv(&[("HOME", home), ("AWS_PROFILE", "half")])).unwrap_err();
        assert!(
            e.0.ends_with("has aws_access_key_id but no aws_secret_access_key"),
            "{e}"
        );
        let e = resolve_chain(&benv(&[("HOME", home), ("AWS_PROFILE", "nope")])).unwrap_err();
        assert!(e.0.starts_with("no AWS credentials found"), "{e}");
        assert!(e.0.contains("instance metadata (IMDS) is not used"));
        let other = dir.path().join("other");
        std::fs::write(
            &other,
            "[default]\naws_access_key_id=AKO\naws_secret_access_key=SO\n",
        )
        .unwrap();
        let (c, _) = resolve_chain(&benv(&[
            ("HOME", "/nonexistent"),
            ("AWS_SHARED_CREDENTIALS_FILE", other.to_str().unwrap()),
        ]))
        .unwrap();
        assert_eq!(c.access_key_id, "AKO");
    }

    /// The sink's `default_chain` mode and the connector's chain are the same chain: same
    /// credentials and source for the same environment and files.
    #[test]
    fn sink_default_chain_is_the_connector_chain() {
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("credentials");
        std::fs::write(
            &creds,
            "[p]\naws_access_key_id=AKP\naws_secret_access_key=SP\naws_session_token=\n",
        )
        .unwrap();
        let creds = creds.to_str().unwrap();
        for pairs in [
            vec![("AWS_ACCESS_KEY_ID", "A"), ("AWS_SECRET_ACCESS_KEY", "S")],
            vec![("AWS_SHARED_CREDENTIALS_FILE", creds), ("AWS_PROFILE", "p")],
        ] {
            let sink = resolve(&CredentialMode::DefaultChain, &env(&pairs)).unwrap();
            let connector = resolve_chain(&benv(&pairs)).unwrap();
            assert_eq!(sink, connector);
        }
        // An empty session token in a file is no token.
        let (c, s) = resolve_chain(&benv(&[
            ("AWS_SHARED_CREDENTIALS_FILE", creds),
            ("AWS_PROFILE", "p"),
        ]))
        .unwrap();
        assert_eq!(c.session_token, None);
        assert_eq!(s.to_string(), format!("profile p of {creds}"));
    }
}
