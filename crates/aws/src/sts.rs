//! AWS STS over the query protocol: `AssumeRole` (signed with SigV4 by the source
//! credentials) and `AssumeRoleWithWebIdentity` (unsigned by design: the web identity token is
//! the proof). Endpoint: `AWS_ENDPOINT_URL_STS`, else `AWS_ENDPOINT_URL` (both ignored with
//! `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true`), else the regional
//! `https://sts.<region>.amazonaws.com`. One whole-operation deadline and a size bound per
//! call; the answer is parsed by [`super::parse::parse_sts_credentials`].

use std::time::Duration;

use super::credentials::Credentials;
use super::http::{Call, Deadline, Http};
use super::parse::{parse_sts_credentials, parse_sts_error, Issued};
use super::{checked_url, endpoint_override, sigv4, Env, UrlRule};
use svc_text::secrets::Secrets;

/// Deadline of one STS call, connect to last byte.
pub const STS_DEADLINE: Duration = Duration::from_secs(10);
/// Largest STS answer read (a real one is under 4 KiB).
pub const MAX_STS_ANSWER: u64 = 64 * 1024;
const CONTENT_TYPE: &str = "application/x-www-form-urlencoded; charset=utf-8";

/// A resolved STS endpoint.
pub struct Sts {
    http: Http,
    /// `scheme://authority/path`.
    url: String,
    /// Host header value (`host[:port]`, the port only when not the scheme's default).
    host: String,
    path: String,
    region: String,
    /// Where the URL came from, for messages: a variable name or `regional endpoint`.
    pub origin: String,
}

impl Sts {
    /// The endpoint for `region`, with the override variables applied and checked.
    pub fn resolve(env: &dyn Env, region: &str) -> Result<Sts, String> {
        let (text, origin) = match endpoint_override(env, "AWS_ENDPOINT_URL_STS") {
            Some((var, v)) => (v, var.to_string()),
            None => (
                format!("https://sts.{region}.amazonaws.com"),
                "regional endpoint".to_string(),
            ),
        };
        let u = checked_url(&origin, &text, UrlRule::HttpsOrLoopback)?;
        let host = match u.port() {
            Some(p) => format!("{}:{p}", u.host_str().unwrap_or_default()),
            None => u.host_str().unwrap_or_default().to_string(),
        };
        let path = if u.path().is_empty() { "/" } else { u.path() }.to_string();
        Ok(Sts {
            http: Http::new(true, Duration::from_secs(3)),
            url: format!("{}://{host}{path}", u.scheme()),
            host,
            path,
            region: region.to_string(),
            origin,
        })
    }

    /// `AssumeRole` of `role_arn`, signed with `source`.
    pub fn assume_role(
        &self,
        source: &Credentials,
        role_arn: &str,
        session_name: &str,
        external_id: Option<&str>,
    ) -> Result<Issued, String> {
        let mut pairs = vec![
            ("Action", "AssumeRole"),
            ("RoleArn", role_arn),
            ("RoleSessionName", session_name),
        ];
        if let Some(x) = external_id {
            pairs.push(("ExternalId", x));
        }
        pairs.push(("Version", "2011-06-15"));
        let body = form(&pairs);
        let amz_date = sigv4::amz_date(time::OffsetDateTime::now_utc());
        let signed = sigv4::sign(
            &sigv4::Request {
                method: "POST",
                host: &self.host,
                path: &self.path,
                query: "",
                headers: &[("Content-Type", CONTENT_TYPE)],
                payload_sha256: &sigv4::hex_sha256(body.as_bytes()),
            },
            &sigv4::Scope {
                region: &self.region,
                service: "sts",
                amz_date: &amz_date,
            },
            source,
        );
        let mut headers: Vec<(&str, &str)> = vec![("Content-Type", CONTENT_TYPE)];
        headers.extend(signed.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        self.call("AssumeRole", &headers, &body, None)
    }

    /// `AssumeRoleWithWebIdentity` of `role_arn` with the web identity `token` (unsigned).
    pub fn assume_role_with_web_identity(
        &self,
        role_arn: &str,
        session_name: &str,
        token: &str,
    ) -> Result<Issued, String> {
        let body = form(&[
            ("Action", "AssumeRoleWithWebIdentity"),
            ("RoleArn", role_arn),
            ("RoleSessionName", session_name),
            ("Version", "2011-06-15"),
            ("WebIdentityToken", token),
        ]);
        self.call(
            "AssumeRoleWithWebIdentity",
            &[("Content-Type", CONTENT_TYPE)],
            &body,
            Some(token),
        )
    }

    fn call(
        &self,
        action: &str,
        headers: &[(&str, &str)],
        body: &str,
        body_secret: Option<&str>,
    ) -> Result<Issued, String> {
        let what = format!("STS {action} at {} ({})", self.url, self.origin);
        let deadline = Deadline::after(STS_DEADLINE);
        let reply = self.http.call(
            Call {
                method: "POST",
                url: &self.url,
                headers,
                body: Some(body.as_bytes()),
                limit: MAX_STS_ANSWER,
            },
            &deadline,
            &what,
        )?;
        // The answer's text is shown scrubbed of the request's secrets (a web identity token
        // travels in the body, not in a header) before it is cut.
        let mut hidden = Secrets::new();
        if let Some(t) = body_secret {
            hidden.add(t);
        }
        let scrubbed = hidden
            .scrub(&String::from_utf8_lossy(&reply.body))
            .into_owned();
        if !(200..300).contains(&reply.status) {
            return Err(reply.hide(format!(
                "{what}: HTTP {}: {}",
                reply.status,
                parse_sts_error(scrubbed.as_bytes())
            )));
        }
        parse_sts_credentials(action, &reply.body)
            .map_err(|e| reply.hide(hidden.scrub(&format!("{what}: {e}")).into_owned()))
    }
}

/// The query protocol's form body (RFC 3986 percent-encoding, as SigV4 wants it).
fn form(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| {
            format!(
                "{}={}",
                sigv4::uri_encode(k, true),
                sigv4::uri_encode(v, true)
            )
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// A role session name: the configured one, else `svc-<unix seconds>` (STS wants 2 to 64 of
/// `[\w+=,.@-]`).
pub fn session_name(configured: Option<String>) -> String {
    configured
        .unwrap_or_else(|| format!("svc-{}", time::OffsetDateTime::now_utc().unix_timestamp()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn endpoint_resolution() {
        let env = |p: &[(&'static str, &'static str)]| -> BTreeMap<&str, &str> {
            p.iter().copied().collect()
        };
        let s = Sts::resolve(&env(&[]), "eu-west-1").unwrap();
        assert_eq!(s.url, "https://sts.eu-west-1.amazonaws.com/");
        assert_eq!(s.host, "sts.eu-west-1.amazonaws.com");
        let s = Sts::resolve(
            &env(&[
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:1"),
                ("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:5000"),
            ]),
            "r",
        )
        .unwrap();
        assert_eq!(
            (s.url.as_str(), s.origin.as_str()),
            ("http://127.0.0.1:5000/", "AWS_ENDPOINT_URL_STS")
        );
        let s = Sts::resolve(
            &env(&[("AWS_ENDPOINT_URL", "https://sts.example:443")]),
            "r",
        )
        .unwrap();
        assert_eq!(s.host, "sts.example");
        let e = Sts::resolve(&env(&[("AWS_ENDPOINT_URL_STS", "http://sts.example")]), "r")
            .err()
            .unwrap();
        assert!(e.starts_with("AWS_ENDPOINT_URL_STS: plain http"), "{e}");
        assert_eq!(form(&[("A", "b c/d")]), "A=b%20c%2Fd");
    }
}
