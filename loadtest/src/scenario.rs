//! Disruptions during the load: SIGKILL of one pod, or a rolling restart (SIGTERM each
//! pod in turn, a replacement started before moving on).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::args::Mode;
use crate::pods::{Fleet, PodState};
use crate::xagent::Reconnect;

/// Pause between two steps of a rolling restart.
const ROLL_GAP: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Seconds since the load started.
    pub at_s: f64,
    pub action: String,
    pub pod: String,
    pub detail: String,
    #[serde(skip)]
    pub at: Instant,
}

/// What happened, shared with the report.
#[derive(Default)]
pub struct Events(Mutex<Vec<Event>>);

impl Events {
    pub fn push(&self, start: Instant, action: &str, pod: &str, detail: String) {
        let at = Instant::now();
        println!(
            "[{:>6.1}s] {action} {pod} {detail}",
            at.duration_since(start).as_secs_f64()
        );
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Event {
                at_s: at.duration_since(start).as_secs_f64(),
                action: action.to_owned(),
                pod: pod.to_owned(),
                detail,
                at,
            });
    }

    pub fn list(&self) -> Vec<Event> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Recovery after one disruption of a pod: the backends that were on it, and when all
/// their channels were open again.
#[derive(Debug, Clone, Serialize)]
pub struct Recovery {
    pub action: String,
    pub pod: String,
    pub at_s: f64,
    pub backends_affected: usize,
    /// Disruption -> the last affected backend had every channel reopened.
    pub all_channels_back_ms: Option<f64>,
    pub reconnects: Vec<Reconnect>,
}

/// Matches each SIGKILL/SIGTERM to the reconnects away from that pod that followed it.
pub fn recoveries(events: &[Event], reconnects: &[Reconnect]) -> Vec<Recovery> {
    events
        .iter()
        .filter(|e| e.action == "sigkill" || e.action == "sigterm")
        .map(|e| {
            let mine: Vec<Reconnect> = reconnects
                .iter()
                .filter(|r| r.from_pod == e.pod && r.lost_at >= e.at)
                .cloned()
                .collect();
            let back = mine
                .iter()
                .map(|r| r.back_at.duration_since(e.at).as_secs_f64() * 1000.0)
                .fold(None, |acc: Option<f64>, x| {
                    Some(acc.map_or(x, |a| a.max(x)))
                });
            Recovery {
                action: e.action.clone(),
                pod: e.pod.clone(),
                at_s: e.at_s,
                backends_affected: mine.len(),
                all_channels_back_ms: back,
                reconnects: mine,
            }
        })
        .collect()
}

/// SIGKILL one pod `after` the start. Cluster: the last serving pod, so that at least
/// one backend must move (backends start on pods 0..tenants). Embedded: the only pod,
/// restarted at once on the same data directory.
pub async fn kill_pod(
    fleet: Arc<Fleet>,
    mode: Mode,
    start: Instant,
    after: Duration,
    events: Arc<Events>,
) {
    tokio::time::sleep_until((start + after).into()).await;
    let Some(pod) = fleet.serving().into_iter().next_back() else {
        events.push(start, "skip", "-", "no serving pod to kill".into());
        return;
    };
    // Recorded first: sockets on the pod close the moment it dies, before it is reaped.
    events.push(start, "sigkill", &pod.name, format!("pid {}", pod.pid));
    pod.kill().await;
    if mode == Mode::Embedded {
        restart(&fleet, start, &events).await;
    }
}

/// SIGTERM each pod serving at `after`, one at a time; a replacement is started (embedded:
/// after the old one exited, as they share the SQLite file) and ready, and 2 s pass, before
/// the next.
pub async fn rolling_restart(
    fleet: Arc<Fleet>,
    mode: Mode,
    start: Instant,
    after: Duration,
    events: Arc<Events>,
) {
    tokio::time::sleep_until((start + after).into()).await;
    for pod in fleet.serving() {
        if pod.state() != PodState::Serving {
            continue;
        }
        events.push(start, "sigterm", &pod.name, format!("pid {}", pod.pid));
        if let Err(e) = pod.term() {
            events.push(start, "error", &pod.name, format!("{e:#}"));
            continue;
        }
        if mode == Mode::Embedded {
            let how = pod.wait_exit(Duration::from_secs(60)).await;
            events.push(start, "exited", &pod.name, how);
            restart(&fleet, start, &events).await;
        } else {
            let (how, ()) = tokio::join!(
                pod.wait_exit(Duration::from_secs(60)),
                restart(&fleet, start, &events)
            );
            events.push(start, "exited", &pod.name, how);
        }
        // Let the moved backends settle before the next pod goes, as a rollout would.
        tokio::time::sleep(ROLL_GAP).await;
    }
}

async fn restart(fleet: &Fleet, start: Instant, events: &Events) {
    match fleet.start_pod().await {
        Ok(p) => events.push(start, "started", &p.name, format!("pid {} ready", p.pid)),
        Err(e) => events.push(start, "error", "replacement", format!("{e:#}")),
    }
}
