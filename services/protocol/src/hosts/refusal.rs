//! Why the server refuses a host's own connection or request, whichever transport carries it
//! (docs/agent-hosts.md, "Identity" and "Data plane"). One code, two wire forms derived here
//! and nowhere else: over HTTP the `code` of `{"error": {"code", "message"}}` with
//! [`HostRefusalCode::http_status`]; on the socket the close code
//! [`HostRefusalCode::close_code`] with the same `code` opening the close reason
//! (`"host_revoked: ..."`, see [`HostRefusalCode::close_reason`]).
//!
//! A message the server answers inside the protocol (`{"type": "error", "code": 4001}`) is a
//! [`HostErrorCode`](super::HostErrorCode) instead: the seed's numeric table. A run operation
//! refused to xAgent or an operator is core's `AgentHostRefusalCode`.

/// A refusal of a host's connection or request. [`HostRefusalCode::as_str`] is the stable
/// snake_case code a host matches on, never its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostRefusalCode {
    /// No client certificate, or one that cannot be decoded.
    ClientCertificateRequired,
    /// The certificate was not issued to a host.
    UnknownCertificate,
    /// The host was revoked: its identity is no good any more.
    HostRevoked,
    /// No bearer JWT, a bad one, or one issued to another host; also a spent enrollment token.
    InvalidToken,
    /// The bearer JWT expired: fetch a new one.
    TokenExpired,
    /// The bearer JWT is bound to another certificate.
    CertificateMismatch,
    /// A forwarded certificate came without the trusted ingress's proof.
    IngressProofRequired,
    /// A message names another host than the connection's.
    WrongHost,
    /// The connection's first message was not `register` (in time).
    RegisterFirst,
    /// A newer connection of the same host took over.
    Replaced,
    /// No pong came back within the keepalive interval.
    KeepaliveTimeout,
    /// The pod is draining: reconnect, another pod answers.
    Draining,
    /// A body or message larger than allowed.
    TooLarge,
    /// A request body of the wrong shape (enrollment, token).
    InvalidRequest,
    /// The enrollment's CSR is not valid or cannot be signed.
    InvalidCsr,
    /// The WebSocket upgrade itself was malformed.
    InvalidRequestFormat,
    /// An artifact URL whose signature does not verify.
    Forbidden,
    /// An artifact URL past its expiry.
    Expired,
    /// No such artifact (or it has no bytes yet).
    NotFound,
    /// The artifact's bytes were uploaded already.
    AlreadyUploaded,
}

impl HostRefusalCode {
    pub const ALL: [Self; 20] = [
        Self::ClientCertificateRequired,
        Self::UnknownCertificate,
        Self::HostRevoked,
        Self::InvalidToken,
        Self::TokenExpired,
        Self::CertificateMismatch,
        Self::IngressProofRequired,
        Self::WrongHost,
        Self::RegisterFirst,
        Self::Replaced,
        Self::KeepaliveTimeout,
        Self::Draining,
        Self::TooLarge,
        Self::InvalidRequest,
        Self::InvalidCsr,
        Self::InvalidRequestFormat,
        Self::Forbidden,
        Self::Expired,
        Self::NotFound,
        Self::AlreadyUploaded,
    ];

    /// The stable code, the same on both transports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClientCertificateRequired => "client_certificate_required",
            Self::UnknownCertificate => "unknown_certificate",
            Self::HostRevoked => "host_revoked",
            Self::InvalidToken => "invalid_token",
            Self::TokenExpired => "token_expired",
            Self::CertificateMismatch => "certificate_mismatch",
            Self::IngressProofRequired => "ingress_proof_required",
            Self::WrongHost => "wrong_host",
            Self::RegisterFirst => "register_first",
            Self::Replaced => "replaced",
            Self::KeepaliveTimeout => "keepalive_timeout",
            Self::Draining => "draining",
            Self::TooLarge => "too_large",
            Self::InvalidRequest => "invalid_request",
            Self::InvalidCsr => "invalid_csr",
            Self::InvalidRequestFormat => "invalid_request_format",
            Self::Forbidden => "forbidden",
            Self::Expired => "expired",
            Self::NotFound => "not_found",
            Self::AlreadyUploaded => "already_uploaded",
        }
    }

    /// The code of a wire string (an HTTP error body, a close reason's first word).
    pub fn from_code(code: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == code)
    }

    /// The HTTP status a request refused with this code answers.
    pub fn http_status(self) -> u16 {
        match self {
            Self::InvalidRequest
            | Self::InvalidCsr
            | Self::InvalidRequestFormat
            | Self::RegisterFirst => 400,
            Self::ClientCertificateRequired
            | Self::UnknownCertificate
            | Self::HostRevoked
            | Self::InvalidToken
            | Self::TokenExpired
            | Self::CertificateMismatch
            | Self::IngressProofRequired => 401,
            Self::WrongHost | Self::Forbidden | Self::Expired => 403,
            Self::NotFound => 404,
            Self::KeepaliveTimeout => 408,
            Self::Replaced | Self::AlreadyUploaded => 409,
            Self::TooLarge => 413,
            Self::Draining => 503,
        }
    }

    /// The close code of a socket ended with this code: RFC 6455's own where one fits,
    /// otherwise 4000 + the HTTP status (4401 revoked, 4409 replaced).
    pub fn close_code(self) -> u16 {
        match self {
            // 1008 "policy violation": the host broke the session's rules.
            Self::WrongHost | Self::RegisterFirst | Self::KeepaliveTimeout => 1008,
            // 1009 "message too big".
            Self::TooLarge => 1009,
            // 1012 "service restart": reconnect, another pod answers.
            Self::Draining => 1012,
            other => 4000 + other.http_status(),
        }
    }

    /// The close frame's reason: the code, then the words (RFC 6455 allows 123 bytes).
    pub fn close_reason(self, message: &str) -> String {
        let mut reason = format!("{}: {message}", self.as_str());
        if reason.len() > 123 {
            let mut cut = 123;
            while !reason.is_char_boundary(cut) {
                cut -= 1;
            }
            reason.truncate(cut);
        }
        reason
    }

    /// The code a close reason written by [`HostRefusalCode::close_reason`] opens with.
    pub fn from_close_reason(reason: &str) -> Option<Self> {
        Self::from_code(reason.split(':').next().unwrap_or_default())
    }

    /// Retrying with the same identity cannot help: enroll again.
    pub fn is_permanent(self) -> bool {
        matches!(self, Self::HostRevoked | Self::UnknownCertificate)
    }
}

impl std::fmt::Display for HostRefusalCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::HostRefusalCode;

    #[test]
    fn codes_are_distinct_and_round_trip() {
        for c in HostRefusalCode::ALL {
            assert_eq!(HostRefusalCode::from_code(c.as_str()), Some(c));
        }
        let mut names: Vec<_> = HostRefusalCode::ALL.iter().map(|c| c.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), HostRefusalCode::ALL.len());
        assert_eq!(HostRefusalCode::from_code("host revoked"), None);
    }

    /// The wire values docs/agent-hosts.md and the e2e tests name.
    #[test]
    fn documented_wire_values() {
        use HostRefusalCode::*;
        for c in [
            ClientCertificateRequired,
            UnknownCertificate,
            HostRevoked,
            InvalidToken,
            TokenExpired,
            CertificateMismatch,
        ] {
            assert_eq!(c.http_status(), 401, "{c}");
        }
        assert_eq!(HostRevoked.close_code(), 4401);
        assert_eq!(Replaced.close_code(), 4409);
        assert_eq!(RegisterFirst.close_code(), 1008);
        assert_eq!(WrongHost.close_code(), 1008);
        assert_eq!(Draining.close_code(), 1012);
        assert_eq!(
            (WrongHost.http_status(), TooLarge.http_status()),
            (403, 413)
        );
    }

    #[test]
    fn a_close_reason_carries_the_code_within_the_frame_limit() {
        let r = HostRefusalCode::HostRevoked.close_reason("the host was revoked");
        assert_eq!(r, "host_revoked: the host was revoked");
        assert_eq!(
            HostRefusalCode::from_close_reason(&r),
            Some(HostRefusalCode::HostRevoked)
        );
        let long = HostRefusalCode::WrongHost.close_reason(&"é".repeat(100));
        assert!(long.len() <= 123 && long.starts_with("wrong_host: "));
        assert_eq!(HostRefusalCode::from_close_reason("going away"), None);
    }
}
