//! `switchyard check`: the configuration loaded and validated (by the caller), then every
//! configured backend reached, one line each. What an init container or an operator runs
//! before `serve`; it changes nothing (no migration, no keys generated).

use std::future::Future;
use std::time::Duration;

use anyhow::Context;
use switchyard_core::crypto::{Cipher, UrlSigner};
use switchyard_core::store::SCHEMA_VERSION;

use crate::app::{open_bus, open_ephemeral, open_files, open_store, schema_fit};
use crate::config::Config;

/// One backend's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verdict = if self.ok { "ok" } else { "FAILED" };
        write!(f, "{:<10} {verdict:<6} {}", self.name, self.detail)
    }
}

/// Runs `f` within `timeout`; its error (with its causes) or the timeout is the detail.
async fn probe<F>(name: &'static str, timeout: Duration, f: F) -> Line
where
    F: Future<Output = anyhow::Result<String>>,
{
    let (ok, detail) = match tokio::time::timeout(timeout, f).await {
        Ok(Ok(detail)) => (true, detail),
        Ok(Err(e)) => (false, format!("{e:#}")),
        Err(_) => (false, format!("no answer within {timeout:?}")),
    };
    Line { name, ok, detail }
}

/// A URL without its credentials, path or query: safe to print.
fn where_(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => {
            let host = u.host_str().unwrap_or("");
            match u.port() {
                Some(p) => format!("{}://{host}:{p}", u.scheme()),
                None => format!("{}://{host}", u.scheme()),
            }
        }
        Err(_) => "an unparseable URL".into(),
    }
}

/// Checks each backend the configuration names; every one is tried even after a failure.
pub async fn run(cfg: &Config, timeout: Duration) -> Vec<Line> {
    let mut lines = Vec::new();
    lines.push(probe("keys", timeout, keys(cfg)).await);
    lines.push(probe("store", timeout, store(cfg)).await);
    lines.push(
        probe("bus", timeout, async {
            let bus = open_bus(cfg).await?;
            let Some(url) = &cfg.nats_url else {
                return Ok("in-process (single node)".into());
            };
            bus.flush().await.context("NATS flush")?;
            anyhow::ensure!(bus.is_connected(), "NATS connection is not up");
            Ok(format!(
                "NATS at {}, subjects {}.*",
                where_(url),
                cfg.nats_subject_prefix
            ))
        })
        .await,
    );
    lines.push(
        probe("ephemeral", timeout, async {
            let e = open_ephemeral(cfg).await?;
            e.ping().await.context("ping")?;
            Ok(match &cfg.redis_url {
                None => "in-process (single node)".into(),
                Some(url) => format!("Redis at {}", where_(url)),
            })
        })
        .await,
    );
    lines.push(
        probe("files", timeout, async {
            let f = open_files(cfg).await?;
            f.ping().await.context("ping")?;
            Ok(match &cfg.s3.bucket {
                None => format!("local folder {}", cfg.data_dir.join("files").display()),
                Some(b) => format!(
                    "S3 bucket {b}{}",
                    cfg.s3
                        .endpoint
                        .as_deref()
                        .map(|e| format!(" at {}", where_(e)))
                        .unwrap_or_default()
                ),
            })
        })
        .await,
    );
    lines
}

/// Configured keys must parse; a shared database needs them configured.
async fn keys(cfg: &Config) -> anyhow::Result<String> {
    let (signing, encryption) = (&cfg.signing_keys.0, &cfg.encryption_keys.0);
    if signing.is_empty() || encryption.is_empty() {
        anyhow::ensure!(
            !cfg.is_clustered(),
            "SWITCHYARD_SIGNING_KEYS and SWITCHYARD_ENCRYPTION_KEYS are required with a shared database"
        );
    }
    if !encryption.is_empty() {
        Cipher::from_base64(encryption).context("encryption_keys")?;
    }
    if !signing.is_empty() {
        UrlSigner::new(signing.clone()).context("signing_keys")?;
    }
    Ok(if signing.is_empty() || encryption.is_empty() {
        "generated under the data dir (embedded mode)".into()
    } else {
        format!(
            "{} signing, {} encryption key(s) configured",
            signing.len(),
            encryption.len()
        )
    })
}

async fn store(cfg: &Config) -> anyhow::Result<String> {
    let what = match &cfg.database_url {
        Some(u) if cfg.is_clustered() => format!("Postgres at {}", where_(u)),
        Some(_) => "SQLite".to_owned(),
        None => format!("SQLite at {}", cfg.data_dir.join("switchyard.db").display()),
    };
    let store = open_store(cfg).await?;
    store.ping().await.context("ping")?;
    let v = store
        .schema_version()
        .await
        .context("reading the schema version")?;
    if v < SCHEMA_VERSION && !cfg.is_clustered() {
        // `serve` migrates an embedded store itself.
        return Ok(format!(
            "{what}, schema {v}; `serve` migrates it to {SCHEMA_VERSION}"
        ));
    }
    schema_fit(v).map_err(anyhow::Error::msg)?;
    Ok(format!("{what}, schema {v}"))
}
