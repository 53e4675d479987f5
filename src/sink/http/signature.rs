//! Standard Webhooks request signatures: `webhook-id`, `webhook-timestamp` and
//! `webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">`, one `v1,` entry per
//! secret (more than one while a secret is rotated; receivers accept any that verifies).
//!
//! Secrets are `whsec_` + standard base64 of the key, read from the environment once when the
//! sink is built. They are held as ring HMAC keys only; nothing here prints them.

use base64::Engine;
use ring::hmac;

use crate::message::protection::keys::decode_base64_into;
use crate::text::secret_bytes::{SecretBytes, SecretString};

/// The signing keys of the sink. Its `Debug` names how many there are, never a key.
pub struct Signer {
    keys: Vec<hmac::Key>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Signer({} secrets)", self.keys.len())
    }
}

/// The three headers of one signed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    pub id: String,
    pub timestamp: String,
    pub signature: String,
}

impl Signer {
    /// Reads `whsec_...` secrets from the named variables, through `var`. An error names the
    /// variable and what is wrong, never the value.
    pub fn from_env(
        names: &[String],
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Signer>, String> {
        if names.is_empty() {
            return Ok(None);
        }
        let mut keys = Vec::with_capacity(names.len());
        for name in names {
            let text = SecretString::new(
                var(name).ok_or_else(|| format!("environment variable {name} is not set"))?,
            );
            keys.push(
                parse_secret(text.expose())
                    .map_err(|why| format!("environment variable {name}: {why}"))?,
            );
        }
        Ok(Some(Signer { keys }))
    }

    /// Signs `body` (before gzip, when on: the reference verifiers take the payload as text).
    pub fn sign(&self, id: &str, unix_seconds: u64, body: &[u8]) -> Signed {
        let timestamp = unix_seconds.to_string();
        let mut entries = Vec::with_capacity(self.keys.len());
        for key in &self.keys {
            let mut ctx = hmac::Context::with_key(key);
            ctx.update(id.as_bytes());
            ctx.update(b".");
            ctx.update(timestamp.as_bytes());
            ctx.update(b".");
            ctx.update(body);
            let tag = ctx.sign();
            entries.push(format!(
                "v1,{}",
                base64::engine::general_purpose::STANDARD.encode(tag.as_ref())
            ));
        }
        Signed {
            id: id.to_string(),
            timestamp,
            signature: entries.join(" "),
        }
    }
}

/// `whsec_` + standard base64 of 24 to 64 key bytes (the specification recommends 24 to 64).
fn parse_secret(text: &str) -> Result<hmac::Key, &'static str> {
    let b64 = text
        .trim()
        .strip_prefix("whsec_")
        .ok_or("must hold a secret starting with whsec_")?;
    let mut key = SecretBytes::default();
    decode_base64_into(b64, key.expose_mut())
        .map_err(|_| "must hold whsec_ followed by standard base64")?;
    if !(24..=64).contains(&key.len()) {
        return Err("must decode to 24 to 64 key bytes");
    }
    // ring's key (kept for the sink's life) is not wiped on drop; the bytes here are.
    Ok(hmac::Key::new(hmac::HMAC_SHA256, key.expose()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    #[test]
    fn matches_the_specification_example() {
        // The example of the Standard Webhooks specification and its reference libraries.
        let signer = Signer::from_env(&["S".into()], |_| Some(SECRET.into()))
            .unwrap()
            .unwrap();
        let s = signer.sign(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(
            s.signature,
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        assert_eq!(s.timestamp, "1614265330");
    }

    #[test]
    fn rotation_signs_with_every_secret_and_errors_name_only_the_variable() {
        let other =
            "whsec_".to_string() + &base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        let env = |n: &str| match n {
            "NEW" => Some(other.clone()),
            "OLD" => Some(SECRET.to_string()),
            "BAD" => Some("plain-secret-value".to_string()),
            _ => None,
        };
        let signer = Signer::from_env(&["NEW".into(), "OLD".into()], env)
            .unwrap()
            .unwrap();
        let s = signer.sign("id", 1, b"x");
        assert_eq!(s.signature.split(' ').count(), 2);
        assert!(s.signature.split(' ').all(|e| e.starts_with("v1,")));
        let e = Signer::from_env(&["BAD".into()], env).unwrap_err();
        assert_eq!(
            e,
            "environment variable BAD: must hold a secret starting with whsec_"
        );
        assert!(!e.contains("plain-secret-value"));
        assert_eq!(
            Signer::from_env(&["MISSING".into()], env).unwrap_err(),
            "environment variable MISSING is not set"
        );
        assert!(Signer::from_env(&[], env).unwrap().is_none());
        assert_eq!(format!("{signer:?}"), "Signer(2 secrets)");
    }
}
