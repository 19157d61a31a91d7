//! The delivery journal table: steps by insert id, read by message (oldest first) and by
//! channel (newest first), purged by age and per-tenant count as `store-sql` does.

use std::collections::HashMap;

use super::{Tables, page_limit};
use crate::model::JournalRecord;

impl Tables {
    pub(super) fn insert_journal(&mut self, entries: &[JournalRecord]) {
        for e in entries {
            self.last_journal_id += 1;
            let mut e = e.clone();
            e.id = self.last_journal_id;
            self.journal.insert(e.id, e);
        }
    }

    pub(super) fn journal_for_message(&self, message_id: &str, limit: u32) -> Vec<JournalRecord> {
        let mut v: Vec<JournalRecord> = self
            .journal
            .values()
            .filter(|e| e.message_id == message_id)
            .cloned()
            .collect();
        v.sort_by_key(|e| (e.at, e.id));
        v.truncate(page_limit(limit));
        v
    }

    pub(super) fn journal_for_channel(
        &self,
        channel_id: &str,
        before_id: Option<i64>,
        limit: u32,
    ) -> Vec<JournalRecord> {
        self.journal
            .values()
            .rev()
            .filter(|e| e.channel_id == channel_id && before_id.is_none_or(|b| e.id < b))
            .take(page_limit(limit))
            .cloned()
            .collect()
    }

    pub(super) fn expired_pending(&self, now: i64, limit: u32) -> Vec<(String, String, String)> {
        let mut v: Vec<(i64, (String, String, String))> = self
            .outbox
            .values()
            .filter(|m| m.state == crate::model::OutboxState::Pending && m.expires_at <= now)
            .filter_map(|m| {
                let ch = self.channels.get(&m.channel_id)?;
                Some((
                    m.expires_at,
                    (
                        ch.tenant_id.clone(),
                        m.channel_id.clone(),
                        m.message_id.clone(),
                    ),
                ))
            })
            .collect();
        v.sort_by_key(|(at, _)| *at);
        v.into_iter()
            .take(page_limit(limit))
            .map(|(_, ids)| ids)
            .collect()
    }

    pub(super) fn purge_journal(&mut self, before: i64, per_tenant: u64) -> u64 {
        let n = self.journal.len();
        self.journal.retain(|_, e| e.at >= before);
        if per_tenant > 0 {
            // Newest first: each tenant keeps its first `per_tenant` steps.
            let mut seen: HashMap<String, u64> = HashMap::new();
            let mut drop = Vec::new();
            for (id, e) in self.journal.iter().rev() {
                if !self.tenants.contains_key(&e.tenant_id) {
                    continue;
                }
                let c = seen.entry(e.tenant_id.clone()).or_default();
                *c += 1;
                if *c > per_tenant {
                    drop.push(*id);
                }
            }
            for id in drop {
                self.journal.remove(&id);
            }
        }
        (n - self.journal.len()) as u64
    }
}
