//! Event encryption as the Open Platform does it: AES-256-CBC with the key SHA-256(encrypt_key),
//! a random 16-byte IV put in front of the ciphertext, PKCS#7 padding, base64 of the whole;
//! and the request signature `hex(sha256(timestamp + nonce + encrypt_key + body))`.

use aes::cipher::{BlockDecryptMut, BlockEncryptMut, KeyIvInit, block_padding::Pkcs7};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use sha2::{Digest, Sha256};

type Enc = cbc::Encryptor<aes::Aes256>;
type Dec = cbc::Decryptor<aes::Aes256>;

pub fn encrypt(encrypt_key: &str, plain: &[u8]) -> String {
    let key: [u8; 32] = Sha256::digest(encrypt_key.as_bytes()).into();
    let iv: [u8; 16] = rand::random();
    let ct = Enc::new(&key.into(), &iv.into()).encrypt_padded_vec_mut::<Pkcs7>(plain);
    let mut out = iv.to_vec();
    out.extend_from_slice(&ct);
    STANDARD.encode(out)
}

pub fn decrypt(encrypt_key: &str, b64: &str) -> Option<Vec<u8>> {
    let raw = STANDARD.decode(b64).ok()?;
    if raw.len() < 32 || raw.len() % 16 != 0 {
        return None;
    }
    let key: [u8; 32] = Sha256::digest(encrypt_key.as_bytes()).into();
    let (iv, ct) = raw.split_at(16);
    let iv: [u8; 16] = iv.try_into().ok()?;
    Dec::new(&key.into(), &iv.into())
        .decrypt_padded_vec_mut::<Pkcs7>(ct)
        .ok()
}

pub fn signature(timestamp: &str, nonce: &str, encrypt_key: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(timestamp.as_bytes());
    h.update(nonce.as_bytes());
    h.update(encrypt_key.as_bytes());
    h.update(body);
    hex::encode(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let c = encrypt("test key", br#"{"challenge":"x"}"#);
        assert_eq!(decrypt("test key", &c).unwrap(), br#"{"challenge":"x"}"#);
        assert!(decrypt("other key", &c).is_none_or(|p| p != br#"{"challenge":"x"}"#));
        assert_eq!(signature("1", "n", "k", b"{}").len(), 64);
    }
}
