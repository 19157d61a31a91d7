//! Test side of Connector API v1: enrolling a host against a pod and speaking the protocol
//! over the real mTLS listener with a raw client, so each rule of the seed can be poked
//! directly (the real host agent, `switchyard-host`, is driven as a process elsewhere).
//! The raw client is the simulated host agent of `switchyard_xagent_sim::host`, re-exported
//! here; this module adds what needs a [`Pod`].

use serde_json::{Value, json};
use switchyard_protocol::hosts::message::RunAccepted;
use switchyard_protocol::hosts::{HostMessage, Peer, parse_from};
// The raw host client lives in the simulator (the loadtest drives it too).
pub use switchyard_xagent_sim::host::{
    DEVICE_CARD, DEVICE_V1, Ended, EnrolledHost, FLOW_PAIRING, HostCallError, HostConn,
    connect_raw, enroll_with_token,
};

use crate::{Conn, EnvelopeExt, Pod, Sim};

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
            FLOW_PAIRING,
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

/// A `run_event` from the host: `ev` holds `event` and `payload` (and anything else), this
/// adds the run, the `seq` and a timestamp.
pub fn event(run_id: &str, seq: u64, ev: Value) -> HostMessage {
    let mut raw = ev;
    raw["type"] = json!("run_event");
    raw["run_id"] = json!(run_id);
    raw["seq"] = json!(seq);
    raw["timestamp"] = json!("2026-07-20T12:01:00Z");
    parse_from(Peer::Host, &raw.to_string()).expect("valid run_event")
}

/// The host's `run_accepted` of `run_id` (status running).
pub fn accepted(run_id: &str) -> HostMessage {
    HostMessage::RunAccepted(
        serde_json::from_value::<RunAccepted>(json!({"run_id": run_id, "status": "running"}))
            .expect("accepted"),
    )
}

/// The run a `create_run` or `cancel_run` from the server is about.
pub fn run_id_of(m: &HostMessage) -> String {
    match m {
        HostMessage::CreateRun(c) => c.run_id.clone(),
        HostMessage::CancelRun(c) => c.run_id.clone(),
        other => panic!("not a run message: {other:?}"),
    }
}

/// `agent_run_start` with `goal` on a device channel; the new run's id.
pub async fn start_run(conn: &Conn, ch: &str, goal: &str) -> String {
    let v = tool(conn, ch, "agent_run_start", json!({"goal": goal})).await;
    v["result"]["run_id"]
        .as_str()
        .unwrap_or_else(|| panic!("agent_run_start answered no run id: {v}"))
        .to_owned()
}

/// The setup most device scenarios start from: a host enrolled on the pod and online with
/// its agents, and an xAgent connection with a device channel bound to it by the pairing
/// code the host was given.
pub struct OnlineDevice {
    pub host: EnrolledHost,
    /// The host's socket, after `register` and `capabilities`.
    pub hc: HostConn,
    /// The `register_ack` config (it holds the pairing code).
    pub config: Value,
    pub sim: Sim,
    pub conn: Conn,
    pub ch: String,
}

/// Enrolls `name` on `pod`, brings it online with `agents` and binds a device channel to it.
pub async fn online_device(pod: &Pod, name: &str, agents: &[&str]) -> OnlineDevice {
    let host = enroll_host(pod, &pod.tenant.id, name).await;
    let (hc, config) = host.online(agents).await;
    let pairing = config["pairing_code"].as_str().expect("pairing code");
    let (sim, conn, ch) = bind_device_channel(pod, name, pairing).await;
    OnlineDevice {
        host,
        hc,
        config,
        sim,
        conn,
        ch,
    }
}
