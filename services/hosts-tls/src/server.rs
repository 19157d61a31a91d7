//! The pod's mTLS listener for `/hosts/v1/*`: TLS with an optional client certificate
//! verified against the host CA, HTTP/1.1 with upgrades (the WSS data plane), and the
//! connection's client certificate handed to every request as [`PeerCertificate`].
//!
//! Certificates are only checked for chaining to the CA here; whether one belongs to a live
//! host is the application's decision, made per request from the fingerprint.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use crate::pki::PkiError;
use crate::tls::{parse_certs, parse_key, provider};

/// A client that has not finished its TLS handshake by then is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// After shutdown, how long requests in flight may take before their connections are cut.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Time allowed for a request's headers to arrive (slow clients hold a task otherwise).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Back-off after `accept` fails (typically out of file descriptors) so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// The client certificate (end-entity, DER) of the TLS connection a request came in on;
/// `None` when the client sent none. Present as a request extension on every request served
/// by [`serve`], so handlers take it with `Extension<PeerCertificate>`.
#[derive(Clone, Debug)]
pub struct PeerCertificate(pub Option<Vec<u8>>);

/// The ring provider, chosen explicitly so no process-wide default is needed.
/// rustls server configuration: the listener's certificate chain and key; client
/// certificates optional, but one that is presented must chain to `client_ca_pem` (with the
/// client-auth EKU), or the handshake fails. ALPN `http/1.1` only.
pub fn server_config(
    client_ca_pem: &str,
    server_cert_pem: &str,
    server_key_pem: &str,
) -> Result<Arc<ServerConfig>, PkiError> {
    let provider = provider();
    let mut roots = rustls::RootCertStore::empty();
    for ca in parse_certs(client_ca_pem, "client CA certificate")? {
        roots.add(ca)?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|e| PkiError::Tls(e.to_string()))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            parse_certs(server_cert_pem, "server certificate")?,
            parse_key(server_key_pem, "server private key")?,
        )?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serves `router` over TLS on `listener` until `shutdown` is cancelled.
///
/// Each connection runs in its own task: the TLS handshake (bounded by
/// [`HANDSHAKE_TIMEOUT`]; a failure is logged at debug and counted, never fatal to the loop),
/// then HTTP/1.1 with upgrades, every request carrying [`PeerCertificate`] and
/// `ConnectInfo<SocketAddr>`. On shutdown the loop stops accepting, connections finish their
/// request in flight and close, and those still busy after [`DRAIN_TIMEOUT`] are cut.
///
/// Upgraded connections (WebSockets) leave hyper once upgraded and live in the tasks axum
/// spawns for them: draining them is the application's job, through its own token.
pub async fn serve(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    router: axum::Router,
    shutdown: CancellationToken,
) {
    let acceptor = TlsAcceptor::from(config);
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            // Reap finished connections so the set does not grow with the listener's age.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let (tcp, remote) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "hosts tls accept failed");
                tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                continue;
            }
        };
        // Protocol messages are small: send them at once, not after the peer's delayed ACK.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set on a hosts connection");
        }
        connections.spawn(connection(
            acceptor.clone(),
            tcp,
            remote,
            router.clone(),
            shutdown.clone(),
        ));
    }
    drop(listener);
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            connections = connections.len(),
            "hosts tls connections still busy after the drain timeout; closing them"
        );
        connections.shutdown().await;
    }
}

async fn connection(
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    remote: SocketAddr,
    router: axum::Router,
    shutdown: CancellationToken,
) {
    let handshake = tokio::select! {
        () = shutdown.cancelled() => return,
        r = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)) => r,
    };
    let tls = match handshake {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(%remote, error = %e, "hosts tls handshake failed");
            metrics::counter!("switchyard_hosts_tls_handshake_failures_total", "reason" => "error")
                .increment(1);
            return;
        }
        Err(_) => {
            tracing::debug!(%remote, "hosts tls handshake timed out");
            metrics::counter!("switchyard_hosts_tls_handshake_failures_total", "reason" => "timeout")
                .increment(1);
            return;
        }
    };
    let peer = PeerCertificate(
        tls.get_ref()
            .1
            .peer_certificates()
            .and_then(|certs| certs.first())
            .map(|c| c.as_ref().to_vec()),
    );
    let service = router.map_request(move |mut req: axum::http::Request<Incoming>| {
        req.extensions_mut().insert(peer.clone());
        req.extensions_mut().insert(ConnectInfo(remote));
        req
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(tls), TowerToHyperService::new(service))
        .with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        () = shutdown.cancelled() => {
            // Finish the request in flight (if any), then close.
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(%remote, error = %e, "hosts tls connection ended with an error");
    }
}
