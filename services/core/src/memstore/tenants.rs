//! Tenants, their API keys and quota overrides, and the usage counts the quotas check
//! (`store-sql`'s `ops/tenants.rs`).

use crate::error::{BackendError, BackendResult, ErrorKind};
use crate::model::*;

use super::{KeyRow, Tables, by_created, capped, duplicate, missing};

/// The refusal of an insert that would pass a tenant quota.
pub(super) fn quota_full(quota: &str) -> BackendError {
    BackendError::new(
        ErrorKind::LimitExceeded,
        format!("tenant quota {quota} reached"),
    )
}

impl Tables {
    pub(super) fn create_tenant(&mut self, t: &Tenant) -> BackendResult<()> {
        if self.tenants.contains_key(&t.id) {
            return Err(duplicate("tenant"));
        }
        // Names are unique so that find_tenant(name) is unambiguous.
        if self.tenants.values().any(|x| x.name == t.name) {
            return Err(duplicate("tenant name"));
        }
        self.tenants.insert(t.id.clone(), t.clone());
        Ok(())
    }

    pub(super) fn list_tenants(&self) -> Vec<Tenant> {
        let mut out: Vec<Tenant> = self.tenants.values().cloned().collect();
        by_created(&mut out, |t| (t.created_at, &t.id));
        out
    }

    pub(super) fn find_tenant(&self, id_or_name: &str) -> Option<Tenant> {
        // An id match wins over a name match, should one tenant be named like another's id.
        self.tenants
            .get(id_or_name)
            .or_else(|| self.tenants.values().find(|t| t.name == id_or_name))
            .cloned()
    }

    pub(super) fn insert_api_key(&mut self, k: &ApiKeyRecord) -> BackendResult<()> {
        if self.api_keys.contains_key(&k.id) {
            return Err(duplicate("api key"));
        }
        if !self.tenants.contains_key(&k.tenant_id) {
            return Err(missing("tenant"));
        }
        self.api_keys.insert(
            k.id.clone(),
            KeyRow {
                key: k.clone(),
                last_used_at: None,
            },
        );
        Ok(())
    }

    pub(super) fn list_api_keys(&self, tenant_id: &str) -> Vec<ApiKeyRecord> {
        let mut out: Vec<ApiKeyRecord> = self
            .api_keys
            .values()
            .filter(|r| r.key.tenant_id == tenant_id)
            .map(|r| r.key.clone())
            .collect();
        by_created(&mut out, |k| (k.created_at, &k.id));
        out
    }

    pub(super) fn revoke_api_key(&mut self, id: &str, at: i64) -> BackendResult<()> {
        let row = self
            .api_keys
            .get_mut(id)
            .ok_or_else(|| missing("api key"))?;
        // Revoking twice keeps the first revocation time.
        row.key.revoked_at.get_or_insert(at);
        Ok(())
    }

    pub(super) fn touch_api_key(&mut self, id: &str, now: i64) {
        // At most one write a minute per key, as the SQL stores keep authentication a read.
        if let Some(row) = self.api_keys.get_mut(id)
            && row.last_used_at.is_none_or(|t| t < now - 60_000)
        {
            row.last_used_at = Some(now);
        }
    }

    pub(super) fn tenant_keys(&self, tenant_id: &str) -> Vec<ApiKeyInfo> {
        let mut rows: Vec<&KeyRow> = self
            .api_keys
            .values()
            .filter(|r| r.key.tenant_id == tenant_id)
            .collect();
        by_created(&mut rows, |r| (r.key.created_at, &r.key.id));
        rows.into_iter()
            .map(|r| ApiKeyInfo {
                id: r.key.id.clone(),
                tenant_id: r.key.tenant_id.clone(),
                created_at: r.key.created_at,
                revoked_at: r.key.revoked_at,
                last_used_at: r.last_used_at,
            })
            .collect()
    }

    pub(super) fn set_tenant_quota(&mut self, q: &TenantQuota) -> BackendResult<()> {
        if !self.tenants.contains_key(&q.tenant_id) {
            return Err(missing("tenant"));
        }
        // The SQL columns are BIGINT: a limit past i64::MAX is stored as i64::MAX.
        let stored = |v: Option<u64>| v.map(|n| n.min(i64::MAX as u64));
        let q = TenantQuota {
            sockets: stored(q.sockets),
            channels: stored(q.channels),
            stored_bytes: stored(q.stored_bytes),
            requests_per_second: stored(q.requests_per_second),
            ..q.clone()
        };
        self.quotas.insert(q.tenant_id.clone(), q);
        Ok(())
    }

    pub(super) fn tenant_quotas(&self) -> Vec<TenantQuota> {
        self.quotas.values().cloned().collect()
    }

    pub(super) fn count_tenant_sockets(&self, tenant_id: &str, at_most: u64) -> u64 {
        let n = self
            .sockets
            .values()
            .filter(|s| {
                self.connectors
                    .get(&s.connector_id)
                    .is_some_and(|c| c.tenant_id == tenant_id)
            })
            .count();
        capped(n, at_most)
    }

    pub(super) fn count_tenant_channels(&self, tenant_id: &str, at_most: u64) -> u64 {
        let n = self
            .channels
            .values()
            .filter(|c| c.tenant_id == tenant_id)
            .count();
        capped(n, at_most)
    }

    /// A tenant's files and host artifacts (an artifact counts its declared size from the
    /// moment its upload URL is handed out).
    pub(super) fn tenant_stored_bytes(&self, tenant_id: &str) -> u64 {
        let files: i128 = self
            .files
            .values()
            .filter(|f| f.tenant_id == tenant_id)
            .map(|f| i128::from(f.byte_size))
            .sum();
        let artifacts: i128 = self
            .artifacts
            .values()
            .filter(|a| a.tenant_id == tenant_id)
            .map(|a| i128::from(a.size_bytes))
            .sum();
        u64::try_from((files + artifacts).max(0)).unwrap_or(u64::MAX)
    }

    /// Refuses `adding` bytes when the tenant's stored bytes would pass `max` (0 = no limit).
    pub(super) fn check_stored_bytes(
        &self,
        tenant_id: &str,
        adding: u64,
        max: u64,
    ) -> BackendResult<()> {
        if max > 0 && self.tenant_stored_bytes(tenant_id).saturating_add(adding) > max {
            return Err(quota_full("stored_bytes"));
        }
        Ok(())
    }

    pub(super) fn insert_channel_within(
        &mut self,
        c: &ChannelRecord,
        max: u64,
    ) -> BackendResult<()> {
        if max > 0 && self.count_tenant_channels(&c.tenant_id, max) >= max {
            return Err(quota_full("channels"));
        }
        self.insert_channel(c)
    }

    pub(super) fn insert_file_within(&mut self, f: &FileRecord, max: u64) -> BackendResult<()> {
        self.check_stored_bytes(&f.tenant_id, f.byte_size, max)?;
        self.insert_file(f)
    }
}
