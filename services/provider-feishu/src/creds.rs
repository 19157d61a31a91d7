//! The credentials of a bound channel and the names derived from them. The app secret, the
//! verification token and the encrypt key live only inside [`Secret`] and the encrypted binding.

use serde_json::{Value, json};
use switchyard_core::crypto::{Secret, sha256_hex};
use switchyard_protocol::descriptor::TargetView;

pub(crate) const FIELD_APP_ID: &str = "app_id";
pub(crate) const FIELD_APP_SECRET: &str = "app_secret";
pub(crate) const FIELD_DOMAIN: &str = "domain";
pub(crate) const FIELD_VERIFICATION_TOKEN: &str = "verification_token";
pub(crate) const FIELD_ENCRYPT_KEY: &str = "encrypt_key";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Domain {
    Feishu,
    Lark,
}

impl Domain {
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "feishu" => Some(Self::Feishu),
            "lark" | "larksuite" => Some(Self::Lark),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Feishu => "feishu",
            Self::Lark => "lark",
        }
    }
}

#[derive(Clone)]
pub(crate) struct Credentials {
    pub app_id: String,
    pub app_secret: Secret,
    pub domain: Domain,
    pub verification_token: Option<Secret>,
    pub encrypt_key: Option<Secret>,
    pub bot_name: String,
    pub bot_open_id: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("app_id", &self.app_id)
            .field("domain", &self.domain)
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

impl Credentials {
    /// From stored credentials; None when they are not ours.
    pub fn from_stored(v: &Value) -> Option<Self> {
        let app_id = v.get(FIELD_APP_ID)?.as_str().filter(|a| app_id_ok(a))?;
        let secret = v
            .get(FIELD_APP_SECRET)?
            .as_str()
            .filter(|s| !s.is_empty())?;
        Some(Self {
            app_id: app_id.to_owned(),
            app_secret: Secret::new(secret),
            domain: Domain::parse(v.get(FIELD_DOMAIN).and_then(Value::as_str).unwrap_or(""))?,
            verification_token: opt_secret(v, FIELD_VERIFICATION_TOKEN),
            encrypt_key: opt_secret(v, FIELD_ENCRYPT_KEY),
            bot_name: v
                .get("bot_name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            bot_open_id: v
                .get("bot_open_id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        })
    }

    pub fn to_stored(&self) -> Value {
        json!({
            FIELD_APP_ID: self.app_id,
            FIELD_APP_SECRET: self.app_secret.expose(),
            FIELD_DOMAIN: self.domain.as_str(),
            FIELD_VERIFICATION_TOKEN: self.verification_token.as_ref().map(Secret::expose),
            FIELD_ENCRYPT_KEY: self.encrypt_key.as_ref().map(Secret::expose),
            "bot_name": self.bot_name,
            "bot_open_id": self.bot_open_id,
        })
    }

    pub fn app_key(&self) -> String {
        app_key(self.domain, &self.app_id)
    }

    /// Events come by HTTP when the binding carries a verification token or an encrypt key;
    /// otherwise over the long connection.
    pub fn http_events(&self) -> bool {
        self.verification_token.is_some() || self.encrypt_key.is_some()
    }

    /// What the Descriptor shows: the bot's name and the app id masked to its tail.
    pub fn view(&self) -> TargetView {
        let name = if self.bot_name.is_empty() {
            "Feishu bot".to_owned()
        } else {
            self.bot_name.clone()
        };
        let tail = &self.app_id[self.app_id.len().saturating_sub(4)..];
        let brand = match self.domain {
            Domain::Feishu => "Feishu",
            Domain::Lark => "Lark",
        };
        TargetView {
            display_name: name,
            account_hint: Some(format!("{brand} app …{tail}")),
        }
    }
}

/// Public name of an app in lease, cache and key/value keys: a hash, never the secret.
pub(crate) fn app_key(domain: Domain, app_id: &str) -> String {
    sha256_hex(format!("feishu-app:{}:{app_id}", domain.as_str()).as_bytes())[..32].to_owned()
}

/// Uniqueness of a binding within a tenant: one channel per app.
pub(crate) fn binding_key(domain: Domain, app_id: &str) -> String {
    sha256_hex(format!("feishu-binding:{}:{app_id}", domain.as_str()).as_bytes())
}

/// `cli_` followed by letters and digits, as the Open Platform issues them.
pub(crate) fn app_id_ok(app_id: &str) -> bool {
    (5..=64).contains(&app_id.len())
        && app_id.starts_with("cli_")
        && app_id[4..].bytes().all(|b| b.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_round_trip_and_no_secret_in_debug_or_view() {
        let c = Credentials {
            app_id: "cli_a1b2c3d4e5".into(),
            app_secret: Secret::new("SuperSecretValue1234"),
            domain: Domain::Lark,
            verification_token: Some(Secret::new("VerifTok")),
            encrypt_key: None,
            bot_name: "Helper".into(),
            bot_open_id: "ou_x".into(),
        };
        let back = Credentials::from_stored(&c.to_stored()).unwrap();
        assert_eq!(back.app_id, c.app_id);
        assert_eq!(back.domain, Domain::Lark);
        assert!(back.http_events());
        assert!(back.encrypt_key.is_none());
        let dbg = format!("{back:?}");
        assert!(!dbg.contains("SuperSecret") && !dbg.contains("VerifTok"));
        let v = back.view();
        assert_eq!(v.display_name, "Helper");
        assert_eq!(v.account_hint.as_deref(), Some("Lark app …d4e5"));
        assert_ne!(
            app_key(Domain::Feishu, "cli_a"),
            app_key(Domain::Lark, "cli_a")
        );
        assert!(app_id_ok("cli_a1b2"));
        assert!(!app_id_ok("cli_a/b"));
        assert!(!app_id_ok("xyz_abc"));
    }
}
