//! Connector_ids, their sockets and the pods that hold them, and the janitor's cascade
//! (`store-sql`'s `ops/connectors.rs` and the dialects' socket bookkeeping).

use crate::error::BackendResult;
use crate::model::*;

use super::tenants::quota_full;
use super::{Tables, duplicate, missing};

impl Tables {
    pub(super) fn connector_for(&self, tenant_id: &str, card_id: &str) -> Option<ConnectorRecord> {
        self.connectors
            .values()
            .find(|c| c.tenant_id == tenant_id && c.card_id == card_id)
            .cloned()
    }

    pub(super) fn insert_connector(&mut self, c: &ConnectorRecord) -> BackendResult<()> {
        if self.connectors.contains_key(&c.id) {
            return Err(duplicate("connector"));
        }
        if self.connector_for(&c.tenant_id, &c.card_id).is_some() {
            return Err(duplicate("connector for this tenant and Card"));
        }
        if !self.tenants.contains_key(&c.tenant_id) {
            return Err(missing("tenant"));
        }
        self.connectors.insert(c.id.clone(), c.clone());
        Ok(())
    }

    /// Registers the socket; with `quota` (tenant, max > 0) only while the tenant has fewer
    /// than max live sockets. A retried registration of the same socket is a no-op that the
    /// quota does not refuse.
    pub(super) fn register_socket(
        &mut self,
        rec: &SocketRecord,
        quota: Option<(&str, u64)>,
    ) -> BackendResult<()> {
        let known = self.sockets.contains_key(&rec.id);
        if let Some((tenant_id, max)) = quota.filter(|(_, max)| *max > 0)
            && !known
            && self.count_tenant_sockets(tenant_id, max) >= max
        {
            return Err(quota_full("sockets"));
        }
        if !known {
            if !self.connectors.contains_key(&rec.connector_id) {
                return Err(missing("connector"));
            }
            self.sockets.insert(rec.id.clone(), rec.clone());
        }
        if let Some(c) = self.connectors.get_mut(&rec.connector_id) {
            c.offline_since = None;
        }
        Ok(())
    }

    pub(super) fn unregister_socket(&mut self, socket_id: &str, now: i64) {
        if let Some(gone) = self.sockets.remove(socket_id) {
            self.mark_offline_if_unsocketed(&[gone.connector_id], now);
        }
    }

    /// Starts the offline time of those of `connectors` that have no socket left. An offline
    /// time already running is kept, so it is never pushed into the future.
    fn mark_offline_if_unsocketed(&mut self, connectors: &[String], now: i64) {
        for id in connectors {
            if self.sockets.values().any(|s| &s.connector_id == id) {
                continue;
            }
            if let Some(c) = self.connectors.get_mut(id) {
                c.offline_since.get_or_insert(now);
            }
        }
    }

    /// Removes the sockets `gone` says and starts the offline time where they were the last.
    fn drop_sockets(&mut self, gone: impl Fn(&SocketRecord) -> bool, now: i64) {
        let mut affected: Vec<String> = Vec::new();
        self.sockets.retain(|_, s| {
            if gone(s) {
                affected.push(s.connector_id.clone());
                false
            } else {
                true
            }
        });
        affected.sort();
        affected.dedup();
        self.mark_offline_if_unsocketed(&affected, now);
    }

    pub(super) fn pod_heartbeat(&mut self, pod_id: &str, now: i64) {
        self.pods.insert(pod_id.to_owned(), now);
    }

    pub(super) fn remove_pod(&mut self, pod_id: &str, now: i64) {
        self.drop_sockets(|s| s.pod_id == pod_id, now);
        self.pods.remove(pod_id);
    }

    pub(super) fn reap_dead_pods(&mut self, stale_before: i64, now: i64) -> Vec<String> {
        let dead: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, seen)| **seen < stale_before)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &dead {
            self.pods.remove(id);
        }
        // With the dead pods' rows gone, their sockets are orphans like those of a pod that
        // died before its first heartbeat was written.
        let pods = std::mem::take(&mut self.pods);
        self.drop_sockets(|s| !pods.contains_key(&s.pod_id), now);
        self.pods = pods;
        dead
    }

    pub(super) fn restart_offline_clocks(&mut self, now: i64, stale_before: i64) -> u64 {
        if self.pods.values().any(|seen| *seen >= stale_before) {
            return 0;
        }
        let mut touched = 0;
        for c in self.connectors.values_mut() {
            if c.offline_since.is_some() {
                c.offline_since = Some(now);
                touched += 1;
            }
        }
        touched
    }

    pub(super) fn expired_connectors(&self, offline_before: i64) -> Vec<ConnectorRecord> {
        let mut out: Vec<ConnectorRecord> = self
            .connectors
            .values()
            .filter(|c| c.offline_since.is_some_and(|t| t < offline_before))
            .cloned()
            .collect();
        out.sort_by(|a, b| (a.offline_since, &a.id).cmp(&(b.offline_since, &b.id)));
        out
    }

    /// Deletes the connector and everything it owns if it is still offline since before
    /// `offline_before`; the check and the delete are one step, so a racing hello wins.
    pub(super) fn delete_connector(&mut self, id: &str, offline_before: i64) -> Option<Cascade> {
        let offline = self.connectors.get(id)?.offline_since;
        if offline.is_none_or(|t| t >= offline_before) {
            return None;
        }
        let cascade = self.delete_channels(|c| c.connector_id == id);
        self.sockets.retain(|_, s| s.connector_id != id);
        self.connectors.remove(id);
        Some(cascade)
    }
}
