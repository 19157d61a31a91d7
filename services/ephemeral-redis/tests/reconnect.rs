//! The store survives Redis going away: calls fail with Unavailable while it is down and
//! succeed again once it is back, without building a new store. Runs a private redis-server
//! (the machine's binary) on a free port, so the shared server is never disturbed.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use switchyard_core::{Ephemeral, ErrorKind};
use switchyard_ephemeral_redis::RedisEphemeral;

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
    let port_arg = port.to_string();
    // No persistence: the private server must not write dump files anywhere.
    let args = [
        "--bind",
        "127.0.0.1",
        "--port",
        &port_arg,
        "--save",
        "",
        "--appendonly",
        "no",
    ];
    let child = [
        "redis-server",
        "/usr/bin/redis-server",
        "/usr/sbin/redis-server",
    ]
    .iter()
    .find_map(|bin| {
        Command::new(bin)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()
    })
    .expect("redis-server binary (Debian package redis-server)");
    let server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "private redis-server did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

#[tokio::test]
async fn reconnects_after_server_restart() {
    let port = free_port();
    let server = start(port);
    let e = RedisEphemeral::connect(&format!("redis://127.0.0.1:{port}"), "reconnect")
        .await
        .expect("connect");
    e.ping().await.expect("ping");

    drop(server);
    let err = e.ping().await.expect_err("server is down");
    assert_eq!(err.kind, ErrorKind::Unavailable, "{err}");

    let _server = start(port);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match e.ping().await {
            Ok(()) => break,
            Err(err) => {
                assert_eq!(err.kind, ErrorKind::Unavailable, "{err}");
                assert!(Instant::now() < deadline, "reconnected within 20s: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let k = "after-restart";
    assert!(
        e.put_if_absent(k, b"v".to_vec(), Duration::from_secs(10))
            .await
            .expect("write after reconnect")
    );
}
