//! `switchyard-host run`: connect, run a session, reconnect with the seed's back-off, for
//! as long as the process lives.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use switchyard_protocol::hosts::reconnect_delay;
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::config::HostConfig;
use crate::http::{TlsMode, Transfers, server_client};
use crate::outbox::Outbox;
use crate::process::RunEnv;
use crate::runs::RunManager;
use crate::session::{Host, Pairing, SessionEnd, run_session};
use crate::token::TokenSource;
use crate::transport::{Dialer, TransportKind};

/// The seed's back-off, scaled: `scale_ms` milliseconds per second of the seed (1000 = the
/// seed's 1, 2, 4, 8, 16, then 30 s).
pub fn scaled_delay(attempt: u32, scale_ms: u64) -> Duration {
    let seed = reconnect_delay(attempt);
    Duration::from_micros((seed.as_millis() as u64).saturating_mul(scale_ms))
}

/// Everything a host agent needs; the CLI builds it from the state dir and flags, tests
/// build it by hand.
pub struct AgentOptions {
    /// The listener base, e.g. `https://127.0.0.1:8443`.
    pub server: Url,
    pub transport: TransportKind,
    pub tls: TlsMode,
    /// The host id (`register.connector_id`).
    pub connector_id: String,
    pub hostname: String,
    pub config: HostConfig,
    pub state_dir: PathBuf,
    pub backoff_scale_ms: u64,
    pub event_capacity: usize,
    /// Per-attempt answer deadline of `upload_artifact`/`download_artifact`.
    pub request_timeout: Duration,
    /// Overrides `PATH` when looking up adapter binaries.
    pub search_path: Option<OsString>,
}

impl AgentOptions {
    /// Defaults for everything but what identifies the host and its server.
    pub fn new(
        server: Url,
        tls: TlsMode,
        connector_id: String,
        config: HostConfig,
        state_dir: PathBuf,
    ) -> Self {
        Self {
            server,
            transport: TransportKind::Wss,
            tls,
            connector_id,
            hostname: crate::ids::hostname(),
            config,
            state_dir,
            backoff_scale_ms: 1000,
            event_capacity: crate::events::DEFAULT_CAPACITY,
            request_timeout: Duration::from_secs(60),
            search_path: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot build the HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    #[error(transparent)]
    Refused(crate::transport::ConnectError),
}

pub struct Agent {
    host: Host,
    dialer: Dialer,
    backoff_scale_ms: u64,
    kill_grace: Duration,
}

impl Agent {
    pub fn new(opts: AgentOptions) -> Result<Self, AgentError> {
        let http = server_client(&opts.tls)?;
        let tokens = Arc::new(TokenSource::new(http.clone(), &opts.server));
        let (outbox, control) = Outbox::new(opts.event_capacity);
        let env = Arc::new(RunEnv {
            state_dir: opts.state_dir.clone(),
            kill_grace: opts.config.kill_grace,
            outbox: outbox.clone(),
            transfers: Transfers::new(&opts.server, http.clone())?,
            request_timeout: opts.request_timeout,
        });
        let runs = RunManager::new(&opts.config.agents, env, opts.search_path);
        let kill_grace = opts.config.kill_grace;
        let host = Host::new(
            opts.connector_id,
            opts.hostname,
            env!("CARGO_PKG_VERSION").to_owned(),
            opts.config,
            runs,
            outbox,
            control,
        );
        Ok(Self {
            host,
            dialer: Dialer::new(opts.server, opts.transport, opts.tls, http, tokens),
            backoff_scale_ms: opts.backoff_scale_ms,
            kill_grace,
        })
    }

    /// The pairing code, once the server has given one.
    pub fn pairing(&self) -> Pairing {
        self.host.pairing.clone()
    }

    pub fn runs(&self) -> Arc<RunManager> {
        self.host.runs.clone()
    }

    /// Connects and reconnects until `shutdown`; then stops the runs. Fails only when the
    /// server refuses the host's identity for good (revoked, unknown certificate).
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<(), AgentError> {
        let mut attempt = 0u32;
        let result = loop {
            if shutdown.is_cancelled() {
                break Ok(());
            }
            match self.dialer.connect().await {
                Ok(conn) => match run_session(&mut self.host, conn, &shutdown).await {
                    SessionEnd::Shutdown => break Ok(()),
                    SessionEnd::Lost { registered, reason } => {
                        if registered {
                            attempt = 0;
                        }
                        tracing::warn!(reason, "connection lost");
                    }
                },
                Err(e) if e.is_permanent() => {
                    tracing::error!(error = %e, "the server refuses this host; giving up");
                    break Err(AgentError::Refused(e));
                }
                Err(e) => tracing::warn!(error = %e, "cannot connect"),
            }
            let delay = scaled_delay(attempt, self.backoff_scale_ms);
            attempt = attempt.saturating_add(1);
            tracing::info!(delay_ms = delay.as_millis() as u64, attempt, "reconnecting");
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = shutdown.cancelled() => break Ok(()),
            }
        };
        self.host
            .runs
            .shutdown(self.kill_grace + Duration::from_secs(2))
            .await;
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_follows_the_seed_and_scales() {
        let seed: Vec<u64> = (0..8)
            .map(|a| scaled_delay(a, 1000).as_millis() as u64)
            .collect();
        assert_eq!(seed, [1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]);
        let fast: Vec<u64> = (0..7)
            .map(|a| scaled_delay(a, 50).as_millis() as u64)
            .collect();
        assert_eq!(fast, [50, 100, 200, 400, 800, 1500, 1500]);
        assert_eq!(scaled_delay(0, 0), Duration::ZERO);
    }
}
