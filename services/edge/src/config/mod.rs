//! One typed configuration: defaults -> optional TOML file (`--config` or `SWITCHYARD_CONFIG`)
//! -> environment variables prefixed `SWITCHYARD_` with `__` between nested keys.

use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};
use switchyard_core::engine::EngineConfig;

mod providers;
mod sections;
mod values;

pub use providers::{LoadedSection, ProviderSections, SectionFactory, factory};
pub use sections::*;
pub use values::*;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub listen: String,
    pub metrics_listen: String,
    /// The admin listener: the console (`/console`) and the operator API (`/admin/v1`) on
    /// their own address, opened when operator tokens are configured; "" = they are served
    /// on the internal listener (`metrics_listen`).
    pub admin_listen: String,
    pub data_dir: PathBuf,
    pub database_url: Option<String>,
    pub database_schema: Option<String>,
    pub database_max_connections: u32,
    pub nats_url: Option<String>,
    pub nats_subject_prefix: String,
    pub redis_url: Option<String>,
    pub redis_key_prefix: String,
    pub s3: S3Config,
    pub pod_id: Option<String>,
    pub public_base_url: Option<String>,
    pub signing_keys: SecretList,
    pub encryption_keys: SecretList,
    pub lease: LeaseConfig,
    pub drain_timeout: Dur,
    pub delivery: DeliveryConfig,
    pub limits: LimitsConfig,
    pub ingress: IngressConfig,
    pub outbound: OutboundConfig,
    pub retention: RetentionConfig,
    pub quotas: QuotasConfig,
    pub readiness: ReadinessConfig,
    pub log: LogConfig,
    /// The pods' mTLS listener for host agents; empty = off.
    pub hosts_tls_listen: String,
    /// Host CA certificate and key (PEM text or a file path). Unset: generated once and kept
    /// in the store, encrypted with the encryption key.
    pub hosts_ca_cert: Option<String>,
    pub hosts_ca_key: Option<String>,
    /// Trusted-ingress mode: header carrying the verified client certificate (URL-encoded
    /// PEM). Unset = the public listener takes no client certificates.
    pub hosts_client_cert_header: Option<String>,
    /// Proof a request came through the trusted ingress, required with
    /// `hosts_client_cert_header`: secrets (comma-separated, any one verifies) the ingress
    /// sends in `X-Switchyard-Ingress-Secret`, and/or the ingress's own address ranges.
    pub hosts_ingress_secret: SecretList,
    pub hosts_ingress_sources: CidrList,
    /// Operators of the console and the operator API, `name=token` comma-separated, each
    /// token 128+ bits of randomness. Empty = both off.
    pub operator_tokens: SecretList,
    pub operator_auth: OperatorAuthConfig,
    pub hosts: HostsSection,
    pub console: crate::console::ConsoleConfig,
    /// The delivery journal (`[journal]`).
    pub journal: crate::journal::JournalSection,
    /// Each provider's section (`[slack]`, ...), owned by its crate and loaded by name.
    #[serde(skip)]
    pub providers: ProviderSections,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            metrics_listen: "127.0.0.1:9090".into(),
            admin_listen: String::new(),
            data_dir: PathBuf::from("./data"),
            database_url: None,
            database_schema: None,
            database_max_connections: 16,
            nats_url: None,
            nats_subject_prefix: "switchyard".into(),
            redis_url: None,
            redis_key_prefix: "switchyard".into(),
            s3: S3Config::default(),
            pod_id: None,
            public_base_url: None,
            signing_keys: SecretList::default(),
            encryption_keys: SecretList::default(),
            lease: LeaseConfig::default(),
            drain_timeout: Dur(Duration::from_secs(30)),
            delivery: DeliveryConfig::default(),
            limits: LimitsConfig::default(),
            ingress: IngressConfig::default(),
            outbound: OutboundConfig::default(),
            retention: RetentionConfig::default(),
            quotas: QuotasConfig::default(),
            readiness: ReadinessConfig::default(),
            log: LogConfig::default(),
            hosts_tls_listen: "127.0.0.1:8443".into(),
            hosts_ca_cert: None,
            hosts_ca_key: None,
            hosts_client_cert_header: None,
            hosts_ingress_secret: SecretList::default(),
            hosts_ingress_sources: CidrList::default(),
            operator_tokens: SecretList::default(),
            operator_auth: OperatorAuthConfig::default(),
            hosts: HostsSection::default(),
            console: crate::console::ConsoleConfig::default(),
            journal: crate::journal::JournalSection::default(),
            providers: ProviderSections::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("configuration: {0}")]
    Invalid(String),
}

/// Least randomness an operator token must carry.
pub const MIN_OPERATOR_TOKEN_BITS: u32 = 128;

/// Bits of randomness a token can hold at most, judged from its length and alphabet: 4 bits
/// a character, or 6 for a base64 (or base64url) string with upper- and lowercase letters
/// and digits, as generated ones have. Anything else is judged as conservatively as hex, and
/// a token with few distinct characters (`aaaa...`, `abab...`) counts as none. A generated
/// token (`openssl rand -hex 32`, `openssl rand -base64 32`) passes; words do not.
pub fn token_bits(token: &str) -> u32 {
    let body = token.trim_end_matches('=');
    let mut distinct: Vec<char> = body.chars().collect();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < 8 {
        return 0;
    }
    let base64 = body
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '-' | '_'))
        && body.chars().any(|c| c.is_ascii_uppercase())
        && body.chars().any(|c| c.is_ascii_lowercase())
        && body.chars().any(|c| c.is_ascii_digit());
    let per_char = if base64 { 6 } else { 4 };
    u32::try_from(body.chars().count() * per_char).unwrap_or(u32::MAX)
}

/// Where a key's value came from: the file, or the `SWITCHYARD_*` variable.
fn key_source(fig: &Figment, path: &[String]) -> String {
    match fig.find_metadata(&path.join(".")) {
        Some(m) if m.name.contains("environment") => format!(
            "the environment variable SWITCHYARD_{}",
            path.join("__").to_ascii_uppercase()
        ),
        Some(m) => m
            .source
            .as_ref()
            .map_or_else(|| m.name.to_string(), ToString::to_string),
        None => "the configuration".into(),
    }
}

/// An unknown key, or a value that is not one of a setting's choices, names the key, where
/// it came from (the file, or the variable) and what is allowed; any other error is
/// figment's own.
fn unknown_key(fig: &Figment, section: &[&str], mut e: figment::Error) -> ConfigError {
    use figment::error::Kind;
    let within = |path: &[String]| -> Vec<String> {
        section
            .iter()
            .map(|s| (*s).to_owned())
            .chain(path.iter().cloned())
            .collect()
    };
    for err in e.clone() {
        match &err.kind {
            Kind::UnknownField(field, expected) => {
                // figment's path ends with the unknown field itself.
                let mut path = within(&err.path);
                if path.last() != Some(field) {
                    path.push(field.clone());
                }
                return ConfigError::Invalid(format!(
                    "unknown key `{}` in {}; known keys there: {}",
                    path.join("."),
                    key_source(fig, &path),
                    expected.join(", ")
                ));
            }
            Kind::UnknownVariant(found, expected) => {
                let path = within(&err.path);
                return ConfigError::Invalid(format!(
                    "`{}` = {found:?} in {} is not one of: {}",
                    path.join("."),
                    key_source(fig, &path),
                    expected.join(", ")
                ));
            }
            _ => {}
        }
    }
    // Sections are read from figures of their own: the key and its source are the ones of
    // the loaded files and variables.
    let path = within(&e.path);
    e.metadata = fig.find_metadata(&path.join(".")).cloned();
    e.path = path;
    ConfigError::Load(Box::new(e))
}

/// The configuration in `fig`: each listed provider's section is taken out and loaded by its
/// factory, the rest is [`Config`]'s own tables; unknown keys are refused in both.
fn extract(fig: &Figment) -> Result<Config, ConfigError> {
    use figment::value::{Dict, Value};
    let mut rest: Dict = fig.extract().map_err(|e| unknown_key(fig, &[], e))?;
    let mut sections = Vec::new();
    for f in crate::providers::factories() {
        let name = f.name();
        let section = match rest.remove(name) {
            None => f.default_section(),
            Some(Value::Dict(..)) => f
                .load(&fig.focus(name))
                .map_err(|e| unknown_key(fig, &[name], *e))?,
            Some(_) => {
                return Err(ConfigError::Invalid(format!(
                    "`{name}` in {} is a table of settings, not a value",
                    key_source(fig, &[name.to_owned()])
                )));
            }
        };
        sections.push(section);
    }
    let mut cfg: Config = Figment::from(Serialized::defaults(rest))
        .extract()
        .map_err(|e| unknown_key(fig, &[], e))?;
    cfg.providers = ProviderSections(sections);
    Ok(cfg)
}

impl Config {
    /// Defaults, then the file (if any), then `SWITCHYARD_*` environment variables.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        let file = file
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("SWITCHYARD_CONFIG").map(PathBuf::from));
        if let Some(f) = file {
            if !f.exists() {
                return Err(ConfigError::Invalid(format!(
                    "config file {} does not exist",
                    f.display()
                )));
            }
            fig = fig.merge(Toml::file(f));
        }
        // Unknown keys (a typo in the file or in a SWITCHYARD_* variable) are refused, naming
        // the key: every struct is deny_unknown_fields. SWITCHYARD_CONFIG names the file and
        // SWITCHYARD_LOG is the log filter override, so neither is a key; SWITCHYARD_BUILD_TIME,
        // SWITCHYARD_GIT_REV and SWITCHYARD_GIT_TAG are build metadata (the build script reads
        // the first and emits all three, which `cargo run` and `cargo test` pass on).
        fig = fig.merge(Env::prefixed("SWITCHYARD_").split("__").ignore(&[
            "config",
            "log",
            "build_time",
            "git_rev",
            "git_tag",
        ]));
        let cfg = extract(&fig)?;
        cfg.validate()?;
        if let Some(filter) = std::env::var_os("SWITCHYARD_LOG") {
            check_log_filter(&filter.to_string_lossy())
                .map_err(|e| ConfigError::Invalid(format!("SWITCHYARD_LOG: {e}")))?;
        }
        Ok(cfg)
    }

    /// Defaults, then `toml` (no file, no environment): the config fuzz target's entry and a
    /// quick way to check a file's text.
    pub fn from_toml_str(toml: &str) -> Result<Self, ConfigError> {
        let fig = Figment::from(Serialized::defaults(Config::default())).merge(Toml::string(toml));
        let cfg = extract(&fig)?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(u) = &self.public_base_url {
            let parsed = url::Url::parse(u).map_err(|_| {
                ConfigError::Invalid("public_base_url must be an absolute URL".into())
            })?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(ConfigError::Invalid(
                    "public_base_url must be http or https".into(),
                ));
            }
        }
        if let Some(db) = &self.database_url
            && !(db.starts_with("sqlite:")
                || db.starts_with("postgres://")
                || db.starts_with("postgresql://"))
        {
            return Err(ConfigError::Invalid(
                "database_url must start with sqlite: or postgres://".into(),
            ));
        }
        check_log_filter(&self.log.level)
            .map_err(|e| ConfigError::Invalid(format!("log.level: {e}")))?;
        self.providers.validate().map_err(ConfigError::Invalid)?;
        if let Err(e) = self.hosts.core().timeouts.validate() {
            return Err(ConfigError::Invalid(format!("hosts: {e}")));
        }
        if self.hosts_ca_cert.is_some() != self.hosts_ca_key.is_some() {
            return Err(ConfigError::Invalid(
                "hosts_ca_cert and hosts_ca_key are set together".into(),
            ));
        }
        if self.hosts_client_cert_header.is_some() {
            let secrets = &self.hosts_ingress_secret.0;
            if secrets.is_empty() && self.hosts_ingress_sources.0.is_empty() {
                return Err(ConfigError::Invalid(
                    "hosts_client_cert_header needs proof that requests came through the ingress: set hosts_ingress_secret (sent by the ingress in X-Switchyard-Ingress-Secret) or hosts_ingress_sources (the ingress's address ranges)".into(),
                ));
            }
            if secrets
                .iter()
                .any(|s| s.expose().trim().chars().count() < 16)
            {
                return Err(ConfigError::Invalid(
                    "hosts_ingress_secret entries must be 16+ characters".into(),
                ));
            }
        }
        for entry in &self.operator_tokens.0 {
            // Judged as used: trimmed, so a token of spaces (empty once trimmed) is refused.
            let Some((name, token)) = entry.expose().split_once('=') else {
                return Err(ConfigError::Invalid(
                    "operator_tokens entries are name=token".into(),
                ));
            };
            let name = name.trim();
            if name.is_empty() {
                return Err(ConfigError::Invalid(
                    "operator_tokens entries are name=token with a name".into(),
                ));
            }
            let bits = token_bits(token.trim());
            if bits < MIN_OPERATOR_TOKEN_BITS {
                return Err(ConfigError::Invalid(format!(
                    "operator_tokens: the token of {name} has about {bits} bits; tokens need {MIN_OPERATOR_TOKEN_BITS}+ bits of randomness: make one with `openssl rand -hex 32` (64 hex characters)"
                )));
            }
        }
        if self.operator_auth.failures_per_source == 0
            || self.operator_auth.failure_window.0.is_zero()
            || self.operator_auth.requests_per_operator == 0
        {
            return Err(ConfigError::Invalid(
                "operator_auth limits must be above zero".into(),
            ));
        }
        if self.ingress.max_concurrent == 0
            || self.ingress.max_concurrent_per_tenant == 0
            || self.ingress.max_concurrent_per_channel == 0
            || self.ingress.max_json_bytes == 0
            || self.ingress.body_timeout.0.is_zero()
        {
            return Err(ConfigError::Invalid(
                "ingress limits must be above zero".into(),
            ));
        }
        if self.readiness.failure_threshold == 0 || self.readiness.interval.0.is_zero() {
            return Err(ConfigError::Invalid(
                "readiness.failure_threshold and readiness.interval must be above zero".into(),
            ));
        }
        if self.delivery.window == 0 || self.limits.tools_per_socket == 0 {
            return Err(ConfigError::Invalid(
                "delivery.window and limits.tools_per_socket must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// True when the store is shared by several pods (keys must then be configured).
    pub fn is_clustered(&self) -> bool {
        self.database_url
            .as_deref()
            .is_some_and(|u| u.starts_with("postgres"))
    }

    /// Operators of the approval API as (name, token).
    pub fn operators(&self) -> Vec<(String, String)> {
        self.operator_tokens
            .0
            .iter()
            .filter_map(|e| e.expose().split_once('='))
            .map(|(n, t)| (n.trim().to_owned(), t.trim().to_owned()))
            // Never an empty token, whatever reached here: it would match a missing header.
            .filter(|(n, t)| !n.is_empty() && !t.is_empty())
            .collect()
    }

    /// Group commit sizes: one committer on SQLite (one writer), two on Postgres. More
    /// committers make smaller batches: with 64 posts in flight over 3 pods, four a pod
    /// delivered 13-17 % less than two (loadtest, 2 cores), each batch paying its five
    /// statements for fewer messages.
    pub fn commit_limits(&self) -> switchyard_core::engine::CommitLimits {
        let committers = match self.delivery.committers {
            0 if self.is_clustered() => 2,
            0 => 1,
            n => n,
        };
        switchyard_core::engine::CommitLimits {
            committers,
            max_batch: self.delivery.commit_batch.max(1),
            max_queued: self.delivery.commit_backlog.max(1),
        }
    }

    pub fn engine(&self) -> EngineConfig {
        EngineConfig {
            connector_grace: self.lease.connector_grace.0,
            auth_session_ttl: self.retention.auth_session_ttl.0,
            message_ttl: self.delivery.message_ttl.0,
            outbox_cap: self.delivery.outbox_cap,
            dedupe_window: self.delivery.dedupe_window.0,
            idempotency_ttl: self.retention.idempotency_ttl.0,
            file_ttl: self.retention.file_ttl.0,
            download_url_ttl: self.retention.download_url_ttl.0,
            max_upload_bytes: self.limits.max_upload_bytes,
            tool_timeout: self.limits.tool_timeout.0,
            delta_ttl: self.retention.delta_ttl.0,
            delta_max_bytes: self.retention.delta_max_bytes,
            tenant_ephemeral_bytes: self.quotas.ephemeral_bytes,
        }
    }
}

/// The edge's part of `print-default-config`; each provider's section goes in at
/// [`PROVIDER_SECTIONS_MARK`].
const EDGE_DEFAULT_TOML: &str = include_str!("../default-config.toml");
const PROVIDER_SECTIONS_MARK: &str = "# (each provider's section)\n";

/// The documented default configuration printed by `switchyard print-default-config`: the
/// edge's tables with each listed provider's section, as its crate documents it.
pub fn default_config_toml() -> String {
    let sections: Vec<&str> = crate::providers::factories()
        .iter()
        .map(|f| f.default_toml().trim_end())
        .collect();
    EDGE_DEFAULT_TOML.replacen(
        PROVIDER_SECTIONS_MARK,
        &format!("{}\n\n", sections.join("\n\n")),
        1,
    )
}

impl Config {
    /// The settings every provider is built with, from this configuration.
    pub fn shared_settings(
        &self,
        build: switchyard_protocol::BuildInfo,
    ) -> switchyard_core::provider::SharedSettings {
        let i = &self.ingress;
        switchyard_core::provider::SharedSettings {
            build,
            public_base_url: self.public_base_url.clone(),
            ingress: switchyard_core::provider::IngressBounds {
                max_json_bytes: i.max_json_bytes,
                body_timeout: i.body_timeout.0,
                body_grace: i.body_grace.0,
                min_body_rate: i.min_body_rate,
                max_concurrent: i.max_concurrent,
                max_concurrent_per_tenant: i.max_concurrent_per_tenant,
                max_concurrent_per_channel: i.max_concurrent_per_channel,
            },
            outbound: self.outbound.policy(),
            max_inbound_bytes: self.limits.max_inbound_bytes,
        }
    }
}

#[cfg(test)]
mod tests;
