//! CDN media crypto (AES-128-ECB with PKCS#7, streamed on upload), key formats and MD5.

use aes::Aes128;
use aes::cipher::generic_array::GenericArray;
use aes::cipher::{BlockDecrypt, BlockEncrypt, KeyInit};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use md5::{Digest, Md5};
use switchyard_core::files::ByteStream;

pub(crate) fn padded_len(n: u64) -> u64 {
    (n / 16 + 1) * 16
}

pub(crate) fn decrypt(key: &[u8; 16], ct: &[u8]) -> Option<Vec<u8>> {
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

/// A media key as iLink gives it: base64 of 16 raw bytes, base64 of 32 hex characters, or
/// 32 hex characters.
pub(crate) fn parse_key(v: &str) -> Option<[u8; 16]> {
    let v = v.trim();
    if v.len() == 32
        && let Ok(raw) = hex::decode(v)
    {
        return raw.try_into().ok();
    }
    let raw = STANDARD.decode(v).ok()?;
    if raw.len() == 16 {
        return raw.try_into().ok();
    }
    let s = String::from_utf8(raw).ok()?;
    hex::decode(s.trim()).ok()?.try_into().ok()
}

/// Encrypts a plaintext stream block by block; the last chunk carries the padding.
pub(crate) fn encrypt_stream(
    key: [u8; 16],
    body: ByteStream,
) -> impl Stream<Item = std::io::Result<Bytes>> + Send + 'static {
    let cipher = Aes128::new(GenericArray::from_slice(&key));
    let state = (body, BytesMut::new(), cipher, false);
    futures::stream::unfold(state, |(mut body, mut rest, cipher, done)| async move {
        if done {
            return None;
        }
        loop {
            match body.next().await {
                Some(Ok(chunk)) => {
                    rest.extend_from_slice(&chunk);
                    let whole = rest.len() / 16 * 16;
                    if whole == 0 {
                        continue;
                    }
                    let mut out = rest.split_to(whole);
                    for block in out.chunks_mut(16) {
                        cipher.encrypt_block(GenericArray::from_mut_slice(block));
                    }
                    return Some((Ok(out.freeze()), (body, rest, cipher, false)));
                }
                Some(Err(e)) => return Some((Err(e), (body, rest, cipher, true))),
                None => {
                    let pad = 16 - rest.len() % 16;
                    rest.extend(std::iter::repeat_n(pad as u8, pad));
                    let mut out = rest.split();
                    for block in out.chunks_mut(16) {
                        cipher.encrypt_block(GenericArray::from_mut_slice(block));
                    }
                    return Some((Ok(out.freeze()), (body, rest, cipher, true)));
                }
            }
        }
    })
}

/// MD5 (hex) and length of a stream.
pub(crate) async fn md5_of(mut body: ByteStream) -> std::io::Result<(String, u64)> {
    let mut h = Md5::new();
    let mut n = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        n += chunk.len() as u64;
        h.update(&chunk);
    }
    Ok((hex::encode(h.finalize()), n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_core::files::bytes_stream;

    fn encrypt(key: &[u8; 16], plain: &[u8]) -> Vec<u8> {
        let c = Aes128::new(GenericArray::from_slice(key));
        let pad = 16 - plain.len() % 16;
        let mut out = plain.to_vec();
        out.extend(std::iter::repeat_n(pad as u8, pad));
        for block in out.chunks_mut(16) {
            c.encrypt_block(GenericArray::from_mut_slice(block));
        }
        out
    }

    #[tokio::test]
    async fn streamed_encryption_matches_whole_encryption() {
        let key = *b"k1k2k3k4k5k6k7k8";
        for n in [0usize, 5, 16, 31, 4096 + 3] {
            let plain: Vec<u8> = (0..n).map(|i| (i * 7) as u8).collect();
            // Split into uneven chunks to exercise the carry-over.
            let parts: Vec<std::io::Result<Bytes>> = plain
                .chunks(7)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            let s: ByteStream = Box::pin(futures::stream::iter(parts));
            let out: Vec<Bytes> = encrypt_stream(key, s).map(|r| r.unwrap()).collect().await;
            let ct: Vec<u8> = out.concat();
            assert_eq!(ct, encrypt(&key, &plain), "n={n}");
            assert_eq!(ct.len() as u64, padded_len(n as u64));
            assert_eq!(decrypt(&key, &ct).unwrap(), plain);
        }
        let (md5, len) = md5_of(bytes_stream(b"hello".to_vec())).await.unwrap();
        assert_eq!(md5, "5d41402abc4b2a76b9719d911017c592");
        assert_eq!(len, 5);
    }

    #[test]
    fn key_forms() {
        let raw = *b"1234567890abcdef";
        let hex_s = hex::encode(raw);
        assert_eq!(parse_key(&hex_s), Some(raw));
        assert_eq!(parse_key(&STANDARD.encode(raw)), Some(raw));
        assert_eq!(parse_key(&STANDARD.encode(&hex_s)), Some(raw));
        assert_eq!(parse_key("nope"), None);
    }
}
