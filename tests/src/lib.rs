//! The end-to-end harness: the real pod (`switchyard::run`) on `127.0.0.1:0` with its own
//! temporary data dir (SQLite + local files), a tenant created before start, short durations
//! from config where a scenario needs them, the xAgent simulator as the client, and a fake
//! chat system (a real HTTP server) on the target side of `im.webhook`.
//!
//! Every scenario builds its own [`Pod`], so tests are independent and run in parallel.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{Value, json};
use switchyard::config::{CidrList, Config, Dur};
use switchyard_core::engine::create_tenant;
use switchyard_core::ids::{now_ms, random_secret};
use switchyard_protocol::{Card, Descriptor};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub mod console;
pub mod hosts;
pub mod spawned;
pub mod webdriver;

pub use switchyard_fake_webhook::{FakeWebhook, InboundRequest, Received};
pub use switchyard_xagent_sim::{AckStatus, Conn, Envelope, EnvelopeExt, Sim, schemas};

pub const CARD_ID: &str = "im.webhook";
pub const PREFIX: &str = "/webhook";
pub const IM_V1: &str = "xagent.im.v1";
pub const IM_V2: &str = "xagent.im.v2";
pub const FLOW_BINDING: &str = "webhook_binding";
pub const FLOW_PAIRING: &str = "webhook_pairing";
pub const TOOL_SEND: &str = "webhook_message_send";
pub const TOOL_FILE_SEND: &str = "webhook_file_send";

/// How long a test waits for something that should happen promptly.
pub const WAIT: Duration = Duration::from_secs(10);
/// How long a test watches for something that must *not* happen. Asserting an absence needs
/// some window; it is kept well above the pod's 250 ms session tick.
pub const QUIET: Duration = Duration::from_millis(1200);

// ---- captured logs ---------------------------------------------------------------------

/// Everything logged so far by every pod of this test binary.
pub use switchyard_core::testkit::captured_logs;

/// Installs (once per test binary) a log subscriber that keeps everything the pods log, at
/// debug level for Switchyard's crates, so scenarios can assert that no secret is logged.
pub fn init_logs() {
    switchyard_core::testkit::init_logs_with(
        "info,switchyard=debug,switchyard_core=debug,switchyard_provider_webhook=debug,switchyard_store_sqlite=debug,tower_http=debug",
    );
}

/// Asserts that `needle` (a secret) appears in no log line.
pub fn assert_not_logged(needle: &str) {
    assert!(!needle.is_empty());
    let logs = captured_logs();
    assert!(!logs.contains(needle), "a secret appears in the server log");
}

// ---- small helpers ---------------------------------------------------------------------

/// A fresh signing secret (unique, so log and frame checks cannot collide across tests).
pub fn new_secret() -> String {
    format!("whsec-{}", random_secret(16))
}

/// Polls `f` until it yields `Some`, or panics after `timeout`.
pub use switchyard_core::testkit::eventually;

/// Asserts that no push of type `kind` arrives on `conn` within `window`; other pushes are
/// kept for later reads.
pub async fn assert_no_push_of(conn: &Conn, kind: &str, window: Duration) {
    if let Some(p) = conn.next_push_of(kind, window).await {
        panic!("unexpected {kind} push: {p:?}");
    }
}

/// The `message_id` of a `chat.message` / `message.push` payload.
pub fn message_id(env: &Envelope) -> String {
    env.str_at("/message_id").unwrap_or_default().to_owned()
}

/// Fails with a readable message when the simulator saw schema violations.
pub fn assert_schema_clean(sim: &Sim) {
    let v = sim.schema_violations();
    assert!(v.is_empty(), "schema violations: {v:#?}");
}

/// Asserts an answer correlates with its request: same `request_id`, `reply_to` = its packet.
pub fn assert_correlated(answer: &Envelope, request: &Envelope) {
    assert_eq!(answer.request_id, request.request_id, "request_id echoed");
    assert_eq!(
        answer.reply_to.as_deref(),
        Some(request.packet_id.as_str()),
        "reply_to = request packet_id"
    );
}

// ---- the pod ---------------------------------------------------------------------------

/// A tenant and one of its API keys.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub id: String,
    pub name: String,
    pub key_id: String,
    pub api_key: String,
}

/// Configuration of a test pod: production defaults, with the background loops fast enough
/// for tests. Scenarios shorten the durations they exercise.
#[derive(Debug, Clone)]
pub struct PodOptions {
    cfg: Config,
}

impl Default for PodOptions {
    fn default() -> Self {
        let mut cfg = Config::default();
        cfg.lease.presence_interval = ms(200);
        cfg.lease.presence_ttl = secs(5);
        cfg.lease.janitor_interval = ms(200);
        cfg.lease.janitor_lease_ttl = secs(5);
        cfg.delivery.sweep_interval = ms(500);
        cfg.drain_timeout = secs(10);
        // Each pod gets its own free port for the hosts mTLS listener at launch.
        cfg.hosts_tls_listen = "127.0.0.1:0".into();
        // And for the admin listener (console, operator API), opened when operators are set.
        cfg.admin_listen = "127.0.0.1:0".into();
        // The fake chat systems listen on loopback, which tenant URLs may not reach by default.
        cfg.outbound.allow_private = CidrList(vec![
            "127.0.0.0/8".parse().expect("static range"),
            "::1/128".parse().expect("static range"),
        ]);
        Self { cfg }
    }
}

fn ms(n: u64) -> Dur {
    Dur(Duration::from_millis(n))
}

fn secs(n: u64) -> Dur {
    Dur(Duration::from_secs(n))
}

impl PodOptions {
    /// Any other change to the configuration.
    pub fn with(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(&mut self.cfg);
        self
    }

    pub fn connector_grace(self, d: Duration) -> Self {
        self.with(|c| c.lease.connector_grace = Dur(d))
    }

    pub fn ack_timeout(self, d: Duration) -> Self {
        self.with(|c| c.delivery.ack_timeout = Dur(d))
    }

    pub fn download_url_ttl(self, d: Duration) -> Self {
        self.with(|c| c.retention.download_url_ttl = Dur(d))
    }

    pub fn max_upload_bytes(self, n: u64) -> Self {
        self.with(|c| c.limits.max_upload_bytes = n)
    }

    pub fn max_frame_bytes(self, n: usize) -> Self {
        self.with(|c| c.limits.max_frame_bytes = n)
    }
}

/// One running pod on its own data dir.
pub struct Pod {
    dir: Arc<tempfile::TempDir>,
    cfg: Config,
    addr: SocketAddr,
    metrics_addr: SocketAddr,
    /// The tenant created before the first start.
    pub tenant: Tenant,
    shutdown: CancellationToken,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

async fn bind_prefer(port: Option<u16>) -> TcpListener {
    if let Some(p) = port
        && let Ok(l) = TcpListener::bind(("127.0.0.1", p)).await
    {
        return l;
    }
    TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0")
}

impl Pod {
    /// Creates a data dir and a tenant, then starts the pod on fresh ports.
    pub async fn start(opts: PodOptions) -> Self {
        init_logs();
        let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
        let mut cfg = opts.cfg;
        cfg.data_dir = dir.path().to_path_buf();
        let tenant = {
            let store = switchyard::app::open_store(&cfg).await.expect("open store");
            switchyard::app::prepare_schema(&cfg, store.as_ref())
                .await
                .expect("schema");
            let (t, key) = create_tenant(store.as_ref(), "tenant-a")
                .await
                .expect("create tenant");
            Tenant {
                id: t.id,
                name: t.name,
                key_id: key.id,
                api_key: key.key.expose().to_owned(),
            }
        };
        let mut pod = Self {
            dir,
            cfg,
            addr: ([127, 0, 0, 1], 0).into(),
            metrics_addr: ([127, 0, 0, 1], 0).into(),
            tenant,
            shutdown: CancellationToken::new(),
            task: None,
        };
        pod.launch(None).await;
        pod
    }

    async fn launch(&mut self, ports: Option<(u16, u16)>) {
        let listener = bind_prefer(ports.map(|p| p.0)).await;
        let metrics = bind_prefer(ports.map(|p| p.1)).await;
        self.addr = listener.local_addr().expect("local addr");
        self.metrics_addr = metrics.local_addr().expect("local addr");
        self.cfg.listen = self.addr.to_string();
        self.cfg.metrics_listen = self.metrics_addr.to_string();
        self.cfg.public_base_url = Some(format!("http://{}", self.addr));
        if self.cfg.admin_listen.ends_with(":0") {
            self.cfg.admin_listen = format!("127.0.0.1:{}", free_port());
        }
        if self.cfg.hosts_tls_listen.ends_with(":0") {
            self.cfg.hosts_tls_listen = format!("127.0.0.1:{}", free_port());
        }
        self.shutdown = CancellationToken::new();
        let run = switchyard::run(self.cfg.clone(), listener, metrics, self.shutdown.clone());
        self.task = Some(tokio::spawn(run));
        // The admin listener is bound once the backends are up; with operators configured,
        // a test may use it as soon as the pod is started.
        if !self.cfg.operator_tokens.0.is_empty() {
            let admin = self.cfg.admin_listen.clone();
            eventually(Duration::from_secs(60), "the admin listener", || {
                let admin = admin.clone();
                async move { tokio::net::TcpStream::connect(admin).await.ok().map(drop) }
            })
            .await;
        }
    }

    /// `http://127.0.0.1:PORT`
    pub fn root_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The `im.webhook` Connector Base URL (with its path prefix).
    pub fn base_url(&self) -> String {
        self.prefix_url(PREFIX)
    }

    /// The Connector Base URL of the connector mounted under `prefix` (e.g. `/telegram`).
    pub fn prefix_url(&self, prefix: &str) -> String {
        format!("{}/{}", self.root_url(), prefix.trim_matches('/'))
    }

    /// `https://127.0.0.1:PORT`: the hosts mTLS listener.
    pub fn hosts_tls_url(&self) -> String {
        format!("https://{}", self.cfg.hosts_tls_listen)
    }

    pub fn metrics_url(&self) -> String {
        format!("http://{}", self.metrics_addr)
    }

    /// `http://127.0.0.1:PORT`: the admin listener (console, operator API).
    pub fn admin_url(&self) -> String {
        format!("http://{}", self.cfg.admin_listen)
    }

    pub fn api_key(&self) -> &str {
        &self.tenant.api_key
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// A simulator for this pod with the tenant's key.
    pub fn sim(&self) -> Sim {
        self.sim_with_key(Some(self.api_key()))
    }

    pub fn sim_with_key(&self, key: Option<&str>) -> Sim {
        Sim::new(&self.base_url(), key).expect("sim")
    }

    /// Status of `/readyz` on the metrics listener (None when it no longer answers).
    pub async fn readyz(&self) -> Option<u16> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .ok()?;
        client
            .get(format!("{}/readyz", self.metrics_url()))
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }

    /// Starts the drain (as SIGTERM would) without waiting for it.
    pub fn begin_stop(&self) {
        self.shutdown.cancel();
    }

    /// Waits for a started drain to finish; panics if `run` failed or hangs.
    pub async fn wait_stopped(&mut self) {
        if let Some(task) = self.task.take() {
            let r = tokio::time::timeout(Duration::from_secs(60), task)
                .await
                .expect("pod drains within 60s");
            r.expect("pod task")
                .expect("switchyard::run returned an error");
        }
    }

    /// Cancels the shutdown token and awaits the drain.
    pub async fn stop(&mut self) {
        self.begin_stop();
        self.wait_stopped().await;
    }

    /// Stops, then starts again on the same data dir (the same ports when still free).
    pub async fn restart(&mut self) {
        self.stop().await;
        let ports = (self.addr.port(), self.metrics_addr.port());
        self.launch(Some(ports)).await;
    }

    /// Stops, changes the configuration (a rotated operator token, say), then starts again
    /// on the same data dir and ports when still free.
    pub async fn restart_with(&mut self, f: impl FnOnce(&mut Config)) {
        self.stop().await;
        f(&mut self.cfg);
        let ports = (self.addr.port(), self.metrics_addr.port());
        self.launch(Some(ports)).await;
    }

    /// Opens the pod's store from outside, like the admin CLI does while the pod serves.
    async fn admin_store(&self) -> Arc<dyn switchyard_core::Store> {
        let store = switchyard::app::open_store(&self.cfg)
            .await
            .expect("open store");
        switchyard::app::prepare_schema(&self.cfg, store.as_ref())
            .await
            .expect("schema");
        store
    }

    /// Creates another tenant with its first key.
    pub async fn create_tenant(&self, name: &str) -> Tenant {
        let store = self.admin_store().await;
        let (t, key) = create_tenant(store.as_ref(), name)
            .await
            .expect("create tenant");
        Tenant {
            id: t.id,
            name: t.name,
            key_id: key.id,
            api_key: key.key.expose().to_owned(),
        }
    }

    /// Mints another key for a tenant; returns (key id, key).
    pub async fn create_key(&self, tenant_id: &str) -> (String, String) {
        let store = self.admin_store().await;
        let key = switchyard_core::engine::create_key(store.as_ref(), tenant_id)
            .await
            .expect("create key");
        (key.id, key.key.expose().to_owned())
    }

    pub async fn revoke_key(&self, key_id: &str) {
        let store = self.admin_store().await;
        store
            .revoke_api_key(key_id, now_ms())
            .await
            .expect("revoke key");
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        // A test that panicked mid-way must not leave the pod serving.
        self.shutdown.cancel();
    }
}

// ---- the fake chat system (target side of im.webhook) ---------------------------------

/// A chat system's webhook endpoint on 127.0.0.1:0 that checks signatures against `secret`;
/// the query carries a token that must never be shown.
pub async fn fake_endpoint(secret: &str) -> FakeWebhook {
    FakeWebhook::start(
        "/hooks/switchyard?token=chat-system-path-token",
        Some(secret),
    )
    .await
}

// ---- the data plane --------------------------------------------------------------------

/// Connects and completes hello with the webhook IM's Card; returns the connection and its
/// `connector_id`.
pub async fn hello(sim: &Sim, connector_id: Option<&str>, profiles: &[&str]) -> (Conn, String) {
    hello_card(sim, CARD_ID, connector_id, profiles).await
}

/// Connects and completes hello with `card` (the connector mounted where `sim` points);
/// checks what every hello ack promises (H-07) and returns the connection and its
/// `connector_id`.
pub async fn hello_card(
    sim: &Sim,
    card: &str,
    connector_id: Option<&str>,
    profiles: &[&str],
) -> (Conn, String) {
    let conn = sim.connect().await.expect("connect /ws");
    assert_eq!(
        conn.subprotocol(),
        Some("xagent.connector.packet.v1"),
        "server selects the subprotocol"
    );
    let ack = conn
        .hello(card, connector_id, profiles)
        .await
        .expect("hello")
        .expect_kind("connector.hello.ack")
        .expect("hello ack");
    let id = ack
        .str_at("/connector_id")
        .expect("connector_id in hello ack")
        .to_owned();
    assert!(!id.is_empty());
    assert_eq!(
        ack.str_at("/connector_card_id"),
        Some(card),
        "H-07 card id echoed"
    );
    assert_eq!(
        ack.str_at("/protocol_version"),
        Some("3.0"),
        "H-07 protocol version"
    );
    (conn, id)
}

/// `channel.open` (None = new channel); returns the channel id and the ack.
pub async fn open(conn: &Conn, channel: Option<&str>) -> (String, Envelope) {
    let ack = conn
        .open_channel(channel)
        .await
        .expect("channel.open")
        .expect_kind("channel.open.ack")
        .expect("open ack");
    let id = ack
        .connector_channel_id
        .clone()
        .expect("CH-03 envelope channel id");
    assert_eq!(
        ack.str_at("/connector_channel_id"),
        Some(id.as_str()),
        "CH-03 payload = envelope"
    );
    assert_eq!(
        ack.str_at("/connection_descriptor/connection/connector_channel_id"),
        Some(id.as_str()),
        "CH-03 descriptor = envelope"
    );
    (id, ack)
}

/// Opens a new channel and binds it with the form flow to `endpoint_url` and `secret`.
pub async fn bind_channel(conn: &Conn, endpoint_url: &str, secret: &str) -> (String, Envelope) {
    let (ch, _) = open(conn, None).await;
    let ack = auth_bind(conn, &ch, endpoint_url, secret).await;
    (ch, ack)
}

/// Runs the form flow on an open channel; asserts it authenticated.
pub async fn auth_bind(conn: &Conn, ch: &str, endpoint_url: &str, secret: &str) -> Envelope {
    let input = json!({"endpoint_url": endpoint_url, "signing_secret": secret});
    let ack = conn
        .auth_start(ch, FLOW_BINDING, input)
        .await
        .expect("auth.start")
        .expect_kind("auth.start.ack")
        .expect("start ack");
    assert_eq!(
        ack.str_at("/status"),
        Some("authenticated"),
        "form flow authenticates: {ack:?}"
    );
    assert_eq!(
        ack.str_at("/connection_descriptor/connection/status"),
        Some("connected")
    );
    ack
}

/// Checks a Descriptor against the schema, the prose rules and D-01..D-09.
pub fn check_descriptor(
    card: &Value,
    d: &Value,
    connector_id: &str,
    channel_id: &str,
    hello_profiles: &[&str],
) {
    if let Err(e) = schemas::validate_descriptor(d) {
        panic!("descriptor schema violations: {e:?}\n{d:#}");
    }
    let typed_card: Card = serde_json::from_value(card.clone()).expect("card parses");
    let typed: Descriptor = serde_json::from_value(d.clone()).expect("descriptor parses");
    assert_eq!(
        typed.violations(&typed_card),
        Vec::<String>::new(),
        "descriptor prose rules"
    );
    assert_eq!(d["schema"], "xagent.connection/v2", "D-01");
    assert_eq!(
        d["connection"]["connector_card_id"], card["connector_card_id"],
        "D-02"
    );
    assert_eq!(d["connection"]["connector_id"], connector_id, "D-03");
    assert_eq!(d["connection"]["connector_channel_id"], channel_id, "D-04");
    let tt = d["connection"]["target_type"].as_str().unwrap_or_default();
    assert!(
        card["supports"]["target_types"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == tt),
        "D-05"
    );
    let profiles: Vec<&str> = d["connection"]["profiles"]
        .as_array()
        .expect("profiles")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(!profiles.is_empty(), "D-06 non-empty");
    let mut dedup = profiles.clone();
    dedup.sort_unstable();
    dedup.dedup();
    assert_eq!(dedup.len(), profiles.len(), "D-06 no duplicates");
    for p in &profiles {
        assert!(
            hello_profiles.contains(p),
            "D-06/H-08 {p} was offered in hello"
        );
        assert!(
            card["supports"]["profiles"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c == p),
            "D-06 {p} in Card"
        );
    }
    assert!(
        !d["target"]["provider"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "D-07 provider"
    );
    assert!(d["target"]["display_name"].is_string(), "D-07 display_name");
    for t in d["tools"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let id = t["tool_id"].as_str().unwrap_or_default();
        assert!(
            card["tools"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["tool_id"] == id),
            "D-08 {id} in Card"
        );
    }
}

/// A pod, a fake endpoint and one IM v2 data plane with one bound channel: the baseline of
/// most scenarios.
pub struct Fixture {
    pub pod: Pod,
    pub sim: Sim,
    pub card: Value,
    pub endpoint: FakeWebhook,
    pub secret: String,
    pub conn: Conn,
    pub connector_id: String,
    pub channel_id: String,
    pub profiles: Vec<&'static str>,
}

impl Fixture {
    pub async fn start(opts: PodOptions) -> Self {
        Self::start_with_profiles(opts, &[IM_V2]).await
    }

    pub async fn start_with_profiles(opts: PodOptions, profiles: &[&'static str]) -> Self {
        let pod = Pod::start(opts).await;
        let sim = pod.sim();
        let card = sim.card().await.expect("card");
        let secret = new_secret();
        let endpoint = fake_endpoint(&secret).await;
        let (conn, connector_id) = hello(&sim, None, profiles).await;
        let (channel_id, ack) = bind_channel(&conn, endpoint.url(), &secret).await;
        let d = ack
            .at("/connection_descriptor")
            .expect("descriptor")
            .clone();
        check_descriptor(&card, &d, &connector_id, &channel_id, profiles);
        // The bind rings a descriptor push; take it so tests start from a quiet queue.
        let push = conn
            .next_push_of("connection.descriptor.push", WAIT)
            .await
            .expect("D-14 descriptor push after binding");
        assert_eq!(
            push.connector_channel_id.as_deref(),
            Some(channel_id.as_str())
        );
        Self {
            pod,
            sim,
            card,
            endpoint,
            secret,
            conn,
            connector_id,
            channel_id,
            profiles: profiles.to_vec(),
        }
    }

    /// `tool.invoke` of `tool_id` on the fixture's channel (with `call_id` as the tool call
    /// id); its `tool.invoke.ack`, carrying a `result` or an `error`.
    pub async fn invoke_ack(&self, tool_id: &str, args: Value, call_id: Option<&str>) -> Envelope {
        self.conn
            .invoke(&self.channel_id, tool_id, args, call_id)
            .await
            .expect("tool.invoke")
            .expect_kind("tool.invoke.ack")
            .expect("a tool.invoke.ack")
    }

    /// A signed JSON inbound message to the fixture's channel.
    pub async fn inbound(&self, body: &Value) -> (u16, Value) {
        InboundRequest::json(&self.secret, body)
            .send(&self.pod.base_url(), &self.channel_id)
            .await
    }

    pub async fn inbound_text(&self, message_id: &str, text: &str) -> u16 {
        self.inbound(
            &json!({"message_id": message_id, "text": text, "sender": {"id": "u1", "name": "Ada"}}),
        )
        .await
        .0
    }

    /// The next `chat.message` push on the fixture's connection.
    pub async fn next_chat(&self) -> Envelope {
        self.conn
            .next_push_of("chat.message", WAIT)
            .await
            .expect("a chat.message push")
    }

    /// Schema-clean, and neither the signing secret, the endpoint token nor the API key
    /// appears in any frame received or in the server log.
    pub fn assert_clean(&self) {
        assert_schema_clean(&self.sim);
        assert_no_secrets(
            &self.conn,
            &[&self.secret, "chat-system-path-token", self.pod.api_key()],
        );
        assert_not_logged(&self.secret);
        assert_not_logged(self.pod.api_key());
    }
}

/// S-01/S-02/C-35/D-10: none of `secrets` appears in any raw frame `conn` received.
pub fn assert_no_secrets(conn: &Conn, secrets: &[&str]) {
    for f in conn.frames() {
        for s in secrets {
            assert!(
                !f.contains(s),
                "a secret appears in a frame sent to xAgent: {f}"
            );
        }
    }
}

// ---- the real binary -------------------------------------------------------------------

/// Path of the `switchyard` binary next to the running test (`target/<profile>/`), built
/// first with the same profile and target dir (`cargo build -p switchyard --bin switchyard`,
/// a no-op when it is fresh, so a stale binary is never tested).
pub fn switchyard_binary() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| build_workspace_binary("switchyard", "switchyard"))
        .clone()
}

/// A free local port (bound, then released) for a child process to listen on.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Path of the `switchyard-host` binary (the agent host of `services/host-agent`), built
/// first exactly like [`switchyard_binary`] (`cargo build -p switchyard-host-agent --bin
/// switchyard-host` with the test's profile and target dir; a no-op when it is fresh).
pub fn switchyard_host_binary() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| build_workspace_binary("switchyard-host-agent", "switchyard-host"))
        .clone()
}

/// `cargo build -p PACKAGE --bin BIN` with the running test's profile and target dir;
/// returns the binary's path (`target/<profile>/BIN`). Callers cache the result.
pub fn build_workspace_binary(package: &str, bin: &str) -> PathBuf {
    // target/<profile>/deps/<test exe> -> target/<profile>
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>")
        .to_path_buf();
    let target_dir = profile_dir.parent().expect("target dir").to_path_buf();
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_owned(),
        Some(other) => other.to_owned(),
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("Cargo.toml");
    let mut cmd = std::process::Command::new(cargo);
    // `cargo test` gives the test process its own package variables; build scripts that
    // track one of them (ring tracks CARGO_MANIFEST_DIR) would otherwise see a change and
    // rebuild half the dependency graph, here and again in the next ordinary build.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("CARGO_PKG_")
            || matches!(
                k.as_ref(),
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
                    | "CARGO_RUSTC_CURRENT_DIR"
                    | "OUT_DIR"
            )
        {
            cmd.env_remove(k.as_ref());
        }
    }
    let status = cmd
        .args(["build", "--quiet", "-p", package, "--bin", bin])
        .args(["--profile", &profile])
        .arg("--manifest-path")
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", &target_dir)
        .status()
        .expect("run cargo build");
    assert!(
        status.success(),
        "cargo build -p {package} --bin {bin} failed"
    );
    let path = profile_dir.join(format!("{bin}{}", std::env::consts::EXE_SUFFIX));
    assert!(path.exists(), "{} missing after build", path.display());
    path
}

/// The start of the binding scenarios: a pod, a connection after `connector.hello` (im.v2)
/// with one open channel not yet bound, and a fake chat endpoint with its signing secret
/// ready for the binding flow.
pub struct OpenChannel {
    pub pod: Pod,
    pub sim: Sim,
    pub card: Value,
    pub secret: String,
    pub endpoint: FakeWebhook,
    pub conn: Conn,
    pub connector_id: String,
    pub ch: String,
}

impl OpenChannel {
    pub async fn start(opts: PodOptions) -> Self {
        let pod = Pod::start(opts).await;
        let sim = pod.sim();
        let card = sim.card().await.expect("card");
        let secret = new_secret();
        let endpoint = fake_endpoint(&secret).await;
        let (conn, connector_id) = hello(&sim, None, &[IM_V2]).await;
        let (ch, _) = open(&conn, None).await;
        Self {
            pod,
            sim,
            card,
            secret,
            endpoint,
            conn,
            connector_id,
            ch,
        }
    }
}

// ---- raw WebSocket frames, for clients a library would make too polite ----------------

/// One masked (client-to-server) final text frame.
pub fn masked_text_frame(payload: &[u8]) -> Vec<u8> {
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    let mut frame = vec![0x81];
    match payload.len() {
        n if n < 126 => frame.push(0x80 | n as u8),
        n if n <= 0xffff => {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            frame.push(0x80 | 127);
            frame.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    frame
}

/// The server's (unmasked, unfragmented) frames as (opcode, payload).
pub fn server_frames(mut bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut frames = Vec::new();
    while bytes.len() >= 2 {
        let op = bytes[0] & 0x0f;
        let (len, at) = match bytes[1] & 0x7f {
            126 => (u16::from_be_bytes([bytes[2], bytes[3]]) as usize, 4),
            127 => (
                u64::from_be_bytes(bytes[2..10].try_into().unwrap()) as usize,
                10,
            ),
            n => (n as usize, 2),
        };
        assert!(bytes.len() >= at + len, "frame cut short");
        frames.push((op, bytes[at..at + len].to_vec()));
        bytes = &bytes[at + len..];
    }
    frames
}
