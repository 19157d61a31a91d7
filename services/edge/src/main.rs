use clap::Parser;
use switchyard::cli::{Cli, Command};
use switchyard::config::Config;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if matches!(cli.command, Command::PrintDefaultConfig) {
        print!("{}", switchyard::config::DEFAULT_CONFIG_TOML);
        return Ok(());
    }
    let cfg = Config::load(cli.config.as_deref())?;
    switchyard::telemetry::init_logging(&cfg.log);
    match cli.command {
        Command::Serve => {
            let listener = tokio::net::TcpListener::bind(&cfg.listen).await?;
            let metrics = tokio::net::TcpListener::bind(&cfg.metrics_listen).await?;
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
