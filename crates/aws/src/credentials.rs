//! AWS credentials: the types every AWS caller signs with ([`Credentials`], [`Source`]), the
//! object-store sink's credential modes ([`CredentialMode`]), and the sources that are plain
//! reads: the environment and the shared credentials and config files. The full chain, with
//! the sources that talk to a service, is in `chain.rs`; it returns a
//! `Provider` (`provider.rs`) that keeps temporary credentials fresh. Its tests are in
//! `credentials_tests.rs`, beside the chain they go through.
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

use super::Env;
use svc_host::ini::parse_ini;
use svc_text::peer::PeerText;
use svc_text::secret_bytes::{wipe_string, SecretString};
use svc_text::secrets::{is_secret_name, REDACTED};

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

impl Drop for Credentials {
    /// The secret key and the session token are wiped (`svc_text::secret_bytes`); the key
    /// id is not secret. Each clone is wiped when it drops.
    fn drop(&mut self) {
        wipe_string(&mut self.secret_access_key);
        if let Some(t) = &mut self.session_token {
            wipe_string(t);
        }
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
    /// The chain of `chain.rs`: environment, web identity, profile `AWS_PROFILE` (or
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

/// One profile's settings, merged from both files. `Debug` shows a value only when its key
/// is not a secret's name (`text::secrets::is_secret_name`: `aws_secret_access_key`,
/// `aws_session_token`, `aws_access_key_id`, `credential_process` print `<redacted>`).
#[derive(Clone, Default)]
pub struct ProfileSettings {
    /// Key -> value; the credentials file's keys win.
    pub keys: BTreeMap<String, String>,
    /// The file each key came from.
    pub origin: BTreeMap<String, PathBuf>,
    /// True when the key came from the credentials file.
    pub from_credentials_file: BTreeMap<String, bool>,
}

impl fmt::Debug for ProfileSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys: BTreeMap<&str, &str> = self
            .keys
            .iter()
            .map(|(k, v)| {
                let shown = if is_secret_name(k) { REDACTED } else { v };
                (k.as_str(), shown)
            })
            .collect();
        f.debug_struct("ProfileSettings")
            .field("keys", &keys)
            .field("origin", &self.origin)
            .field("from_credentials_file", &self.from_credentials_file)
            .finish()
    }
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
        let mut sections = parse_ini(text.expose());
        if let Some(keys) = sections.remove(&section) {
            found = true;
            for (k, v) in keys {
                out.origin.insert(k.clone(), path.clone());
                out.from_credentials_file.insert(k.clone(), is_creds);
                // A value the config file set and the credentials file sets again is wiped.
                if let Some(mut old) = out.keys.insert(k, v) {
                    wipe_string(&mut old);
                }
            }
        }
        // Other profiles' keys are secrets too.
        sections.values_mut().for_each(wipe_values);
    }
    Ok(found.then_some(out))
}

/// Wipes every value of a section (`svc_text::secret_bytes`).
fn wipe_values(keys: &mut BTreeMap<String, String>) {
    keys.values_mut().for_each(wipe_string);
}

impl Drop for ProfileSettings {
    /// The values hold the static keys: wiped (every clone too).
    fn drop(&mut self) {
        wipe_values(&mut self.keys);
    }
}

/// Largest shared file read.
const MAX_SHARED_FILE_BYTES: u64 = 1024 * 1024;

/// The file's text in a wiping owner, read into one allocation of the size the file had
/// (no reallocation leaves a copy behind unless the file grows while it is read).
fn read_file(path: &std::path::Path) -> Result<Option<SecretString>, String> {
    use std::io::Read;
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut text = SecretString::with_capacity(
        usize::try_from(len.min(MAX_SHARED_FILE_BYTES) + 1).unwrap_or(usize::MAX),
    );
    f.take(MAX_SHARED_FILE_BYTES + 1)
        .read_to_string(text.expose_mut())
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if text.len() as u64 > MAX_SHARED_FILE_BYTES {
        return Err(format!(
            "{}: larger than {MAX_SHARED_FILE_BYTES} bytes",
            path.display()
        ));
    }
    Ok(Some(text))
}
