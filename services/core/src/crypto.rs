//! Secrets at rest, signed URLs and API keys.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// A string that never shows itself in `Debug` or `Display`.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CryptoError {
    #[error("encryption key must be 32 bytes of base64")]
    BadKey,
    #[error("no encryption key configured")]
    NoKey,
    #[error("ciphertext cannot be decrypted with any configured key")]
    Undecryptable,
}

/// Authenticated encryption of credentials at rest. The first key encrypts; every key is
/// tried for decryption so keys can be rotated.
///
/// Every blob is bound to the row it belongs to: the caller names it (`channel:ID`,
/// `auth_session:ID`, ...) and that name is the AEAD's associated data, so a blob copied into
/// another row (another tenant's channel, say) does not decrypt there.
///
/// Layout: format (1 byte) | nonce (12) | ciphertext. Format 1 is bound to its row; format 0
/// is the unbound layout of builds before row binding, still read so an upgrade loses no
/// binding, and rewritten as format 1 the next time the row is written.
#[derive(Clone)]
pub struct Cipher {
    keys: Vec<ChaCha20Poly1305>,
}

/// Blobs written before row binding (no associated data).
const FORMAT_UNBOUND: u8 = 0;
/// Blobs bound to their row through the associated data.
const FORMAT_BOUND: u8 = 1;

impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cipher({} keys)", self.keys.len())
    }
}

impl Cipher {
    /// Keys as base64 strings of 32 bytes each.
    pub fn from_base64(keys: &[Secret]) -> Result<Self, CryptoError> {
        if keys.is_empty() {
            return Err(CryptoError::NoKey);
        }
        let keys = keys
            .iter()
            .map(|k| {
                let raw = STANDARD
                    .decode(k.expose().trim())
                    .map_err(|_| CryptoError::BadKey)?;
                if raw.len() != 32 {
                    return Err(CryptoError::BadKey);
                }
                Ok(ChaCha20Poly1305::new(Key::from_slice(&raw)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { keys })
    }

    /// A fresh random key, base64.
    pub fn generate_key() -> String {
        let mut k = [0u8; 32];
        rand::rng().fill_bytes(&mut k);
        STANDARD.encode(k)
    }

    /// Encrypts `plaintext` for the row named `row` (see the type's docs).
    pub fn encrypt(&self, row: &str, plaintext: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; 12];
        rand::rng().fill_bytes(&mut nonce);
        // ChaCha20-Poly1305 encryption cannot fail for in-memory buffers.
        let ct = self.keys[0]
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: plaintext,
                    aad: row.as_bytes(),
                },
            )
            .unwrap_or_default();
        let mut out = Vec::with_capacity(13 + ct.len());
        out.push(FORMAT_BOUND);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ct);
        out
    }

    /// Decrypts a blob of the row named `row`; a blob of another row does not decrypt.
    pub fn decrypt(&self, row: &str, blob: &[u8]) -> Result<Vec<u8>, CryptoError> {
        if blob.len() < 13 {
            return Err(CryptoError::Undecryptable);
        }
        let aad: &[u8] = match blob[0] {
            FORMAT_BOUND => row.as_bytes(),
            FORMAT_UNBOUND => b"",
            _ => return Err(CryptoError::Undecryptable),
        };
        let nonce = Nonce::from_slice(&blob[1..13]);
        self.keys
            .iter()
            .find_map(|k| {
                k.decrypt(
                    nonce,
                    Payload {
                        msg: &blob[13..],
                        aad,
                    },
                )
                .ok()
            })
            .ok_or(CryptoError::Undecryptable)
    }

    pub fn encrypt_json(&self, row: &str, v: &serde_json::Value) -> Vec<u8> {
        self.encrypt(row, &serde_json::to_vec(v).unwrap_or_default())
    }

    pub fn decrypt_json(&self, row: &str, blob: &[u8]) -> Result<serde_json::Value, CryptoError> {
        serde_json::from_slice(&self.decrypt(row, blob)?).map_err(|_| CryptoError::Undecryptable)
    }
}

/// The associated-data names of the rows whose columns hold encrypted blobs.
pub mod rows {
    /// A channel's binding credentials (`channels.binding`).
    pub fn channel(id: &str) -> String {
        format!("channel:{id}")
    }
    /// An auth session's provider state (`auth_sessions.state`).
    pub fn auth_session(id: &str) -> String {
        format!("auth_session:{id}")
    }
    /// A key of the durable key-value table (`kv`), by namespace.
    pub fn kv(namespace: &str, key: &str) -> String {
        format!("kv:{namespace}/{key}")
    }
}

type HmacSha256 = Hmac<Sha256>;

/// HMAC-SHA256 of `msg` with `key`.
pub fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut mac = <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(msg);
    mac.finalize().into_bytes().into()
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Constant-time equality of two byte strings.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// Signs `/files/refs` URLs so any pod can verify them without shared session state.
#[derive(Clone)]
pub struct UrlSigner {
    keys: Vec<Secret>,
}

impl std::fmt::Debug for UrlSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UrlSigner({} keys)", self.keys.len())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureCheck {
    Valid,
    Expired,
    Invalid,
}

impl UrlSigner {
    pub fn new(keys: Vec<Secret>) -> Result<Self, CryptoError> {
        if keys.is_empty() || keys.iter().any(|k| k.expose().is_empty()) {
            return Err(CryptoError::NoKey);
        }
        Ok(Self { keys })
    }

    fn mac(key: &Secret, file_ref: &str, expires_ms: i64) -> String {
        URL_SAFE_NO_PAD.encode(hmac_sha256(
            key.expose().as_bytes(),
            format!("{file_ref}.{expires_ms}").as_bytes(),
        ))
    }

    /// Query string `exp=..&sig=..` for a file ref.
    pub fn sign(&self, file_ref: &str, expires_ms: i64) -> String {
        format!(
            "exp={expires_ms}&sig={}",
            Self::mac(&self.keys[0], file_ref, expires_ms)
        )
    }

    pub fn verify(
        &self,
        file_ref: &str,
        expires_ms: i64,
        sig: &str,
        now_ms: i64,
    ) -> SignatureCheck {
        let ok = self.keys.iter().any(|k| {
            ct_eq(
                Self::mac(k, file_ref, expires_ms).as_bytes(),
                sig.as_bytes(),
            )
        });
        match (ok, expires_ms >= now_ms) {
            (false, _) => SignatureCheck::Invalid,
            (true, false) => SignatureCheck::Expired,
            (true, true) => SignatureCheck::Valid,
        }
    }
}

/// A freshly minted API key: the full key is shown once, only the hash is stored.
#[derive(Debug)]
pub struct MintedKey {
    pub id: String,
    pub key: Secret,
    pub secret_hash: String,
}

const KEY_PREFIX: &str = "sy_";

/// Mints an API key `sy_<id>_<secret>`; the id part locates the record, the secret is hashed.
pub fn mint_api_key() -> MintedKey {
    let idpart = crate::ids::random_secret(8);
    let secret = crate::ids::random_secret(32);
    MintedKey {
        id: format!("key_{idpart}"),
        key: Secret::new(format!("{KEY_PREFIX}{idpart}_{secret}")),
        secret_hash: sha256_hex(secret.as_bytes()),
    }
}

/// Splits a presented key into (key id, hash of secret); None when malformed.
pub fn parse_api_key(presented: &str) -> Option<(String, String)> {
    let rest = presented.strip_prefix(KEY_PREFIX)?;
    let (idpart, secret) = rest.split_once('_')?;
    if idpart.is_empty() || secret.is_empty() || !idpart.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some((format!("key_{idpart}"), sha256_hex(secret.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cipher_round_trip_and_rotation() {
        let old = Secret::new(Cipher::generate_key());
        let new = Secret::new(Cipher::generate_key());
        let c_old = Cipher::from_base64(std::slice::from_ref(&old)).unwrap();
        let blob = c_old.encrypt("channel:cch_1", b"bot-token");
        assert!(!blob.windows(9).any(|w| w == b"bot-token"));
        let rotated = Cipher::from_base64(&[new, old]).unwrap();
        assert_eq!(
            rotated.decrypt("channel:cch_1", &blob).unwrap(),
            b"bot-token"
        );
        let other = Cipher::from_base64(&[Secret::new(Cipher::generate_key())]).unwrap();
        assert!(other.decrypt("channel:cch_1", &blob).is_err());
    }

    #[test]
    fn a_blob_decrypts_only_in_its_own_row() {
        let c = Cipher::from_base64(&[Secret::new(Cipher::generate_key())]).unwrap();
        let blob = c.encrypt_json(&rows::channel("cch_a"), &serde_json::json!({"t": "s3cret"}));
        assert_eq!(
            c.decrypt_json(&rows::channel("cch_a"), &blob).unwrap()["t"],
            "s3cret"
        );
        // Copied into another channel's row (or an auth session's), it is refused.
        assert!(c.decrypt_json(&rows::channel("cch_b"), &blob).is_err());
        assert!(c.decrypt_json(&rows::auth_session("cch_a"), &blob).is_err());
        // A flipped format byte cannot strip the binding.
        let mut unbound = blob.clone();
        unbound[0] = FORMAT_UNBOUND;
        assert!(c.decrypt_json(&rows::channel("cch_a"), &unbound).is_err());
        let mut unknown = blob;
        unknown[0] = 7;
        assert!(c.decrypt_json(&rows::channel("cch_a"), &unknown).is_err());
    }

    #[test]
    fn blobs_written_before_row_binding_still_decrypt() {
        // The layout older builds wrote: format 0, no associated data.
        let key = Cipher::generate_key();
        let raw = STANDARD.decode(&key).unwrap();
        let aead = ChaCha20Poly1305::new(Key::from_slice(&raw));
        let nonce = [9u8; 12];
        let ct = aead
            .encrypt(Nonce::from_slice(&nonce), &b"{\"t\":1}"[..])
            .unwrap();
        let mut blob = vec![FORMAT_UNBOUND];
        blob.extend_from_slice(&nonce);
        blob.extend_from_slice(&ct);
        let c = Cipher::from_base64(&[Secret::new(key)]).unwrap();
        assert_eq!(
            c.decrypt_json(&rows::channel("any"), &blob).unwrap()["t"],
            1
        );
    }

    #[test]
    fn url_signatures() {
        let s = UrlSigner::new(vec![Secret::new("k1")]).unwrap();
        let q = s.sign("file_1", 2000);
        let sig = q.split("sig=").nth(1).unwrap();
        assert_eq!(s.verify("file_1", 2000, sig, 1000), SignatureCheck::Valid);
        assert_eq!(s.verify("file_1", 2000, sig, 3000), SignatureCheck::Expired);
        assert_eq!(s.verify("file_2", 2000, sig, 1000), SignatureCheck::Invalid);
        assert_eq!(s.verify("file_1", 2001, sig, 1000), SignatureCheck::Invalid);
        let rotated = UrlSigner::new(vec![Secret::new("k2"), Secret::new("k1")]).unwrap();
        assert_eq!(
            rotated.verify("file_1", 2000, sig, 1000),
            SignatureCheck::Valid
        );
    }

    #[test]
    fn api_keys() {
        let m = mint_api_key();
        let (id, hash) = parse_api_key(m.key.expose()).unwrap();
        assert_eq!(id, m.id);
        assert_eq!(hash, m.secret_hash);
        assert!(parse_api_key("Bearer x").is_none());
        assert_eq!(format!("{:?}", m.key), "Secret(***)");
    }
}
