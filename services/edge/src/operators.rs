//! Operator credentials: the configured operators, the check of a presented token, and the
//! limiter every operator sign-in and Bearer call goes through (the console and `/admin/v1`).
//!
//! Guessing is bounded per source address: after `failures_per_source` wrong tokens within
//! `failure_window`, every operator authentication from that address (IPv4, or the IPv6 /64)
//! is answered 429 until the window ends, before the token is judged, so a guess past the
//! bound learns nothing. A wrong token names no operator, so guesses elsewhere never lock an
//! operator out; what one operator's credential may do is bounded per operator
//! (`requests_per_operator` a minute). The counters live in the shared ephemeral state
//! (outside the tenants' share of it); when it fails, authentication is refused (503), never
//! let through uncounted.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use switchyard_core::crypto::{ct_eq, sha256_hex};
use switchyard_core::ephemeral::Ephemeral;

/// The operator limiter's bounds (`[operator_auth]`).
#[derive(Debug, Clone, Copy)]
pub struct OperatorLimits {
    /// Wrong tokens from one source address within `failure_window` before it is refused.
    pub failures_per_source: u64,
    pub failure_window: Duration,
    /// Authenticated requests (sign-ins, Bearer calls, console pages) per operator a minute.
    pub requests_per_operator: u64,
}

/// Why an operator was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No operator tokens are configured.
    Disabled,
    /// No token, or not an operator's.
    Unauthorized,
    /// Over a bound: retry after this long.
    Limited(Duration),
    /// The ephemeral state failed: nothing could be counted.
    Unavailable,
}

impl Denied {
    pub fn status(self) -> StatusCode {
        match self {
            Denied::Disabled => StatusCode::NOT_FOUND,
            Denied::Unauthorized => StatusCode::UNAUTHORIZED,
            Denied::Limited(_) => StatusCode::TOO_MANY_REQUESTS,
            Denied::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Denied::Disabled => "no operator tokens are configured (operator_tokens)",
            Denied::Unauthorized => "an operator token is required",
            Denied::Limited(_) => "too many operator authentication attempts; retry later",
            Denied::Unavailable => "operator authentication is unavailable; retry",
        }
    }

    /// The refusal as the one client error shape (with `Retry-After` on 429 and 503).
    pub fn client_error(self) -> switchyard_core::client_error::ClientError {
        let code = match self {
            Denied::Disabled => "operator_api_disabled",
            Denied::Unauthorized => "unauthorized",
            Denied::Limited(_) => "rate_limited",
            Denied::Unavailable => "unavailable",
        };
        let e =
            switchyard_core::client_error::ClientError::new(self.status(), code, self.message());
        match self {
            Denied::Limited(after) => e.with_retry_after(after),
            _ => e,
        }
    }
}

/// The deployment's operators and their limiter.
#[derive(Clone)]
pub struct Operators {
    /// (name, token)
    list: Arc<Vec<(String, String)>>,
    ephemeral: Arc<dyn Ephemeral>,
    limits: OperatorLimits,
}

/// The bucket a source address counts in: an IPv4 address, or an IPv6 /64 (one host's
/// usual allocation); unknown sources share one bucket.
fn source_bucket(source: Option<IpAddr>) -> String {
    match source.map(|ip| ip.to_canonical()) {
        Some(IpAddr::V4(v4)) => v4.to_string(),
        Some(IpAddr::V6(v6)) => {
            let s = v6.segments();
            format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
        }
        None => "unknown".into(),
    }
}

/// What a console session keeps of the token it was opened with: a one-way fingerprint, so
/// replacing the token ends the session.
pub fn token_fingerprint(token: &str) -> String {
    sha256_hex(format!("switchyard operator session v1\n{token}").as_bytes())
}

impl Operators {
    pub fn new(
        list: Vec<(String, String)>,
        ephemeral: Arc<dyn Ephemeral>,
        limits: OperatorLimits,
    ) -> Self {
        Self {
            list: Arc::new(list),
            ephemeral,
            limits,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The operator `presented` belongs to, compared in constant time against every token.
    fn find(&self, presented: &str) -> Option<&(String, String)> {
        let presented = presented.trim();
        if presented.is_empty() {
            return None;
        }
        let mut hit = None;
        for op in self.list.iter() {
            if ct_eq(op.1.as_bytes(), presented.as_bytes()) && hit.is_none() {
                hit = Some(op);
            }
        }
        hit
    }

    /// Whether `name` is still an operator whose current token has `fingerprint`.
    pub fn holds(&self, name: &str, fingerprint: &str) -> bool {
        self.list.iter().any(|(n, t)| {
            n == name && ct_eq(token_fingerprint(t).as_bytes(), fingerprint.as_bytes())
        })
    }

    fn lock_key(bucket: &str) -> String {
        format!("operator:locked:{bucket}")
    }

    /// Judges a token presented from `source` (sign-in form or Bearer): the operator's name
    /// and the token's fingerprint, or why not.
    pub async fn authenticate(
        &self,
        source: Option<IpAddr>,
        presented: &str,
    ) -> Result<(String, String), Denied> {
        if self.is_empty() {
            return Err(Denied::Disabled);
        }
        if presented.trim().is_empty() {
            // No token at all is not a guess.
            return Err(Denied::Unauthorized);
        }
        let bucket = source_bucket(source);
        match self.ephemeral.get(&Self::lock_key(&bucket)).await {
            Ok(Some(_)) => {
                switchyard_core::limits::hit("operator_auth_source");
                return Err(Denied::Limited(self.limits.failure_window));
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "operator limiter unavailable; refusing");
                return Err(Denied::Unavailable);
            }
        }
        let Some((name, token)) = self.find(presented) else {
            let failures = self
                .ephemeral
                .incr(
                    &format!("operator:failures:{bucket}"),
                    self.limits.failure_window,
                )
                .await
                .map_err(|e| {
                    tracing::warn!(error = %e, "operator limiter unavailable; refusing");
                    Denied::Unavailable
                })?;
            if failures >= self.limits.failures_per_source {
                self.ephemeral
                    .put(
                        &Self::lock_key(&bucket),
                        b"1".to_vec(),
                        self.limits.failure_window,
                    )
                    .await
                    .map_err(|e| {
                        tracing::warn!(error = %e, "operator limiter unavailable; refusing");
                        Denied::Unavailable
                    })?;
                if failures > self.limits.failures_per_source {
                    switchyard_core::limits::hit("operator_auth_source");
                    return Err(Denied::Limited(self.limits.failure_window));
                }
                tracing::warn!(source = %bucket, failures, "operator token guesses from one source: refused until the window ends");
            }
            return Err(Denied::Unauthorized);
        };
        self.admit(name).await?;
        Ok((name.clone(), token_fingerprint(token)))
    }

    /// Counts one authenticated request of `name` against its per-minute bound.
    pub async fn admit(&self, name: &str) -> Result<(), Denied> {
        let key = format!("operator:requests:{}", &sha256_hex(name.as_bytes())[..32]);
        match self.ephemeral.incr(&key, Duration::from_secs(60)).await {
            Ok(n) if n > self.limits.requests_per_operator => {
                switchyard_core::limits::hit("operator_requests");
                Err(Denied::Limited(Duration::from_secs(60)))
            }
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::warn!(error = %e, "operator limiter unavailable; refusing");
                Err(Denied::Unavailable)
            }
        }
    }
}

/// The `Bearer` token of a request, if it has one.
pub fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// The TCP peer of a request (every pod listener sets it).
pub fn source(ext: &axum::http::Extensions) -> Option<IpAddr> {
    ext.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip())
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_core::ephemeral::MemoryEphemeral;

    fn ops() -> Operators {
        Operators::new(
            vec![("alice".into(), "a".repeat(32))],
            Arc::new(MemoryEphemeral::new(1000)),
            OperatorLimits {
                failures_per_source: 3,
                failure_window: Duration::from_secs(60),
                requests_per_operator: 5,
            },
        )
    }

    #[tokio::test]
    async fn guesses_lock_their_source_only() {
        let o = ops();
        let bad: IpAddr = "10.0.0.1".parse().unwrap();
        let good: IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 0..3 {
            assert_eq!(
                o.authenticate(Some(bad), "wrong").await,
                Err(Denied::Unauthorized)
            );
        }
        let right = "a".repeat(32);
        assert!(matches!(
            o.authenticate(Some(bad), &right).await,
            Err(Denied::Limited(_))
        ));
        assert_eq!(o.authenticate(Some(good), &right).await.unwrap().0, "alice");
    }

    #[tokio::test]
    async fn an_operator_is_bounded_per_minute() {
        let o = ops();
        let right = "a".repeat(32);
        for _ in 0..5 {
            assert!(o.authenticate(None, &right).await.is_ok());
        }
        assert!(matches!(
            o.authenticate(None, &right).await,
            Err(Denied::Limited(_))
        ));
    }

    #[test]
    fn ipv6_sources_count_per_64() {
        let a = source_bucket(Some("2001:db8:1:2::1".parse().unwrap()));
        let b = source_bucket(Some("2001:db8:1:2:ffff::9".parse().unwrap()));
        assert_eq!(a, b);
        assert_eq!(
            source_bucket(Some("::ffff:10.1.2.3".parse().unwrap())),
            "10.1.2.3"
        );
    }

    #[test]
    fn a_session_holds_only_while_its_token_does() {
        let o = ops();
        assert!(o.holds("alice", &token_fingerprint(&"a".repeat(32))));
        assert!(!o.holds("alice", &token_fingerprint(&"b".repeat(32))));
        assert!(!o.holds("bob", &token_fingerprint(&"a".repeat(32))));
    }
}
