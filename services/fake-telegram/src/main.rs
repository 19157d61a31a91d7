//! Runs the fake Telegram Bot API on a port, for manual tests and the loadtest.
//!
//! `fake-telegram --listen 127.0.0.1:8081 --bot 123456:TOKEN=my_bot --chat 42=private:Ada`
//! then drive it through `/_fake/...` (see the crate docs).

use std::net::SocketAddr;

use clap::Parser;
use switchyard_fake_telegram::FakeTelegram;

#[derive(Parser)]
#[command(about = "A fake Telegram Bot API server")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8081")]
    listen: SocketAddr,
    /// A bot to register, `TOKEN=USERNAME` (repeatable).
    #[arg(long = "bot")]
    bots: Vec<String>,
    /// A chat to register, `CHAT_ID=TYPE:TITLE` (repeatable).
    #[arg(long = "chat")]
    chats: Vec<String>,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let fake = FakeTelegram::start_on(args.listen).await?;
    for b in &args.bots {
        match b.rsplit_once('=') {
            Some((token, username)) => {
                fake.add_bot(token, username);
            }
            None => eprintln!("ignoring --bot {b:?}: expected TOKEN=USERNAME"),
        }
    }
    for c in &args.chats {
        let parsed = c.split_once('=').and_then(|(id, rest)| {
            let (kind, title) = rest.split_once(':').unwrap_or((rest, ""));
            id.parse::<i64>()
                .ok()
                .map(|id| (id, kind.to_owned(), title.to_owned()))
        });
        match parsed {
            Some((id, kind, title)) => fake.add_chat(id, &kind, &title),
            None => eprintln!("ignoring --chat {c:?}: expected CHAT_ID=TYPE:TITLE"),
        }
    }
    println!("fake telegram listening on {}", fake.base_url());
    tokio::signal::ctrl_c().await?;
    Ok(())
}
