//! Per-tenant figures for the console's tenant page, kept apart from the metrics: a metric
//! label per tenant would grow the exposition without bound, so the pod counts what each
//! tenant's messages did here, in memory, for at most [`MAX_TENANTS`] tenants. The console's
//! sampler reads the counts once an interval ([`TenantTally::snapshot`]) and turns their
//! increases into the tenant's chart rows.
//!
//! Counts are cumulative since the process started and never hold message text. A tenant
//! past the cap is not counted on this pod (`switchyard_console_tenants_untracked_total`
//! counts its events); a tenant's entry stays until the process ends, so the map holds at
//! most [`MAX_TENANTS`] entries of a few hundred bytes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// Buckets of every `*_seconds` histogram and of the tallies' latencies: 1 ms to 1 min (the
/// console's charts read them).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Most tenants one pod counts.
pub const MAX_TENANTS: usize = 4096;

/// What one tenant's messages did on this pod since it started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantCounts {
    /// Inbound messages stored, by Card.
    pub accepted: BTreeMap<String, u64>,
    /// Deliveries xAgent acknowledged (or, for `message.push`, the socket took), by Card.
    pub delivered: BTreeMap<String, u64>,
    /// Deliveries xAgent rejected and xAgent -> target messages refused, by Card.
    pub failed: BTreeMap<String, u64>,
    /// Delivery latencies per bucket of [`LATENCY_BUCKETS`] (then +Inf), not cumulative.
    pub delivery: Vec<u64>,
    pub tools: u64,
    /// Tool call durations per bucket, as `delivery`.
    pub tool_latency: Vec<u64>,
}

/// The bucket `secs` falls in: the first bound at or above it, else +Inf.
fn bucket_of(secs: f64) -> usize {
    LATENCY_BUCKETS
        .iter()
        .position(|b| secs <= *b)
        .unwrap_or(LATENCY_BUCKETS.len())
}

fn observe(buckets: &mut Vec<u64>, secs: f64) {
    buckets.resize(LATENCY_BUCKETS.len() + 1, 0);
    buckets[bucket_of(secs)] += 1;
}

fn bump(by_card: &mut BTreeMap<String, u64>, card: &str, n: u64) {
    match by_card.get_mut(card) {
        Some(v) => *v += n,
        None => {
            by_card.insert(card.to_owned(), n);
        }
    }
}

/// The pod's per-tenant counts; one short lock per event.
#[derive(Debug, Default)]
pub struct TenantTally {
    tenants: Mutex<HashMap<String, TenantCounts>>,
}

impl TenantTally {
    fn with(&self, tenant: &str, f: impl FnOnce(&mut TenantCounts)) {
        if tenant.is_empty() {
            // A delivery whose route left meanwhile: no tenant to count it for.
            return;
        }
        let mut map = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = map.get_mut(tenant) {
            f(c);
            return;
        }
        if map.len() >= MAX_TENANTS {
            drop(map);
            metrics::counter!("switchyard_console_tenants_untracked_total").increment(1);
            return;
        }
        f(map.entry(tenant.to_owned()).or_default());
    }

    /// An inbound message of `tenant` through `card` was stored.
    pub fn accepted(&self, tenant: &str, card: &str) {
        self.with(tenant, |c| bump(&mut c.accepted, card, 1));
    }

    /// xAgent acknowledged a delivery (or the socket took a push) `secs` after acceptance.
    pub fn delivered(&self, tenant: &str, card: &str, secs: f64) {
        self.with(tenant, |c| {
            bump(&mut c.delivered, card, 1);
            observe(&mut c.delivery, secs);
        });
    }

    /// A delivery was rejected, or an xAgent -> target message refused.
    pub fn failed(&self, tenant: &str, card: &str) {
        self.with(tenant, |c| bump(&mut c.failed, card, 1));
    }

    /// A tool call finished (whatever its outcome) after `secs`.
    pub fn tool(&self, tenant: &str, secs: f64) {
        self.with(tenant, |c| {
            c.tools += 1;
            observe(&mut c.tool_latency, secs);
        });
    }

    /// Every tenant's counts now.
    pub fn snapshot(&self) -> HashMap<String, TenantCounts> {
        self.tenants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_tenant_apart_and_buckets_latencies() {
        let t = TenantTally::default();
        t.accepted("a", "im.webhook");
        t.accepted("a", "im.webhook");
        t.accepted("b", "im.telegram");
        t.delivered("a", "im.webhook", 0.004);
        t.delivered("a", "im.webhook", 120.0);
        t.failed("b", "im.telegram");
        t.tool("b", 0.0005);
        t.delivered("", "im.webhook", 0.1);
        let s = t.snapshot();
        assert!(!s.contains_key(""), "no entry without a tenant");
        assert_eq!(s["a"].accepted["im.webhook"], 2);
        assert!(!s["a"].accepted.contains_key("im.telegram"));
        assert_eq!(s["b"].accepted["im.telegram"], 1);
        assert_eq!(s["a"].delivered["im.webhook"], 2);
        // 4 ms falls in the 5 ms bucket, 2 minutes past the last bound in +Inf.
        assert_eq!(s["a"].delivery[2], 1);
        assert_eq!(s["a"].delivery[LATENCY_BUCKETS.len()], 1);
        assert_eq!(s["a"].delivery.iter().sum::<u64>(), 2);
        assert_eq!(s["b"].failed["im.telegram"], 1);
        assert_eq!((s["b"].tools, s["b"].tool_latency[0]), (1, 1));
        assert_eq!(s["a"].tools, 0);
    }

    #[test]
    fn tenants_past_the_cap_are_not_counted() {
        let t = TenantTally::default();
        for i in 0..MAX_TENANTS {
            t.accepted(&format!("t{i}"), "c");
        }
        t.accepted("one-too-many", "c");
        t.accepted("t0", "c");
        let s = t.snapshot();
        assert_eq!(s.len(), MAX_TENANTS);
        assert!(!s.contains_key("one-too-many"));
        assert_eq!(s["t0"].accepted["c"], 2, "a counted tenant keeps counting");
    }
}
