//! The credentials of a bound channel and the names derived from them. The token appears
//! only inside [`Secret`] and in request URLs, which are never logged.

use serde_json::{Value, json};
use switchyard_core::crypto::{Secret, sha256_hex};
use switchyard_protocol::descriptor::TargetView;

pub(crate) const FIELD_TOKEN: &str = "bot_token";
pub(crate) const FIELD_CHAT: &str = "chat_id";
const FIELD_MIGRATED_FROM: &str = "migrated_from_chat_id";

#[derive(Clone)]
pub(crate) struct Credentials {
    pub token: Secret,
    pub bot_id: i64,
    pub bot_username: String,
    pub chat_id: i64,
    pub chat_type: String,
    /// The group's former id, once Telegram upgraded it to a supergroup (the new `chat_id`).
    pub migrated_from: Option<i64>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("bot_id", &self.bot_id)
            .field("chat", &mask_chat(self.chat_id))
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// From stored credentials; None when they are not ours.
    pub fn from_stored(v: &Value) -> Option<Self> {
        let token = v.get(FIELD_TOKEN)?.as_str().filter(|t| token_shape_ok(t))?;
        Some(Self {
            token: Secret::new(token),
            bot_id: v.get("bot_id")?.as_i64()?,
            bot_username: v
                .get("bot_username")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            chat_id: v.get(FIELD_CHAT)?.as_i64()?,
            chat_type: v
                .get("chat_type")
                .and_then(Value::as_str)
                .unwrap_or("private")
                .to_owned(),
            migrated_from: v.get(FIELD_MIGRATED_FROM).and_then(Value::as_i64),
        })
    }

    pub fn to_stored(&self) -> Value {
        let mut v = json!({
            FIELD_TOKEN: self.token.expose(),
            "bot_id": self.bot_id,
            "bot_username": self.bot_username,
            FIELD_CHAT: self.chat_id,
            "chat_type": self.chat_type,
        });
        if let Some(from) = self.migrated_from {
            v[FIELD_MIGRATED_FROM] = json!(from);
        }
        v
    }

    /// The same binding after Telegram upgraded its group to the supergroup `to`.
    pub fn moved_to(&self, to: i64) -> Self {
        Self {
            chat_id: to,
            chat_type: "supergroup".into(),
            migrated_from: Some(self.chat_id),
            ..self.clone()
        }
    }

    pub fn bot_key(&self) -> String {
        bot_key(self.bot_id)
    }

    pub fn is_group(&self) -> bool {
        matches!(self.chat_type.as_str(), "group" | "supergroup" | "channel")
    }

    /// What the Descriptor shows: the bot's `@username` and the chat masked to its last digits.
    pub fn view(&self) -> TargetView {
        let kind = match self.chat_type.as_str() {
            "private" => "private chat",
            "group" | "supergroup" => "group",
            "channel" => "channel",
            _ => "chat",
        };
        let moved = self
            .migrated_from
            .map(|from| format!(" (upgraded to a supergroup from group {})", mask_chat(from)))
            .unwrap_or_default();
        TargetView {
            display_name: format!("@{}", self.bot_username),
            account_hint: Some(format!("{kind} {}{moved}", mask_chat(self.chat_id))),
        }
    }
}

/// Public name of a bot in routes, lease and cursor keys: a hash of its id, never the token.
pub(crate) fn bot_key(bot_id: i64) -> String {
    sha256_hex(format!("telegram-bot:{bot_id}").as_bytes())[..32].to_owned()
}

/// Uniqueness of a binding within a tenant: one channel per bot and chat.
pub(crate) fn binding_key(bot_id: i64, chat_id: i64) -> String {
    sha256_hex(format!("{bot_id}:{chat_id}").as_bytes())
}

/// The `secret_token` registered with `setWebhook`. Derived from the token, so every pod and
/// every channel of a bot agree on it without storing it, and only the token's holder knows it.
pub(crate) fn webhook_secret(token: &Secret) -> String {
    sha256_hex(format!("switchyard.telegram.webhook:{}", token.expose()).as_bytes())
}

/// Stable, non-reversible name of a token (revocation marks, change detection).
pub(crate) fn token_fingerprint(token: &Secret) -> String {
    sha256_hex(format!("switchyard.telegram.token:{}", token.expose()).as_bytes())[..32].to_owned()
}

/// `…1234`: enough to tell chats apart, not enough to address one.
pub(crate) fn mask_chat(chat_id: i64) -> String {
    let digits = chat_id.unsigned_abs().to_string();
    let tail = &digits[digits.len().saturating_sub(4)..];
    format!("…{tail}")
}

/// `<digits>:<token chars>`: the token becomes a URL path segment, so nothing else may pass.
pub(crate) fn token_shape_ok(token: &str) -> bool {
    let Some((id, rest)) = token.split_once(':') else {
        return false;
    };
    !id.is_empty()
        && id.len() <= 20
        && id.bytes().all(|b| b.is_ascii_digit())
        && (8..=128).contains(&rest.len())
        && rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The `chat_id` input as Telegram takes it: an integer or a public `@username`.
pub(crate) fn parse_chat_input(raw: &str) -> Result<Value, &'static str> {
    let raw = raw.trim();
    if let Ok(id) = raw.parse::<i64>() {
        if id == 0 {
            return Err("chat_id must not be 0");
        }
        return Ok(json!(id));
    }
    if let Some(name) = raw.strip_prefix('@')
        && (4..=32).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Ok(json!(raw));
    }
    Err("chat_id must be a numeric chat id or a public @username")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        assert!(token_shape_ok("123456:ABC-DEF1234ghIkl-zyx57W2v1u123ew11"));
        for bad in [
            "",
            "abc",
            "123456:",
            ":abcdefghij",
            "12a:abcdefghij",
            "1:abc/def?ghijk",
            "1:abcdefgh#ijk",
            "1:abcdefghij k",
        ] {
            assert!(!token_shape_ok(bad), "{bad}");
        }
        assert_eq!(parse_chat_input(" -100123 ").unwrap(), json!(-100123));
        assert_eq!(parse_chat_input("@ops_chat").unwrap(), json!("@ops_chat"));
        assert!(parse_chat_input("@a/b").is_err());
        assert!(parse_chat_input("0").is_err());
        assert_eq!(mask_chat(-1001234567890), "…7890");
        assert_eq!(mask_chat(42), "…42");
    }

    #[test]
    fn derived_names_never_contain_the_token() {
        let c = Credentials {
            token: Secret::new("123456:ABC-DEF1234ghIkl-zyx57W2v1u123ew11"),
            bot_id: 123456,
            bot_username: "demo_bot".into(),
            chat_id: -1001234567890,
            chat_type: "supergroup".into(),
            migrated_from: None,
        };
        let debug = format!("{c:?}");
        assert!(!debug.contains("ABC-DEF"));
        let v = c.view();
        assert_eq!(v.display_name, "@demo_bot");
        assert_eq!(v.account_hint.as_deref(), Some("group …7890"));
        assert!(!bot_key(123456).contains("123456"));
        assert_eq!(webhook_secret(&c.token).len(), 64);
        let back = Credentials::from_stored(&c.to_stored()).unwrap();
        assert_eq!(back.chat_id, c.chat_id);
        assert!(back.is_group());
        let moved = Credentials::from_stored(&c.moved_to(-1009999000011).to_stored()).unwrap();
        assert_eq!(
            (moved.chat_id, moved.migrated_from),
            (-1009999000011, Some(-1001234567890))
        );
        assert_eq!(
            moved.view().account_hint.as_deref(),
            Some("group …0011 (upgraded to a supergroup from group …7890)")
        );
    }
}
