//! The xAgent backend as seen by one Connector Base URL: the HTTP planes and the way into `/ws`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http::header::{AUTHORIZATION, HeaderValue, SEC_WEBSOCKET_PROTOCOL};
use serde_json::Value;
use switchyard_protocol::SUBPROTOCOL;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::conn::{Conn, ConnOptions};
use crate::{Result, SimError, schemas};

/// Header naming the channel of an upload (protocol §5.1).
pub const CHANNEL_HEADER: &str = "X-XAgent-Connector-Channel-ID";

/// Default time a request waits for its correlated answer.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Plays the xAgent backend against one Connector.
///
/// Cheap to clone; clones share the HTTP client and the schema-violation list, so one
/// `schema_violations()` check at the end of a test covers the Card and every connection.
#[derive(Clone)]
pub struct Sim {
    base: String,
    api_key: Option<String>,
    http: reqwest::Client,
    violations: Violations,
    options: ConnOptions,
}

impl Sim {
    /// `base_url` is the Connector Base URL including its path prefix, e.g.
    /// `http://127.0.0.1:8080/webhook`. `api_key` is sent as `Authorization: Bearer` where
    /// xAgent sends it (`/health`, `/ws`, `/files/uploads`).
    pub fn new(base_url: &str, api_key: Option<&str>) -> Result<Self> {
        let parsed =
            url::Url::parse(base_url).map_err(|e| SimError::Url(format!("{base_url}: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https")
            || parsed.host_str().is_none()
            || parsed.query().is_some()
            || parsed.fragment().is_some()
        {
            return Err(SimError::Url(format!(
                "{base_url}: a Base URL is http(s) with a host and no query or fragment"
            )));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(120))
            .build()?;
        Ok(Self {
            base: base_url.trim_end_matches('/').to_owned(),
            api_key: api_key.map(str::to_owned),
            http,
            violations: Violations::default(),
            options: ConnOptions {
                request_timeout: DEFAULT_REQUEST_TIMEOUT,
                record_frames: true,
            },
        })
    }

    /// Default answer timeout of connections opened from now on (10 s unless changed).
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.options.request_timeout = timeout;
        self
    }

    /// Whether connections keep every received text frame (on by default; the loadtest turns
    /// it off to keep memory flat).
    pub fn with_frame_recording(mut self, on: bool) -> Self {
        self.options.record_frames = on;
        self
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// `base_url` + `path` (`path` with or without its leading slash).
    pub fn url(&self, path: &str) -> String {
        if path.starts_with('/') {
            format!("{}{path}", self.base)
        } else {
            format!("{}/{path}", self.base)
        }
    }

    /// The underlying client, for requests the helpers do not cover.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// Schema violations found in anything this simulator (or a connection it opened) received.
    pub fn schema_violations(&self) -> Vec<String> {
        self.violations.snapshot()
    }

    fn bearer(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(key) => req.bearer_auth(key),
            None => req,
        }
    }

    /// `GET /connector-card.json`; a non-2xx answer is an error. The Card is schema-checked
    /// and violations are recorded.
    pub async fn card(&self) -> Result<Value> {
        let resp = self
            .http
            .get(self.url("/connector-card.json"))
            .send()
            .await?;
        let status = resp.status().as_u16();
        let body = resp.text().await?;
        if !(200..300).contains(&status) {
            return Err(SimError::Status { status, body });
        }
        let card: Value = serde_json::from_str(&body)?;
        if let Err(errors) = schemas::validate_card(&card) {
            for e in errors {
                self.violations.push(format!("connector card {e}"));
            }
        }
        Ok(card)
    }

    /// `GET /skill.md` without credentials.
    pub async fn skill(&self) -> Result<(u16, String)> {
        let resp = self.http.get(self.url("/skill.md")).send().await?;
        let status = resp.status().as_u16();
        Ok((status, resp.text().await?))
    }

    /// `GET /health` with the API key; the body when it is JSON.
    pub async fn health(&self) -> Result<(u16, Option<Value>)> {
        let resp = self
            .bearer(self.http.get(self.url("/health")))
            .send()
            .await?;
        let status = resp.status().as_u16();
        let body = resp.bytes().await?;
        Ok((status, serde_json::from_slice(&body).ok()))
    }

    /// `POST /files/uploads` (multipart field `file`, channel header, API key). The body is
    /// returned as JSON, or as a JSON string when it is not JSON.
    pub async fn upload(
        &self,
        channel_id: &str,
        filename: &str,
        mime: &str,
        bytes: impl Into<Bytes>,
    ) -> Result<(u16, Value)> {
        let bytes: Bytes = bytes.into();
        let len = bytes.len() as u64;
        let part = reqwest::multipart::Part::stream_with_length(reqwest::Body::from(bytes), len)
            .file_name(filename.to_owned())
            .mime_str(mime)?;
        let form = reqwest::multipart::Form::new().part("file", part);
        let req = self
            .http
            .post(self.url("/files/uploads"))
            .header(CHANNEL_HEADER, channel_id)
            .multipart(form);
        let resp = self.bearer(req).send().await?;
        let status = resp.status().as_u16();
        let text = resp.text().await?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, body))
    }

    /// Downloads a `download_url` the way xAgent does: no credentials; a relative URL is
    /// appended to the Base URL.
    pub async fn download(&self, url: &str) -> Result<(u16, HeaderMap, Bytes)> {
        let url = if url.starts_with("http://") || url.starts_with("https://") {
            url.to_owned()
        } else {
            self.url(url)
        };
        let resp = self.http.get(url).send().await?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        Ok((status, headers, resp.bytes().await?))
    }

    /// The `/ws` URL (`http` -> `ws`, `https` -> `wss`; TLS is not compiled into the WebSocket
    /// client, so only `ws` connects).
    pub fn ws_url(&self) -> Result<String> {
        let mut url =
            url::Url::parse(&self.url("/ws")).map_err(|e| SimError::Url(e.to_string()))?;
        let scheme = if url.scheme() == "https" { "wss" } else { "ws" };
        url.set_scheme(scheme)
            .map_err(|()| SimError::Url(format!("cannot use scheme {scheme} for {url}")))?;
        Ok(url.into())
    }

    /// Opens `/ws` as xAgent does: subprotocol `xagent.connector.packet.v1` and the API key.
    pub async fn connect(&self) -> Result<Conn> {
        let key = self.api_key.clone();
        self.connect_with(Some(SUBPROTOCOL), key.as_deref()).await
    }

    /// Opens `/ws` with a chosen subprotocol offer and API key (sent as `Bearer <api_key>`);
    /// `None` leaves the header out. A refused upgrade is [`SimError::Upgrade`] with its HTTP
    /// status (see [`SimError::status`]).
    pub async fn connect_with(
        &self,
        subprotocol: Option<&str>,
        api_key: Option<&str>,
    ) -> Result<Conn> {
        let mut req = self.ws_url()?.into_client_request()?;
        let header =
            |v: &str| HeaderValue::from_str(v).map_err(|e| SimError::Header(e.to_string()));
        if let Some(p) = subprotocol {
            req.headers_mut().insert(SEC_WEBSOCKET_PROTOCOL, header(p)?);
        }
        if let Some(k) = api_key {
            req.headers_mut()
                .insert(AUTHORIZATION, header(&format!("Bearer {k}"))?);
        }
        let (stream, resp) = dial(req).await?;
        let negotiated = resp
            .headers()
            .get(SEC_WEBSOCKET_PROTOCOL)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Ok(Conn::start(
            stream,
            negotiated,
            self.violations.clone(),
            self.options.clone(),
        ))
    }
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim")
            .field("base", &self.base)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

/// Shared, append-only list of schema violations.
#[derive(Clone, Default, Debug)]
pub(crate) struct Violations(Arc<Mutex<Vec<String>>>);

impl Violations {
    pub(crate) fn push(&self, v: String) {
        tracing::warn!(violation = %v, "connector emitted a schema violation");
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(v);
    }

    pub(crate) fn snapshot(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The WebSocket as xAgent would open it, with Nagle's algorithm off: the backend writes
/// small frames back to back (an ack, then a `tool.invoke`), and with Nagle the second waits
/// for the pod's delayed ACK of the first, up to 40 ms (the loadtest's tool and outbound p99
/// was that wait, not the pods').
pub(crate) async fn dial(
    req: http::Request<()>,
) -> std::result::Result<
    (
        tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
        tokio_tungstenite::tungstenite::handshake::client::Response,
    ),
    tokio_tungstenite::tungstenite::Error,
> {
    tokio_tungstenite::connect_async_with_config(req, None, true).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_socket_is_dialed_without_nagle() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            tokio_tungstenite::accept_async(tcp).await.unwrap()
        });
        let req = format!("ws://{addr}/ws").into_client_request().unwrap();
        let (ws, _) = dial(req).await.unwrap();
        let tokio_tungstenite::MaybeTlsStream::Plain(tcp) = ws.get_ref() else {
            panic!("a ws:// URL gives a plain TCP stream");
        };
        assert!(
            tcp.nodelay().unwrap(),
            "TCP_NODELAY is set on the dialed socket"
        );
        drop(server.await.unwrap());
    }
}
