//! The failover scenario of the providers with one long-lived consumer per bot or app in the
//! deployment (Slack's Socket Mode, Discord's Gateway, Feishu's long connection): a channel
//! bound through its form on one pod, every pod standing by for the consumer's lease, the
//! xAgent client on a pod that does not hold it (so a kill only moves the consumer), a
//! message pushed at the fake every 10 ms, and the exactly-once check at the end. Each test
//! keeps what is its target's own: the fake, how a consumer is seen to be open, the ids.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use switchyard_xagent_sim::{AutoAck, Conn, Deliveries, EnvelopeExt, Sim};

use super::{
    Cluster, PodInfo, WAIT, eventually, hello_card, open_channel_on, pods_logging, prefix_sim,
};

/// Pods reload their bound channels this often (the providers' default): how long a pod
/// may take to stand by for a new binding's lease.
pub const REFRESH: Duration = Duration::from_secs(30);

/// A channel bound on a pod: the simulator and connection that bound it.
pub struct Bound {
    pub sim: Sim,
    pub conn: Conn,
    pub connector_id: String,
    pub ch: String,
}

/// Binds a new channel of `card` through the form `flow` with `input`, on `pod` at `prefix`;
/// panics unless it is authenticated at once.
pub async fn bind_form(
    pod: &PodInfo,
    prefix: &str,
    api_key: &str,
    card: &str,
    flow: &str,
    input: Value,
) -> Bound {
    let sim = prefix_sim(pod, prefix, api_key);
    let (conn, connector_id) = hello_card(&sim, card, None).await;
    let ch = open_channel_on(&conn, None).await;
    let ack = conn
        .auth_start(&ch, flow, input)
        .await
        .expect("auth.start")
        .expect_kind("auth.start.ack")
        .expect("auth.start.ack");
    assert_eq!(ack.str_at("/status"), Some("authenticated"), "{ack:?}");
    Bound {
        sim,
        conn,
        connector_id,
        ch,
    }
}

/// Waits until every pod runs a consumer task (the gauge `metric` is at least 1 on each):
/// pods other than the binding one learn of a binding at their next reload.
pub async fn every_pod_stands_by(cluster: &Cluster, pods: &[PodInfo], metric: &str) {
    eventually(
        REFRESH + WAIT,
        "every pod to run a consumer task",
        || async {
            for p in pods {
                if cluster.metric(p, metric, "").await < 1.0 {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
}

/// The one live pod whose log says it opened the consumer (`line`); panics unless exactly
/// one did.
pub fn the_opener(cluster: &Cluster, line: &str) -> String {
    let openers: Vec<String> = pods_logging(cluster, line)
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(openers.len(), 1, "one pod opened it: {openers:?}");
    openers[0].clone()
}

/// xAgent's client on a pod other than `holder`, with channel `bound.ch` open and every
/// message acknowledged as it arrives.
pub struct Client {
    pub sim: Sim,
    pub conn: Conn,
    pub deliveries: Deliveries,
    _acker: AutoAck,
}

/// Moves the client of `bound` (dropping its connection) to a pod that is not `holder`.
pub async fn client_away_from(
    pods: &[PodInfo],
    holder: &str,
    prefix: &str,
    api_key: &str,
    card: &str,
    bound: Bound,
) -> (Sim, Client) {
    let pod = pods.iter().find(|p| p.name != holder).expect("another pod");
    let Bound {
        sim: binding_sim,
        conn: binding_conn,
        connector_id,
        ch,
    } = bound;
    drop(binding_conn);
    let sim = prefix_sim(pod, prefix, api_key);
    let (conn, _) = hello_card(&sim, card, Some(&connector_id)).await;
    assert_eq!(open_channel_on(&conn, Some(&ch)).await, ch);
    let deliveries = Deliveries::default();
    let acker = conn.spawn_auto_ack(deliveries.clone());
    (
        binding_sim,
        Client {
            sim,
            conn,
            deliveries,
            _acker: acker,
        },
    )
}

/// Calls `push(n)` every 10 ms (n = 0, 1, ...) until stopped, keeping what each call
/// returned (what the fake says it sent).
pub struct Pusher<T> {
    stop: Arc<AtomicBool>,
    pushed: Arc<Mutex<Vec<T>>>,
    task: tokio::task::JoinHandle<()>,
}

impl<T: Clone + Send + 'static> Pusher<T> {
    pub fn start(mut push: impl FnMut(usize) -> T + Send + 'static) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let pushed: Arc<Mutex<Vec<T>>> = Arc::default();
        let task = {
            let (stop, pushed) = (stop.clone(), pushed.clone());
            tokio::spawn(async move {
                let mut n = 0usize;
                while !stop.load(Ordering::SeqCst) {
                    let p = push(n);
                    pushed.lock().expect("pushed").push(p);
                    n += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        };
        Self { stop, pushed, task }
    }

    /// How many were pushed so far.
    pub fn count(&self) -> usize {
        self.pushed.lock().expect("pushed").len()
    }

    /// Waits for `n` more pushes than `after`.
    pub async fn wait_past(&self, after: usize, n: usize) {
        eventually(WAIT, &format!("{n} more pushes"), || async {
            (self.count() >= after + n).then_some(())
        })
        .await;
    }

    /// Stops pushing; everything pushed.
    pub async fn stop(self) -> Vec<T> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("pusher");
        self.pushed.lock().expect("pushed").clone()
    }
}

/// Every one of `ids` delivered to xAgent exactly once, and nothing else: waits for them,
/// then a moment more, as a late repeat would arrive within the delivery ack timeout.
pub async fn assert_delivered_once(deliveries: &Deliveries, ids: &[String]) {
    let total = ids.len();
    assert!(
        deliveries
            .wait_distinct(total, Duration::from_secs(60))
            .await,
        "all {total} delivered, got {}",
        deliveries.distinct()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let snap = deliveries.snapshot();
    let missing: Vec<&String> = ids.iter().filter(|id| !snap.contains_key(*id)).collect();
    let dups = deliveries.duplicates();
    assert!(
        missing.is_empty() && dups.is_empty(),
        "{total} messages: missing {missing:?}, duplicated {dups:?}"
    );
    assert_eq!(snap.len(), total, "nothing else delivered");
}
