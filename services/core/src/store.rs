//! The durable store: Postgres in a cluster, SQLite on one node. Every method is a single
//! atomic fact change; callers never hold transactions across calls.

use async_trait::async_trait;

use crate::error::BackendResult;
use crate::model::*;

/// Schema version this build understands; `serve` refuses any other.
pub const SCHEMA_VERSION: i64 = 10;

/// The answer of [`Store::reopen_channels`]: each of `found` (as read before the move) with
/// its state among `states` (those of the moved channels).
pub fn reopened(found: Vec<ChannelRecord>, states: Vec<RouteState>) -> Vec<Reopened> {
    let mut states: std::collections::HashMap<String, Option<i64>> = states
        .into_iter()
        .map(|s| (s.channel_id, s.max_pending_seq))
        .collect();
    found
        .into_iter()
        .map(|channel| {
            let state = states.remove(&channel.id);
            Reopened {
                moved: state.is_some(),
                max_pending_seq: state.flatten(),
                channel,
            }
        })
        .collect()
}

#[async_trait]
pub trait Store: crate::hoststore::HostStore + Send + Sync + 'static {
    // -- schema --
    /// Applies pending migrations.
    async fn migrate(&self) -> BackendResult<()>;
    /// The applied schema version (0 when none).
    async fn schema_version(&self) -> BackendResult<i64>;
    /// Cheap liveness query for readiness.
    async fn ping(&self) -> BackendResult<()>;

    // -- tenants and keys --
    async fn create_tenant(&self, tenant: &Tenant) -> BackendResult<()>;
    async fn list_tenants(&self) -> BackendResult<Vec<Tenant>>;
    async fn get_tenant(&self, id: &str) -> BackendResult<Option<Tenant>>;
    /// Finds a tenant by id or by name.
    async fn find_tenant(&self, id_or_name: &str) -> BackendResult<Option<Tenant>>;
    async fn insert_api_key(&self, key: &ApiKeyRecord) -> BackendResult<()>;
    async fn get_api_key(&self, id: &str) -> BackendResult<Option<ApiKeyRecord>>;
    async fn list_api_keys(&self, tenant_id: &str) -> BackendResult<Vec<ApiKeyRecord>>;
    /// NotFound when the key does not exist.
    async fn revoke_api_key(&self, id: &str, at: i64) -> BackendResult<()>;

    // -- tenant quotas --
    /// Stores a tenant's quota overrides (replacing earlier ones).
    async fn set_tenant_quota(&self, quota: &TenantQuota) -> BackendResult<()>;
    /// Every tenant's overrides (pods keep them in memory and refresh them periodically).
    async fn tenant_quotas(&self) -> BackendResult<Vec<TenantQuota>>;
    /// Live sockets of a tenant's connectors, counting at most `at_most`.
    async fn count_tenant_sockets(&self, tenant_id: &str, at_most: u64) -> BackendResult<u64>;
    /// Channels of a tenant, counting at most `at_most`.
    async fn count_tenant_channels(&self, tenant_id: &str, at_most: u64) -> BackendResult<u64>;
    /// Bytes of a tenant's files not yet expired or removed.
    async fn tenant_stored_bytes(&self, tenant_id: &str) -> BackendResult<u64>;

    // -- connector_ids, sockets, pods --
    async fn get_connector(&self, id: &str) -> BackendResult<Option<ConnectorRecord>>;
    /// The live connector_id of a tenant for a Card, if any.
    async fn connector_for(
        &self,
        tenant_id: &str,
        card_id: &str,
    ) -> BackendResult<Option<ConnectorRecord>>;
    /// Conflict when the tenant already has one for this Card.
    async fn insert_connector(&self, rec: &ConnectorRecord) -> BackendResult<()>;
    /// Records a socket that completed hello and clears the connector's offline time.
    async fn register_socket(&self, rec: &SocketRecord) -> BackendResult<()>;
    /// [`Store::register_socket`] while the tenant has fewer than `max` live sockets (0 = no
    /// limit): the count and the insert are one step, so concurrent hellos cannot pass the
    /// quota. `LimitExceeded` when it is reached.
    async fn register_socket_within(
        &self,
        rec: &SocketRecord,
        tenant_id: &str,
        max: u64,
    ) -> BackendResult<()>;
    /// Removes a socket; when it was the connector's last, its offline time starts at `now`.
    async fn unregister_socket(&self, socket_id: &str, now: i64) -> BackendResult<()>;
    async fn pod_heartbeat(&self, pod_id: &str, now: i64) -> BackendResult<()>;
    /// Removes the pod row and its sockets (drain); starts offline time where it was the last.
    async fn remove_pod(&self, pod_id: &str, now: i64) -> BackendResult<()>;
    /// Removes pods not seen since `stale_before` with their sockets; returns their ids.
    async fn reap_dead_pods(&self, stale_before: i64, now: i64) -> BackendResult<Vec<String>>;
    /// Start-up rule (L-08): when no pod has heartbeated since `stale_before`, the whole
    /// deployment was down and nobody could reconnect, so every offline connector's offline
    /// time restarts at `now`. Returns how many connectors were touched (0 when a pod is live).
    async fn restart_offline_clocks(&self, now: i64, stale_before: i64) -> BackendResult<u64>;
    /// Connectors offline since before `offline_before`.
    async fn expired_connectors(&self, offline_before: i64) -> BackendResult<Vec<ConnectorRecord>>;
    /// Deletes a connector_id and everything it owns, but only if it is still offline since
    /// before `offline_before` (checked atomically, so a reconnect racing the janitor wins).
    /// Returns the channels and files removed so the caller can release provider state and
    /// file bytes; None when nothing was deleted.
    async fn delete_connector(
        &self,
        id: &str,
        offline_before: i64,
    ) -> BackendResult<Option<Cascade>>;

    // -- channels --
    async fn insert_channel(&self, rec: &ChannelRecord) -> BackendResult<()>;
    /// Inserts the channel while its tenant has fewer than `max` (0 = no limit), counted and
    /// inserted in one step. `LimitExceeded` when the quota is reached.
    async fn insert_channel_within(&self, rec: &ChannelRecord, max: u64) -> BackendResult<()>;
    async fn get_channel(&self, id: &str) -> BackendResult<Option<ChannelRecord>>;
    async fn list_channels(&self, connector_id: &str) -> BackendResult<Vec<ChannelRecord>>;
    /// Sets the route socket (None = closed) and the enabled profiles.
    async fn set_channel_route(
        &self,
        id: &str,
        socket: Option<&str>,
        profiles: &[String],
        now: i64,
    ) -> BackendResult<()>;
    /// The existing channels of `ids`, in any order: one read for a batch of reopens.
    async fn get_channels(&self, ids: &[String]) -> BackendResult<Vec<ChannelRecord>> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.extend(self.get_channel(id).await?);
        }
        Ok(out)
    }
    /// [`Store::set_channel_route`] for many channels at once, to the same socket and
    /// profiles: one write for a batch of reopens. Answers the routed channels' states as
    /// [`Store::route_states`] at `now` would right after (read by the same statement where
    /// the store can).
    async fn set_channel_routes(
        &self,
        ids: &[String],
        socket: &str,
        profiles: &[String],
        now: i64,
    ) -> BackendResult<Vec<RouteState>> {
        for id in ids {
            self.set_channel_route(id, Some(socket), profiles, now)
                .await?;
        }
        self.route_states(ids, now).await
    }
    /// A reconnecting socket's batch of reopens: the existing channels of `ids` as they were
    /// (any order), and those of `owner` routed to `socket` with `profiles` as by
    /// [`Store::set_channel_routes`]. One statement where the store can; by default
    /// [`Store::get_channels`], then [`Store::set_channel_routes`] for the owned ones.
    async fn reopen_channels(
        &self,
        ids: &[String],
        owner: &ChannelOwner<'_>,
        socket: &str,
        profiles: &[String],
        now: i64,
    ) -> BackendResult<Vec<Reopened>> {
        let found = self.get_channels(ids).await?;
        let mine = owner.owned_ids(&found);
        let states = if mine.is_empty() {
            Vec::new()
        } else {
            self.set_channel_routes(&mine, socket, profiles, now)
                .await?
        };
        Ok(reopened(found, states))
    }
    /// Clears the route only if it still points at `socket`.
    async fn clear_channel_route_if(&self, id: &str, socket: &str, now: i64) -> BackendResult<()>;
    /// [`Store::clear_channel_route_if`] for many channels: one write for the routes of a
    /// closing socket (ids the store does not have are skipped).
    async fn clear_channel_routes_if(
        &self,
        ids: &[String],
        socket: &str,
        now: i64,
    ) -> BackendResult<()> {
        for id in ids {
            self.clear_channel_route_if(id, socket, now).await?;
        }
        Ok(())
    }
    /// Replaces binding, status and view in one step.
    async fn set_channel_binding(
        &self,
        id: &str,
        binding: Option<&[u8]>,
        binding_key: Option<&str>,
        status: switchyard_protocol::ConnectionStatus,
        view: &serde_json::Value,
        now: i64,
    ) -> BackendResult<()>;
    /// Changes status and view, keeping the binding.
    async fn set_channel_status(
        &self,
        id: &str,
        status: switchyard_protocol::ConnectionStatus,
        view: &serde_json::Value,
        now: i64,
    ) -> BackendResult<()>;
    /// A bound channel of the tenant and Card with this binding key (duplicate binding check).
    async fn find_channel_by_binding_key(
        &self,
        tenant_id: &str,
        card_id: &str,
        key: &str,
    ) -> BackendResult<Option<ChannelRecord>>;
    /// Every bound channel of a Card across tenants (shared consumers such as pollers start
    /// from it).
    async fn bound_channels(&self, card_id: &str) -> BackendResult<Vec<ChannelRecord>>;
    /// Unbound, unrouted channels last updated before `before` (never-authenticated garbage).
    async fn stale_unbound_channels(&self, before: i64) -> BackendResult<Vec<ChannelRecord>>;
    /// Deletes a channel with its auth sessions, outbox, idempotency records and file rows;
    /// returns the files removed.
    async fn delete_channel(&self, id: &str) -> BackendResult<Vec<FileRecord>>;

    // -- auth sessions --
    async fn insert_auth_session(&self, rec: &AuthSessionRecord) -> BackendResult<()>;
    async fn get_auth_session(&self, id: &str) -> BackendResult<Option<AuthSessionRecord>>;
    async fn update_auth_session(&self, rec: &AuthSessionRecord) -> BackendResult<()>;
    /// [`Store::update_auth_session`] only while the stored session is unfinished (pending,
    /// scanned, QR refresh required): false, and nothing written, when it had ended (on any
    /// pod) since it was read.
    async fn update_open_auth_session(&self, rec: &AuthSessionRecord) -> BackendResult<bool>;
    /// Unfinished sessions of a channel.
    async fn open_auth_sessions(&self, channel_id: &str) -> BackendResult<Vec<AuthSessionRecord>>;
    /// Deletes sessions that expired before `now - keep_ms`; returns how many.
    async fn purge_auth_sessions(&self, before: i64) -> BackendResult<u64>;

    // -- outbox (Connector -> xAgent pending deliveries) --
    /// Stores a message unless `(channel, message_id)` was seen within the dedupe window or
    /// the channel holds `cap` pending messages. `dedupe_until` bounds the seen-record.
    async fn enqueue_outbox(
        &self,
        rec: &OutboxRecord,
        cap: u32,
        dedupe_until: i64,
    ) -> BackendResult<EnqueueOutcome>;
    /// Pending, unexpired messages of a channel with `seq > after`, oldest first.
    async fn pending_outbox(
        &self,
        channel_id: &str,
        after_seq: i64,
        now: i64,
        limit: u32,
    ) -> BackendResult<Vec<OutboxRecord>>;
    /// Group commit: every item with the rules of `enqueue_outbox`, all in one transaction,
    /// outcomes in input order. A missing channel is `UnknownChannel` for its items only; a
    /// repeated `(channel, message_id)` within the batch is a `Duplicate` of the first.
    async fn enqueue_outbox_batch(&self, items: &[Enqueue]) -> BackendResult<Vec<EnqueueOutcome>>;
    async fn count_pending(&self, channel_id: &str) -> BackendResult<u64>;
    /// The deployment's backlog for the operations gauges: pending, unexpired messages
    /// (counted up to `cap`, so the query's work is bounded) and the `created_at` of the
    /// oldest one.
    async fn outbox_backlog(&self, now: i64, cap: u64) -> BackendResult<(u64, Option<i64>)>;
    /// Connections the store's pool holds open and how many of them are idle, when it
    /// has a pool.
    fn pool_stats(&self) -> Option<(u32, u32)> {
        None
    }
    async fn record_attempt(
        &self,
        channel_id: &str,
        message_id: &str,
        error: Option<&str>,
    ) -> BackendResult<()>;
    /// Terminal success: the message leaves the outbox.
    async fn ack_outbox(&self, channel_id: &str, message_id: &str) -> BackendResult<bool>;
    /// Terminal success of many `(channel, message_id)` at once; returns how many left.
    async fn ack_outbox_batch(&self, done: &[(String, String)]) -> BackendResult<u64>;
    /// Acks as a cursor: moves each channel's acked position up to its seq, never back, in
    /// one statement. Every pending message of the channel at or below the position is
    /// delivered from then on: pending reads, counts and the backlog skip it, and
    /// [`Store::purge_acked_outbox`] removes it. Channels that do not exist are skipped.
    async fn advance_outbox(&self, cursors: &[(String, i64)]) -> BackendResult<()>;
    /// Removes, in bulk, the pending messages their channel's acked position covers (the
    /// janitor, off the delivery path); returns how many.
    async fn purge_acked_outbox(&self) -> BackendResult<u64>;
    /// For each existing channel of `ids` (any order): its route socket and its highest
    /// pending, unexpired seq. The delivery sweep's one query per socket.
    async fn route_states(&self, ids: &[String], now: i64) -> BackendResult<Vec<RouteState>>;
    /// Terminal failure: kept as failed with its reason until purged.
    async fn fail_outbox(
        &self,
        channel_id: &str,
        message_id: &str,
        reason: &str,
    ) -> BackendResult<bool>;
    /// Removes expired pending and old failed messages and dedupe records; returns how many messages.
    async fn purge_outbox(&self, now: i64) -> BackendResult<u64>;

    // -- idempotency (receiver side) --
    async fn claim(&self, rec: &IdempotencyRecord) -> BackendResult<Claim>;
    async fn finish_claim(
        &self,
        scope: &str,
        channel_id: &str,
        key: &str,
        outcome: &serde_json::Value,
    ) -> BackendResult<()>;
    /// Drops an unfinished claim so a retry can run (after a retryable failure).
    async fn release_claim(&self, scope: &str, channel_id: &str, key: &str) -> BackendResult<()>;
    async fn purge_claims(&self, now: i64) -> BackendResult<u64>;

    // -- files --
    async fn insert_file(&self, rec: &FileRecord) -> BackendResult<()>;
    /// Records the file unless its tenant's stored bytes (files and artifacts) would pass
    /// `max_bytes` with it (0 = no limit), summed and inserted in one step. `LimitExceeded`
    /// when it would.
    async fn insert_file_within(&self, rec: &FileRecord, max_bytes: u64) -> BackendResult<()>;
    async fn get_file(&self, file_ref: &str) -> BackendResult<Option<FileRecord>>;
    async fn delete_file(&self, file_ref: &str) -> BackendResult<()>;
    async fn expired_files(&self, now: i64, limit: u32) -> BackendResult<Vec<FileRecord>>;

    // -- leases --
    /// Acquires or renews `name` for `holder` until `now + ttl_ms`. Returns the lease when held
    /// by `holder` afterwards; the generation increases whenever the holder changes.
    async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
        now: i64,
    ) -> BackendResult<Option<Lease>>;
    async fn release_lease(&self, name: &str, holder: &str) -> BackendResult<()>;
    async fn get_lease(&self, name: &str) -> BackendResult<Option<Lease>>;

    // -- provider key/value (cursors, small state) --
    async fn kv_get(&self, namespace: &str, key: &str) -> BackendResult<Option<String>>;
    async fn kv_put(&self, namespace: &str, key: &str, value: &str) -> BackendResult<()>;

    // -- operator console: keyset pages, each one indexed query whatever the table size --
    /// Tenants with `id > after` in id order.
    async fn page_tenants(&self, after: Option<&str>, limit: u32) -> BackendResult<Vec<Tenant>>;
    /// A tenant's keys (oldest first) with when each was last used; no hashes.
    async fn tenant_keys(&self, tenant_id: &str) -> BackendResult<Vec<ApiKeyInfo>>;
    /// Records a successful authentication with the key.
    async fn touch_api_key(&self, id: &str, now: i64) -> BackendResult<()>;
    /// Connector_ids with `id > after` in id order.
    async fn page_connectors(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> BackendResult<Vec<ConnectorRecord>>;
    /// Channels with `id > after` in id order (only bound ones when `bound_only`), each with
    /// its outbox depth.
    async fn page_channels(
        &self,
        after: Option<&str>,
        bound_only: bool,
        limit: u32,
    ) -> BackendResult<Vec<ChannelSummary>>;
    /// Outbox messages with a failure reason and `seq < before`, newest first.
    async fn page_failures(
        &self,
        before_seq: Option<i64>,
        limit: u32,
    ) -> BackendResult<Vec<DeliveryFailure>>;
    /// Hosts of every tenant with `id > after` in id order.
    async fn page_hosts(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> BackendResult<Vec<crate::hoststore::HostRecord>>;
    /// Runs of every tenant with `(created_at, id) < before`, newest first.
    async fn page_runs(
        &self,
        before: Option<(i64, &str)>,
        limit: u32,
    ) -> BackendResult<Vec<crate::hoststore::RunRecord>>;
    /// Approvals of every tenant in `status` with `(created_at, id) > after`, oldest first.
    async fn page_approvals(
        &self,
        status: crate::hoststore::ApprovalStatus,
        after: Option<(i64, &str)>,
        limit: u32,
    ) -> BackendResult<Vec<crate::hoststore::ApprovalRecord>>;
    /// [`Store::page_channels`] narrowed by the console's search, in the same order and
    /// with the same cursor. The SQL stores answer with one indexed query; this default
    /// (for stores without one) reads unfiltered pages until `limit` rows match.
    async fn search_channels(
        &self,
        filter: &ConsoleFilter,
        after: Option<&str>,
        bound_only: bool,
        limit: u32,
    ) -> BackendResult<Vec<ChannelSummary>> {
        let mut out = Vec::new();
        let mut cursor = after.map(str::to_owned);
        loop {
            let page = self
                .page_channels(cursor.as_deref(), bound_only, limit)
                .await?;
            let done = page.len() < limit as usize;
            cursor = page.last().map(|c| c.id.clone());
            out.extend(page.into_iter().filter(|c| filter.matches_channel(c)));
            if done || out.len() >= limit as usize {
                out.truncate(limit as usize);
                return Ok(out);
            }
        }
    }
    /// [`Store::page_failures`] narrowed by the console's search (same order and cursor);
    /// the default reads unfiltered pages until `limit` rows match.
    async fn search_failures(
        &self,
        filter: &ConsoleFilter,
        before_seq: Option<i64>,
        limit: u32,
    ) -> BackendResult<Vec<DeliveryFailure>> {
        let mut out = Vec::new();
        let mut cursor = before_seq;
        loop {
            let page = self.page_failures(cursor, limit).await?;
            let done = page.len() < limit as usize;
            cursor = page.last().map(|f| f.seq);
            out.extend(page.into_iter().filter(|f| filter.matches_failure(f)));
            if done || out.len() >= limit as usize {
                out.truncate(limit as usize);
                return Ok(out);
            }
        }
    }
    /// [`Store::page_runs`] narrowed by the console's search (same order and cursor); the
    /// default reads unfiltered pages until `limit` rows match.
    async fn search_runs(
        &self,
        filter: &ConsoleFilter,
        before: Option<(i64, &str)>,
        limit: u32,
    ) -> BackendResult<Vec<crate::hoststore::RunRecord>> {
        let mut out = Vec::new();
        let mut cursor = before.map(|(at, id)| (at, id.to_owned()));
        loop {
            let page = self
                .page_runs(cursor.as_ref().map(|(at, id)| (*at, id.as_str())), limit)
                .await?;
            let done = page.len() < limit as usize;
            cursor = page.last().map(|r| (r.created_at, r.id.clone()));
            out.extend(page.into_iter().filter(|r| filter.matches_run(r)));
            if done || out.len() >= limit as usize {
                out.truncate(limit as usize);
                return Ok(out);
            }
        }
    }
    /// Counts for the overview, each counting at most `at_most` rows.
    async fn overview(&self, at_most: u64) -> BackendResult<Overview>;

    // -- delivery journal --
    /// Stores journal steps (one statement for the batch); their `id`s are assigned here.
    async fn insert_journal(&self, entries: &[JournalRecord]) -> BackendResult<()>;
    /// A message's steps, oldest first (by time, then their place in a message's life, then
    /// insert order: [`crate::journal::oldest_first`]), at most `limit`.
    async fn journal_for_message(
        &self,
        message_id: &str,
        limit: u32,
    ) -> BackendResult<Vec<JournalRecord>>;
    /// A channel's steps, newest first, those with an `id` below `before_id` when given.
    async fn journal_for_channel(
        &self,
        channel_id: &str,
        before_id: Option<i64>,
        limit: u32,
    ) -> BackendResult<Vec<JournalRecord>>;
    /// Removes steps older than `before` and, for each tenant of the tenants table, all but
    /// its newest `per_tenant` (0 = no cap; a deleted tenant's steps only age out). Returns
    /// how many went.
    async fn purge_journal(&self, before: i64, per_tenant: u64) -> BackendResult<u64>;
    /// Pending messages past their expiry that `purge_outbox` is about to remove unanswered,
    /// oldest expiry first, at most `limit`: `(tenant_id, channel_id, message_id)`, for the
    /// journal's `expired` step.
    async fn expired_pending(
        &self,
        now: i64,
        limit: u32,
    ) -> BackendResult<Vec<(String, String, String)>>;
}

/// What the store holds for a batch of [`Enqueue`] items, read inside the batch's
/// transaction: the channels that exist, the `(channel, message_id)` pairs already seen or
/// still in the outbox, and the pending count per channel.
#[derive(Debug, Default)]
pub struct BatchFacts {
    pub channels: std::collections::HashSet<String>,
    pub seen: std::collections::HashSet<(String, String)>,
    pub pending: std::collections::HashMap<String, i64>,
    /// The highest seq each channel's outbox holds, in any state (none: no row).
    pub last: std::collections::HashMap<String, i64>,
}

/// Places the stored items of a planned batch: `seqs` are the seqs the backend gave them,
/// in input order; each one's `prev` is the seq stored before it in its channel (earlier
/// in the batch, or the channel's highest in `facts.last`).
pub fn place_batch(
    items: &[Enqueue],
    outcomes: &mut [EnqueueOutcome],
    facts: &BatchFacts,
    seqs: &[i64],
) {
    let mut last = facts.last.clone();
    let mut seqs = seqs.iter();
    for (it, o) in items.iter().zip(outcomes.iter_mut()) {
        if !o.is_stored() {
            continue;
        }
        let Some(&seq) = seqs.next() else {
            return;
        };
        let prev = last.insert(it.record.channel_id.clone(), seq).unwrap_or(0);
        *o = EnqueueOutcome::Stored { seq, prev };
    }
}

/// The outcome of each item of a batch, in input order, with the rules of
/// [`Store::enqueue_outbox`]; a repeat within the batch is a duplicate of the first, and
/// items stored earlier in the batch count toward their channel's cap. SQLite and the memory
/// store run it in the pod; Postgres runs the same rules on the server, in one call
/// (`migrations/postgres/0010_enqueue_batch.sql`), and the store conformance suite
/// (`enqueue_batch_rules` and the cases after it) holds every backend to them.
pub fn plan_enqueue_batch(items: &[Enqueue], facts: &BatchFacts) -> Vec<EnqueueOutcome> {
    let mut seen_here = std::collections::HashSet::new();
    let mut pending = facts.pending.clone();
    items
        .iter()
        .map(|it| {
            let r = &it.record;
            if !facts.channels.contains(&r.channel_id) {
                return EnqueueOutcome::UnknownChannel;
            }
            let key = (r.channel_id.clone(), r.message_id.clone());
            if facts.seen.contains(&key) || seen_here.contains(&key) {
                return EnqueueOutcome::Duplicate;
            }
            let n = pending.entry(r.channel_id.clone()).or_insert(0);
            if *n >= i64::from(it.cap) {
                return EnqueueOutcome::Full;
            }
            *n += 1;
            seen_here.insert(key);
            // The backend places it (seq, prev) when it inserts the row.
            EnqueueOutcome::STORED
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(ch: &str, m: &str, cap: u32) -> Enqueue {
        Enqueue {
            record: OutboxRecord {
                seq: 0,
                channel_id: ch.into(),
                message_id: m.into(),
                payload: serde_json::json!({}),
                created_at: 1,
                expires_at: 2,
                attempts: 0,
                state: OutboxState::Pending,
                last_error: None,
            },
            cap,
            dedupe_until: 3,
        }
    }

    #[test]
    fn batch_rules() {
        let mut facts = BatchFacts::default();
        facts.channels.insert("a".into());
        facts.channels.insert("b".into());
        facts.seen.insert(("a".into(), "old".into()));
        facts.pending.insert("b".into(), 1);
        let items = [
            item("a", "m1", 10),
            item("a", "m1", 10),
            item("a", "old", 10),
            item("x", "m1", 10),
            item("b", "m1", 2),
            item("b", "m2", 2),
            item("a", "m2", 10),
        ];
        use EnqueueOutcome::*;
        assert_eq!(
            plan_enqueue_batch(&items, &facts),
            vec![
                EnqueueOutcome::STORED,
                Duplicate,
                Duplicate,
                UnknownChannel,
                EnqueueOutcome::STORED,
                Full,
                EnqueueOutcome::STORED
            ]
        );
    }
}
