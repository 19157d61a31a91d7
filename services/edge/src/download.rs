//! Headers of every response that streams bytes someone else supplied (files, artifacts):
//! the browser saves them, never renders them in our origin.

use axum::http::{HeaderMap, HeaderValue, header};

/// The sandbox a download gets should a browser render it anyway: no scripts, no plugins,
/// no requests, a unique origin.
pub const SANDBOX_CSP: &str = "sandbox; default-src 'none'";

/// `Content-Disposition: attachment` with the file's name (an ASCII fallback and the UTF-8
/// form), plus `X-Content-Type-Options: nosniff` and the sandbox CSP.
pub fn attachment(h: &mut HeaderMap, filename: &str) {
    if let Ok(v) = HeaderValue::from_str(&content_disposition(filename)) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    no_sniff(h);
}

/// `X-Content-Type-Options: nosniff` and the sandbox CSP.
pub fn no_sniff(h: &mut HeaderMap) {
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(SANDBOX_CSP),
    );
}

/// The Content-Type of supplied bytes: the declared one when it is a well-formed type,
/// else `application/octet-stream`.
pub fn content_type(declared: &str) -> HeaderValue {
    let ok = declared.len() <= 255
        && declared
            .parse::<mime_guess::mime::Mime>()
            .is_ok_and(|m| !m.type_().as_str().is_empty());
    ok.then(|| HeaderValue::from_str(declared).ok())
        .flatten()
        .unwrap_or_else(|| HeaderValue::from_static("application/octet-stream"))
}

/// `attachment; filename="ascii"; filename*=UTF-8''percent-encoded`.
pub fn content_disposition(name: &str) -> String {
    let ascii: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .filter(|c| *c != '"' && *c != '\\')
        .collect();
    let mut encoded = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            encoded.push(b as char);
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    format!("attachment; filename=\"{ascii}\"; filename*=UTF-8''{encoded}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispositions() {
        assert_eq!(
            content_disposition("a b.txt"),
            "attachment; filename=\"a b.txt\"; filename*=UTF-8''a%20b.txt"
        );
        assert!(content_disposition("отчёт.pdf").starts_with("attachment; filename=\"_"));
    }

    #[test]
    fn downloads_are_attachments_in_a_sandbox() {
        let mut h = HeaderMap::new();
        attachment(&mut h, "re\"port\n.html");
        let cd = h[header::CONTENT_DISPOSITION].to_str().unwrap();
        assert!(
            cd.starts_with("attachment; filename=\"report_.html\""),
            "{cd}"
        );
        assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(h[header::CONTENT_SECURITY_POLICY], SANDBOX_CSP);
        assert_eq!(content_type("text/csv"), "text/csv");
        assert_eq!(content_type("not a type"), "application/octet-stream");
    }
}
