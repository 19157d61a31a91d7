//! The cluster backends, each behind a cargo feature so a lean build can leave them out; a
//! configured backend that is not compiled in fails at startup with a clear message.

use std::sync::Arc;

#[allow(unused_imports)]
use anyhow::{Context, bail};
use switchyard_core::bus::Bus;
use switchyard_core::ephemeral::Ephemeral;
use switchyard_core::files::FileStore;
use switchyard_core::store::Store;

use crate::config::{Config, S3Config};

#[cfg(feature = "postgres")]
pub async fn open_postgres(cfg: &Config, url: &str) -> anyhow::Result<Arc<dyn Store>> {
    let s = switchyard_store_postgres::PostgresStore::connect(
        url,
        cfg.database_schema.as_deref(),
        cfg.database_max_connections,
    )
    .await
    .context("connecting to Postgres")?;
    Ok(Arc::new(s))
}

#[cfg(not(feature = "postgres"))]
pub async fn open_postgres(_cfg: &Config, _url: &str) -> anyhow::Result<Arc<dyn Store>> {
    bail!("database_url names Postgres but this build has no `postgres` feature")
}

#[cfg(feature = "nats")]
pub async fn open_nats(url: &str, prefix: &str) -> anyhow::Result<Arc<dyn Bus>> {
    let b = switchyard_bus_nats::NatsBus::connect(url, prefix)
        .await
        .context("connecting to NATS")?;
    Ok(Arc::new(b))
}

#[cfg(not(feature = "nats"))]
pub async fn open_nats(_url: &str, _prefix: &str) -> anyhow::Result<Arc<dyn Bus>> {
    bail!("nats_url is set but this build has no `nats` feature")
}

#[cfg(feature = "redis")]
pub async fn open_redis(url: &str, prefix: &str) -> anyhow::Result<Arc<dyn Ephemeral>> {
    let r = switchyard_ephemeral_redis::RedisEphemeral::connect(url, prefix)
        .await
        .context("connecting to Redis")?;
    Ok(Arc::new(r))
}

#[cfg(not(feature = "redis"))]
pub async fn open_redis(_url: &str, _prefix: &str) -> anyhow::Result<Arc<dyn Ephemeral>> {
    bail!("redis_url is set but this build has no `redis` feature")
}

#[cfg(feature = "s3")]
pub async fn open_s3(cfg: &S3Config) -> anyhow::Result<Arc<dyn FileStore>> {
    let s3 = switchyard_files_s3::S3FileStore::new(switchyard_files_s3::S3Config {
        endpoint: cfg.endpoint.clone(),
        bucket: cfg.bucket.clone().unwrap_or_default(),
        region: cfg.region.clone(),
        force_path_style: cfg.force_path_style,
    })
    .context("configuring S3")?;
    Ok(Arc::new(s3))
}

#[cfg(not(feature = "s3"))]
pub async fn open_s3(_cfg: &S3Config) -> anyhow::Result<Arc<dyn FileStore>> {
    bail!("s3.bucket is set but this build has no `s3` feature")
}
