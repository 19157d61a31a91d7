//! A bare tokio-tungstenite server (in a process of its own, [`BareProcess`]): the limit that the pods' `/ws`
//! connect + hello rate and ping/pong round trips are compared with, driven by the very same
//! client (`switchyard_xagent_sim::Conn`, which also schema-checks what it receives).
//!
//! Per text frame it parses the JSON and answers like a minimal connector would, with a
//! packet of similar size: `ping` -> `pong` (same `request_id`, `reply_to` the ping), a
//! `connector.hello` -> `connector.hello.ack` with a payload copied from a real pod's ack
//! (so the client checks the same shape), anything else is echoed back as is. It accepts the
//! subprotocol the client offers and sets `TCP_NODELAY`, as the pods do.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::{SinkExt, StreamExt};
use serde::Serialize;
use serde_json::{Value, json};
use switchyard_xagent_sim::{Conn, EnvelopeExt, Sim, packet};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_util::sync::CancellationToken;

use crate::stats::Latency;

const SUBPROTOCOL_HEADER: &str = "sec-websocket-protocol";

pub struct BareServer {
    pub base_url: String,
    stop: CancellationToken,
}

impl Drop for BareServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl BareServer {
    /// Listens on `127.0.0.1:0`; `hello_ack` is the payload of its `connector.hello.ack`s.
    pub async fn start(hello_ack: Value) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let hello_ack = Arc::new(hello_ack);
        let s = stop.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = tokio::select! {
                    _ = s.cancelled() => return,
                    r = listener.accept() => match r {
                        Ok(x) => x,
                        Err(_) => {
                            // Out of file descriptors, most likely: back off instead of spinning.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                };
                let _ = tcp.set_nodelay(true);
                tokio::spawn(serve(tcp, hello_ack.clone(), s.clone()));
            }
        });
        Ok(Self {
            // The simulator appends /ws to a Base URL; the server ignores the path.
            base_url: format!("http://{addr}/bare"),
            stop,
        })
    }
}

/// Accepts the first subprotocol the client offers (the client insists on getting one).
#[allow(clippy::result_large_err)]
fn pick_subprotocol(req: &Request, mut resp: Response) -> Result<Response, ErrorResponse> {
    let offered = req
        .headers()
        .get(SUBPROTOCOL_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(|v| v.trim().to_owned());
    if let Some(p) = offered
        && let Ok(v) = HeaderValue::from_str(&p)
    {
        resp.headers_mut().insert(SUBPROTOCOL_HEADER, v);
    }
    Ok(resp)
}

/// First argument of the loadtest binary when it runs as the bare server's process.
pub const CHILD_ARG: &str = "__bare-server";

/// The bare server in a process of its own (this binary re-run with [`CHILD_ARG`]), so it
/// has its own runtime and threads like a pod instead of sharing the client's. It prints its
/// Base URL on the first line of stdout and exits when its stdin closes (this process ended)
/// or when it is killed with the handle.
pub struct BareProcess {
    pub base_url: String,
    _child: tokio::process::Child,
}

impl BareProcess {
    pub async fn start(hello_ack: &Value) -> anyhow::Result<Self> {
        use tokio::io::AsyncBufReadExt as _;
        let exe = std::env::current_exe()?;
        let mut child = tokio::process::Command::new(exe)
            .arg(CHILD_ARG)
            .arg(hello_ack.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let out = child
            .stdout
            .take()
            .context("no stdout of the bare server")?;
        let mut line = String::new();
        tokio::time::timeout(
            Duration::from_secs(10),
            tokio::io::BufReader::new(out).read_line(&mut line),
        )
        .await
        .context("the bare server did not start within 10 s")??;
        let base_url = line.trim().to_owned();
        if !base_url.starts_with("http://") {
            anyhow::bail!("the bare server printed {line:?}");
        }
        Ok(Self {
            base_url,
            _child: child,
        })
    }
}

/// The bare server process: serves until stdin closes.
pub async fn child_main(hello_ack: Option<String>) {
    use tokio::io::AsyncReadExt as _;
    let ack = hello_ack
        .and_then(|a| serde_json::from_str(&a).ok())
        .unwrap_or_else(|| json!({}));
    let server = match BareServer::start(ack).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bare server: {e:#}");
            std::process::exit(1);
        }
    };
    println!("{}", server.base_url);
    let mut sink = Vec::new();
    let _ = tokio::io::stdin().read_to_end(&mut sink).await;
    drop(server);
}

async fn serve(tcp: tokio::net::TcpStream, hello_ack: Arc<Value>, stop: CancellationToken) {
    let Ok(ws) = tokio_tungstenite::accept_hdr_async(tcp, pick_subprotocol).await else {
        return;
    };
    let (mut tx, mut rx) = ws.split();
    loop {
        let msg = tokio::select! {
            _ = stop.cancelled() => return,
            m = rx.next() => m,
        };
        let Some(Ok(msg)) = msg else { return };
        let out = match msg {
            Message::Text(t) => Message::text(answer(t.as_str(), &hello_ack)),
            Message::Close(_) => {
                let _ = tx.close().await;
                return;
            }
            _ => continue,
        };
        if tx.send(out).await.is_err() {
            return;
        }
    }
}

fn answer(text: &str, hello_ack: &Value) -> String {
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        return text.to_owned();
    };
    let kind = v.get("type").and_then(Value::as_str).unwrap_or_default();
    let (reply, payload) = match kind {
        "ping" => ("pong", json!({})),
        "connector.hello" => ("connector.hello.ack", hello_ack.clone()),
        _ => return text.to_owned(),
    };
    let mut out = packet(reply, None, payload);
    out.request_id = v
        .get("request_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    out.reply_to = v
        .get("packet_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    out.to_json()
}

/// Round trips of one side of `--ping-compare`.
#[derive(Debug, Clone, Serialize)]
pub struct PingRun {
    pub target: String,
    pub sockets: usize,
    pub round_trips: u64,
    pub seconds: f64,
    pub round_trips_per_s: f64,
    pub rtt_ms: Latency,
    pub failures: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PingCompare {
    pub pod: PingRun,
    pub bare: PingRun,
    /// pod / bare.
    pub ratio: f64,
}

/// The pod (through `pod_sim`) and then the bare server, each with `sockets` sockets for
/// `duration`.
pub async fn ping_compare(
    pod_sim: &Sim,
    card: &str,
    profiles: &[&str],
    sockets: usize,
    duration: Duration,
) -> anyhow::Result<PingCompare> {
    let (pod, hello_ack) = ping_run("pod", pod_sim, card, profiles, sockets, duration).await?;
    let server = BareProcess::start(&hello_ack).await?;
    let sim = Sim::new(&server.base_url, Some("bare"))?
        .with_frame_recording(false)
        .with_request_timeout(Duration::from_secs(30));
    let (bare, _) = ping_run(
        "bare tokio-tungstenite server",
        &sim,
        card,
        profiles,
        sockets,
        duration,
    )
    .await?;
    Ok(PingCompare {
        ratio: crate::figures::ratio(pod.round_trips_per_s, bare.round_trips_per_s),
        pod,
        bare,
    })
}

impl PingCompare {
    pub fn line(&self) -> String {
        let one = |r: &PingRun| {
            format!(
                "{}: {:.0}/s (rtt p50 {:.3} p99 {:.3} ms, {} failed)",
                r.target, r.round_trips_per_s, r.rtt_ms.p50, r.rtt_ms.p99, r.failures
            )
        };
        format!(
            "ping compare, {} socket(s) with one ping in flight each, {:.1}s per side: {}; {}; pod/bare {:.2}",
            self.pod.sockets,
            self.pod.seconds,
            one(&self.pod),
            one(&self.bare),
            self.ratio
        )
    }
}

/// `sockets` connections that each say hello and then send `ping`s back to back (one in
/// flight per socket) for `duration`. Also returns the first hello answer's payload.
async fn ping_run(
    target: &str,
    sim: &Sim,
    card: &str,
    profiles: &[&str],
    sockets: usize,
    duration: Duration,
) -> anyhow::Result<(PingRun, Value)> {
    let mut conns: Vec<Conn> = Vec::new();
    let mut hello_ack = None;
    for _ in 0..sockets {
        let c = sim.connect().await?;
        let ack = c
            .hello(card, None, profiles)
            .await?
            .expect_kind("connector.hello.ack")?;
        hello_ack.get_or_insert(ack.payload.unwrap_or_default());
        conns.push(c);
    }
    // A short warm-up, so connection setup is not part of the figure.
    let warm = Instant::now() + Duration::from_millis(300);
    for c in &conns {
        while Instant::now() < warm {
            c.ping().await?;
        }
    }
    let started = Instant::now();
    let deadline = started + duration;
    let tasks: Vec<_> = conns
        .iter()
        .cloned()
        .map(|c| {
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut failures = 0u64;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    match c.ping().await {
                        Ok(p) if p.clone().expect_kind("pong").is_ok() => {
                            lat.push(t.elapsed().as_micros() as u64)
                        }
                        _ => failures += 1,
                    }
                }
                (lat, failures)
            })
        })
        .collect();
    let mut lat = Vec::new();
    let mut failures = 0;
    for t in tasks {
        if let Ok((l, f)) = t.await {
            lat.extend(l);
            failures += f;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    for c in &conns {
        let _ = c.close(1000, "ping compare done").await;
    }
    let n = lat.len() as u64;
    let run = PingRun {
        target: target.to_owned(),
        sockets,
        round_trips: n,
        seconds,
        round_trips_per_s: n as f64 / seconds,
        rtt_ms: Latency::of(&lat),
        failures,
    };
    Ok((run, hello_ack.unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_ping_with_pong() {
        let ping = r#"{"schema":"x","packet_id":"p1","type":"ping","request_id":"r1","time":1,"payload":{}}"#;
        let v: Value = serde_json::from_str(&answer(ping, &json!({}))).unwrap();
        assert_eq!(v["type"], "pong");
        assert_eq!(v["request_id"], "r1");
        assert_eq!(v["reply_to"], "p1");
        let other = r#"{"type":"x"}"#;
        assert_eq!(answer(other, &json!({})), other);
    }

    /// The simulator talks to the bare server as to a pod: subprotocol, hello, ping.
    #[tokio::test]
    async fn serves_the_simulator() {
        let server = BareServer::start(json!({"connector_id": "conn_bare"}))
            .await
            .unwrap();
        let sim = Sim::new(&server.base_url, Some("k")).unwrap();
        let conn = sim.connect().await.unwrap();
        assert_eq!(conn.subprotocol(), Some("xagent.connector.packet.v1"));
        let ack = conn
            .hello("im.webhook", None, &["xagent.im.v2"])
            .await
            .unwrap();
        assert_eq!(ack.kind, "connector.hello.ack");
        assert_eq!(ack.str_at("/connector_id"), Some("conn_bare"));
        let pong = conn.ping().await.unwrap().expect_kind("pong").unwrap();
        assert!(pong.reply_to.is_some());
        let (run, hello) = ping_run(
            "bare",
            &sim,
            "im.webhook",
            &["xagent.im.v2"],
            2,
            Duration::from_millis(200),
        )
        .await
        .unwrap();
        assert!(run.round_trips > 0 && run.failures == 0);
        assert_eq!(hello["connector_id"], "conn_bare");
    }
}
