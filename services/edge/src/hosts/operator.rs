//! The operator API (internal listener): approvals decided by people, and the host list.

use super::*;

fn operator(gw: &Gateway, headers: &HeaderMap) -> Result<String, Refusal> {
    if gw.operators.is_empty() {
        return Err(Refusal(
            StatusCode::NOT_FOUND,
            "operator_api_disabled",
            "no operator tokens are configured (operator_tokens)",
        ));
    }
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or_default();
    if presented.is_empty() {
        return Err(Refusal(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "an operator token is required",
        ));
    }
    gw.operators
        .iter()
        .find(|(_, token)| switchyard_core::crypto::ct_eq(token.as_bytes(), presented.as_bytes()))
        .map(|(name, _)| name.clone())
        .ok_or(Refusal(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "an operator token is required",
        ))
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
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Response {
    if let Err(r) = operator(&gw, &headers) {
        return r.into_response();
    }
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
    match gw.hosts.hub.store.list_approvals(&q.tenant, status).await {
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
    headers: HeaderMap,
    id: String,
    grant: bool,
    body: axum::body::Bytes,
) -> Response {
    let by = match operator(&gw, &headers) {
        Ok(n) => n,
        Err(r) => return r.into_response(),
    };
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
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    decide(gw, headers, id, true, body).await
}

pub(super) async fn approval_deny(
    State(gw): State<Gateway>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    decide(gw, headers, id, false, body).await
}

#[derive(Deserialize)]
pub(super) struct HostsQuery {
    tenant: String,
}

pub(super) async fn hosts_list(
    State(gw): State<Gateway>,
    headers: HeaderMap,
    Query(q): Query<HostsQuery>,
) -> Response {
    if let Err(r) = operator(&gw, &headers) {
        return r.into_response();
    }
    match gw.hosts.hub.store.list_hosts(&q.tenant).await {
        Ok(list) => axum::Json(
            list.iter()
                .map(|h| json!({"host_id": h.id, "name": h.name, "status": h.status.as_str(), "hostname": h.hostname, "last_seen_at": h.last_seen_at}))
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(e) => ClientError::from(e).into_response(),
    }
}
