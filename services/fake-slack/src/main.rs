//! Runs the fake Slack on a port, for manual tests and the loadtest.
//!
//! `fake-slack --listen 127.0.0.1:8084 --app A01=T01=xoxb-1=xapp-1=SECRET=My Bot`; the Web
//! API is then at `http://127.0.0.1:8084/api`.

use std::net::SocketAddr;

use clap::Parser;
use switchyard_fake_slack::{FakeSlack, NewApp};

#[derive(Parser)]
#[command(about = "A fake Slack (Web API, Socket Mode, Events API)")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8084")]
    listen: SocketAddr,
    /// An app, `APP_ID=TEAM_ID=BOT_TOKEN=APP_TOKEN=SIGNING_SECRET=BOT NAME` (repeatable).
    #[arg(long = "app")]
    apps: Vec<String>,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let fake = FakeSlack::start_on(args.listen).await?;
    for a in &args.apps {
        let p: Vec<&str> = a.splitn(6, '=').collect();
        if p.len() != 6 {
            eprintln!(
                "ignoring --app {a:?}: expected APP_ID=TEAM_ID=BOT_TOKEN=APP_TOKEN=SECRET=NAME"
            );
            continue;
        }
        fake.add_app(NewApp {
            app_id: p[0].into(),
            team_id: p[1].into(),
            team_name: "Fake".into(),
            bot_token: p[2].into(),
            app_token: Some(p[3].to_owned()).filter(|t| !t.is_empty()),
            signing_secret: p[4].into(),
            bot_name: p[5].into(),
            bot_user_id: format!("U{}", p[0].trim_start_matches('A')),
            bot_id: format!("B{}", p[0].trim_start_matches('A')),
        });
    }
    println!("fake slack listening on {}", fake.base_url());
    tokio::signal::ctrl_c().await?;
    Ok(())
}
