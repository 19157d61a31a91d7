//! The Gateway: exactly one session per bot in the whole deployment.
//!
//! Every pod runs a supervisor that reloads the bound bots (periodically, and when a binding
//! is made or released here) and a task per bot that runs sessions under the lease
//! `gw:<bot_key>` (the provider kit's [`Lease`]). The holder connects to the URL of
//! `GET /gateway/bot`, identifies after Hello, heartbeats at Hello's interval (the first
//! after a random share of it) and reconnects when a heartbeat goes unacked.
//!
//! Nothing is lost across drops: dispatches are handled in order (several at once, their
//! results taken in order), and the sequence a Resume names is the last one whose message is
//! stored, not the last one received, so Discord replays whatever was not stored yet. The
//! session id, resume URL and that sequence are kept durably (`kv`), so the pod that takes
//! the lease over after a crash resumes the same session too. Replays repeat messages the
//! store has already: the core de-duplicates them by message id. A handover closes the
//! connection with 4000, not 1000/1001, which would end the session at Discord.

pub(crate) mod codec;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesOrdered;
use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use switchyard_core::ProviderServices;
use switchyard_provider_kit::{Consumers, Lease, LeaseConfig, pause, reconnect_wait};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use yawc::close::CloseCode;
use yawc::frame::{Frame, OpCode};

use self::codec::{CloseKind, Event, Incoming};
use crate::Runtime;
use crate::bots::Bot;
use crate::inbound::{Handled, handle_message};

/// What a Resume needs, kept per bot across connections and pods.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct ResumeState {
    pub session_id: String,
    pub resume_url: String,
    /// The last sequence whose dispatch was handled (its message stored).
    pub seq: u64,
}

pub(crate) fn state_key(bot_key: &str) -> String {
    format!("gw:{bot_key}")
}

/// The supervisor loop of one pod; ends (giving its leases up) when `stop` is cancelled.
pub(crate) async fn supervise(
    rt: Arc<Runtime>,
    services: Arc<dyn ProviderServices>,
    stop: CancellationToken,
) {
    let mut tasks = Consumers::new(&stop);
    loop {
        reconcile(&rt, &services, &mut tasks).await;
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(rt.cfg.refresh_interval) => {}
            _ = rt.kick.notified() => {}
        }
    }
    tasks.shutdown().await;
}

async fn reconcile(rt: &Arc<Runtime>, services: &Arc<dyn ProviderServices>, tasks: &mut Consumers) {
    if let Err(e) = rt.registry.refresh(services.as_ref()).await {
        tracing::warn!(error = %e, "bound discord bots not reloaded; retried at the next refresh");
        return;
    }
    let mut wanted = HashMap::new();
    for bot in rt.registry.all() {
        let fp = bot.creds.fingerprint();
        if rt.is_revoked(services.as_ref(), &fp).await {
            continue;
        }
        wanted.insert(bot.key.clone(), (fp, bot));
    }
    tasks.retain(
        &wanted
            .iter()
            .map(|(k, (fp, _))| (k.clone(), fp.clone()))
            .collect(),
    );
    for (key, (fp, bot)) in wanted {
        let (rt, services) = (rt.clone(), services.clone());
        tasks.ensure(&key, &fp, move |stop| run_bot(rt, services, bot, stop));
    }
    metrics::gauge!("switchyard_discord_gateway_bots").set(tasks.len() as f64);
}

async fn load_state(services: &dyn ProviderServices, bot: &Bot) -> Option<ResumeState> {
    match services.kv_get(&state_key(&bot.key)).await {
        Ok(Some(s)) if !s.is_empty() => serde_json::from_str(&s).ok(),
        _ => None,
    }
}

async fn store_state(services: &dyn ProviderServices, bot: &Bot, s: Option<&ResumeState>) {
    let v = s
        .and_then(|s| serde_json::to_string(s).ok())
        .unwrap_or_default();
    if let Err(e) = services.kv_put(&state_key(&bot.key), &v).await {
        tracing::warn!(bot_key = %bot.key, error = %e, "discord session state not stored; a takeover identifies anew");
    }
}

/// How one session under the lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The pod stops (drain): the lease is given up for a successor.
    Stopped,
    /// A renewal failed or came late: the session closed; the lease is tried again.
    LostLease,
    /// The bot cannot go on (credentials refused, a fatal close): the lease is given up.
    Fatal,
    /// Start a new session at once (Discord asked to reconnect).
    Again,
    /// The session failed: a new one after a growing pause.
    Failed,
}

async fn run_bot(
    rt: Arc<Runtime>,
    services: Arc<dyn ProviderServices>,
    bot: Arc<Bot>,
    stop: CancellationToken,
) {
    let cfg = LeaseConfig {
        ttl: rt.cfg.lease_ttl,
        retry: rt.cfg.lease_retry,
        backoff: rt.cfg.reconnect_backoff,
    };
    let name = format!("gw:{}", bot.key);
    let mut lease = Lease::new(services.clone(), name, "discord gateway", cfg);
    let mut failures: u32 = 0;
    while lease.hold(&stop).await.is_some() {
        // Read at every session start: the previous holder (maybe another pod) kept it.
        let state = load_state(services.as_ref(), &bot).await;
        let (end, state) = Session::new(&rt, services.as_ref(), &bot, state, &stop)
            .run(&mut lease)
            .await;
        store_state(services.as_ref(), &bot, state.as_ref()).await;
        match end {
            Ended::Stopped => break,
            Ended::Fatal => {
                tracing::warn!(bot_key = %bot.key, "discord gateway stopped for this bot until it is bound again");
                break;
            }
            Ended::LostLease | Ended::Again => failures = 0,
            Ended::Failed => {
                failures = failures.saturating_add(1);
                // A zero setting still does not spin.
                let wait = reconnect_wait(
                    rt.cfg.reconnect_backoff,
                    rt.cfg.max_reconnect_backoff,
                    failures,
                )
                .max(Duration::from_millis(25));
                if !pause(&stop, wait).await {
                    break;
                }
            }
        }
    }
    lease.release().await;
}

type Inflight<'a> = FuturesOrdered<Pin<Box<dyn Future<Output = (u64, Handled)> + Send + 'a>>>;

/// One connection's worth of a bot's Gateway session.
struct Session<'a> {
    rt: &'a Runtime,
    services: &'a dyn ProviderServices,
    bot: &'a Bot,
    state: Option<ResumeState>,
    stop: &'a CancellationToken,
}

fn jitter(d: Duration) -> Duration {
    d.mul_f64(rand::random::<f64>())
}

impl<'a> Session<'a> {
    fn new(
        rt: &'a Runtime,
        services: &'a dyn ProviderServices,
        bot: &'a Bot,
        state: Option<ResumeState>,
        stop: &'a CancellationToken,
    ) -> Self {
        Self {
            rt,
            services,
            bot,
            state,
            stop,
        }
    }

    async fn run(mut self, lease: &mut Lease) -> (Ended, Option<ResumeState>) {
        let end = self.connect_and_serve(lease).await;
        if end == Ended::Fatal {
            self.state = None;
        }
        (end, self.state)
    }

    async fn connect_and_serve(&mut self, lease: &mut Lease) -> Ended {
        let rt = self.rt;
        let bot = self.bot;
        let token = bot.creds.token.expose();
        let deadline = Instant::now() + rt.cfg.request_timeout * 2;
        let url = match &self.state {
            Some(s) if !s.resume_url.is_empty() => s.resume_url.clone(),
            _ => match rt
                .api
                .gateway_url(&bot.creds.token, &bot.key, deadline)
                .await
            {
                Ok(u) => u,
                Err(e) if e.is_unauthorized() => {
                    rt.on_revoked(self.services, bot).await;
                    return Ended::Fatal;
                }
                Err(e) => {
                    tracing::info!(bot_key = %bot.key, error = %e, "discord gateway url not obtained");
                    return Ended::Failed;
                }
            },
        };
        let Ok(url) = url::Url::parse(&codec::with_query(&url)) else {
            tracing::info!(bot_key = %bot.key, "discord gateway url unusable");
            self.state = None;
            return Ended::Failed;
        };
        let options = yawc::Options::default()
            .with_limits(
                rt.cfg.max_gateway_message_bytes,
                rt.cfg.max_gateway_message_bytes,
            )
            .with_utf8();
        let connected = tokio::time::timeout(
            rt.cfg.request_timeout,
            yawc::WebSocket::connect(url).with_options(options),
        )
        .await;
        let ws = match connected {
            Ok(Ok(ws)) => ws,
            Ok(Err(_)) | Err(_) => {
                tracing::info!(bot_key = %bot.key, "discord gateway refused or timed out");
                return Ended::Failed;
            }
        };
        metrics::counter!("switchyard_discord_gateway_connections_total").increment(1);
        let (mut sink, mut stream) = ws.split();
        // Hello first, within the request timeout.
        let hello = tokio::time::timeout(rt.cfg.request_timeout, async {
            while let Some(f) = stream.next().await {
                if f.opcode() == OpCode::Text {
                    return std::str::from_utf8(f.payload()).ok().and_then(codec::parse);
                }
            }
            None
        })
        .await;
        let interval = match hello {
            Ok(Some(Incoming::Hello { heartbeat_interval })) => heartbeat_interval,
            _ => {
                tracing::info!(bot_key = %bot.key, "discord gateway sent no hello");
                return Ended::Failed;
            }
        };
        let opening = match &self.state {
            Some(s) => {
                metrics::counter!("switchyard_discord_gateway_resumes_total").increment(1);
                codec::resume(token, &s.session_id, s.seq)
            }
            None => {
                metrics::counter!("switchyard_discord_gateway_identifies_total").increment(1);
                codec::identify(token)
            }
        };
        if sink.send(Frame::text(opening)).await.is_err() {
            return Ended::Failed;
        }
        tracing::info!(bot_key = %bot.key, resumed = self.state.is_some(), "discord gateway session opening");
        let mut received: Option<u64> = self.state.as_ref().map(|s| s.seq);
        let mut acked = true;
        let mut next_beat = Instant::now() + jitter(interval);
        let mut persisted = self.state.clone();
        let mut inflight: Inflight<'_> = FuturesOrdered::new();
        let max_inflight = rt.cfg.max_inflight_events.max(1);
        let (services, stop) = (self.services, self.stop);
        let ended = loop {
            tokio::select! {
                _ = stop.cancelled() => break Ended::Stopped,
                _ = lease.renewal_due() => {
                    if lease.renew().await.is_err() {
                        break Ended::LostLease;
                    }
                }
                Some((seq, handled)) = inflight.next(), if !inflight.is_empty() => match handled {
                    Handled::Done => self.advance(seq),
                    Handled::Retry => break Ended::Failed,
                },
                _ = tokio::time::sleep_until(next_beat) => {
                    if !acked {
                        tracing::info!(bot_key = %bot.key, "discord heartbeat not acknowledged; reconnecting");
                        metrics::counter!("switchyard_discord_gateway_zombies_total").increment(1);
                        break Ended::Again;
                    }
                    if sink.send(Frame::text(codec::heartbeat(received))).await.is_err() {
                        break Ended::Failed;
                    }
                    acked = false;
                    next_beat = Instant::now() + interval;
                    if self.state != persisted {
                        store_state(services, bot, self.state.as_ref()).await;
                        persisted = self.state.clone();
                    }
                }
                msg = stream.next(), if inflight.len() < max_inflight => {
                    let Some(frame) = msg else { break Ended::Failed };
                    match frame.opcode() {
                        OpCode::Text => {}
                        OpCode::Close => {
                            let code = frame.close_code().map(u16::from).unwrap_or(1005);
                            break self.closed(code).await;
                        }
                        _ => continue,
                    }
                    let Ok(text) = std::str::from_utf8(frame.payload()) else { continue };
                    match codec::parse(text) {
                        Some(Incoming::Dispatch { seq, event }) => {
                            received = Some(received.map_or(seq, |r| r.max(seq)));
                            match event {
                                Event::Ready { session_id, resume_url } => {
                                    tracing::info!(bot_key = %bot.key, "discord gateway session ready");
                                    self.state = Some(ResumeState { session_id, resume_url, seq: 0 });
                                    inflight.push_back(Box::pin(async move { (seq, Handled::Done) }));
                                }
                                Event::MessageCreate(m) => {
                                    inflight.push_back(Box::pin(async move {
                                        (seq, handle_message(rt, services, bot, &m).await)
                                    }));
                                }
                                Event::Resumed | Event::Other => {
                                    inflight.push_back(Box::pin(async move { (seq, Handled::Done) }));
                                }
                            }
                        }
                        Some(Incoming::Heartbeat) => {
                            if sink.send(Frame::text(codec::heartbeat(received))).await.is_err() {
                                break Ended::Failed;
                            }
                        }
                        Some(Incoming::HeartbeatAck) => acked = true,
                        Some(Incoming::Reconnect) => {
                            tracing::info!(bot_key = %bot.key, "discord asked to reconnect");
                            break Ended::Again;
                        }
                        Some(Incoming::InvalidSession { resumable }) => {
                            tracing::info!(bot_key = %bot.key, resumable, "discord session invalidated");
                            if !resumable {
                                self.state = None;
                            }
                            // The docs ask for a random 1 to 5 s before identifying again.
                            let wait = rt.cfg.invalid_session_wait.mul_f64(0.2 + 0.8 * rand::random::<f64>());
                            tokio::select! {
                                _ = stop.cancelled() => break Ended::Stopped,
                                _ = tokio::time::sleep(wait) => break Ended::Again,
                            }
                        }
                        Some(Incoming::Hello { .. } | Incoming::Other) => {}
                        None => tracing::debug!(bot_key = %bot.key, "undecodable discord payload skipped"),
                    }
                }
            }
        };
        // Messages already being stored finish (a drain loses nothing it could keep).
        if matches!(ended, Ended::Stopped | Ended::LostLease | Ended::Again) {
            let until = tokio::time::sleep(Duration::from_secs(5));
            tokio::pin!(until);
            loop {
                tokio::select! {
                    _ = &mut until => break,
                    next = inflight.next() => match next {
                        Some((seq, Handled::Done)) => self.advance(seq),
                        _ => break,
                    }
                }
            }
        }
        drop(inflight);
        // 1000 would end the session at Discord; a handover or reconnect keeps it resumable.
        let code = if ended == Ended::Fatal || self.state.is_none() {
            CloseCode::Normal
        } else {
            CloseCode::from(4000)
        };
        let _ = sink.send(Frame::close(code, b"")).await;
        ended
    }

    fn advance(&mut self, seq: u64) {
        if let Some(s) = &mut self.state
            && seq > s.seq
        {
            s.seq = seq;
        }
    }

    async fn closed(&mut self, code: u16) -> Ended {
        match codec::close_kind(code) {
            CloseKind::Revoked => {
                self.rt.on_revoked(self.services, self.bot).await;
                Ended::Fatal
            }
            CloseKind::Fatal => {
                tracing::warn!(bot_key = %self.bot.key, code, "discord closed the gateway for good (enable the Message Content intent in the Developer Portal if the code is 4014)");
                self.rt.on_gateway_refused(self.services, self.bot).await;
                Ended::Fatal
            }
            CloseKind::NewSession => {
                self.state = None;
                Ended::Failed
            }
            CloseKind::Resume => Ended::Failed,
        }
    }
}
