//! The command line: `serve`, `migrate`, tenant and key administration, default config.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use serde_json::json;
use switchyard_core::ids::now_ms;

use crate::app::{open_store, prepare_schema};
use crate::config::{Config, default_config_toml};

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
    /// Agent hosts (Connector API v1).
    Host {
        #[command(subcommand)]
        command: HostCommand,
    },
    /// Approvals requested by host agents; decided by people only.
    Approval {
        #[command(subcommand)]
        command: ApprovalCommand,
    },
    /// Prints a message's delivery journal: each step with its time (Unix ms), pod and
    /// detail, oldest first.
    Trace {
        message_id: String,
        /// One JSON object with the steps.
        #[arg(long)]
        json: bool,
    },
    /// Prints the full default configuration, every key documented.
    PrintDefaultConfig,
    /// Validates the configuration and reaches every configured backend (store, bus,
    /// ephemeral state, files), one line each; exits non-zero when one fails. Changes
    /// nothing.
    Check {
        /// How long each backend may take to answer.
        #[arg(long, default_value = "10s", value_parser = parse_timeout)]
        timeout: std::time::Duration,
    },
}

fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    crate::config::parse_duration(s)
        .ok_or_else(|| format!("invalid duration {s:?}; use 500ms, 30s, 5m or 1h"))
}

#[derive(Debug, Subcommand)]
pub enum HostCommand {
    /// Creates a host of a tenant (id or name) and prints its one-time enrollment token
    /// alone on the last line.
    Enroll {
        tenant: String,
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Lists a tenant's hosts.
    List {
        tenant: String,
        #[arg(long)]
        json: bool,
    },
    /// Revokes a host: its connections close, its runs fail, its next connection is refused.
    Revoke {
        host_id: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ApprovalCommand {
    /// Pending approvals of a tenant (id or name), one a line.
    List {
        tenant: String,
        #[arg(long)]
        json: bool,
    },
    /// Grants an approval as NAME.
    Grant {
        approval_id: String,
        #[arg(long)]
        by: String,
        #[arg(long)]
        json: bool,
    },
    /// Denies an approval as NAME.
    Deny {
        approval_id: String,
        #[arg(long)]
        by: String,
        #[arg(long)]
        reason: Option<String>,
        #[arg(long)]
        json: bool,
    },
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
    /// Shows a tenant's quotas, or sets its own (0 = unlimited); flags not given keep their
    /// value. Pods apply a change within quotas.refresh_interval.
    Quota(QuotaArgs),
}

#[derive(Debug, clap::Args)]
pub struct QuotaArgs {
    tenant: String,
    /// Live xAgent sockets, cluster-wide.
    #[arg(long)]
    sockets: Option<u64>,
    /// Channels, cluster-wide.
    #[arg(long)]
    channels: Option<u64>,
    /// Bytes of unexpired files.
    #[arg(long)]
    stored_bytes: Option<u64>,
    /// Work requests per second on each pod.
    #[arg(long)]
    requests_per_second: Option<u64>,
    /// Drops the tenant's own values first (back to the deployment defaults).
    #[arg(long)]
    reset: bool,
    #[arg(long)]
    json: bool,
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

async fn tenant_id(store: &dyn switchyard_core::Store, tenant: &str) -> anyhow::Result<String> {
    match store.find_tenant(tenant).await? {
        Some(t) => Ok(t.id),
        None => bail!("no tenant {tenant:?}"),
    }
}

fn approval_line(a: &switchyard_core::hoststore::ApprovalRecord) -> serde_json::Value {
    json!({"approval_id": a.id, "host_id": a.host_id, "run_id": a.run_id, "action": a.action,
        "risk_level": a.risk_level, "status": a.status.as_str(), "decided_by": a.decided_by,
        "reason": a.reason, "created_at": a.created_at, "expires_at": a.expires_at})
}

async fn host_admin(cfg: Config, command: HostCommand) -> anyhow::Result<()> {
    let hosts = crate::app::admin_hosts(&cfg).await?;
    let result = host_command(&hosts, command).await;
    // The doorbells rung above must leave before the process exits.
    flush_bus(&hosts).await;
    result
}

async fn flush_bus(hosts: &switchyard_core::hosts::Hosts) {
    if let Err(e) = hosts.hub().bus().flush().await {
        eprintln!(
            "warning: the bus did not confirm the notices ({e}); pods pick the change up on their next tick"
        );
    }
}

async fn host_command(
    hosts: &switchyard_core::hosts::Hosts,
    command: HostCommand,
) -> anyhow::Result<()> {
    let store = hosts.hub().store().clone();
    match command {
        HostCommand::Enroll { tenant, name, json } => {
            let tid = tenant_id(store.as_ref(), &tenant).await?;
            let e = hosts
                .enroll(&tid, &name)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            if json {
                println!(
                    "{}",
                    json!({"host_id": e.host.id, "tenant_id": tid, "name": e.host.name, "token": e.token, "expires_at": e.expires_at})
                );
            } else {
                println!(
                    "host {} ({}) created; one-time enrollment token:",
                    e.host.name, e.host.id
                );
                println!("{}", e.token);
            }
        }
        HostCommand::List { tenant, json } => {
            let tid = tenant_id(store.as_ref(), &tenant).await?;
            let list = store.list_hosts(&tid).await?;
            if json {
                let rows: Vec<_> = list.iter().map(|h| json!({"host_id": h.id, "name": h.name, "status": h.status.as_str(), "hostname": h.hostname, "last_seen_at": h.last_seen_at, "revoked_at": h.revoked_at})).collect();
                println!("{}", serde_json::Value::Array(rows));
            } else {
                for h in list {
                    println!("{}\t{}\t{}", h.id, h.name, h.status.as_str());
                }
            }
        }
        HostCommand::Revoke { host_id, json } => {
            let h = hosts
                .revoke(&host_id)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            if json {
                println!("{}", json!({"host_id": h.id, "revoked": true}));
            } else {
                println!("revoked {}", h.id);
            }
        }
    }
    Ok(())
}

async fn approval_admin(cfg: Config, command: ApprovalCommand) -> anyhow::Result<()> {
    let hosts = crate::app::admin_hosts(&cfg).await?;
    let result = approval_command(&hosts, command).await;
    flush_bus(&hosts).await;
    result
}

async fn approval_command(
    hosts: &switchyard_core::hosts::Hosts,
    command: ApprovalCommand,
) -> anyhow::Result<()> {
    let store = hosts.hub().store().clone();
    let (id, grant, by, reason, json) = match command {
        ApprovalCommand::List { tenant, json } => {
            let tid = tenant_id(store.as_ref(), &tenant).await?;
            let list = store
                .list_approvals(
                    &tid,
                    Some(switchyard_core::hoststore::ApprovalStatus::Pending),
                )
                .await?;
            if json {
                println!(
                    "{}",
                    serde_json::Value::Array(list.iter().map(approval_line).collect())
                );
            } else {
                for a in list {
                    println!("{}\t{}\t{}\t{}", a.id, a.run_id, a.risk_level, a.action);
                }
            }
            return Ok(());
        }
        ApprovalCommand::Grant {
            approval_id,
            by,
            json,
        } => (approval_id, true, by, None, json),
        ApprovalCommand::Deny {
            approval_id,
            by,
            reason,
            json,
        } => (approval_id, false, by, reason, json),
    };
    let a = hosts
        .decide(&id, None, grant, &by, reason.as_deref())
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if json {
        println!("{}", approval_line(&a));
    } else {
        println!("{} {} by {}", a.id, a.status.as_str(), by);
    }
    Ok(())
}

/// `switchyard tenant quota`: shows, and when asked sets, a tenant's own quotas.
async fn tenant_quota(cfg: &Config, args: QuotaArgs) -> anyhow::Result<()> {
    let QuotaArgs {
        tenant,
        sockets,
        channels,
        stored_bytes,
        requests_per_second,
        reset,
        json,
    } = args;
    let store = admin_store(cfg).await?;
    let Some(t) = store.find_tenant(&tenant).await? else {
        bail!("no tenant {tenant:?}")
    };
    let current = store
        .tenant_quotas()
        .await?
        .into_iter()
        .find(|q| q.tenant_id == t.id)
        .filter(|_| !reset)
        .unwrap_or_else(|| switchyard_core::model::TenantQuota {
            tenant_id: t.id.clone(),
            ..Default::default()
        });
    let changed = reset
        || sockets.is_some()
        || channels.is_some()
        || stored_bytes.is_some()
        || requests_per_second.is_some();
    let q = switchyard_core::model::TenantQuota {
        sockets: sockets.or(current.sockets),
        channels: channels.or(current.channels),
        stored_bytes: stored_bytes.or(current.stored_bytes),
        requests_per_second: requests_per_second.or(current.requests_per_second),
        updated_at: now_ms(),
        ..current
    };
    if changed {
        store.set_tenant_quota(&q).await?;
    }
    let eff = cfg.quotas.values().with(&q);
    let rows = [
        ("sockets", eff.sockets, q.sockets.is_some()),
        ("channels", eff.channels, q.channels.is_some()),
        ("stored_bytes", eff.stored_bytes, q.stored_bytes.is_some()),
        (
            "requests_per_second",
            eff.requests_per_second,
            q.requests_per_second.is_some(),
        ),
    ];
    if json {
        let mut obj = serde_json::Map::new();
        obj.insert("tenant_id".into(), json!(t.id));
        for (name, value, own) in rows {
            obj.insert(name.into(), json!({"value": value, "tenant_own": own}));
        }
        println!("{}", serde_json::Value::Object(obj));
    } else {
        println!("quotas of tenant {} (0 = unlimited):", t.name);
        for (name, value, own) in rows {
            let from = if own { "tenant" } else { "default" };
            println!("{name}\t{value}\t{from}");
        }
    }
    Ok(())
}

/// Runs an administrative command; `serve` is handled by the caller.
pub async fn admin(cfg: Config, command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve => unreachable!("serve is handled by main"),
        Command::PrintDefaultConfig => print!("{}", default_config_toml()),
        Command::Check { timeout } => {
            println!(
                "{:<10} {:<6} configuration loaded and validated",
                "config", "ok"
            );
            let lines = crate::check::run(&cfg, timeout).await;
            for l in &lines {
                println!("{l}");
            }
            let failed: Vec<&str> = lines.iter().filter(|l| !l.ok).map(|l| l.name).collect();
            if !failed.is_empty() {
                bail!("check failed: {}", failed.join(", "));
            }
        }
        Command::Host { command } => host_admin(cfg, command).await?,
        Command::Approval { command } => approval_admin(cfg, command).await?,
        Command::Trace { message_id, json } => {
            let store = admin_store(&cfg).await?;
            let steps = store.journal_for_message(&message_id, 1000).await?;
            if steps.is_empty() {
                bail!("no journal steps for message {message_id:?} (never recorded, or purged)");
            }
            if json {
                let rows: Vec<_> = steps
                    .iter()
                    .map(|e| json!({"at": e.at, "step": e.step, "detail": e.detail, "pod_id": e.pod_id, "tenant_id": e.tenant_id, "channel_id": e.channel_id}))
                    .collect();
                println!("{}", json!({"message_id": message_id, "steps": rows}));
            } else {
                for e in &steps {
                    println!(
                        "{}\t{}\t{}\t{}\t{}",
                        e.at, e.step, e.pod_id, e.channel_id, e.detail
                    );
                }
            }
        }
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
            TenantCommand::Quota(args) => tenant_quota(&cfg, args).await?,
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
