//! The Connector Card `xagent.connector/v1` (protocol §4.1, §10) and its hard rules.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::{CARD_SCHEMA, PROTOCOL_VERSION, TARGET_TYPES, profile};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildInfo {
    pub version: String,
    pub git_tag: String,
    pub git_rev: String,
    pub build_time: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Card {
    pub schema: String,
    pub protocol_version: String,
    pub build: BuildInfo,
    pub connector_card_id: String,
    pub connector: ConnectorInfo,
    pub supports: Supports,
    pub tools: Vec<CardTool>,
    pub auth_flows: Vec<AuthFlow>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ui: Option<Value>,
    pub security: Security,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConnectorInfo {
    pub name: String,
    pub version: String,
    pub vendor: String,
    pub description: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Supports {
    pub user_channel_mode: String,
    pub target_types: Vec<String>,
    pub targets: Vec<TargetDecl>,
    pub profiles: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetDecl {
    pub target_type: String,
    pub provider: String,
    pub label: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CardTool {
    pub tool_id: String,
    pub profile: String,
    pub title: String,
    pub description: String,
    pub related_skill_ids: Vec<String>,
    pub input_schema: Value,
    pub output_schema: Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthFlowType {
    Form,
    QrLogin,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuthFlow {
    pub id: String,
    pub target_type: String,
    #[serde(rename = "type")]
    pub flow_type: AuthFlowType,
    pub title: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<AuthField>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuthField {
    pub name: String,
    pub label: String,
    pub input_type: String,
    pub required: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placeholder: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub help_text: Option<String>,
    pub secret: bool,
}

impl AuthField {
    pub fn text(name: &str, label: &str, help: &str) -> Self {
        Self {
            name: name.into(),
            label: label.into(),
            input_type: "text".into(),
            required: true,
            placeholder: None,
            help_text: Some(help.into()),
            secret: false,
        }
    }
    pub fn secret(name: &str, label: &str, help: &str) -> Self {
        Self {
            input_type: "password".into(),
            secret: true,
            ..Self::text(name, label, help)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Security {
    pub trust_level: String,
    pub api_key_required: bool,
    pub data_classes: Vec<String>,
}

/// The one helper that injects the reserved `connector_channel_id` argument into a tool's
/// input schema (protocol §10). Providers never write it by hand.
pub fn with_connector_channel_id(mut schema: Value) -> Value {
    if !schema.is_object() {
        schema = json!({});
    }
    let obj = schema.as_object_mut().expect("object ensured above");
    obj.insert("type".into(), json!("object"));
    let props = obj.entry("properties").or_insert_with(|| json!({}));
    if let Some(p) = props.as_object_mut() {
        p.insert(
            "connector_channel_id".into(),
            json!({
                "type": "string",
                "description": "Target user-level Connector channel ID. Pass the opaque ID returned by connector_channels_list or inbound source_connector_channel_id unchanged."
            }),
        );
    }
    let required = obj.entry("required").or_insert_with(|| json!([]));
    if let Some(r) = required.as_array_mut() {
        r.retain(|v| v != "connector_channel_id");
        r.insert(0, json!("connector_channel_id"));
    }
    schema
}

/// Skill name rule (protocol §4.2): `connector-<card id>` with `.` and `_` turned into `-`.
pub fn skill_name(card_id: &str) -> String {
    format!(
        "connector-{}",
        card_id.to_ascii_lowercase().replace(['.', '_'], "-")
    )
}

/// True when `tool_id` satisfies the model-function-name rule.
pub fn tool_id_valid(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 256
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

impl Card {
    /// Every prose hard rule of protocol §4.1 and §10; returns the list of violations.
    pub fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.schema != CARD_SCHEMA {
            v.push("schema must be xagent.connector/v1".into());
        }
        if self.protocol_version != PROTOCOL_VERSION {
            v.push("protocol_version must be 3.0".into());
        }
        if self.build.build_time.is_empty() {
            v.push("build.build_time required".into());
        }
        if self.connector_card_id.is_empty()
            || self.connector.name.is_empty()
            || self.connector.version.is_empty()
        {
            v.push("connector_card_id, connector.name and connector.version are required".into());
        }
        if self.supports.target_types.is_empty() {
            v.push("supports.target_types must be non-empty".into());
        }
        for t in &self.supports.target_types {
            if !TARGET_TYPES.contains(&t.as_str()) {
                v.push(format!("unknown target type {t}"));
            }
        }
        if self.supports.profiles.is_empty() {
            v.push("supports.profiles must be non-empty".into());
        }
        if !matches!(
            self.supports.user_channel_mode.as_str(),
            "single" | "multiple"
        ) {
            v.push("user_channel_mode must be single or multiple".into());
        }
        for p in &self.supports.profiles {
            match profile::spec(p) {
                None => v.push(format!("unknown profile {p}")),
                Some(s)
                    if !s
                        .target_types
                        .iter()
                        .any(|t| self.supports.target_types.iter().any(|c| c == t)) =>
                {
                    v.push(format!(
                        "profile {p} does not intersect supports.target_types"
                    ))
                }
                _ => {}
            }
        }
        for t in &self.supports.targets {
            if !self.supports.target_types.contains(&t.target_type)
                || t.provider.is_empty()
                || t.label.is_empty()
            {
                v.push(
                    "supports.targets[] needs a declared target_type, provider and label".into(),
                );
            }
        }
        let skill = skill_name(&self.connector_card_id);
        let mut ids = std::collections::HashSet::new();
        for tool in &self.tools {
            if !tool_id_valid(&tool.tool_id) {
                v.push(format!(
                    "tool_id {:?} violates the charset/length rule",
                    tool.tool_id
                ));
            }
            if !ids.insert(tool.tool_id.as_str()) {
                v.push(format!("duplicate tool_id {}", tool.tool_id));
            }
            if !self.supports.profiles.contains(&tool.profile) {
                v.push(format!(
                    "tool {} profile not in supports.profiles",
                    tool.tool_id
                ));
            }
            let s = &tool.input_schema;
            if s.get("type") != Some(&json!("object"))
                || s.pointer("/properties/connector_channel_id/type") != Some(&json!("string"))
                || !s
                    .get("required")
                    .and_then(Value::as_array)
                    .is_some_and(|r| r.contains(&json!("connector_channel_id")))
            {
                v.push(format!(
                    "tool {} input_schema lacks the connector_channel_id contract",
                    tool.tool_id
                ));
            }
            if s.pointer("/properties/connector_card_id").is_some() {
                v.push(format!("tool {} declares connector_card_id", tool.tool_id));
            }
            for r in &tool.related_skill_ids {
                if !r.starts_with(&skill) {
                    v.push(format!(
                        "tool {} related skill {r} does not follow {skill}",
                        tool.tool_id
                    ));
                }
            }
        }
        let mut flow_ids = std::collections::HashSet::new();
        for f in &self.auth_flows {
            if f.id.is_empty()
                || f.title.is_empty()
                || !self.supports.target_types.contains(&f.target_type)
            {
                v.push(format!(
                    "auth flow {:?} needs id, title and a declared target_type",
                    f.id
                ));
            }
            if !flow_ids.insert(f.id.as_str()) {
                v.push(format!("duplicate auth flow {}", f.id));
            }
            if f.flow_type == AuthFlowType::Form && f.fields.is_empty() {
                v.push(format!("form flow {} needs fields", f.id));
            }
            let mut names = std::collections::HashSet::new();
            for field in &f.fields {
                if !names.insert(field.name.as_str()) {
                    v.push(format!("flow {} repeats field {}", f.id, field.name));
                }
                if field.input_type == "password" && !field.secret {
                    v.push(format!("password field {} must be secret", field.name));
                }
            }
        }
        if !matches!(
            self.security.trust_level.as_str(),
            "unknown" | "builtin" | "verified" | "third_party" | "local"
        ) {
            v.push("security.trust_level invalid".into());
        }
        v
    }

    pub fn tool(&self, id: &str) -> Option<&CardTool> {
        self.tools.iter().find(|t| t.tool_id == id)
    }

    pub fn flow(&self, id: &str) -> Option<&AuthFlow> {
        self.auth_flows.iter().find(|f| f.id == id)
    }

    pub fn primary_target(&self) -> &TargetDecl {
        &self.supports.targets[0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helper_injects_channel_argument_once() {
        let s = with_connector_channel_id(
            json!({"type":"object","required":["text","connector_channel_id"],"properties":{"text":{"type":"string"}}}),
        );
        assert_eq!(
            s.pointer("/properties/connector_channel_id/type"),
            Some(&json!("string"))
        );
        assert_eq!(s["required"], json!(["connector_channel_id", "text"]));
    }

    #[test]
    fn skill_names() {
        assert_eq!(skill_name("im.wechat"), "connector-im-wechat");
        assert_eq!(
            skill_name("device.agent_host"),
            "connector-device-agent-host"
        );
    }

    #[test]
    fn tool_ids() {
        assert!(tool_id_valid("webhook_message_send"));
        assert!(tool_id_valid("a.b-c"));
        assert!(!tool_id_valid("has space"));
        assert!(!tool_id_valid(""));
        assert!(!tool_id_valid(&"x".repeat(257)));
    }
}
