//! The operator API (admin listener): approvals decided by people, and the host list.

use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use switchyard_core::client_error::ClientError;

use super::Gateway;

/// The operator a request of the operator API comes from (set by [`require_operator`]).
#[derive(Clone)]
pub(super) struct OperatorName(pub(super) String);

/// Admits a request only with an operator's Bearer token, before its query or body is
/// looked at, through the operator limiter (per source address and per operator).
pub(super) async fn require_operator(
    State(ops): State<crate::operators::Operators>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let presented = crate::operators::bearer(req.headers())
        .unwrap_or_default()
        .to_owned();
    let source = crate::operators::source(req.extensions());
    match ops.authenticate(source, &presented).await {
        Ok((name, _)) => {
            req.extensions_mut().insert(OperatorName(name));
            next.run(req).await
        }
        Err(denied) => denied.client_error().into_response(),
    }
}

#[derive(Deserialize)]
pub(super) struct ListQuery {
    tenant: String,
    status: Option<String>,
}

fn approval_json(a: &switchyard_core::hoststore::ApprovalRecord) -> serde_json::Value {
    json!({
        "approval_id": a.id,
        "tenant_id": a.tenant_id,
        "host_id": a.host_id,
        "run_id": a.run_id,
        "action": a.action,
        "risk_level": a.risk_level,
        "status": a.status.as_str(),
        "decided_by": a.decided_by,
        "reason": a.reason,
        "created_at": a.created_at,
        "expires_at": a.expires_at,
        "decided_at": a.decided_at,
    })
}

pub(super) async fn approvals_list(
    State(gw): State<Gateway>,
    Query(q): Query<ListQuery>,
) -> Response {
    let status = match q.status.as_deref() {
        None | Some("all") => None,
        Some(s) => match switchyard_core::hoststore::ApprovalStatus::parse(s) {
            Some(st) => Some(st),
            None => {
                return ClientError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "unknown status",
                )
                .into_response();
            }
        },
    };
    match gw
        .hosts
        .hub()
        .store()
        .list_approvals(&q.tenant, status)
        .await
    {
        Ok(list) => axum::Json(list.iter().map(approval_json).collect::<Vec<_>>()).into_response(),
        Err(e) => ClientError::from(e).into_response(),
    }
}

#[derive(Deserialize, Default)]
struct DecisionBody {
    reason: Option<String>,
}

async fn decide(
    gw: Gateway,
    by: String,
    id: String,
    grant: bool,
    body: axum::body::Bytes,
) -> Response {
    let body: DecisionBody = if body.is_empty() {
        DecisionBody::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(b) => b,
            Err(_) => {
                return ClientError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "body must be {\"reason\"?}",
                )
                .into_response();
            }
        }
    };
    match gw
        .hosts
        .decide(&id, None, grant, &by, body.reason.as_deref())
        .await
    {
        Ok(a) => axum::Json(approval_json(&a)).into_response(),
        Err(e) => ClientError::from(&e).into_response(),
    }
}

pub(super) async fn approval_grant(
    State(gw): State<Gateway>,
    Extension(by): Extension<OperatorName>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    decide(gw, by.0, id, true, body).await
}

pub(super) async fn approval_deny(
    State(gw): State<Gateway>,
    Extension(by): Extension<OperatorName>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    decide(gw, by.0, id, false, body).await
}

#[derive(Deserialize)]
pub(super) struct HostsQuery {
    tenant: String,
}

pub(super) async fn hosts_list(State(gw): State<Gateway>, Query(q): Query<HostsQuery>) -> Response {
    match gw.hosts.hub().store().list_hosts(&q.tenant).await {
        Ok(list) => axum::Json(
            list.iter()
                .map(|h| json!({"host_id": h.id, "name": h.name, "status": h.status.as_str(), "hostname": h.hostname, "last_seen_at": h.last_seen_at}))
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(e) => ClientError::from(e).into_response(),
    }
}

fn journal_json(e: &switchyard_core::model::JournalRecord) -> serde_json::Value {
    json!({
        "at": e.at,
        "step": e.step,
        "detail": e.detail,
        "pod_id": e.pod_id,
        "tenant_id": e.tenant_id,
        "channel_id": e.channel_id,
        "message_id": e.message_id,
    })
}

/// `GET /admin/v1/messages/{message_id}`: the message's journal, oldest step first; 404 when
/// nothing is recorded (never journaled, or purged).
pub(super) async fn message_journal(
    State(gw): State<Gateway>,
    axum::extract::Path(message_id): axum::extract::Path<String>,
) -> Response {
    match gw
        .hosts
        .hub()
        .store()
        .journal_for_message(&message_id, 1000)
        .await
    {
        Ok(steps) if steps.is_empty() => ClientError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no journal steps for this message",
        )
        .into_response(),
        Ok(steps) => axum::Json(json!({
            "message_id": message_id,
            "steps": steps.iter().map(journal_json).collect::<Vec<_>>(),
        }))
        .into_response(),
        Err(e) => ClientError::from(e).into_response(),
    }
}

#[derive(Deserialize)]
pub(super) struct ChannelJournalQuery {
    channel: String,
    /// Steps with an id below this one (the previous page's `next`).
    before: Option<i64>,
    limit: Option<u32>,
}

/// `GET /admin/v1/messages?channel=ID[&before=N][&limit=N]`: a channel's journal, newest step
/// first, with `next` to pass as `before` for the following page.
pub(super) async fn channel_journal(
    State(gw): State<Gateway>,
    Query(q): Query<ChannelJournalQuery>,
) -> Response {
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let store = gw.hosts.hub().store();
    match store.journal_for_channel(&q.channel, q.before, limit).await {
        Ok(steps) => {
            let next = (steps.len() == limit as usize)
                .then(|| steps.last().map(|e| e.id))
                .flatten();
            axum::Json(json!({
                "channel_id": q.channel,
                "steps": steps.iter().map(journal_json).collect::<Vec<_>>(),
                "next": next,
            }))
            .into_response()
        }
        Err(e) => ClientError::from(e).into_response(),
    }
}
