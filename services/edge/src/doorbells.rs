//! One bus subscription per connector_id per pod, fanned out to the pod's sessions of that
//! connector. The pod joins a connector's subject with its first socket and leaves it with
//! its last.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use futures::StreamExt;
use switchyard_core::bus::{Bus, Doorbell, connector_topic};
use switchyard_core::error::BackendResult;
use tokio::sync::broadcast;

/// Notices buffered per session before a slow one lags (it then resyncs from the store).
const FANOUT_CAPACITY: usize = 1024;

struct Entry {
    tx: broadcast::Sender<Doorbell>,
    task: tokio::task::JoinHandle<()>,
}

pub struct Doorbells {
    bus: Arc<dyn Bus>,
    subs: Mutex<HashMap<String, Entry>>,
}

/// A session's handle; dropping the last one of a connector leaves its subject.
pub struct Subscription {
    pub rx: broadcast::Receiver<Doorbell>,
    connector_id: String,
    owner: Weak<Doorbells>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.upgrade() {
            owner.release(&self.connector_id);
        }
    }
}

/// A session's next doorbell, or None when some were lost (a lagging or closed
/// subscription: the session resyncs from the store). Pends forever without a
/// subscription.
pub async fn next(bells: &mut Option<Subscription>) -> Option<Doorbell> {
    match bells {
        Some(sub) => match sub.rx.recv().await {
            Ok(b) => Some(b),
            Err(broadcast::error::RecvError::Lagged(_)) => None,
            Err(broadcast::error::RecvError::Closed) => {
                *bells = None;
                None
            }
        },
        None => std::future::pending().await,
    }
}

/// A doorbell already queued (`Some(None)`: some were lost), without waiting.
pub fn try_next(bells: &mut Option<Subscription>) -> Option<Option<Doorbell>> {
    match bells.as_mut()?.rx.try_recv() {
        Ok(b) => Some(Some(b)),
        Err(broadcast::error::TryRecvError::Lagged(_)) => Some(None),
        Err(_) => None,
    }
}

impl Doorbells {
    pub fn new(bus: Arc<dyn Bus>) -> Arc<Self> {
        Arc::new(Self {
            bus,
            subs: Mutex::new(HashMap::new()),
        })
    }

    pub async fn subscribe(self: &Arc<Self>, connector_id: &str) -> BackendResult<Subscription> {
        if let Some(rx) = self.existing(connector_id) {
            return Ok(Subscription {
                rx,
                connector_id: connector_id.to_owned(),
                owner: Arc::downgrade(self),
            });
        }
        let mut stream = self.bus.subscribe(&connector_topic(connector_id)).await?;
        let mut subs = self.subs.lock().unwrap_or_else(|e| e.into_inner());
        // Another session may have subscribed while we awaited; keep theirs.
        if let Some(e) = subs.get(connector_id) {
            let rx = e.tx.subscribe();
            return Ok(Subscription {
                rx,
                connector_id: connector_id.to_owned(),
                owner: Arc::downgrade(self),
            });
        }
        let (tx, rx) = broadcast::channel(FANOUT_CAPACITY);
        let fan = tx.clone();
        let task = tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                if let Some(bell) = Doorbell::decode(&msg) {
                    let _ = fan.send(bell);
                }
            }
        });
        subs.insert(connector_id.to_owned(), Entry { tx, task });
        metrics::gauge!("switchyard_connector_subscriptions").set(subs.len() as f64);
        Ok(Subscription {
            rx,
            connector_id: connector_id.to_owned(),
            owner: Arc::downgrade(self),
        })
    }

    fn existing(&self, connector_id: &str) -> Option<broadcast::Receiver<Doorbell>> {
        let subs = self.subs.lock().unwrap_or_else(|e| e.into_inner());
        subs.get(connector_id).map(|e| e.tx.subscribe())
    }

    fn release(&self, connector_id: &str) {
        let mut subs = self.subs.lock().unwrap_or_else(|e| e.into_inner());
        // The dropping receiver still counts while Drop runs, so one means "last one".
        if subs
            .get(connector_id)
            .is_some_and(|e| e.tx.receiver_count() <= 1)
            && let Some(e) = subs.remove(connector_id)
        {
            e.task.abort();
        }
        metrics::gauge!("switchyard_connector_subscriptions").set(subs.len() as f64);
    }
}
