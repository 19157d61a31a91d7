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
