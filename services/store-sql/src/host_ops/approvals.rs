//! Approvals.

use switchyard_core::error::{BackendError, BackendResult};
use switchyard_core::hoststore::*;

use crate::host_records::approval;
use crate::{Exec, Handles, all, one, stmt};

pub async fn insert_approval(s: &impl Handles, a: &ApprovalRecord) -> BackendResult<()> {
    let mut w = s.write().await?;
    stmt(concat!(
        "INSERT INTO approvals (",
        crate::approval_cols!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
    ))
    .bind(&a.id)
    .bind(&a.tenant_id)
    .bind(&a.host_id)
    .bind(&a.run_id)
    .bind(&a.action)
    .bind(&a.risk_level)
    .bind(a.status.as_str())
    .bind(&a.decided_by)
    .bind(&a.reason)
    .bind(a.created_at)
    .bind(a.expires_at)
    .bind(a.decided_at)
    .bind(a.delivered_at)
    .execute(&mut w, "insert approval")
    .await?;
    w.commit().await
}

pub async fn get_approval(s: &impl Handles, id: &str) -> BackendResult<Option<ApprovalRecord>> {
    let row = stmt(concat!(
        "SELECT ",
        crate::approval_cols!(),
        " FROM approvals WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&mut s.read(), "get approval")
    .await?;
    one(row, approval)
}

pub async fn list_approvals(
    s: &impl Handles,
    tenant_id: &str,
    status: Option<ApprovalStatus>,
) -> BackendResult<Vec<ApprovalRecord>> {
    let rows = stmt(concat!(
        "SELECT ",
        crate::approval_cols!(),
        " FROM approvals WHERE tenant_id = $1 AND ($2 IS NULL OR status = $2) \
         ORDER BY created_at, id"
    ))
    .bind(tenant_id)
    .bind(status.map(ApprovalStatus::as_str))
    .fetch_all(&mut s.read(), "list approvals")
    .await?;
    all(rows, approval)
}

pub async fn expire_approvals(s: &impl Handles, now: i64) -> BackendResult<Vec<ApprovalRecord>> {
    let mut w = s.write().await?;
    let rows = stmt(concat!(
        "UPDATE approvals SET status = 'expired', decided_at = $1 \
         WHERE status = 'pending' AND expires_at < $1 RETURNING ",
        crate::approval_cols!()
    ))
    .bind(now)
    .fetch_all(&mut w, "expire approvals")
    .await?;
    let mut out = all(rows, approval)?;
    w.commit().await?;
    out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    Ok(out)
}

pub async fn undelivered_decisions(
    s: &impl Handles,
    host_id: &str,
) -> BackendResult<Vec<ApprovalRecord>> {
    // Expired approvals are decisions too: the host is told `approval_denied`.
    let rows = stmt(concat!(
        "SELECT ",
        crate::approval_cols!(),
        " FROM approvals WHERE host_id = $1 AND status <> 'pending' AND delivered_at IS NULL \
         ORDER BY decided_at, id"
    ))
    .bind(host_id)
    .fetch_all(&mut s.read(), "undelivered decisions")
    .await?;
    all(rows, approval)
}

pub async fn mark_approval_delivered(s: &impl Handles, id: &str, now: i64) -> BackendResult<()> {
    let mut w = s.write().await?;
    // Delivered twice keeps the first delivery time.
    stmt(
        "UPDATE approvals SET delivered_at = COALESCE(delivered_at, $2) \
         WHERE id = $1 AND status <> 'pending'",
    )
    .bind(id)
    .bind(now)
    .execute(&mut w, "mark approval delivered")
    .await?;
    w.commit().await
}

pub async fn decide_approval(
    s: &impl Handles,
    id: &str,
    status: ApprovalStatus,
    decided_by: &str,
    reason: Option<&str>,
    now: i64,
) -> BackendResult<Option<ApprovalRecord>> {
    if !matches!(status, ApprovalStatus::Granted | ApprovalStatus::Denied) {
        return Err(BackendError::internal(format!(
            "an approval is decided as granted or denied, not {}",
            status.as_str()
        )));
    }
    let mut w = s.write().await?;
    let row = stmt(concat!(
        "UPDATE approvals SET status = $2, decided_by = $3, reason = $4, decided_at = $5 \
         WHERE id = $1 AND status = 'pending' AND expires_at > $5 RETURNING ",
        crate::approval_cols!()
    ))
    .bind(id)
    .bind(status.as_str())
    .bind(decided_by)
    .bind(reason)
    .bind(now)
    .fetch_optional(&mut w, "decide approval")
    .await?;
    let out = one(row, approval)?;
    w.commit().await?;
    Ok(out)
}
