//! Runs the fake Discord on a port, for manual tests and the loadtest.
//!
//! `fake-discord --listen 127.0.0.1:8084 --bot TOKEN=ID:USERNAME --dm CHANNEL=USER_ID:NAME`

use std::net::SocketAddr;

use clap::Parser;
use switchyard_fake_discord::FakeDiscord;

#[derive(Parser)]
#[command(about = "A fake Discord REST API and Gateway")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8084")]
    listen: SocketAddr,
    /// A bot to register, `TOKEN=ID:USERNAME` (repeatable).
    #[arg(long = "bot")]
    bots: Vec<String>,
    /// A DM channel with a user, `CHANNEL_ID=USER_ID:NAME` (repeatable).
    #[arg(long = "dm")]
    dms: Vec<String>,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let fake = FakeDiscord::start_on(args.listen).await?;
    for b in &args.bots {
        match b
            .rsplit_once('=')
            .and_then(|(t, rest)| rest.split_once(':').map(|(id, name)| (t, id, name)))
        {
            Some((token, id, name)) => fake.add_bot(token, id, name),
            None => eprintln!("ignoring --bot {b:?}: expected TOKEN=ID:USERNAME"),
        }
    }
    for d in &args.dms {
        match d
            .split_once('=')
            .and_then(|(ch, rest)| rest.split_once(':').map(|(u, n)| (ch, u, n)))
        {
            Some((channel, user, name)) => {
                fake.add_user(user, name);
                fake.add_dm_channel(channel, user);
            }
            None => eprintln!("ignoring --dm {d:?}: expected CHANNEL_ID=USER_ID:NAME"),
        }
    }
    println!("fake discord listening on {}", fake.api_base());
    tokio::signal::ctrl_c().await?;
    Ok(())
}
