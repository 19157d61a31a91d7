//! The mTLS listener end to end: a real `serve` on 127.0.0.1:0 with a tiny router, and real
//! TLS clients (reqwest, tokio-tungstenite) built from `client_config`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Extension;
use axum::extract::ws::{Message as WsMessage, WebSocketUpgrade};
use axum::routing::get;
use futures::{SinkExt as _, StreamExt as _};
use rustls::pki_types::{CertificateDer, UnixTime};
use switchyard_hosts_tls::client::client_config;
use switchyard_hosts_tls::pki::{HostCa, IssuedCert, fingerprint_hex, new_host_key_and_csr};
use switchyard_hosts_tls::server::{PeerCertificate, serve, server_config};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::{Notify, mpsc};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

fn whoami(peer: &PeerCertificate) -> String {
    peer.0
        .as_deref()
        .map(fingerprint_hex)
        .unwrap_or_else(|| "none".to_owned())
}

/// What the `/slow` handler does: says it started, then waits to be released.
#[derive(Clone)]
struct Slow {
    started: mpsc::UnboundedSender<()>,
    release: Arc<Notify>,
}

fn router(slow: Slow) -> Router {
    Router::new()
        .route(
            "/whoami",
            get(|Extension(peer): Extension<PeerCertificate>| async move { whoami(&peer) }),
        )
        .route(
            "/ws",
            get(
                |Extension(peer): Extension<PeerCertificate>, ws: WebSocketUpgrade| async move {
                    ws.on_upgrade(move |mut socket| async move {
                        while let Some(Ok(WsMessage::Text(t))) = socket.recv().await {
                            let reply = format!("{} {}", t.as_str(), whoami(&peer));
                            if socket.send(WsMessage::Text(reply.into())).await.is_err() {
                                break;
                            }
                        }
                    })
                },
            ),
        )
        .route(
            "/slow",
            get(move || async move {
                let _ = slow.started.send(());
                slow.release.notified().await;
                "done"
            }),
        )
}

struct Server {
    ca: HostCa,
    addr: SocketAddr,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    slow_started: mpsc::UnboundedReceiver<()>,
    slow_release: Arc<Notify>,
}

async fn start() -> Server {
    let ca = HostCa::generate("test host CA").unwrap();
    let (cert, key) = ca
        .server_certificate(&["localhost".to_owned(), "127.0.0.1".to_owned()])
        .unwrap();
    let config = server_config(&ca.cert_pem(), &cert, &key).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let (started, slow_started) = mpsc::unbounded_channel();
    let release = Arc::new(Notify::new());
    let app = router(Slow {
        started,
        release: release.clone(),
    });
    let task = tokio::spawn(serve(listener, config, app, shutdown.clone()));
    Server {
        ca,
        addr,
        shutdown,
        task,
        slow_started,
        slow_release: release,
    }
}

/// A host of `ca`: (key PEM, issued certificate).
fn enroll(ca: &HostCa, host_id: &str) -> (String, IssuedCert) {
    let (key, csr) = new_host_key_and_csr("test-host").unwrap();
    (key, ca.sign_csr(&csr, host_id, 1).unwrap())
}

/// An HTTPS client trusting the server's CA, presenting `cert` = (key PEM, cert PEM).
fn http(server: &Server, cert: Option<(&str, &str)>) -> reqwest::Client {
    let cfg = client_config(&server.ca.cert_pem(), cert.map(|c| c.1), cert.map(|c| c.0)).unwrap();
    reqwest::Client::builder()
        .use_preconfigured_tls((*cfg).clone())
        .resolve("localhost", server.addr)
        .build()
        .unwrap()
}

fn url(server: &Server, path: &str) -> String {
    format!("https://localhost:{}{path}", server.addr.port())
}

async fn get_text(client: &reqwest::Client, url: &str) -> reqwest::Result<String> {
    client
        .get(url)
        .send()
        .await?
        .error_for_status()?
        .text()
        .await
}

#[tokio::test]
async fn handler_sees_the_client_certificate() {
    let server = start().await;
    let (key, issued) = enroll(&server.ca, "host_1");
    let client = http(&server, Some((&key, &issued.pem)));
    let seen = get_text(&client, &url(&server, "/whoami")).await.unwrap();
    assert_eq!(seen, issued.fingerprint);
    // Same connection, second request: the extension is there for every request.
    let seen = get_text(&client, &url(&server, "/whoami")).await.unwrap();
    assert_eq!(seen, issued.fingerprint);
}

#[tokio::test]
async fn no_client_certificate_is_allowed_and_seen_as_none() {
    let server = start().await;
    let client = http(&server, None);
    let seen = get_text(&client, &url(&server, "/whoami")).await.unwrap();
    assert_eq!(seen, "none");
}

#[tokio::test]
async fn certificate_from_another_ca_fails_the_handshake() {
    let server = start().await;
    let other = HostCa::generate("someone else's CA").unwrap();
    let (key, foreign) = enroll(&other, "host_1");
    let client = http(&server, Some((&key, &foreign.pem)));
    let res = get_text(&client, &url(&server, "/whoami")).await;
    assert!(res.is_err(), "a foreign certificate was accepted: {res:?}");

    // A client speaking plain HTTP to the TLS port fails its handshake too.
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(b"GET /whoami HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut buf)).await;
    assert!(!String::from_utf8_lossy(&buf).contains("200 OK"));

    // Neither failure took the listener down.
    let (key, issued) = enroll(&server.ca, "host_2");
    let client = http(&server, Some((&key, &issued.pem)));
    let seen = get_text(&client, &url(&server, "/whoami")).await.unwrap();
    assert_eq!(seen, issued.fingerprint);
}

#[tokio::test]
async fn issued_certificates_chain_to_the_ca_for_client_auth() {
    // The same check the listener makes, without a socket: the rustls client verifier built
    // on the CA accepts our certificate and refuses another CA's.
    let ca = HostCa::generate("test host CA").unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(ca.cert_der())).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .unwrap();
    let now = UnixTime::now();
    let (_, issued) = enroll(&ca, "host_1");
    verifier
        .verify_client_cert(&CertificateDer::from(issued.der.clone()), &[], now)
        .expect("issued certificate chains to the CA");
    let (_, foreign) = enroll(&HostCa::generate("other").unwrap(), "host_1");
    assert!(
        verifier
            .verify_client_cert(&CertificateDer::from(foreign.der), &[], now)
            .is_err()
    );
    // A CA reloaded from its PEMs keeps issuing certificates that chain.
    let reloaded = HostCa::from_pem(&ca.cert_pem(), &ca.key_pem()).unwrap();
    let (_, again) = enroll(&reloaded, "host_2");
    verifier
        .verify_client_cert(&CertificateDer::from(again.der), &[], now)
        .expect("certificate from the reloaded CA chains");
    // The listener's server certificate is not usable as a client certificate (EKU).
    let (server_pem, _) = ca.server_certificate(&["localhost".to_owned()]).unwrap();
    let server_der = switchyard_hosts_tls::pki::pem_to_der(&server_pem).unwrap();
    assert!(
        verifier
            .verify_client_cert(&CertificateDer::from(server_der), &[], now)
            .is_err()
    );
}

#[tokio::test]
async fn websocket_upgrade_through_serve() {
    let server = start().await;
    let (key, issued) = enroll(&server.ca, "host_ws");
    let cfg = client_config(&server.ca.cert_pem(), Some(&issued.pem), Some(&key)).unwrap();
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let (mut ws, response) = tokio_tungstenite::client_async_tls_with_config(
        format!("wss://localhost:{}/ws", server.addr.port()),
        tcp,
        None,
        Some(tokio_tungstenite::Connector::Rustls(cfg)),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 101);
    for text in ["hello", "again"] {
        ws.send(Message::text(text)).await.unwrap();
        let reply = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .expect("reply in time")
            .expect("socket open")
            .unwrap();
        assert_eq!(
            reply.into_text().unwrap().as_str(),
            format!("{text} {}", issued.fingerprint)
        );
    }
    ws.close(None).await.unwrap();
}

#[tokio::test]
async fn graceful_shutdown_finishes_requests_in_flight_then_ends() {
    let mut server = start().await;
    let (key, issued) = enroll(&server.ca, "host_1");
    let client = http(&server, Some((&key, &issued.pem)));
    // An idle keep-alive connection in the pool must not hold shutdown up.
    get_text(&client, &url(&server, "/whoami")).await.unwrap();

    let slow_client = http(&server, None);
    let slow_url = url(&server, "/slow");
    let slow = tokio::spawn(async move { get_text(&slow_client, &slow_url).await });
    server.slow_started.recv().await.unwrap();

    server.shutdown.cancel();
    // The request in flight keeps serve draining.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut server.task)
            .await
            .is_err(),
        "serve ended while a request was in flight"
    );
    // No new connections are taken once shutdown fired.
    let fresh = http(&server, None);
    let late = tokio::time::timeout(
        Duration::from_secs(5),
        get_text(&fresh, &url(&server, "/whoami")),
    )
    .await;
    assert!(
        !matches!(late, Ok(Ok(_))),
        "a new connection was served after shutdown: {late:?}"
    );

    server.slow_release.notify_one();
    assert_eq!(slow.await.unwrap().unwrap(), "done");
    tokio::time::timeout(Duration::from_secs(5), server.task)
        .await
        .expect("serve ends once the request in flight is done")
        .unwrap();
}
