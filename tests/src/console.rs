//! The operator console's test fixture: a pod with operator tokens, a bound webhook channel
//! with messages waiting in its outbox (xAgent never acks them), and an agent host whose run
//! waits for a person's approval; plus a small HTTP client that keeps the session cookie.

use std::time::Duration;

use serde_json::{Value, json};
use switchyard_protocol::hosts::message::{ApprovalRequest, RiskLevel, RunAccepted};
use switchyard_protocol::hosts::{HostMessage, MessageType};

use crate::hosts::{HostConn, bind_device_channel, enroll_host, tool};
use crate::{Conn, Fixture, PodOptions, Sim, eventually};

pub const OPERATOR: &str = "alice@example.com";
/// 32 random bytes, hex (`openssl rand -hex 32`): operator tokens need 128+ bits.
pub const OPERATOR_TOKEN: &str = "5f1c9a7e2b3d4c6a8e0f7d2b9c4a6e1f3b8d0c5a7e9f2d4b6a8c1e3f5d7b9a0c";

pub struct ConsoleFixture {
    pub fx: Fixture,
    pub host: HostConn,
    pub host_id: String,
    pub host_name: String,
    pub pairing_code: String,
    pub device_sim: Sim,
    pub device_conn: Conn,
    pub device_channel: String,
    pub run_id: String,
    /// As operators see it: `{host_id}:{the host's id}`.
    pub approval_id: String,
    /// Messages waiting in the webhook channel's outbox.
    pub pending: usize,
}

fn accepted(run_id: &str) -> HostMessage {
    HostMessage::RunAccepted(
        serde_json::from_value::<RunAccepted>(json!({"run_id": run_id, "status": "running"}))
            .expect("accepted"),
    )
}

/// A `run_event` from the host (`ev` holds `event` and `payload`).
pub fn run_event(run_id: &str, seq: u64, ev: Value) -> HostMessage {
    let mut raw = ev;
    raw["type"] = json!("run_event");
    raw["run_id"] = json!(run_id);
    raw["seq"] = json!(seq);
    raw["timestamp"] = json!("2026-07-20T12:01:00Z");
    switchyard_protocol::hosts::parse_from(switchyard_protocol::hosts::Peer::Host, &raw.to_string())
        .expect("valid run_event")
}

impl ConsoleFixture {
    pub async fn start() -> Self {
        Self::start_with(PodOptions::default()).await
    }

    pub async fn start_with(opts: PodOptions) -> Self {
        let opts = opts.with(|c| {
            c.operator_tokens =
                serde_json::from_value(json!(format!("{OPERATOR}={OPERATOR_TOKEN}"))).unwrap();
        });
        let fx = Fixture::start(opts).await;
        // Two inbound messages xAgent receives but never acks: they wait in the outbox.
        let pending = 2;
        for i in 0..pending {
            assert_eq!(
                fx.inbound_text(&format!("m-{i}"), "hello <b>there</b>")
                    .await,
                202
            );
            let _ = fx.next_chat().await;
        }

        let host_name = "build-box".to_owned();
        let host = enroll_host(&fx.pod, &fx.pod.tenant.id, &host_name).await;
        let host_id = host.host_id.clone();
        let (mut hc, cfg) = host.online(&["coder"]).await;
        let pairing_code = cfg["pairing_code"]
            .as_str()
            .expect("pairing code")
            .to_owned();
        let (device_sim, device_conn, device_channel) =
            bind_device_channel(&fx.pod, &host_name, &pairing_code).await;
        let started = tool(
            &device_conn,
            &device_channel,
            "agent_run_start",
            json!({"goal": "clean the <build> dir"}),
        )
        .await;
        let run_id = started["result"]["run_id"]
            .as_str()
            .unwrap_or_else(|| panic!("run started: {started}"))
            .to_owned();
        let _ = hc.expect(MessageType::CreateRun).await;
        hc.send(&accepted(&run_id)).await;
        hc.send(&HostMessage::ApprovalRequest(ApprovalRequest {
            run_id: run_id.clone(),
            action: "rm -rf /tmp/build".into(),
            risk_level: RiskLevel::High,
            approval_id: Some("apr-console".into()),
        }))
        .await;
        let approval_id = format!("{host_id}:apr-console");
        let store = switchyard::app::open_store(fx.pod.config())
            .await
            .expect("store");
        eventually(Duration::from_secs(10), "approval stored", || {
            let store = store.clone();
            let id = approval_id.clone();
            async move { store.get_approval(&id).await.ok().flatten() }
        })
        .await;
        Self {
            fx,
            host: hc,
            host_id,
            host_name,
            pairing_code,
            device_sim,
            device_conn,
            device_channel,
            run_id,
            approval_id,
            pending,
        }
    }

    pub fn console_url(&self) -> String {
        format!("{}/console", self.fx.pod.admin_url())
    }

    /// Every secret this fixture made or the pod holds: none may appear in a page.
    pub fn secrets(&self) -> Vec<String> {
        let mut s = vec![
            OPERATOR_TOKEN.to_owned(),
            self.fx.pod.api_key().to_owned(),
            self.fx.secret.clone(),
            self.pairing_code.clone(),
            "chat-system-path-token".to_owned(),
        ];
        let keys: Value = serde_json::from_slice(
            &std::fs::read(self.fx.pod.data_dir().join("keys.json")).expect("keys.json"),
        )
        .expect("keys json");
        for k in ["signing_keys", "encryption_keys"] {
            for v in keys[k].as_array().expect("keys") {
                s.push(v.as_str().expect("key").to_owned());
            }
        }
        // The API key's secret part alone, too.
        if let Some((_, tail)) = self.fx.pod.api_key().rsplit_once('_') {
            s.push(tail.to_owned());
        }
        s
    }
}

/// The host's side after a grant: it hears the decision, then finishes the run.
pub async fn host_finishes_after_grant(host: &mut HostConn, run_id: &str) -> HostMessage {
    let granted = host.expect(MessageType::ApprovalGranted).await;
    host.send(&run_event(
        run_id,
        1,
        json!({"event": "completion", "payload": {"summary": "build dir cleaned"}}),
    ))
    .await;
    granted
}

/// Fails when any of `secrets` appears in `html`.
pub fn assert_no_secret_in(what: &str, html: &str, secrets: &[String]) {
    for s in secrets {
        assert!(
            s.len() >= 8,
            "secret too short to grep for meaningfully: {s:?}"
        );
        assert!(!html.contains(s.as_str()), "a secret appears in {what}");
    }
}

/// A console client: no redirects followed, the session cookie kept by hand.
pub struct ConsoleClient {
    pub http: reqwest::Client,
    pub base: String,
    pub cookies: Vec<(String, String)>,
}

pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: String,
}

impl Answer {
    pub fn location(&self) -> Option<&str> {
        self.headers
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
    }

    pub fn set_cookies(&self) -> Vec<String> {
        self.headers
            .get_all(reqwest::header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_owned))
            .collect()
    }

    /// The value of the hidden `csrf` field of the page's first form.
    pub fn csrf(&self) -> String {
        let at = self
            .body
            .find("name=\"csrf\" value=\"")
            .unwrap_or_else(|| panic!("no csrf field in {}", self.body));
        let rest = &self.body[at + "name=\"csrf\" value=\"".len()..];
        rest[..rest.find('"').expect("end of value")].to_owned()
    }
}

impl ConsoleClient {
    pub fn new(base: &str) -> Self {
        Self {
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("client"),
            base: base.trim_end_matches('/').to_owned(),
            cookies: Vec::new(),
        }
    }

    /// A client whose connections come from `local` (any 127.0.0.0/8 address on loopback):
    /// a second source address for limits kept per source.
    pub fn from_address(base: &str, local: std::net::IpAddr) -> Self {
        Self {
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .local_address(local)
                .build()
                .expect("client"),
            base: base.trim_end_matches('/').to_owned(),
            cookies: Vec::new(),
        }
    }

    /// GET `path` with `Authorization: Bearer {token}` (no cookie).
    pub async fn get_bearer(&mut self, path: &str, token: &str) -> Answer {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(token)
            .send()
            .await
            .expect("GET");
        self.answer(r).await
    }

    fn cookie_header(&self) -> String {
        self.cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn keep(&mut self, a: &Answer) {
        for c in a.set_cookies() {
            let first = c.split(';').next().unwrap_or_default();
            if let Some((k, v)) = first.split_once('=') {
                self.cookies.retain(|(n, _)| n != k);
                if !v.is_empty() {
                    self.cookies.push((k.to_owned(), v.to_owned()));
                }
            }
        }
    }

    async fn answer(&mut self, r: reqwest::Response) -> Answer {
        let a = Answer {
            status: r.status().as_u16(),
            headers: r.headers().clone(),
            body: r.text().await.expect("body"),
        };
        self.keep(&a);
        a
    }

    /// GET `path` (below the listener root, e.g. `/console/channels`).
    pub async fn get(&mut self, path: &str) -> Answer {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .header(reqwest::header::COOKIE, self.cookie_header())
            .send()
            .await
            .expect("GET");
        self.answer(r).await
    }

    pub async fn post(&mut self, path: &str, form: &[(&str, &str)]) -> Answer {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .header(reqwest::header::COOKIE, self.cookie_header())
            .form(form)
            .send()
            .await
            .expect("POST");
        self.answer(r).await
    }

    /// Signs in with `token` through the form; returns the final answer of the POST.
    pub async fn login(&mut self, token: &str) -> Answer {
        let form = self.get("/console/login").await;
        assert_eq!(form.status, 200, "{}", form.body);
        let csrf = form.csrf();
        self.post("/console/login", &[("csrf", &csrf), ("token", token)])
            .await
    }
}
