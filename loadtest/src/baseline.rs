//! `--baseline`: what the store under the pods can do at all, measured in the same run.
//!
//! - Postgres: 16 connections, each a loop of single-row `INSERT`s (autocommit, so one
//!   commit per row), into a plain (WAL-logged) table in the run's own schema: what
//!   `pgbench` with 16 clients and a one-INSERT script measures.
//! - SQLite: one connection, WAL journal and `synchronous=FULL`, one row per transaction,
//!   in a file next to the embedded pod's data directory (same disk).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use sqlx::Connection as _;

use crate::stats::Latency;

pub const PG_CONNECTIONS: usize = 16;
pub const PG_SECONDS: u64 = 5;
pub const SQLITE_SECONDS: u64 = 3;

#[derive(Debug, Clone, Serialize)]
pub struct StoreBaseline {
    /// `postgres` or `sqlite`.
    pub store: String,
    pub what: String,
    pub connections: usize,
    pub rows: u64,
    pub seconds: f64,
    pub rows_per_s: f64,
    /// Per-statement latency.
    pub latency_ms: Latency,
    pub location: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Baselines {
    pub postgres: Option<StoreBaseline>,
    pub sqlite: Option<StoreBaseline>,
    /// Why a baseline is missing.
    pub notes: Vec<String>,
}

impl StoreBaseline {
    pub fn line(&self) -> String {
        format!(
            "baseline {}: {:.0} rows/s ({} rows in {:.1}s over {} connection(s); commit latency p50 {:.2} p99 {:.2} max {:.2} ms) [{}; {}]",
            self.store,
            self.rows_per_s,
            self.rows,
            self.seconds,
            self.connections,
            self.latency_ms.p50,
            self.latency_ms.p99,
            self.latency_ms.max,
            self.what,
            self.location
        )
    }
}

/// 16 connections of single-row INSERTs for `PG_SECONDS` into `schema.lt_baseline` (created
/// here; `own_schema` also creates the schema and drops it afterwards).
pub async fn postgres(url: &str, schema: &str, own_schema: bool) -> anyhow::Result<StoreBaseline> {
    let mut admin = sqlx::PgConnection::connect(url)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    // The schema name is ours (loadtest_ + hex), so quoting is not needed.
    if own_schema {
        sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
            .execute(&mut admin)
            .await?;
    }
    let table = format!("{schema}.lt_baseline");
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (id BIGSERIAL PRIMARY KEY, conn INT NOT NULL, n BIGINT NOT NULL, body TEXT NOT NULL)"
    ))
    .execute(&mut admin)
    .await?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(PG_SECONDS);
    let insert = format!("INSERT INTO {table} (conn, n, body) VALUES ($1, $2, $3)");
    let tasks: Vec<_> = (0..PG_CONNECTIONS)
        .map(|c| {
            let url = url.to_owned();
            let insert = insert.clone();
            tokio::spawn(async move {
                let mut conn = sqlx::PgConnection::connect(&url).await?;
                let body = "x".repeat(100);
                let mut lat = Vec::new();
                let mut n = 0i64;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    sqlx::query(&insert)
                        .bind(c as i32)
                        .bind(n)
                        .bind(&body)
                        .execute(&mut conn)
                        .await?;
                    lat.push(t.elapsed().as_micros() as u64);
                    n += 1;
                }
                let _ = conn.close().await;
                anyhow::Ok(lat)
            })
        })
        .collect();
    let mut lat = Vec::new();
    let mut first_err = None;
    for t in tasks {
        match t.await {
            Ok(Ok(l)) => lat.extend(l),
            Ok(Err(e)) => first_err = first_err.or(Some(e)),
            Err(e) => first_err = first_err.or(Some(e.into())),
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let cleanup = if own_schema {
        format!("DROP SCHEMA IF EXISTS {schema} CASCADE")
    } else {
        format!("DROP TABLE IF EXISTS {table}")
    };
    let _ = sqlx::query(&cleanup).execute(&mut admin).await;
    let _ = admin.close().await;
    if let Some(e) = first_err {
        return Err(e.context("Postgres INSERT loop"));
    }
    let rows = lat.len() as u64;
    Ok(StoreBaseline {
        store: "postgres".into(),
        what: format!("{PG_CONNECTIONS} connections, single-row INSERT, autocommit"),
        connections: PG_CONNECTIONS,
        rows,
        seconds,
        rows_per_s: rows as f64 / seconds,
        latency_ms: Latency::of(&lat),
        location: format!("table {table}"),
    })
}

/// One connection, WAL + `synchronous=FULL`, one row per transaction for `SQLITE_SECONDS`,
/// in `dir` (removed afterwards).
pub async fn sqlite(dir: &Path) -> anyhow::Result<StoreBaseline> {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let file = dir.join("baseline.db");
    let opts = SqliteConnectOptions::new()
        .filename(&file)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full);
    let mut conn = sqlx::SqliteConnection::connect_with(&opts).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS lt_baseline (id INTEGER PRIMARY KEY, n INTEGER NOT NULL, body TEXT NOT NULL)",
    )
    .execute(&mut conn)
    .await?;
    let body = "x".repeat(100);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(SQLITE_SECONDS);
    let mut lat = Vec::new();
    let mut n = 0i64;
    while Instant::now() < deadline {
        let t = Instant::now();
        // Autocommit: each INSERT is its own transaction, committed with a WAL fsync.
        sqlx::query("INSERT INTO lt_baseline (n, body) VALUES (?1, ?2)")
            .bind(n)
            .bind(&body)
            .execute(&mut conn)
            .await?;
        lat.push(t.elapsed().as_micros() as u64);
        n += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    let _ = conn.close().await;
    let _ = std::fs::remove_dir_all(dir);
    let rows = lat.len() as u64;
    Ok(StoreBaseline {
        store: "sqlite".into(),
        what: "1 connection, WAL, synchronous=FULL, one row per transaction".into(),
        connections: 1,
        rows,
        seconds,
        rows_per_s: rows as f64 / seconds,
        latency_ms: Latency::of(&lat),
        location: dir.display().to_string(),
    })
}
