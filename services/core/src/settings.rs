//! What a provider is configured with: the duration value of settings files (`30s`), the
//! settings every provider shares (build, public URL, ingress bounds, outbound policy) and the
//! factory a provider crate exposes so that it owns its configuration section
//! ([`ProviderFactory`]).

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use switchyard_protocol::BuildInfo;

use crate::netguard::OutboundPolicy;
use crate::provider::{Provider, ProviderServices};

/// A duration written `500ms`, `30s`, `5m`, `1h` (or a bare number of seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let d = match unit.trim() {
        "" | "s" => Duration::from_secs(n),
        "ms" => Duration::from_millis(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        "d" => Duration::from_secs(n * 86_400),
        _ => return None,
    };
    Some(d)
}

impl Dur {
    fn render(&self) -> String {
        let ms = self.0.as_millis();
        if ms > 0 && ms.is_multiple_of(3_600_000) {
            format!("{}h", ms / 3_600_000)
        } else if ms > 0 && ms.is_multiple_of(60_000) {
            format!("{}m", ms / 60_000)
        } else if ms.is_multiple_of(1000) {
            format!("{}s", ms / 1000)
        } else {
            format!("{ms}ms")
        }
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.render())
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            N(u64),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(Dur(Duration::from_secs(n))),
            Raw::S(s) => parse_duration(&s).map(Dur).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "invalid duration {s:?}; use 500ms, 30s, 5m or 1h"
                ))
            }),
        }
    }
}

/// What unauthenticated callers of a provider's ingress (webhooks, event callbacks) may make
/// a pod hold: the deployment's `[ingress]` section, the same for every provider.
#[derive(Debug, Clone, PartialEq)]
pub struct IngressBounds {
    /// Largest JSON body, held until verified.
    pub max_json_bytes: u64,
    /// Time allowed to receive a body.
    pub body_timeout: Duration,
    /// After this much of `body_timeout`, a body must have arrived at `min_body_rate`.
    pub body_grace: Duration,
    /// Slowest average a body may arrive at after `body_grace`, in bytes a second.
    pub min_body_rate: u64,
    /// Requests in flight per pod and provider (503 beyond).
    pub max_concurrent: usize,
    /// Requests in flight per tenant (429 beyond).
    pub max_concurrent_per_tenant: usize,
    /// Requests in flight per channel (429 beyond).
    pub max_concurrent_per_channel: usize,
}

/// The settings every provider is built with besides its own section.
#[derive(Debug, Clone)]
pub struct SharedSettings {
    pub build: BuildInfo,
    /// The deployment's public URL (`public_base_url`), when configured.
    pub public_base_url: Option<String>,
    pub ingress: IngressBounds,
    /// Requests to URLs a tenant supplied.
    pub outbound: OutboundPolicy,
    /// Largest inbound message or file a provider accepts (`limits.max_inbound_bytes`).
    pub max_inbound_bytes: u64,
}

/// A provider crate's entry in the edge's one list of providers: its configuration section
/// (serde with `#[serde(default, deny_unknown_fields)]`, defaults, validation and its
/// documented lines of `print-default-config`) and how the provider is built from it.
///
/// The edge reads `[SECTION]` from the settings file and `SWITCHYARD_<SECTION>__<KEY>`
/// variables, refuses unknown keys naming them, makes the services of Card [`CARD_ID`]
/// mounted under [`PREFIX`], and calls [`ProviderFactory::build`] once with them.
///
/// [`CARD_ID`]: ProviderFactory::CARD_ID
/// [`PREFIX`]: ProviderFactory::PREFIX
pub trait ProviderFactory: Send + Sync + 'static {
    /// The section's settings.
    type Section: Serialize
        + DeserializeOwned
        + Default
        + Clone
        + PartialEq
        + Debug
        + Send
        + Sync
        + 'static;
    /// The section's name (`slack` for `[slack]` and `SWITCHYARD_SLACK__*`).
    const SECTION: &'static str;
    /// The `connector_card_id` of the provider's Card (`im.slack`); its services are this
    /// Card's.
    const CARD_ID: &'static str;
    /// The provider's mount prefix (`/slack`), as [`Provider::prefix`] answers.
    const PREFIX: &'static str;
    /// The section as `print-default-config` prints it: `[SECTION]`, then each key with a
    /// comment, every value the default. Each provider's tests check it parses to
    /// `Section::default()`.
    const DEFAULT_TOML: &'static str;

    /// Checks a loaded section; the message names the key (`slack.api_base must be ...`).
    fn validate(_section: &Self::Section) -> Result<(), String> {
        Ok(())
    }

    /// The provider, holding `services` (made for [`Self::CARD_ID`]) from its first moment.
    fn build(
        section: &Self::Section,
        shared: &SharedSettings,
        services: Arc<dyn ProviderServices>,
    ) -> Arc<dyn Provider>;

    /// Describes and registers the provider's metric families at zero, once at start.
    fn describe_metrics() {}
}

/// `Ok` when `value` is an absolute http(s) URL, else the message `{key} must be an http(s)
/// URL`.
pub fn check_http_url(key: &str, value: &str) -> Result<(), String> {
    if url::Url::parse(value).is_ok_and(|u| matches!(u.scheme(), "http" | "https")) {
        Ok(())
    } else {
        Err(format!("{key} must be an http(s) URL"))
    }
}

#[cfg(test)]
mod tests {
    use super::{Dur, check_http_url, parse_duration};
    use std::time::Duration;

    #[test]
    fn durations_round_trip() {
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1x"), None);
        let d: Dur = serde_json::from_str("\"600s\"").unwrap();
        assert_eq!(d, Dur(Duration::from_secs(600)));
        assert_eq!(serde_json::to_string(&d).unwrap(), "\"10m\"");
    }

    #[test]
    fn http_urls_only() {
        assert!(check_http_url("x.api_base", "https://slack.com/api").is_ok());
        let e = check_http_url("x.api_base", "ftp://h").unwrap_err();
        assert_eq!(e, "x.api_base must be an http(s) URL");
        assert!(check_http_url("x.api_base", "nope").is_err());
    }
}
