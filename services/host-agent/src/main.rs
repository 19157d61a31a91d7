use clap::Parser;
use switchyard_host_agent::cli::{Cli, Command};
use switchyard_host_agent::token::Secret;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}`: the whole chain on one line, without a backtrace.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Enroll {
            server,
            token,
            state_dir,
            ca,
        } => {
            let id =
                switchyard_host_agent::enroll::enroll(switchyard_host_agent::enroll::EnrollArgs {
                    server,
                    token: Secret::new(token),
                    state_dir: state_dir.clone(),
                    ca,
                    csr_name: switchyard_host_agent::ids::hostname(),
                })
                .await?;
            println!(
                "enrolled host {} ({}) of tenant {}; state in {}",
                id.host_id,
                id.name,
                id.tenant_id,
                state_dir.display()
            );
            Ok(())
        }
        Command::Run {
            server,
            state_dir,
            config,
            transport,
            backoff_scale_ms,
        } => {
            let shutdown = CancellationToken::new();
            let trigger = shutdown.clone();
            tokio::spawn(async move {
                wait_for_signal().await;
                trigger.cancel();
            });
            switchyard_host_agent::run(
                switchyard_host_agent::RunArgs {
                    server,
                    state_dir,
                    config,
                    transport,
                    backoff_scale_ms,
                },
                shutdown,
            )
            .await
        }
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
