//! An in-memory [`Store`](crate::store::Store) and [`HostStore`](crate::hoststore::HostStore)
//! for tests and development: every table is a map in one process, behind one lock, so each
//! method is one atomic step exactly as a SQL transaction is (quota checks and their inserts,
//! lease takeovers, claims and enqueues cannot interleave).
//!
//! It keeps the rules the SQL stores keep (`store-sql`'s shared statements and the dialects'
//! own): the same orderings, dedupe windows, caps, fencing generations, cascades and the
//! referential checks (a row whose parent is missing is `NotFound`, a duplicate key
//! `Conflict`), and it passes the same conformance suites (`store_conformance_tests!`).
//!
//! It is not bounded and not durable: nothing is ever spilled or evicted, reads scan whole
//! tables, and everything is lost with the process. Use it where a test or a single
//! development process needs a store without a database, never for a deployment.

mod channels;
mod connectors;
mod console;
mod files;
mod host_impl;
mod hosts;
mod journal;
mod outbox;
mod runs;
mod store_impl;
mod tenants;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use crate::error::{BackendError, BackendResult};
use crate::hoststore::{
    AgentRecord, ApprovalRecord, ArtifactRecord, EnrollmentRecord, HostRecord, RunEventRecord,
    RunRecord,
};
use crate::model::*;

/// The in-memory store. `new` gives an empty store at schema version 0, as a fresh database
/// is; `migrate` only records the current version (there is no schema to build), and every
/// method works before it.
#[derive(Default)]
pub struct MemoryStore {
    tables: Mutex<Tables>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// How many times `pending_outbox` was answered: the reads the delivery path made.
    pub fn pending_reads(&self) -> u64 {
        self.with(|t| Ok(t.pending_reads)).unwrap_or_default()
    }

    /// How many channel ids `route_states` was asked about: what the route sweeps looked up.
    pub fn route_lookups(&self) -> u64 {
        self.with(|t| Ok(t.route_lookups)).unwrap_or_default()
    }

    /// Every channel's queue counts as full (`true`) or as it is (`false`): a new message
    /// is refused `Full` while a repeated one is still a duplicate, as when the cap is
    /// reached. Tests use it to fill every queue at once.
    pub fn set_queues_full(&self, full: bool) {
        let _ = self.with(|t| {
            t.queues_full = full;
            Ok(())
        });
    }

    /// Every outbox row still kept (pending, acked awaiting the purge, failed), in the
    /// order they were stored.
    pub fn outbox_rows(&self) -> Vec<OutboxRecord> {
        self.with(|t| Ok(t.outbox.values().cloned().collect()))
            .unwrap_or_default()
    }

    /// The id of every auth session kept.
    pub fn auth_session_ids(&self) -> Vec<String> {
        self.with(|t| Ok(t.auth_sessions.keys().cloned().collect()))
            .unwrap_or_default()
    }

    /// The keys of a kv namespace, sorted.
    pub fn kv_keys(&self, namespace: &str) -> Vec<String> {
        let mut keys: Vec<String> = self
            .with(|t| {
                Ok(t.kv
                    .keys()
                    .filter(|(ns, _)| ns == namespace)
                    .map(|(_, k)| k.clone())
                    .collect())
            })
            .unwrap_or_default();
        keys.sort();
        keys
    }

    /// The file_ref of every stored file.
    pub fn file_refs(&self) -> Vec<String> {
        self.with(|t| Ok(t.files.keys().cloned().collect()))
            .unwrap_or_default()
    }

    /// Runs `f` on the tables under the lock: one call, one atomic step. A std mutex, since
    /// no step awaits while it holds the lock.
    fn with<T>(&self, f: impl FnOnce(&mut Tables) -> BackendResult<T>) -> BackendResult<T> {
        let mut tables = self
            .tables
            .lock()
            .map_err(|_| BackendError::internal("memory store lock poisoned"))?;
        f(&mut tables)
    }
}

/// An API key row: the record and when it was last used (the console's column).
#[derive(Debug, Clone)]
struct KeyRow {
    key: ApiKeyRecord,
    last_used_at: Option<i64>,
}

/// A host row: the record and the connection `mark_hosts_lost` set aside, which a late
/// heartbeat on it resumes (the SQL stores' `lost_pod_id` / `lost_session_id`).
#[derive(Debug, Clone)]
struct HostRow {
    host: HostRecord,
    lost_pod_id: Option<String>,
    lost_session_id: Option<String>,
}

/// Every table, keyed like the SQL schema's primary keys; `BTreeMap` where a sweep or a page
/// walks the key order.
#[derive(Debug, Default)]
struct Tables {
    schema_version: i64,
    tenants: BTreeMap<String, Tenant>,
    api_keys: BTreeMap<String, KeyRow>,
    quotas: BTreeMap<String, TenantQuota>,
    connectors: BTreeMap<String, ConnectorRecord>,
    /// Pod id -> last heartbeat.
    pods: BTreeMap<String, i64>,
    sockets: BTreeMap<String, SocketRecord>,
    channels: BTreeMap<String, ChannelRecord>,
    auth_sessions: BTreeMap<String, AuthSessionRecord>,
    /// By seq, which is commit order.
    outbox: BTreeMap<i64, OutboxRecord>,
    /// `(channel, message_id)` -> seq: the outbox's unique index.
    outbox_ids: HashMap<(String, String), i64>,
    /// The last seq handed out; never reused, like SQLite's AUTOINCREMENT.
    last_seq: i64,
    /// Channel -> acked position (`outbox_cursors`): its pending rows at or below it are
    /// delivered and wait for `purge_acked_outbox`.
    acked: HashMap<String, i64>,
    /// `(channel, message_id)` -> until when a repeat is a duplicate.
    seen: HashMap<(String, String), i64>,
    /// `(scope, channel, key)` -> claim.
    claims: HashMap<(String, String, String), IdempotencyRecord>,
    files: BTreeMap<String, FileRecord>,
    leases: HashMap<String, Lease>,
    kv: HashMap<(String, String), String>,
    hosts: BTreeMap<String, HostRow>,
    enrollments: HashMap<String, EnrollmentRecord>,
    /// `(host, agent)` -> agent.
    agents: BTreeMap<(String, String), AgentRecord>,
    runs: BTreeMap<String, RunRecord>,
    /// `(run, seq)` -> event.
    run_events: BTreeMap<(String, i64), RunEventRecord>,
    artifacts: BTreeMap<String, ArtifactRecord>,
    approvals: BTreeMap<String, ApprovalRecord>,
    /// Journal steps by id (insert order).
    journal: BTreeMap<i64, JournalRecord>,
    last_journal_id: i64,
    /// `pending_outbox` calls answered (tests count the delivery path's store reads).
    pending_reads: u64,
    /// Channel ids `route_states` was asked about (tests bound the route sweep's lookups).
    route_lookups: u64,
    /// Set by [`MemoryStore::set_queues_full`]: every channel's queue is at its cap.
    queues_full: bool,
}

/// The error a unique key gives in the SQL stores.
fn duplicate(what: &str) -> BackendError {
    BackendError::conflict(format!("{what} exists"))
}

/// The error a missing parent row (a foreign key) gives in the SQL stores.
fn missing(what: &str) -> BackendError {
    BackendError::not_found(what.to_owned())
}

/// At most `at_most` of `n` (the SQL stores' `LIMIT` on a count).
fn capped(n: usize, at_most: u64) -> u64 {
    (n as u64).min(at_most)
}

/// A page size as the console's queries clamp it.
fn page_limit(limit: u32) -> usize {
    limit.clamp(1, 1000) as usize
}

/// Sorts by creation time then id, the SQL stores' usual `ORDER BY created_at, id`.
fn by_created<T>(v: &mut [T], key: impl Fn(&T) -> (i64, &str)) {
    v.sort_by(|a, b| key(a).cmp(&key(b)));
}
