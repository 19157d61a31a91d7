//! Payloads of profiles `xagent.im.v2` and `xagent.im.v1`.

use serde::{Deserialize, Serialize};

/// `files[].type` values.
pub const FILE_TYPES: [&str; 4] = ["image", "video", "audio", "file"];

/// One file of a `chat.message` (either direction).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileItem {
    #[serde(rename = "type")]
    pub file_type: String,
    pub file_ref: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub byte_size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download_url: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessagePayload {
    pub message_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileItem>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<i64>,
    /// Display name of the sender (C->X only; never an internal identity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender_name: Option<String>,
}

impl ChatMessagePayload {
    /// IM2-05/06/07: non-empty id, text or files, known file types, unique refs.
    pub fn validate(&self) -> Result<(), String> {
        if self.message_id.is_empty() {
            return Err("message_id must be non-empty".into());
        }
        let has_text = self.text.as_deref().is_some_and(|t| !t.is_empty());
        if !has_text && self.files.is_empty() {
            return Err("chat.message needs non-empty text or files".into());
        }
        let mut seen = std::collections::HashSet::new();
        for f in &self.files {
            if !FILE_TYPES.contains(&f.file_type.as_str()) {
                return Err(format!(
                    "files[].type {:?} is not one of image, video, audio, file",
                    f.file_type
                ));
            }
            if f.file_ref.is_empty() {
                return Err("files[].file_ref must be non-empty".into());
            }
            if !seen.insert(f.file_ref.as_str()) {
                return Err("files[].file_ref must be unique within the message".into());
            }
        }
        Ok(())
    }

    /// Content fingerprint used for duplicate/conflict detection (text + file refs).
    pub fn content_key(&self) -> String {
        let mut refs: Vec<&str> = self.files.iter().map(|f| f.file_ref.as_str()).collect();
        refs.sort_unstable();
        format!(
            "{}\u{0}{}",
            self.text.as_deref().unwrap_or(""),
            refs.join("\u{0}")
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaPayload {
    pub message_id: String,
    pub sequence: u64,
    #[serde(default)]
    pub text: String,
    /// Deltas carry text only (IM2-19); present only to reject it.
    #[serde(default, skip_serializing)]
    pub files: Option<serde_json::Value>,
}

impl DeltaPayload {
    pub fn validate(&self) -> Result<(), String> {
        if self.message_id.is_empty() {
            return Err("message_id must be non-empty".into());
        }
        if self.sequence == 0 {
            return Err("sequence starts at 1".into());
        }
        if self.files.is_some() {
            return Err("chat.message.delta carries text only".into());
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AckStatus {
    Accepted,
    Duplicate,
    Rejected,
}

impl AckStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Duplicate => "duplicate",
            Self::Rejected => "rejected",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatAckPayload {
    pub message_id: String,
    pub status: AckStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
}

impl ChatAckPayload {
    pub fn accepted(message_id: &str) -> Self {
        Self {
            message_id: message_id.to_owned(),
            status: AckStatus::Accepted,
            code: None,
            message: None,
            retryable: None,
        }
    }
    pub fn duplicate(message_id: &str) -> Self {
        Self {
            status: AckStatus::Duplicate,
            ..Self::accepted(message_id)
        }
    }
    pub fn rejected(message_id: &str, code: &str, message: &str, retryable: bool) -> Self {
        Self {
            message_id: message_id.to_owned(),
            status: AckStatus::Rejected,
            code: Some(code.to_owned()),
            message: Some(message.to_owned()),
            retryable: Some(retryable),
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.message_id.is_empty() {
            return Err("message_id must be non-empty".into());
        }
        if self.status == AckStatus::Rejected
            && (self.code.as_deref().unwrap_or("").is_empty() || self.retryable.is_none())
        {
            return Err("rejected ack needs a code and a boolean retryable".into());
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActivityStatus {
    Thinking,
    Tool,
    Idle,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActivityPayload {
    pub status: ActivityStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
}

impl ActivityPayload {
    /// IM2-36: `tool_name` required iff status is `tool`, at most 256 bytes.
    pub fn validate(&self) -> Result<(), String> {
        match (&self.status, &self.tool_name) {
            (ActivityStatus::Tool, Some(n)) if !n.is_empty() && n.len() <= 256 => Ok(()),
            (ActivityStatus::Tool, Some(_)) => Err("tool_name must be 1..=256 bytes".into()),
            (ActivityStatus::Tool, None) => Err("tool_name is required when status is tool".into()),
            (_, Some(_)) => Err("tool_name is only allowed when status is tool".into()),
            (_, None) => Ok(()),
        }
    }
}

/// Legacy `message.push` payload (IM v1 §5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessagePushPayload {
    pub provider: String,
    pub profile: String,
    pub event_kind: String,
    pub message_id: String,
    pub sender_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    pub message_type: String,
    pub text: String,
    pub raw_text: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileItem>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<serde_json::Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activity_rules() {
        let ok = ActivityPayload {
            status: ActivityStatus::Tool,
            tool_name: Some("x".into()),
        };
        assert!(ok.validate().is_ok());
        let bad = ActivityPayload {
            status: ActivityStatus::Idle,
            tool_name: Some("x".into()),
        };
        assert!(bad.validate().is_err());
        let long = ActivityPayload {
            status: ActivityStatus::Tool,
            tool_name: Some("x".repeat(257)),
        };
        assert!(long.validate().is_err());
        let missing = ActivityPayload {
            status: ActivityStatus::Tool,
            tool_name: None,
        };
        assert!(missing.validate().is_err());
    }

    #[test]
    fn message_needs_content() {
        let m = ChatMessagePayload {
            message_id: "m".into(),
            text: Some(String::new()),
            files: vec![],
            created_at: None,
            sender_name: None,
        };
        assert!(m.validate().is_err());
    }

    #[test]
    fn duplicate_file_refs_rejected() {
        let f = FileItem {
            file_type: "file".into(),
            file_ref: "f1".into(),
            filename: None,
            mime_type: None,
            byte_size: None,
            expires_at: None,
            download_url: None,
        };
        let m = ChatMessagePayload {
            message_id: "m".into(),
            text: None,
            files: vec![f.clone(), f],
            created_at: None,
            sender_name: None,
        };
        assert!(m.validate().is_err());
    }
}
