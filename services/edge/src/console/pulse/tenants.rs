//! A tenant's own rows: what the hub's per-tenant tally grew by each interval, kept while the
//! tenant had activity in the hour, published for the pod's busiest tenants in a compact form,
//! and read back for a tenant's page with a live pod's quiet intervals as zeros.

use std::collections::{BTreeMap, HashMap};

use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use switchyard_core::tally::TenantCounts;

use super::{
    POINTS, PUBLISH_CONCURRENCY, PodRows, Pulse, Row, SLOTS, TENANTS_PUBLISHED, tenant_key,
};

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn all_zero(v: &[u64]) -> bool {
    v.iter().all(|n| *n == 0)
}

/// A tenant's row as published: the message and tool figures, empty ones left out (a pod
/// publishes up to [`TENANTS_PUBLISHED`] of these rings). Only this build reads them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
struct TenantRow {
    at: i64,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    accepted: BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    delivered: BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    failed: BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "all_zero")]
    delivery: Vec<u64>,
    #[serde(skip_serializing_if = "is_zero")]
    tools: u64,
    #[serde(skip_serializing_if = "all_zero")]
    tool_latency: Vec<u64>,
}

impl From<Row> for TenantRow {
    fn from(r: Row) -> Self {
        Self {
            at: r.at,
            accepted: r.accepted,
            delivered: r.delivered,
            failed: r.failed,
            delivery: r.delivery,
            tools: r.tools,
            tool_latency: r.tool_latency,
        }
    }
}

impl From<TenantRow> for Row {
    fn from(r: TenantRow) -> Self {
        Self {
            at: r.at,
            accepted: r.accepted,
            delivered: r.delivered,
            failed: r.failed,
            delivery: r.delivery,
            tools: r.tools,
            tool_latency: r.tool_latency,
            ..Row::default()
        }
    }
}

/// A pod's published rows of one tenant.
#[derive(Debug, Default, Serialize, Deserialize)]
struct TenantPodRows {
    pod: String,
    rows: Vec<TenantRow>,
}

impl Row {
    /// A tenant's row of the interval at `at`: what its counts grew by since `earlier`.
    fn of_tenant(now: &TenantCounts, earlier: Option<&TenantCounts>, at: i64) -> Row {
        let per_card = |now: &BTreeMap<String, u64>, then: Option<&BTreeMap<String, u64>>| {
            now.iter()
                .map(|(k, v)| {
                    let before = then.and_then(|t| t.get(k)).copied().unwrap_or(0);
                    (k.clone(), v.saturating_sub(before))
                })
                .filter(|(_, v)| *v > 0)
                .collect::<BTreeMap<_, _>>()
        };
        let buckets = |now: &[u64], then: Option<&Vec<u64>>| {
            now.iter()
                .enumerate()
                .map(|(i, v)| v.saturating_sub(then.and_then(|t| t.get(i)).copied().unwrap_or(0)))
                .collect::<Vec<_>>()
        };
        Row {
            at,
            accepted: per_card(&now.accepted, earlier.map(|e| &e.accepted)),
            delivered: per_card(&now.delivered, earlier.map(|e| &e.delivered)),
            failed: per_card(&now.failed, earlier.map(|e| &e.failed)),
            delivery: buckets(&now.delivery, earlier.map(|e| &e.delivery)),
            tools: now.tools.saturating_sub(earlier.map_or(0, |e| e.tools)),
            tool_latency: buckets(&now.tool_latency, earlier.map(|e| &e.tool_latency)),
            ..Row::default()
        }
    }

    /// Messages and tool calls in the row, all counted once (how busy a tenant was).
    pub(super) fn activity(&self) -> u64 {
        let sum = |m: &BTreeMap<String, u64>| m.values().sum::<u64>();
        sum(&self.accepted) + sum(&self.delivered) + sum(&self.failed) + self.tools
    }
}

impl Pulse {
    /// Adds each tenant's row of the interval at `at` (tenants with activity only) and drops
    /// rows, and then tenants, older than the last [`POINTS`] intervals.
    pub(super) fn keep_tenant_rows(
        &self,
        now: &HashMap<String, TenantCounts>,
        earlier: &HashMap<String, TenantCounts>,
        at: i64,
    ) {
        let oldest = at - self.interval_ms() * (POINTS as i64 - 1);
        let mut rings = self.tenant_rings.lock().unwrap_or_else(|e| e.into_inner());
        for (tenant, counts) in now {
            let row = Row::of_tenant(counts, earlier.get(tenant), at);
            if row.activity() > 0 {
                rings.entry(tenant.clone()).or_default().push(row);
            }
        }
        rings.retain(|_, ring| {
            ring.prune(oldest);
            !ring.rows.is_empty()
        });
    }

    /// Writes the rows of this pod's [`TENANTS_PUBLISHED`] busiest tenants under its slot.
    pub(super) async fn publish_tenants(&self) {
        let Some(slot) = *self.slot.lock().unwrap_or_else(|e| e.into_inner()) else {
            return;
        };
        let mut busiest: Vec<(u64, String, Vec<Row>)> = self
            .tenant_rings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(t, ring)| (ring.activity(), t.clone(), ring.rows()))
            .collect();
        busiest.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        busiest.truncate(TENANTS_PUBLISHED);
        let ttl = self.ttl();
        let writes = busiest.into_iter().filter_map(|(_, tenant, rows)| {
            let value = serde_json::to_vec(&TenantPodRows {
                pod: self.pod.clone(),
                rows: rows.into_iter().map(TenantRow::from).collect(),
            })
            .ok()?;
            let key = tenant_key(slot, &tenant);
            Some(async move { self.ephemeral.put(&key, value, ttl).await })
        });
        let failed = futures::stream::iter(writes)
            .buffer_unordered(PUBLISH_CONCURRENCY)
            .filter(|r| std::future::ready(r.is_err()))
            .count()
            .await;
        if failed > 0 {
            tracing::debug!(failed, "some tenants' console pulse could not be published");
        }
    }

    /// `tenant`'s rows on every pod, in the order of [`Pulse::pods`]: a pod's interval without
    /// a row for the tenant is a zero row, so a live pod draws a line at zero.
    pub async fn tenant_pods(&self, tenant: &str) -> Vec<PodRows> {
        let pods = self.pods().await;
        let mut by_pod: HashMap<String, Vec<Row>> = HashMap::new();
        if let Some(ring) = self
            .tenant_rings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(tenant)
        {
            by_pod.insert(self.pod.clone(), ring.rows());
        }
        let reads = (0..SLOTS).map(|i| {
            let key = tenant_key(i, tenant);
            async move { self.ephemeral.get(&key).await }
        });
        for read in futures::future::join_all(reads).await {
            match read {
                Ok(Some(v)) => {
                    if let Ok(p) = serde_json::from_slice::<TenantPodRows>(&v)
                        && p.pod != self.pod
                    {
                        by_pod.insert(p.pod, p.rows.into_iter().map(Row::from).collect());
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "reading a tenant's pulse failed");
                    break;
                }
            }
        }
        pods.into_iter()
            .map(|p| {
                let mine = by_pod.remove(&p.pod).unwrap_or_default();
                let rows = p
                    .rows
                    .iter()
                    .map(|r| {
                        mine.iter().find(|t| t.at == r.at).cloned().unwrap_or(Row {
                            at: r.at,
                            ..Row::default()
                        })
                    })
                    .collect();
                PodRows { pod: p.pod, rows }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use switchyard_core::ephemeral::{Ephemeral, MemoryEphemeral};

    use super::*;

    #[tokio::test]
    async fn a_tenants_rows_are_its_own_on_every_pod() {
        use switchyard_core::tally::TenantTally;
        let eph: Arc<dyn Ephemeral> = Arc::new(MemoryEphemeral::default());
        let (ta, tb) = (
            Arc::new(TenantTally::default()),
            Arc::new(TenantTally::default()),
        );
        let (sa, sb) = (ta.clone(), tb.clone());
        let a = Pulse::with_source("pod-a", Duration::from_secs(60), eph.clone(), String::new)
            .with_tenants(move || sa.snapshot());
        let b = Pulse::with_source("pod-b", Duration::from_secs(60), eph.clone(), String::new)
            .with_tenants(move || sb.snapshot());
        // Counted before the baseline: not in any row.
        ta.accepted("acme", "im.webhook");
        a.step(60_001).await;
        b.step(60_001).await;
        for _ in 0..3 {
            ta.accepted("acme", "im.webhook");
        }
        ta.delivered("acme", "im.webhook", 0.003);
        ta.accepted("other", "im.webhook");
        tb.accepted("acme", "im.telegram");
        tb.tool("acme", 0.02);
        a.step(120_001).await;
        b.step(120_001).await;
        // A quiet interval: no row is kept for it, and it reads as zero.
        a.step(180_001).await;
        b.step(180_001).await;

        let seen = b.tenant_pods("acme").await;
        assert_eq!(
            seen.iter().map(|p| p.pod.as_str()).collect::<Vec<_>>(),
            ["pod-b", "pod-a"]
        );
        let (on_b, on_a) = (&seen[0].rows, &seen[1].rows);
        assert_eq!(
            on_a.iter().map(|r| r.at).collect::<Vec<_>>(),
            [60_000, 120_000]
        );
        assert_eq!(
            on_a[0].accepted["im.webhook"], 3,
            "counts since the baseline"
        );
        assert_eq!(on_a[0].delivered["im.webhook"], 1);
        assert_eq!(on_a[0].delivery.iter().sum::<u64>(), 1);
        assert_eq!(
            on_a[1],
            Row {
                at: 120_000,
                ..Row::default()
            },
            "the quiet interval is zero"
        );
        assert_eq!(on_b[0].accepted["im.telegram"], 1);
        assert!(
            !on_b[0].accepted.contains_key("im.webhook"),
            "pod b's own counts"
        );
        assert_eq!(on_b[0].tools, 1);
        let other = b.tenant_pods("other").await;
        assert_eq!(other[1].rows[0].accepted["im.webhook"], 1);
        assert!(
            other[0].rows.iter().all(|r| r.activity() == 0),
            "nothing on pod b"
        );
        let none = a.tenant_pods("nobody").await;
        assert!(
            none.iter()
                .all(|p| p.rows.iter().all(|r| r.activity() == 0))
        );

        // A tenant quiet for the whole window leaves the pod's memory.
        for k in 4..(POINTS as i64 + 5) {
            a.step(k * 60_000 + 1).await;
        }
        assert!(a.tenant_rings.lock().unwrap().is_empty());
    }

    #[test]
    fn a_tenant_row_leaves_its_empty_fields_out_and_a_pod_row_keeps_them() {
        let quiet = Row {
            at: 5,
            ..Row::default()
        };
        let json = serde_json::to_string(&TenantRow::from(quiet.clone())).unwrap();
        assert_eq!(json, r#"{"at":5}"#);
        let back: TenantRow = serde_json::from_str(&json).unwrap();
        assert_eq!(Row::from(back), quiet);
        // A pod's row is published whole: pods of the previous build read every field.
        let whole = serde_json::to_value(&quiet).unwrap();
        for field in ["accepted", "delivery", "sockets", "outbox", "outbox_oldest"] {
            assert!(whole.get(field).is_some(), "{field}");
        }
    }
}
