//! What talking to AWS needs, shared by the object-store sink (S3) and the cloud-B exporter
//! connector (CloudWatch): AWS Signature Version 4 ([`sigv4`]), the credential chain and the
//! credential modes ([`credentials`]), the endpoint override variables
//! ([`endpoint_override`]), and the environment seam ([`Env`], from [`svc_host`]) the resolution reads through.
//!
//! Neutral on purpose: nothing here depends on sink or exporter code, so neither depends on
//! the other. Validation of an endpoint URL (which schemes and hosts are acceptable) stays with
//! each caller, whose configuration decides it.

pub mod chain;
pub mod credentials;
pub mod http;
pub mod metadata;
pub mod parse;
pub mod process;
pub mod provider;
pub mod sigv4;
pub mod sts;

pub use svc_host::{Env, ProcessEnv};

/// The endpoint override the AWS SDKs honour for one service: `service_var` (e.g.
/// `AWS_ENDPOINT_URL_S3`), else `AWS_ENDPOINT_URL`; neither when
/// `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS` is `true` (any case). Returns the variable that
/// applies and its value, unvalidated (the caller checks it and names the variable).
pub fn endpoint_override(
    env: &dyn Env,
    service_var: &'static str,
) -> Option<(&'static str, String)> {
    let ignore = env
        .var("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if ignore {
        return None;
    }
    [service_var, "AWS_ENDPOINT_URL"]
        .into_iter()
        .find_map(|n| env.var(n).map(|v| (n, v)))
}

/// Which plain-http hosts a credential endpoint URL may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UrlRule {
    /// https anywhere, http to loopback only (STS, `AWS_CONTAINER_CREDENTIALS_FULL_URI`).
    HttpsOrLoopback,
    /// As [`UrlRule::HttpsOrLoopback`], plus http to the link-local addresses AWS serves
    /// credentials on: ECS `169.254.170.2`, EKS Pod Identity `169.254.170.23` and
    /// `[fd00:ec2::23]`, instance metadata `169.254.169.254` and `[fd00:ec2::254]`.
    AwsLinkLocal,
}

/// True for `localhost`, `127.0.0.0/8` and `[::1]`.
pub fn is_loopback(host: &url::Host<&str>) -> bool {
    match host {
        url::Host::Domain(d) => d.eq_ignore_ascii_case("localhost"),
        url::Host::Ipv4(a) => a.is_loopback(),
        url::Host::Ipv6(a) => a.is_loopback(),
    }
}

/// Parses and checks the URL of a credential endpoint: http or https, no user info, no
/// fragment, plain http only to the hosts `rule` allows. Errors start with `name` (the
/// variable or setting) and never repeat the URL (it may carry a token in its query).
pub fn checked_url(name: &str, text: &str, rule: UrlRule) -> Result<url::Url, String> {
    let u = url::Url::parse(text).map_err(|e| format!("{name}: not a valid URL ({e})"))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(format!("{name}: the scheme must be http or https"));
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(format!("{name}: must not contain credentials"));
    }
    if u.fragment().is_some() {
        return Err(format!("{name}: must not contain a fragment"));
    }
    let Some(host) = u.host() else {
        return Err(format!("{name}: has no host"));
    };
    if u.scheme() == "http" && !is_loopback(&host) {
        let link_local = rule == UrlRule::AwsLinkLocal
            && match host {
                url::Host::Ipv4(a) => [
                    [169, 254, 170, 2],
                    [169, 254, 170, 23],
                    [169, 254, 169, 254],
                ]
                .contains(&a.octets()),
                url::Host::Ipv6(a) => {
                    a == std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23)
                        || a == std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)
                }
                url::Host::Domain(_) => false,
            };
        if !link_local {
            return Err(format!(
                "{name}: plain http is allowed only for loopback hosts (localhost, \
                 127.0.0.0/8, [::1]){}; use https",
                if rule == UrlRule::AwsLinkLocal {
                    " and AWS's link-local credential addresses"
                } else {
                    ""
                }
            ));
        }
    }
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn endpoint_override_order() {
        let env = |pairs: &[(&'static str, &'static str)]| -> BTreeMap<&str, &str> {
            pairs.iter().copied().collect()
        };
        let both = env(&[
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:1"),
            ("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:2"),
        ]);
        assert_eq!(
            endpoint_override(&both, "AWS_ENDPOINT_URL_S3"),
            Some(("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:2".to_string()))
        );
        assert_eq!(
            endpoint_override(&both, "AWS_ENDPOINT_URL_CLOUDWATCH"),
            Some(("AWS_ENDPOINT_URL", "http://127.0.0.1:1".to_string()))
        );
        let mut ignored = both.clone();
        ignored.insert("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "TRUE");
        assert_eq!(endpoint_override(&ignored, "AWS_ENDPOINT_URL_S3"), None);
        assert_eq!(
            endpoint_override(&env(&[("AWS_ENDPOINT_URL", "")]), "X"),
            None
        );
    }
}
