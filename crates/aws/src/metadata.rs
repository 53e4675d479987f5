//! Credentials from the endpoints AWS runs next to the workload: the ECS/EKS container
//! credentials endpoint ([`Container`]) and the EC2 instance metadata service, IMDSv2 only
//! ([`Imds`]). Both answer the JSON [`super::parse::parse_metadata_credentials`] reads.
//!
//! Container (as the SDKs do it): `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` is a path on
//! `http://169.254.170.2`; else `AWS_CONTAINER_CREDENTIALS_FULL_URI`, https, or plain http to
//! loopback or to AWS's link-local credential addresses (EKS Pod Identity's
//! `169.254.170.23`). The `Authorization` header comes from the file named by
//! `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` (read at every fetch: EKS rotates it), else from
//! `AWS_CONTAINER_AUTHORIZATION_TOKEN`.
//!
//! IMDSv2: `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds`, then
//! `GET /latest/meta-data/iam/security-credentials/` (the role name) and
//! `GET .../security-credentials/<role>`, both with `X-aws-ec2-metadata-token`. IMDSv1 (no
//! token) is never used. Endpoint `AWS_EC2_METADATA_SERVICE_ENDPOINT`, else
//! `http://[fd00:ec2::254]` with `AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE=IPv6`, else
//! `http://169.254.169.254`; skipped with `AWS_EC2_METADATA_DISABLED=true`.
//!
//! Each fetch is one operation under one deadline; every answer is size-bounded.

use std::path::PathBuf;
use std::time::Duration;

use super::http::{Call, Deadline, Http};
use super::parse::{parse_metadata_credentials, Issued};
use super::{checked_url, Env, UrlRule};
use svc_text::error_chain;
use svc_text::peer::PeerText;

/// Deadline of one container-endpoint fetch.
pub const CONTAINER_DEADLINE: Duration = Duration::from_secs(5);
/// Deadline of one IMDS fetch (token, role, credentials). Off EC2 the address does not
/// answer: the 1 s connect timeout ends the attempt well before.
pub const IMDS_DEADLINE: Duration = Duration::from_secs(5);
/// Largest credentials answer read.
pub const MAX_CREDENTIALS_ANSWER: u64 = 16 * 1024;
/// Largest token (IMDS session token, container authorization token) accepted.
pub const MAX_TOKEN_BYTES: u64 = 16 * 1024;
/// IMDS session token lifetime asked for: 6 hours, the SDKs' value (one token per fetch).
pub const IMDS_TOKEN_TTL_SECONDS: &str = "21600";
const ECS_HOST: &str = "http://169.254.170.2";

enum Authorization {
    None,
    Token(String),
    File(PathBuf),
}

/// The container credentials endpoint.
pub struct Container {
    http: Http,
    url: String,
    /// Scheme, authority and path (no query), safe to print.
    pub shown: String,
    auth: Authorization,
}

impl Container {
    /// `None` when neither URI variable is set.
    pub fn from_env(env: &dyn Env) -> Result<Option<Container>, String> {
        let (var, url) = if let Some(rel) = env.var("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") {
            if !rel.starts_with('/') {
                return Err("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI: must start with /".into());
            }
            (
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                format!("{ECS_HOST}{rel}"),
            )
        } else if let Some(full) = env.var("AWS_CONTAINER_CREDENTIALS_FULL_URI") {
            ("AWS_CONTAINER_CREDENTIALS_FULL_URI", full)
        } else {
            return Ok(None);
        };
        let u = checked_url(var, &url, UrlRule::AwsLinkLocal)?;
        let shown = format!(
            "{}://{}{}",
            u.scheme(),
            &u[url::Position::BeforeHost..url::Position::AfterPort],
            u.path()
        );
        let auth = if let Some(f) = env.var("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") {
            Authorization::File(PathBuf::from(f))
        } else if let Some(t) = env.var("AWS_CONTAINER_AUTHORIZATION_TOKEN") {
            check_token("AWS_CONTAINER_AUTHORIZATION_TOKEN", &t)?;
            Authorization::Token(t)
        } else {
            Authorization::None
        };
        Ok(Some(Container {
            http: Http::new(false, Duration::from_secs(1)),
            url: u.to_string(),
            shown,
            auth,
        }))
    }

    pub fn fetch(&self) -> Result<Issued, String> {
        let what = format!("container credentials endpoint {}", self.shown);
        let token = match &self.auth {
            Authorization::None => None,
            Authorization::Token(t) => Some(t.clone()),
            Authorization::File(path) => {
                let name = format!("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE {}", path.display());
                let t = read_bounded(path, &name).map_err(|e| error_chain(&e))?;
                check_token(&name, &t)?;
                Some(t)
            }
        };
        let headers: Vec<(&str, &str)> = match &token {
            Some(t) => vec![
                ("Authorization", t.as_str()),
                ("Accept", "application/json"),
            ],
            None => vec![("Accept", "application/json")],
        };
        let deadline = Deadline::after(CONTAINER_DEADLINE);
        let reply = self.http.call(
            Call {
                method: "GET",
                url: &self.url,
                headers: &headers,
                body: None,
                limit: MAX_CREDENTIALS_ANSWER,
            },
            &deadline,
            &what,
        )?;
        parse_metadata_credentials(reply.ok(&what)?).map_err(|e| reply.hide(format!("{what}: {e}")))
    }
}

/// A token file that gave no token. `Display` names the file and what is wrong with it, never
/// its content; when it could not be read, the I/O error is `source()`, printed once by
/// whoever prints the chain ([`svc_text::error_chain`]).
#[derive(Debug)]
pub struct TokenFileError {
    message: String,
    source: Option<std::io::Error>,
}

impl std::fmt::Display for TokenFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TokenFileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Reads a token file (web identity, container authorization): at most
/// [`MAX_TOKEN_BYTES`], trailing newline trimmed. The error names the file, never the content.
pub fn read_bounded(path: &std::path::Path, name: &str) -> Result<String, TokenFileError> {
    use std::io::Read;
    let unreadable = |e| TokenFileError {
        message: format!("{name}: cannot read"),
        source: Some(e),
    };
    let bad = |message| TokenFileError {
        message,
        source: None,
    };
    let f = std::fs::File::open(path).map_err(unreadable)?;
    let mut buf = Vec::new();
    f.take(MAX_TOKEN_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(unreadable)?;
    if buf.len() as u64 > MAX_TOKEN_BYTES {
        return Err(bad(format!("{name}: larger than {MAX_TOKEN_BYTES} bytes")));
    }
    let text = String::from_utf8(buf).map_err(|_| bad(format!("{name}: not UTF-8")))?;
    let t = text.trim_end_matches(['\n', '\r']).to_string();
    if t.is_empty() {
        return Err(bad(format!("{name}: empty")));
    }
    Ok(t)
}

/// A header value must be visible ASCII (and spaces): no CR/LF header injection.
fn check_token(name: &str, t: &str) -> Result<(), String> {
    if t.is_empty() || !t.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) {
        return Err(format!(
            "{name}: the token is empty or has characters other than visible ASCII"
        ));
    }
    Ok(())
}

/// The EC2 instance metadata service (IMDSv2).
pub struct Imds {
    http: Http,
    base: String,
}

impl Imds {
    /// `None` when `AWS_EC2_METADATA_DISABLED` is `true`.
    pub fn from_env(env: &dyn Env) -> Result<Option<Imds>, String> {
        if env
            .var("AWS_EC2_METADATA_DISABLED")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        {
            return Ok(None);
        }
        let (name, text) = match env.var("AWS_EC2_METADATA_SERVICE_ENDPOINT") {
            Some(v) => ("AWS_EC2_METADATA_SERVICE_ENDPOINT", v),
            None => match env.var("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE") {
                Some(m) if m.eq_ignore_ascii_case("ipv6") => {
                    ("IMDS IPv6 endpoint", "http://[fd00:ec2::254]".to_string())
                }
                Some(m) if !m.eq_ignore_ascii_case("ipv4") => {
                    return Err(format!(
                        "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE: {} is neither IPv4 nor IPv6",
                        PeerText::new(&m)
                    ))
                }
                _ => ("IMDS endpoint", "http://169.254.169.254".to_string()),
            },
        };
        let u = checked_url(name, &text, UrlRule::AwsLinkLocal)?;
        Ok(Some(Imds {
            http: Http::new(false, Duration::from_secs(1)),
            base: u.as_str().trim_end_matches('/').to_string(),
        }))
    }

    /// The endpoint, safe to print.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Token, role name, credentials: one operation under [`IMDS_DEADLINE`]. Returns the
    /// credentials and the role name.
    pub fn fetch(&self) -> Result<(Issued, String), String> {
        let deadline = Deadline::after(IMDS_DEADLINE);
        let what = format!("instance metadata (IMDSv2) at {}", self.base);
        let token = self
            .http
            .call(
                Call {
                    method: "PUT",
                    url: &format!("{}/latest/api/token", self.base),
                    headers: &[(
                        "X-aws-ec2-metadata-token-ttl-seconds",
                        IMDS_TOKEN_TTL_SECONDS,
                    )],
                    body: Some(b""),
                    limit: MAX_TOKEN_BYTES,
                },
                &deadline,
                &format!("{what}: session token"),
            )?
            .ok(&format!("{what}: session token"))?
            .to_vec();
        let token = String::from_utf8(token)
            .ok()
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| format!("{what}: the session token is not visible ASCII"))?;
        let creds_path = format!("{}/latest/meta-data/iam/security-credentials/", self.base);
        let auth = [("X-aws-ec2-metadata-token", token.as_str())];
        let roles = self
            .http
            .call(
                Call {
                    method: "GET",
                    url: &creds_path,
                    headers: &auth,
                    body: None,
                    limit: MAX_TOKEN_BYTES,
                },
                &deadline,
                &format!("{what}: role name"),
            )?
            .ok(&format!(
                "{what}: role name (is an instance profile attached?)"
            ))?
            .to_vec();
        let roles = String::from_utf8_lossy(&roles);
        let role = roles.lines().next().unwrap_or_default().trim().to_string();
        if role.is_empty()
            || role.len() > 64
            || !role
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+=,.@_-".contains(&b))
        {
            return Err(format!("{what}: not a role name: {}", PeerText::new(&role)));
        }
        let reply = self.http.call(
            Call {
                method: "GET",
                url: &format!("{creds_path}{role}"),
                headers: &auth,
                body: None,
                limit: MAX_CREDENTIALS_ANSWER,
            },
            &deadline,
            &format!("{what}: credentials of role {role}"),
        )?;
        let body = reply.ok(&format!("{what}: credentials of role {role}"))?;
        let issued =
            parse_metadata_credentials(body).map_err(|e| reply.hide(format!("{what}: {e}")))?;
        Ok((issued, role))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn an_unreadable_token_file_keeps_the_io_error_as_its_cause() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("token");
        let e = read_bounded(&missing, "TOKEN_FILE t").unwrap_err();
        assert_eq!(e.to_string(), "TOKEN_FILE t: cannot read");
        let cause = std::error::Error::source(&e).map(|c| c.to_string());
        assert_eq!(
            cause.as_deref(),
            Some("No such file or directory (os error 2)")
        );
        assert_eq!(
            error_chain(&e),
            "TOKEN_FILE t: cannot read: No such file or directory (os error 2)"
        );
        std::fs::write(&missing, "\n").unwrap();
        let e = read_bounded(&missing, "TOKEN_FILE t").unwrap_err();
        assert_eq!(error_chain(&e), "TOKEN_FILE t: empty");
    }

    fn env<'a>(p: &[(&'a str, &'a str)]) -> BTreeMap<&'a str, &'a str> {
        p.iter().copied().collect()
    }

    #[test]
    fn container_urls() {
        let c = Container::from_env(&env(&[(
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "/v2/credentials/abc?x=1",
        )]))
        .unwrap()
        .unwrap();
        assert_eq!(c.url, "http://169.254.170.2/v2/credentials/abc?x=1");
        assert_eq!(c.shown, "http://169.254.170.2/v2/credentials/abc");
        for ok in [
            "http://127.0.0.1:9/creds",
            "http://169.254.170.23/v1/credentials",
            "http://[fd00:ec2::23]/v1/credentials",
            "https://creds.example/x",
        ] {
            let e = env(&[("AWS_CONTAINER_CREDENTIALS_FULL_URI", ok)]);
            assert!(Container::from_env(&e).unwrap().is_some(), "{ok}");
        }
        for bad in [
            "http://10.0.0.1/creds",
            "ftp://127.0.0.1/",
            "http://u:p@127.0.0.1/",
        ] {
            let e = env(&[("AWS_CONTAINER_CREDENTIALS_FULL_URI", bad)]);
            let err = Container::from_env(&e).err().unwrap();
            assert!(
                err.starts_with("AWS_CONTAINER_CREDENTIALS_FULL_URI: "),
                "{err}"
            );
            assert!(!err.contains("u:p"), "{err}");
        }
        let e = env(&[
            ("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://127.0.0.1:9/"),
            ("AWS_CONTAINER_AUTHORIZATION_TOKEN", "a\r\nX-Evil: 1"),
        ]);
        let err = Container::from_env(&e).err().unwrap();
        assert!(
            err.contains("visible ASCII") && !err.contains("Evil"),
            "{err}"
        );
        assert!(Container::from_env(&env(&[])).unwrap().is_none());
    }

    #[test]
    fn imds_endpoints() {
        let ep = |p: &[(&str, &str)]| Imds::from_env(&env(p)).map(|o| o.map(|i| i.base));
        assert_eq!(ep(&[]).unwrap().unwrap(), "http://169.254.169.254");
        assert_eq!(
            ep(&[("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", "IPv6")])
                .unwrap()
                .unwrap(),
            "http://[fd00:ec2::254]"
        );
        assert_eq!(
            ep(&[("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:8/")])
                .unwrap()
                .unwrap(),
            "http://127.0.0.1:8"
        );
        assert!(ep(&[("AWS_EC2_METADATA_DISABLED", "TRUE")])
            .unwrap()
            .is_none());
        assert!(ep(&[("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://10.1.1.1")]).is_err());
        assert!(ep(&[("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", "v5")]).is_err());
    }
}
