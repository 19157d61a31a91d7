//! A simulated host agent (Connector API v1, `docs/agent-hosts.md`): enrollment over HTTP,
//! a JWT from `POST /hosts/v1/token`, and the WSS data plane with the client certificate,
//! spoken message by message so every rule can be poked directly. The e2e suite drives it
//! with the panicking helpers (`connect`, `send`, `expect`, ...); the loadtest uses the
//! `Result` forms (`enroll`, `try_connect`, `try_online`, `try_send`, `next_within`, ...).
//! The real host agent, `switchyard-host`, is a separate program.
//!
//! The xAgent side of a host is a `device.agent-host` channel ([`DEVICE_CARD`], profile
//! [`DEVICE_V1`]) bound with the form flow [`FLOW_PAIRING`]: the host's name and the
//! `pairing_code` of its `register_ack.config`.

use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use switchyard_hosts_tls::client::client_config;
use switchyard_hosts_tls::pki::new_host_key_and_csr;
use switchyard_protocol::hosts::message::{Capabilities, Heartbeat, HeartbeatMetrics, Register};
use switchyard_protocol::hosts::{HostMessage, MessageType, Peer, format_rfc3339, parse_from};
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::now_ms;

/// Card of the device bridge whose channels bind to hosts.
pub const DEVICE_CARD: &str = switchyard_protocol::hosts::AGENT_HOST_CARD_ID;
/// Profile of the device bridge's tools.
pub const DEVICE_V1: &str = "xagent.device.v1";
/// Form flow binding a device channel to a host.
pub const FLOW_PAIRING: &str = "agent_host_pairing";

/// How a simulated host call failed.
#[derive(Debug, thiserror::Error)]
pub enum HostCallError {
    #[error("http request failed: {0}")]
    Http(#[from] reqwest::Error),
    #[error("{what} answered http {status}: {body}")]
    Status {
        what: &'static str,
        status: u16,
        body: String,
    },
    /// The WebSocket upgrade was answered with plain HTTP (`status`), or the TLS handshake
    /// or the TCP connection failed (`status` 0).
    #[error("connection refused (http {status}): {body}")]
    Refused { status: u16, body: String },
    #[error("websocket failed: {0}")]
    Ws(Box<tungstenite::Error>),
    #[error("the connection ended: {0:?}")]
    Ended(Ended),
    #[error("no {what} within {after:?}")]
    Timeout { what: String, after: Duration },
    /// Something that does not follow the protocol: an invalid server message, an answer
    /// without its fields, a certificate that does not load.
    #[error("{0}")]
    Invalid(String),
}

impl From<tungstenite::Error> for HostCallError {
    fn from(e: tungstenite::Error) -> Self {
        Self::Ws(Box::new(e))
    }
}

pub type HostResult<T> = std::result::Result<T, HostCallError>;

/// An enrolled host: its identity material and where to reach the pod.
#[derive(Clone)]
pub struct EnrolledHost {
    pub host_id: String,
    pub tenant_id: String,
    pub name: String,
    pub key_pem: String,
    pub cert_pem: String,
    pub ca_pem: String,
    /// `https://127.0.0.1:PORT`: the pod's mTLS listener.
    pub tls_url: String,
}

impl std::fmt::Debug for EnrolledHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnrolledHost")
            .field("host_id", &self.host_id)
            .field("tenant_id", &self.tenant_id)
            .field("name", &self.name)
            .field("tls_url", &self.tls_url)
            .finish_non_exhaustive()
    }
}

/// Enrolls with `token` at `root_url` (`http://127.0.0.1:PORT`) through
/// `POST /hosts/v1/enroll`; the host will connect to the mTLS listener `tls_url`
/// (`https://127.0.0.1:PORT`).
pub async fn enroll(
    http: &reqwest::Client,
    root_url: &str,
    token: &str,
    name: &str,
    tls_url: &str,
) -> HostResult<EnrolledHost> {
    let (key_pem, csr_pem) =
        new_host_key_and_csr(name).map_err(|e| HostCallError::Invalid(format!("csr: {e}")))?;
    let resp = http
        .post(format!("{root_url}/hosts/v1/enroll"))
        .json(&json!({"token": token, "csr_pem": csr_pem}))
        .send()
        .await?;
    let status = resp.status().as_u16();
    if status != 200 {
        let body = resp.text().await.unwrap_or_default();
        return Err(HostCallError::Status {
            what: "POST /hosts/v1/enroll",
            status,
            body,
        });
    }
    let body: Value = resp.json().await?;
    let field = |k: &str| {
        body[k]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| HostCallError::Invalid(format!("enrollment answer without {k}")))
    };
    Ok(EnrolledHost {
        host_id: field("host_id")?,
        tenant_id: field("tenant_id")?,
        name: name.to_owned(),
        key_pem,
        cert_pem: field("certificate_pem")?,
        ca_pem: field("ca_pem")?,
        tls_url: tls_url.to_owned(),
    })
}

/// [`enroll`] for tests: panics unless the enrollment succeeds.
pub async fn enroll_with_token(
    root_url: &str,
    token: &str,
    name: &str,
    tls_url: &str,
) -> EnrolledHost {
    match enroll(&reqwest::Client::new(), root_url, token, name, tls_url).await {
        Ok(h) => h,
        Err(HostCallError::Status { status, body, .. }) => {
            panic!("enrollment succeeds: got http {status}: {body}")
        }
        Err(e) => panic!("enrollment failed: {e}"),
    }
}

impl EnrolledHost {
    /// HTTPS client presenting the host's certificate and trusting only the host CA.
    pub fn try_https(&self) -> HostResult<reqwest::Client> {
        let identity =
            reqwest::Identity::from_pem(format!("{}\n{}", self.cert_pem, self.key_pem).as_bytes())?;
        Ok(reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(self.ca_pem.as_bytes())?)
            .identity(identity)
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .build()?)
    }

    /// [`EnrolledHost::try_https`] for tests.
    pub fn https(&self) -> reqwest::Client {
        self.try_https().expect("https client")
    }

    /// A fresh JWT from `POST /hosts/v1/token`.
    pub async fn try_jwt(&self) -> HostResult<String> {
        let resp = self
            .try_https()?
            .post(format!("{}/hosts/v1/token", self.tls_url))
            .send()
            .await?;
        let status = resp.status().as_u16();
        if status != 200 {
            let body = resp.text().await.unwrap_or_default();
            return Err(HostCallError::Status {
                what: "POST /hosts/v1/token",
                status,
                body,
            });
        }
        let body: Value = resp.json().await?;
        body["token"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| HostCallError::Invalid("token answer without token".into()))
    }

    /// [`EnrolledHost::try_jwt`] for tests.
    pub async fn jwt(&self) -> String {
        match self.try_jwt().await {
            Ok(t) => t,
            Err(HostCallError::Status { status, body, .. }) => {
                panic!("token issued: got http {status}: {body}")
            }
            Err(e) => panic!("token request failed: {e}"),
        }
    }

    /// Opens `wss://.../hosts/v1/ws` with the certificate (unless `with_cert` is false) and
    /// `jwt`; Err carries the HTTP status of a refused upgrade (or 0 when the TLS handshake
    /// or the connection failed) and the body or error text.
    pub async fn connect_with(
        &self,
        jwt: Option<&str>,
        with_cert: bool,
    ) -> Result<HostConn, (u16, String)> {
        let cfg = if with_cert {
            client_config(&self.ca_pem, Some(&self.cert_pem), Some(&self.key_pem))
        } else {
            client_config(&self.ca_pem, None, None)
        }
        .map_err(|e| (0, format!("client config: {e}")))?;
        connect_raw(&self.tls_url, cfg, jwt).await
    }

    /// Connects with a fresh JWT.
    pub async fn try_connect(&self) -> HostResult<HostConn> {
        let jwt = self.try_jwt().await?;
        self.connect_with(Some(&jwt), true)
            .await
            .map_err(|(status, body)| HostCallError::Refused { status, body })
    }

    /// [`EnrolledHost::try_connect`] for tests.
    pub async fn connect(&self) -> HostConn {
        let jwt = self.jwt().await;
        self.connect_with(Some(&jwt), true)
            .await
            .unwrap_or_else(|e| panic!("connect refused: {e:?}"))
    }

    pub fn register_msg(&self) -> HostMessage {
        HostMessage::Register(Register {
            connector_id: self.host_id.clone(),
            version: "test".into(),
            host: "test-machine".into(),
            adapters: vec!["exec".into()],
        })
    }

    /// `capabilities` declaring one `exec` agent per id.
    pub fn capabilities_msg(&self, agent_ids: &[&str]) -> HostResult<HostMessage> {
        let agents = agent_ids
            .iter()
            .map(|id| {
                serde_json::from_value(json!({
                    "agent_id": id, "runtime": "exec", "model": "test-model",
                    "tools": ["terminal"], "max_turns": 10,
                    "supports": ["streaming", "cancellation", "handoff"]
                }))
                .map_err(|e| HostCallError::Invalid(format!("agent {id}: {e}")))
            })
            .collect::<HostResult<Vec<_>>>()?;
        Ok(HostMessage::Capabilities(Capabilities {
            connector_id: self.host_id.clone(),
            agents,
        }))
    }

    /// Connects, registers and declares the agents `agent_ids`; returns the connection and
    /// the `register_ack` config (with `pairing_code`, `heartbeat_interval_s`, ...).
    pub async fn try_online(&self, agent_ids: &[&str]) -> HostResult<(HostConn, Value)> {
        let mut c = self.try_connect().await?;
        c.try_send(&self.register_msg()).await?;
        let HostMessage::RegisterAck(ack) = c
            .try_expect(MessageType::RegisterAck, Duration::from_secs(10))
            .await?
        else {
            unreachable!("try_expect returns the asked type")
        };
        c.try_send(&self.capabilities_msg(agent_ids)?).await?;
        Ok((c, Value::Object(ack.config)))
    }

    /// [`EnrolledHost::try_online`] for tests.
    pub async fn online(&self, agent_ids: &[&str]) -> (HostConn, Value) {
        let mut c = self.connect().await;
        c.send(&self.register_msg()).await;
        let HostMessage::RegisterAck(ack) = c.expect(MessageType::RegisterAck).await else {
            unreachable!()
        };
        c.send(&self.capabilities_msg(agent_ids).expect("capabilities"))
            .await;
        (c, Value::Object(ack.config))
    }

    /// A `heartbeat` with idle metrics.
    pub fn heartbeat(&self) -> HostMessage {
        self.heartbeat_with(0, 0)
    }

    /// A `heartbeat` reporting `active_runs` and `queued_runs`.
    pub fn heartbeat_with(&self, active_runs: u32, queued_runs: u32) -> HostMessage {
        HostMessage::Heartbeat(Heartbeat {
            connector_id: self.host_id.clone(),
            timestamp: format_rfc3339(now_ms()),
            metrics: HeartbeatMetrics {
                cpu_pct: 1.5,
                memory_mb: 100,
                active_runs,
                queued_runs,
            },
        })
    }
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens `wss://.../hosts/v1/ws` of `tls_url` with a TLS configuration of the caller's
/// choosing (see [`client_config`]) and an optional bearer JWT. Err carries the HTTP status
/// of a refused upgrade (0 when the TLS handshake or the connection failed).
pub async fn connect_raw(
    tls_url: &str,
    cfg: Arc<rustls::ClientConfig>,
    jwt: Option<&str>,
) -> Result<HostConn, (u16, String)> {
    let url = format!("{}/hosts/v1/ws", tls_url.replacen("https://", "wss://", 1));
    let mut req = url
        .into_client_request()
        .map_err(|e| (0, format!("request: {e}")))?;
    if let Some(j) = jwt {
        let value = format!("Bearer {j}")
            .parse()
            .map_err(|_| (0, "the JWT is not a valid header value".to_owned()))?;
        req.headers_mut().insert("authorization", value);
    }
    // No Nagle (`true`): run events are small frames that must not wait for a delayed ACK.
    match tokio_tungstenite::connect_async_tls_with_config(
        req,
        None,
        true,
        Some(tokio_tungstenite::Connector::Rustls(cfg)),
    )
    .await
    {
        Ok((ws, _)) => Ok(HostConn { ws }),
        Err(tungstenite::Error::Http(resp)) => {
            let body = resp
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            Err((resp.status().as_u16(), body))
        }
        Err(e) => Err((0, e.to_string())),
    }
}

/// A raw host connection: one WebSocket, one message per text frame.
pub struct HostConn {
    ws: Ws,
}

/// How a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// A close frame, with its code.
    Closed(Option<u16>),
    /// The stream ended or failed without a close frame.
    Dropped,
}

impl HostConn {
    pub async fn try_send(&mut self, m: &HostMessage) -> HostResult<()> {
        self.try_send_raw(&m.to_json()).await
    }

    /// Sends one text frame as is.
    pub async fn try_send_raw(&mut self, text: &str) -> HostResult<()> {
        self.ws.send(Message::Text(text.to_owned().into())).await?;
        Ok(())
    }

    /// [`HostConn::try_send`] for tests.
    pub async fn send(&mut self, m: &HostMessage) {
        self.send_raw(&m.to_json()).await;
    }

    /// [`HostConn::try_send_raw`] for tests.
    pub async fn send_raw(&mut self, text: &str) {
        self.try_send_raw(text).await.expect("send");
    }

    /// The next server message within `timeout`, answering pings. `Ok(None)` when nothing
    /// came in time; `Err(Ended)` when the connection ended; `Err(Invalid)` for a message
    /// that does not parse as a server message.
    pub async fn next_within(&mut self, timeout: Duration) -> HostResult<Option<HostMessage>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let Some(left) = deadline.checked_duration_since(tokio::time::Instant::now()) else {
                return Ok(None);
            };
            match tokio::time::timeout(left, self.ws.next()).await {
                Err(_) => return Ok(None),
                Ok(Some(Ok(Message::Text(t)))) => {
                    return parse_from(Peer::Server, t.as_str()).map(Some).map_err(|e| {
                        HostCallError::Invalid(format!("server sent an invalid message {t}: {e}"))
                    });
                }
                Ok(Some(Ok(Message::Ping(p)))) => {
                    let _ = self.ws.send(Message::Pong(p)).await;
                }
                Ok(Some(Ok(Message::Close(f)))) => {
                    return Err(HostCallError::Ended(Ended::Closed(
                        f.map(|f| u16::from(f.code)),
                    )));
                }
                Ok(Some(Ok(_))) => {}
                Ok(None) | Ok(Some(Err(_))) => return Err(HostCallError::Ended(Ended::Dropped)),
            }
        }
    }

    /// The next server message within `timeout`, answering pings; None on timeout or close.
    /// Panics on a message that is not a valid server message.
    pub async fn recv_within(&mut self, timeout: Duration) -> Option<HostMessage> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.checked_duration_since(tokio::time::Instant::now())?;
            match tokio::time::timeout(left, self.ws.next()).await {
                Ok(Some(Ok(Message::Text(t)))) => {
                    return Some(
                        parse_from(Peer::Server, t.as_str())
                            .unwrap_or_else(|e| panic!("server sent an invalid message {t}: {e}")),
                    );
                }
                Ok(Some(Ok(Message::Ping(p)))) => {
                    let _ = self.ws.send(Message::Pong(p)).await;
                }
                Ok(Some(Ok(_))) => {}
                _ => return None,
            }
        }
    }

    pub async fn recv(&mut self) -> HostMessage {
        self.recv_within(Duration::from_secs(10))
            .await
            .expect("a server message within 10 s")
    }

    /// Skips other messages until one of type `t` arrives within `timeout`.
    pub async fn try_expect(
        &mut self,
        t: MessageType,
        timeout: Duration,
    ) -> HostResult<HostMessage> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline
                .checked_duration_since(tokio::time::Instant::now())
                .unwrap_or_default();
            match self.next_within(left).await? {
                Some(m) if m.message_type() == t => return Ok(m),
                Some(_) => {}
                None => {
                    return Err(HostCallError::Timeout {
                        what: t.as_str().to_owned(),
                        after: timeout,
                    });
                }
            }
        }
    }

    /// Skips other messages until one of type `t` arrives (10 s).
    pub async fn expect(&mut self, t: MessageType) -> HostMessage {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline
                .checked_duration_since(tokio::time::Instant::now())
                .unwrap_or_else(|| panic!("no {} within 10 s", t.as_str()));
            match self.recv_within(left).await {
                Some(m) if m.message_type() == t => return m,
                Some(_) => {}
                None => panic!("connection ended before {}", t.as_str()),
            }
        }
    }

    /// Skips other messages until one of type `t` about `run_id` arrives (20 s): re-sent
    /// messages of other runs may come first.
    pub async fn expect_for(&mut self, t: MessageType, run_id: &str) -> HostMessage {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline
                .checked_duration_since(tokio::time::Instant::now())
                .unwrap_or_else(|| panic!("no {} for {run_id} within 20 s", t.as_str()));
            match self.recv_within(left).await {
                Some(m) if m.message_type() == t && m.run_id() == Some(run_id) => return m,
                Some(_) => {}
                None => panic!(
                    "no {} for {run_id}: the connection ended or 20 s passed",
                    t.as_str()
                ),
            }
        }
    }

    /// Waits for the server to end the connection (answering pings meanwhile, unless
    /// `answer_pings` is false).
    pub async fn ended(&mut self, timeout: Duration, answer_pings: bool) -> Option<Ended> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.checked_duration_since(tokio::time::Instant::now())?;
            match tokio::time::timeout(left, self.ws.next()).await {
                Err(_) => return None,
                Ok(None) | Ok(Some(Err(_))) => return Some(Ended::Dropped),
                Ok(Some(Ok(Message::Close(f)))) => {
                    return Some(Ended::Closed(f.map(|f| u16::from(f.code))));
                }
                Ok(Some(Ok(Message::Ping(p)))) if answer_pings => {
                    let _ = self.ws.send(Message::Pong(p)).await;
                }
                Ok(Some(Ok(_))) => {}
            }
        }
    }

    /// Sends a close frame with `code` (1000 for a normal goodbye) and waits briefly for the
    /// server's answer.
    pub async fn close(&mut self, code: u16, reason: &str) {
        let frame = tungstenite::protocol::CloseFrame {
            code: tungstenite::protocol::frame::coding::CloseCode::from(code),
            reason: reason.to_owned().into(),
        };
        let _ = self.ws.send(Message::Close(Some(frame))).await;
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while let Some(Ok(_)) = self.ws.next().await {}
        })
        .await;
    }
}
