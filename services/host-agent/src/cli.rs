//! Command line of `switchyard-host`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::transport::TransportKind;

#[derive(Debug, Parser)]
#[command(
    name = "switchyard-host",
    version,
    about = "Switchyard agent host: runs local agents for Switchyard (Connector API v1)"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Enrolls this host with a one-time token from `switchyard host enroll TENANT NAME`.
    Enroll {
        /// Switchyard's base URL (the public listener, http:// or https://).
        #[arg(long)]
        server: String,
        /// The one-time enrollment token.
        #[arg(long, env = "SWITCHYARD_HOST_ENROLL_TOKEN", hide_env_values = true)]
        token: String,
        /// Where the key, certificate and identity are kept.
        #[arg(long)]
        state_dir: PathBuf,
        /// Trust only this CA certificate (PEM) for an https:// server.
        #[arg(long)]
        ca: Option<PathBuf>,
    },
    /// Connects to Switchyard and runs the configured agents.
    Run {
        /// The mTLS listener's base URL, e.g. https://127.0.0.1:8443.
        #[arg(long)]
        server: String,
        /// The state dir `enroll` filled.
        #[arg(long)]
        state_dir: PathBuf,
        /// The agents config (TOML).
        #[arg(long)]
        config: PathBuf,
        /// Data plane: a WebSocket, or the HTTPS fallback.
        #[arg(long, value_enum, default_value_t = TransportKind::Wss)]
        transport: TransportKind,
        /// Milliseconds per second of the seed's reconnect back-off (tests shorten it).
        #[arg(long, hide = true, default_value_t = 1000)]
        backoff_scale_ms: u64,
    },
}
