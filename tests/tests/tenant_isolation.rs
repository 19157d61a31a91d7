//! One tenant with bad intent against the others, on the real binary with its default limits
//! (issue 23, findings 1 and 2): slow webhook bodies that would hold the pod's ingress slots,
//! and a delta flood that would fill the shared ephemeral state. Each scenario prints what
//! the victim saw (status codes, latency) and asserts that it was served. Run one against
//! another build with `SWITCHYARD_E2E_BIN=path/to/switchyard` (the figures before a fix).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use switchyard_e2e::spawned::{SpawnedPod, binary};
use switchyard_e2e::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The status of the first answer in `bytes` (`HTTP/1.1 408 ...`), 0 when there is none.
fn status_of(bytes: &[u8]) -> u16 {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// One slow-body request as the attack sends it: valid headers (a fresh timestamp, a
/// signature of the right shape), a declared 1000-byte JSON body, then one byte every 5 s.
/// Returns the pod's answer (0 = it closed without one) and how long the request was held.
async fn slow_body(addr: &str, path: &str) -> (u16, Duration) {
    let start = Instant::now();
    let Ok(mut tcp) = TcpStream::connect(addr).await else {
        return (0, start.elapsed());
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: 1000\r\nx-switchyard-timestamp: {now}\r\n\
         x-switchyard-signature: v1={}\r\n\r\n{{",
        "0".repeat(64)
    );
    if tcp.write_all(head.as_bytes()).await.is_err() {
        return (0, start.elapsed());
    }
    let mut buf = [0u8; 1024];
    while start.elapsed() < Duration::from_secs(60) {
        match tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => return (status_of(&buf[..n]), start.elapsed()),
            Ok(_) => return (0, start.elapsed()),
            Err(_) => {
                if tcp.write_all(b" ").await.is_err() {
                    return (0, start.elapsed());
                }
            }
        }
    }
    (0, start.elapsed())
}

/// Counts of each value, in order of first appearance.
fn tally(v: &[u16]) -> Vec<(u16, usize)> {
    let mut out: Vec<(u16, usize)> = Vec::new();
    for &x in v {
        match out.iter_mut().find(|(k, _)| *k == x) {
            Some((_, n)) => *n += 1,
            None => out.push((x, 1)),
        }
    }
    out
}

/// Finding 1: tenant A keeps 8 slow bodies open on each of 8 of its own webhook channels (64,
/// the whole per-pod pool before the fix), reopening each as soon as it is answered. Tenant
/// B's correctly signed messages, at once and later, must be accepted; A's slow bodies must
/// be cut after seconds, not after the 30 s body timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenants_slow_bodies_leave_other_tenants_their_webhook_ingress() {
    let bin = tokio::task::spawn_blocking(binary).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pod = SpawnedPod::start(&bin, dir.path(), &[]).await;
    let base = format!("{}{PREFIX}", pod.root_url());
    let addr = format!("127.0.0.1:{}", pod.port);

    let secret_a = new_secret();
    let endpoint_a = fake_endpoint(&secret_a).await;
    let sim_a = Sim::new(&base, Some(&pod.api_key)).unwrap();
    let (conn_a, _) = hello(&sim_a, None, &[IM_V2]).await;
    let mut channels_a = Vec::new();
    for _ in 0..8 {
        channels_a.push(bind_channel(&conn_a, endpoint_a.url(), &secret_a).await.0);
    }
    let key_b = pod.create_tenant("tenant-b").await;
    let secret_b = new_secret();
    let endpoint_b = fake_endpoint(&secret_b).await;
    let sim_b = Sim::new(&base, Some(&key_b)).unwrap();
    let (conn_b, _) = hello(&sim_b, None, &[IM_V2]).await;
    let (channel_b, _) = bind_channel(&conn_b, endpoint_b.url(), &secret_b).await;

    // The attack: 64 slow bodies, each reopened when the pod answers it (after Retry-After
    // when refused at once).
    let stop = Arc::new(AtomicBool::new(false));
    let mut attackers = Vec::new();
    for ch in &channels_a {
        for _ in 0..8 {
            let (stop, addr) = (stop.clone(), addr.clone());
            let path = format!("{PREFIX}/inbound/{ch}");
            attackers.push(tokio::spawn(async move {
                let mut answers = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let (status, held) = slow_body(&addr, &path).await;
                    answers.push((status, held));
                    if held < Duration::from_secs(1) {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
                answers
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let attack_start = Instant::now();

    // The victim: tenant B's signed messages at once, after 5 s and after 21 s.
    let mut victim = Vec::new();
    for (i, at) in [0u64, 5, 21].into_iter().enumerate() {
        let wait = Duration::from_secs(at).saturating_sub(attack_start.elapsed());
        tokio::time::sleep(wait).await;
        let sent = Instant::now();
        let (status, _) = InboundRequest::json(
            &secret_b,
            &json!({"message_id": format!("b{i}"), "text": "hello from tenant B"}),
        )
        .send(&base, &channel_b)
        .await;
        victim.push((at, status, sent.elapsed()));
    }
    stop.store(true, Ordering::SeqCst);
    let mut answers = Vec::new();
    for a in attackers {
        answers.extend(a.await.unwrap());
    }
    let statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
    let mut cut: Vec<Duration> = answers
        .iter()
        .filter(|(s, _)| *s == 408)
        .map(|(_, d)| *d)
        .collect();
    cut.sort();
    println!(
        "binary {}: tenant B's messages under 64 slow bodies of tenant A: {}; tenant A's slow \
         bodies answered {:?}, the 408s after {:?} (median) to {:?} (longest)",
        bin.display(),
        victim
            .iter()
            .map(|(at, s, d)| format!("t+{at}s -> {s} in {} ms", d.as_millis()))
            .collect::<Vec<_>>()
            .join(", "),
        tally(&statuses),
        cut.get(cut.len() / 2),
        cut.last(),
    );
    for (at, status, _) in &victim {
        assert_eq!(
            *status, 202,
            "tenant B's message at t+{at}s was refused while tenant A held its slow bodies"
        );
    }
    assert!(
        !cut.is_empty() && cut.iter().all(|d| *d < Duration::from_secs(10)),
        "tenant A's slow bodies are cut after seconds: {cut:?}"
    );
}

const DELTA_BYTES: usize = 255 * 1024;
const FLOOD_DELTAS: usize = 262;

/// An operator's console sign-in through the form: the answer's status (`303` signed in,
/// `503` when the session could not be kept, `0` when the pod serves no console here) and
/// how long the POST took.
async fn console_sign_in(root: &str, token: &str) -> (u16, Duration) {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let Ok(form) = http.get(format!("{root}/console/login")).send().await else {
        return (0, Duration::ZERO);
    };
    if form.status() != 200 {
        return (0, Duration::ZERO);
    }
    let cookies: Vec<String> = form
        .headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|c| c.split(';').next().map(str::to_owned))
        .collect();
    let body = form.text().await.unwrap();
    let Some(at) = body.find("name=\"csrf\" value=\"") else {
        return (0, Duration::ZERO);
    };
    let rest = &body[at + "name=\"csrf\" value=\"".len()..];
    let csrf = &rest[..rest.find('"').unwrap()];
    let sent = Instant::now();
    let r = http
        .post(format!("{root}/console/login"))
        .header(reqwest::header::COOKIE, cookies.join("; "))
        .form(&[("csrf", csrf), ("token", token)])
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), sent.elapsed())
}

/// Whether `e` answers the packet `to`.
fn answers(e: &Envelope, to: &Envelope) -> bool {
    (e.request_id.is_some() && e.request_id == to.request_id)
        || e.reply_to.as_deref() == Some(to.packet_id.as_str())
}

/// The error packets on `conn` (code, message) before the one answering `sentinel`, a delta
/// out of sequence sent last: the channel's worker takes deltas in order, so every earlier
/// delta's refusal has come by then. Waits up to `within` for the sentinel's.
async fn errors_before(
    conn: &Conn,
    sentinel: &Envelope,
    within: Duration,
) -> Vec<(String, String)> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    while let Some(e) = conn
        .next_push_of("error", deadline.saturating_duration_since(Instant::now()))
        .await
    {
        if answers(&e, sentinel) {
            return seen;
        }
        let (code, message) = e
            .error
            .map(|b| (b.code, b.message.unwrap_or_default()))
            .unwrap_or_default();
        seen.push((code, message));
    }
    panic!("no answer to the sentinel delta within {within:?}; errors so far {seen:?}");
}

/// Finding 2: tenant A sends 262 deltas of 255 KiB on as many messages (enough to fill the
/// in-process ephemeral state's 64 MiB) within about 12 s, then 1 KiB and 64-byte ones into
/// the room left. Afterwards tenant B's 1 KiB deltas must still be kept (a second one in
/// sequence is not refused as out of order), and an operator must still be able to sign in
/// to the console.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenants_delta_flood_leaves_others_their_ephemeral_state() {
    let bin = tokio::task::spawn_blocking(binary).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let token = switchyard_core::ids::random_secret(32);
    let tokens = format!("ops={token}");
    let pod = SpawnedPod::start(
        &bin,
        dir.path(),
        &[("SWITCHYARD_OPERATOR_TOKENS", tokens.as_str())],
    )
    .await;
    let root = pod.root_url();
    let base = format!("{root}{PREFIX}");

    let secret = new_secret();
    let endpoint = fake_endpoint(&secret).await;
    let sim_a = Sim::new(&base, Some(&pod.api_key)).unwrap();
    let (conn_a, _) = hello(&sim_a, None, &[IM_V2]).await;
    let (channel_a, _) = bind_channel(&conn_a, endpoint.url(), &secret).await;
    let key_b = pod.create_tenant("tenant-b").await;
    let sim_b = Sim::new(&base, Some(&key_b)).unwrap();
    let (conn_b, _) = hello(&sim_b, None, &[IM_V2]).await;
    let (channel_b, _) = bind_channel(&conn_b, endpoint.url(), &secret).await;
    let console = pod.console_url();
    let (before_sign_in, _) = console_sign_in(&console, &token).await;

    let flood_start = Instant::now();
    // The big deltas at about 22 a second, as the attack was run (within the channel's work
    // queue), then smaller ones into what room is left.
    let waves = [
        (FLOOD_DELTAS, DELTA_BYTES, 45),
        (300, 1024, 5),
        (100, 64, 5),
    ];
    for (wave, (count, bytes, gap_ms)) in waves.into_iter().enumerate() {
        let chunk = "x".repeat(bytes);
        for i in 0..count {
            conn_a
                .send_delta(&channel_a, &format!("flood-{wave}-{i}"), 1, &chunk)
                .await
                .expect("send delta");
            tokio::time::sleep(Duration::from_millis(gap_ms)).await;
        }
    }
    let sentinel = conn_a
        .send_delta(&channel_a, "sentinel", 2, "x")
        .await
        .unwrap();
    let a_errors = errors_before(&conn_a, &sentinel, Duration::from_secs(60)).await;
    let flood_took = flood_start.elapsed();

    // The victims, once the flood is in.
    let sent = Instant::now();
    let answer = "b".repeat(1024);
    conn_b
        .send_delta(&channel_b, "b-answer", 1, &answer)
        .await
        .unwrap();
    conn_b
        .send_delta(&channel_b, "b-answer", 2, &answer)
        .await
        .unwrap();
    let sentinel = conn_b
        .send_delta(&channel_b, "b-sentinel", 2, "x")
        .await
        .unwrap();
    let b_errors = errors_before(&conn_b, &sentinel, Duration::from_secs(30)).await;
    let b_took = sent.elapsed();
    let (sign_in, sign_in_took) = console_sign_in(&console, &token).await;

    let a_codes: Vec<&str> = a_errors.iter().map(|(c, _)| c.as_str()).collect();
    let refused_a = a_codes.iter().filter(|c| **c == "rate_limited").count();
    println!(
        "binary {}: tenant A sent {FLOOD_DELTAS} deltas of {} KiB and 400 small ones in {:.1} s; A was refused \
         {refused_a} of them rate_limited (errors {:?}); tenant B's two deltas then: errors \
         {:?} ({} ms until its sentinel); console sign-in before the flood {before_sign_in}, \
         after it {sign_in} in {:.1} ms",
        bin.display(),
        DELTA_BYTES / 1024,
        flood_took.as_secs_f64(),
        tally_codes(&a_codes),
        b_errors,
        b_took.as_millis(),
        sign_in_took.as_secs_f64() * 1000.0,
    );
    assert!(
        b_errors.is_empty(),
        "tenant B's delta was dropped after tenant A's flood: {b_errors:?}"
    );
    assert!(
        refused_a > 0,
        "tenant A's flood is held to its ephemeral budget: {a_codes:?}"
    );
    if before_sign_in != 0 {
        assert_eq!(
            sign_in, before_sign_in,
            "console sign-in answers as before the flood"
        );
    }
}

fn tally_codes(v: &[&str]) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for x in v {
        match out.iter_mut().find(|(k, _)| k == x) {
            Some((_, n)) => *n += 1,
            None => out.push(((*x).to_owned(), 1)),
        }
    }
    out
}
