//! The bindings an inbound message needs at ingress, kept in memory so that a message costs
//! its share of one group-committed insert and no read of its channel.
//!
//! Every pod keeps the bound channels its providers asked for lately, and forgets a channel
//! when a notice on the [`TOPIC`] bus topic says its binding changed (bound, unbound,
//! rebound, deleted). Whoever writes such a change publishes the notice after the write
//! ([`announce`]); the pod that wrote it also forgets the channel at once
//! ([`BindingCache::forget`]), so its own next message sees the change without waiting for
//! the bus.
//!
//! The bus is a hint, never the only copy of a fact, so the cache trusts it only while it
//! listens: while it has no live subscription, or its bus reports itself disconnected (a
//! notice may have been lost), it answers nothing from memory and keeps nothing, and every
//! lookup reads the store as before. An entry is also trusted for at most [`TRUST_FOR`],
//! which bounds how long a notice lost some other way (a lagging in-process subscriber) can
//! leave a stale binding. A read that raced a change is not kept: each invalidation bumps an
//! epoch, and a read's result is stored only when no invalidation arrived since the read
//! began, so a notice can never be overtaken by the value it was meant to remove.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use tokio::sync::OnceCell;

use crate::bus::Bus;
use crate::error::BackendResult;
use crate::provider::Binding;

/// The bus topic of "these channels' bindings changed" notices (every pod listens).
pub const TOPIC: &str = "bindings";

/// Longest an entry is trusted without a notice.
pub const TRUST_FOR: Duration = Duration::from_secs(30);
/// Most channels kept by one cache; a full cache is cleared (they are read again).
const MAX_ENTRIES: usize = 65_536;
/// How often the listener checks that its bus is still connected.
const CONNECTED_CHECK: Duration = Duration::from_millis(250);
/// Pause before subscribing again after the subscription ended or failed.
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(1);

/// What a notice on [`TOPIC`] carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Notice {
    channels: Vec<String>,
}

/// Publishes that the bindings of `channel_ids` changed, after the change is durable. A
/// notice that cannot be published is logged: caches elsewhere then keep the old binding
/// for at most [`TRUST_FOR`].
pub async fn announce(bus: &dyn Bus, channel_ids: &[String]) {
    if channel_ids.is_empty() {
        return;
    }
    let notice = Notice {
        channels: channel_ids.to_vec(),
    };
    let body = serde_json::to_vec(&notice).unwrap_or_default();
    if let Err(e) = bus.publish(TOPIC, body).await {
        tracing::warn!(error = %e, channels = channel_ids.len(), "binding change notice not published; other pods keep the old binding for at most 30 s");
    }
}

/// A bound channel as ingress needs it: its credentials and its connector_id.
#[derive(Debug, Clone)]
pub struct CachedBinding {
    pub connector_id: String,
    pub binding: Binding,
}

#[derive(Default)]
struct State {
    entries: HashMap<String, (CachedBinding, Instant)>,
    /// Bumped by every invalidation; a read stores its result only when it did not move.
    epoch: u64,
    /// Whether notices are arriving (subscribed, and the bus connected).
    live: bool,
}

/// The bound channels one provider (Card) read lately, invalidated through the bus.
pub struct BindingCache {
    bus: Arc<dyn Bus>,
    state: Arc<Mutex<State>>,
    listener: OnceCell<()>,
}

impl std::fmt::Debug for BindingCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("BindingCache")
            .field("entries", &s.entries.len())
            .field("live", &s.live)
            .finish()
    }
}

/// Permission to keep the result of one read: valid while no invalidation arrived.
#[derive(Debug, Clone, Copy)]
struct Ticket(Option<u64>);

impl BindingCache {
    /// An empty cache; it starts listening on `bus` at its first lookup.
    pub fn new(bus: Arc<dyn Bus>) -> Self {
        Self {
            bus,
            state: Arc::default(),
            listener: OnceCell::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The channel's binding from memory, or from `load` (a store read: `None` for a
    /// channel that is not this Card's or not bound, which is not kept).
    pub async fn get_or_load<F, Fut>(
        &self,
        channel_id: &str,
        load: F,
    ) -> BackendResult<Option<CachedBinding>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = BackendResult<Option<CachedBinding>>>,
    {
        if let Some(hit) = self.get(channel_id) {
            return Ok(Some(hit));
        }
        self.listen().await;
        let ticket = self.ticket();
        let loaded = load().await?;
        if let Some(c) = &loaded {
            self.keep(ticket, channel_id, c.clone());
        }
        Ok(loaded)
    }

    /// The channel's binding when it is in memory and trusted.
    pub fn get(&self, channel_id: &str) -> Option<CachedBinding> {
        let s = self.lock();
        if !s.live {
            return None;
        }
        s.entries
            .get(channel_id)
            .filter(|(_, at)| at.elapsed() < TRUST_FOR)
            .map(|(c, _)| c.clone())
    }

    /// Drops these channels here at once (the writer's own pod; others hear [`announce`]).
    pub fn forget(&self, channel_ids: &[String]) {
        let mut s = self.lock();
        s.epoch += 1;
        for id in channel_ids {
            s.entries.remove(id);
        }
    }

    fn ticket(&self) -> Ticket {
        let s = self.lock();
        Ticket(s.live.then_some(s.epoch))
    }

    fn keep(&self, ticket: Ticket, channel_id: &str, c: CachedBinding) {
        let mut s = self.lock();
        if !s.live || ticket.0 != Some(s.epoch) {
            return;
        }
        if s.entries.len() >= MAX_ENTRIES && !s.entries.contains_key(channel_id) {
            s.entries.clear();
        }
        s.entries.insert(channel_id.to_owned(), (c, Instant::now()));
    }

    /// Subscribes once (the first lookup waits for it, so no notice published after a read
    /// began is missed); the listener task then keeps the subscription and ends with the
    /// cache.
    async fn listen(&self) {
        self.listener
            .get_or_init(|| async {
                let first = self.bus.subscribe(TOPIC).await;
                if first.is_ok() && self.bus.is_connected() {
                    self.lock().live = true;
                }
                let state = Arc::downgrade(&self.state);
                tokio::spawn(listener(self.bus.clone(), state, first.ok()));
            })
            .await;
        // The first subscription is in place (or failed, and the listener retries) before
        // any read whose result could be kept.
    }
}

type Notices = futures::stream::BoxStream<'static, Vec<u8>>;

/// Runs while the cache lives: applies notices, and stops trusting memory whenever the
/// subscription ends or the bus disconnects (until it is back).
async fn listener(bus: Arc<dyn Bus>, state: Weak<Mutex<State>>, mut sub: Option<Notices>) {
    let set_live = |live: bool| -> bool {
        let Some(state) = state.upgrade() else {
            return false;
        };
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        if !live && s.live {
            s.entries.clear();
            s.epoch += 1;
        }
        s.live = live;
        true
    };
    loop {
        let Some(mut stream) = sub.take() else {
            if !set_live(false) {
                return;
            }
            tokio::time::sleep(RESUBSCRIBE_AFTER).await;
            sub = bus.subscribe(TOPIC).await.ok();
            continue;
        };
        if !set_live(bus.is_connected()) {
            return;
        }
        let mut check = tokio::time::interval(CONNECTED_CHECK);
        loop {
            tokio::select! {
                next = stream.next() => match next {
                    Some(body) => {
                        let Some(state) = state.upgrade() else { return };
                        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                        s.epoch += 1;
                        match serde_json::from_slice::<Notice>(&body) {
                            Ok(n) => {
                                for id in &n.channels {
                                    s.entries.remove(id);
                                }
                            }
                            // Not understood (a newer pod's notice): forget everything.
                            Err(_) => s.entries.clear(),
                        }
                    }
                    None => break,
                },
                _ = check.tick() => {
                    if !set_live(bus.is_connected()) {
                        return;
                    }
                }
            }
        }
        // The subscription ended: notices may be lost until it is back.
        if !set_live(false) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::bus::LocalBus;

    fn bound(channel: &str) -> CachedBinding {
        CachedBinding {
            connector_id: "conn_1".into(),
            binding: Binding {
                channel_id: channel.into(),
                tenant_id: "ten_1".into(),
                credentials: serde_json::json!({"k": channel}),
            },
        }
    }

    /// Looks `channel` up, counting the reads `load` stands for.
    async fn lookup(cache: &BindingCache, reads: &AtomicUsize, channel: &str) -> Option<String> {
        cache
            .get_or_load(channel, || async {
                reads.fetch_add(1, Ordering::SeqCst);
                Ok(Some(bound(channel)))
            })
            .await
            .unwrap()
            .map(|c| c.binding.channel_id)
    }

    async fn eventually(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !f() {
            assert!(Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_notice_on_the_bus_makes_every_cache_read_again() {
        let bus: Arc<dyn Bus> = Arc::new(LocalBus::new());
        let (a, b) = (
            BindingCache::new(bus.clone()),
            BindingCache::new(bus.clone()),
        );
        let reads = AtomicUsize::new(0);
        for c in [&a, &b] {
            assert_eq!(lookup(c, &reads, "cch_1").await.as_deref(), Some("cch_1"));
            assert_eq!(lookup(c, &reads, "cch_1").await.as_deref(), Some("cch_1"));
        }
        assert_eq!(reads.load(Ordering::SeqCst), 2, "one read per cache");
        announce(bus.as_ref(), &["cch_1".to_owned()]).await;
        eventually("both caches forget cch_1", || {
            a.get("cch_1").is_none() && b.get("cch_1").is_none()
        })
        .await;
        lookup(&b, &reads, "cch_1").await;
        assert_eq!(reads.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_read_that_raced_a_change_is_not_kept() {
        let bus: Arc<dyn Bus> = Arc::new(LocalBus::new());
        let cache = BindingCache::new(bus.clone());
        let loaded = cache
            .get_or_load("cch_1", || async {
                // The binding changes (and is announced) while this read is under way.
                cache.forget(&["cch_1".to_owned()]);
                Ok(Some(bound("cch_1")))
            })
            .await
            .unwrap();
        assert!(loaded.is_some(), "the read's answer is still returned");
        assert!(cache.get("cch_1").is_none(), "but not kept");
    }

    #[tokio::test]
    async fn the_cache_stays_bounded() {
        let cache = BindingCache::new(Arc::new(LocalBus::new()));
        let reads = AtomicUsize::new(0);
        for i in 0..MAX_ENTRIES + 10 {
            lookup(&cache, &reads, &format!("cch_{i}")).await;
        }
        let len = cache.lock().entries.len();
        assert!(len <= MAX_ENTRIES, "{len}");
    }

    /// A bus that can be told to report itself disconnected.
    struct Flaky {
        inner: LocalBus,
        connected: std::sync::atomic::AtomicBool,
    }

    #[async_trait::async_trait]
    impl Bus for Flaky {
        async fn publish(&self, topic: &str, msg: Vec<u8>) -> BackendResult<()> {
            self.inner.publish(topic, msg).await
        }
        async fn subscribe(&self, topic: &str) -> BackendResult<Notices> {
            self.inner.subscribe(topic).await
        }
        fn is_connected(&self) -> bool {
            self.connected.load(Ordering::SeqCst)
        }
    }

    #[tokio::test]
    async fn nothing_is_answered_from_memory_while_the_bus_is_down() {
        let flaky = Arc::new(Flaky {
            inner: LocalBus::new(),
            connected: true.into(),
        });
        let cache = BindingCache::new(flaky.clone());
        let reads = AtomicUsize::new(0);
        lookup(&cache, &reads, "cch_1").await;
        assert!(cache.get("cch_1").is_some());
        flaky.connected.store(false, Ordering::SeqCst);
        eventually("the cache stops trusting memory", || {
            cache.get("cch_1").is_none()
        })
        .await;
        lookup(&cache, &reads, "cch_1").await;
        lookup(&cache, &reads, "cch_1").await;
        assert_eq!(reads.load(Ordering::SeqCst), 3, "every lookup reads");
        flaky.connected.store(true, Ordering::SeqCst);
        eventually("memory is trusted again", || {
            cache.get("cch_1").is_none() && cache.lock().live
        })
        .await;
        lookup(&cache, &reads, "cch_1").await;
        lookup(&cache, &reads, "cch_1").await;
        assert_eq!(reads.load(Ordering::SeqCst), 4);
    }
}
