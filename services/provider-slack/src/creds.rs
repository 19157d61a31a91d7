//! The credentials of a bound channel and the names derived from them. The bot token, the
//! app-level token and the signing secret live only inside [`Secret`] and the encrypted
//! binding.

use serde_json::{Value, json};
use switchyard_core::crypto::{Secret, sha256_hex};
use switchyard_protocol::descriptor::TargetView;

pub(crate) const FIELD_BOT_TOKEN: &str = "bot_token";
pub(crate) const FIELD_APP_TOKEN: &str = "app_token";
pub(crate) const FIELD_SIGNING_SECRET: &str = "signing_secret";

#[derive(Clone)]
pub(crate) struct Credentials {
    pub bot_token: Secret,
    pub app_token: Option<Secret>,
    pub signing_secret: Option<Secret>,
    pub team_id: String,
    pub team_name: String,
    pub bot_user_id: String,
    pub bot_id: String,
    pub bot_name: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("team_id", &self.team_id)
            .field("bot_user_id", &self.bot_user_id)
            .finish_non_exhaustive()
    }
}

fn opt_secret(v: &Value, k: &str) -> Option<Secret> {
    v.get(k)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(Secret::new)
}

fn s(v: &Value, k: &str) -> String {
    v.get(k)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// A token of the given kind: its prefix, then printable ASCII without spaces, bounded.
pub(crate) fn token_ok(token: &str, prefix: &str) -> bool {
    token.starts_with(prefix)
        && token.len() > prefix.len() + 4
        && token.len() <= 512
        && token.bytes().all(|b| b.is_ascii_graphic())
}

impl Credentials {
    /// From stored credentials; None when they are not ours.
    pub fn from_stored(v: &Value) -> Option<Self> {
        let bot = v
            .get(FIELD_BOT_TOKEN)?
            .as_str()
            .filter(|t| token_ok(t, "xoxb-"))?;
        Some(Self {
            bot_token: Secret::new(bot),
            app_token: opt_secret(v, FIELD_APP_TOKEN),
            signing_secret: opt_secret(v, FIELD_SIGNING_SECRET),
            team_id: s(v, "team_id"),
            team_name: s(v, "team_name"),
            bot_user_id: s(v, "bot_user_id"),
            bot_id: s(v, "bot_id"),
            bot_name: s(v, "bot_name"),
        })
    }

    pub fn to_stored(&self) -> Value {
        json!({
            FIELD_BOT_TOKEN: self.bot_token.expose(),
            FIELD_APP_TOKEN: self.app_token.as_ref().map(Secret::expose),
            FIELD_SIGNING_SECRET: self.signing_secret.as_ref().map(Secret::expose),
            "team_id": self.team_id,
            "team_name": self.team_name,
            "bot_user_id": self.bot_user_id,
            "bot_id": self.bot_id,
            "bot_name": self.bot_name,
        })
    }

    /// The Socket Mode consumer's key: one connection per Slack app in the deployment. An
    /// app-level token `xapp-1-A0123-...` names its app; otherwise its hash stands for it.
    pub fn app_key(&self) -> Option<String> {
        let token = self.app_token.as_ref()?.expose();
        let app = token
            .strip_prefix("xapp-")
            .and_then(|r| r.split('-').nth(1))
            .filter(|a| a.starts_with('A') && a.len() <= 32)
            .map(str::to_owned)
            .unwrap_or_else(|| sha256_hex(token.as_bytes()));
        Some(sha256_hex(format!("slack-app:{app}").as_bytes())[..32].to_owned())
    }

    /// Changes when a token changes (revocation marks, consumer restarts).
    pub fn fingerprint(&self) -> String {
        sha256_hex(
            format!(
                "switchyard.slack:{}:{}:{}",
                self.bot_token.expose(),
                self.app_token.as_ref().map(Secret::expose).unwrap_or(""),
                self.signing_secret
                    .as_ref()
                    .map(Secret::expose)
                    .unwrap_or("")
            )
            .as_bytes(),
        )[..32]
            .to_owned()
    }

    /// What the Descriptor shows: the bot's name and the workspace.
    pub fn view(&self) -> TargetView {
        let name = if self.bot_name.is_empty() {
            "Slack bot".to_owned()
        } else {
            self.bot_name.clone()
        };
        let team = if self.team_name.is_empty() {
            self.team_id.clone()
        } else {
            self.team_name.clone()
        };
        TargetView {
            display_name: name,
            account_hint: Some(format!("Slack workspace {team}")),
        }
    }
}

/// Uniqueness of a binding within a tenant: one channel per bot of a workspace.
pub(crate) fn binding_key(team_id: &str, bot_user_id: &str) -> String {
    sha256_hex(format!("slack-binding:{team_id}:{bot_user_id}").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_round_trip_app_key_and_no_secret_in_debug_or_view() {
        let c = Credentials {
            bot_token: Secret::new("xoxb-1-SECRETBOT"),
            app_token: Some(Secret::new("xapp-1-A0APP1-99-SECRETAPP")),
            signing_secret: None,
            team_id: "T1".into(),
            team_name: "Acme".into(),
            bot_user_id: "U1".into(),
            bot_id: "B1".into(),
            bot_name: "helper".into(),
        };
        let back = Credentials::from_stored(&c.to_stored()).unwrap();
        assert_eq!(back.team_id, "T1");
        assert!(back.signing_secret.is_none());
        let dbg = format!("{back:?}{:?}", back.view());
        assert!(!dbg.contains("SECRET"), "{dbg}");
        // Another token of the same app is the same consumer.
        let mut other = back.clone();
        other.app_token = Some(Secret::new("xapp-1-A0APP1-100-OTHER"));
        assert_eq!(back.app_key(), other.app_key());
        assert!(Credentials::from_stored(&json!({"bot_token": "xoxp-user"})).is_none());
        assert!(token_ok("xapp-1-A1-2-abc", "xapp-"));
        assert!(!token_ok("xapp-1 A1", "xapp-"));
    }
}
