//! Setting value types: durations (`30s`), secret lists and address-range lists, each
//! written as a string or a list in files and in `SWITCHYARD_*` variables.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use switchyard_core::crypto::Secret;
use switchyard_core::netguard::Cidr;

pub use switchyard_core::settings::{Dur, parse_duration};

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
