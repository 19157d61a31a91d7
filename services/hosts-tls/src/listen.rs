//! The one accept loop of every pod listener: the public one, the internal one (metrics and
//! probes), the admin one (console and operator API) and the hosts mTLS listener.
//!
//! hyper's own serving has no header-read timeout and no connection cap, so slow or idle
//! clients could hold any number of tasks and descriptors. Here every connection gets a
//! header-read timeout (which also bounds an idle keep-alive connection), the connections
//! still speaking HTTP (a TLS handshake included) are capped, and one over the cap is
//! refused at once by its [`Transport`] instead of being left to hang. Connections upgraded
//! to WebSockets leave the bound (their sessions have their own limits and drain).
//!
//! What differs between listeners is only how an accepted socket becomes an HTTP stream
//! ([`Transport::open`]: nothing for plain HTTP, the TLS handshake for the mTLS listener) and
//! how a socket over the cap is refused.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// Back-off after `accept` fails (typically out of file descriptors) so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);
/// How long a refused connection gets to read its refusal before it is closed.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// The bounds of one listener.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections speaking HTTP (not yet upgraded) at once, a TLS handshake included; more
    /// are refused by the transport.
    pub max_connections: usize,
    /// Time for a request's headers to arrive, and for an idle keep-alive connection to
    /// start its next request.
    pub header_read_timeout: Duration,
    /// After shutdown, how long requests in flight may take before connections are cut.
    pub drain_timeout: Duration,
}

/// How an accepted socket becomes an HTTP stream, and how one over the cap is refused.
pub trait Transport: Clone + Send + Sync + 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// The stream HTTP is spoken on and what every request on it carries as extensions;
    /// None ends the connection (a failed handshake).
    fn open(
        &self,
        tcp: TcpStream,
        remote: SocketAddr,
    ) -> impl Future<Output = Option<(Self::Stream, axum::http::Extensions)>> + Send;

    /// Answers a socket over the connection cap, then drops it.
    fn refuse(&self, tcp: TcpStream) -> impl Future<Output = ()> + Send;
}

/// Plain HTTP; a socket over the cap reads `refusal` (a complete HTTP response) and is closed.
#[derive(Clone, Copy, Debug)]
pub struct Plain {
    pub refusal: &'static [u8],
}

impl Transport for Plain {
    type Stream = TcpStream;

    async fn open(
        &self,
        tcp: TcpStream,
        _remote: SocketAddr,
    ) -> Option<(TcpStream, axum::http::Extensions)> {
        Some((tcp, axum::http::Extensions::new()))
    }

    async fn refuse(&self, mut tcp: TcpStream) {
        let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, async {
            tcp.write_all(self.refusal).await?;
            tcp.shutdown().await
        })
        .await;
    }
}

/// Serves `router` on `listener` through `transport` until `shutdown` is cancelled (then
/// stops accepting, lets requests in flight finish within the drain timeout and closes idle
/// connections). Every request carries `ConnectInfo<SocketAddr>` and the transport's
/// extensions.
pub async fn serve<T: Transport>(
    listener: TcpListener,
    transport: T,
    router: axum::Router,
    limits: Limits,
    shutdown: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            // Reap finished connections so the set does not grow with the listener's age.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = accept(&listener) => accepted,
        };
        let (tcp, remote) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                continue;
            }
        };
        match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let router = router.clone();
                let stop = shutdown.clone();
                let transport = transport.clone();
                connections.spawn(async move {
                    connection(transport, tcp, remote, router, limits, stop).await;
                    drop(permit);
                });
            }
            Err(_) => {
                metrics::counter!("switchyard_limits_hit_total", "limit" => "connections")
                    .increment(1);
                let transport = transport.clone();
                connections.spawn(async move { transport.refuse(tcp).await });
            }
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(limits.drain_timeout, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            connections = connections.len(),
            "connections still busy after the drain timeout; closing them"
        );
        connections.shutdown().await;
    }
}

/// The next connection, with Nagle's algorithm off: small frames (acks, progress, tool
/// answers) go out at once instead of waiting for the peer's delayed ACK, ~40 ms off a
/// request/answer pair. Cancel-safe, like `TcpListener::accept`.
async fn accept(listener: &TcpListener) -> std::io::Result<(TcpStream, SocketAddr)> {
    let (tcp, remote) = listener.accept().await?;
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "TCP_NODELAY not set on an accepted socket");
    }
    Ok((tcp, remote))
}

async fn connection<T: Transport>(
    transport: T,
    tcp: TcpStream,
    remote: SocketAddr,
    router: axum::Router,
    limits: Limits,
    shutdown: CancellationToken,
) {
    let opened = tokio::select! {
        () = shutdown.cancelled() => return,
        o = transport.open(tcp, remote) => o,
    };
    let Some((stream, extensions)) = opened else {
        return;
    };
    let service = router.map_request(move |mut req: axum::http::Request<Incoming>| {
        req.extensions_mut().extend(extensions.clone());
        req.extensions_mut().insert(ConnectInfo(remote));
        req
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
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
        tracing::debug!(%remote, error = %e, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepted_sockets_have_nagle_off() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (tcp, _) = accept(&listener).await.unwrap();
        assert!(tcp.nodelay().unwrap(), "TCP_NODELAY on the accepted socket");
    }
}
