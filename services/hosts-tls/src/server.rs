//! The pod's mTLS listener for `/hosts/v1/*`: TLS with an optional client certificate
//! verified against the host CA, HTTP/1.1 with upgrades (the WSS data plane), and the
//! connection's client certificate handed to every request as [`PeerCertificate`].
//!
//! Certificates are only checked for chaining to the CA here; whether one belongs to a live
//! host is the application's decision, made per request from the fingerprint.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::listen::{Limits, Transport};
use crate::pki::PkiError;
use crate::tls::{parse_certs, parse_key, provider};

/// A client that has not finished its TLS handshake by then is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// After shutdown, how long requests in flight may take before their connections are cut.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Time allowed for a request's headers to arrive (slow clients hold a task otherwise).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

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

/// The mTLS listener's defaults when no bounds are given ([`serve`]).
pub const DEFAULT_LIMITS: Limits = Limits {
    max_connections: 10_000,
    header_read_timeout: HEADER_READ_TIMEOUT,
    drain_timeout: DRAIN_TIMEOUT,
};

/// The TLS half of the mTLS listener: the handshake (bounded by [`HANDSHAKE_TIMEOUT`]; a
/// failure is logged at debug and counted, never fatal to the loop) and the connection's
/// client certificate, handed to every request as [`PeerCertificate`]. A socket over the
/// connection cap is closed before any handshake work.
#[derive(Clone)]
pub struct Tls {
    acceptor: TlsAcceptor,
}

impl Tls {
    pub fn new(config: Arc<ServerConfig>) -> Self {
        Self {
            acceptor: TlsAcceptor::from(config),
        }
    }
}

impl Transport for Tls {
    type Stream = tokio_rustls::server::TlsStream<TcpStream>;

    async fn open(
        &self,
        tcp: TcpStream,
        remote: SocketAddr,
    ) -> Option<(Self::Stream, axum::http::Extensions)> {
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(tcp)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                tracing::debug!(%remote, error = %e, "hosts tls handshake failed");
                metrics::counter!("switchyard_hosts_tls_handshake_failures_total", "reason" => "error")
                    .increment(1);
                return None;
            }
            Err(_) => {
                tracing::debug!(%remote, "hosts tls handshake timed out");
                metrics::counter!("switchyard_hosts_tls_handshake_failures_total", "reason" => "timeout")
                    .increment(1);
                return None;
            }
        };
        let peer = PeerCertificate(
            tls.get_ref()
                .1
                .peer_certificates()
                .and_then(|certs| certs.first())
                .map(|c| c.as_ref().to_vec()),
        );
        let mut ext = axum::http::Extensions::new();
        ext.insert(peer);
        Some((tls, ext))
    }

    async fn refuse(&self, tcp: TcpStream) {
        // Nothing can be said before a handshake; closing at once is the clearest refusal.
        drop(tcp);
    }
}

/// Serves `router` over TLS on `listener` until `shutdown` is cancelled, with
/// [`DEFAULT_LIMITS`]; the pod passes its own bounds to [`serve_with`].
///
/// Every request carries [`PeerCertificate`] and `ConnectInfo<SocketAddr>`. On shutdown the
/// loop stops accepting, connections finish their request in flight and close, and those
/// still busy after the drain timeout are cut.
///
/// Upgraded connections (WebSockets) leave hyper once upgraded and live in the tasks axum
/// spawns for them: draining them is the application's job, through its own token.
pub async fn serve(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    router: axum::Router,
    shutdown: CancellationToken,
) {
    serve_with(listener, config, router, DEFAULT_LIMITS, shutdown).await;
}

/// [`serve`] with the listener's bounds (connection cap, header timeout, drain): the same
/// accept loop as the pod's other listeners ([`crate::listen`]).
pub async fn serve_with(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    router: axum::Router,
    limits: Limits,
    shutdown: CancellationToken,
) {
    crate::listen::serve(listener, Tls::new(config), router, limits, shutdown).await;
}
