//! Pure parsers of what credential sources answer: the STS XML ([`parse_sts_credentials`],
//! [`parse_sts_error`]), the JSON of instance metadata and container endpoints
//! ([`parse_metadata_credentials`]) and the JSON a `credential_process` prints
//! ([`parse_process_credentials`]). No I/O: the fuzz targets call them on arbitrary bytes.
//!
//! Every input is hostile: a parser never panics, never echoes a secret (errors name the field,
//! never its value; peer text such as an error code goes through [`PeerText`]), and checks
//! what it lets through: the values end up in HTTP headers, so a key, secret or token with a
//! control character, a space or a non-ASCII byte is refused (header injection), and lengths
//! are bounded.

use std::fmt;

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::credentials::Credentials;
use crate::text::peer::PeerText;

/// Longest access key id accepted (AWS documents 16 to 128).
pub const MAX_KEY_ID_CHARS: usize = 128;
/// Longest secret or session token accepted (session tokens run to about 2 KiB).
pub const MAX_SECRET_CHARS: usize = 8192;

/// Credentials as a source issued them, with their expiry when they have one. `Debug`
/// redacts (through [`Credentials`]).
#[derive(Clone, PartialEq, Eq)]
pub struct Issued {
    pub credentials: Credentials,
    /// `None`: they do not expire (static keys, a `credential_process` without
    /// `Expiration`).
    pub expiration: Option<OffsetDateTime>,
}

impl fmt::Debug for Issued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Issued")
            .field("credentials", &self.credentials)
            .field("expiration", &self.expiration)
            .finish()
    }
}

/// Checks and assembles the three values; `what` names the answer in errors.
fn issued(
    what: &str,
    id: Option<String>,
    secret: Option<String>,
    token: Option<String>,
    token_required: bool,
    expiration: Option<&str>,
) -> Result<Issued, String> {
    let id = id.ok_or_else(|| format!("{what}: no access key id"))?;
    let secret = secret.ok_or_else(|| format!("{what}: no secret access key"))?;
    if id.is_empty()
        || id.len() > MAX_KEY_ID_CHARS
        || !id.bytes().all(|b| b.is_ascii_alphanumeric())
    {
        return Err(format!(
            "{what}: the access key id is not 1 to {MAX_KEY_ID_CHARS} letters and digits"
        ));
    }
    check_secret(what, "secret access key", &secret)?;
    if let Some(t) = &token {
        check_secret(what, "session token", t)?;
    } else if token_required {
        return Err(format!("{what}: no session token"));
    }
    let expiration = match expiration {
        Some(text) => Some(OffsetDateTime::parse(text.trim(), &Rfc3339).map_err(|_| {
            format!(
                "{what}: Expiration is not an RFC 3339 time: {}",
                PeerText::new(text)
            )
        })?),
        None => None,
    };
    Ok(Issued {
        credentials: Credentials {
            access_key_id: id,
            secret_access_key: secret,
            session_token: token,
        },
        expiration,
    })
}

fn check_secret(what: &str, name: &str, v: &str) -> Result<(), String> {
    if v.is_empty() || v.len() > MAX_SECRET_CHARS || !v.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{what}: the {name} is empty, longer than {MAX_SECRET_CHARS} characters or has \
             characters other than visible ASCII"
        ));
    }
    Ok(())
}

/// The text of the first `<name>...</name>` element inside `xml` (no attributes on it),
/// entities decoded. `None` when absent or malformed.
fn xml_element<'a>(xml: &'a str, name: &str) -> Option<&'a str> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let start = xml.find(&open)? + open.len();
    let len = xml[start..].find(&close)?;
    Some(&xml[start..start + len])
}

/// Decodes the five predefined XML entities and numeric character references; `None` on
/// anything else (CDATA, an unknown entity), which no STS answer contains.
fn xml_text(raw: &str) -> Option<String> {
    if raw.contains('<') {
        return None;
    }
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let after = &rest[amp + 1..];
        let semi = after.find(';').filter(|&i| i <= 10)?;
        let entity = &after[..semi];
        let c = match entity {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let code = if let Some(hex) = entity.strip_prefix("#x") {
                    u32::from_str_radix(hex, 16).ok()?
                } else {
                    entity.strip_prefix('#')?.parse().ok()?
                };
                char::from_u32(code)?
            }
        };
        out.push(c);
        rest = &after[semi + 1..];
    }
    out.push_str(rest);
    Some(out.trim().to_string())
}

/// The credentials of an STS `<action>Response` (`AssumeRole`,
/// `AssumeRoleWithWebIdentity`): `<action>Result><Credentials>` with `AccessKeyId`,
/// `SecretAccessKey`, `SessionToken` and `Expiration`, all required.
pub fn parse_sts_credentials(action: &str, body: &[u8]) -> Result<Issued, String> {
    let what = format!("STS {action} answer");
    let xml = std::str::from_utf8(body).map_err(|_| format!("{what}: not UTF-8"))?;
    let root = format!("{action}Response");
    if !xml.contains(&format!("<{root}")) {
        return Err(format!("{what}: no {root} element"));
    }
    let result = xml_element(xml, &format!("{action}Result"))
        .ok_or_else(|| format!("{what}: no {action}Result element"))?;
    let creds = xml_element(result, "Credentials")
        .ok_or_else(|| format!("{what}: no Credentials element"))?;
    let field = |name: &str| -> Result<Option<String>, String> {
        match xml_element(creds, name) {
            None => Ok(None),
            Some(raw) => xml_text(raw)
                .map(Some)
                .ok_or_else(|| format!("{what}: {name} is not plain XML text")),
        }
    };
    let expiration = field("Expiration")?.ok_or_else(|| format!("{what}: no Expiration"))?;
    issued(
        &what,
        field("AccessKeyId")?,
        field("SecretAccessKey")?,
        field("SessionToken")?,
        true,
        Some(&expiration),
    )
}

/// `Code: Message` of an STS `ErrorResponse`, as peer text; the whole body (bounded and
/// escaped) when it has neither.
pub fn parse_sts_error(body: &[u8]) -> String {
    let xml = String::from_utf8_lossy(body);
    let get = |n: &str| xml_element(&xml, n).and_then(xml_text);
    match (get("Code"), get("Message")) {
        (Some(c), Some(m)) => format!("{}: {}", PeerText::new(&c), PeerText::new(&m)),
        (Some(c), None) => PeerText::new(&c).to_string(),
        _ => crate::text::peer::peer_bytes(body),
    }
}

fn json_object(
    what: &str,
    body: &[u8],
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => Err(format!("{what}: not a JSON object")),
        Err(e) => Err(format!("{what}: not JSON: {e}")),
    }
}

/// A string field; an error when present with another type.
fn json_str(
    what: &str,
    m: &serde_json::Map<String, serde_json::Value>,
    name: &str,
) -> Result<Option<String>, String> {
    match m.get(name) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{what}: {name} is not a string")),
    }
}

/// The credentials JSON of the EC2 instance metadata service
/// (`/latest/meta-data/iam/security-credentials/<role>`: `Code`, `Type`, `AccessKeyId`,
/// `SecretAccessKey`, `Token`, `Expiration`) and of the ECS/EKS container endpoint (the same
/// without `Code`/`Type`). `Code` other than `Success` is an error with the peer's `Message`;
/// token and expiration are required (these credentials are always temporary).
pub fn parse_metadata_credentials(body: &[u8]) -> Result<Issued, String> {
    let what = "credentials endpoint answer";
    let m = json_object(what, body)?;
    if let Some(code) = json_str(what, &m, "Code")? {
        if code != "Success" {
            let msg = json_str(what, &m, "Message")?.unwrap_or_default();
            return Err(format!(
                "{what}: Code {}: {}",
                PeerText::new(&code),
                PeerText::new(&msg)
            ));
        }
    }
    let expiration =
        json_str(what, &m, "Expiration")?.ok_or_else(|| format!("{what}: no Expiration"))?;
    issued(
        what,
        json_str(what, &m, "AccessKeyId")?,
        json_str(what, &m, "SecretAccessKey")?,
        json_str(what, &m, "Token")?,
        true,
        Some(&expiration),
    )
}

/// The JSON a `credential_process` prints: `Version` 1 (required), `AccessKeyId`,
/// `SecretAccessKey`, optional `SessionToken`, optional `Expiration` (absent: the credentials
/// do not expire, as the SDKs read it).
pub fn parse_process_credentials(body: &[u8]) -> Result<Issued, String> {
    let what = "credential_process output";
    let m = json_object(what, body)?;
    match m.get("Version") {
        Some(v) if v.as_u64() == Some(1) => {}
        Some(_) => return Err(format!("{what}: Version is not 1")),
        None => return Err(format!("{what}: no Version (must be 1)")),
    }
    let expiration = json_str(what, &m, "Expiration")?;
    issued(
        what,
        json_str(what, &m, "AccessKeyId")?,
        json_str(what, &m, "SecretAccessKey")?,
        json_str(what, &m, "SessionToken")?,
        false,
        expiration.as_deref(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY";

    #[test]
    fn sts_answers() {
        let ok = format!(
            "<AssumeRoleResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">\
             <AssumeRoleResult><AssumedRoleUser><Arn>arn</Arn></AssumedRoleUser><Credentials>\
             <AccessKeyId>ASIAEXAMPLE</AccessKeyId><SecretAccessKey>{SECRET}</SecretAccessKey>\
             <SessionToken>tok&amp;en+/=</SessionToken>\
             <Expiration>2030-01-02T03:04:05Z</Expiration></Credentials></AssumeRoleResult>\
             </AssumeRoleResponse>"
        );
        let i = parse_sts_credentials("AssumeRole", ok.as_bytes()).unwrap();
        assert_eq!(i.credentials.access_key_id, "ASIAEXAMPLE");
        assert_eq!(i.credentials.session_token.as_deref(), Some("tok&en+/="));
        assert_eq!(i.expiration.unwrap().unix_timestamp(), 1_893_553_445);
        assert!(!format!("{i:?}").contains(SECRET));
        // The wrong action, a missing token, an injected header, an undecodable entity.
        let e = parse_sts_credentials("AssumeRoleWithWebIdentity", ok.as_bytes()).unwrap_err();
        assert!(e.contains("no AssumeRoleWithWebIdentityResponse"), "{e}");
        let no_token = ok.replace("<SessionToken>tok&amp;en+/=</SessionToken>", "");
        let e = parse_sts_credentials("AssumeRole", no_token.as_bytes()).unwrap_err();
        assert!(e.ends_with("no session token"), "{e}");
        let crlf = ok.replace("tok&amp;en", "tok&#13;&#10;X-Evil: 1");
        let e = parse_sts_credentials("AssumeRole", crlf.as_bytes()).unwrap_err();
        assert!(e.contains("visible ASCII") && !e.contains("X-Evil"), "{e}");
        let bad = ok.replace("tok&amp;en", "tok&bogus;en");
        assert!(parse_sts_credentials("AssumeRole", bad.as_bytes()).is_err());
        let when = ok.replace("2030-01-02T03:04:05Z", "soon\n");
        let e = parse_sts_credentials("AssumeRole", when.as_bytes()).unwrap_err();
        assert!(e.ends_with("not an RFC 3339 time: soon"), "{e}");
        assert!(parse_sts_credentials("AssumeRole", &[0xff, 0xfe]).is_err());
        assert_eq!(
            parse_sts_error(
                b"<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code>\
                  <Message>not\nallowed</Message></Error></ErrorResponse>"
            ),
            "AccessDenied: not\\nallowed"
        );
    }

    #[test]
    fn metadata_answers() {
        let ok = format!(
            r#"{{"Code":"Success","LastUpdated":"2030-01-01T00:00:00Z","Type":"AWS-HMAC",
               "AccessKeyId":"ASIAX","SecretAccessKey":"{SECRET}","Token":"T0k",
               "Expiration":"2030-01-01T06:00:00Z"}}"#
        );
        let i = parse_metadata_credentials(ok.as_bytes()).unwrap();
        assert_eq!(i.credentials.session_token.as_deref(), Some("T0k"));
        let e = parse_metadata_credentials(
            br#"{"Code":"AssumeRoleUnauthorizedAccess","Message":"no\u001b[31m"}"#,
        )
        .unwrap_err();
        assert!(
            e.ends_with("Code AssumeRoleUnauthorizedAccess: no\\u{1b}[31m"),
            "{e}"
        );
        let e = parse_metadata_credentials(br#"{"AccessKeyId":"A","SecretAccessKey":"S"}"#)
            .unwrap_err();
        assert!(e.ends_with("no Expiration"), "{e}");
        assert!(parse_metadata_credentials(b"[1]").is_err());
        let e = parse_metadata_credentials(
            br#"{"AccessKeyId":"A B","SecretAccessKey":"S","Token":"t","Expiration":"2030-01-01T00:00:00Z"}"#,
        )
        .unwrap_err();
        assert!(e.contains("letters and digits"), "{e}");
    }

    #[test]
    fn process_answers() {
        let i = parse_process_credentials(
            format!(r#"{{"Version":1,"AccessKeyId":"AKID","SecretAccessKey":"{SECRET}"}}"#)
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(
            (i.expiration, i.credentials.session_token.clone()),
            (None, None)
        );
        let i = parse_process_credentials(
            br#"{"Version":1,"AccessKeyId":"AKID","SecretAccessKey":"s","SessionToken":"t","Expiration":"2030-01-01T00:00:00+00:00"}"#,
        )
        .unwrap();
        assert!(i.expiration.is_some());
        for bad in [
            &br#"{"AccessKeyId":"A","SecretAccessKey":"S"}"#[..],
            br#"{"Version":2,"AccessKeyId":"A","SecretAccessKey":"S"}"#,
            br#"{"Version":1,"AccessKeyId":"A"}"#,
            br#"{"Version":1,"AccessKeyId":7,"SecretAccessKey":"S"}"#,
            b"not json",
        ] {
            assert!(parse_process_credentials(bad).is_err());
        }
    }
}
