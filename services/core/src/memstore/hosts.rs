//! Agent hosts: enrollment tokens, hosts with their connection and liveness, and the agents
//! they declare (`store-sql`'s `host_ops/hosts.rs` and the dialects' certificate step).

use crate::error::{BackendError, BackendResult};
use crate::hoststore::*;

use super::{HostRow, Tables, by_created, duplicate, missing};

impl Tables {
    /// Inserts the host and its token together, or neither.
    pub(super) fn insert_enrollment(
        &mut self,
        h: &HostRecord,
        e: &EnrollmentRecord,
    ) -> BackendResult<()> {
        if self.hosts.contains_key(&h.id) {
            return Err(duplicate("host"));
        }
        if self
            .hosts
            .values()
            .any(|r| r.host.tenant_id == h.tenant_id && r.host.name == h.name)
        {
            return Err(duplicate("host name"));
        }
        if h.cert_fingerprint.is_some()
            && self
                .hosts
                .values()
                .any(|r| r.host.cert_fingerprint == h.cert_fingerprint)
        {
            return Err(duplicate("certificate fingerprint"));
        }
        if !self.tenants.contains_key(&h.tenant_id) {
            return Err(missing("tenant"));
        }
        if self.enrollments.contains_key(&e.token_hash) {
            return Err(duplicate("enrollment token"));
        }
        if e.host_id != h.id && !self.hosts.contains_key(&e.host_id) {
            return Err(missing("host"));
        }
        self.hosts.insert(
            h.id.clone(),
            HostRow {
                host: h.clone(),
                lost_pod_id: None,
                lost_session_id: None,
            },
        );
        self.enrollments.insert(e.token_hash.clone(), e.clone());
        Ok(())
    }

    /// Marks the token used if it is unused and unexpired at `now`.
    pub(super) fn consume_enrollment(
        &mut self,
        token_hash: &str,
        now: i64,
    ) -> Option<EnrollmentRecord> {
        let e = self.enrollments.get_mut(token_hash)?;
        if e.used_at.is_some() || e.expires_at <= now {
            return None;
        }
        e.used_at = Some(now);
        Some(e.clone())
    }

    pub(super) fn get_host(&self, id: &str) -> Option<HostRecord> {
        self.hosts.get(id).map(|r| r.host.clone())
    }

    pub(super) fn find_host_where(&self, pick: impl Fn(&HostRecord) -> bool) -> Option<HostRecord> {
        self.hosts
            .values()
            .find(|r| pick(&r.host))
            .map(|r| r.host.clone())
    }

    pub(super) fn list_hosts(&self, tenant_id: &str) -> Vec<HostRecord> {
        let mut out: Vec<HostRecord> = self
            .hosts
            .values()
            .filter(|r| r.host.tenant_id == tenant_id)
            .map(|r| r.host.clone())
            .collect();
        by_created(&mut out, |h| (h.created_at, &h.id));
        out
    }

    pub(super) fn set_host_certificate(
        &mut self,
        id: &str,
        fingerprint: &str,
        cert_pem: &str,
    ) -> BackendResult<()> {
        match self.hosts.get(id) {
            None => return Err(BackendError::not_found("host")),
            Some(r) if r.host.status == HostStatus::Revoked => {
                return Err(BackendError::conflict("host is revoked"));
            }
            Some(_) => {}
        }
        if self
            .hosts
            .values()
            .any(|r| r.host.id != id && r.host.cert_fingerprint.as_deref() == Some(fingerprint))
        {
            return Err(duplicate("certificate fingerprint"));
        }
        let Some(h) = self.hosts.get_mut(id).map(|r| &mut r.host) else {
            return Err(BackendError::not_found("host"));
        };
        h.cert_fingerprint = Some(fingerprint.to_owned());
        h.cert_pem = Some(cert_pem.to_owned());
        // A host that already has a certificate (a renewal) keeps its status.
        if h.status == HostStatus::Enrolling {
            h.status = HostStatus::Offline;
        }
        Ok(())
    }

    /// A live host row (not revoked), for the steps a revoked host ignores.
    fn live_host(&mut self, id: &str) -> Option<&mut HostRow> {
        self.hosts
            .get_mut(id)
            .filter(|r| r.host.status != HostStatus::Revoked)
    }

    #[allow(clippy::too_many_arguments)] // The `HostStore` method's own arguments.
    pub(super) fn host_connected(
        &mut self,
        id: &str,
        pod_id: &str,
        session_id: &str,
        hostname: &str,
        agent_version: &str,
        adapters: &[String],
        now: i64,
    ) -> bool {
        let Some(row) = self.live_host(id) else {
            return false;
        };
        let h = &mut row.host;
        h.status = HostStatus::Online;
        h.pod_id = Some(pod_id.to_owned());
        h.session_id = Some(session_id.to_owned());
        h.hostname = Some(hostname.to_owned());
        h.agent_version = Some(agent_version.to_owned());
        h.adapters = adapters.to_vec();
        h.connected_at = Some(now);
        h.last_seen_at = Some(now);
        row.lost_pod_id = None;
        row.lost_session_id = None;
        true
    }

    pub(super) fn host_seen(
        &mut self,
        id: &str,
        session_id: &str,
        metrics: Option<&serde_json::Value>,
        now: i64,
    ) {
        let Some(row) = self.live_host(id) else {
            return;
        };
        row.host.last_seen_at = Some(now);
        if let Some(m) = metrics {
            row.host.metrics = m.clone();
        }
        // A host lost while this session was its connection gets that connection back.
        if row.host.status == HostStatus::Lost && row.lost_session_id.as_deref() == Some(session_id)
        {
            row.host.status = HostStatus::Online;
            row.host.pod_id = row.lost_pod_id.take();
            row.host.session_id = row.lost_session_id.take();
        }
    }

    pub(super) fn host_disconnected(&mut self, id: &str, session_id: &str) {
        let Some(row) = self.live_host(id) else {
            return;
        };
        // The live session goes offline; a lost host forgets the session it could resume.
        if row.host.session_id.as_deref() == Some(session_id) {
            row.host.status = HostStatus::Offline;
            row.host.pod_id = None;
            row.host.session_id = None;
        }
        if row.lost_session_id.as_deref() == Some(session_id) {
            row.lost_pod_id = None;
            row.lost_session_id = None;
        }
    }

    pub(super) fn revoke_host(&mut self, id: &str, now: i64) -> BackendResult<HostRecord> {
        let row = self
            .hosts
            .get_mut(id)
            .ok_or_else(|| BackendError::not_found("host"))?;
        let h = &mut row.host;
        h.status = HostStatus::Revoked;
        // Revoking twice keeps the first revocation time.
        h.revoked_at.get_or_insert(now);
        h.pod_id = None;
        h.session_id = None;
        row.lost_pod_id = None;
        row.lost_session_id = None;
        Ok(row.host.clone())
    }

    pub(super) fn set_host_config(&mut self, id: &str, config: &serde_json::Value) {
        if let Some(row) = self.hosts.get_mut(id) {
            row.host.config = config.clone();
        }
    }

    /// Online and offline hosts not seen since `stale_before` (or never seen and created
    /// before it) become lost; their connection is kept aside so a late heartbeat on it can
    /// resume it.
    pub(super) fn mark_hosts_lost(&mut self, stale_before: i64) -> Vec<HostRecord> {
        let mut out = Vec::new();
        for row in self.hosts.values_mut() {
            let h = &row.host;
            let stale = match h.last_seen_at {
                Some(seen) => seen < stale_before,
                None => h.created_at < stale_before,
            };
            if !matches!(h.status, HostStatus::Online | HostStatus::Offline) || !stale {
                continue;
            }
            row.lost_pod_id = row.host.pod_id.take();
            row.lost_session_id = row.host.session_id.take();
            row.host.status = HostStatus::Lost;
            out.push(row.host.clone());
        }
        by_created(&mut out, |h| (h.created_at, &h.id));
        out
    }

    /// Replaces every agent of the host, all or nothing.
    pub(super) fn replace_agents(
        &mut self,
        host_id: &str,
        agents: &[AgentRecord],
    ) -> BackendResult<()> {
        if !agents.is_empty() && !self.hosts.contains_key(host_id) {
            return Err(missing("host"));
        }
        let mut ids = std::collections::HashSet::new();
        if !agents.iter().all(|a| ids.insert(a.agent_id.as_str())) {
            return Err(duplicate("agent"));
        }
        self.agents.retain(|(h, _), _| h != host_id);
        for a in agents {
            self.agents.insert(
                (host_id.to_owned(), a.agent_id.clone()),
                AgentRecord {
                    host_id: host_id.to_owned(),
                    ..a.clone()
                },
            );
        }
        Ok(())
    }

    pub(super) fn list_agents(&self, host_id: &str) -> Vec<AgentRecord> {
        // Keys are (host, agent): one host's agents come in agent id order.
        self.agents
            .values()
            .filter(|a| a.host_id == host_id)
            .cloned()
            .collect()
    }

    /// The agent of a tenant declared most recently, on whichever host.
    pub(super) fn find_agent(&self, tenant_id: &str, agent_id: &str) -> Option<AgentRecord> {
        self.agents
            .values()
            .filter(|a| a.tenant_id == tenant_id && a.agent_id == agent_id)
            .min_by(|a, b| {
                b.updated_at
                    .cmp(&a.updated_at)
                    .then_with(|| a.host_id.cmp(&b.host_id))
            })
            .cloned()
    }
}
