//! ES256 test tokens, signed with the demo key in tests/fixtures/jwt whose public half is the
//! local JWKS in envoy/per-user-jwt.yaml.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use p256::ecdsa::signature::Signer;
use p256::ecdsa::{Signature, SigningKey};
use p256::pkcs8::DecodePrivateKey;

/// The issuer and audience envoy/per-user-jwt.yaml accepts.
pub const ISSUER: &str = "ratelimit-server-demo";
/// The key id in the JWKS.
pub const KID: &str = "demo-es256";

fn demo_key() -> SigningKey {
    let pem = include_str!("../../fixtures/jwt/es256-private.pem");
    SigningKey::from_pkcs8_pem(pem).expect("the demo key parses")
}

/// Unix seconds, from the library's one reader of wall time.
fn now() -> u64 {
    use ratelimit_server::clock::{Clock, NANOS_PER_SECOND, SystemClock};
    SystemClock.now() / NANOS_PER_SECOND
}

/// Signs `claims` with `key` as a compact JWS (header.payload.signature).
pub fn sign_with(key: &SigningKey, claims: &serde_json::Value) -> String {
    let header = serde_json::json!({"alg": "ES256", "typ": "JWT", "kid": KID});
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let signature: Signature = key.sign(input.as_bytes());
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature.to_bytes()))
}

/// Claims Envoy accepts for `sub`, valid for an hour.
pub fn claims(sub: &str) -> serde_json::Value {
    serde_json::json!({"iss": ISSUER, "aud": ISSUER, "sub": sub, "exp": now() + 3600})
}

/// A valid token for `sub`.
pub fn token(sub: &str) -> String {
    sign_with(&demo_key(), &claims(sub))
}

/// A token for `sub` that expired an hour ago (Envoy allows 60 s of clock skew).
pub fn expired_token(sub: &str) -> String {
    let mut c = claims(sub);
    c["exp"] = (now() - 3600).into();
    sign_with(&demo_key(), &c)
}

/// A token for `sub` signed by a key that is not in the JWKS.
pub fn foreign_token(sub: &str) -> String {
    let other = SigningKey::from_slice(&[7u8; 32]).expect("a valid scalar");
    sign_with(&other, &claims(sub))
}

/// `token(from)` with its payload swapped for one claiming `to`: the signature no longer matches.
pub fn forged_token(from: &str, to: &str) -> String {
    let genuine = token(from);
    let parts: Vec<&str> = genuine.split('.').collect();
    let payload = URL_SAFE_NO_PAD.encode(claims(to).to_string());
    format!("{}.{payload}.{}", parts[0], parts[2])
}

/// `Authorization` header value for a token.
pub fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}
