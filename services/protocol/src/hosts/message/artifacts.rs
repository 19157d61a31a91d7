//! Artifact URL requests: `upload_artifact` and `download_artifact`.

use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------------------
// 8. upload_artifact / download_artifact

/// Host -> server: ask for a URL to upload a file a run produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadArtifact {
    pub run_id: String,
    pub name: String,
    pub content_type: String,
    pub size_bytes: u64,
}

/// Server -> host, answer to `upload_artifact`: a presigned (or signed Switchyard) URL the
/// host PUTs the bytes to, valid for `Timeouts::upload_url_ttl`. Over the HTTPS fallback it
/// is the bare response body, without `type`, exactly as in the seed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadArtifactAck {
    pub upload_url: String,
    pub artifact_id: String,
    /// Echo of the request, so a host with several uploads in flight can pair them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// When the URL stops working (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

/// Host -> server: ask for a URL to fetch an artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownloadArtifact {
    pub artifact_id: String,
}

/// Server -> host, answer to `download_artifact` (bare body over the HTTPS fallback).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownloadArtifactAck {
    pub download_url: String,
    /// Echo of the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}
