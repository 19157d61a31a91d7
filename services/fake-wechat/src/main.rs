//! Runs the fake iLink bot API and CDN on a port, for manual tests and the loadtest.
//!
//! `fake-wechat --listen 127.0.0.1:8082`, then point `SWITCHYARD_WECHAT__API_BASE` at
//! `http://127.0.0.1:8082` and `SWITCHYARD_WECHAT__CDN_BASE` at `http://127.0.0.1:8082/c2c`.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use switchyard_fake_wechat::FakeWechat;

#[derive(Parser)]
#[command(about = "A fake WeChat iLink bot API and media CDN")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8082")]
    listen: SocketAddr,
    /// How long an empty getupdates is held, in milliseconds.
    #[arg(long, default_value_t = 35_000)]
    long_poll_ms: u64,
    /// How long a `wait` answer of get_qrcode_status is held, in milliseconds.
    #[arg(long, default_value_t = 35_000)]
    qr_hold_ms: u64,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let fake = FakeWechat::start_on(args.listen).await?;
    fake.set_long_poll(Duration::from_millis(args.long_poll_ms));
    fake.set_qr_hold(Duration::from_millis(args.qr_hold_ms));
    println!(
        "fake wechat listening on {} (cdn {})",
        fake.base_url(),
        fake.cdn_base()
    );
    tokio::signal::ctrl_c().await?;
    Ok(())
}
