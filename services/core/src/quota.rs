//! Per-tenant quotas, so one tenant cannot slow or starve another: live sockets, channels
//! and stored bytes (files and host artifacts; cluster-wide, counted by the store in the same
//! step as the insert they admit, under the tenant's lock, so concurrent requests cannot
//! pass them), and the rate of work requests on the data plane (a token bucket per tenant on
//! each pod: no store or network round trip per packet). The delta buffers a tenant may
//! keep in the shared ephemeral store have their own byte budget (`ephemeral_bytes`,
//! charged by the engine).
//!
//! The deployment's defaults come from configuration (`[quotas]`); a tenant's overrides
//! live in the store (`switchyard tenant quota`) and every pod reloads them with
//! [`Quotas::refresh`]. A quota of 0 is unlimited. Refusals are `busy` (a count) or
//! `rate_limited` (the rate), and their message names the quota and its value.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use switchyard_protocol::ErrorCode;

use crate::engine::Fault;
use crate::error::{BackendResult, ErrorKind};
use crate::model::TenantQuota;
use crate::store::Store;

/// Quota values for one tenant; 0 = unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QuotaValues {
    pub sockets: u64,
    pub channels: u64,
    pub stored_bytes: u64,
    /// Work requests per second on each pod (bursts up to twice this).
    pub requests_per_second: u64,
}

impl QuotaValues {
    /// These values with a tenant's overrides applied.
    pub fn with(self, o: &TenantQuota) -> Self {
        Self {
            sockets: o.sockets.unwrap_or(self.sockets),
            channels: o.channels.unwrap_or(self.channels),
            stored_bytes: o.stored_bytes.unwrap_or(self.stored_bytes),
            requests_per_second: o.requests_per_second.unwrap_or(self.requests_per_second),
        }
    }
}

/// Token buckets are kept for tenants seen recently; one idle this long is forgotten
/// (and starts full when it comes back), so the map is bounded by active tenants.
const BUCKET_IDLE: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

#[derive(Debug)]
pub struct Quotas {
    defaults: QuotaValues,
    overrides: RwLock<HashMap<String, TenantQuota>>,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl Quotas {
    pub fn new(defaults: QuotaValues) -> Self {
        Self {
            defaults,
            overrides: RwLock::new(HashMap::new()),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Reloads every tenant's overrides from the store, and forgets idle buckets.
    pub async fn refresh(&self, store: &dyn Store) -> BackendResult<()> {
        let all = store.tenant_quotas().await?;
        let map = all.into_iter().map(|q| (q.tenant_id.clone(), q)).collect();
        *self.overrides.write().unwrap_or_else(|e| e.into_inner()) = map;
        let now = Instant::now();
        self.buckets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, b| now.duration_since(b.at) < BUCKET_IDLE);
        Ok(())
    }

    /// The quotas that apply to a tenant now.
    pub fn effective(&self, tenant_id: &str) -> QuotaValues {
        let overrides = self.overrides.read().unwrap_or_else(|e| e.into_inner());
        match overrides.get(tenant_id) {
            Some(o) => self.defaults.with(o),
            None => self.defaults,
        }
    }

    /// Takes one request from the tenant's bucket, or says how long until there is one.
    pub fn admit_request(&self, tenant_id: &str) -> Result<(), Fault> {
        let rate = self.effective(tenant_id).requests_per_second;
        if rate == 0 {
            return Ok(());
        }
        let rate_f = rate as f64;
        let burst = rate_f * 2.0;
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let b = buckets.entry(tenant_id.to_owned()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * rate_f).min(burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Ok(());
        }
        let wait_ms = (((1.0 - b.tokens) / rate_f) * 1000.0).ceil().max(1.0);
        drop(buckets);
        hit("requests_per_second");
        Err(Fault::new(
            ErrorCode::RateLimited,
            format!("tenant quota requests_per_second ({rate}/s) exceeded; retry in {wait_ms} ms"),
        ))
    }

    /// Refuses a new socket when the tenant already has its quota of live ones.
    pub async fn admit_socket(&self, store: &dyn Store, tenant_id: &str) -> Result<(), Fault> {
        let max = self.effective(tenant_id).sockets;
        if max == 0 {
            return Ok(());
        }
        let n = store.count_tenant_sockets(tenant_id, max).await?;
        at_most(n, max, "sockets", "close a socket")
    }
}

fn at_most(n: u64, max: u64, quota: &'static str, hint: &str) -> Result<(), Fault> {
    if n < max {
        return Ok(());
    }
    Err(reached(quota, max, hint))
}

/// The refusal of a tenant at its quota, counted.
pub fn reached(quota: &'static str, max: u64, hint: &str) -> Fault {
    hit(quota);
    Fault::new(
        ErrorCode::Busy,
        format!("tenant quota {quota} ({max}) reached; {hint} or ask the operator to raise it"),
    )
}

/// The outcome of a store insert made within `quota` (`Store::insert_channel_within` and
/// the like): the store's `LimitExceeded` becomes the quota's `busy` refusal.
pub fn within(
    inserted: BackendResult<()>,
    quota: &'static str,
    max: u64,
    hint: &str,
) -> Result<(), Fault> {
    match inserted {
        Ok(()) => Ok(()),
        Err(e) if e.is(ErrorKind::LimitExceeded) => Err(reached(quota, max, hint)),
        Err(e) => Err(e.into()),
    }
}

/// Counts one refusal by the quota named `quota`.
pub(crate) fn refused(quota: &'static str) {
    hit(quota);
}

fn hit(quota: &'static str) {
    metrics::counter!("switchyard_quota_refused_total", "quota" => quota).increment(1);
}

/// Every quota name, so the refusal counter's series exist from the start.
pub const QUOTA_NAMES: [&str; 5] = [
    "sockets",
    "channels",
    "stored_bytes",
    "requests_per_second",
    "ephemeral_bytes",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas(rps: u64) -> Quotas {
        Quotas::new(QuotaValues {
            requests_per_second: rps,
            ..QuotaValues::default()
        })
    }

    #[test]
    fn a_tenant_gets_its_burst_then_rate_limited_naming_the_quota() {
        let q = quotas(5);
        for _ in 0..10 {
            q.admit_request("a")
                .expect("within the burst of 2x the rate");
        }
        let f = q.admit_request("a").expect_err("over the burst");
        assert_eq!(f.code, ErrorCode::RateLimited);
        assert!(
            f.message.contains("requests_per_second (5/s)"),
            "{}",
            f.message
        );
        // Another tenant's bucket is its own.
        q.admit_request("b").expect("tenant b is not slowed by a");
    }

    #[test]
    fn zero_is_unlimited_and_overrides_win() {
        let q = quotas(0);
        for _ in 0..10_000 {
            q.admit_request("a").expect("unlimited");
        }
        q.overrides.write().unwrap().insert(
            "a".into(),
            TenantQuota {
                tenant_id: "a".into(),
                requests_per_second: Some(1),
                sockets: Some(0),
                ..TenantQuota::default()
            },
        );
        let e = q.effective("a");
        assert_eq!(e.requests_per_second, 1);
        assert_eq!(e.sockets, 0);
        assert_eq!(q.effective("b"), QuotaValues::default());
        q.admit_request("a").expect("burst of 2");
        q.admit_request("a").expect("burst of 2");
        assert!(q.admit_request("a").is_err());
    }

    #[test]
    fn a_count_at_the_quota_is_refused_as_busy() {
        assert!(at_most(2, 3, "sockets", "close a socket").is_ok());
        let f = at_most(3, 3, "sockets", "close a socket").expect_err("at quota");
        assert_eq!(f.code, ErrorCode::Busy);
        assert!(f.message.contains("tenant quota sockets (3)"));
    }
}
