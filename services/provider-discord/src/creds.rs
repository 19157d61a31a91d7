//! The credentials of a bound channel and the names derived from them. The token appears
//! only inside [`Secret`] and in the `Authorization` header and Identify/Resume payloads,
//! which are never logged.

use serde_json::{Value, json};
use switchyard_core::crypto::{Secret, sha256_hex};
use switchyard_protocol::descriptor::TargetView;

pub(crate) const FIELD_TOKEN: &str = "bot_token";

#[derive(Clone)]
pub(crate) struct Credentials {
    pub token: Secret,
    /// The bot user's id (a snowflake).
    pub bot_id: String,
    pub bot_name: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("bot_key", &self.bot_key())
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// From stored credentials; None when they are not ours.
    pub fn from_stored(v: &Value) -> Option<Self> {
        let token = v.get(FIELD_TOKEN)?.as_str().filter(|t| token_shape_ok(t))?;
        Some(Self {
            token: Secret::new(token),
            bot_id: v
                .get("bot_id")?
                .as_str()
                .filter(|s| snowflake_ok(s))?
                .to_owned(),
            bot_name: v
                .get("bot_name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        })
    }

    pub fn to_stored(&self) -> Value {
        json!({FIELD_TOKEN: self.token.expose(), "bot_id": self.bot_id, "bot_name": self.bot_name})
    }

    pub fn bot_key(&self) -> String {
        bot_key(&self.bot_id)
    }

    /// What the Descriptor shows: the bot's name and a masked id.
    pub fn view(&self) -> TargetView {
        let tail = &self.bot_id[self.bot_id.len().saturating_sub(4)..];
        TargetView {
            display_name: self.bot_name.clone(),
            account_hint: Some(format!("Discord bot …{tail}")),
        }
    }

    /// Changes when the token changes (a re-bound bot restarts its Gateway session).
    pub fn fingerprint(&self) -> String {
        sha256_hex(format!("switchyard.discord.token:{}", self.token.expose()).as_bytes())[..32]
            .to_owned()
    }
}

/// Public name of a bot in lease and state keys: a hash of its id, never the token.
pub(crate) fn bot_key(bot_id: &str) -> String {
    sha256_hex(format!("discord-bot:{bot_id}").as_bytes())[..32].to_owned()
}

/// Uniqueness of a binding within a tenant: one channel per bot.
pub(crate) fn binding_key(bot_id: &str) -> String {
    sha256_hex(format!("discord:{bot_id}").as_bytes())
}

/// A Discord snowflake: 1 to 20 decimal digits.
pub(crate) fn snowflake_ok(s: &str) -> bool {
    (1..=20).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit())
}

/// Bot tokens are three base64url segments joined by dots; anything else (spaces, slashes,
/// a `Bot ` prefix left in) would end up in a header, so it is refused before any call.
pub(crate) fn token_shape_ok(token: &str) -> bool {
    (20..=200).contains(&token.len())
        && token.split('.').count() == 3
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "MTIzNDU2Nzg5MDEyMzQ1Njc4.GhIjKl.abcdefghijklmnopqrstuvwxyz0123456789";

    #[test]
    fn shapes_and_names() {
        assert!(token_shape_ok(TOKEN));
        for bad in [
            "",
            "abc",
            "Bot MTIz.a.b",
            "a.b",
            "aaaaaaaaaaaaaaaaaaaaaaaa/b.c",
            "x.y.z",
        ] {
            assert!(!token_shape_ok(bad), "{bad}");
        }
        assert!(snowflake_ok("1100000000000000001"));
        assert!(!snowflake_ok("12a") && !snowflake_ok(""));
        let c = Credentials {
            token: Secret::new(TOKEN),
            bot_id: "1100000000000000001".into(),
            bot_name: "helper".into(),
        };
        assert!(!format!("{c:?}").contains("GhIjKl"));
        assert_eq!(c.view().account_hint.as_deref(), Some("Discord bot …0001"));
        let back = Credentials::from_stored(&c.to_stored()).unwrap();
        assert_eq!(back.bot_id, c.bot_id);
        assert!(!c.bot_key().contains("1100000000000000001"));
        assert_ne!(c.fingerprint(), c.bot_key());
    }
}
