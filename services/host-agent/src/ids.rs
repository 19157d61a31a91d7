//! Identifiers, wall-clock times and small text helpers.

use rand::RngCore;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// A random (version 4) UUID in its canonical lowercase form.
pub fn new_uuid() -> String {
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Now, RFC 3339 in UTC (the protocol's timestamp form).
pub fn now_rfc3339() -> String {
    OffsetDateTime::now_utc()
        .format(&Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_owned())
}

/// Parses an RFC 3339 date-time.
pub fn parse_rfc3339(s: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(s, &Rfc3339).ok()
}

/// At most `max` bytes of `s`, cut at a character boundary, with a marker when cut.
pub fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [{} bytes cut]", &s[..end], s.len() - end)
}

/// A run id turned into a safe directory name: letters, digits, `-`, `_` and `.` are kept
/// (a leading dot is not), everything else becomes `_`.
pub fn dir_name(id: &str) -> String {
    let mut out: String = id
        .chars()
        .take(128)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with('.') {
        out.replace_range(0..1, "_");
    }
    if out.is_empty() {
        out.push('_');
    }
    out
}

/// An error with its sources, `outer: inner: innermost` (reqwest's own text hides the cause,
/// such as an unknown certificate issuer).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// The machine's host name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "localhost".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_shape() {
        let a = new_uuid();
        let b = new_uuid();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        let parts: Vec<_> = a.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12]);
        assert_eq!(&a[14..15], "4");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"));
    }

    #[test]
    fn times_round_trip() {
        let now = now_rfc3339();
        assert!(now.ends_with('Z'), "{now}");
        assert!(parse_rfc3339(&now).is_some());
        let t = parse_rfc3339("2026-07-20T12:00:00+03:00").unwrap();
        assert_eq!(t.unix_timestamp(), 1_784_538_000);
        assert!(parse_rfc3339("yesterday").is_none());
    }

    #[test]
    fn clipping_and_dir_names() {
        assert_eq!(clip("abc", 5), "abc");
        assert_eq!(clip("abcdef", 3), "abc… [3 bytes cut]");
        assert_eq!(clip("éé", 1), "… [4 bytes cut]");
        assert_eq!(dir_name("run-1_a.b"), "run-1_a.b");
        assert_eq!(dir_name("../etc/passwd"), "_._etc_passwd");
        assert_eq!(dir_name(""), "_");
    }
}
