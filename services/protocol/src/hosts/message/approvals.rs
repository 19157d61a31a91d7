//! Approvals: `approval_request`, `approval_granted` and `approval_denied`.

use serde::{Deserialize, Serialize};

use crate::hosts::error::HostErrorCode;

// ---------------------------------------------------------------------------------------
// 9. approve

/// Host -> server: a risky action waits for a person.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    pub run_id: String,
    pub action: String,
    pub risk_level: RiskLevel,
    /// Chosen by the host so it can pair the answer with the request; the server echoes it
    /// in `approval_granted` / `approval_denied`. When absent the server assigns one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RiskLevel {
    Low,
    Medium,
    High,
    Critical,
}

/// Server -> host, after a person approved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalGranted {
    pub approval_id: String,
    /// The operator's identity.
    pub approved_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

/// Server -> host: the approval was denied by a person, or expired undecided. Always
/// carries `code: 4008`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalDenied {
    pub approval_id: String,
    #[serde(default = "approval_denied_code")]
    pub code: HostErrorCode,
    /// The operator's identity; absent when the approval expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denied_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

fn approval_denied_code() -> HostErrorCode {
    HostErrorCode::ApprovalDenied
}
