//! What every cloud A signing mode produces, and the token expiry they all read: shared by
//! `auth.rs` (the modes) and `instance.rs` (instance principal federation).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

use super::signature::Signer;

/// A signer plus a description of where it came from (no secret in it).
#[derive(Debug)]
pub struct Identity {
    pub signer: Signer,
    pub source: String,
}

/// The `exp` claim of a JWT, if it has one (the signature is the service's business).
pub fn jwt_expiry(token: &str) -> Option<i64> {
    let payload = token.split('.').nth(1)?;
    let bytes = URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    v.get("exp")?.as_i64()
}
