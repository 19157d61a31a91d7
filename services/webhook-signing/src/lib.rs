//! The request signature shared by both directions of the webhook contract:
//! `X-Switchyard-Signature: v1=<hex HMAC-SHA256(secret, timestamp + "." + raw body)>`.
//!
//! Its own crate, with no Switchyard dependency, so the provider (`switchyard-provider-webhook`),
//! the fake chat system (`switchyard-fake-webhook`) and the loadtest sign and verify with the
//! same code without any of them pulling in the others.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

pub const TIMESTAMP_HEADER: &str = "x-switchyard-timestamp";
pub const SIGNATURE_HEADER: &str = "x-switchyard-signature";
/// How far a timestamp may be from the receiver's clock, in seconds.
pub const MAX_SKEW_SECS: i64 = 300;

const SCHEME: &str = "v1=";

/// Value of the signature header for `body` sent at `timestamp` (unix seconds).
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    format!("{SCHEME}{}", hex::encode(mac(secret, timestamp, body)))
}

fn mac(secret: &[u8], timestamp: i64, body: &[u8]) -> [u8; 32] {
    let mut mac = new_mac(secret);
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.finalize().into_bytes().into()
}

fn new_mac(secret: &[u8]) -> Hmac<Sha256> {
    <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes keys of any length")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureError {
    MissingTimestamp,
    StaleTimestamp,
    MissingSignature,
    Mismatch,
}

impl SignatureError {
    /// A fixed explanation for the sender; it never contains request data.
    pub fn message(self) -> &'static str {
        match self {
            Self::MissingTimestamp => "X-Switchyard-Timestamp is missing or not unix seconds",
            Self::StaleTimestamp => {
                "X-Switchyard-Timestamp is more than 300 seconds away from server time"
            }
            Self::MissingSignature => "X-Switchyard-Signature is missing or not v1=<hex>",
            Self::Mismatch => "X-Switchyard-Signature does not match the body",
        }
    }
}

/// Checks the two headers against `body`. `now` is unix seconds.
pub fn verify(
    secret: &[u8],
    timestamp_header: Option<&str>,
    signature_header: Option<&str>,
    body: &[u8],
    now: i64,
) -> Result<(), SignatureError> {
    let mut v = Verifier::start(secret, timestamp_header, signature_header, now)?;
    v.update(body);
    v.finish()
}

/// Checks a signature over a body that arrives in pieces, so a large body is verified
/// without being held: feed every byte with [`Verifier::update`], then [`Verifier::finish`].
pub struct Verifier {
    mac: Hmac<Sha256>,
    presented: Vec<u8>,
}

impl Verifier {
    /// Checks the headers' form (and the timestamp's age) before any body byte is read.
    pub fn start(
        secret: &[u8],
        timestamp_header: Option<&str>,
        signature_header: Option<&str>,
        now: i64,
    ) -> Result<Self, SignatureError> {
        let ts = verify_timestamp(timestamp_header, now)?;
        let presented = parse_signature(signature_header)?;
        let mut mac = new_mac(secret);
        mac.update(ts.to_string().as_bytes());
        mac.update(b".");
        Ok(Self { mac, presented })
    }

    pub fn update(&mut self, chunk: &[u8]) {
        self.mac.update(chunk);
    }

    pub fn finish(self) -> Result<(), SignatureError> {
        let expected: [u8; 32] = self.mac.finalize().into_bytes().into();
        // Constant time: the comparison must not tell a forger how much of a guess was right.
        if expected.len() == self.presented.len() && bool::from(expected.ct_eq(&self.presented)) {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }
}

fn parse_signature(signature_header: Option<&str>) -> Result<Vec<u8>, SignatureError> {
    signature_header
        .map(str::trim)
        .and_then(|s| s.strip_prefix(SCHEME))
        .and_then(|h| hex::decode(h).ok())
        .filter(|h| h.len() == 32)
        .ok_or(SignatureError::MissingSignature)
}

/// Parses the timestamp header and checks it is within [`MAX_SKEW_SECS`] of `now`.
pub fn verify_timestamp(timestamp_header: Option<&str>, now: i64) -> Result<i64, SignatureError> {
    let ts: i64 = timestamp_header
        .map(str::trim)
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse().ok())
        .ok_or(SignatureError::MissingTimestamp)?;
    if now.abs_diff(ts) > MAX_SKEW_SECS as u64 {
        return Err(SignatureError::StaleTimestamp);
    }
    Ok(ts)
}

/// Unix seconds from the system clock.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef";

    #[test]
    fn round_trip() {
        let sig = sign(SECRET, 1_700_000_000, b"{}");
        assert!(sig.starts_with("v1=") && sig.len() == 3 + 64);
        assert_eq!(
            verify(SECRET, Some("1700000000"), Some(&sig), b"{}", 1_700_000_100),
            Ok(())
        );
    }

    #[test]
    fn rejects() {
        let sig = sign(SECRET, 1_700_000_000, b"{}");
        let now = 1_700_000_000;
        assert_eq!(
            verify(SECRET, None, Some(&sig), b"{}", now),
            Err(SignatureError::MissingTimestamp)
        );
        assert_eq!(
            verify(SECRET, Some("-5"), Some(&sig), b"{}", now),
            Err(SignatureError::MissingTimestamp)
        );
        assert_eq!(
            verify(SECRET, Some("1700000000"), Some(&sig), b"{}", now + 301),
            Err(SignatureError::StaleTimestamp)
        );
        assert_eq!(
            verify(SECRET, Some("1700000000"), Some(&sig), b"{}", now - 301),
            Err(SignatureError::StaleTimestamp)
        );
        assert_eq!(
            verify(SECRET, Some("1700000000"), None, b"{}", now),
            Err(SignatureError::MissingSignature)
        );
        assert_eq!(
            verify(SECRET, Some("1700000000"), Some("v0=00"), b"{}", now),
            Err(SignatureError::MissingSignature)
        );
        assert_eq!(
            verify(SECRET, Some("1700000000"), Some(&sig), b"{ }", now),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(
                b"another-secret-16",
                Some("1700000000"),
                Some(&sig),
                b"{}",
                now
            ),
            Err(SignatureError::Mismatch)
        );
        // Fed in pieces, the same body verifies; a short hex signature is malformed.
        let mut v = Verifier::start(SECRET, Some("1700000000"), Some(&sig), now).unwrap();
        v.update(b"{");
        v.update(b"}");
        assert_eq!(v.finish(), Ok(()));
        assert!(matches!(
            Verifier::start(SECRET, Some("1700000000"), Some("v1=00"), now),
            Err(SignatureError::MissingSignature)
        ));
        // The timestamp is part of the MAC: moving it inside the window still fails.
        assert_eq!(
            verify(SECRET, Some("1700000001"), Some(&sig), b"{}", now),
            Err(SignatureError::Mismatch)
        );
    }
}
