use anyhow::Context;
use clap::Parser;
use switchyard::cli::{Cli, Command};
use switchyard::config::Config;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if matches!(cli.command, Command::PrintDefaultConfig) {
        print!("{}", switchyard::config::default_config_toml());
        return Ok(());
    }
    let cfg = match Config::load(cli.config.as_deref()) {
        Ok(cfg) => cfg,
        Err(e) => {
            if matches!(cli.command, Command::Check { .. }) {
                println!("{:<10} {:<6} {e}", "config", "FAILED");
            }
            return Err(e.into());
        }
    };
    switchyard::telemetry::init_logging(&cfg.log);
    match cli.command {
        Command::Serve => {
            let listener = bind(&cfg.listen, "public listener (listen)").await?;
            let metrics = bind(&cfg.metrics_listen, "internal listener (metrics_listen)").await?;
            let shutdown = CancellationToken::new();
            let trigger = shutdown.clone();
            tokio::spawn(async move {
                wait_for_signal().await;
                trigger.cancel();
            });
            switchyard::run(cfg, listener, metrics, shutdown).await
        }
        other => switchyard::cli::admin(cfg, other).await,
    }
}

/// Binds `addr`; a failure names the address and the setting it came from.
async fn bind(addr: &str, what: &str) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the {what} on {addr}"))
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
