//! Cloud A (OCI) identities: where the key id and the private key of a request signature come
//! from, for each `auth_mode`.
//!
//! - `config_file`: the SDK config file named by the policy (`config_file`), section
//!   `[<profile>]`; keys `user`, `fingerprint`, `tenancy`, `key_file` (required), `pass_phrase`
//!   (only for encrypted keys, which this release refuses), `region` (ignored: the policy's
//!   `region` selects the endpoint). Values of `[DEFAULT]` are inherited by every profile, as
//!   in the SDKs. `key_file` may start with `~/` (the `HOME` directory); a relative path is
//!   resolved against the config file's directory. Key id `<tenancy>/<user>/<fingerprint>`.
//! - `resource_principal`: resource principal version 2.2 from the environment the platform
//!   sets (`OCI_RESOURCE_PRINCIPAL_VERSION` = `2.2`, `OCI_RESOURCE_PRINCIPAL_RPST`,
//!   `OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM`, optional `OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM_PASSPHRASE`,
//!   `OCI_RESOURCE_PRINCIPAL_REGION`). The token and the PEM are either the value itself or an
//!   absolute path to a file holding it. Key id `ST$<token>`. An expired token (JWT `exp`) is
//!   refused before any request. Versions 1.1 and 3.0 (token exchange over the network) are not
//!   implemented.
//! - `instance_principal`: the federation of `instance.rs` (instance metadata
//!   service, then `https://auth.<region>.oraclecloud.com/v1/x509`); key id `ST$<token>` with a
//!   session key generated for the run. The connector calls that module directly to tell a
//!   failed network step (exit 1) from an unusable environment (exit 2).
//!
//! Nothing here prints a key, a passphrase, a token or an OCID: errors name the file, the
//! profile, the key or the variable.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use super::identity::{jwt_expiry, Identity};
use super::signature::{load_private_key, Signer};
use crate::policy::oci::{AuthMode, OciMonitoring};
use svc_host::ini::parse_ini;
use svc_host::Env;
use svc_text::secret_bytes::{read_secret_text, SecretString};

/// The identity could not be established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthError(pub String);

impl std::fmt::Display for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AuthError {}

/// Builds the signer for the policy's `auth_mode`. `now` is used for the token expiry check.
pub fn identity(cfg: &OciMonitoring, env: &dyn Env, now_epoch: i64) -> Result<Identity, AuthError> {
    match cfg.auth_mode {
        AuthMode::ConfigFile => {
            let path = cfg.config_file.as_deref().ok_or_else(|| {
                AuthError(
                    "cloud_a_monitoring.config_file is required for auth_mode config_file".into(),
                )
            })?;
            config_file(Path::new(path), &cfg.profile, env)
        }
        AuthMode::ResourcePrincipal => resource_principal(env, now_epoch),
        AuthMode::InstancePrincipal => super::instance::identity(
            env,
            cfg.push.timeout(),
            &super::super::Deadline::start("cloud_a_monitoring", cfg.push.export_deadline_seconds),
            time::OffsetDateTime::from_unix_timestamp(now_epoch)
                .unwrap_or(time::OffsetDateTime::UNIX_EPOCH),
        )
        .map_err(|e| AuthError(e.message().to_string())),
    }
}

fn is_ocid(v: &str, kind: &str) -> bool {
    v.starts_with(&format!("ocid1.{kind}."))
        && v.len() <= 255
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

fn is_fingerprint(v: &str) -> bool {
    let parts: Vec<&str> = v.split(':').collect();
    parts.len() == 16
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// `config_file` mode.
pub fn config_file(path: &Path, profile: &str, env: &dyn Env) -> Result<Identity, AuthError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        AuthError(format!(
            "cannot read OCI config file {}: {e}",
            path.display()
        ))
    })?;
    let ini = parse_ini(&text);
    let mut section: BTreeMap<String, String> = ini.get("DEFAULT").cloned().unwrap_or_default();
    match ini.get(profile) {
        Some(own) => section.extend(own.clone()),
        None if profile == "DEFAULT" && ini.contains_key("DEFAULT") => {}
        None => {
            return Err(AuthError(format!(
                "OCI config file {} has no profile [{profile}]",
                path.display()
            )))
        }
    }
    let where_ = format!("profile [{profile}] of {}", path.display());
    let get = |k: &str| -> Result<&String, AuthError> {
        section
            .get(k)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| AuthError(format!("{where_} has no {k}")))
    };
    let user = get("user")?;
    let tenancy = get("tenancy")?;
    let fingerprint = get("fingerprint")?;
    let key_file = get("key_file")?;
    if !is_ocid(user, "user") {
        return Err(AuthError(format!(
            "{where_}: user must be a user OCID (ocid1.user.…)"
        )));
    }
    if !is_ocid(tenancy, "tenancy") {
        return Err(AuthError(format!(
            "{where_}: tenancy must be a tenancy OCID (ocid1.tenancy.…)"
        )));
    }
    if !is_fingerprint(fingerprint) {
        return Err(AuthError(format!(
            "{where_}: fingerprint must be 16 colon-separated hex bytes"
        )));
    }
    let key_path = resolve_key_path(key_file, path, env);
    // Wiped when it drops (`svc_text::secret_bytes`), once the key pair is built.
    let pem = read_secret_text(&key_path).map_err(|e| {
        AuthError(format!(
            "cannot read key_file {} ({where_}): {e}",
            key_path.display()
        ))
    })?;
    let key = load_private_key(pem.expose()).map_err(|e| {
        let hint = if section.contains_key("pass_phrase") {
            " (pass_phrase is set, but encrypted keys are not supported)"
        } else {
            ""
        };
        AuthError(format!("key_file {} {e}{hint}", key_path.display()))
    })?;
    Ok(Identity {
        signer: Signer::new(format!("{tenancy}/{user}/{fingerprint}"), key),
        source: format!("API key from {where_}"),
    })
}

fn resolve_key_path(key_file: &str, config: &Path, env: &dyn Env) -> PathBuf {
    if let Some(rest) = key_file.strip_prefix("~/") {
        if let Some(home) = env.var("HOME") {
            return PathBuf::from(home).join(rest);
        }
    }
    let p = PathBuf::from(key_file);
    if p.is_absolute() {
        p
    } else {
        config.parent().unwrap_or(Path::new("/")).join(p)
    }
}

/// The value of a variable that holds either the content or an absolute path to it.
fn value_or_file(env: &dyn Env, var: &str) -> Result<Option<String>, AuthError> {
    match env.var(var) {
        None => Ok(None),
        Some(v) if v.starts_with('/') => read_secret_text(Path::new(&v))
            // The file holds a token or a private key: the untrimmed text is wiped (and text
            // that is not UTF-8 too, before the error returns).
            .map(|t| Some(t.expose().trim().to_string()))
            .map_err(|e| AuthError(format!("cannot read the file named by {var}: {e}"))),
        Some(v) => Ok(Some(v)),
    }
}

/// `resource_principal` mode (version 2.2, from the environment).
pub fn resource_principal(env: &dyn Env, now_epoch: i64) -> Result<Identity, AuthError> {
    match env.var("OCI_RESOURCE_PRINCIPAL_VERSION").as_deref() {
        Some("2.2") => {}
        None => {
            return Err(AuthError(
                "auth_mode resource_principal needs OCI_RESOURCE_PRINCIPAL_VERSION=2.2 and the OCI_RESOURCE_PRINCIPAL_* variables (set by the platform for functions and other resources)".into(),
            ))
        }
        Some(_) => {
            return Err(AuthError(
                "OCI_RESOURCE_PRINCIPAL_VERSION must be 2.2: versions 1.1 and 3.0 need a network token exchange this release does not implement".into(),
            ))
        }
    }
    let token = value_or_file(env, "OCI_RESOURCE_PRINCIPAL_RPST")?
        .filter(|t| !t.is_empty())
        .ok_or_else(|| AuthError("OCI_RESOURCE_PRINCIPAL_RPST is not set".into()))?;
    if token
        .chars()
        .any(|c| c.is_whitespace() || c == '"' || c.is_control())
    {
        return Err(AuthError(
            "OCI_RESOURCE_PRINCIPAL_RPST is not a session token (whitespace or quotes)".into(),
        ));
    }
    if let Some(exp) = jwt_expiry(&token) {
        if exp <= now_epoch {
            return Err(AuthError(format!(
                "the resource principal session token expired {} s ago; the platform must refresh OCI_RESOURCE_PRINCIPAL_RPST",
                now_epoch - exp
            )));
        }
    }
    let pem = value_or_file(env, "OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM")?
        .map(SecretString::new)
        .ok_or_else(|| AuthError("OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM is not set".into()))?;
    if env.var("OCI_RESOURCE_PRINCIPAL_REGION").is_none() {
        return Err(AuthError("OCI_RESOURCE_PRINCIPAL_REGION is not set".into()));
    }
    let key = load_private_key(pem.expose()).map_err(|e| {
        let hint = if env
            .var("OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM_PASSPHRASE")
            .is_some()
        {
            " (a passphrase is set, but encrypted keys are not supported)"
        } else {
            ""
        };
        AuthError(format!("OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM {e}{hint}"))
    })?;
    Ok(Identity {
        signer: Signer::new(format!("ST${token}"), key),
        source: "resource principal 2.2 (OCI_RESOURCE_PRINCIPAL_*)".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::signature::tests::openssl_key_pair;
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;

    const USER: &str = "ocid1.user.oc1..aaaauser";
    const TENANCY: &str = "ocid1.tenancy.oc1..aaaatenancy";
    const FP: &str = "20:3b:97:13:55:1c:5b:0d:d3:37:d8:50:4e:c5:3a:34";

    fn key_id(id: &Identity) -> String {
        // The key id is private to the signer; read it back from a signature header.
        let req = super::super::signature::Request {
            method: "GET",
            host: "h",
            path: "/",
            body: None,
        };
        let h = id
            .signer
            .sign(&req, time::OffsetDateTime::UNIX_EPOCH)
            .unwrap();
        let auth = &h.iter().find(|(n, _)| n == "authorization").unwrap().1;
        auth.split("keyId=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .to_string()
    }

    #[test]
    fn config_file_profiles() {
        let dir = tempfile::tempdir().unwrap();
        let (pkcs8, _, _) = openssl_key_pair();
        std::fs::write(dir.path().join("api.pem"), &pkcs8).unwrap();
        let cfg = dir.path().join("config");
        std::fs::write(
            &cfg,
            format!(
                "[DEFAULT]\nuser={USER}\nfingerprint={FP}\ntenancy={TENANCY}\nregion=eu-frankfurt-1\nkey_file=api.pem\n\n[OTHER]\nuser=ocid1.user.oc1..other\n[BROKEN]\nfingerprint=zz\n[NOKEY]\nkey_file=/nonexistent/key.pem\n"
            ),
        )
        .unwrap();
        let env: BTreeMap<&str, &str> = BTreeMap::new();
        let id = config_file(&cfg, "DEFAULT", &env).unwrap();
        assert_eq!(key_id(&id), format!("{TENANCY}/{USER}/{FP}"));
        let id = config_file(&cfg, "OTHER", &env).unwrap();
        assert_eq!(key_id(&id), format!("{TENANCY}/ocid1.user.oc1..other/{FP}"));
        let e = config_file(&cfg, "BROKEN", &env).unwrap_err();
        assert!(
            e.0.ends_with("fingerprint must be 16 colon-separated hex bytes"),
            "{e}"
        );
        let e = config_file(&cfg, "NOKEY", &env).unwrap_err();
        assert!(
            e.0.starts_with("cannot read key_file /nonexistent/key.pem"),
            "{e}"
        );
        let e = config_file(&cfg, "MISSING", &env).unwrap_err();
        assert!(e.0.ends_with("has no profile [MISSING]"), "{e}");
        let e = config_file(&dir.path().join("nope"), "DEFAULT", &env).unwrap_err();
        assert!(e.0.starts_with("cannot read OCI config file"), "{e}");
        // ~/ expansion
        let home = dir.path().to_str().unwrap();
        std::fs::write(
            &cfg,
            format!("[DEFAULT]\nuser={USER}\nfingerprint={FP}\ntenancy={TENANCY}\nkey_file=~/api.pem\npass_phrase=not-needed\n"),
        )
        .unwrap();
        let env: BTreeMap<&str, &str> = [("HOME", home)].into_iter().collect();
        assert!(config_file(&cfg, "DEFAULT", &env).is_ok());
        std::fs::write(
            &cfg,
            format!("[DEFAULT]\nuser={USER}\nfingerprint={FP}\ntenancy={TENANCY}\n"),
        )
        .unwrap();
        let e = config_file(&cfg, "DEFAULT", &env).unwrap_err();
        assert!(e.0.ends_with("has no key_file"), "{e}");
    }

    fn jwt(exp: i64) -> String {
        let part = |v: &str| URL_SAFE_NO_PAD.encode(v.as_bytes());
        format!(
            "{}.{}.{}",
            part(r#"{"alg":"RS256"}"#),
            part(&format!(r#"{{"exp":{exp},"sub":"x"}}"#)),
            part("sig")
        )
    }

    #[test]
    fn resource_principal_from_env() {
        let dir = tempfile::tempdir().unwrap();
        let (pkcs8, pkcs1, _) = openssl_key_pair();
        let token = jwt(2_000_000_000);
        let pem_path = dir.path().join("rp.pem");
        std::fs::write(&pem_path, &pkcs1).unwrap();
        let tok_path = dir.path().join("rpst");
        std::fs::write(&tok_path, format!("{token}\n")).unwrap();
        let base = |pem: &str, tok: &str| -> BTreeMap<&'static str, String> {
            [
                ("OCI_RESOURCE_PRINCIPAL_VERSION", "2.2".to_string()),
                ("OCI_RESOURCE_PRINCIPAL_RPST", tok.to_string()),
                ("OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM", pem.to_string()),
                (
                    "OCI_RESOURCE_PRINCIPAL_REGION",
                    "eu-frankfurt-1".to_string(),
                ),
            ]
            .into_iter()
            .collect()
        };
        struct E(BTreeMap<&'static str, String>);
        impl Env for E {
            fn var(&self, n: &str) -> Option<String> {
                self.0.get(n).cloned()
            }
        }
        let now = 1_700_000_000;
        let id = resource_principal(&E(base(&pkcs8, &token)), now).unwrap();
        assert_eq!(key_id(&id), format!("ST${token}"));
        let id = resource_principal(
            &E(base(pem_path.to_str().unwrap(), tok_path.to_str().unwrap())),
            now,
        )
        .unwrap();
        assert_eq!(key_id(&id), format!("ST${token}"));
        let e = resource_principal(&E(base(&pkcs8, &jwt(now - 5))), now).unwrap_err();
        assert_eq!(e.0, "the resource principal session token expired 5 s ago; the platform must refresh OCI_RESOURCE_PRINCIPAL_RPST");
        let mut v = base(&pkcs8, &token);
        v.insert("OCI_RESOURCE_PRINCIPAL_VERSION", "1.1".into());
        assert!(resource_principal(&E(v), now)
            .unwrap_err()
            .0
            .starts_with("OCI_RESOURCE_PRINCIPAL_VERSION must be 2.2"));
        let mut v = base(&pkcs8, &token);
        v.remove("OCI_RESOURCE_PRINCIPAL_REGION");
        assert_eq!(
            resource_principal(&E(v), now).unwrap_err().0,
            "OCI_RESOURCE_PRINCIPAL_REGION is not set"
        );
        let mut v = base(
            "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n-----END PRIVATE KEY-----",
            &token,
        );
        v.insert(
            "OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM_PASSPHRASE",
            "hunter2".into(),
        );
        let e = resource_principal(&E(v), now).unwrap_err().0;
        assert!(
            e.contains("encrypted keys are not supported")
                && !e.contains("hunter2")
                && !e.contains("c2VjcmV0"),
            "{e}"
        );
        let e = resource_principal(&E(BTreeMap::new()), now).unwrap_err().0;
        assert!(
            e.starts_with("auth_mode resource_principal needs OCI_RESOURCE_PRINCIPAL_VERSION=2.2")
        );
    }

    #[test]
    fn instance_principal_names_the_failed_step() {
        let mut cfg = crate::policy::Policy::disabled().cloud_a_monitoring;
        cfg.auth_mode = AuthMode::InstancePrincipal;
        cfg.push.timeout_seconds = 2.0;
        // a closed loopback port stands for an unreachable metadata service
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}");
        let env: BTreeMap<&str, &str> = [("SVC_OCI_METADATA_OVERRIDE", url.as_str())]
            .into_iter()
            .collect();
        let e = identity(&cfg, &env, 0).unwrap_err();
        assert!(
            e.0.starts_with(
                "instance principal step 1 (instance metadata /opc/v2/instance/region) failed: "
            ),
            "{e}"
        );
        let env: BTreeMap<&str, &str> = [("SVC_OCI_METADATA_OVERRIDE", "http://example.com")]
            .into_iter()
            .collect();
        let e = identity(&cfg, &env, 0).unwrap_err();
        assert!(
            e.0.starts_with("SVC_OCI_METADATA_OVERRIDE must name a loopback host"),
            "{e}"
        );
    }
}
