//! Runs the fake Feishu Open Platform on a port, for manual tests and the loadtest.
//!
//! `fake-feishu --listen 127.0.0.1:8082 --app cli_a1=SECRET=My Bot`, then drive it through
//! `/_fake/...` (see the crate docs).

use std::net::SocketAddr;

use clap::Parser;
use switchyard_fake_feishu::FakeFeishu;

#[derive(Parser)]
#[command(about = "A fake Feishu / Lark Open Platform server")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8082")]
    listen: SocketAddr,
    /// An app to register, `APP_ID=APP_SECRET=BOT NAME` (repeatable).
    #[arg(long = "app")]
    apps: Vec<String>,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let fake = FakeFeishu::start_on(args.listen).await?;
    for a in &args.apps {
        let mut parts = a.splitn(3, '=');
        match (parts.next(), parts.next()) {
            (Some(id), Some(secret)) => {
                fake.add_app(id, secret, parts.next().unwrap_or("Bot"));
            }
            _ => eprintln!("ignoring --app {a:?}: expected APP_ID=APP_SECRET=NAME"),
        }
    }
    println!("fake feishu listening on {}", fake.base_url());
    tokio::signal::ctrl_c().await?;
    Ok(())
}
