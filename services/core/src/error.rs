//! The backend-neutral error of every trait seam. No driver error crosses a seam.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The thing asked for does not exist.
    NotFound,
    /// A uniqueness or state precondition failed.
    Conflict,
    /// The backend cannot be reached right now; retrying later may succeed.
    Unavailable,
    /// A size or capacity limit was hit.
    LimitExceeded,
    /// Anything else. Details are in the source, which is logged and never sent.
    Internal,
}

#[derive(Debug, thiserror::Error)]
pub struct BackendError {
    pub kind: ErrorKind,
    pub context: String,
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.context)?;
        if let Some(s) = &self.source {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

impl BackendError {
    pub fn new(kind: ErrorKind, context: impl Into<String>) -> Self {
        Self {
            kind,
            context: context.into(),
            source: None,
        }
    }
    pub fn with_source(
        kind: ErrorKind,
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            kind,
            context: context.into(),
            source: Some(Box::new(source)),
        }
    }
    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, what)
    }
    pub fn conflict(what: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, what)
    }
    pub fn unavailable(what: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, what)
    }
    pub fn internal(what: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, what)
    }
    pub fn is(&self, kind: ErrorKind) -> bool {
        self.kind == kind
    }
}

pub type BackendResult<T> = Result<T, BackendError>;

/// What a client may learn of a [`BackendError`]: whether retrying later can help. Every
/// vocabulary (an HTTP [`ClientError`](crate::client_error::ClientError), an xAgent
/// [`Fault`](crate::engine::Fault), an
/// [`AgentHostRefusal`](crate::hosts::AgentHostRefusal), the console's page) renders this
/// and never looks at the error itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendRefusal {
    /// The backend cannot be reached right now: retry later.
    Unavailable,
    /// Anything else.
    Internal,
}

impl BackendRefusal {
    /// The stable snake_case code of an HTTP refusal.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unavailable => "unavailable",
            Self::Internal => "internal",
        }
    }

    /// Words safe to show.
    pub fn message(self) -> &'static str {
        match self {
            Self::Unavailable => "a backend is unavailable; retry later",
            Self::Internal => "internal error",
        }
    }

    pub fn http_status(self) -> u16 {
        match self {
            Self::Unavailable => 503,
            Self::Internal => 500,
        }
    }
}

impl BackendError {
    /// The one mapping from a backend failure to what a client sees. The context and source
    /// may name tables or hosts: they are logged here and never sent.
    pub fn refusal(&self) -> BackendRefusal {
        tracing::warn!(error = %self, "backend error");
        match self.kind {
            ErrorKind::Unavailable => BackendRefusal::Unavailable,
            ErrorKind::NotFound
            | ErrorKind::Conflict
            | ErrorKind::LimitExceeded
            | ErrorKind::Internal => BackendRefusal::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{BackendError, BackendRefusal, ErrorKind};

    #[test]
    fn only_an_unavailable_backend_is_worth_a_retry_and_no_detail_is_shown() {
        let kinds = [
            (ErrorKind::NotFound, BackendRefusal::Internal),
            (ErrorKind::Conflict, BackendRefusal::Internal),
            (ErrorKind::Unavailable, BackendRefusal::Unavailable),
            (ErrorKind::LimitExceeded, BackendRefusal::Internal),
            (ErrorKind::Internal, BackendRefusal::Internal),
        ];
        for (kind, want) in kinds {
            let r = BackendError::new(kind, "table hosts at db.internal:5432").refusal();
            assert_eq!(r, want, "{kind:?}");
            assert!(!r.message().contains("db.internal"));
        }
        assert_eq!(
            (
                BackendRefusal::Unavailable.http_status(),
                BackendRefusal::Unavailable.as_str()
            ),
            (503, "unavailable")
        );
        assert_eq!(
            (
                BackendRefusal::Internal.http_status(),
                BackendRefusal::Internal.as_str()
            ),
            (500, "internal")
        );
    }
}
