//! Claims of the short-lived JWT a host agent presents together with its client certificate
//! (issue 5, "Transport and identity"). Types and pure checks only: signing, verifying and
//! hashing the certificate live where the crypto dependencies are.
//!
//! The token is bound to the certificate through `cnf."x5t#S256"` (RFC 8705 §3.1): the
//! base64url (no padding) SHA-256 digest of the certificate's DER encoding.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

/// The claims Switchyard issues to a host and checks on every connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostClaims {
    /// The host id.
    pub sub: String,
    /// The tenant the host was enrolled under.
    pub tenant: String,
    /// Issued at, seconds since the Unix epoch.
    pub iat: i64,
    /// Expires at, seconds since the Unix epoch.
    pub exp: i64,
    /// Certificate binding.
    pub cnf: Confirmation,
    /// Token id, for audit logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jti: Option<String>,
}

/// `cnf` (RFC 7800) with the certificate thumbprint confirmation method of RFC 8705.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confirmation {
    #[serde(rename = "x5t#S256")]
    pub x5t_s256: String,
}

/// Why presented claims are not acceptable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClaimsError {
    #[error("token expired")]
    Expired,
    #[error("token issued in the future")]
    NotYetValid,
    #[error("token lifetime is empty or negative")]
    EmptyLifetime,
    #[error("token is not bound to the presented client certificate")]
    CertificateMismatch,
    #[error("token has an empty subject or tenant")]
    MissingIdentity,
}

impl HostClaims {
    /// Claims for `host` of `tenant`, valid from `now` for `ttl_secs`, bound to the
    /// certificate whose SHA-256 digest is `cert_digest`.
    pub fn new(host: &str, tenant: &str, now: i64, ttl_secs: i64, cert_digest: &[u8; 32]) -> Self {
        Self {
            sub: host.to_owned(),
            tenant: tenant.to_owned(),
            iat: now,
            exp: now.saturating_add(ttl_secs),
            cnf: Confirmation {
                x5t_s256: x5t_s256_from_digest(cert_digest),
            },
            jti: None,
        }
    }

    /// Checks identity, lifetime at `now` (allowing `leeway_secs` of clock skew) and the
    /// binding to the certificate presented on this connection, given its SHA-256 digest.
    /// The signature is checked before this, by the caller.
    pub fn check(
        &self,
        now: i64,
        leeway_secs: i64,
        presented_cert_digest: &[u8; 32],
    ) -> Result<(), ClaimsError> {
        if self.sub.is_empty() || self.tenant.is_empty() {
            return Err(ClaimsError::MissingIdentity);
        }
        if self.exp <= self.iat {
            return Err(ClaimsError::EmptyLifetime);
        }
        if self.iat > now.saturating_add(leeway_secs) {
            return Err(ClaimsError::NotYetValid);
        }
        if now >= self.exp.saturating_add(leeway_secs) {
            return Err(ClaimsError::Expired);
        }
        if self.cnf.x5t_s256 != x5t_s256_from_digest(presented_cert_digest) {
            return Err(ClaimsError::CertificateMismatch);
        }
        Ok(())
    }
}

/// `x5t#S256` from the SHA-256 digest of a DER certificate: base64url without padding.
pub fn x5t_s256_from_digest(digest: &[u8; 32]) -> String {
    URL_SAFE_NO_PAD.encode(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SHA-256 of the empty input, e3b0c442...7852b855. Its standard base64 is the well-known
    /// "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="; base64url maps + to - and / to _
    /// and drops the padding.
    const SHA256_EMPTY: [u8; 32] = [
        0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f, 0xb9,
        0x24, 0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b, 0x93, 0x4c, 0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52,
        0xb8, 0x55,
    ];

    #[test]
    fn thumbprint_vectors() {
        assert_eq!(
            x5t_s256_from_digest(&SHA256_EMPTY),
            "47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"
        );
        // 32 zero bytes: ten 3-byte groups give 40 'A', the last 2 bytes give 3 more.
        assert_eq!(x5t_s256_from_digest(&[0; 32]), "A".repeat(43));
        // 32 0xff bytes: each 3-byte group is four '_' (63); the tail 0xffff is 16 one-bits
        // + 2 zero bits: "__8".
        assert_eq!(
            x5t_s256_from_digest(&[0xff; 32]),
            format!("{}__8", "_".repeat(40))
        );
    }

    #[test]
    fn claims_wire_form() {
        let c = HostClaims::new("host_1", "acme", 1_000, 600, &SHA256_EMPTY);
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "sub": "host_1", "tenant": "acme", "iat": 1000, "exp": 1600,
                "cnf": {"x5t#S256": "47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"}
            })
        );
        let back: HostClaims = serde_json::from_value(v).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn checks() {
        let c = HostClaims::new("host_1", "acme", 1_000, 600, &SHA256_EMPTY);
        assert_eq!(c.check(1_000, 0, &SHA256_EMPTY), Ok(()));
        assert_eq!(c.check(1_599, 0, &SHA256_EMPTY), Ok(()));
        assert_eq!(c.check(1_600, 0, &SHA256_EMPTY), Err(ClaimsError::Expired));
        assert_eq!(c.check(1_600, 5, &SHA256_EMPTY), Ok(()));
        assert_eq!(
            c.check(990, 0, &SHA256_EMPTY),
            Err(ClaimsError::NotYetValid)
        );
        assert_eq!(c.check(990, 10, &SHA256_EMPTY), Ok(()));
        assert_eq!(
            c.check(1_100, 0, &[0; 32]),
            Err(ClaimsError::CertificateMismatch)
        );
        let empty = HostClaims {
            exp: 1_000,
            ..c.clone()
        };
        assert_eq!(
            empty.check(1_000, 0, &SHA256_EMPTY),
            Err(ClaimsError::EmptyLifetime)
        );
        let anon = HostClaims {
            sub: String::new(),
            ..c
        };
        assert_eq!(
            anon.check(1_100, 0, &SHA256_EMPTY),
            Err(ClaimsError::MissingIdentity)
        );
    }
}
