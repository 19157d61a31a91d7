//! Frames <-> messages, in one place: a WSS socket or the HTTPS fallback, both presented to
//! the session as a [`Connection`] — a bounded queue of messages to write and a queue of
//! what arrived — served by a writer and a reader task.

use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use switchyard_protocol::hosts::{HostMessage, HostProtocolError, Peer, parse_from};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::Message;
use url::Url;

use crate::http::TlsMode;
use crate::token::{AuthError, TokenSource, api_error};

/// Messages queued for writing before the session waits.
const QUEUE: usize = 64;
/// The WebSocket handshake, the TLS one included, must finish within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// `GET /hosts/v1/messages?wait_s=` of the fallback's long poll.
pub const LONG_POLL_S: u64 = 25;
/// Polls are at least this far apart when they come back empty at once.
const MIN_POLL: Duration = Duration::from_secs(1);

/// Which data plane to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportKind {
    /// `wss://.../hosts/v1/ws`.
    Wss,
    /// `POST`/`GET /hosts/v1/messages`.
    Https,
}

/// What the reader side delivers.
#[derive(Debug)]
pub enum Inbound {
    Message(HostMessage),
    /// A frame that is not a valid server message.
    Invalid(HostProtocolError),
    /// The connection is gone, with why.
    Closed(String),
}

/// One live connection.
pub struct Connection {
    pub tx: mpsc::Sender<HostMessage>,
    pub rx: mpsc::Receiver<Inbound>,
    on_registered: Option<oneshot::Sender<()>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Connection {
    /// A connection served by the caller through two channels (tests).
    #[doc(hidden)]
    pub fn from_channels(tx: mpsc::Sender<HostMessage>, rx: mpsc::Receiver<Inbound>) -> Self {
        Self {
            tx,
            rx,
            on_registered: None,
            tasks: Vec::new(),
        }
    }

    /// `register_ack` arrived: the fallback starts its long poll.
    pub fn registered(&mut self) {
        if let Some(tx) = self.on_registered.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error("websocket handshake with {url} failed: {detail}")]
    Handshake { url: String, detail: String },
    #[error("websocket handshake with {0} timed out")]
    Timeout(String),
}

impl ConnectError {
    pub fn is_permanent(&self) -> bool {
        matches!(self, Self::Auth(a) if a.is_permanent())
    }
}

/// `base` with `path` appended to its path.
pub fn endpoint(base: &Url, path: &str) -> Url {
    let mut u = base.clone();
    let p = format!("{}{}", u.path().trim_end_matches('/'), path);
    u.set_path(&p);
    u.set_query(None);
    u
}

/// Opens connections to one server.
pub struct Dialer {
    base: Url,
    kind: TransportKind,
    tls: TlsMode,
    http: reqwest::Client,
    tokens: Arc<TokenSource>,
}

impl Dialer {
    pub fn new(
        base: Url,
        kind: TransportKind,
        tls: TlsMode,
        http: reqwest::Client,
        tokens: Arc<TokenSource>,
    ) -> Self {
        Self {
            base,
            kind,
            tls,
            http,
            tokens,
        }
    }

    pub async fn connect(&self) -> Result<Connection, ConnectError> {
        match self.kind {
            TransportKind::Wss => self.connect_ws().await,
            TransportKind::Https => {
                // Fail early and clearly when the identity is refused.
                self.tokens.get().await?;
                Ok(self.connect_https())
            }
        }
    }

    async fn connect_ws(&self) -> Result<Connection, ConnectError> {
        let token = self.tokens.get().await?;
        let mut url = endpoint(&self.base, "/hosts/v1/ws");
        let scheme = if url.scheme() == "http" { "ws" } else { "wss" };
        // http(s) -> ws(s) is a change between special schemes, which `url` allows.
        let _ = url.set_scheme(scheme);
        let shown = url.to_string();
        let handshake_err = |detail: String| ConnectError::Handshake {
            url: shown.clone(),
            detail,
        };
        let mut req = url
            .as_str()
            .into_client_request()
            .map_err(|e| handshake_err(e.to_string()))?;
        let bearer = HeaderValue::from_str(&format!("Bearer {}", token.expose()))
            .map_err(|_| handshake_err("token is not a valid header value".into()))?;
        req.headers_mut().insert("authorization", bearer);
        let connecting = async {
            match &self.tls {
                TlsMode::Mutual(cfg) => {
                    // No Nagle: run events and answers are small frames that must not wait
                    // for the pod's delayed ACK.
                    tokio_tungstenite::connect_async_tls_with_config(
                        req,
                        None,
                        true,
                        Some(tokio_tungstenite::Connector::Rustls(cfg.clone())),
                    )
                    .await
                }
                TlsMode::Plaintext => {
                    tokio_tungstenite::connect_async_with_config(req, None, true).await
                }
            }
        };
        let ws = match tokio::time::timeout(HANDSHAKE_TIMEOUT, connecting).await {
            Err(_) => return Err(ConnectError::Timeout(shown)),
            Ok(Err(tokio_tungstenite::tungstenite::Error::Http(resp))) => {
                let status = resp.status();
                let body = resp
                    .body()
                    .as_ref()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default();
                if status.as_u16() == 401 || status.as_u16() == 403 {
                    self.tokens.invalidate().await;
                    let e = api_error(&body);
                    return Err(ConnectError::Auth(AuthError::Rejected {
                        code: e
                            .as_ref()
                            .map_or_else(|| "unauthorized".into(), |e| e.code.clone()),
                        message: e.map(|e| e.message).unwrap_or_default(),
                    }));
                }
                return Err(handshake_err(format!("HTTP {status}")));
            }
            Ok(Err(e)) => return Err(handshake_err(crate::ids::error_chain(&e))),
            Ok(Ok((ws, _))) => ws,
        };
        let (mut sink, mut stream) = ws.split();
        let (out_tx, mut out_rx) = mpsc::channel::<HostMessage>(QUEUE);
        let (in_tx, in_rx) = mpsc::channel::<Inbound>(QUEUE);
        let writer_in = in_tx.clone();
        let writer = tokio::spawn(async move {
            while let Some(m) = out_rx.recv().await {
                if let Err(e) = sink.send(Message::Text(m.to_json().into())).await {
                    let _ = writer_in
                        .send(Inbound::Closed(format!("write failed: {e}")))
                        .await;
                    return;
                }
            }
            let _ = sink.close().await;
        });
        let reader = tokio::spawn(async move {
            let why = loop {
                match stream.next().await {
                    Some(Ok(Message::Text(t))) => {
                        let item = match parse_from(Peer::Server, t.as_str()) {
                            Ok(m) => Inbound::Message(m),
                            Err(e) => Inbound::Invalid(e),
                        };
                        if in_tx.send(item).await.is_err() {
                            return;
                        }
                    }
                    Some(Ok(Message::Close(frame))) => {
                        break match frame {
                            Some(f) => format!(
                                "server closed the socket ({} {})",
                                u16::from(f.code),
                                f.reason
                            ),
                            None => "server closed the socket".into(),
                        };
                    }
                    Some(Ok(Message::Binary(_))) => {
                        tracing::warn!("binary frame ignored");
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => break format!("read failed: {e}"),
                    None => break "socket ended".into(),
                }
            };
            let _ = in_tx.send(Inbound::Closed(why)).await;
        });
        Ok(Connection {
            tx: out_tx,
            rx: in_rx,
            on_registered: None,
            tasks: vec![writer, reader],
        })
    }

    fn connect_https(&self) -> Connection {
        let url = endpoint(&self.base, "/hosts/v1/messages");
        let (out_tx, mut out_rx) = mpsc::channel::<HostMessage>(QUEUE);
        let (in_tx, in_rx) = mpsc::channel::<Inbound>(QUEUE);
        let (reg_tx, reg_rx) = oneshot::channel::<()>();
        let poster = Fallback {
            http: self.http.clone(),
            tokens: self.tokens.clone(),
            url: url.clone(),
        };
        let poller = poster.clone();
        let writer_in = in_tx.clone();
        let writer = tokio::spawn(async move {
            while let Some(m) = out_rx.recv().await {
                let req = poster
                    .http
                    .post(poster.url.clone())
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(m.to_json())
                    .timeout(Duration::from_secs(30));
                match poster.exchange(req).await {
                    Ok(items) => {
                        for item in items {
                            if writer_in.send(item).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(why) => {
                        let _ = writer_in.send(Inbound::Closed(why)).await;
                        return;
                    }
                }
            }
        });
        let reader = tokio::spawn(async move {
            if reg_rx.await.is_err() {
                return;
            }
            let mut url = poller.url.clone();
            url.set_query(Some(&format!("wait_s={LONG_POLL_S}")));
            loop {
                let started = tokio::time::Instant::now();
                let req = poller
                    .http
                    .get(url.clone())
                    .timeout(Duration::from_secs(LONG_POLL_S + 15));
                let items = match poller.exchange(req).await {
                    Ok(items) => items,
                    Err(why) => {
                        let _ = in_tx.send(Inbound::Closed(why)).await;
                        return;
                    }
                };
                // The server lost our registration (it restarted, or another pod answers):
                // a poll says so at once, and only a new `register` helps.
                if items.iter().any(asks_for_register) {
                    let _ = in_tx
                        .send(Inbound::Closed("the server asks for register again".into()))
                        .await;
                    return;
                }
                let empty = items.is_empty();
                for item in items {
                    if in_tx.send(item).await.is_err() {
                        return;
                    }
                }
                // A poll that came back empty at once (a draining server) is not repeated
                // in a tight loop.
                if empty && started.elapsed() < MIN_POLL {
                    tokio::time::sleep(MIN_POLL).await;
                }
            }
        });
        Connection {
            tx: out_tx,
            rx: in_rx,
            on_registered: Some(reg_tx),
            tasks: vec![writer, reader],
        }
    }
}

/// One side of the HTTPS fallback.
#[derive(Clone)]
struct Fallback {
    http: reqwest::Client,
    tokens: Arc<TokenSource>,
    url: Url,
}

impl Fallback {
    /// Sends `req` with the bearer token; returns the messages of the JSON array it answers
    /// with.
    async fn exchange(&self, req: reqwest::RequestBuilder) -> Result<Vec<Inbound>, String> {
        let token = self.tokens.get().await.map_err(|e| e.to_string())?;
        let resp = req
            .bearer_auth(token.expose())
            .send()
            .await
            .map_err(|e| format!("{}: {}", self.url, crate::ids::error_chain(&e)))?;
        let status = resp.status();
        let body = resp.text().await.map_err(|e| e.to_string())?;
        if status.as_u16() == 401 || status.as_u16() == 403 {
            self.tokens.invalidate().await;
            let code = api_error(&body).map_or_else(|| "unauthorized".into(), |e| e.code);
            return Err(format!("{} refused the host ({code})", self.url));
        }
        if !status.is_success() {
            return Err(format!("{} answered HTTP {status}", self.url));
        }
        let items: Vec<serde_json::Value> = serde_json::from_str(&body).map_err(|e| {
            format!(
                "{} answered something that is not a JSON array: {e}",
                self.url
            )
        })?;
        Ok(items
            .into_iter()
            .map(|v| match parse_from(Peer::Server, &typed(v).to_string()) {
                Ok(m) => Inbound::Message(m),
                Err(e) => Inbound::Invalid(e),
            })
            .collect())
    }
}

/// The fallback's answer to a poll before `register`: a 4001 `error` about no run.
fn asks_for_register(item: &Inbound) -> bool {
    matches!(item, Inbound::Message(HostMessage::Error(e))
        if e.run_id.is_none() && e.code == switchyard_protocol::hosts::HostErrorCode::InvalidRequestFormat)
}

/// The seed shows the upload/download answers without `type` (its HTTPS form); accept that
/// shape too, naming it by its URL field.
fn typed(mut v: serde_json::Value) -> serde_json::Value {
    if let serde_json::Value::Object(obj) = &mut v
        && !obj.contains_key("type")
    {
        let t = if obj.contains_key("upload_url") {
            "upload_artifact_ack"
        } else if obj.contains_key("download_url") {
            "download_artifact_ack"
        } else {
            return v;
        };
        obj.insert("type".into(), t.into());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_artifact_answers_are_typed() {
        let up = typed(serde_json::json!({"upload_url": "https://x/u", "artifact_id": "a"}));
        assert!(matches!(
            parse_from(Peer::Server, &up.to_string()),
            Ok(HostMessage::UploadArtifactAck(a)) if a.artifact_id == "a"
        ));
        let down = typed(serde_json::json!({"download_url": "https://x/d"}));
        assert!(matches!(
            parse_from(Peer::Server, &down.to_string()),
            Ok(HostMessage::DownloadArtifactAck(_))
        ));
        let other = serde_json::json!({"type": "heartbeat_ack"});
        assert_eq!(typed(other.clone()), other);
        assert_eq!(typed(serde_json::json!([1])), serde_json::json!([1]));
    }

    #[test]
    fn endpoints() {
        let b = Url::parse("https://127.0.0.1:8443").unwrap();
        assert_eq!(
            endpoint(&b, "/hosts/v1/ws").as_str(),
            "https://127.0.0.1:8443/hosts/v1/ws"
        );
        let b = Url::parse("https://sy.example.com/base/?x=1").unwrap();
        assert_eq!(
            endpoint(&b, "/hosts/v1/token").as_str(),
            "https://sy.example.com/base/hosts/v1/token"
        );
    }
}
