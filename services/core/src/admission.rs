//! Admission of provider ingress requests (webhooks, Feishu HTTP events) before their
//! signature is known: a pod-wide pool of slots, of which one tenant and one channel may
//! hold only a share, so a sender that keeps its own requests open (a slow body) cannot take
//! the slots every other tenant's messages need.
//!
//! Nothing waits for a slot: a request that finds its share or the pool full is answered at
//! once (429 for a tenant's or a channel's share, 503 for the pod), and the refusal is
//! counted as `switchyard_limits_hit_total{limit="ingress_concurrency_*"}`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::client_error::ClientError;
use crate::limits;

/// How many ingress requests may be in flight at once: on the pod, per tenant and per
/// channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngressShares {
    pub per_pod: usize,
    pub per_tenant: usize,
    pub per_channel: usize,
}

impl Default for IngressShares {
    /// 64 per pod, 16 per tenant (a quarter of the pool), 8 per channel.
    fn default() -> Self {
        Self {
            per_pod: 64,
            per_tenant: 16,
            per_channel: 8,
        }
    }
}

/// Which bound refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Pod,
    Tenant,
    Channel,
}

impl Refused {
    /// The limit name of the refusal counter.
    pub fn limit(self) -> &'static str {
        match self {
            Self::Pod => "ingress_concurrency_pod",
            Self::Tenant => "ingress_concurrency_tenant",
            Self::Channel => "ingress_concurrency_channel",
        }
    }

    /// What the sender is answered: 503 when the pod is full (another pod may serve it),
    /// 429 when its own share is used up.
    pub fn client_error(self) -> ClientError {
        match self {
            Self::Pod => ClientError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                "too many inbound requests in flight; retry later",
            ),
            Self::Tenant => ClientError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                "too many inbound requests in flight for this tenant; retry later",
            ),
            Self::Channel => ClientError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                "too many inbound requests in flight for this channel; retry later",
            ),
        }
    }
}

/// The pool of one provider's ingress on one pod.
pub struct IngressAdmission {
    shares: IngressShares,
    pod: Arc<Semaphore>,
    /// Requests in flight per tenant and per channel; only keys with one are kept.
    busy: Mutex<Busy>,
}

#[derive(Default)]
struct Busy {
    tenants: HashMap<String, usize>,
    channels: HashMap<String, usize>,
}

impl IngressAdmission {
    /// Every bound is at least 1; a tenant's and a channel's share never exceed the pool.
    pub fn new(shares: IngressShares) -> Arc<Self> {
        let per_pod = shares.per_pod.max(1);
        Arc::new(Self {
            shares: IngressShares {
                per_pod,
                per_tenant: shares.per_tenant.clamp(1, per_pod),
                per_channel: shares.per_channel.clamp(1, per_pod),
            },
            pod: Arc::new(Semaphore::new(per_pod)),
            busy: Mutex::default(),
        })
    }

    pub fn shares(&self) -> IngressShares {
        self.shares
    }

    /// Whether the pool is full now: lets a route answer before it spends a store lookup
    /// on finding the channel's tenant. Counts the refusal.
    pub fn pod_full(&self) -> bool {
        let full = self.pod.available_permits() == 0;
        if full {
            limits::hit(Refused::Pod.limit());
        }
        full
    }

    /// A slot for one request of `channel_id` (of `tenant_id`, when known), or which bound
    /// refused it. The slot is given back when dropped. Counts the refusal.
    pub fn admit(
        self: &Arc<Self>,
        tenant_id: Option<&str>,
        channel_id: &str,
    ) -> Result<IngressSlot, Refused> {
        let refused = |r: Refused| {
            limits::hit(r.limit());
            Err(r)
        };
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        if busy.channels.get(channel_id).copied().unwrap_or(0) >= self.shares.per_channel {
            return refused(Refused::Channel);
        }
        if let Some(t) = tenant_id
            && busy.tenants.get(t).copied().unwrap_or(0) >= self.shares.per_tenant
        {
            return refused(Refused::Tenant);
        }
        let Ok(permit) = self.pod.clone().try_acquire_owned() else {
            return refused(Refused::Pod);
        };
        *busy.channels.entry(channel_id.to_owned()).or_insert(0) += 1;
        if let Some(t) = tenant_id {
            *busy.tenants.entry(t.to_owned()).or_insert(0) += 1;
        }
        Ok(IngressSlot {
            admission: self.clone(),
            tenant_id: tenant_id.map(str::to_owned),
            channel_id: channel_id.to_owned(),
            _permit: permit,
        })
    }
}

/// One request in flight; its place in the pool and in its tenant's and channel's shares.
pub struct IngressSlot {
    admission: Arc<IngressAdmission>,
    tenant_id: Option<String>,
    channel_id: String,
    _permit: OwnedSemaphorePermit,
}

fn release(map: &mut HashMap<String, usize>, key: &str) {
    if let Some(n) = map.get_mut(key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            map.remove(key);
        }
    }
}

impl Drop for IngressSlot {
    fn drop(&mut self) {
        let mut busy = self
            .admission
            .busy
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        release(&mut busy.channels, &self.channel_id);
        if let Some(t) = &self.tenant_id {
            release(&mut busy.tenants, t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_keeps_to_its_share_and_leaves_the_rest_of_the_pool() {
        let a = IngressAdmission::new(IngressShares {
            per_pod: 8,
            per_tenant: 3,
            per_channel: 2,
        });
        // Tenant A on many channels: held to 3 of the 8 slots.
        let mut held = Vec::new();
        for ch in 0..8 {
            if let Ok(s) = a.admit(Some("a"), &format!("a{ch}")) {
                held.push(s);
            }
        }
        assert_eq!(held.len(), 3);
        assert_eq!(a.admit(Some("a"), "a9").err(), Some(Refused::Tenant));
        // Tenant B still gets its share; one channel of it no more than 2.
        let b1 = a.admit(Some("b"), "b0").expect("b's first");
        let b2 = a.admit(Some("b"), "b0").expect("b's second");
        assert_eq!(a.admit(Some("b"), "b0").err(), Some(Refused::Channel));
        // A request with no known tenant is held to its channel's share.
        let _u = a.admit(None, "u0").expect("unknown tenant");
        drop((b1, b2));
        assert!(!a.busy.lock().unwrap().channels.contains_key("b0"));
        drop(held);
        assert!(a.busy.lock().unwrap().tenants.is_empty());
        assert_eq!(a.pod.available_permits(), 7);
    }

    #[test]
    fn a_full_pool_refuses_with_503_and_shares_with_429() {
        let a = IngressAdmission::new(IngressShares {
            per_pod: 2,
            per_tenant: 2,
            per_channel: 2,
        });
        let _x = a.admit(Some("a"), "a").unwrap();
        let _y = a.admit(Some("b"), "b").unwrap();
        assert!(a.pod_full());
        assert_eq!(a.admit(Some("c"), "c").err(), Some(Refused::Pod));
        assert_eq!(
            Refused::Pod.client_error().status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            Refused::Tenant.client_error().status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}
