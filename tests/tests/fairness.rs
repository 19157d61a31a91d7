//! Slow clients and tenant fairness on the public listener and the xAgent data plane:
//! header-read timeout, connection cap, WebSocket keepalive, refused requests that still get
//! their answer, and per-tenant quotas (rate, sockets, channels, stored bytes) whose
//! refusals name the limit and touch no other tenant.

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use serde_json::json;
use switchyard::config::Dur;
use switchyard_core::model::TenantQuota;
use switchyard_e2e::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads until the peer closes (Ok(bytes read)) or `within` passes (Err).
async fn read_until_closed(tcp: &mut TcpStream, within: Duration) -> Result<Vec<u8>, ()> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return Err(()),
        }
    }
}

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_cut_off() {
    let pod = Pod::start(
        PodOptions::default()
            .with(|c| c.limits.header_read_timeout = Dur(Duration::from_millis(500))),
    )
    .await;
    let mut tcp = TcpStream::connect(pod.root_url().trim_start_matches("http://"))
        .await
        .unwrap();
    // Slowloris: a request line and one header, then silence.
    tcp.write_all(b"GET /webhook/connector-card.json HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let t0 = Instant::now();
    read_until_closed(&mut tcp, Duration::from_secs(5))
        .await
        .expect("the pod closes a connection whose headers never complete");
    assert!(
        t0.elapsed() >= Duration::from_millis(400),
        "not before the timeout"
    );
    // A client that sends its request in time is served as usual.
    let r = reqwest::get(format!("{}/connector-card.json", pod.base_url()))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn connections_over_the_cap_get_a_clear_503_and_the_rest_are_served() {
    let pod = Pod::start(PodOptions::default().with(|c| c.limits.max_connections = 4)).await;
    let addr = pod.root_url().trim_start_matches("http://").to_owned();
    // Four idle connections hold every slot.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut tcp = TcpStream::connect(&addr).await.unwrap();
        tcp.write_all(b"GET /webhook/connector-card.json HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 1024];
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(
            std::str::from_utf8(&buf[..n])
                .unwrap()
                .starts_with("HTTP/1.1 200")
        );
        held.push(tcp);
    }
    let mut extra = TcpStream::connect(&addr).await.unwrap();
    let answer = read_until_closed(&mut extra, Duration::from_secs(5))
        .await
        .expect("refused and closed");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("\"overloaded\""), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("retry-after: 1"),
        "{text}"
    );
    drop(held);
    // Slots come back once those connections are gone.
    let http = reqwest::Client::new();
    eventually(Duration::from_secs(5), "a slot frees up", || {
        let http = http.clone();
        let url = format!("{}/connector-card.json", pod.base_url());
        async move {
            match http.get(url).send().await {
                Ok(r) if r.status() == 200 => Some(()),
                _ => None,
            }
        }
    })
    .await;
}

#[tokio::test]
async fn a_socket_that_answers_no_ping_is_closed_and_one_that_does_stays() {
    let pod = Pod::start(
        PodOptions::default().with(|c| c.limits.ws_ping_interval = Dur(Duration::from_millis(300))),
    )
    .await;
    // The simulator reads its socket (and so answers the pod's WebSocket pings): it stays
    // open well past two ping intervals.
    let (live, _) = hello(&pod.sim(), None, &["xagent.im.v2"]).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(live.closed().is_none());
    live.ping().await.expect("still served");

    // A peer that answers no ping: closed with 1008 after two intervals. The client is raw
    // bytes over TCP, so nothing (unlike a WebSocket library reading its socket) sends a pong
    // however late the test reads what the pod sent.
    let addr = pod.root_url().trim_start_matches("http://").to_owned();
    let mut tcp = TcpStream::connect(&addr).await.unwrap();
    let upgrade = format!(
        "GET /{}/ws HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Protocol: xagent.connector.packet.v1\r\nAuthorization: Bearer {}\r\n\r\n",
        PREFIX.trim_matches('/'),
        addr,
        pod.api_key()
    );
    tcp.write_all(upgrade.as_bytes()).await.unwrap();
    let hello = json!({"type": "connector.hello", "protocol_version": "3.0", "request_id": "h1",
        "payload": {"connector_card_id": CARD_ID, "protocol_version": "3.0", "supported_profiles": ["xagent.im.v2"]}});
    tcp.write_all(&masked_text_frame(hello.to_string().as_bytes()))
        .await
        .unwrap();
    let t0 = Instant::now();
    let got = read_until_closed(&mut tcp, Duration::from_secs(10))
        .await
        .expect("the pod closes a socket that answers no ping");
    let elapsed = t0.elapsed();
    let head_end = got
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP answer")
        + 4;
    assert!(got.starts_with(b"HTTP/1.1 101"), "upgraded");
    let frames = server_frames(&got[head_end..]);
    assert!(
        frames.iter().any(|(op, _)| *op == 0x9),
        "the pod pinged before giving up"
    );
    let (op, close) = frames.last().expect("a close frame");
    assert_eq!(*op, 0x8, "the last frame closes");
    let code = u16::from_be_bytes([close[0], close[1]]);
    assert_eq!(
        (code, std::str::from_utf8(&close[2..]).unwrap()),
        (1008, "keepalive timeout")
    );
    assert!(
        elapsed >= Duration::from_millis(500),
        "not closed before two intervals: {elapsed:?}"
    );
}

#[tokio::test]
async fn an_upload_refused_for_its_key_still_reads_its_401() {
    let pod = Pod::start(PodOptions::default()).await;
    // A small multipart body streamed in pieces, without a key: the refusal comes before the
    // body is read, yet the client must see the 401 rather than a broken pipe.
    let boundary = "XyZ";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.bin\"\r\n\r\n"
    )
    .into_bytes();
    body.extend(std::iter::repeat_n(b'a', 48 * 1024));
    body.extend(format!("\r\n--{boundary}--\r\n").into_bytes());
    for _ in 0..5 {
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
            body.chunks(4096).map(|c| Ok(c.to_vec())).collect();
        let stream = futures::stream::iter(chunks).then(|c| async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            c
        });
        let r = reqwest::Client::new()
            .post(format!("{}/files/uploads", pod.base_url()))
            .header(
                "content-type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .body(reqwest::Body::wrap_stream(stream))
            .send()
            .await
            .expect("the answer arrives, not a reset");
        assert_eq!(r.status(), 401);
    }
}

async fn set_quota(pod: &Pod, q: TenantQuota) {
    let store = switchyard::app::open_store(pod.config()).await.unwrap();
    store.set_tenant_quota(&q).await.unwrap();
}

fn quota_pod() -> PodOptions {
    PodOptions::default().with(|c| c.quotas.refresh_interval = Dur(Duration::from_millis(100)))
}

#[tokio::test]
async fn a_tenant_over_its_request_rate_is_rate_limited_and_another_is_not() {
    let pod = Pod::start(quota_pod()).await;
    let other = pod.create_tenant("tenant-b").await;
    set_quota(
        &pod,
        TenantQuota {
            tenant_id: pod.tenant.id.clone(),
            requests_per_second: Some(5),
            updated_at: 1,
            ..TenantQuota::default()
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (a, _) = hello(&pod.sim(), None, &["xagent.im.v2"]).await;
    let (b, _) = hello(
        &pod.sim_with_key(Some(&other.api_key)),
        None,
        &["xagent.im.v2"],
    )
    .await;
    let (ch_a, _) = open(&a, None).await;
    let (ch_b, _) = open(&b, None).await;
    let mut limited = Vec::new();
    for _ in 0..40 {
        let r = a.descriptor_get(&ch_a).await.unwrap();
        if r.error_code() == Some("rate_limited") {
            limited.push(r);
        }
    }
    assert!(limited.len() >= 25, "only {} of 40 refused", limited.len());
    let msg = limited[0]
        .error
        .as_ref()
        .unwrap()
        .message
        .clone()
        .unwrap_or_default();
    assert!(msg.contains("requests_per_second (5/s)"), "{msg}");
    // Tenant B, on the same pod at the same time, is not slowed by A's quota.
    for _ in 0..40 {
        b.descriptor_get(&ch_b)
            .await
            .unwrap()
            .expect_kind("connection.descriptor.get.ack")
            .expect("tenant b served");
    }
    // A's bucket refills: A is served again after a pause.
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.descriptor_get(&ch_a)
        .await
        .unwrap()
        .expect_kind("connection.descriptor.get.ack")
        .expect("served after the pause");
}

/// `chat.message.delta` is work like any other request: a tenant that streams deltas faster
/// than its rate is refused `rate_limited` (each delta is also bytes in the shared ephemeral
/// state).
#[tokio::test]
async fn deltas_count_against_the_request_rate() {
    let pod = Pod::start(quota_pod()).await;
    set_quota(
        &pod,
        TenantQuota {
            tenant_id: pod.tenant.id.clone(),
            requests_per_second: Some(5),
            updated_at: 1,
            ..TenantQuota::default()
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (a, _) = hello(&pod.sim(), None, &["xagent.im.v2"]).await;
    let (ch, _) = open(&a, None).await;
    for i in 0..40 {
        a.send_delta(&ch, &format!("m{i}"), 1, "a few words")
            .await
            .unwrap();
    }
    let mut limited = Vec::new();
    while let Some(e) = a.next_push_of("error", QUIET).await {
        if e.error_code() == Some("rate_limited") {
            limited.push(e);
        }
    }
    assert!(
        limited.len() >= 25,
        "only {} of 40 deltas refused",
        limited.len()
    );
    let msg = limited[0]
        .error
        .as_ref()
        .unwrap()
        .message
        .clone()
        .unwrap_or_default();
    assert!(msg.contains("requests_per_second (5/s)"), "{msg}");
}

#[tokio::test]
async fn socket_channel_and_stored_byte_quotas_refuse_with_busy_naming_the_quota() {
    let pod = Pod::start(quota_pod()).await;
    set_quota(
        &pod,
        TenantQuota {
            tenant_id: pod.tenant.id.clone(),
            sockets: Some(1),
            channels: Some(2),
            stored_bytes: Some(10),
            updated_at: 1,
            ..TenantQuota::default()
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (a, _) = hello(&pod.sim(), None, &["xagent.im.v2"]).await;
    // A second socket of the same tenant is over its quota of one.
    let second = pod.sim().connect().await.unwrap();
    let refused = second
        .hello(CARD_ID, None, &["xagent.im.v2"])
        .await
        .unwrap();
    assert_eq!(refused.error_code(), Some("busy"));
    assert!(
        refused
            .error
            .as_ref()
            .unwrap()
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("tenant quota sockets (1)"),
        "{refused:?}"
    );
    // Two channels, then the quota.
    let (ch, _) = open(&a, None).await;
    open(&a, None).await;
    let third = a.open_channel(None).await.unwrap();
    assert_eq!(third.error_code(), Some("busy"));
    assert!(
        third
            .error
            .as_ref()
            .unwrap()
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("tenant quota channels (2)")
    );
    // Reopening an existing channel is not a new one.
    open(&a, Some(&ch)).await;
    // Stored bytes: a file must fit whole with what is stored (counted with the insert): 8
    // bytes fit in 10, 8 more do not, though the tenant is under its quota when it asks.
    let upload = |n: usize| {
        let url = format!("{}/files/uploads", pod.base_url());
        let key = pod.api_key().to_owned();
        let ch = ch.clone();
        async move {
            let form = reqwest::multipart::Form::new().part(
                "file",
                reqwest::multipart::Part::bytes(vec![b'x'; n]).file_name("f.bin"),
            );
            let r = reqwest::Client::new()
                .post(url)
                .bearer_auth(key)
                .header("x-xagent-connector-channel-id", ch)
                .multipart(form)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    assert_eq!(upload(8).await.0, 200);
    let (status, body) = upload(8).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("tenant quota stored_bytes (10)"), "{body}");
}

/// Stored bytes hold on every path that stores bytes: a file that arrives from a chat system
/// and a host artifact count like an upload, and each is refused when it would pass the
/// quota (files from chat systems were counted but never refused, artifacts not counted).
#[tokio::test]
async fn chat_system_files_and_host_artifacts_count_against_stored_bytes() {
    use base64::Engine as _;
    use switchyard_e2e::hosts::{accepted, online_device, start_run};
    use switchyard_protocol::hosts::message::UploadArtifact;
    use switchyard_protocol::hosts::{HostErrorCode, HostMessage, MessageType};

    let fx = Fixture::start(quota_pod()).await;
    set_quota(
        &fx.pod,
        TenantQuota {
            tenant_id: fx.pod.tenant.id.clone(),
            stored_bytes: Some(1000),
            updated_at: 1,
            ..TenantQuota::default()
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let file = |id: &str| {
        let b64 = base64::engine::general_purpose::STANDARD.encode(vec![b'f'; 600]);
        json!({"message_id": id, "files": [{"filename": "a.bin", "content_base64": b64}]})
    };
    let (status, _) = fx.inbound(&file("f1")).await;
    assert_eq!(status, 202, "600 of 1000 bytes");
    let (status, body) = fx.inbound(&file("f2")).await;
    assert_eq!(status, 507, "{body}");
    assert_eq!(body["error"]["code"], "quota_exceeded", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("tenant quota stored_bytes (1000)"),
        "{body}"
    );

    // A host artifact reserves its declared size: 600 more do not fit, 300 do, and no more
    // than declared may be put.
    let dev = online_device(&fx.pod, "art-box", &["writer"]).await;
    let mut hc = dev.hc;
    let run = start_run(&dev.conn, &dev.ch, "write results").await;
    let _ = hc.expect(MessageType::CreateRun).await;
    hc.send(&accepted(&run)).await;
    let upload = |size: u64| {
        HostMessage::UploadArtifact(UploadArtifact {
            run_id: run.clone(),
            name: "out.bin".into(),
            content_type: "application/octet-stream".into(),
            size_bytes: size,
        })
    };
    hc.send(&upload(600)).await;
    let HostMessage::Error(e) = hc.expect(MessageType::Error).await else {
        unreachable!()
    };
    assert_eq!(e.code, HostErrorCode::QuotaExceeded, "{e:?}");
    assert!(
        e.message.contains("tenant quota stored_bytes (1000)"),
        "{e:?}"
    );
    hc.send(&upload(300)).await;
    let HostMessage::UploadArtifactAck(up) = hc.expect(MessageType::UploadArtifactAck).await else {
        unreachable!()
    };
    let put = |n: usize| {
        reqwest::Client::new()
            .put(&up.upload_url)
            .body(vec![b'a'; n])
            .send()
    };
    assert_eq!(put(400).await.unwrap().status(), 413, "more than declared");
    assert_eq!(put(300).await.unwrap().status(), 200);
}
