//! The command line: `serve`, `migrate`, tenant and key administration, default config.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use serde_json::json;
use switchyard_core::ids::now_ms;

use crate::app::{open_store, prepare_schema};
use crate::config::{Config, DEFAULT_CONFIG_TOML};

#[derive(Debug, Parser)]
#[command(
    name = "switchyard",
    version,
    about = "Multi-tenant xAgent connector server"
)]
pub struct Cli {
    /// Configuration file (TOML); also SWITCHYARD_CONFIG.
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Runs a pod.
    Serve,
    /// Applies the schema for the configured store and exits.
    Migrate,
    /// Tenant administration.
    Tenant {
        #[command(subcommand)]
        command: TenantCommand,
    },
    /// API key administration.
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
    /// Prints the full default configuration, every key documented.
    PrintDefaultConfig,
}

#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// Creates a tenant and prints its first API key alone on the last line.
    Create {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Lists tenants.
    List {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Creates another API key for a tenant (id or name).
    Create {
        tenant: String,
        #[arg(long)]
        json: bool,
    },
    /// Revokes an API key by its id.
    Revoke {
        key_id: String,
        #[arg(long)]
        json: bool,
    },
    /// Lists a tenant's keys (ids only; secrets are never stored).
    List {
        tenant: String,
        #[arg(long)]
        json: bool,
    },
}

async fn admin_store(cfg: &Config) -> anyhow::Result<std::sync::Arc<dyn switchyard_core::Store>> {
    let store = open_store(cfg).await?;
    prepare_schema(cfg, store.as_ref()).await?;
    Ok(store)
}

/// Runs an administrative command; `serve` is handled by the caller.
pub async fn admin(cfg: Config, command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve => unreachable!("serve is handled by main"),
        Command::PrintDefaultConfig => print!("{DEFAULT_CONFIG_TOML}"),
        Command::Migrate => {
            let store = open_store(&cfg).await?;
            store.migrate().await.context("applying migrations")?;
            println!("schema at version {}", store.schema_version().await?);
        }
        Command::Tenant { command } => match command {
            TenantCommand::Create { name, json } => {
                let store = admin_store(&cfg).await?;
                let (t, key) =
                    switchyard_core::engine::create_tenant(store.as_ref(), &name).await?;
                if json {
                    println!(
                        "{}",
                        json!({"tenant_id": t.id, "name": t.name, "key_id": key.id, "api_key": key.key.expose()})
                    );
                } else {
                    println!(
                        "tenant {} created with id {}; API key id {}:",
                        t.name, t.id, key.id
                    );
                    println!("{}", key.key.expose());
                }
            }
            TenantCommand::List { json } => {
                let store = admin_store(&cfg).await?;
                let tenants = store.list_tenants().await?;
                if json {
                    let rows: Vec<_> = tenants.iter().map(|t| json!({"tenant_id": t.id, "name": t.name, "created_at": t.created_at})).collect();
                    println!("{}", serde_json::Value::Array(rows));
                } else {
                    for t in tenants {
                        println!("{}\t{}", t.id, t.name);
                    }
                }
            }
        },
        Command::Key { command } => match command {
            KeyCommand::Create { tenant, json } => {
                let store = admin_store(&cfg).await?;
                let Some(t) = store.find_tenant(&tenant).await? else {
                    bail!("no tenant {tenant:?}")
                };
                let key = switchyard_core::engine::create_key(store.as_ref(), &t.id).await?;
                if json {
                    println!(
                        "{}",
                        json!({"tenant_id": t.id, "key_id": key.id, "api_key": key.key.expose()})
                    );
                } else {
                    println!("API key {} for tenant {}:", key.id, t.name);
                    println!("{}", key.key.expose());
                }
            }
            KeyCommand::Revoke { key_id, json } => {
                let store = admin_store(&cfg).await?;
                store
                    .revoke_api_key(&key_id, now_ms())
                    .await
                    .with_context(|| format!("revoking {key_id}"))?;
                if json {
                    println!("{}", json!({"key_id": key_id, "revoked": true}));
                } else {
                    println!("revoked {key_id}");
                }
            }
            KeyCommand::List { tenant, json } => {
                let store = admin_store(&cfg).await?;
                let Some(t) = store.find_tenant(&tenant).await? else {
                    bail!("no tenant {tenant:?}")
                };
                let keys = store.list_api_keys(&t.id).await?;
                if json {
                    let rows: Vec<_> = keys.iter().map(|k| json!({"key_id": k.id, "created_at": k.created_at, "revoked_at": k.revoked_at})).collect();
                    println!("{}", serde_json::Value::Array(rows));
                } else {
                    for k in keys {
                        println!(
                            "{}\t{}",
                            k.id,
                            if k.revoked_at.is_some() {
                                "revoked"
                            } else {
                                "active"
                            }
                        );
                    }
                }
            }
        },
    }
    Ok(())
}
