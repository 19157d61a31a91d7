//! The operator console's pages: keyset queries (rows after a cursor in an indexed order,
//! `LIMIT n`), so a page costs the same whatever the table size, and bounded counts.

use switchyard_core::error::BackendResult;
use switchyard_core::hoststore::{ApprovalRecord, ApprovalStatus, HostRecord, RunRecord};
use switchyard_core::model::*;
use switchyard_protocol::ConnectionStatus;

use crate::host_records::{approval, host, run};
use crate::records::{connector, tenant};
use crate::{Arg, Handles, SqlRow, all, capped, corrupt, count, get, json_col, stmt};

fn lim(limit: u32) -> i64 {
    i64::from(limit.clamp(1, 1000))
}

fn key_info(row: &impl SqlRow) -> BackendResult<ApiKeyInfo> {
    Ok(ApiKeyInfo {
        id: get(row, "id")?,
        tenant_id: get(row, "tenant_id")?,
        created_at: get(row, "created_at")?,
        revoked_at: get(row, "revoked_at")?,
        last_used_at: get(row, "last_used_at")?,
    })
}

fn summary(row: &impl SqlRow) -> BackendResult<ChannelSummary> {
    let status: String = get(row, "status")?;
    let n = |c: &str| -> BackendResult<u64> { Ok(count(get(row, c)?)) };
    Ok(ChannelSummary {
        id: get(row, "id")?,
        tenant_id: get(row, "tenant_id")?,
        connector_id: get(row, "connector_id")?,
        card_id: get(row, "card_id")?,
        status: ConnectionStatus::parse(&status).ok_or_else(|| corrupt("channel status"))?,
        view: json_col(row, "view")?,
        bound: get::<i64>(row, "bound")? != 0,
        routed: get::<i64>(row, "routed")? != 0,
        pending: n("pending")?,
        oldest_pending_at: get(row, "oldest_pending_at")?,
        failed: n("failed")?,
        created_at: get(row, "created_at")?,
        updated_at: get(row, "updated_at")?,
    })
}

fn failure(row: &impl SqlRow) -> BackendResult<DeliveryFailure> {
    let state: String = get(row, "state")?;
    Ok(DeliveryFailure {
        seq: get(row, "seq")?,
        channel_id: get(row, "channel_id")?,
        tenant_id: get(row, "tenant_id")?,
        card_id: get(row, "card_id")?,
        message_id: get(row, "message_id")?,
        state: match state.as_str() {
            "pending" => OutboxState::Pending,
            "failed" => OutboxState::Failed,
            _ => return Err(corrupt("outbox state")),
        },
        attempts: get(row, "attempts")?,
        reason: get::<Option<String>>(row, "last_error")?.unwrap_or_default(),
        created_at: get(row, "created_at")?,
    })
}

pub async fn page_tenants(
    s: &impl Handles,
    after: Option<&str>,
    limit: u32,
) -> BackendResult<Vec<Tenant>> {
    let q = stmt("SELECT id, name, created_at FROM tenants WHERE id > $1 ORDER BY id LIMIT $2")
        .bind(after.unwrap_or(""))
        .bind(lim(limit));
    all(q.fetch_all(&mut s.read(), "page tenants").await?, tenant)
}

pub async fn tenant_keys(s: &impl Handles, tenant_id: &str) -> BackendResult<Vec<ApiKeyInfo>> {
    let q = stmt(
        "SELECT id, tenant_id, created_at, revoked_at, last_used_at FROM api_keys \
         WHERE tenant_id = $1 ORDER BY created_at, id",
    )
    .bind(tenant_id);
    all(q.fetch_all(&mut s.read(), "tenant keys").await?, key_info)
}

pub async fn page_connectors(
    s: &impl Handles,
    after: Option<&str>,
    limit: u32,
) -> BackendResult<Vec<ConnectorRecord>> {
    let q = stmt(
        "SELECT id, tenant_id, card_id, created_at, offline_since FROM connectors \
         WHERE id > $1 ORDER BY id LIMIT $2",
    )
    .bind(after.unwrap_or(""))
    .bind(lim(limit));
    all(
        q.fetch_all(&mut s.read(), "page connectors").await?,
        connector,
    )
}

/// A search's conditions with their values, numbered in order of appearance (`$n` first
/// appears in order, as both dialects read it).
#[derive(Default)]
struct Where<'a> {
    sql: String,
    args: Vec<Arg<'a>>,
}

impl<'a> Where<'a> {
    fn next(&mut self) -> usize {
        self.args.len() + 1
    }

    /// `AND <cond>`, where `{}` in `cond` is the placeholder of `v`.
    fn and(&mut self, cond: &str, v: impl Into<Arg<'a>>) {
        let n = self.next();
        self.sql.push_str(" AND ");
        self.sql.push_str(&cond.replace("{}", &format!("${n}")));
        self.args.push(v.into());
    }

    fn eq(&mut self, col: &str, v: Option<&'a str>) {
        if let Some(v) = v {
            self.and(&format!("{col} = {{}}"), v);
        }
    }

    /// Rows whose `cols` (any of them) start with `prefix`. With one column, a range on it
    /// lets its index start and stop the walk: an id of ASCII letters, digits, `_` and `-`
    /// that starts with the prefix sorts at or after it and, unless `zzzz` follows the
    /// prefix in it, before `prefix` + `zzzz`, in byte order and in the linguistic
    /// collations (which skip `_` and `-` at the first level). Generated ids are hex after
    /// their `_`, so none is missed; the `substr` test keeps the match exact.
    fn prefix(&mut self, cols: &[&str], prefix: Option<&'a str>) {
        let Some(p) = prefix else { return };
        let len = i32::try_from(p.chars().count()).unwrap_or(i32::MAX);
        let tests: Vec<String> = cols
            .iter()
            .map(|c| {
                let (l, v) = (self.args.len() + 1, self.args.len() + 2);
                self.args.push(Arg::Int4(len));
                self.args.push(p.into());
                format!("substr({c}, 1, ${l}) = ${v}")
            })
            .collect();
        self.sql.push_str(&format!(" AND ({})", tests.join(" OR ")));
        if let [only] = cols {
            self.and(&format!("{only} >= {{}}"), p);
            self.and(&format!("{only} < {{}}"), format!("{p}zzzz"));
        }
    }
}

// Each count walks one channel's slice of outbox_delivery (channel_id, state, seq).
const CHANNEL_SELECT: &str = "SELECT c.id, c.tenant_id, c.connector_id, c.card_id, c.status, c.view, \
         CAST(CASE WHEN c.binding IS NULL THEN 0 ELSE 1 END AS BIGINT) AS bound, \
         CAST(CASE WHEN r.socket_id IS NULL THEN 0 ELSE 1 END AS BIGINT) AS routed, c.created_at, \
         CASE WHEN r.moved_at > c.updated_at THEN r.moved_at ELSE c.updated_at END AS updated_at, \
         (SELECT COUNT(*) FROM outbox o WHERE o.channel_id = c.id AND o.state = 'pending' \
           AND o.seq > COALESCE((SELECT k.acked_seq FROM outbox_cursors k WHERE k.channel_id = c.id), 0)) AS pending, \
         (SELECT o.created_at FROM outbox o WHERE o.channel_id = c.id AND o.state = 'pending' \
           AND o.seq > COALESCE((SELECT k.acked_seq FROM outbox_cursors k WHERE k.channel_id = c.id), 0) \
          ORDER BY o.seq LIMIT 1) AS oldest_pending_at, \
         (SELECT COUNT(*) FROM outbox o WHERE o.channel_id = c.id AND o.state = 'failed') AS failed \
         FROM channels c LEFT JOIN channel_routes r ON r.channel_id = c.id ";

pub async fn page_channels(
    s: &impl Handles,
    after: Option<&str>,
    bound_only: bool,
    limit: u32,
) -> BackendResult<Vec<ChannelSummary>> {
    let sql = if bound_only {
        format!("{CHANNEL_SELECT} WHERE c.id > $1 AND c.binding IS NOT NULL ORDER BY c.id LIMIT $2")
    } else {
        format!("{CHANNEL_SELECT} WHERE c.id > $1 ORDER BY c.id LIMIT $2")
    };
    let q = stmt(&sql).bind(after.unwrap_or("")).bind(lim(limit));
    all(q.fetch_all(&mut s.read(), "page channels").await?, summary)
}

/// [`page_channels`] narrowed by the console's search: one keyset query, walking
/// `channels_tenant_id`, `channels_card_id`, `channels_status_id` or the primary key.
pub async fn search_channels(
    s: &impl Handles,
    f: &ConsoleFilter,
    after: Option<&str>,
    bound_only: bool,
    limit: u32,
) -> BackendResult<Vec<ChannelSummary>> {
    let mut w = Where::default();
    w.and("c.id > {}", after.unwrap_or(""));
    if bound_only {
        w.sql.push_str(" AND c.binding IS NOT NULL");
    }
    w.eq("c.tenant_id", f.tenant_id.as_deref());
    w.eq("c.card_id", f.card_id.as_deref());
    w.eq("c.status", f.status.as_deref());
    w.prefix(&["c.id"], f.id_prefix.as_deref());
    let n = w.next();
    let sql = format!(
        "{CHANNEL_SELECT} WHERE {} ORDER BY c.id LIMIT ${n}",
        w.sql.trim_start_matches(" AND ")
    );
    let mut q = stmt(&sql);
    for a in w.args {
        q = q.bind(a);
    }
    let q = q.bind(lim(limit));
    all(
        q.fetch_all(&mut s.read(), "search channels").await?,
        summary,
    )
}

pub async fn page_failures(
    s: &impl Handles,
    before_seq: Option<i64>,
    limit: u32,
) -> BackendResult<Vec<DeliveryFailure>> {
    let q = stmt(
        "SELECT o.seq, o.channel_id, c.tenant_id, c.card_id, o.message_id, o.state, o.attempts, \
         o.last_error, o.created_at FROM outbox o JOIN channels c ON c.id = o.channel_id \
         WHERE o.last_error IS NOT NULL AND o.seq < $1 ORDER BY o.seq DESC LIMIT $2",
    )
    .bind(before_seq.unwrap_or(i64::MAX))
    .bind(lim(limit));
    all(q.fetch_all(&mut s.read(), "page failures").await?, failure)
}

const FAILURE_SELECT: &str = "SELECT o.seq, o.channel_id, c.tenant_id, c.card_id, o.message_id, \
     o.state, o.attempts, o.last_error, o.created_at FROM outbox o JOIN channels c ON c.id = o.channel_id \
     WHERE o.last_error IS NOT NULL";

/// [`page_failures`] narrowed by the console's search: one query walking `outbox_errors`
/// (or `outbox_failed` for the failed ones) newest first, each row joined to its channel by
/// primary key. The outbox is bounded (rows expire and failed ones are purged), so the walk is.
pub async fn search_failures(
    s: &impl Handles,
    f: &ConsoleFilter,
    before_seq: Option<i64>,
    limit: u32,
) -> BackendResult<Vec<DeliveryFailure>> {
    let mut w = Where::default();
    w.and("o.seq < {}", before_seq.unwrap_or(i64::MAX));
    w.eq("c.tenant_id", f.tenant_id.as_deref());
    w.eq("c.card_id", f.card_id.as_deref());
    w.eq("o.state", f.status.as_deref());
    w.prefix(&["o.channel_id", "o.message_id"], f.id_prefix.as_deref());
    let n = w.next();
    let sql = format!("{FAILURE_SELECT}{} ORDER BY o.seq DESC LIMIT ${n}", w.sql);
    let mut q = stmt(&sql);
    for a in w.args {
        q = q.bind(a);
    }
    let q = q.bind(lim(limit));
    all(
        q.fetch_all(&mut s.read(), "search failures").await?,
        failure,
    )
}

pub async fn page_hosts(
    s: &impl Handles,
    after: Option<&str>,
    limit: u32,
) -> BackendResult<Vec<HostRecord>> {
    let q = stmt(concat!(
        "SELECT ",
        crate::host_cols!(),
        " FROM hosts WHERE id > $1 ORDER BY id LIMIT $2"
    ))
    .bind(after.unwrap_or(""))
    .bind(lim(limit));
    all(q.fetch_all(&mut s.read(), "page hosts").await?, host)
}

pub async fn page_runs(
    s: &impl Handles,
    before: Option<(i64, &str)>,
    limit: u32,
) -> BackendResult<Vec<RunRecord>> {
    let (at, id) = before.unwrap_or((i64::MAX, ""));
    let q = stmt(concat!(
        "SELECT ",
        crate::run_cols!(),
        " FROM runs WHERE created_at < $1 OR (created_at = $1 AND id < $2) \
         ORDER BY created_at DESC, id DESC LIMIT $3"
    ))
    .bind(at)
    .bind(id)
    .bind(lim(limit));
    all(q.fetch_all(&mut s.read(), "page runs").await?, run)
}

/// [`page_runs`] narrowed by the console's search: one keyset query, walking
/// `runs_tenant_created`, `runs_state_created` or `runs_created` newest first.
pub async fn search_runs(
    s: &impl Handles,
    f: &ConsoleFilter,
    before: Option<(i64, &str)>,
    limit: u32,
) -> BackendResult<Vec<RunRecord>> {
    let (at, id) = before.unwrap_or((i64::MAX, ""));
    let mut w = Where::default();
    w.sql
        .push_str(" AND (created_at < $1 OR (created_at = $1 AND id < $2))");
    w.args.push(at.into());
    w.args.push(id.into());
    w.eq("tenant_id", f.tenant_id.as_deref());
    w.eq("state", f.status.as_deref());
    w.prefix(&["id"], f.id_prefix.as_deref());
    let n = w.next();
    let sql = format!(
        "SELECT {} FROM runs WHERE {} ORDER BY created_at DESC, id DESC LIMIT ${n}",
        crate::run_cols!(),
        w.sql.trim_start_matches(" AND ")
    );
    let mut q = stmt(&sql);
    for a in w.args {
        q = q.bind(a);
    }
    let q = q.bind(lim(limit));
    all(q.fetch_all(&mut s.read(), "search runs").await?, run)
}

pub async fn page_approvals(
    s: &impl Handles,
    status: ApprovalStatus,
    after: Option<(i64, &str)>,
    limit: u32,
) -> BackendResult<Vec<ApprovalRecord>> {
    let (at, id) = after.unwrap_or((i64::MIN, ""));
    let q = stmt(concat!(
        "SELECT ",
        crate::approval_cols!(),
        " FROM approvals WHERE status = $1 AND (created_at > $2 OR (created_at = $2 AND id > $3)) \
         ORDER BY created_at, id LIMIT $4"
    ))
    .bind(status.as_str())
    .bind(at)
    .bind(id)
    .bind(lim(limit));
    all(
        q.fetch_all(&mut s.read(), "page approvals").await?,
        approval,
    )
}

pub async fn overview(s: &impl Handles, at_most: u64) -> BackendResult<Overview> {
    let count = |sql: &'static str| async move {
        let n: i64 = stmt(sql)
            .bind(capped(at_most))
            .scalar(&mut s.read(), "overview count")
            .await?;
        BackendResult::Ok(count(n))
    };
    Ok(Overview {
        tenants: count("SELECT COUNT(*) FROM (SELECT 1 FROM tenants LIMIT $1) t").await?,
        connectors: count("SELECT COUNT(*) FROM (SELECT 1 FROM connectors LIMIT $1) t").await?,
        connectors_offline: count(
            "SELECT COUNT(*) FROM (SELECT 1 FROM connectors WHERE offline_since IS NOT NULL LIMIT $1) t",
        )
        .await?,
        channels: count("SELECT COUNT(*) FROM (SELECT 1 FROM channels LIMIT $1) t").await?,
        bound_channels: count(
            "SELECT COUNT(*) FROM (SELECT 1 FROM channels WHERE binding IS NOT NULL LIMIT $1) t",
        )
        .await?,
        outbox: count("SELECT COUNT(*) FROM (SELECT 1 FROM outbox LIMIT $1) t").await?,
        outbox_failed: count(
            "SELECT COUNT(*) FROM (SELECT 1 FROM outbox WHERE state = 'failed' LIMIT $1) t",
        )
        .await?,
        hosts_online: count(
            "SELECT COUNT(*) FROM (SELECT 1 FROM hosts WHERE status = 'online' LIMIT $1) t",
        )
        .await?,
        approvals_pending: count(
            "SELECT COUNT(*) FROM (SELECT 1 FROM approvals WHERE status = 'pending' LIMIT $1) t",
        )
        .await?,
    })
}
