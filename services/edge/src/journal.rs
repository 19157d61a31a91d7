//! `[journal]`: the delivery journal's bounds and switch, turned into core's
//! [`JournalConfig`]. Core records the steps (`switchyard_core::journal`); the operator API
//! (`GET /admin/v1/messages/...`), `switchyard trace` and the console's timeline read them.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_core::journal::JournalConfig;

use crate::config::Dur;

/// `[journal]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JournalSection {
    /// Record each message's steps.
    pub enabled: bool,
    /// Steps older than this are purged by the janitor.
    pub ttl: Dur,
    /// Most steps kept per tenant, newest first (0 = no cap).
    pub per_tenant: u64,
    /// Steps a pod holds for its writer; when full, new steps are dropped and counted.
    pub queue: usize,
}

impl Default for JournalSection {
    fn default() -> Self {
        let d = JournalConfig::default();
        Self {
            // On: off the delivery path (a bounded queue, dropped when full) and, embedded, in
            // a SQLite file of its own with a message's steps packed in one row; README
            // "Measured" has its cost at saturation.
            enabled: d.enabled,
            ttl: Dur(d.ttl),
            per_tenant: d.per_tenant,
            queue: d.queue,
        }
    }
}

impl JournalSection {
    pub fn core(&self) -> JournalConfig {
        JournalConfig {
            enabled: self.enabled,
            ttl: self.ttl.0.max(Duration::from_secs(1)),
            per_tenant: self.per_tenant,
            queue: self.queue.max(1),
            ..JournalConfig::default()
        }
    }
}
