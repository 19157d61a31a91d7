//! The backends chosen once from config (store, bus, ephemeral state, files), the schema
//! window a pod runs in, and the signing and encryption keys.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use switchyard_core::bus::{Bus, LocalBus};
use switchyard_core::crypto::{Cipher, Secret};
use switchyard_core::ephemeral::{Ephemeral, MemoryEphemeral};
use switchyard_core::files::{FileStore, LocalFileStore};
use switchyard_core::ids::random_secret;
use switchyard_core::store::{SCHEMA_VERSION, Store};

use crate::config::Config;

pub struct Backends {
    pub store: Arc<dyn Store>,
    pub bus: Arc<dyn Bus>,
    pub ephemeral: Arc<dyn Ephemeral>,
    pub files: Arc<dyn FileStore>,
}

/// The store named by the config (SQLite under the data dir when unset).
pub async fn open_store(cfg: &Config) -> anyhow::Result<Arc<dyn Store>> {
    let url = match &cfg.database_url {
        Some(u) => u.clone(),
        None => {
            create_private_dir(&cfg.data_dir)
                .with_context(|| format!("creating data dir {}", cfg.data_dir.display()))?;
            format!("sqlite://{}", cfg.data_dir.join("switchyard.db").display())
        }
    };
    if url.starts_with("sqlite:") {
        let store = switchyard_store_sqlite::SqliteStore::open(&url)
            .await
            .context("opening SQLite store")?;
        return Ok(Arc::new(store));
    }
    crate::cluster::open_postgres(cfg, &url).await
}

pub async fn backends(cfg: &Config) -> anyhow::Result<Backends> {
    Ok(Backends {
        store: open_store(cfg).await?,
        bus: open_bus(cfg).await?,
        ephemeral: open_ephemeral(cfg).await?,
        files: open_files(cfg).await?,
    })
}

/// NATS when configured, else the in-process bus.
pub async fn open_bus(cfg: &Config) -> anyhow::Result<Arc<dyn Bus>> {
    match &cfg.nats_url {
        None => Ok(Arc::new(LocalBus::new())),
        Some(url) => crate::cluster::open_nats(url, &cfg.nats_subject_prefix).await,
    }
}

/// Redis when configured, else in-process ephemeral state.
pub async fn open_ephemeral(cfg: &Config) -> anyhow::Result<Arc<dyn Ephemeral>> {
    match &cfg.redis_url {
        None => Ok(Arc::new(MemoryEphemeral::default())),
        Some(url) => crate::cluster::open_redis(url, &cfg.redis_key_prefix).await,
    }
}

/// S3 when a bucket is configured, else the files folder under the data dir.
pub async fn open_files(cfg: &Config) -> anyhow::Result<Arc<dyn FileStore>> {
    match &cfg.s3.bucket {
        None => Ok(Arc::new(
            LocalFileStore::new(cfg.data_dir.join("files")).context("opening files folder")?,
        )),
        Some(_) => crate::cluster::open_s3(&cfg.s3).await,
    }
}

/// Migrations are expand/contract: the migration to version N+1 only adds (tables, indexes,
/// nullable or defaulted columns), so a build of version N runs on its own schema and on
/// the next one. A `helm rollback` after a migrating upgrade, or an old pod restarted in the
/// middle of a rollout, keeps working; anything further ahead is refused. Removing what an
/// older build still reads waits until no supported build reads it (docs/ops.md).
pub const SCHEMA_WINDOW: std::ops::RangeInclusive<i64> = SCHEMA_VERSION..=SCHEMA_VERSION + 1;

/// Whether this build runs on a database at schema version `v`.
pub fn schema_fit(v: i64) -> Result<(), String> {
    if v < *SCHEMA_WINDOW.start() {
        Err(format!(
            "database schema version {v} is older than {SCHEMA_VERSION}; run `switchyard migrate`"
        ))
    } else if v > *SCHEMA_WINDOW.end() {
        Err(format!(
            "database schema version {v} is newer than this build runs on (its own {SCHEMA_VERSION} and the next, {}); upgrade switchyard",
            SCHEMA_VERSION + 1
        ))
    } else {
        Ok(())
    }
}

/// SQLite migrates itself; a shared Postgres must be migrated with `switchyard migrate`
/// first, and a pod refuses a schema outside [`SCHEMA_WINDOW`].
pub async fn prepare_schema(cfg: &Config, store: &dyn Store) -> anyhow::Result<()> {
    if !cfg.is_clustered() {
        // A no-op on a database a newer build already migrated.
        store
            .migrate()
            .await
            .context("migrating the embedded store")?;
    }
    let v = store
        .schema_version()
        .await
        .context("reading the schema version")?;
    schema_fit(v).map_err(anyhow::Error::msg)?;
    if v > SCHEMA_VERSION {
        tracing::info!(
            schema = v,
            build_schema = SCHEMA_VERSION,
            "running on the next schema version (a newer build migrated it)"
        );
    }
    Ok(())
}

#[derive(serde::Serialize, serde::Deserialize)]
struct KeyFile {
    signing_keys: Vec<String>,
    encryption_keys: Vec<String>,
}

/// Signing and encryption keys: configured, or (embedded mode only) generated once and kept
/// in the data dir with owner-only permissions.
pub fn keys(cfg: &Config) -> anyhow::Result<(Vec<Secret>, Vec<Secret>)> {
    if !cfg.signing_keys.0.is_empty() && !cfg.encryption_keys.0.is_empty() {
        return Ok((cfg.signing_keys.0.clone(), cfg.encryption_keys.0.clone()));
    }
    if cfg.is_clustered() {
        bail!(
            "SWITCHYARD_SIGNING_KEYS and SWITCHYARD_ENCRYPTION_KEYS are required with a shared database (every pod must use the same keys)"
        );
    }
    let path = cfg.data_dir.join("keys.json");
    let file: KeyFile = if path.exists() {
        serde_json::from_slice(&std::fs::read(&path)?).context("reading keys.json")?
    } else {
        let kf = KeyFile {
            signing_keys: vec![random_secret(32)],
            encryption_keys: vec![Cipher::generate_key()],
        };
        create_private_dir(&cfg.data_dir)?;
        write_private(&path, &serde_json::to_vec_pretty(&kf)?)?;
        kf
    };
    let pick = |configured: &[Secret], stored: &[String]| {
        if configured.is_empty() {
            stored.iter().map(Secret::new).collect()
        } else {
            configured.to_vec()
        }
    };
    Ok((
        pick(&cfg.signing_keys.0, &file.signing_keys),
        pick(&cfg.encryption_keys.0, &file.encryption_keys),
    ))
}

/// The data dir holds the database, keys and files: this user's only (0700) when created.
pub(super) fn create_private_dir(path: &Path) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    b.create(path)
}

fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}
