//! The console (`/console`) and the operator API (`/admin/v1`): with an admin listener
//! (admin_listen) they are served there only, and the public listener, which ingresses
//! expose, and the internal one, which monitoring reaches, answer 404 for them; without one
//! they are on the internal listener (CONTRACT.md). `/metrics` and the probes stay on the
//! internal listener.

use std::net::SocketAddr;
use std::time::Duration;

use switchyard::config::{Config, SecretList};
use switchyard_core::crypto::Secret;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "e4a1c7f3b9d2e6a0c8f5b1d7e3a9c2f6b0d8e4a1c7f3b9d2e6a0c8f5b1d7e3a9";

/// One HTTP/1.1 GET; returns the status code and the body.
async fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .expect("write");
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.expect("read");
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_and_operator_api_are_served_on_the_admin_listener_only() {
    let dir = tempfile::tempdir().unwrap();
    let public = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let internal = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (public_addr, internal_addr) =
        (public.local_addr().unwrap(), internal.local_addr().unwrap());
    let admin_addr: SocketAddr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let cfg = Config {
        data_dir: dir.path().join("data"),
        listen: public_addr.to_string(),
        metrics_listen: internal_addr.to_string(),
        admin_listen: admin_addr.to_string(),
        hosts_tls_listen: String::new(),
        operator_tokens: SecretList(vec![Secret::new(format!("alice={TOKEN}"))]),
        ..Config::default()
    };
    let shutdown = CancellationToken::new();
    let pod = tokio::spawn(switchyard::run(cfg, public, internal, shutdown.clone()));

    // Up once the public listener serves a Card.
    let mut up = false;
    for _ in 0..100 {
        if get(public_addr, "/webhook/connector-card.json", None)
            .await
            .0
            == 200
        {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(up, "the pod did not start");

    let path = "/admin/v1/hosts?tenant=nobody";
    // Public listener: not there at all, even with a valid operator token.
    assert_eq!(get(public_addr, path, Some(TOKEN)).await.0, 404);
    assert_eq!(
        get(
            public_addr,
            "/admin/v1/approvals?tenant=nobody",
            Some(TOKEN)
        )
        .await
        .0,
        404
    );
    // Internal listener: monitoring's reach opens neither the API nor the console.
    assert_eq!(get(internal_addr, path, Some(TOKEN)).await.0, 404);
    assert_eq!(get(internal_addr, "/console/login", None).await.0, 404);
    // Admin listener: served, and still behind the operator token.
    let (status, body) = get(admin_addr, path, Some(TOKEN)).await;
    assert_eq!((status, body.trim()), (200, "[]"));
    assert_eq!(get(admin_addr, path, None).await.0, 401);
    assert_eq!(
        get(admin_addr, path, Some("wrong-token-0123456")).await.0,
        401
    );
    assert_eq!(get(admin_addr, "/console/login", None).await.0, 200);
    // The metrics and probes are on the internal listener only.
    assert_eq!(get(internal_addr, "/livez", None).await.0, 200);
    assert_eq!(get(internal_addr, "/metrics", None).await.0, 200);
    assert_eq!(get(admin_addr, "/metrics", None).await.0, 404);

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), pod)
        .await
        .expect("drains")
        .unwrap()
        .unwrap();
}

/// Without `admin_listen`, the console and the operator API are where CONTRACT.md puts them:
/// on the internal listener, behind the operator token, never on the public one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_admin_listener_they_stay_on_the_internal_listener() {
    let dir = tempfile::tempdir().unwrap();
    let public = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let internal = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (public_addr, internal_addr) =
        (public.local_addr().unwrap(), internal.local_addr().unwrap());
    let cfg = Config {
        data_dir: dir.path().join("data"),
        listen: public_addr.to_string(),
        metrics_listen: internal_addr.to_string(),
        hosts_tls_listen: String::new(),
        operator_tokens: SecretList(vec![Secret::new(format!("alice={TOKEN}"))]),
        ..Config::default()
    };
    assert_eq!(cfg.admin_listen, "", "the default has no admin listener");
    let shutdown = CancellationToken::new();
    let pod = tokio::spawn(switchyard::run(cfg, public, internal, shutdown.clone()));
    let mut up = false;
    for _ in 0..100 {
        if get(internal_addr, "/livez", None).await.0 == 200 {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(up, "the pod did not start");

    let path = "/admin/v1/hosts?tenant=nobody";
    assert_eq!(get(public_addr, path, Some(TOKEN)).await.0, 404);
    assert_eq!(get(public_addr, "/console/login", None).await.0, 404);
    let (status, body) = get(internal_addr, path, Some(TOKEN)).await;
    assert_eq!((status, body.trim()), (200, "[]"));
    assert_eq!(get(internal_addr, path, None).await.0, 401);
    assert_eq!(get(internal_addr, "/console/login", None).await.0, 200);
    assert_eq!(get(internal_addr, "/metrics", None).await.0, 200);

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), pod)
        .await
        .expect("drains")
        .unwrap()
        .unwrap();
}
