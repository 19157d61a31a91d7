//! Opaque identifiers and time.

use rand::RngCore;

/// A random, unguessable identifier with a readable prefix (`cch_`, `conn_`, ...).
pub fn new_id(prefix: &str) -> String {
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    format!("{prefix}_{}", hex::encode(b))
}

/// A random secret of `n` bytes, hex encoded.
pub fn random_secret(n: usize) -> String {
    let mut b = vec![0u8; n];
    rand::rng().fill_bytes(&mut b);
    hex::encode(b)
}

/// Unix time in milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
