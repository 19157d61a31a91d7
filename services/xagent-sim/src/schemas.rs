//! The protocol's three JSON Schemas (checked in under `proto-schemas/`, byte-identical to the
//! published ones) and validators for everything a Connector emits.
//!
//! Schemas constrain structure only; the protocol text and `switchyard-protocol` stay
//! authoritative for cross-object rules (protocol §1).

use std::sync::LazyLock;

use jsonschema::Validator;
use serde_json::Value;

/// Connector Card `xagent.connector/v1`.
pub const CARD_SCHEMA_JSON: &str =
    include_str!("../../../proto-schemas/xagent.connector.v1.schema.json");
/// Connection Descriptor `xagent.connection/v2`.
pub const DESCRIPTOR_SCHEMA_JSON: &str =
    include_str!("../../../proto-schemas/xagent.connection.v2.schema.json");
/// Packet envelope `xagent.connector.packet/v1`.
pub const PACKET_SCHEMA_JSON: &str =
    include_str!("../../../proto-schemas/xagent.connector.packet.v1.schema.json");

static CARD: LazyLock<Validator> = LazyLock::new(|| compile(CARD_SCHEMA_JSON));
static DESCRIPTOR: LazyLock<Validator> = LazyLock::new(|| compile(DESCRIPTOR_SCHEMA_JSON));
static PACKET: LazyLock<Validator> = LazyLock::new(|| compile(PACKET_SCHEMA_JSON));

/// The schemas are compile-time constants covered by unit tests, so failing here is a build
/// defect, not a runtime condition.
fn compile(src: &str) -> Validator {
    let schema: Value = serde_json::from_str(src).expect("embedded schema is valid JSON");
    jsonschema::validator_for(&schema).expect("embedded schema compiles")
}

fn run(validator: &Validator, instance: &Value, prefix: &str) -> Vec<String> {
    validator
        .iter_errors(instance)
        .map(|e| {
            let path = format!("{prefix}{}", e.instance_path);
            let path = if path.is_empty() {
                "/".to_owned()
            } else {
                path
            };
            format!("{path}: {e}")
        })
        .collect()
}

fn result(errors: Vec<String>) -> Result<(), Vec<String>> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Validates a Connector Card against `xagent.connector/v1`.
pub fn validate_card(card: &Value) -> Result<(), Vec<String>> {
    result(run(&CARD, card, ""))
}

/// Validates a Connection Descriptor against `xagent.connection/v2`.
pub fn validate_descriptor(descriptor: &Value) -> Result<(), Vec<String>> {
    result(run(&DESCRIPTOR, descriptor, ""))
}

/// Validates a packet against the envelope schema and every `connection_descriptor` found
/// anywhere in its payload against the Descriptor schema.
pub fn validate_packet(packet: &Value) -> Result<(), Vec<String>> {
    let mut errors = run(&PACKET, packet, "");
    if let Some(payload) = packet.get("payload") {
        descriptors_in(payload, "/payload", &mut errors);
    }
    result(errors)
}

fn descriptors_in(value: &Value, path: &str, errors: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                let here = format!("{path}/{}", escape_pointer(key));
                if key == "connection_descriptor" {
                    errors.extend(run(&DESCRIPTOR, v, &here));
                } else {
                    descriptors_in(v, &here, errors);
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                descriptors_in(v, &format!("{path}/{i}"), errors);
            }
        }
        _ => {}
    }
}

fn escape_pointer(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Protocol §4.1, verbatim.
    fn spec_card() -> Value {
        json!({
          "schema": "xagent.connector/v1",
          "protocol_version": "3.0",
          "build": {"version": "0.0.7", "git_tag": "v0.0.7", "git_rev": "abc1234", "build_time": "2607241200"},
          "connector_card_id": "im.wechat",
          "connector": {
            "name": "WeChat Connector", "version": "0.0.1", "vendor": "Example",
            "description": "Bridge WeChat messages into xAgent."
          },
          "supports": {
            "user_channel_mode": "single",
            "target_types": ["im"],
            "targets": [{"target_type": "im", "provider": "wechat", "label": "WeChat"}],
            "profiles": ["xagent.im.v2"]
          },
          "tools": [{
            "tool_id": "wechat_message_send",
            "profile": "xagent.im.v2",
            "title": "Send a WeChat Message",
            "description": "Send text to the WeChat contact bound to the current channel.",
            "related_skill_ids": ["connector-im-wechat"],
            "input_schema": {
              "type": "object",
              "required": ["connector_channel_id", "text"],
              "properties": {
                "connector_channel_id": {
                  "type": "string",
                  "description": "Target user-level Connector channel ID. Pass the opaque ID returned by connector_channels_list or inbound source_connector_channel_id unchanged."
                },
                "text": {"type": "string", "description": "Text to send."}
              }
            },
            "output_schema": {"type": "object"}
          }],
          "auth_flows": [
            {"id": "wechat_qr_login", "target_type": "im", "type": "qr_login", "title": "Sign in to WeChat with a QR Code"},
            {
              "id": "telegram_bot_binding", "target_type": "im", "type": "form", "title": "Bind a Telegram Bot",
              "fields": [
                {"name": "bot_token", "label": "Bot Token", "input_type": "password", "required": true,
                 "placeholder": "123456:ABC-DEF...", "help_text": "Create a bot with BotFather and enter its token."},
                {"name": "chat_id", "label": "Chat ID", "input_type": "text", "required": true,
                 "placeholder": "For example, 123456789", "help_text": "Start a conversation with the bot, then enter the target chat_id."}
              ]
            }
          ],
          "ui": {"login_flow": {"flow_id": "wechat_qr_login", "steps": [
            {"type": "qr_code", "request_type": "auth.start", "response_type": "auth.start.ack"},
            {"type": "polling", "request_type": "auth.status", "response_type": "auth.status.ack"}
          ]}},
          "security": {"trust_level": "third_party", "api_key_required": true, "data_classes": ["message", "image"]}
        })
    }

    /// Protocol §9, verbatim.
    fn spec_descriptor() -> Value {
        json!({
          "schema": "xagent.connection/v2",
          "connection": {
            "connector_card_id": "im.wechat", "connector_id": "conn_im_wechat_xxx",
            "connector_channel_id": "cch_conn_im_wechat_xxx", "target_type": "im",
            "profiles": ["xagent.im.v2"], "status": "connected"
          },
          "target": {"provider": "wechat", "label": "WeChat", "display_name": "WeChat 0069***.bot", "account_hint": "0069***.bot"},
          "tools": [{"tool_id": "wechat_message_send", "status": "available", "target_permission_state": "granted"}]
        })
    }

    /// Protocol §8.4, verbatim.
    fn spec_open_ack() -> Value {
        json!({
          "schema": "xagent.connector.packet/v1",
          "packet_id": "pkt_2", "request_id": "req_1", "reply_to": "pkt_1",
          "connector_channel_id": "cch_123", "type": "channel.open.ack", "time": 1790000000000i64,
          "payload": {
            "connector_channel_id": "cch_123",
            "connection_descriptor": {
              "schema": "xagent.connection/v2",
              "connection": {
                "connector_card_id": "im.wechat", "connector_id": "conn_im_wechat_xxx",
                "connector_channel_id": "cch_123", "target_type": "im",
                "profiles": ["xagent.im.v2"], "status": "created"
              },
              "target": {"provider": "wechat", "label": "WeChat", "display_name": "WeChat not bound"}
            }
          }
        })
    }

    #[test]
    fn embedded_schemas_are_the_published_ones() {
        for src in [CARD_SCHEMA_JSON, DESCRIPTOR_SCHEMA_JSON, PACKET_SCHEMA_JSON] {
            let v: Value = serde_json::from_str(src).unwrap();
            assert_eq!(v["$schema"], "https://json-schema.org/draft/2020-12/schema");
        }
        LazyLock::force(&CARD);
        LazyLock::force(&DESCRIPTOR);
        LazyLock::force(&PACKET);
    }

    #[test]
    fn spec_card_validates() {
        assert_eq!(validate_card(&spec_card()), Ok(()));
    }

    #[test]
    fn card_without_build_fails() {
        let mut card = spec_card();
        card.as_object_mut().unwrap().remove("build");
        let errors = validate_card(&card).unwrap_err();
        assert!(errors.iter().any(|e| e.contains("build")), "{errors:?}");
    }

    #[test]
    fn card_with_bad_tool_id_fails() {
        let mut card = spec_card();
        card["tools"][0]["tool_id"] = json!("send message");
        let errors = validate_card(&card).unwrap_err();
        assert!(
            errors.iter().any(|e| e.starts_with("/tools/0/tool_id")),
            "{errors:?}"
        );
        card["tools"][0]["tool_id"] = json!("x".repeat(257));
        assert!(validate_card(&card).is_err());
    }

    #[test]
    fn card_tool_without_channel_argument_fails() {
        let mut card = spec_card();
        card["tools"][0]["input_schema"]["required"] = json!(["text"]);
        assert!(validate_card(&card).is_err());
    }

    #[test]
    fn spec_descriptor_validates() {
        assert_eq!(validate_descriptor(&spec_descriptor()), Ok(()));
    }

    #[test]
    fn descriptor_with_unknown_status_fails() {
        let mut d = spec_descriptor();
        d["connection"]["status"] = json!("online");
        let errors = validate_descriptor(&d).unwrap_err();
        assert!(
            errors.iter().any(|e| e.starts_with("/connection/status")),
            "{errors:?}"
        );
    }

    #[test]
    fn spec_packets_validate() {
        assert_eq!(validate_packet(&spec_open_ack()), Ok(()));
        let error = json!({
          "schema": "xagent.connector.packet/v1", "packet_id": "pkt_error", "request_id": "req_123",
          "connector_channel_id": "cch_123", "type": "error", "time": 1790000000000i64,
          "error": {"code": "channel_not_open", "message": "channel.open must complete before auth.start"}
        });
        assert_eq!(validate_packet(&error), Ok(()));
        let ack = json!({
          "schema": "xagent.connector.packet/v1", "packet_id": "pkt_ack_1", "reply_to": "pkt_message_1",
          "connector_channel_id": "cch_123", "type": "chat.message.ack", "time": 1790000000002i64,
          "payload": {"message_id": "msg_1", "status": "rejected", "code": "target_delivery_failed",
                      "message": "target platform rejected the message", "retryable": false}
        });
        assert_eq!(validate_packet(&ack), Ok(()));
    }

    #[test]
    fn envelope_without_packet_id_fails() {
        let mut p = spec_open_ack();
        p.as_object_mut().unwrap().remove("packet_id");
        let errors = validate_packet(&p).unwrap_err();
        assert!(errors.iter().any(|e| e.contains("packet_id")), "{errors:?}");
    }

    #[test]
    fn envelope_field_types_are_checked() {
        for (field, bad) in [
            ("schema", json!("xagent.connector.packet/v2")),
            ("packet_id", json!("")),
            ("type", json!("")),
            ("time", json!(-1)),
            ("payload", json!([1])),
            ("error", json!({"message": "no code"})),
        ] {
            let mut p = spec_open_ack();
            p[field] = bad;
            assert!(validate_packet(&p).is_err(), "{field} should be rejected");
        }
    }

    #[test]
    fn nested_descriptor_is_checked() {
        let mut p = spec_open_ack();
        p["payload"]["connection_descriptor"]["target"]
            .as_object_mut()
            .unwrap()
            .remove("provider");
        let errors = validate_packet(&p).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("/payload/connection_descriptor/target"),
            "{errors:?}"
        );

        let deep = json!({
          "schema": "xagent.connector.packet/v1", "packet_id": "p", "type": "x",
          "payload": {"items": [{"connection_descriptor": {"schema": "xagent.connection/v2"}}]}
        });
        let errors = validate_packet(&deep).unwrap_err();
        assert!(
            errors
                .iter()
                .all(|e| e.starts_with("/payload/items/0/connection_descriptor")),
            "{errors:?}"
        );
    }
}
