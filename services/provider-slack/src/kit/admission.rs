//! Ingress admission: a request to an unauthenticated ingress route takes a slot of the pod,
//! of its tenant and of its channel before its body is read, so one known URL cannot take
//! the pool the others need. Slots are given back when the guard drops.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The pod's slots are taken (answer 503: another pod may take it).
    Pod,
    /// The tenant's or the channel's share is taken (answer 429).
    Tenant,
    Channel,
}

impl Refused {
    /// The limit's name for `limits::hit`.
    pub fn limit(self) -> &'static str {
        match self {
            Self::Pod => "ingress_concurrency_pod",
            Self::Tenant => "ingress_concurrency_tenant",
            Self::Channel => "ingress_concurrency_channel",
        }
    }
}

pub(crate) struct Admission {
    pod: Arc<Semaphore>,
    per_tenant: usize,
    per_channel: usize,
    counts: Arc<Mutex<HashMap<String, usize>>>,
}

/// Held while a request is served.
pub(crate) struct Slot {
    _pod: OwnedSemaphorePermit,
    keys: Vec<String>,
    counts: Arc<Mutex<HashMap<String, usize>>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        for k in &self.keys {
            if let Some(n) = c.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    c.remove(k);
                }
            }
        }
    }
}

impl Admission {
    pub fn new(pod: usize, per_tenant: usize, per_channel: usize) -> Self {
        Self {
            pod: Arc::new(Semaphore::new(pod.max(1))),
            per_tenant: per_tenant.max(1),
            per_channel: per_channel.max(1),
            counts: Arc::default(),
        }
    }

    /// A slot of the pod, the tenant and the channel, or which of them is full.
    pub fn admit(&self, tenant_id: &str, channel_id: &str) -> Result<Slot, Refused> {
        let pod = self
            .pod
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refused::Pod)?;
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let t = format!("t:{tenant_id}");
        let ch = format!("c:{channel_id}");
        if c.get(&t).copied().unwrap_or(0) >= self.per_tenant {
            return Err(Refused::Tenant);
        }
        if c.get(&ch).copied().unwrap_or(0) >= self.per_channel {
            return Err(Refused::Channel);
        }
        *c.entry(t.clone()).or_default() += 1;
        *c.entry(ch.clone()).or_default() += 1;
        Ok(Slot {
            _pod: pod,
            keys: vec![t, ch],
            counts: self.counts.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_tenant_and_pod_shares_are_bounded_and_given_back() {
        let a = Admission::new(3, 2, 1);
        let one = a.admit("t1", "c1").unwrap();
        assert_eq!(a.admit("t1", "c1").err(), Some(Refused::Channel));
        let two = a.admit("t1", "c2").unwrap();
        assert_eq!(a.admit("t1", "c3").err(), Some(Refused::Tenant));
        let three = a.admit("t2", "c4").unwrap();
        assert_eq!(a.admit("t3", "c5").err(), Some(Refused::Pod));
        drop((one, two, three));
        assert!(a.admit("t1", "c1").is_ok());
        assert!(a.counts.lock().unwrap().len() <= 2);
    }
}
