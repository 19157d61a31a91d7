//! The bus survives its server going away: it reports not connected, reconnects by itself
//! once the server is back, and restores its subscriptions. Runs a private nats-server (the
//! machine's binary) on a free port, so the shared server is never disturbed.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use switchyard_bus_nats::NatsBus;
use switchyard_core::Bus;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn start(port: u16) -> Server {
    let child = [
        "nats-server",
        "/usr/sbin/nats-server",
        "/usr/bin/nats-server",
    ]
    .iter()
    .find_map(|bin| {
        Command::new(bin)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()
    })
    .expect("nats-server binary (Debian package nats-server)");
    let server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "private nats-server did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

async fn wait_until(what: &str, timeout: Duration, f: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "{what} within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn reconnects_and_resubscribes() {
    let port = free_port();
    let server = start(port);
    let bus = NatsBus::connect(&format!("nats://127.0.0.1:{port}"), "reconnect")
        .await
        .expect("connect");
    let mut sub = bus.subscribe("t").await.expect("subscribe");
    bus.publish("t", b"before".to_vec()).await.expect("publish");
    let got = tokio::time::timeout(Duration::from_secs(5), sub.next())
        .await
        .expect("delivery");
    assert_eq!(got, Some(b"before".to_vec()));

    drop(server);
    wait_until("disconnect noticed", Duration::from_secs(10), || {
        !bus.is_connected()
    })
    .await;

    let _server = start(port);
    wait_until("reconnected", Duration::from_secs(20), || {
        bus.is_connected()
    })
    .await;

    // The restored subscription may lag the reconnect by a moment; a doorbell is only a hint,
    // so retrying the publish is what a real sender's sweep would do too.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        bus.publish("t", b"after".to_vec())
            .await
            .expect("publish after reconnect");
        match tokio::time::timeout(Duration::from_millis(500), sub.next()).await {
            Ok(Some(m)) => {
                assert_eq!(m, b"after".to_vec());
                break;
            }
            Ok(None) => panic!("subscription ended across a reconnect"),
            Err(_) => assert!(
                Instant::now() < deadline,
                "subscription restored after reconnect"
            ),
        }
    }
}
