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

use std::collections::BTreeMap;
use std::fmt;

use serde_json::value::RawValue;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::credentials::Credentials;
use svc_text::peer::PeerText;
use svc_text::secret_bytes::SecretString;

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

/// Checks and assembles the three values; `what` names the answer in errors. The secret and
/// the token arrive in wiping owners and move into the [`Credentials`] (which wipe on drop)
/// only once every check passed: a refused answer wipes them as it returns.
fn issued(
    what: &str,
    id: Option<String>,
    secret: Option<SecretString>,
    token: Option<SecretString>,
    token_required: bool,
    expiration: Option<&str>,
) -> Result<Issued, String> {
    let id = id.ok_or_else(|| format!("{what}: no access key id"))?;
    let mut secret = secret.ok_or_else(|| format!("{what}: no secret access key"))?;
    if id.is_empty()
        || id.len() > MAX_KEY_ID_CHARS
        || !id.bytes().all(|b| b.is_ascii_alphanumeric())
    {
        return Err(format!(
            "{what}: the access key id is not 1 to {MAX_KEY_ID_CHARS} letters and digits"
        ));
    }
    check_secret(what, "secret access key", secret.expose())?;
    let mut token = token;
    if let Some(t) = &token {
        check_secret(what, "session token", t.expose())?;
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
    // Moved out, not copied: the owners are left empty.
    Ok(Issued {
        credentials: Credentials {
            access_key_id: id,
            secret_access_key: std::mem::take(secret.expose_mut()),
            session_token: token.as_mut().map(|t| std::mem::take(t.expose_mut())),
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
/// anything else (CDATA, an unknown entity), which no STS answer contains. The text is
/// decoded and trimmed in one wiping owner reserved at the raw length (decoding never
/// lengthens it), so a secret field leaves no copy behind.
fn xml_text(raw: &str) -> Option<SecretString> {
    if raw.contains('<') {
        return None;
    }
    let mut text = SecretString::with_capacity(raw.len());
    let out = text.expose_mut();
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
    // Trimmed in place: the bytes stay in the same allocation, wiped with it.
    let end = out.trim_end().len();
    out.truncate(end);
    let start = out.len() - out.trim_start().len();
    out.drain(..start);
    Some(text)
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
    let field = |name: &str| -> Result<Option<SecretString>, String> {
        match xml_element(creds, name) {
            None => Ok(None),
            Some(raw) => xml_text(raw)
                .map(Some)
                .ok_or_else(|| format!("{what}: {name} is not plain XML text")),
        }
    };
    let expiration = field("Expiration")?.ok_or_else(|| format!("{what}: no Expiration"))?;
    let id = field("AccessKeyId")?.map(|s| s.expose().to_string());
    issued(
        &what,
        id,
        field("SecretAccessKey")?,
        field("SessionToken")?,
        true,
        Some(expiration.expose()),
    )
}

/// `Code: Message` of an STS `ErrorResponse`, as peer text; the whole body (bounded and
/// escaped) when it has neither.
pub fn parse_sts_error(body: &[u8]) -> String {
    let xml = String::from_utf8_lossy(body);
    let get = |n: &str| xml_element(&xml, n).and_then(xml_text);
    match (get("Code"), get("Message")) {
        (Some(c), Some(m)) => format!(
            "{}: {}",
            PeerText::new(c.expose()),
            PeerText::new(m.expose())
        ),
        (Some(c), None) => PeerText::new(c.expose()).to_string(),
        _ => svc_text::peer::peer_bytes(body),
    }
}

/// The members of a JSON object, each the raw JSON text of its value borrowed from `body`:
/// nothing is decoded yet, so no value passes through serde_json's scratch buffer (which
/// holds every string with an escape and is freed unwiped). Later duplicates win.
type JsonFields<'a> = BTreeMap<String, &'a RawValue>;

fn json_object<'a>(what: &str, body: &'a [u8]) -> Result<JsonFields<'a>, String> {
    serde_json::from_slice::<JsonFields<'a>>(body).map_err(|e| {
        if e.classify() == serde_json::error::Category::Data {
            // Valid JSON of another type; serde's text would quote the value.
            format!("{what}: not a JSON object")
        } else {
            format!("{what}: not JSON: {e}")
        }
    })
}

/// A string field that is not secret; an error when present with another type.
fn json_str(what: &str, m: &JsonFields<'_>, name: &str) -> Result<Option<String>, String> {
    match m.get(name) {
        None => Ok(None),
        Some(raw) => serde_json::from_str::<Option<String>>(raw.get())
            .map_err(|_| format!("{what}: {name} is not a string")),
    }
}

/// A secret string field, decoded straight into a wiping owner ([`json_string_secret`]).
fn json_secret(what: &str, m: &JsonFields<'_>, name: &str) -> Result<Option<SecretString>, String> {
    match m.get(name) {
        None => Ok(None),
        Some(raw) => {
            json_string_secret(raw.get()).ok_or_else(|| format!("{what}: {name} is not a string"))
        }
    }
}

/// The raw JSON text of a string (or `null`: `Some(None)`) decoded into a [`SecretString`]
/// reserved at the raw length, which decoding never exceeds (every escape is at least as
/// long as what it stands for). `None` for another type or a broken escape (the owner is
/// wiped as it drops).
fn json_string_secret(raw: &str) -> Option<Option<SecretString>> {
    if raw == "null" {
        return Some(None);
    }
    let body = raw.strip_prefix('"')?.strip_suffix('"')?;
    let mut text = SecretString::with_capacity(body.len());
    let out = text.expose_mut();
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        out.push(match chars.next()? {
            '"' => '"',
            '\\' => '\\',
            '/' => '/',
            'b' => '\u{8}',
            'f' => '\u{c}',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'u' => unicode_escape(&mut chars)?,
            _ => return None,
        });
    }
    Some(Some(text))
}

/// The character of a `\uXXXX` escape (after the `u`), a surrogate pair included.
fn unicode_escape(chars: &mut std::str::Chars<'_>) -> Option<char> {
    let hex4 = |chars: &mut std::str::Chars<'_>| -> Option<u32> {
        (0..4).try_fold(0u32, |v, _| Some(v * 16 + chars.next()?.to_digit(16)?))
    };
    let hi = hex4(chars)?;
    if !(0xD800..0xDC00).contains(&hi) {
        return char::from_u32(hi);
    }
    if chars.next()? != '\\' || chars.next()? != 'u' {
        return None;
    }
    let lo = hex4(chars)?;
    if !(0xDC00..0xE000).contains(&lo) {
        return None;
    }
    char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
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
        json_secret(what, &m, "SecretAccessKey")?,
        json_secret(what, &m, "Token")?,
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
    let version = m
        .get("Version")
        .map(|raw| serde_json::from_str::<serde_json::Value>(raw.get()).ok());
    match version {
        Some(Some(v)) if v.as_u64() == Some(1) => {}
        Some(_) => return Err(format!("{what}: Version is not 1")),
        None => return Err(format!("{what}: no Version (must be 1)")),
    }
    let expiration = json_str(what, &m, "Expiration")?;
    issued(
        what,
        json_str(what, &m, "AccessKeyId")?,
        json_secret(what, &m, "SecretAccessKey")?,
        json_secret(what, &m, "SessionToken")?,
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

    /// Secret fields are decoded by this module (straight into wiping owners): escapes as
    /// any JSON encoder writes them decode as serde_json would; other types, broken escapes
    /// and a top-level value that is not an object are refused without quoting anything.
    #[test]
    fn escaped_secrets_are_decoded_and_refusals_quote_nothing() {
        let i = parse_process_credentials(
            br#"{"Version":1,"AccessKeyId":"AKID","SecretAccessKey":"wJal\/K7\u004dX\"\\",
                "SessionToken":"t\/\u0041","SessionToken":"t\/\u0042"}"#,
        )
        .unwrap();
        assert_eq!(i.credentials.secret_access_key, "wJal/K7MX\"\\");
        // A repeated member: the last one wins, as serde_json's maps do.
        assert_eq!(i.credentials.session_token.as_deref(), Some("t/B"));
        let body = |secret: &str| {
            format!(r#"{{"Version":1,"AccessKeyId":"AKID","SecretAccessKey":{secret}}}"#)
        };
        for (secret, error) in [
            (r#""a\ud83d\ude00""#, "visible ASCII"),
            ("7", "SecretAccessKey is not a string"),
            ("null", "no secret access key"),
            (r#""a\ud83dxyz""#, "not"),
        ] {
            let e = parse_process_credentials(body(secret).as_bytes()).unwrap_err();
            assert!(e.contains(error), "{secret}: {e}");
        }
        assert_eq!(
            json_string_secret(r#""a\ud83d\ude00b""#)
                .unwrap()
                .unwrap()
                .expose(),
            "a\u{1f600}b"
        );
        assert!(json_string_secret(r#""a\ud83db""#).is_none());
        assert!(json_string_secret(r#""a\x""#).is_none());
        let e = parse_process_credentials(br#""s3cr3t-top-level""#).unwrap_err();
        assert!(
            e.ends_with("not a JSON object") && !e.contains("s3cr3t"),
            "{e}"
        );
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
