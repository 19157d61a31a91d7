//! Connectors, channels with their outbox depth, provider bindings and recent delivery
//! failures.

use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use switchyard_core::ids::now_ms;
use switchyard_core::model::OutboxState;

use super::auth::{Caller, Operator, viewer};
use super::html::{clip, code, esc, link, mask, next_link, span, table, time};
use super::search::Search;
use super::{ConsoleState, Cursor, PAGE, backend, error_page, full, html, ok};

pub(super) async fn connectors(
    State(st): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Query(c): Query<Cursor>,
) -> Response {
    let who = match viewer(&caller) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let list = match st
        .hosts
        .hub()
        .store()
        .page_connectors(c.after(), PAGE)
        .await
    {
        Ok(l) => l,
        Err(e) => return backend(&who, e),
    };
    let grace = st.hosts.hub().config().connector_grace.as_millis() as i64;
    let now = now_ms();
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|k| {
            let (state, since, left) = match k.offline_since {
                None => (
                    "<span class=\"ok\">online</span>".to_owned(),
                    "—".into(),
                    "—".into(),
                ),
                Some(at) => (
                    "<span class=\"warn\">offline</span>".to_owned(),
                    time(at),
                    span(at + grace - now),
                ),
            };
            vec![
                code(&k.card_id),
                code(&k.id),
                link(
                    &format!("/console/tenants/{}", html::url(&k.tenant_id)),
                    &k.tenant_id,
                ),
                state,
                esc(&since),
                esc(&left),
            ]
        })
        .collect();
    let mut body = table(
        &[
            "card",
            "connector_id",
            "tenant",
            "state",
            "offline since",
            "grace left",
        ],
        &rows,
    );
    body.push_str(&next_link(
        "/console/connectors",
        "after",
        full(&list)
            .then(|| list.last().map(|t| t.id.clone()))
            .flatten(),
        "",
    ));
    ok("Connectors", &who, &body)
}

pub(super) fn status_class(s: switchyard_protocol::ConnectionStatus) -> &'static str {
    use switchyard_protocol::ConnectionStatus as S;
    match s {
        S::Connected => "ok",
        S::Degraded => "warn",
        S::Expired | S::Revoked => "bad",
        _ => "muted",
    }
}

/// The Descriptor's target as shown: display name, and the account hint masked.
pub(super) fn target(view: &serde_json::Value) -> String {
    let name = view["display_name"].as_str().unwrap_or("");
    let hint = view["account_hint"].as_str().map(mask);
    match (name.is_empty(), hint) {
        (true, None) => "<span class=\"muted\">—</span>".into(),
        (_, Some(h)) => format!("{} <span class=\"muted\">{}</span>", esc(name), esc(&h)),
        (false, None) => esc(name),
    }
}

pub(super) fn channel_rows(
    list: &[switchyard_core::model::ChannelSummary],
    with_health: bool,
) -> Vec<Vec<String>> {
    let now = now_ms();
    list.iter()
        .map(|c| {
            let oldest = c
                .oldest_pending_at
                .map(|at| span(now - at))
                .unwrap_or_else(|| "—".into());
            let mut row = vec![
                super::journal::channel_link(&c.id),
                code(&c.card_id),
                link(
                    &format!("/console/tenants/{}", html::url(&c.tenant_id)),
                    &c.tenant_id,
                ),
                format!(
                    "<span class=\"{}\">{}</span>",
                    status_class(c.status),
                    esc(c.status.as_str())
                ),
                target(&c.view),
                if c.bound { "bound" } else { "—" }.into(),
                if c.routed {
                    "<span class=\"ok\">open</span>"
                } else {
                    "closed"
                }
                .into(),
                format!("<span class=\"depth\">{}</span>", c.pending),
                esc(&oldest),
                c.failed.to_string(),
            ];
            if with_health {
                row.push(health(c, now));
            }
            row
        })
        .collect()
}

/// A binding's health from what the store knows: its Descriptor status and its outbox.
pub(super) fn health(c: &switchyard_core::model::ChannelSummary, now: i64) -> String {
    use switchyard_protocol::ConnectionStatus as S;
    let stuck = c.oldest_pending_at.is_some_and(|at| now - at > 60_000);
    let (class, label) = match c.status {
        S::Expired | S::Revoked => ("bad", "needs re-binding"),
        S::Connected if c.failed == 0 && !stuck => ("ok", "healthy"),
        S::Connected | S::Degraded => (
            "warn",
            if stuck {
                "deliveries waiting"
            } else if c.failed > 0 {
                "failed deliveries"
            } else {
                "degraded"
            },
        ),
        _ => ("muted", "not connected"),
    };
    format!("<span class=\"{class}\">{label}</span>")
}

pub(super) const CHANNEL_HEADERS: [&str; 10] = [
    "connector_channel_id",
    "card",
    "tenant",
    "status",
    "target",
    "binding",
    "route",
    "outbox depth",
    "oldest pending",
    "failed",
];

/// Every Descriptor status, the channels and bindings pages' status choices.
pub(super) const CHANNEL_STATUSES: [&str; 8] = [
    "created",
    "authenticating",
    "connected",
    "degraded",
    "offline",
    "expired",
    "revoked",
    "error",
];

/// The channels or bindings page: the search form, one search query, the rows.
async fn channel_list(
    st: &ConsoleState,
    who: &Operator,
    c: &Cursor,
    s: &Search,
    bound_only: bool,
) -> Result<(String, Vec<switchyard_core::model::ChannelSummary>), Response> {
    let path = if bound_only {
        "/console/bindings"
    } else {
        "/console/channels"
    };
    let filter = s
        .filter(&CHANNEL_STATUSES)
        .map_err(|m| error_page(StatusCode::BAD_REQUEST, Some(who), m))?;
    let list = st
        .hosts
        .hub()
        .store()
        .search_channels(&filter, c.after(), bound_only, PAGE)
        .await
        .map_err(|e| backend(who, e))?;
    let rows = channel_rows(&list, bound_only);
    let mut headers_ = CHANNEL_HEADERS.to_vec();
    if bound_only {
        headers_.push("health");
    }
    let mut body = s.form(path, &CHANNEL_STATUSES, true, "connector_channel_id");
    body.push_str(&table(&headers_, &rows));
    body.push_str(&next_link(
        path,
        "after",
        full(&list)
            .then(|| list.last().map(|t| t.id.clone()))
            .flatten(),
        &s.query(),
    ));
    Ok((body, list))
}

pub(super) async fn channels(
    State(st): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Query(c): Query<Cursor>,
    Query(s): Query<Search>,
) -> Response {
    let who = match viewer(&caller) {
        Ok(w) => w,
        Err(r) => return r,
    };
    match channel_list(&st, &who, &c, &s, false).await {
        Ok((body, _)) => ok("Channels", &who, &body),
        Err(r) => r,
    }
}

pub(super) async fn bindings(
    State(st): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Query(c): Query<Cursor>,
    Query(s): Query<Search>,
) -> Response {
    let who = match viewer(&caller) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let mut body = String::from(
        "<p class=\"muted\">Provider bindings: the bound channels of every Card this \
         deployment mounts (IM providers and agent hosts; filter by Card id, e.g. \
         <code>im.slack</code>); credentials are never shown.</p>",
    );
    match channel_list(&st, &who, &c, &s, true).await {
        Ok((list, _)) => {
            body.push_str(&list);
            ok("Provider bindings", &who, &body)
        }
        Err(r) => r,
    }
}

/// The failures page's status choices: the outbox states a failure row can be in.
const FAILURE_STATUSES: [&str; 2] = ["failed", "pending"];

pub(super) async fn failures(
    State(st): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Query(c): Query<Cursor>,
    Query(s): Query<Search>,
) -> Response {
    let who = match viewer(&caller) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let filter = match s.filter(&FAILURE_STATUSES) {
        Ok(f) => f,
        Err(m) => return error_page(StatusCode::BAD_REQUEST, Some(&who), m),
    };
    let before = c.before.as_deref().and_then(|b| b.parse::<i64>().ok());
    let list = match st
        .hosts
        .hub()
        .store()
        .search_failures(&filter, before, PAGE)
        .await
    {
        Ok(l) => l,
        Err(e) => return backend(&who, e),
    };
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|f| {
            vec![
                esc(&time(f.created_at)),
                super::journal::channel_link(&f.channel_id),
                code(&f.card_id),
                super::journal::message_link(&f.message_id),
                match f.state {
                    OutboxState::Failed => "<span class=\"bad\">failed</span>".into(),
                    OutboxState::Pending => "<span class=\"warn\">retrying</span>".into(),
                },
                f.attempts.to_string(),
                esc(&clip(&f.reason, 300)),
            ]
        })
        .collect();
    let mut body = s.form(
        "/console/failures",
        &FAILURE_STATUSES,
        true,
        "channel or message id",
    );
    body.push_str(&table(
        &[
            "message created",
            "channel",
            "card",
            "message_id",
            "state",
            "attempts",
            "reason",
        ],
        &rows,
    ));
    body.push_str(&next_link(
        "/console/failures",
        "before",
        full(&list)
            .then(|| list.last().map(|f| f.seq.to_string()))
            .flatten(),
        &s.query(),
    ));
    ok("Recent delivery failures", &who, &body)
}
