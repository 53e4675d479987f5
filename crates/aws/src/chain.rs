//! The AWS default credential chain, in the SDKs' order (the Java v2 and Go v2 SDKs'; the
//! first source that is configured answers, and a source that is configured but fails is an
//! error, not a fall-through):
//!
//! 1. environment: `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`);
//! 2. web identity: `AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN` (+ `AWS_ROLE_SESSION_NAME`)
//!    through STS `AssumeRoleWithWebIdentity` (EKS IRSA); the token file is read at every
//!    fetch (it rotates);
//! 3. profile `AWS_PROFILE` (else `default`) of the shared files: `role_arn` with
//!    `source_profile` (+ `external_id`, `role_session_name`) through STS `AssumeRole` signed
//!    with the source profile's credentials (which may be a role or a process themselves);
//!    else static keys; else `credential_process`;
//! 4. container credentials (ECS, EKS Pod Identity): see [`super::metadata::Container`];
//! 5. instance metadata, IMDSv2 only: see [`super::metadata::Imds`].
//!
//! STS calls go to `AWS_ENDPOINT_URL_STS`, else `AWS_ENDPOINT_URL`, else
//! `https://sts.<region>.amazonaws.com`, the region being `AWS_REGION`, else
//! `AWS_DEFAULT_REGION`, else the profile's `region`, else the caller's region (the sink's or
//! the connector's), else `us-east-1`.
//!
//! The environment is read once, here; the fetches keep owned copies of what they need, so
//! the refresh thread ([`super::provider`]) never reads it again.

use std::sync::Arc;

use super::credentials::{
    chain_profile, files_shown, from_environment, from_named_variables, load_profile,
    CredentialMode, Source,
};
use super::metadata::{read_bounded, Container, Imds};
use super::parse::Issued;
use super::process;
use super::provider::{Fetch, Provider};
use super::sts::{session_name, Sts};
use super::Env;

/// Profiles followed through `source_profile` at most (a longer chain is a loop).
const MAX_ROLE_CHAIN: usize = 5;

/// The provider of a sink `credential_mode`. Errors start with the mode. `region` is the
/// caller's region, the STS region when the environment names none.
pub fn provider(
    mode: &CredentialMode,
    env: &dyn Env,
    region: Option<&str>,
) -> Result<Provider, String> {
    match mode {
        CredentialMode::Environment {
            access_key_id_env,
            secret_access_key_env,
            session_token_env,
        } => {
            let (c, s) = from_named_variables(
                access_key_id_env,
                secret_access_key_env,
                session_token_env.as_deref(),
                env,
            )?;
            Ok(Provider::fixed(c, s))
        }
        CredentialMode::Profile { profile_name } => {
            match profile_fetch(profile_name, env, region, &mut Vec::new())
                .map_err(|e| format!("credential_mode profile: {e}"))?
            {
                Some(fetch) => {
                    Provider::refreshing(fetch).map_err(|e| format!("credential_mode profile: {e}"))
                }
                None => Err(format!(
                    "credential_mode profile: profile {profile_name} not found in {}",
                    files_shown(env).replacen(" and ", " or ", 1)
                )),
            }
        }
        CredentialMode::DefaultChain => {
            default_chain(env, region).map_err(|e| format!("credential_mode default_chain: {e}"))
        }
    }
}

/// The default chain (module comment). The error of the source that failed, or, when none is
/// configured, the list of what was checked.
pub fn default_chain(env: &dyn Env, region: Option<&str>) -> Result<Provider, String> {
    if let Some((c, s)) = from_environment(env)? {
        return Ok(Provider::fixed(c, s));
    }
    if let Some(token_file) = env.var("AWS_WEB_IDENTITY_TOKEN_FILE") {
        let role_arn = env.var("AWS_ROLE_ARN").ok_or(
            "AWS_WEB_IDENTITY_TOKEN_FILE is set but AWS_ROLE_ARN is not (both are needed for \
             web identity credentials)",
        )?;
        let sts = Sts::resolve(env, &sts_region(env, None, region))?;
        let session = session_name(env.var("AWS_ROLE_SESSION_NAME"));
        let path = std::path::PathBuf::from(token_file);
        let fetch: Fetch = Box::new(move || {
            let token = read_bounded(
                &path,
                &format!("AWS_WEB_IDENTITY_TOKEN_FILE {}", path.display()),
            )
            .map_err(|e| svc_text::error_chain(&e))?;
            let issued = sts.assume_role_with_web_identity(&role_arn, &session, &token)?;
            let source = Source::WebIdentity {
                role_arn: role_arn.clone(),
            };
            Ok((issued, source))
        });
        return Provider::refreshing(fetch);
    }
    let profile = chain_profile(env);
    if let Some(fetch) = profile_fetch(&profile, env, region, &mut Vec::new())? {
        return Provider::refreshing(fetch);
    }
    if let Some(container) = Container::from_env(env)? {
        let container = Arc::new(container);
        let fetch: Fetch = Box::new(move || {
            let issued = container.fetch()?;
            let url = container.shown.clone();
            Ok((issued, Source::Container { url }))
        });
        return Provider::refreshing(fetch);
    }
    let imds_note = match Imds::from_env(env)? {
        None => "instance metadata disabled by AWS_EC2_METADATA_DISABLED".to_string(),
        Some(imds) => {
            let fetch: Fetch = Box::new(move || {
                let (issued, role) = imds.fetch()?;
                let endpoint = imds.base().to_string();
                Ok((issued, Source::InstanceMetadata { endpoint, role }))
            });
            match Provider::refreshing(fetch) {
                Ok(p) => return Ok(p),
                Err(e) => e,
            }
        }
    };
    Err(format!(
        "no AWS credentials found: checked AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, \
         AWS_WEB_IDENTITY_TOKEN_FILE, profile {profile} in {}, \
         AWS_CONTAINER_CREDENTIALS_RELATIVE_URI/AWS_CONTAINER_CREDENTIALS_FULL_URI, then \
         {imds_note}",
        files_shown(env)
    ))
}

/// The STS region (module comment).
fn sts_region(env: &dyn Env, profile_region: Option<&str>, caller: Option<&str>) -> String {
    env.var("AWS_REGION")
        .or_else(|| env.var("AWS_DEFAULT_REGION"))
        .or_else(|| profile_region.map(str::to_string))
        .or_else(|| caller.map(str::to_string))
        .unwrap_or_else(|| "us-east-1".to_string())
}

/// The fetch of one profile's credentials; `Ok(None)` when neither file has the profile or
/// it has no credential settings. `seen` holds the profiles already on this `source_profile`
/// path.
fn profile_fetch(
    profile: &str,
    env: &dyn Env,
    region: Option<&str>,
    seen: &mut Vec<String>,
) -> Result<Option<Fetch>, String> {
    let Some(settings) = load_profile(profile, env)? else {
        return Ok(None);
    };
    if let Some(role_arn) = settings.get("role_arn") {
        let what = settings.what(profile, "role_arn");
        let Some(source_profile) = settings.get("source_profile") else {
            let why = if settings.get("credential_source").is_some() {
                "credential_source is not supported; use source_profile"
            } else if settings.get("web_identity_token_file").is_some() {
                "web_identity_token_file in a profile is not supported; use \
                 AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN"
            } else {
                "it needs source_profile (the profile whose credentials call STS AssumeRole)"
            };
            return Err(format!("{what} has role_arn, but {why}"));
        };
        seen.push(profile.to_string());
        let base: Fetch = if source_profile == profile {
            // The SDKs' rule: a profile that is its own source uses its static keys.
            let (c, s) = settings.static_keys(profile)?.ok_or_else(|| {
                format!("{what} is its own source_profile but has no static keys")
            })?;
            Box::new(move || {
                Ok((
                    Issued {
                        credentials: c.clone(),
                        expiration: None,
                    },
                    s.clone(),
                ))
            })
        } else {
            if seen.iter().any(|p| p == source_profile) || seen.len() > MAX_ROLE_CHAIN {
                return Err(format!(
                    "{what}: source_profile chain {} -> {source_profile} loops or is longer \
                     than {MAX_ROLE_CHAIN}",
                    seen.join(" -> ")
                ));
            }
            profile_fetch(source_profile, env, region, seen)?.ok_or_else(|| {
                format!("{what}: source_profile {source_profile} not found or has no credentials")
            })?
        };
        let sts = Sts::resolve(env, &sts_region(env, settings.get("region"), region))?;
        let session = session_name(settings.get("role_session_name").map(str::to_string));
        let external_id = settings.get("external_id").map(str::to_string);
        let (profile, role_arn, source_profile) = (
            profile.to_string(),
            role_arn.to_string(),
            source_profile.to_string(),
        );
        return Ok(Some(Box::new(move || {
            let (base_creds, _) = base()?;
            let issued = sts.assume_role(
                &base_creds.credentials,
                &role_arn,
                &session,
                external_id.as_deref(),
            )?;
            let source = Source::AssumeRole {
                profile: profile.clone(),
                role_arn: role_arn.clone(),
                source_profile: source_profile.clone(),
            };
            Ok((issued, source))
        })));
    }
    if let Some((c, s)) = settings.static_keys(profile)? {
        return Ok(Some(Box::new(move || {
            Ok((
                Issued {
                    credentials: c.clone(),
                    expiration: None,
                },
                s.clone(),
            ))
        })));
    }
    if let Some(command) = settings.get("credential_process") {
        let what = settings.what(profile, "credential_process");
        let (command, profile) = (command.to_string(), profile.to_string());
        return Ok(Some(Box::new(move || {
            let issued = process::run(&command, &what).map_err(|e| svc_text::error_chain(&e))?;
            let source = Source::Process {
                profile: profile.clone(),
            };
            Ok((issued, source))
        })));
    }
    for key in [
        "sso_session",
        "sso_start_url",
        "web_identity_token_file",
        "credential_source",
    ] {
        if settings.get(key).is_some() {
            return Err(format!(
                "{} uses {key}, which this release does not support; use static keys, \
                 role_arn with source_profile, or credential_process",
                settings.what(profile, key)
            ));
        }
    }
    Ok(None)
}

#[cfg(test)]
#[path = "credentials_tests.rs"]
mod credentials_tests;
