//! Secrets a request carried (keys, tokens, signatures), hidden from anything a peer says
//! back before it is shown: a store's error document, a metadata endpoint's answer, a
//! receiver's rejection can quote the request, headers included.
//!
//! Rules, each from a leak seen with a hostile peer:
//! - scrub the whole text first, cut it for display afterwards: a cut first can leave all but
//!   the last characters of a secret behind, and the cut prefix no longer matches;
//! - hide whole values and their parts in one pass over the original text (overlapping matches
//!   merge), so replacing a part (a key id inside an `Authorization` value) never stops the
//!   whole value from matching;
//! - hide the forms a peer may echo a value in: JSON-escaped (`\/`), percent-encoded,
//!   XML-escaped, in any ASCII letter case (hex signatures and `%2f` come back either way).

use std::borrow::Cow;

use base64::engine::general_purpose::{STANDARD as B64, URL_SAFE as B64_URL};
use base64::Engine as _;

/// What a hidden value prints as.
pub use super::secret_bytes::REDACTED;
use super::secret_bytes::{wipe_string, SecretBytes, SecretString};

/// Parts of a header or field name that make its value secret, wherever they occur in the
/// name, in any letter case: `X-Auth-Key`, `Ocp-Apim-Subscription-Key`, `X-Functions-Key`,
/// `X-Hub-Signature`, `Authentication`, `X-Access-Key`, `Session-Id`, `Cookie`.
const SECRET_NAME_PARTS: &[&str] = &[
    "key",
    "auth",
    "signature",
    "session",
    "cookie",
    "token",
    "secret",
    "password",
    "passwd",
    "credential",
    "bearer",
];

/// Short parts that make a value secret when they are a whole token of the name (tokens split
/// on `-`, `_`, `.`): `X-Shopify-Hmac-Sha256`, `X-Api-Sig`, `X-Jwt`, `X-Pwd`, `X-Creds`,
/// `X-Psk`, `X-Sign`, `X-Otp`, `X-Pin`, `X-Csrf`, `X-Xsrf`, `X-Sas` (one-time passwords, PINs,
/// anti-forgery tokens and Azure shared access signatures were shown by `svc inspect`). Whole
/// tokens only, so `X-Design-Id`, `X-Passenger`, `X-Ping` or `X-Shipping` stay visible (`sign`
/// was a substring part before, which caught `X-Design-Id`). `signature`, `credential` and
/// `apikey` are also substring parts or contain one; they are listed here too so that the
/// whole word stays secret should the substring rule ever be narrowed.
const SECRET_NAME_TOKENS: &[&str] = &[
    "sig",
    "sign",
    "signed",
    "signing",
    "signature",
    "hmac",
    "jwt",
    "pass",
    "pwd",
    "psk",
    "creds",
    "cred",
    "credential",
    "otp",
    "pin",
    "csrf",
    "xsrf",
    "sas",
    "apikey",
];

/// The secret-name rule of headers a request or an operator command shows: true when the
/// name contains any of [`SECRET_NAME_PARTS`] or has a token among [`SECRET_NAME_TOKENS`]
/// (case-insensitive). Wide on purpose: a false
/// alarm costs an operator a move to `headers_env` or a `<redacted>` in a listing, a miss
/// costs a key in a config file, a dump or a terminal. Used by the HTTP sink's static and
/// forwarded headers, `svc show-effective-config` and `svc inspect`.
pub fn is_secret_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    SECRET_NAME_PARTS.iter().any(|part| lower.contains(part))
        || lower
            .split(['-', '_', '.'])
            .any(|token| SECRET_NAME_TOKENS.contains(&token))
}

/// Values shorter than this are not hidden: no real key, token or signature is that short,
/// and hiding a two-letter value would garble every text it occurs in.
const MIN_CHARS: usize = 4;

/// A set of secret values and the forms they may be echoed in. Cheap to build; only error
/// paths build one.
#[derive(Clone, Default)]
pub struct Secrets {
    /// Lower-cased forms to hide.
    forms: Vec<String>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({} forms)", self.forms.len())
    }
}

impl Drop for Secrets {
    /// The forms are the secrets themselves: wiped (`super::secret_bytes`).
    fn drop(&mut self) {
        self.forms.iter_mut().for_each(wipe_string);
    }
}

impl Secrets {
    pub fn new() -> Secrets {
        Secrets::default()
    }

    /// The set of `values` (see [`Secrets::add`]).
    pub fn of<'a>(values: impl IntoIterator<Item = &'a str>) -> Secrets {
        let mut s = Secrets::new();
        for v in values {
            s.add(v);
        }
        s
    }

    /// Hides `value` and its escaped forms. Each form is built in one buffer reserved for its
    /// largest size ([`build_form`]), so no form leaves a partial copy of the value behind, and a
    /// form already held is wiped before it drops.
    pub fn add(&mut self, value: &str) {
        if value.chars().count() < MIN_CHARS {
            return;
        }
        for build in [
            plain as fn(&str, &mut String),
            json_escaped,
            json_fully_escaped,
            percent_encoded,
            xml_escaped,
            base64_standard,
            base64_url,
        ] {
            let mut form = build_form(value, build);
            form.make_ascii_lowercase();
            if self.forms.contains(&form) {
                wipe_string(&mut form);
            } else {
                self.forms.push(form);
            }
        }
    }

    /// Hides an `Authorization` header value, its credential (after the scheme word), and for
    /// SigV4 the access key id and the signature on their own.
    pub fn add_authorization(&mut self, value: &str) {
        self.add(value);
        if let Some((scheme, credential)) = value.split_once(' ') {
            let credential = credential.trim();
            self.add(credential);
            // Basic: a peer may quote back the decoded `user:password`, or the password.
            if scheme.eq_ignore_ascii_case("basic") {
                // The decoded pair is a secret too: wiped when it drops.
                let decoded = B64.decode(credential).ok().map(SecretBytes::new);
                let pair = decoded.as_ref().map(|d| std::str::from_utf8(d.expose()));
                if let Some(Ok(pair)) = pair {
                    self.add(pair);
                    if let Some((_, password)) = pair.split_once(':') {
                        self.add(password);
                    }
                }
            }
        }
        for part in value.split([',', ' ']) {
            if let Some(scope) = part.strip_prefix("Credential=") {
                self.add(scope.split('/').next().unwrap_or_default());
            } else if let Some(sig) = part.strip_prefix("Signature=") {
                self.add(sig);
            }
        }
    }

    /// Hides every value of `other` too.
    pub fn extend(&mut self, other: &Secrets) {
        for f in &other.forms {
            if !self.forms.contains(f) {
                self.forms.push(f.clone());
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.forms.is_empty()
    }

    /// `text` with every occurrence of a hidden value replaced by [`REDACTED`]. Overlapping
    /// and adjacent occurrences become one `<redacted>`.
    pub fn scrub<'t>(&self, text: &'t str) -> Cow<'t, str> {
        if self.forms.is_empty() {
            return Cow::Borrowed(text);
        }
        // Lower-casing ASCII keeps every byte offset and char boundary of `text`. The copy
        // holds whatever secret the peer echoed: wiped when it drops.
        let lower_copy = SecretString::new(text.to_ascii_lowercase());
        let lower = lower_copy.expose();
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for form in &self.forms {
            let mut from = 0;
            while let Some(i) = lower[from..].find(form.as_str()) {
                ranges.push((from + i, from + i + form.len()));
                // Invariant: a form is non-empty, so the search moves on.
                from += i + 1;
                while !lower.is_char_boundary(from) {
                    from += 1;
                }
            }
        }
        if ranges.is_empty() {
            return Cow::Borrowed(text);
        }
        ranges.sort_unstable();
        let mut out = String::with_capacity(text.len());
        let mut shown_to = 0;
        let mut iter = ranges.into_iter().peekable();
        while let Some((start, mut end)) = iter.next() {
            while let Some(&(s, e)) = iter.peek() {
                if s > end {
                    break;
                }
                end = end.max(e);
                iter.next();
            }
            out.push_str(&text[shown_to..start]);
            out.push_str(REDACTED);
            shown_to = end;
        }
        out.push_str(&text[shown_to..]);
        Cow::Owned(out)
    }
}

/// Replaces every value of `secrets` (and its escaped forms) in `text` by `<redacted>`.
pub fn scrub(text: &str, secrets: &[&str]) -> String {
    Secrets::of(secrets.iter().copied())
        .scrub(text)
        .into_owned()
}

/// The most bytes one byte of a value becomes in any form: a control character as JSON
/// `\u00XX`, `"` as XML `&quot;` (6 each); percent-encoding triples, base64 grows by 4/3.
const MAX_GROWTH: usize = 6;

/// One escaped form of a secret: `build` writes it into a buffer reserved for the largest
/// form any value of that length can have ([`MAX_GROWTH`] times its bytes), so it never
/// reallocates (a reallocation would leave the part written so far in freed memory,
/// unwiped); the form is then copied into an allocation of its exact size and the buffer
/// wiped.
fn build_form(value: &str, build: fn(&str, &mut String)) -> String {
    let mut buf = String::with_capacity(value.len() * MAX_GROWTH + 4);
    let room = buf.capacity();
    build(value, &mut buf);
    debug_assert_eq!(buf.capacity(), room, "a form outgrew its reservation");
    let mut exact = String::with_capacity(buf.len());
    exact.push_str(&buf);
    wipe_string(&mut buf);
    exact
}

fn plain(value: &str, out: &mut String) {
    out.push_str(value);
}

fn base64_standard(value: &str, out: &mut String) {
    B64.encode_string(value, out);
}

fn base64_url(value: &str, out: &mut String) {
    B64_URL.encode_string(value, out);
}

/// `\uXXXX` of one UTF-16 unit, written in place.
fn push_unit_escape(out: &mut String, unit: u16) {
    use std::fmt::Write as _;
    // Writing to a String cannot fail.
    let _ = write!(out, "\\u{unit:04x}");
}

/// The value as a JSON string body, with `/` escaped as `\/` (as PHP and some Java encoders
/// write it).
fn json_escaped(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '/' => out.push_str("\\/"),
            c if (c as u32) < 0x20 => push_unit_escape(out, c as u16),
            c => out.push(c),
        }
    }
}

/// Every character as a JSON `\uXXXX` escape (UTF-16 units): what a peer that escapes all
/// non-alphanumerics, or everything, would echo.
fn json_fully_escaped(value: &str, out: &mut String) {
    let mut units = [0u16; 2];
    for c in value.chars() {
        for u in c.encode_utf16(&mut units) {
            push_unit_escape(out, *u);
        }
    }
}

/// RFC 3986 percent-encoding of everything but the unreserved characters.
fn percent_encoded(value: &str, out: &mut String) {
    use std::fmt::Write as _;
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{b:02x}");
        }
    }
}

/// The five predefined XML entities, in one pass.
fn xml_escaped(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "IQoJb3JpZ2luX2VjE/Nz+abc=";

    /// A peer quoting a credential back base64-encoded, every character `\u`-escaped, or a
    /// Basic credential decoded: none of it reaches the text (HTTP sink attack, issue 43).
    #[test]
    fn encoded_and_decoded_echoes_are_hidden() {
        let mut s = Secrets::new();
        s.add("tok-4711-secret");
        let b64 = B64.encode("tok-4711-secret");
        let escaped: String = "tok-4711-secret"
            .chars()
            .map(|c| format!("\\u{:04X}", c as u32))
            .collect();
        for echo in [b64.as_str(), escaped.as_str()] {
            let out = s.scrub(&format!("{{\"echo\": \"{echo}\"}}")).into_owned();
            assert!(!out.contains(echo) && out.contains(REDACTED), "{out}");
        }
        let mut basic = Secrets::new();
        basic.add_authorization(&format!("Basic {}", B64.encode("alice:pa55-word")));
        for echo in ["alice:pa55-word", "pa55-word"] {
            let out = basic
                .scrub(&format!("bad credentials for {echo}"))
                .into_owned();
            assert!(!out.contains("pa55-word"), "{out}");
        }
    }

    #[test]
    fn secret_names_are_found_anywhere_in_the_name() {
        for n in [
            "Ocp-Apim-Subscription-Key",
            "X-Functions-Key",
            "X-Auth-Key",
            "X-Hub-Signature",
            "X-Signature",
            "Authentication",
            "X-Access-Key",
            "Authorization",
            "Proxy-Authorization",
            "Cookie",
            "Set-Cookie",
            "X-Session-Id",
            "x-csrf-token",
            "DB_PASSWORD",
            "X-Client-Secret",
            "X-Api-Key",
        ] {
            assert!(is_secret_name(n), "{n}");
        }
        // Short parts count as whole tokens only (the names an attack got through).
        for n in [
            "X-Shopify-Hmac-Sha256",
            "X-Hmac",
            "X-Api-Sig",
            "X-Jwt",
            "X-Pwd",
            "X-Pass",
            "X-Creds",
            "X-Psk",
            "x_cred",
            "upstream.jwt",
            "X-Sign",
            "X-Signed-By",
        ] {
            assert!(is_secret_name(n), "{n}");
        }
        // One-time passwords, PINs, anti-forgery tokens, shared access signatures (`svc
        // inspect` showed these values).
        for n in [
            "X-Otp",
            "X-Pin",
            "x-csrf",
            "X-XSRF-Header",
            "X-Sas",
            "X_OTP_CODE",
            "card.pin",
            "X-Signature",
            "X-Credential",
            "X-Apikey",
        ] {
            assert!(is_secret_name(n), "{n}");
        }
        for n in [
            "X-Design-Id",
            "X-Passenger",
            "X-Hmacro",
            "X-Compass",
            "X-Ping",
            "X-Shipping",
            "X-Pinned-Version",
            "X-Spinner",
            "X-Otpx",
            "X-Sass-Version",
            "X-Saskatoon",
            "X-Hotpath",
        ] {
            assert!(!is_secret_name(n), "{n}");
        }
        for n in [
            "Content-Type",
            "X-Team",
            "Trace-Id",
            "X-Tenant",
            "Accept",
            "User-Agent",
        ] {
            assert!(!is_secret_name(n), "{n}");
        }
    }

    #[test]
    fn every_echoed_form_is_hidden() {
        let s = Secrets::of([TOKEN]);
        for echoed in [
            TOKEN.to_string(),
            TOKEN.replace('/', "\\/"),
            "IQoJb3JpZ2luX2VjE%2FNz%2Babc%3D".to_string(),
            "iqojb3jpz2lux2vje%2fnz%2babc%3d".to_string(),
            TOKEN.to_ascii_uppercase(),
        ] {
            let text = format!("before {echoed} after");
            assert_eq!(s.scrub(&text), "before <redacted> after", "{echoed}");
        }
        assert!(matches!(s.scrub("nothing here"), Cow::Borrowed(_)));
    }

    #[test]
    fn whole_values_and_parts_in_one_pass() {
        let auth =
            "AWS4-HMAC-SHA256 Credential=AKIAEXAMPLE123/20260101/eu-west-1/s3/aws4_request, \
                    SignedHeaders=host, Signature=0123456789abcdef0123";
        let mut s = Secrets::new();
        s.add("eu-west-1");
        s.add_authorization(auth);
        assert_eq!(s.scrub(&format!("got [{auth}]")), "got [<redacted>]");
        assert_eq!(
            s.scrub("key AKIAEXAMPLE123 sig 0123456789ABCDEF0123"),
            "key <redacted> sig <redacted>"
        );
        // Parts overlapping or touching merge into one marker.
        assert_eq!(s.scrub("AKIAEXAMPLE123AKIAEXAMPLE123"), "<redacted>");
    }

    #[test]
    fn short_values_and_non_ascii_text() {
        let s = Secrets::of(["s", "", "tökén-1"]);
        assert_eq!(
            s.scrub("status ünïcode TÖKÉN-1 tökén-1"),
            "status ünïcode TÖKÉN-1 <redacted>"
        );
        assert_eq!(scrub("a-secret-value!", &["secret-value"]), "a-<redacted>!");
    }
}
