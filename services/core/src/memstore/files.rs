//! File rows, leases with their fencing generations and the providers' key/value rows
//! (`store-sql`'s `ops/files.rs` and the dialects' lease upsert).

use crate::error::{BackendError, BackendResult};
use crate::model::*;

use super::{Tables, duplicate, missing};

impl Tables {
    pub(super) fn insert_file(&mut self, f: &FileRecord) -> BackendResult<()> {
        if i64::try_from(f.byte_size).is_err() {
            return Err(BackendError::internal("file size out of range"));
        }
        if self.files.contains_key(&f.file_ref) {
            return Err(duplicate("file"));
        }
        if !self.channels.contains_key(&f.channel_id) {
            return Err(missing("channel"));
        }
        self.files.insert(f.file_ref.clone(), f.clone());
        Ok(())
    }

    pub(super) fn expired_files(&self, now: i64, limit: u32) -> Vec<FileRecord> {
        let mut out: Vec<&FileRecord> = self
            .files
            .values()
            .filter(|f| f.expires_at <= now)
            .collect();
        out.sort_by(|a, b| (a.expires_at, &a.file_ref).cmp(&(b.expires_at, &b.file_ref)));
        out.into_iter().take(limit as usize).cloned().collect()
    }

    /// Takes or renews `name` for `holder` until `now + ttl_ms`: free, expired (at
    /// `expires_at`) or already `holder`'s. The generation grows whenever the holder changes.
    pub(super) fn acquire_lease(
        &mut self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
        now: i64,
    ) -> Option<Lease> {
        let expires_at = now.saturating_add(ttl_ms);
        let lease = match self.leases.get(name) {
            None => Lease {
                name: name.to_owned(),
                holder: holder.to_owned(),
                generation: 1,
                expires_at,
            },
            Some(l) if l.holder == holder => Lease {
                expires_at,
                ..l.clone()
            },
            Some(l) if l.expires_at <= now => Lease {
                holder: holder.to_owned(),
                generation: l.generation + 1,
                expires_at,
                ..l.clone()
            },
            Some(_) => return None,
        };
        self.leases.insert(name.to_owned(), lease.clone());
        Some(lease)
    }

    pub(super) fn release_lease(&mut self, name: &str, holder: &str) {
        // The row stays so the next holder still gets a higher generation (fencing).
        if let Some(l) = self.leases.get_mut(name)
            && l.holder == holder
        {
            l.expires_at = 0;
        }
    }

    pub(super) fn kv_get(&self, namespace: &str, key: &str) -> Option<String> {
        self.kv
            .get(&(namespace.to_owned(), key.to_owned()))
            .cloned()
    }

    pub(super) fn kv_put(&mut self, namespace: &str, key: &str, value: &str) {
        self.kv
            .insert((namespace.to_owned(), key.to_owned()), value.to_owned());
    }
}
