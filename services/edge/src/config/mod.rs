//! One typed configuration: defaults -> optional TOML file (`--config` or `SWITCHYARD_CONFIG`)
//! -> environment variables prefixed `SWITCHYARD_` with `__` between nested keys.

use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};
use switchyard_core::engine::EngineConfig;

mod sections;
mod values;

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
    pub telegram: TelegramConfig,
    pub wechat: WechatConfig,
    pub feishu: FeishuConfig,
    pub discord: DiscordConfig,
    pub slack: SlackConfig,
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
            telegram: TelegramConfig::default(),
            wechat: WechatConfig::default(),
            feishu: FeishuConfig::default(),
            discord: DiscordConfig::default(),
            slack: SlackConfig::default(),
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
fn unknown_key(fig: &Figment, e: figment::Error) -> ConfigError {
    use figment::error::Kind;
    for err in e.clone() {
        match &err.kind {
            Kind::UnknownField(field, expected) => {
                // figment's path ends with the unknown field itself.
                let mut path = err.path.clone();
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
                return ConfigError::Invalid(format!(
                    "`{}` = {found:?} in {} is not one of: {}",
                    err.path.join("."),
                    key_source(fig, &err.path),
                    expected.join(", ")
                ));
            }
            _ => {}
        }
    }
    ConfigError::Load(Box::new(e))
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
        let cfg: Config = fig.extract().map_err(|e| unknown_key(&fig, e))?;
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
        let cfg: Config = fig.extract().map_err(|e| unknown_key(&fig, e))?;
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
        for (name, v) in [
            ("wechat.api_base", &self.wechat.api_base),
            ("wechat.cdn_base", &self.wechat.cdn_base),
            ("feishu.accounts_base", &self.feishu.accounts_base),
            ("discord.api_base", &self.discord.api_base),
            ("feishu.lark_accounts_base", &self.feishu.lark_accounts_base),
            ("slack.api_base", &self.slack.api_base),
        ] {
            if !url::Url::parse(v).is_ok_and(|u| matches!(u.scheme(), "http" | "https")) {
                return Err(ConfigError::Invalid(format!(
                    "{name} must be an http(s) URL"
                )));
            }
        }
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

    /// Group commit sizes: one committer on SQLite (one writer), four on Postgres.
    pub fn commit_limits(&self) -> switchyard_core::engine::CommitLimits {
        let committers = match self.delivery.committers {
            0 if self.is_clustered() => 4,
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
            ack_timeout: self.delivery.ack_timeout.0,
            delivery_window: self.delivery.window,
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

/// The documented default configuration printed by `switchyard print-default-config`.
pub const DEFAULT_CONFIG_TOML: &str = include_str!("../default-config.toml");

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_core::crypto::Secret;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Some(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("7"), Some(Duration::from_secs(7)));
        assert_eq!(parse_duration("1x"), None);
        assert_eq!(parse_duration(""), None);
    }

    #[test]
    // figment's Jail API fixes the closure's error type.
    #[allow(clippy::result_large_err)]
    fn printed_default_config_is_the_default() {
        // Parsed on its own: every key is where the structs expect it (unknown keys are
        // refused, so a key printed under the wrong table fails here).
        let parsed: Config = Figment::from(Toml::string(DEFAULT_CONFIG_TOML))
            .extract()
            .unwrap();
        assert_eq!(parsed, Config::default());
        // Loaded as a config file, the way `serve --config FILE` does.
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("printed.toml", DEFAULT_CONFIG_TOML)?;
            let c = Config::load(Some(Path::new("printed.toml"))).map_err(|e| e.to_string())?;
            assert_eq!(c, Config::default());
            Ok(())
        });
        // Every top-level key that is not a table is printed before the first table, where
        // TOML puts it at the top level.
        let top = DEFAULT_CONFIG_TOML.split("\n[").next().unwrap();
        for key in [
            "hosts_tls_listen",
            "operator_tokens",
            "listen",
            "metrics_listen",
        ] {
            assert!(
                top.lines().any(|l| l.starts_with(&format!("{key} ="))),
                "{key} is printed at the top level"
            );
        }
    }

    #[test]
    #[allow(clippy::result_large_err)]
    fn unknown_keys_are_refused_naming_them() {
        figment::Jail::expect_with(|jail| {
            // Whatever SWITCHYARD_* the test runner has (scripts/test.sh exports some) would
            // be refused as unknown keys.
            jail.clear_env();
            jail.set_env("SWITCHYARD_LEASE__CONECTOR_GRACE", "2h");
            let e = Config::load(None).unwrap_err().to_string();
            assert!(
                e.contains("lease.conector_grace")
                    && e.contains("SWITCHYARD_LEASE__CONECTOR_GRACE")
                    && e.contains("connector_grace"),
                "{e}"
            );
            Ok(())
        });
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("SWITCHYARD_LISTN", "0.0.0.0:1");
            let e = Config::load(None).unwrap_err().to_string();
            assert!(
                e.contains("`listn`") && e.contains("SWITCHYARD_LISTN"),
                "{e}"
            );
            Ok(())
        });
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("typo.toml", "[log]\nhosts_tls_listen = \"\"\n")?;
            let e = Config::load(Some(Path::new("typo.toml")))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("log.hosts_tls_listen") && e.contains("typo.toml"),
                "{e}"
            );
            Ok(())
        });
        // The file and log-filter variables are not keys.
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("SWITCHYARD_LOG", "debug");
            jail.set_env("SWITCHYARD_LOG__LEVEL", "warn");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.log.level, "warn");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)]
    fn every_table_refuses_unknown_keys() {
        // One typo per table, through the environment: each is refused naming its variable.
        for var in [
            "SWITCHYARD_S3__BUKET",
            "SWITCHYARD_LEASE__GRACE",
            "SWITCHYARD_DELIVERY__WINDOWS",
            "SWITCHYARD_LIMITS__MAX_FRAME",
            "SWITCHYARD_INGRESS__MAX_JSON_BYTE",
            "SWITCHYARD_OUTBOUND__ALLOW_PRIVATES",
            "SWITCHYARD_RETENTION__FILES_TTL",
            "SWITCHYARD_QUOTAS__SOCKET",
            "SWITCHYARD_TELEGRAM__API",
            "SWITCHYARD_LOG__LEVELS",
            "SWITCHYARD_HOSTS__LOST",
        ] {
            figment::Jail::expect_with(|jail| {
                jail.clear_env();
                jail.set_env(var, "1");
                let e = Config::load(None).unwrap_err().to_string();
                assert!(e.contains("unknown key") && e.contains(var), "{var}: {e}");
                Ok(())
            });
        }
    }

    #[test]
    #[allow(clippy::result_large_err)]
    fn choices_and_log_levels_are_checked_at_load() {
        let refused = |var: &str, value: &str| {
            let mut out = String::new();
            figment::Jail::expect_with(|jail| {
                jail.clear_env();
                jail.set_env(var, value);
                out = Config::load(None).unwrap_err().to_string();
                Ok(())
            });
            out
        };
        let e = refused("SWITCHYARD_LOG__FORMAT", "JSON");
        assert!(
            e.contains("log.format") && e.contains("SWITCHYARD_LOG__FORMAT") && e.contains("json"),
            "{e}"
        );
        let e = refused("SWITCHYARD_TELEGRAM__MODE", "webhooks");
        assert!(
            e.contains("telegram.mode") && e.contains("polling") && e.contains("auto"),
            "{e}"
        );
        let e = refused("SWITCHYARD_HOSTS__LOST_POLICY", "retry");
        assert!(
            e.contains("hosts.lost_policy") && e.contains("requeue") && e.contains("fail"),
            "{e}"
        );
        let e = refused("SWITCHYARD_LOG__LEVEL", "verbose");
        assert!(
            e.contains("log.level") && e.contains("`verbose` is not a log level"),
            "{e}"
        );
        let e = refused("SWITCHYARD_LOG__LEVEL", "switchyard=loud");
        assert!(e.contains("log.level"), "{e}");
        let e = refused("SWITCHYARD_LOG", "verbose");
        assert!(e.contains("SWITCHYARD_LOG:"), "{e}");
        for ok in ["debug", "WARN", "switchyard=debug,info", "off"] {
            assert_eq!(check_log_filter(ok), Ok(()), "{ok}");
        }
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("SWITCHYARD_LOG__FORMAT", "json");
            jail.set_env("SWITCHYARD_TELEGRAM__MODE", "polling");
            jail.set_env("SWITCHYARD_HOSTS__LOST_POLICY", "fail");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.log.format, LogFormat::Json);
            assert_eq!(c.telegram.mode, TelegramMode::Polling);
            assert_eq!(
                c.hosts.core().lost_policy,
                switchyard_protocol::hosts::HostLostPolicy::Fail
            );
            Ok(())
        });
    }

    #[test]
    fn trusted_ingress_mode_needs_a_proof() {
        let mut c = Config {
            hosts_client_cert_header: Some("x-ssl-client-cert".into()),
            ..Config::default()
        };
        let e = c.validate().expect_err("no proof configured").to_string();
        assert!(e.contains("hosts_ingress_secret"), "{e}");
        c.hosts_ingress_secret = SecretList(vec![Secret::new("short")]);
        assert!(c.validate().is_err(), "a short secret is refused");
        c.hosts_ingress_secret = SecretList(vec![Secret::new("0123456789abcdef")]);
        c.validate().expect("a secret is proof");
        c.hosts_ingress_secret = SecretList::default();
        c.hosts_ingress_sources = CidrList(vec!["10.0.0.0/8".parse().unwrap()]);
        c.validate().expect("a source range is proof");
    }

    #[test]
    fn operator_tokens_are_judged_trimmed() {
        let mut c = Config::default();
        for bad in [
            "ops=                ",
            "ops=   short-token      ",
            "   =0123456789abcdef",
            "ops",
        ] {
            c.operator_tokens = SecretList(vec![Secret::new(bad)]);
            assert!(c.validate().is_err(), "{bad:?} was accepted");
        }
        let token = "7f3a9c1e5b2d8f4a6c0e9b3d1f7a5c2e";
        c.operator_tokens = SecretList(vec![Secret::new(format!(" ops = {token} "))]);
        assert!(c.validate().is_ok());
        assert_eq!(c.operators(), vec![("ops".to_owned(), token.to_owned())]);
    }

    /// Finding 4 of issue 23: 16 characters were enough before; a token needs 128 bits of
    /// randomness now, and the refusal says how to make one.
    #[test]
    fn operator_tokens_need_128_bits() {
        let mut c = Config::default();
        for weak in [
            // 16 hex characters (64 bits): accepted before.
            "0123456789abcdef",
            // 31 hex characters: 124 bits.
            "7f3a9c1e5b2d8f4a6c0e9b3d1f7a5c2",
            // Long but hardly random.
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "abababababababababababababababababababab",
            // 21 base64 characters: 126 bits.
            "q8ZkV2xN4pR7tW1yB5mC9",
            // Words and a counted run: judged as hex, 100 bits.
            "operator-token-0123456789",
        ] {
            c.operator_tokens = SecretList(vec![Secret::new(format!("ops={weak}"))]);
            let e = c.validate().expect_err(weak).to_string();
            assert!(e.contains("128") && e.contains("openssl rand"), "{e}");
            assert!(!e.contains(weak), "the token is not echoed: {e}");
        }
        for strong in [
            // openssl rand -hex 16 / -hex 32 / -base64 32
            "7f3a9c1e5b2d8f4a6c0e9b3d1f7a5c2e",
            "9f2c4e81b7a35d60c1e8f4a2b9d07c3e5a61f8d2c4b7e09a3f5d1c8b6e2a4f70",
            "q8ZkV2xN4pR7tW1yB5mC9dLs3HfJ0gUe6iOa7bYcXn4=",
        ] {
            c.operator_tokens = SecretList(vec![Secret::new(format!("ops={strong}"))]);
            assert!(c.validate().is_ok(), "{strong} refused");
        }
    }

    #[test]
    #[allow(clippy::result_large_err)]
    fn outbound_allow_private_is_a_list_of_ranges() {
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("SWITCHYARD_OUTBOUND__ALLOW_PRIVATE", "127.0.0.0/8, ::1/128");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            let p = c.outbound.policy();
            assert!(p.check_ip("127.0.0.1".parse().unwrap()).is_ok());
            assert!(p.check_ip("::1".parse().unwrap()).is_ok());
            assert!(p.check_ip("10.0.0.1".parse().unwrap()).is_err());
            jail.set_env("SWITCHYARD_OUTBOUND__ALLOW_PRIVATE", "127.0.0.0/33");
            assert!(Config::load(None).is_err());
            Ok(())
        });
        assert!(
            Config::default()
                .outbound
                .policy()
                .check_ip("169.254.169.254".parse().unwrap())
                .is_err()
        );
    }

    #[test]
    // figment's Jail API fixes the closure's error type.
    #[allow(clippy::result_large_err)]
    fn env_overrides_nested_keys() {
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("SWITCHYARD_LISTEN", "0.0.0.0:1234");
            jail.set_env("SWITCHYARD_LEASE__CONNECTOR_GRACE", "2s");
            jail.set_env("SWITCHYARD_S3__BUCKET", "b");
            jail.set_env("SWITCHYARD_SIGNING_KEYS", "k1,k2");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.listen, "0.0.0.0:1234");
            assert_eq!(c.lease.connector_grace, Dur(Duration::from_secs(2)));
            assert_eq!(c.s3.bucket.as_deref(), Some("b"));
            assert_eq!(c.signing_keys.0.len(), 2);
            assert!(!format!("{c:?}").contains("k1"));
            Ok(())
        });
    }
}
