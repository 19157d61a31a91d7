//! The credentials of a bound webhook channel and the one validation both the form flow and
//! the pairing page use.

use serde_json::{Map, Value, json};
use switchyard_core::crypto::Secret;
use switchyard_core::limits;
use switchyard_core::netguard::OutboundPolicy;
use switchyard_core::provider::AuthStep;
use switchyard_protocol::descriptor::TargetView;
use url::Url;

pub(crate) const FIELD_ENDPOINT: &str = "endpoint_url";
pub(crate) const FIELD_SECRET: &str = "signing_secret";

const MIN_SECRET_CHARS: usize = 16;
const MAX_SECRET_BYTES: usize = 1024;
const MAX_URL_BYTES: usize = 2048;

pub(crate) struct Credentials {
    pub endpoint: Url,
    pub secret: Secret,
}

impl Credentials {
    /// Validates user input. Error texts are fixed: they never echo the secret, nor the URL
    /// (whose path or query may hold a token of the chat system).
    pub fn parse(
        endpoint_url: Option<&str>,
        signing_secret: Option<&str>,
    ) -> Result<Self, &'static str> {
        let raw = endpoint_url
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .ok_or("endpoint_url is required")?;
        if raw.len() > MAX_URL_BYTES {
            return Err("endpoint_url is longer than 2048 bytes");
        }
        let endpoint =
            Url::parse(raw).map_err(|_| "endpoint_url must be an absolute http or https URL")?;
        if !matches!(endpoint.scheme(), "http" | "https")
            || endpoint.host_str().is_none_or(str::is_empty)
        {
            return Err("endpoint_url must be an absolute http or https URL with a host");
        }
        if !endpoint.username().is_empty() || endpoint.password().is_some() {
            return Err("endpoint_url must not contain user credentials");
        }
        if endpoint.fragment().is_some() {
            return Err("endpoint_url must not contain a fragment");
        }
        let secret = signing_secret
            .filter(|s| !s.is_empty())
            .ok_or("signing_secret is required")?;
        if secret.chars().count() < MIN_SECRET_CHARS {
            return Err("signing_secret must be at least 16 characters");
        }
        if secret.len() > MAX_SECRET_BYTES {
            return Err("signing_secret is longer than 1024 bytes");
        }
        Ok(Self {
            endpoint,
            secret: Secret::new(secret),
        })
    }

    /// A new binding's endpoint must not name an internal address (SSRF) unless the operator
    /// allowed its range; names are checked again on every connection, once resolved.
    pub fn check_endpoint(&self, policy: &OutboundPolicy) -> Result<(), &'static str> {
        policy.check_url(&self.endpoint).map_err(|_| {
            limits::hit("outbound_private_address");
            "endpoint_url points to a loopback, private, link-local or otherwise internal address; the operator can allow its range with outbound.allow_private"
        })
    }

    /// Parses submitted fields and checks the endpoint against the outbound policy.
    pub fn from_new_input(
        input: &Map<String, Value>,
        policy: &OutboundPolicy,
    ) -> Result<Self, &'static str> {
        let creds = Self::from_input(input)?;
        creds.check_endpoint(policy)?;
        Ok(creds)
    }

    /// From submitted fields; a field of the wrong JSON type counts as missing.
    pub fn from_input(input: &Map<String, Value>) -> Result<Self, &'static str> {
        Self::parse(
            input.get(FIELD_ENDPOINT).and_then(Value::as_str),
            input.get(FIELD_SECRET).and_then(Value::as_str),
        )
    }

    /// From stored credentials; None when they are not ours or were tampered with.
    pub fn from_stored(credentials: &Value) -> Option<Self> {
        credentials
            .as_object()
            .and_then(|m| Self::from_input(m).ok())
    }

    pub fn to_stored(&self) -> Value {
        json!({ FIELD_ENDPOINT: self.endpoint.as_str(), FIELD_SECRET: self.secret.expose() })
    }

    /// Only the host is shown: the path and query may carry tokens of the chat system.
    pub fn view(&self) -> TargetView {
        let host = self.endpoint.host_str().unwrap_or_default().to_owned();
        TargetView {
            display_name: format!("Webhook {host}"),
            account_hint: Some(host),
        }
    }

    pub fn into_step(self) -> AuthStep {
        AuthStep::Authenticated {
            credentials: self.to_stored(),
            view: self.view(),
            binding_key: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "0123456789abcdef";

    #[test]
    fn accepts_and_normalizes() {
        let c = Credentials::parse(
            Some(" https://chat.example.com:8443/hooks/x?token=abc "),
            Some(GOOD),
        )
        .unwrap();
        assert_eq!(
            c.endpoint.as_str(),
            "https://chat.example.com:8443/hooks/x?token=abc"
        );
        let v = c.view();
        assert_eq!(v.display_name, "Webhook chat.example.com");
        assert_eq!(v.account_hint.as_deref(), Some("chat.example.com"));
        let back = Credentials::from_stored(&c.to_stored()).unwrap();
        assert_eq!(back.secret.expose(), GOOD);
    }

    #[test]
    fn refuses_bad_urls_and_secrets() {
        for url in [
            "",
            "chat.example.com/hook",
            "/hook",
            "ftp://chat.example.com/hook",
            "https://user:pw@chat.example.com/hook",
            "https://user@chat.example.com/hook",
            "https://chat.example.com/hook#frag",
            "mailto:a@b.c",
            "http://",
        ] {
            assert!(Credentials::parse(Some(url), Some(GOOD)).is_err(), "{url}");
        }
        assert!(Credentials::parse(Some("http://h/x"), Some("short")).is_err());
        assert!(Credentials::parse(Some("http://h/x"), None).is_err());
        assert!(Credentials::parse(Some("http://h/x"), Some(&"x".repeat(2000))).is_err());
        // Internal endpoints are refused unless their range is allowed.
        let strict = OutboundPolicy::default();
        let local = OutboundPolicy::new(vec!["127.0.0.0/8".parse().unwrap()]);
        for url in [
            "http://127.0.0.1:9/x",
            "http://0.0.0.0/x",
            "http://2130706433/x",
            "http://[::1]/x",
            "http://169.254.169.254/latest/meta-data/",
            "http://localhost:8080/x",
        ] {
            let input =
                serde_json::from_value(json!({"endpoint_url": url, "signing_secret": GOOD}))
                    .unwrap();
            let err = Credentials::from_new_input(&input, &strict).err();
            assert!(
                err.is_some_and(|m| m.contains("outbound.allow_private")),
                "{url}"
            );
        }
        let input = serde_json::from_value(
            json!({"endpoint_url": "http://127.0.0.1:9/x", "signing_secret": GOOD}),
        )
        .unwrap();
        assert!(Credentials::from_new_input(&input, &local).is_ok());
        let input = serde_json::from_value(
            json!({"endpoint_url": "https://chat.example.com/x", "signing_secret": GOOD}),
        )
        .unwrap();
        assert!(Credentials::from_new_input(&input, &strict).is_ok());
        // 16 characters, more bytes: counted in characters.
        assert!(Credentials::parse(Some("http://h/x"), Some("ééééééééééééééé1")).is_ok());
    }
}
