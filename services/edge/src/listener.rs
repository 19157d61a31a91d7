//! The public listener's accept loop. axum's `serve` has no header-read timeout and no
//! connection cap, so slow or idle clients could hold any number of tasks and descriptors:
//! here every connection gets a header-read timeout (which also bounds an idle keep-alive
//! connection), the number of connections still speaking HTTP is capped, and one over the
//! cap is answered `503` with `Connection: close` instead of being left to hang. Connections
//! upgraded to WebSockets leave this bound (their sessions have their own limits and drain).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// Back-off after `accept` fails (typically out of file descriptors) so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);
/// How long a refused connection gets to read its 503 before it is closed.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
pub struct ListenerLimits {
    /// Connections speaking HTTP (not yet upgraded) at once; more are refused with 503.
    pub max_connections: usize,
    /// Time for a request's headers to arrive, and for an idle keep-alive connection to
    /// start its next request.
    pub header_read_timeout: Duration,
    /// After the drain starts, how long requests in flight may take before connections are cut.
    pub drain_timeout: Duration,
}

/// The answer to a connection over the cap: a complete response, so the client reads a
/// reason rather than a reset. Its body is a `ClientError`'s, written out because it is sent
/// before a request is read (a test keeps the two equal).
pub const OVER_CAP_RESPONSE: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\n\
retry-after: 1\r\n\
connection: close\r\n\
content-length: 89\r\n\r\n\
{\"error\":{\"code\":\"overloaded\",\"message\":\"too many open connections; retry in a moment\"}}\n";

/// Serves `router` on `listener` until `shutdown` is cancelled (then stops accepting, lets
/// requests in flight finish within the drain timeout and closes idle connections).
/// Every request carries `ConnectInfo<SocketAddr>`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ListenerLimits,
    shutdown: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
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
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                continue;
            }
        };
        // Small frames (acks, progress, tool answers) go out at once instead of waiting for
        // the peer's delayed ACK (Nagle): ~40 ms off every request/answer pair.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set on an accepted socket");
        }
        match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let router = router.clone();
                let stop = shutdown.clone();
                connections.spawn(async move {
                    connection(tcp, remote, router, limits, stop).await;
                    drop(permit);
                });
            }
            Err(_) => {
                metrics::counter!("switchyard_limits_hit_total", "limit" => "connections")
                    .increment(1);
                connections.spawn(refuse(tcp));
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

async fn refuse(mut tcp: TcpStream) {
    let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, async {
        tcp.write_all(OVER_CAP_RESPONSE).await?;
        tcp.shutdown().await
    })
    .await;
}

async fn connection(
    tcp: TcpStream,
    remote: SocketAddr,
    router: Router,
    limits: ListenerLimits,
    shutdown: CancellationToken,
) {
    let service = router.map_request(move |mut req: axum::http::Request<Incoming>| {
        req.extensions_mut().insert(ConnectInfo(remote));
        req
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(tcp), TowerToHyperService::new(service))
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

/// Largest part of a refused request's body read and discarded so its client sees the answer.
const REFUSED_BODY_DRAIN_BYTES: usize = 64 * 1024;
const REFUSED_BODY_DRAIN_TIME: Duration = Duration::from_secs(2);

/// The request body, shared between the handler and [`answer_refusals`], which needs what
/// the handler left unread once it has answered.
struct SharedBody(Arc<std::sync::Mutex<Option<axum::body::Body>>>);

impl http_body::Body for SharedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let mut inner = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match inner.as_mut() {
            Some(body) => std::pin::Pin::new(body).poll_frame(cx),
            None => std::task::Poll::Ready(None),
        }
    }
}

/// A request refused before its body was read (a missing key on an upload, a bad
/// signature, a body over its limit) would otherwise be answered on a connection that is
/// then closed with the body still unread, and the kernel's reset can reach the client
/// before the answer does ("broken pipe" instead of the 401). So the unread rest of a
/// refused request is read and discarded, up to a small bound; when more remains, the
/// answer says `Connection: close`.
pub async fn answer_refusals(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let (parts, body) = req.into_parts();
    let shared = Arc::new(std::sync::Mutex::new(Some(body)));
    let req = axum::extract::Request::from_parts(
        parts,
        axum::body::Body::new(SharedBody(shared.clone())),
    );
    let mut resp = next.run(req).await;
    if resp.status().is_success() || resp.status().is_informational() {
        return resp;
    }
    let rest = shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    let Some(rest) = rest else { return resp };
    let drained = tokio::time::timeout(REFUSED_BODY_DRAIN_TIME, async move {
        use futures::StreamExt as _;
        let mut stream = rest.into_data_stream();
        let mut seen = 0usize;
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(c) => seen += c.len(),
                Err(_) => return false,
            }
            if seen > REFUSED_BODY_DRAIN_BYTES {
                return false;
            }
        }
        true
    })
    .await;
    if !matches!(drained, Ok(true)) {
        resp.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_is_a_complete_response() {
        let text = std::str::from_utf8(OVER_CAP_RESPONSE).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(body.len(), len);
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        // Written out by hand (it is sent before any request is read), in the one shape.
        let same = switchyard_core::client_error::ClientError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "too many open connections; retry in a moment",
        );
        assert_eq!(v, same.body());
        assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
    }
}
