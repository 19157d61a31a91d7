//! Every listener of the real pod runs the same accept loop as the public one (header
//! timeout, connection cap): the internal listener (`/metrics`, probes), the admin listener
//! (console, operator API) and the hosts mTLS listener.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use switchyard::config::Dur;
use switchyard_e2e::{Pod, PodOptions, eventually};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads until the peer closes or `within` passes; returns what was read and whether the
/// peer closed.
async fn read_until_closed(s: &mut TcpStream, within: Duration) -> (String, bool) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Err(_) => return (String::from_utf8_lossy(&buf).into_owned(), false),
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&buf).into_owned(), true),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn addr(url: &str) -> SocketAddr {
    url.trim_start_matches("http://")
        .trim_start_matches("https://")
        .parse()
        .expect("socket address")
}

/// Slow-header clients (one header line every 300 ms, never the blank line) on `target`:
/// how many are still open after `after`.
async fn slow_headers_still_open(target: SocketAddr, clients: usize, after: Duration) -> usize {
    let mut socks = Vec::new();
    for _ in 0..clients {
        let mut s = TcpStream::connect(target).await.expect("connect");
        s.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n")
            .await
            .expect("write");
        socks.push(s);
    }
    let start = Instant::now();
    let mut i = 0u32;
    while start.elapsed() < after {
        tokio::time::sleep(Duration::from_millis(300)).await;
        i += 1;
        for s in &mut socks {
            // A write to a closed socket fails sooner or later; either way, keep trickling.
            let _ = s.write_all(format!("X-Slow-{i}: 1\r\n").as_bytes()).await;
        }
    }
    let mut open = 0;
    for s in &mut socks {
        let (_, closed) = read_until_closed(s, Duration::from_millis(200)).await;
        if !closed {
            open += 1;
        }
    }
    open
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_listener_cuts_slow_headers() {
    let pod = Pod::start(
        PodOptions::default().with(|c| c.limits.header_read_timeout = Dur(Duration::from_secs(1))),
    )
    .await;
    let open = slow_headers_still_open(addr(&pod.metrics_url()), 10, Duration::from_secs(4)).await;
    println!("internal listener: {open} of 10 slow-header connections open after 4 s");
    assert_eq!(
        open, 0,
        "the internal listener keeps slow-header connections past the 1 s header timeout"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_listener_caps_connections() {
    let pod = Pod::start(PodOptions::default().with(|c| c.limits.max_connections = 4)).await;
    let target = addr(&pod.metrics_url());
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(target).await.expect("connect"));
    }
    // Let the accept loop take the four.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut over = TcpStream::connect(target).await.expect("connect");
    let _ = over
        .write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await;
    let (answer, closed) = read_until_closed(&mut over, Duration::from_secs(3)).await;
    assert!(
        answer.starts_with("HTTP/1.1 503") && closed,
        "a fifth connection over a cap of 4 is answered 503 and closed, got {answer:?}"
    );
    assert!(answer.contains("overloaded"), "{answer}");
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_tls_listener_caps_connections() {
    let pod = Pod::start(PodOptions::default().with(|c| c.limits.max_connections = 4)).await;
    let target: SocketAddr = pod.config().hosts_tls_listen.parse().expect("tls addr");
    // The pod binds the mTLS listener once its backends are up.
    eventually(
        Duration::from_secs(20),
        "the mTLS listener",
        || async move { TcpStream::connect(target).await.ok().map(drop) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        // No handshake: each holds a slot until the handshake timeout.
        held.push(TcpStream::connect(target).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut over = TcpStream::connect(target).await.expect("connect");
    let start = Instant::now();
    let (_, closed) = read_until_closed(&mut over, Duration::from_secs(3)).await;
    assert!(
        closed,
        "a fifth connection over a cap of 4 is closed at once, not held for the handshake timeout"
    );
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    drop(held);
}
