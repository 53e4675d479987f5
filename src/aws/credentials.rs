//! AWS credentials: the types every AWS caller signs with ([`Credentials`], [`Source`]), the
//! object-store sink's credential modes ([`CredentialMode`]), and the sources that are plain
//! reads: the environment and the shared credentials and config files. The full chain, with
//! the sources that talk to a service, is [`super::chain`]; it returns a
//! [`super::provider::Provider`] that keeps temporary credentials fresh.
//!
//! Files: the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`, else
//! `~/.aws/credentials`), section `[<profile>]`, and the shared config file
//! (`AWS_CONFIG_FILE`, else `~/.aws/config`), section `[profile <profile>]` (`[default]` for
//! the default profile). A profile's keys are merged from both, the credentials file winning
//! (as the SDKs do). Without `HOME`, only the files named by the variables are read.
//!
//! Values are never printed: errors name the variable, file, profile and key, never the value,
//! and `Debug` of [`Credentials`] redacts them.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use super::{parse_ini, Env};
use crate::text::peer::PeerText;

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
    /// `AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN` through STS
    /// `AssumeRoleWithWebIdentity`.
    WebIdentity {
        role_arn: String,
    },
    /// A profile's `role_arn` through STS `AssumeRole`, signed with `source_profile`'s.
    AssumeRole {
        profile: String,
        role_arn: String,
        source_profile: String,
    },
    /// A profile's `credential_process`.
    Process {
        profile: String,
    },
    /// The ECS/EKS container credentials endpoint (scheme, authority and path).
    Container {
        url: String,
    },
    /// The EC2 instance metadata service (IMDSv2), the instance profile's role.
    InstanceMetadata {
        endpoint: String,
        role: String,
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
            Source::WebIdentity { role_arn } => write!(
                f,
                "web identity (AWS_WEB_IDENTITY_TOKEN_FILE) for role {} via STS \
                 AssumeRoleWithWebIdentity",
                PeerText::new(role_arn)
            ),
            Source::AssumeRole {
                profile,
                role_arn,
                source_profile,
            } => write!(
                f,
                "profile {profile}: role {} via STS AssumeRole with the credentials of \
                 profile {source_profile}",
                PeerText::new(role_arn)
            ),
            Source::Process { profile } => write!(f, "profile {profile}: credential_process"),
            Source::Container { url } => write!(f, "container credentials endpoint {url}"),
            Source::InstanceMetadata { endpoint, role } => write!(
                f,
                "instance metadata (IMDSv2) at {endpoint}, role {}",
                PeerText::new(role)
            ),
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
    /// The chain of [`super::chain`]: environment, web identity, profile `AWS_PROFILE` (or
    /// `default`), container endpoint, instance metadata.
    DefaultChain,
    /// Variables named here, resolved when the sink starts.
    Environment {
        access_key_id_env: String,
        secret_access_key_env: String,
        session_token_env: Option<String>,
    },
    /// A named profile of the shared credentials and config files (static keys, `role_arn`
    /// with `source_profile`, or `credential_process`).
    Profile { profile_name: String },
}

/// The sink's `environment` mode: the variables it names.
pub fn from_named_variables(
    access_key_id_env: &str,
    secret_access_key_env: &str,
    session_token_env: Option<&str>,
    env: &dyn Env,
) -> Result<(Credentials, Source), String> {
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
        access_key_id: access_key_id_env.to_string(),
        secret_access_key: secret_access_key_env.to_string(),
    };
    Ok((creds, source))
}

/// `AWS_PROFILE`, else `default`.
pub fn chain_profile(env: &dyn Env) -> String {
    env.var("AWS_PROFILE").unwrap_or_else(|| "default".into())
}

/// `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`); one of the first
/// two without the other is an error.
pub fn from_environment(env: &dyn Env) -> Result<Option<(Credentials, Source)>, String> {
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

/// A path for messages, or the default with a note when `HOME` is not set.
pub fn shown(path: Option<PathBuf>, default: &str) -> String {
    match path {
        Some(p) => p.display().to_string(),
        None => format!("{default} (HOME is not set)"),
    }
}

/// The files' names for messages: `<credentials file> and <config file>`.
pub fn files_shown(env: &dyn Env) -> String {
    format!(
        "{} and {}",
        shown(credentials_file(env), "~/.aws/credentials"),
        shown(config_file(env), "~/.aws/config")
    )
}

/// One profile's settings, merged from both files.
#[derive(Debug, Clone, Default)]
pub struct ProfileSettings {
    /// Key -> value; the credentials file's keys win.
    pub keys: BTreeMap<String, String>,
    /// The file each key came from.
    pub origin: BTreeMap<String, PathBuf>,
    /// True when the key came from the credentials file.
    pub from_credentials_file: BTreeMap<String, bool>,
}

impl ProfileSettings {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.keys
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// `profile <name> of <file of key>`, for messages.
    pub fn what(&self, profile: &str, key: &str) -> String {
        match self.origin.get(key) {
            Some(p) => format!("profile {profile} of {}", p.display()),
            None => format!("profile {profile}"),
        }
    }

    /// The static keys, if the profile has them: `Ok(None)` when it has neither key.
    pub fn static_keys(&self, profile: &str) -> Result<Option<(Credentials, Source)>, String> {
        let id = self.get("aws_access_key_id");
        let secret = self.get("aws_secret_access_key");
        match (id, secret) {
            (Some(id), Some(secret)) => {
                let path = self.origin["aws_access_key_id"].clone();
                let profile = profile.to_string();
                let source = if self.from_credentials_file["aws_access_key_id"] {
                    Source::SharedCredentialsFile { path, profile }
                } else {
                    Source::SharedConfigFile { path, profile }
                };
                Ok(Some((
                    Credentials {
                        access_key_id: id.to_string(),
                        secret_access_key: secret.to_string(),
                        session_token: self.get("aws_session_token").map(str::to_string),
                    },
                    source,
                )))
            }
            (Some(_), None) => Err(format!(
                "{} has aws_access_key_id but no aws_secret_access_key",
                self.what(profile, "aws_access_key_id")
            )),
            (None, Some(_)) => Err(format!(
                "{} has aws_secret_access_key but no aws_access_key_id",
                self.what(profile, "aws_secret_access_key")
            )),
            (None, None) => Ok(None),
        }
    }
}

/// Reads `profile` from both files; `Ok(None)` when neither has its section.
pub fn load_profile(profile: &str, env: &dyn Env) -> Result<Option<ProfileSettings>, String> {
    let mut out = ProfileSettings::default();
    let mut found = false;
    let config_section = if profile == "default" {
        "default".to_string()
    } else {
        format!("profile {profile}")
    };
    // Config first, then the credentials file over it: its keys win.
    for (path, section, is_creds) in [
        (config_file(env), config_section, false),
        (credentials_file(env), profile.to_string(), true),
    ] {
        let Some(path) = path else { continue };
        let text = match read_file(&path)? {
            Some(t) => t,
            None => continue,
        };
        if let Some(keys) = parse_ini(&text).remove(&section) {
            found = true;
            for (k, v) in keys {
                out.origin.insert(k.clone(), path.clone());
                out.from_credentials_file.insert(k.clone(), is_creds);
                out.keys.insert(k, v);
            }
        }
    }
    Ok(found.then_some(out))
}

/// Largest shared file read.
const MAX_SHARED_FILE_BYTES: u64 = 1024 * 1024;

fn read_file(path: &std::path::Path) -> Result<Option<String>, String> {
    use std::io::Read;
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let mut text = String::new();
    f.take(MAX_SHARED_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if text.len() as u64 > MAX_SHARED_FILE_BYTES {
        return Err(format!(
            "{}: larger than {MAX_SHARED_FILE_BYTES} bytes",
            path.display()
        ));
    }
    Ok(Some(text))
}

/// Resolves and returns the current credentials and their source (tests: the old one-shot
/// interface over [`super::chain::provider`]).
#[cfg(test)]
pub fn resolve(mode: &CredentialMode, env: &dyn Env) -> Result<(Credentials, Source), String> {
    let p = super::chain::provider(mode, env, None)?;
    let c = p.current()?;
    Ok(((*c).clone(), p.source()))
}

#[cfg(test)]
pub fn resolve_chain(env: &dyn Env) -> Result<(Credentials, Source), CredentialError> {
    let p = super::chain::default_chain(env, None).map_err(CredentialError)?;
    let c = p.current().map_err(CredentialError)?;
    Ok(((*c).clone(), p.source()))
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
        let none = env(&[
            ("HOME", dir.join("nohome").to_str().unwrap()),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ]);
        let err = resolve(&CredentialMode::DefaultChain, &none).unwrap_err();
        assert!(
            err.starts_with("credential_mode default_chain: no AWS credentials found: checked")
                && err.ends_with("then instance metadata disabled by AWS_EC2_METADATA_DISABLED"),
            "{err}"
        );
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
            e.0.ends_with("has role_arn, but it needs source_profile (the profile whose credentials call STS AssumeRole)"),
            "{e}"
        );
        let e = resolve_chain(&benv(&[("HOME", home), ("AWS_PROFILE", "half")])).unwrap_err();
        assert!(
            e.0.ends_with("has aws_access_key_id but no aws_secret_access_key"),
            "{e}"
        );
        let e = resolve_chain(&benv(&[
            ("HOME", home),
            ("AWS_PROFILE", "nope"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ]))
        .unwrap_err();
        assert!(e.0.starts_with("no AWS credentials found"), "{e}");
        assert!(e.0.contains("profile nope in "), "{e}");
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
