//! The operator console's pages (rows after a cursor in key order, at most a clamped limit)
//! and bounded counts (`store-sql`'s `ops/console.rs`).

use crate::hoststore::{ApprovalRecord, ApprovalStatus, HostRecord, HostStatus, RunRecord};
use crate::model::*;

use super::{Tables, capped, page_limit};

/// The rows of `map` after `after` in key order, at most `limit` (clamped as the console's
/// queries clamp it).
fn page_after<'a, V: 'a>(
    map: &'a std::collections::BTreeMap<String, V>,
    after: Option<&str>,
    keep: impl Fn(&V) -> bool,
    limit: u32,
) -> impl Iterator<Item = &'a V> {
    let after = after.unwrap_or("").to_owned();
    map.range::<String, _>((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
        .map(|(_, v)| v)
        .filter(move |v| keep(v))
        .take(page_limit(limit))
}

impl Tables {
    pub(super) fn page_tenants(&self, after: Option<&str>, limit: u32) -> Vec<Tenant> {
        page_after(&self.tenants, after, |_| true, limit)
            .cloned()
            .collect()
    }

    pub(super) fn page_connectors(&self, after: Option<&str>, limit: u32) -> Vec<ConnectorRecord> {
        page_after(&self.connectors, after, |_| true, limit)
            .cloned()
            .collect()
    }

    pub(super) fn page_channels(
        &self,
        after: Option<&str>,
        bound_only: bool,
        limit: u32,
    ) -> Vec<ChannelSummary> {
        page_after(
            &self.channels,
            after,
            |c| !bound_only || c.binding.is_some(),
            limit,
        )
        .map(|c| self.summary(c))
        .collect()
    }

    /// A channel as the console lists it, with its outbox depth.
    fn summary(&self, c: &ChannelRecord) -> ChannelSummary {
        let rows = || self.outbox.values().filter(|m| m.channel_id == c.id);
        let pending = || rows().filter(|m| self.is_pending(m));
        ChannelSummary {
            id: c.id.clone(),
            tenant_id: c.tenant_id.clone(),
            connector_id: c.connector_id.clone(),
            card_id: c.card_id.clone(),
            status: c.status,
            view: c.view.clone(),
            bound: c.binding.is_some(),
            routed: c.route_socket.is_some(),
            pending: pending().count() as u64,
            oldest_pending_at: pending().next().map(|m| m.created_at),
            failed: rows().filter(|m| m.state == OutboxState::Failed).count() as u64,
            created_at: c.created_at,
            updated_at: c.updated_at,
        }
    }

    pub(super) fn page_failures(
        &self,
        before_seq: Option<i64>,
        limit: u32,
    ) -> Vec<DeliveryFailure> {
        self.outbox
            .range(..before_seq.unwrap_or(i64::MAX))
            .rev()
            .filter_map(|(_, m)| {
                let reason = m.last_error.clone()?;
                let c = self.channels.get(&m.channel_id)?;
                Some(DeliveryFailure {
                    seq: m.seq,
                    channel_id: m.channel_id.clone(),
                    tenant_id: c.tenant_id.clone(),
                    card_id: c.card_id.clone(),
                    message_id: m.message_id.clone(),
                    state: m.state,
                    attempts: m.attempts,
                    reason,
                    created_at: m.created_at,
                })
            })
            .take(page_limit(limit))
            .collect()
    }

    pub(super) fn page_hosts(&self, after: Option<&str>, limit: u32) -> Vec<HostRecord> {
        page_after(&self.hosts, after, |_| true, limit)
            .map(|row| row.host.clone())
            .collect()
    }

    pub(super) fn page_runs(&self, before: Option<(i64, &str)>, limit: u32) -> Vec<RunRecord> {
        let before = before.unwrap_or((i64::MAX, ""));
        let mut out: Vec<&RunRecord> = self
            .runs
            .values()
            .filter(|r| (r.created_at, r.id.as_str()) < before)
            .collect();
        out.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
        out.into_iter().take(page_limit(limit)).cloned().collect()
    }

    pub(super) fn page_approvals(
        &self,
        status: ApprovalStatus,
        after: Option<(i64, &str)>,
        limit: u32,
    ) -> Vec<ApprovalRecord> {
        let after = after.unwrap_or((i64::MIN, ""));
        let mut out: Vec<&ApprovalRecord> = self
            .approvals
            .values()
            .filter(|a| a.status == status && (a.created_at, a.id.as_str()) > after)
            .collect();
        out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        out.into_iter().take(page_limit(limit)).cloned().collect()
    }

    pub(super) fn overview(&self, at_most: u64) -> Overview {
        let count = |n: usize| capped(n, at_most);
        let channels = self.channels.values();
        Overview {
            tenants: count(self.tenants.len()),
            connectors: count(self.connectors.len()),
            connectors_offline: count(
                self.connectors
                    .values()
                    .filter(|c| c.offline_since.is_some())
                    .count(),
            ),
            channels: count(self.channels.len()),
            bound_channels: count(channels.filter(|c| c.binding.is_some()).count()),
            outbox: count(self.outbox.len()),
            outbox_failed: count(
                self.outbox
                    .values()
                    .filter(|m| m.state == OutboxState::Failed)
                    .count(),
            ),
            hosts_online: count(
                self.hosts
                    .values()
                    .filter(|h| h.host.status == HostStatus::Online)
                    .count(),
            ),
            approvals_pending: count(
                self.approvals
                    .values()
                    .filter(|a| a.status == ApprovalStatus::Pending)
                    .count(),
            ),
        }
    }
}
