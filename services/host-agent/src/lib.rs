//! `switchyard-host`, the agent host side of Connector API v1.
//!
//! Layers, bottom up: pure rules ([`config`], [`risky`], [`lines`], [`metrics`], [`events`],
//! [`requests`]); the runs and their processes ([`adapter`], [`process`], [`runs`]); the
//! connection-independent [`outbox`]; frames <-> messages ([`transport`]); one connection's
//! protocol ([`session`]); the reconnect loop ([`agent`]); and the two commands
//! ([`enroll`], [`run`]). Every message is a `switchyard_protocol::hosts` type.

pub mod adapter;
pub mod agent;
pub mod cli;
pub mod config;
pub mod enroll;
pub mod events;
pub mod http;
pub mod ids;
pub mod lines;
pub mod metrics;
pub mod outbox;
pub mod process;
pub mod requests;
pub mod risky;
pub mod runs;
pub mod session;
pub mod state;
pub mod token;
pub mod transport;

use std::path::PathBuf;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

/// What `switchyard-host run` was given.
pub struct RunArgs {
    pub server: String,
    pub state_dir: PathBuf,
    pub config: PathBuf,
    pub transport: transport::TransportKind,
    pub backoff_scale_ms: u64,
}

/// `switchyard-host run`: loads the enrollment and config, then runs until `shutdown`.
pub async fn run(args: RunArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let server = url::Url::parse(&args.server)
        .ok()
        .filter(|u| u.scheme() == "https" && u.has_host())
        .with_context(|| {
            format!(
                "--server must be the https:// URL of the mTLS listener (e.g. https://127.0.0.1:8443), not {:?}",
                args.server
            )
        })?;
    let enrollment = state::Enrollment::load(&args.state_dir)?;
    let config = config::HostConfig::load(&args.config, &args.state_dir)?;
    let tls = switchyard_hosts_tls::client::client_config(
        &enrollment.ca_pem,
        Some(&enrollment.cert_pem),
        Some(&enrollment.key_pem),
    )
    .context("cannot use the certificate and key in the state dir")?;
    tracing::info!(
        host_id = enrollment.identity.host_id,
        host_name = enrollment.identity.name,
        server = %server,
        transport = ?args.transport,
        agents = config.agents.len(),
        "starting"
    );
    let mut opts = agent::AgentOptions::new(
        server,
        http::TlsMode::Mutual(tls),
        enrollment.identity.host_id.clone(),
        config,
        args.state_dir,
    );
    opts.transport = args.transport;
    opts.backoff_scale_ms = args.backoff_scale_ms;
    agent::Agent::new(opts)?.run(shutdown).await?;
    Ok(())
}
