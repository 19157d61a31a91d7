//! The Connection Descriptor `xagent.connection/v2` (protocol §9).

use serde::{Deserialize, Serialize};

use crate::{Card, DESCRIPTOR_SCHEMA};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnectionStatus {
    Created,
    Authenticating,
    Connected,
    Degraded,
    Offline,
    Expired,
    Revoked,
    Error,
}

impl ConnectionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Authenticating => "authenticating",
            Self::Connected => "connected",
            Self::Degraded => "degraded",
            Self::Offline => "offline",
            Self::Expired => "expired",
            Self::Revoked => "revoked",
            Self::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
    }

    /// Statuses in which the target binding exists (tools may work).
    pub fn is_bound(self) -> bool {
        matches!(
            self,
            Self::Connected | Self::Degraded | Self::Offline | Self::Error
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolStatus {
    Available,
    Unavailable,
    DeniedByTarget,
    RequiresReauth,
    NotSupported,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolState {
    pub tool_id: String,
    pub status: ToolStatus,
    pub target_permission_state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connection {
    pub connector_card_id: String,
    pub connector_id: String,
    pub connector_channel_id: String,
    pub target_type: String,
    pub profiles: Vec<String>,
    pub status: ConnectionStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub provider: String,
    pub label: String,
    pub display_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_hint: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Descriptor {
    pub schema: String,
    pub connection: Connection,
    pub target: Target,
    pub tools: Vec<ToolState>,
}

/// What a provider says about a channel's target, redacted for display.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetView {
    pub display_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_hint: Option<String>,
}

impl Descriptor {
    /// Builds the Descriptor of one channel. Tools are always the Card's tools (D-08), each with
    /// a status derived from the connection status. Every Card tool serves the Card's single
    /// target type, so a legacy `xagent.im.v1` channel keeps its send tools.
    pub fn build(
        card: &Card,
        connector_id: &str,
        channel_id: &str,
        profiles: Vec<String>,
        status: ConnectionStatus,
        view: TargetView,
    ) -> Self {
        let target = card.primary_target();
        let (tool_status, permission) = match status {
            ConnectionStatus::Connected | ConnectionStatus::Degraded => {
                (ToolStatus::Available, "granted")
            }
            ConnectionStatus::Expired | ConnectionStatus::Revoked => {
                (ToolStatus::RequiresReauth, "requires_reauth")
            }
            ConnectionStatus::Created | ConnectionStatus::Authenticating => {
                (ToolStatus::Unavailable, "unknown")
            }
            ConnectionStatus::Offline | ConnectionStatus::Error => {
                (ToolStatus::Unavailable, "granted")
            }
        };
        let tools = card
            .tools
            .iter()
            .map(|t| ToolState {
                tool_id: t.tool_id.clone(),
                status: tool_status,
                target_permission_state: permission.to_owned(),
                reason: None,
            })
            .collect();
        let display_name = if view.display_name.is_empty() {
            format!("{} not bound", target.label)
        } else {
            view.display_name
        };
        Self {
            schema: DESCRIPTOR_SCHEMA.to_owned(),
            connection: Connection {
                connector_card_id: card.connector_card_id.clone(),
                connector_id: connector_id.to_owned(),
                connector_channel_id: channel_id.to_owned(),
                target_type: target.target_type.clone(),
                profiles,
                status,
            },
            target: Target {
                provider: target.provider.clone(),
                label: target.label.clone(),
                display_name,
                account_hint: view.account_hint,
            },
            tools,
        }
    }

    /// Prose hard rules (protocol §9) against the Card.
    pub fn violations(&self, card: &Card) -> Vec<String> {
        let mut v = Vec::new();
        if self.schema != DESCRIPTOR_SCHEMA {
            v.push("schema must be xagent.connection/v2".into());
        }
        let c = &self.connection;
        if c.connector_card_id != card.connector_card_id {
            v.push("connector_card_id differs from the Card".into());
        }
        if c.connector_id.is_empty() || c.connector_channel_id.is_empty() {
            v.push("connector_id and connector_channel_id are required".into());
        }
        if !card.supports.target_types.contains(&c.target_type) {
            v.push("target_type not declared by the Card".into());
        }
        if c.profiles.is_empty() {
            v.push("profiles must be non-empty".into());
        }
        let mut seen = std::collections::HashSet::new();
        for p in &c.profiles {
            if !seen.insert(p) || !card.supports.profiles.contains(p) {
                v.push(format!("profile {p} duplicated or not in the Card"));
            }
        }
        if self.target.provider.is_empty() {
            v.push("target.provider required".into());
        }
        for t in &self.tools {
            if card.tool(&t.tool_id).is_none() {
                v.push(format!("tool {} not in the Card", t.tool_id));
            }
        }
        v
    }
}
