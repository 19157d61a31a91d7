//! The four flows, each an open-loop generator at a fixed rate with a bound on operations
//! in flight. An operation keeps its `message_id` (or `tool_call_id`) and content across
//! retries, as a well-behaved sender does, so idempotency is what gets measured.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use switchyard_fake_webhook::InboundRequest;
use switchyard_xagent_sim::{Envelope, EnvelopeExt, SimError};
use tokio::sync::Semaphore;
use tokio::time::Instant as TokioInstant;
use tokio_util::task::TaskTracker;

use crate::pods::Fleet;
use crate::stages::Profile;
use crate::stats::{Flow, Flows, stamp_text};
use crate::xagent::Backend;

const TOOL_MESSAGE_SEND: &str = "webhook_message_send";
const TOOL_FILE_SEND: &str = "webhook_file_send";
const RETRY_PAUSE: Duration = Duration::from_millis(250);
/// Operations of a socket flow (tool, outbound, file) alive at once, waiting included. The
/// real limits are per socket (see [`Backend`]); this only bounds memory.
pub const SOCKET_FLOW_CAP: usize = 10_000;

/// Everything an operation needs.
pub struct Ctx {
    pub backends: Vec<Arc<Backend>>,
    /// `(backend index, connector_channel_id)` of every channel.
    pub channels: Vec<(usize, String)>,
    pub flows: Arc<Flows>,
    pub fleet: Arc<Fleet>,
    pub http: reqwest::Client,
    /// Distinguishes this run's ids from any earlier run's.
    pub tag: String,
    pub filler: String,
    pub file: Bytes,
    /// Operations still not accepted at this instant give up.
    pub deadline: TokioInstant,
}

impl Ctx {
    fn channel(&self, n: u64) -> (&Arc<Backend>, &str) {
        let (b, ch) = &self.channels[(n % self.channels.len() as u64) as usize];
        (&self.backends[*b], ch.as_str())
    }
}

/// Every tenant's channels as one list, taken in turn (tenant 0's first, tenant 1's first,
/// ..., tenant 0's second, ...), each with its tenant's index. Operation `n` goes to entry
/// `n % len`, so the operations in flight at any moment are spread evenly over the tenants
/// (and their channels). Grouped by tenant, 64 in flight fell on one or two tenants at a
/// time, past a pod's per-tenant share, and the run measured the 429s' retry pauses.
pub fn interleave(per_tenant: Vec<&[String]>) -> Vec<(usize, String)> {
    let longest = per_tenant.iter().map(|c| c.len()).max().unwrap_or(0);
    let mut out = Vec::with_capacity(per_tenant.iter().map(|c| c.len()).sum());
    for k in 0..longest {
        for (t, chans) in per_tenant.iter().enumerate() {
            if let Some(c) = chans.get(k) {
                out.push((t, c.clone()));
            }
        }
    }
    out
}

/// The `message_id` the webhook provider derives from a tool call's idempotency key.
pub fn tool_message_id(tool_call_id: &str) -> String {
    let digest = hex::encode(Sha256::digest(tool_call_id.as_bytes()));
    format!("tool_{}", &digest[..32])
}

/// Starts operation `n = 0, 1, ...` when `pace` says it is due (`None` = as fast as `cap`
/// allows) until `until`, with at most `cap` in flight; returns once every started operation
/// finished.
pub async fn drive<F, Fut>(pace: Option<&Profile>, cap: usize, until: TokioInstant, op: F) -> u64
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let sem = Arc::new(Semaphore::new(cap.max(1)));
    let tasks = TaskTracker::new();
    let start = TokioInstant::now();
    let mut n = 0u64;
    loop {
        if let Some(p) = pace {
            let Some(due) = p.due(n).map(|d| start + d) else {
                break;
            };
            if due >= until {
                break;
            }
            tokio::time::sleep_until(due).await;
        } else if TokioInstant::now() >= until {
            break;
        }
        let permit = tokio::select! {
            p = sem.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = tokio::time::sleep_until(until) => break,
        };
        let fut = op(n);
        tasks.spawn(async move {
            fut.await;
            drop(permit);
        });
        n += 1;
    }
    tasks.close();
    tasks.wait().await;
    n
}

async fn pause(deadline: TokioInstant) -> bool {
    if TokioInstant::now() + RETRY_PAUSE >= deadline {
        return false;
    }
    tokio::time::sleep(RETRY_PAUSE).await;
    true
}

fn http_error_kind(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else {
        "request"
    }
}

/// One inbound message: a signed POST to `/webhook/inbound/{channel}` on a serving pod,
/// retried on other pods while the answer is retryable.
pub async fn inbound(ctx: Arc<Ctx>, n: u64) {
    let flow = &ctx.flows.inbound;
    let (backend, ch) = ctx.channel(n);
    let id = format!("in_{}_{n}", ctx.tag);
    let body = json!({
        "message_id": id,
        "text": stamp_text("in", &ctx.filler),
        "sender": {"id": format!("user-{}", n % 97), "name": "Load Test"},
    })
    .to_string();
    flow.sent();
    let started = Instant::now();
    let mut attempt = 0usize;
    loop {
        let pods = ctx.fleet.serving();
        if pods.is_empty() {
            flow.error("no serving pod");
            if pause(ctx.deadline).await {
                continue;
            }
            return flow.gave_up();
        }
        let pod = &pods[(n as usize + attempt) % pods.len()];
        attempt += 1;
        // Signed now, not once: a retry late in a long run must not carry a stale timestamp.
        let req = InboundRequest::raw(&backend.secret, "application/json", body.clone().into());
        flow.attempt();
        let res = req
            .request(&ctx.http, &format!("{}/webhook/inbound/{ch}", pod.base_url))
            .send()
            .await;
        match res {
            Ok(r) if r.status().as_u16() == 202 => return flow.accepted(&id, started),
            Ok(r) if r.status().is_server_error() || r.status().as_u16() == 429 => {
                flow.error(&format!("http {}", r.status().as_u16()));
            }
            Ok(r) => {
                let status = r.status().as_u16();
                let code = r
                    .json::<Value>()
                    .await
                    .ok()
                    .and_then(|v| {
                        v.pointer("/error/code")
                            .and_then(Value::as_str)
                            .map(str::to_owned)
                    })
                    .unwrap_or_default();
                return flow.rejected(&format!("http {status} {code}"));
            }
            Err(e) => flow.error(&format!("http {}", http_error_kind(&e))),
        }
        if !pause(ctx.deadline).await {
            return flow.gave_up();
        }
    }
}

/// How a request over the socket ended.
enum Answer {
    Accepted,
    Retry(String),
    Refused(String),
}

/// Codes after which the same request may succeed later.
fn retryable_code(code: &str, message: &str) -> bool {
    matches!(
        code,
        "busy" | "draining" | "unavailable" | "channel_not_open" | "target_unavailable"
    ) || message.contains("(retryable)")
}

fn classify_tool(res: Result<Envelope, SimError>, expect_id: &str) -> Answer {
    match res {
        Ok(env) if env.kind == "tool.invoke.ack" && env.error.is_none() => {
            match env.str_at("/result/message_id") {
                Some(id) if id == expect_id => Answer::Accepted,
                other => Answer::Refused(format!("result message_id {other:?}")),
            }
        }
        Ok(env) => {
            let code = env.error_code().unwrap_or(&env.kind).to_owned();
            let message = env
                .error
                .as_ref()
                .and_then(|e| e.message.clone())
                .unwrap_or_default();
            if retryable_code(&code, &message) {
                Answer::Retry(code)
            } else {
                Answer::Refused(code)
            }
        }
        Err(e) => Answer::Retry(sim_error_kind(&e).to_owned()),
    }
}

fn sim_error_kind(e: &SimError) -> &'static str {
    match e {
        SimError::Timeout { .. } => "no answer (timeout)",
        SimError::Closed => "socket closed",
        SimError::Ws(_) => "websocket error",
        SimError::Http(_) => "http error",
        _ => "client error",
    }
}

/// One tool call of a flow.
struct Call<'a> {
    backend: &'a Backend,
    channel: &'a str,
    tool_id: &'static str,
    arguments: Value,
    /// Kept across retries, so the pods run the call at most once.
    tool_call_id: String,
}

/// Runs one tool call to completion, retrying while the answer is retryable.
async fn tool_call(ctx: &Ctx, flow: &Flow, call: Call<'_>, started: Instant) {
    let expect = tool_message_id(&call.tool_call_id);
    loop {
        let Some(live) = call.backend.live(ctx.deadline).await else {
            return flow.gave_up();
        };
        // Held for the attempt only: the pods limit concurrent calls per socket.
        let Ok(_slot) = call.backend.tool_slots.acquire().await else {
            return flow.gave_up();
        };
        flow.attempt();
        let res = live
            .conn
            .invoke(
                call.channel,
                call.tool_id,
                call.arguments.clone(),
                Some(&call.tool_call_id),
            )
            .await;
        match classify_tool(res, &expect) {
            Answer::Accepted => return flow.accepted(&expect, started),
            Answer::Refused(why) => return flow.rejected(&why),
            Answer::Retry(why) => flow.error(&why),
        }
        if !pause(ctx.deadline).await {
            return flow.gave_up();
        }
    }
}

/// One `webhook_message_send` call.
pub async fn tool(ctx: Arc<Ctx>, n: u64) {
    let flow = &ctx.flows.tool;
    // Offset so tool calls and inbound messages do not walk the channels in lockstep.
    let (backend, ch) = ctx.channel(n + 7);
    let call = Call {
        backend,
        channel: ch,
        tool_id: TOOL_MESSAGE_SEND,
        arguments: json!({"connector_channel_id": ch, "text": stamp_text("tool", &ctx.filler)}),
        tool_call_id: format!("tc_{}_{n}", ctx.tag),
    };
    flow.sent();
    tool_call(&ctx, flow, call, Instant::now()).await;
}

/// One xAgent `chat.message` to the target, retried with the same `message_id` and text.
pub async fn outbound(ctx: Arc<Ctx>, n: u64) {
    let flow = &ctx.flows.outbound;
    let (backend, ch) = ctx.channel(n + 13);
    let id = format!("out_{}_{n}", ctx.tag);
    let text = stamp_text("out", &ctx.filler);
    flow.sent();
    let started = Instant::now();
    loop {
        let Some(live) = backend.live(ctx.deadline).await else {
            return flow.gave_up();
        };
        let Ok(_slot) = backend.outbound_slots.acquire().await else {
            return flow.gave_up();
        };
        flow.attempt();
        let res = live
            .conn
            .send_chat_message(ch, &id, Some(&text), vec![])
            .await;
        let answer = match res {
            Ok(env) if env.kind == "chat.message.ack" => {
                let code = env.str_at("/code").unwrap_or("rejected").to_owned();
                match env.str_at("/status") {
                    Some("accepted" | "duplicate") => Answer::Accepted,
                    _ if env.at("/retryable").and_then(Value::as_bool) == Some(true) => {
                        Answer::Retry(code)
                    }
                    _ => Answer::Refused(code),
                }
            }
            Ok(env) => {
                let code = env.error_code().unwrap_or(&env.kind).to_owned();
                if retryable_code(&code, "") {
                    Answer::Retry(code)
                } else {
                    Answer::Refused(code)
                }
            }
            Err(e) => Answer::Retry(sim_error_kind(&e).to_owned()),
        };
        match answer {
            Answer::Accepted => return flow.accepted(&id, started),
            Answer::Refused(why) => return flow.rejected(&why),
            Answer::Retry(why) => flow.error(&why),
        }
        if !pause(ctx.deadline).await {
            return flow.gave_up();
        }
    }
}

/// Uploads a file to the channel, then sends it with `webhook_file_send`; the target
/// downloads it through the signed URL it receives.
pub async fn file(ctx: Arc<Ctx>, n: u64) {
    let flow = &ctx.flows.file;
    let (backend, ch) = ctx.channel(n + 29);
    let text = stamp_text("file", &ctx.filler);
    flow.sent();
    let started = Instant::now();
    let file_ref = loop {
        let Some(live) = backend.live(ctx.deadline).await else {
            return flow.gave_up();
        };
        // Attempts count the sends (tool calls); a failed upload shows under errors.
        let name = format!("lt-{n}.bin");
        match live
            .sim
            .upload(ch, &name, "application/octet-stream", ctx.file.clone())
            .await
        {
            Ok((200, body)) => match body.get("file_ref").and_then(Value::as_str) {
                Some(r) => break r.to_owned(),
                None => return flow.rejected("upload answered without file_ref"),
            },
            Ok((status, _)) if status >= 500 => flow.error(&format!("upload http {status}")),
            Ok((status, body)) => {
                let code = body
                    .pointer("/error/code")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                return flow.rejected(&format!("upload http {status} {code}"));
            }
            Err(e) => flow.error(&format!("upload {}", sim_error_kind(&e))),
        }
        if !pause(ctx.deadline).await {
            return flow.gave_up();
        }
    };
    let call = Call {
        backend,
        channel: ch,
        tool_id: TOOL_FILE_SEND,
        arguments: json!({"connector_channel_id": ch, "file_ref": file_ref, "text": text}),
        tool_call_id: format!("tf_{}_{n}", ctx.tag),
    };
    tool_call(&ctx, flow, call, started).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_take_turns_across_tenants() {
        let a: Vec<String> = ["a0", "a1", "a2"].map(String::from).to_vec();
        let b: Vec<String> = ["b0"].map(String::from).to_vec();
        let c: Vec<String> = ["c0", "c1"].map(String::from).to_vec();
        let got = interleave(vec![&a, &b, &c]);
        let want: Vec<(usize, String)> = [
            (0, "a0"),
            (1, "b0"),
            (2, "c0"),
            (0, "a1"),
            (2, "c1"),
            (0, "a2"),
        ]
        .map(|(t, c)| (t, c.to_owned()))
        .to_vec();
        assert_eq!(got, want);
        assert!(interleave(vec![]).is_empty());
    }

    #[test]
    fn tool_ids_match_the_provider() {
        let id = tool_message_id("call-1");
        assert_eq!(id.len(), 5 + 32);
        assert!(id.starts_with("tool_"));
        assert_eq!(id, tool_message_id("call-1"));
        assert_ne!(id, tool_message_id("call-2"));
    }

    #[tokio::test]
    async fn drive_paces_and_waits() {
        let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let c = count.clone();
        let until = TokioInstant::now() + Duration::from_millis(300);
        let pace = Profile::constant(100.0, Duration::from_secs(10));
        let started = drive(Some(&pace), 4, until, move |_| {
            let c = c.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        })
        .await;
        assert!((25..=31).contains(&started), "started {started}");
        assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), started);
    }

    #[tokio::test]
    async fn drive_follows_a_ramp() {
        // 0 -> 200/s over 400 ms is 40 operations, most of them late in the ramp.
        let pace = crate::stages::parse_ramp("0:200:400ms").unwrap();
        let half = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let h = half.clone();
        let t0 = TokioInstant::now();
        let until = t0 + Duration::from_secs(5);
        let started = drive(Some(&pace), 64, until, move |_| {
            if t0.elapsed() < Duration::from_millis(200) {
                h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            async {}
        })
        .await;
        assert_eq!(started, 40);
        let early = half.load(std::sync::atomic::Ordering::SeqCst);
        // A quarter of the operations fall in the first half of a linear ramp from 0.
        assert!((4..=14).contains(&early), "early {early}");
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "ends with the stages"
        );
    }
}
