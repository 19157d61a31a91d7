//! The host's short-lived bearer token: an HS256 compact JWS of
//! [`HostClaims`](switchyard_protocol::hosts::HostClaims), bound to the client certificate
//! through `cnf."x5t#S256"` (docs/agent-hosts.md, "Identity").
//!
//! Only HS256 is accepted, whatever the header asks for: the key is a server secret and the
//! server is the only issuer, so there is no algorithm to negotiate.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac as _};
use serde::Deserialize;
use sha2::Sha256;
use switchyard_protocol::hosts::{ClaimsError, HostClaims, HostRefusalCode};

type HmacSha256 = Hmac<Sha256>;

/// Clock skew tolerated on `iat` and `exp` between the pod that issued a token and the one
/// checking it.
pub const LEEWAY_SECS: i64 = 5;

/// base64url of `{"alg":"HS256","typ":"JWT"}`.
const HEADER: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9";

#[derive(Debug, thiserror::Error)]
pub enum JwtError {
    #[error("token is not a compact JWS")]
    Malformed,
    #[error("token signature does not verify")]
    BadSignature,
    #[error("token algorithm is not HS256")]
    Algorithm,
    #[error(transparent)]
    Claims(ClaimsError),
}

impl JwtError {
    /// The refusal a request with this token gets (a 401 of docs/agent-hosts.md).
    pub fn refusal(&self) -> HostRefusalCode {
        match self {
            JwtError::Claims(ClaimsError::Expired) => HostRefusalCode::TokenExpired,
            JwtError::Claims(ClaimsError::CertificateMismatch) => {
                HostRefusalCode::CertificateMismatch
            }
            _ => HostRefusalCode::InvalidToken,
        }
    }

    /// The refusal's stable wire code.
    pub fn code(&self) -> &'static str {
        self.refusal().as_str()
    }
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    /// Extensions a verifier must understand (RFC 7515 §4.1.11); this one understands none.
    #[serde(default)]
    crit: Option<serde_json::Value>,
}

/// HS256 compact JWS of the claims.
pub fn issue(key: &[u8], claims: &HostClaims) -> String {
    // Serializing plain strings and integers cannot fail.
    let payload = serde_json::to_vec(claims).unwrap_or_default();
    let signing_input = format!("{HEADER}.{}", URL_SAFE_NO_PAD.encode(payload));
    let sig = mac(key, signing_input.as_bytes()).finalize().into_bytes();
    format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(sig))
}

/// Checks, in order: the form, the algorithm (HS256 only), the signature (in constant time),
/// then [`HostClaims::check`] at `now_secs` against the certificate actually presented on
/// the connection, given as its `x5t#S256` (see [`crate::pki::x5t_s256`]).
pub fn verify(
    key: &[u8],
    token: &str,
    now_secs: i64,
    presented_x5t: &str,
) -> Result<HostClaims, JwtError> {
    let mut parts = token.split('.');
    let (Some(header_b64), Some(payload_b64), Some(sig_b64), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwtError::Malformed);
    };
    let header: Header = decode_json(header_b64)?;
    if header.alg != "HS256" || header.crit.is_some() {
        return Err(JwtError::Algorithm);
    }
    let sig = URL_SAFE_NO_PAD
        .decode(sig_b64)
        .map_err(|_| JwtError::Malformed)?;
    let signed_len = header_b64.len() + 1 + payload_b64.len();
    mac(key, &token.as_bytes()[..signed_len])
        .verify_slice(&sig)
        .map_err(|_| JwtError::BadSignature)?;
    let claims: HostClaims = decode_json(payload_b64)?;
    // A thumbprint that is not 32 bytes of base64url cannot be any certificate's.
    let digest: [u8; 32] = URL_SAFE_NO_PAD
        .decode(presented_x5t)
        .ok()
        .and_then(|d| d.try_into().ok())
        .ok_or(JwtError::Claims(ClaimsError::CertificateMismatch))?;
    claims
        .check(now_secs, LEEWAY_SECS, &digest)
        .map_err(JwtError::Claims)?;
    Ok(claims)
}

fn mac(key: &[u8], data: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length.
    let mut m = <HmacSha256 as hmac::Mac>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("hmac accepts any key length"));
    m.update(data);
    m
}

fn decode_json<T: serde::de::DeserializeOwned>(b64: &str) -> Result<T, JwtError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(b64)
        .map_err(|_| JwtError::Malformed)?;
    serde_json::from_slice(&bytes).map_err(|_| JwtError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::x5t_s256;
    use sha2::Digest as _;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
    const CERT: &[u8] = b"pretend this is a DER certificate";

    fn claims(now: i64) -> HostClaims {
        let mut c = HostClaims::new(
            "host_1",
            "acme",
            now,
            600,
            &sha2::Sha256::digest(CERT).into(),
        );
        c.jti = Some("jti_1".into());
        c
    }

    #[test]
    fn header_constant_is_what_it_claims() {
        let h = URL_SAFE_NO_PAD.decode(HEADER).unwrap();
        assert_eq!(h, br#"{"alg":"HS256","typ":"JWT"}"#);
    }

    #[test]
    fn round_trip() {
        let c = claims(1_000);
        let t = issue(KEY, &c);
        assert_eq!(t.split('.').count(), 3);
        let back = verify(KEY, &t, 1_100, &x5t_s256(CERT)).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn known_vector() {
        // RFC 7515 A.1 uses a JWK-encoded key; this checks the HMAC input instead: the token
        // must verify with an independently computed HMAC over "header.payload".
        let t = issue(KEY, &claims(1_000));
        let (input, sig) = t.rsplit_once('.').unwrap();
        let mut m = <HmacSha256 as hmac::Mac>::new_from_slice(KEY).unwrap();
        m.update(input.as_bytes());
        assert_eq!(
            URL_SAFE_NO_PAD.encode(m.finalize().into_bytes()),
            sig,
            "signature is HMAC-SHA256 over the signing input"
        );
    }

    #[test]
    fn expired() {
        let t = issue(KEY, &claims(1_000));
        let e = verify(KEY, &t, 1_600 + LEEWAY_SECS, &x5t_s256(CERT)).unwrap_err();
        assert!(matches!(e, JwtError::Claims(ClaimsError::Expired)), "{e:?}");
        assert_eq!(e.code(), "token_expired");
        // Within the leeway it still passes.
        verify(KEY, &t, 1_600 + LEEWAY_SECS - 1, &x5t_s256(CERT)).unwrap();
    }

    #[test]
    fn wrong_key() {
        let t = issue(KEY, &claims(1_000));
        let e = verify(b"another key", &t, 1_100, &x5t_s256(CERT)).unwrap_err();
        assert!(matches!(e, JwtError::BadSignature), "{e:?}");
        assert_eq!(e.code(), "invalid_token");
    }

    #[test]
    fn alg_none_and_others_refused() {
        let t = issue(KEY, &claims(1_000));
        let (_, rest) = t.split_once('.').unwrap();
        let (payload, _) = rest.split_once('.').unwrap();
        for header in [
            r#"{"alg":"none","typ":"JWT"}"#,
            r#"{"alg":"HS512","typ":"JWT"}"#,
            r#"{"alg":"RS256","typ":"JWT"}"#,
            r#"{"alg":"HS256","crit":["exp"]}"#,
            r#"{"typ":"JWT"}"#,
        ] {
            let h = URL_SAFE_NO_PAD.encode(header);
            // "none" style: empty signature; and one with the original (valid) signature.
            for sig in ["", t.rsplit_once('.').unwrap().1] {
                let forged = format!("{h}.{payload}.{sig}");
                let e = verify(KEY, &forged, 1_100, &x5t_s256(CERT)).unwrap_err();
                assert!(
                    matches!(e, JwtError::Algorithm | JwtError::Malformed),
                    "{header}: {e:?}"
                );
                assert_eq!(e.code(), "invalid_token");
            }
        }
    }

    #[test]
    fn tampered_payload() {
        let t = issue(KEY, &claims(1_000));
        let parts: Vec<&str> = t.split('.').collect();
        let mut other = claims(1_000);
        other.sub = "host_2".into();
        let forged_payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&other).unwrap());
        let forged = format!("{}.{forged_payload}.{}", parts[0], parts[2]);
        let e = verify(KEY, &forged, 1_100, &x5t_s256(CERT)).unwrap_err();
        assert!(matches!(e, JwtError::BadSignature), "{e:?}");
        // A flipped signature character fails too.
        let mut sig = parts[2].to_owned();
        let flipped = if sig.starts_with('A') { "B" } else { "A" };
        sig.replace_range(0..1, flipped);
        let e = verify(
            KEY,
            &format!("{}.{}.{sig}", parts[0], parts[1]),
            1_100,
            &x5t_s256(CERT),
        )
        .unwrap_err();
        assert!(matches!(e, JwtError::BadSignature), "{e:?}");
    }

    #[test]
    fn certificate_mismatch() {
        let t = issue(KEY, &claims(1_000));
        let e = verify(KEY, &t, 1_100, &x5t_s256(b"another certificate")).unwrap_err();
        assert!(
            matches!(e, JwtError::Claims(ClaimsError::CertificateMismatch)),
            "{e:?}"
        );
        assert_eq!(e.code(), "certificate_mismatch");
        let e = verify(KEY, &t, 1_100, "not a thumbprint").unwrap_err();
        assert_eq!(e.code(), "certificate_mismatch");
    }

    #[test]
    fn malformed() {
        for t in ["", "a.b", "a.b.c.d", "!!.!!.!!", &format!("{HEADER}.e30.")] {
            let e = verify(KEY, t, 1_100, &x5t_s256(CERT)).unwrap_err();
            assert_eq!(e.code(), "invalid_token", "{t}: {e:?}");
        }
    }
}
