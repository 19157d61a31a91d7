//! The pods' plain HTTP listeners (public, internal, admin) on the accept loop every
//! listener shares, the mTLS one included (`switchyard_hosts_tls::listen`): every connection
//! gets a header-read timeout (which also bounds an idle keep-alive connection), the number
//! of connections still speaking HTTP is capped, and one over the cap is answered `503`
//! with `Connection: close` instead of being left to hang. Connections upgraded to
//! WebSockets leave this bound (their sessions have their own limits and drain).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The bounds of one listener (connection cap, header timeout, drain).
pub use switchyard_hosts_tls::listen::Limits as ListenerLimits;

/// The answer to a connection over the cap: a complete response, so the client reads a
/// reason rather than a reset. Its body is a `ClientError`'s, written out because it is sent
/// before a request is read (a test keeps the two equal).
pub const OVER_CAP_RESPONSE: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\n\
retry-after: 1\r\n\
connection: close\r\n\
content-length: 89\r\n\r\n\
{\"error\":{\"code\":\"overloaded\",\"message\":\"too many open connections; retry in a moment\"}}\n";

/// Serves `router` over plain HTTP on `listener` until `shutdown` is cancelled (then stops
/// accepting, lets requests in flight finish within the drain timeout and closes idle
/// connections). Every request carries `ConnectInfo<SocketAddr>`. The public, internal and
/// admin listeners all run here.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ListenerLimits,
    shutdown: CancellationToken,
) {
    let plain = switchyard_hosts_tls::listen::Plain {
        refusal: OVER_CAP_RESPONSE,
    };
    switchyard_hosts_tls::listen::serve(listener, plain, router, limits, shutdown).await;
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
