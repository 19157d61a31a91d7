//! HTTP event security as the Open Platform defines it: the body `{"encrypt": base64(iv ||
//! AES-256-CBC(SHA-256(encrypt_key), iv, json) with PKCS#7)}`, and the signature
//! `X-Lark-Signature = hex(sha256(timestamp + nonce + encrypt_key + raw body))`.

use aes::cipher::{BlockDecryptMut, KeyIvInit, block_padding::Pkcs7};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use sha2::{Digest, Sha256};

type Dec = cbc::Decryptor<aes::Aes256>;

/// The plaintext, or None when it does not decrypt with this key.
pub(crate) fn decrypt(encrypt_key: &str, b64: &str) -> Option<Vec<u8>> {
    let raw = STANDARD.decode(b64.trim()).ok()?;
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

pub(crate) fn signature(timestamp: &str, nonce: &str, encrypt_key: &str, body: &[u8]) -> String {
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
    use aes::cipher::BlockEncryptMut;

    #[test]
    fn decrypts_what_the_platform_encrypts() {
        let key: [u8; 32] = Sha256::digest(b"kk").into();
        let iv = [7u8; 16];
        let ct = cbc::Encryptor::<aes::Aes256>::new(&key.into(), &iv.into())
            .encrypt_padded_vec_mut::<Pkcs7>(b"{\"a\":1}");
        let mut all = iv.to_vec();
        all.extend_from_slice(&ct);
        let b64 = STANDARD.encode(all);
        assert_eq!(decrypt("kk", &b64).unwrap(), b"{\"a\":1}");
        assert!(decrypt("other", &b64).is_none_or(|p| p != b"{\"a\":1}"));
        assert!(decrypt("kk", "not base64!").is_none());
        // Known vector: sha256("1" + "n" + "k" + "{}").
        assert_eq!(
            signature("1", "n", "k", b"{}"),
            hex::encode(Sha256::digest(b"1nk{}"))
        );
    }
}
