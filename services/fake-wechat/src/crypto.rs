//! AES-128-ECB with PKCS#7 padding, as the WeChat media CDN stores files, and MD5.

use aes::Aes128;
use aes::cipher::generic_array::GenericArray;
use aes::cipher::{BlockDecrypt, BlockEncrypt, KeyInit};
use md5::{Digest, Md5};

/// Size of the ciphertext of `n` plaintext bytes (PKCS#7 always adds 1..=16 bytes).
pub fn padded_len(n: u64) -> u64 {
    (n / 16 + 1) * 16
}

pub fn encrypt(key: &[u8; 16], plain: &[u8]) -> Vec<u8> {
    let c = Aes128::new(GenericArray::from_slice(key));
    let pad = 16 - plain.len() % 16;
    let mut out = Vec::with_capacity(plain.len() + pad);
    out.extend_from_slice(plain);
    out.extend(std::iter::repeat_n(pad as u8, pad));
    for block in out.chunks_mut(16) {
        c.encrypt_block(GenericArray::from_mut_slice(block));
    }
    out
}

/// None when the length or the padding is wrong.
pub fn decrypt(key: &[u8; 16], ct: &[u8]) -> Option<Vec<u8>> {
    if ct.is_empty() || !ct.len().is_multiple_of(16) {
        return None;
    }
    let c = Aes128::new(GenericArray::from_slice(key));
    let mut out = ct.to_vec();
    for block in out.chunks_mut(16) {
        c.decrypt_block(GenericArray::from_mut_slice(block));
    }
    let pad = *out.last()? as usize;
    if pad == 0 || pad > 16 || out[out.len() - pad..].iter().any(|&b| b as usize != pad) {
        return None;
    }
    out.truncate(out.len() - pad);
    Some(out)
}

pub fn md5_hex(b: &[u8]) -> String {
    hex::encode(Md5::digest(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_sizes() {
        let key = *b"0123456789abcdef";
        for n in [0usize, 1, 15, 16, 17, 1000] {
            let p: Vec<u8> = (0..n).map(|i| i as u8).collect();
            let c = encrypt(&key, &p);
            assert_eq!(c.len() as u64, padded_len(n as u64));
            assert_eq!(decrypt(&key, &c).unwrap(), p);
        }
        assert!(decrypt(&key, b"short").is_none());
        // FIPS-197 AES-128 vector (one block, no padding check): key 000102..0f.
        let k: [u8; 16] = core::array::from_fn(|i| i as u8);
        let c = Aes128::new(GenericArray::from_slice(&k));
        let mut b =
            *GenericArray::from_slice(&hex::decode("00112233445566778899aabbccddeeff").unwrap());
        c.encrypt_block(&mut b);
        assert_eq!(hex::encode(b), "69c4e0d86a7b0430d8cdb78070b4c55a");
    }
}
