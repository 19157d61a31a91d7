//! Test side of Connector API v1: enrolling a host against a pod and speaking the protocol
//! over the real mTLS listener with a raw client, so each rule of the seed can be poked
//! directly (the real host agent, `switchyard-host`, is driven as a process elsewhere).

use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use switchyard_hosts_tls::client::client_config;
use switchyard_hosts_tls::pki::new_host_key_and_csr;
use switchyard_protocol::hosts::message::{Capabilities, Heartbeat, HeartbeatMetrics, Register};
use switchyard_protocol::hosts::{HostMessage, MessageType, Peer, format_rfc3339, parse_from};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::{Conn, EnvelopeExt, Pod, Sim};

pub const DEVICE_CARD: &str = "device.agent-host";
pub const DEVICE_V1: &str = "xagent.device.v1";

/// An enrolled host: its identity material and where to reach the pod.
#[derive(Clone)]
pub struct EnrolledHost {
    pub host_id: String,
    pub tenant_id: String,
    pub name: String,
    pub key_pem: String,
    pub cert_pem: String,
    pub ca_pem: String,
    pub tls_url: String,
}

/// Mints an enrollment token with the pod's own admin path (what `switchyard host enroll`
/// does).
pub async fn enrollment_token(pod: &Pod, tenant_id: &str, name: &str) -> String {
    let hosts = switchyard::app::admin_hosts(pod.config())
        .await
        .expect("admin hosts");
    hosts.enroll(tenant_id, name).await.expect("enroll").token
}

/// Enrolls a host named `name` of `tenant_id` through `POST /hosts/v1/enroll`.
pub async fn enroll_host(pod: &Pod, tenant_id: &str, name: &str) -> EnrolledHost {
    let token = enrollment_token(pod, tenant_id, name).await;
    enroll_with_token(&pod.root_url(), &token, name, &pod.hosts_tls_url()).await
}

/// Enrolls with `token` at `root_url` (`http://127.0.0.1:PORT`); the host will connect to
/// the mTLS listener `tls_url` (`https://127.0.0.1:PORT`).
pub async fn enroll_with_token(
    root_url: &str,
    token: &str,
    name: &str,
    tls_url: &str,
) -> EnrolledHost {
    let (key_pem, csr_pem) = new_host_key_and_csr(name).expect("csr");
    let resp = reqwest::Client::new()
        .post(format!("{root_url}/hosts/v1/enroll"))
        .json(&json!({"token": token, "csr_pem": csr_pem}))
        .send()
        .await
        .expect("enroll request");
    assert_eq!(resp.status(), 200, "enrollment succeeds");
    let body: Value = resp.json().await.expect("enroll body");
    EnrolledHost {
        host_id: body["host_id"].as_str().expect("host_id").to_owned(),
        tenant_id: body["tenant_id"].as_str().expect("tenant_id").to_owned(),
        name: name.to_owned(),
        key_pem,
        cert_pem: body["certificate_pem"].as_str().expect("cert").to_owned(),
        ca_pem: body["ca_pem"].as_str().expect("ca").to_owned(),
        tls_url: tls_url.to_owned(),
    }
}

impl EnrolledHost {
    /// HTTPS client presenting the host's certificate and trusting only the host CA.
    pub fn https(&self) -> reqwest::Client {
        let identity =
            reqwest::Identity::from_pem(format!("{}\n{}", self.cert_pem, self.key_pem).as_bytes())
                .expect("identity");
        reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(
                reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).expect("ca"),
            )
            .identity(identity)
            .build()
            .expect("client")
    }

    /// A fresh JWT from `POST /hosts/v1/token`.
    pub async fn jwt(&self) -> String {
        let resp = self
            .https()
            .post(format!("{}/hosts/v1/token", self.tls_url))
            .send()
            .await
            .expect("token request");
        assert_eq!(resp.status(), 200, "token issued");
        let body: Value = resp.json().await.expect("token body");
        body["token"].as_str().expect("token").to_owned()
    }

    /// Opens `wss://.../hosts/v1/ws` with the certificate and `jwt`; Err carries the HTTP
    /// status of a refused upgrade (or 0 when the TLS handshake failed).
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
        .expect("client config");
        connect_raw(&self.tls_url, cfg, jwt).await
    }

    /// Connects with a fresh JWT.
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

    /// Connects, registers and declares one agent `agent_id`; returns the connection and the
    /// `register_ack` config.
    pub async fn online(&self, agent_ids: &[&str]) -> (HostConn, Value) {
        let mut c = self.connect().await;
        c.send(&self.register_msg()).await;
        let ack = c.expect(MessageType::RegisterAck).await;
        let HostMessage::RegisterAck(ack) = ack else {
            unreachable!()
        };
        c.send(&HostMessage::Capabilities(Capabilities {
            connector_id: self.host_id.clone(),
            agents: agent_ids
                .iter()
                .map(|id| {
                    serde_json::from_value(json!({
                        "agent_id": id, "runtime": "exec", "model": "test-model",
                        "tools": ["terminal"], "max_turns": 10, "supports": ["streaming", "cancellation", "handoff"]
                    }))
                    .expect("agent")
                })
                .collect(),
        }))
        .await;
        (c, Value::Object(ack.config))
    }

    pub fn heartbeat(&self) -> HostMessage {
        HostMessage::Heartbeat(Heartbeat {
            connector_id: self.host_id.clone(),
            timestamp: format_rfc3339(switchyard_core::ids::now_ms()),
            metrics: HeartbeatMetrics {
                cpu_pct: 1.5,
                memory_mb: 100,
                active_runs: 0,
                queued_runs: 0,
            },
        })
    }
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub async fn connect_raw(
    tls_url: &str,
    cfg: Arc<rustls::ClientConfig>,
    jwt: Option<&str>,
) -> Result<HostConn, (u16, String)> {
    let url = format!("{}/hosts/v1/ws", tls_url.replacen("https://", "wss://", 1));
    let mut req = url.into_client_request().expect("request");
    if let Some(j) = jwt {
        req.headers_mut().insert(
            "authorization",
            format!("Bearer {j}").parse().expect("header"),
        );
    }
    match tokio_tungstenite::connect_async_tls_with_config(
        req,
        None,
        false,
        Some(tokio_tungstenite::Connector::Rustls(cfg)),
    )
    .await
    {
        Ok((ws, _)) => Ok(HostConn { ws }),
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
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

/// A raw host connection.
pub struct HostConn {
    ws: Ws,
}

/// How a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    Closed(Option<u16>),
    Dropped,
}

impl HostConn {
    pub async fn send(&mut self, m: &HostMessage) {
        self.send_raw(&m.to_json()).await;
    }

    pub async fn send_raw(&mut self, text: &str) {
        self.ws
            .send(Message::Text(text.to_owned().into()))
            .await
            .expect("send");
    }

    /// The next server message within `timeout`, answering pings; None on timeout or close.
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
                None => panic!("connection ended before {} for {run_id}", t.as_str()),
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
}

/// An xAgent connection to the pod's `/hosts` connector with a device channel bound to
/// `host` by its pairing code.
pub async fn bind_device_channel(
    pod: &Pod,
    host_name: &str,
    pairing_code: &str,
) -> (Sim, Conn, String) {
    bind_device_channel_at(
        &pod.prefix_url("/hosts"),
        pod.api_key(),
        host_name,
        pairing_code,
    )
    .await
}

/// Same, against any pod's `/hosts` base URL with an API key.
pub async fn bind_device_channel_at(
    hosts_base_url: &str,
    api_key: &str,
    host_name: &str,
    pairing_code: &str,
) -> (Sim, Conn, String) {
    let sim = Sim::new(hosts_base_url, Some(api_key)).expect("sim");
    let conn = sim.connect().await.expect("connect");
    conn.hello(DEVICE_CARD, None, &[DEVICE_V1])
        .await
        .expect("hello")
        .expect_kind("connector.hello.ack")
        .expect("hello ack");
    let (ch, _) = crate::open(&conn, None).await;
    let ack = conn
        .auth_start(
            &ch,
            "agent_host_pairing",
            json!({"host_name": host_name, "pairing_code": pairing_code}),
        )
        .await
        .expect("auth.start")
        .expect_kind("auth.start.ack")
        .expect("auth ack");
    assert_eq!(ack.str_at("/status"), Some("authenticated"), "{ack:?}");
    (sim, conn, ch)
}

/// `tool.invoke` on a device channel; returns the ack payload (`result` or `error`).
pub async fn tool(conn: &Conn, ch: &str, tool_id: &str, args: Value) -> Value {
    let ack = conn
        .invoke(ch, tool_id, args, None)
        .await
        .expect("tool.invoke")
        .expect_kind("tool.invoke.ack")
        .expect("tool ack");
    ack.payload.clone().unwrap_or_default()
}
