//! Setting value types: durations (`30s`), secret lists and address-range lists, each
//! written as a string or a list in files and in `SWITCHYARD_*` variables.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use switchyard_core::crypto::Secret;
use switchyard_core::netguard::Cidr;

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

/// A comma-separated list of secrets (first signs/encrypts, all verify/decrypt).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretList(pub Vec<Secret>);

impl Serialize for SecretList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Never print secrets, not even in print-default-config.
        s.serialize_str(if self.0.is_empty() { "" } else { "<redacted>" })
    }
}

impl<'de> Deserialize<'de> for SecretList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            L(Vec<String>),
        }
        let items = match Raw::deserialize(d)? {
            Raw::S(s) => s
                .split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .map(Secret::new)
                .collect(),
            Raw::L(l) => l
                .into_iter()
                .filter(|x| !x.is_empty())
                .map(Secret::new)
                .collect(),
        };
        Ok(SecretList(items))
    }
}

/// Comma-separated address ranges (`127.0.0.0/8,::1/128`), or a TOML array of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CidrList(pub Vec<Cidr>);

impl Serialize for CidrList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let joined: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        s.serialize_str(&joined.join(","))
    }
}

impl<'de> Deserialize<'de> for CidrList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            L(Vec<String>),
        }
        let items: Vec<String> = match Raw::deserialize(d)? {
            Raw::S(s) => s.split(',').map(str::to_owned).collect(),
            Raw::L(l) => l,
        };
        items
            .iter()
            .map(|x| x.trim())
            .filter(|x| !x.is_empty())
            .map(|x| x.parse::<Cidr>().map_err(serde::de::Error::custom))
            .collect::<Result<_, _>>()
            .map(CidrList)
    }
}
