//! The credential sources through the chain (`chain.rs` includes this file): each mode and the
//! default chain resolved from an environment.

use crate::credentials::*;
use crate::Env;

/// Resolves and returns the current credentials and their source (the old one-shot interface
/// over [`super::provider`]).
pub fn resolve(mode: &CredentialMode, env: &dyn Env) -> Result<(Credentials, Source), String> {
    let p = super::provider(mode, env, None)?;
    let c = p.current()?;
    Ok(((*c).clone(), p.source()))
}

pub fn resolve_chain(env: &dyn Env) -> Result<(Credentials, Source), CredentialError> {
    let p = super::default_chain(env, None).map_err(CredentialError)?;
    let c = p.current().map_err(CredentialError)?;
    Ok(((*c).clone(), p.source()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap};

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
            (c.access_key_id.as_str(), c.session_token.clone()),
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
