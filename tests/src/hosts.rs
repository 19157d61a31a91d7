//! Test side of Connector API v1: enrolling a host against a pod and speaking the protocol
//! over the real mTLS listener with a raw client, so each rule of the seed can be poked
//! directly (the real host agent, `switchyard-host`, is driven as a process elsewhere).
//! The raw client is the simulated host agent of `switchyard_xagent_sim::host`, re-exported
//! here; this module adds what needs a [`Pod`].

use serde_json::{Value, json};
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
