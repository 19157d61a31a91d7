//! Agent hosts, runs with their event log, and approvals decided by operators.

use std::fmt::Write as _;

use axum::extract::{Extension, Form, Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use switchyard_core::hoststore::ApprovalStatus;
use switchyard_core::ids::now_ms;

use super::auth::{Caller, actor, viewer};
use super::html::{clip, code, esc, link, next_link, opt_time, post_button, span, table, time};
use super::search::Search;
use super::{
    ConsoleState, Cursor, PAGE, backend, error_page, full, html, notice, ok, see_other,
    split_cursor,
};
use switchyard_core::client_error::ClientError;

pub(super) async fn hosts_page(
    State(st): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Query(c): Query<Cursor>,
) -> Response {
    let who = match viewer(&caller) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let store = st.hosts.hub().store();
    let list = match store.page_hosts(c.after(), PAGE).await {
        Ok(l) => l,
        Err(e) => return backend(&who, e),
    };
    let now = now_ms();
    let mut rows = Vec::with_capacity(list.len());
    for h in &list {
        // One indexed read per host of the page (at most PAGE).
        let agents = match store.list_agents(&h.id).await {
            Ok(a) => a,
            Err(e) => return backend(&who, e),
        };
        let agents = if agents.is_empty() {
            "—".to_owned()
        } else {
            agents
                .iter()
                .map(|a| {
                    format!(
                        "{} <span class=\"muted\">({}, {})</span>",
                        esc(&a.agent_id),
                        esc(&a.runtime),
                        esc(&a.model)
                    )
                })
                .collect::<Vec<_>>()
                .join("<br>")
        };
        let m = &h.metrics;
        let cpu = m["cpu_pct"]
            .as_f64()
            .map(|v| format!("{v:.1}%"))
            .unwrap_or_else(|| "—".into());
        let mem = m["memory_mb"]
            .as_u64()
            .map(|v| format!("{v} MB"))
            .unwrap_or_else(|| "—".into());
        let runs = match (m["active_runs"].as_u64(), m["queued_runs"].as_u64()) {
            (Some(a), Some(q)) => format!("{a} active, {q} queued"),
            _ => "—".into(),
        };
        let class = match h.status {
            switchyard_core::hoststore::HostStatus::Online => "ok",
            switchyard_core::hoststore::HostStatus::Lost
            | switchyard_core::hoststore::HostStatus::Revoked => "bad",
            _ => "muted",
        };
        let seen = h
            .last_seen_at
            .map(|at| format!("{} ({} ago)", time(at), span(now - at)))
            .unwrap_or_else(|| "never".into());
        rows.push(vec![
            esc(&h.name),
            code(&h.id),
            link(
                &format!("/console/tenants/{}", html::url(&h.tenant_id)),
                &h.tenant_id,
            ),
            format!("<span class=\"{class}\">{}</span>", esc(h.status.as_str())),
            esc(&seen),
            esc(h.hostname.as_deref().unwrap_or("—")),
            agents,
            esc(&cpu),
            esc(&mem),
            esc(&runs),
        ]);
    }
    let mut body = table(
        &[
            "name",
            "host_id",
            "tenant",
            "status",
            "last heartbeat",
            "hostname",
            "agents",
            "CPU",
            "memory",
            "runs",
        ],
        &rows,
    );
    body.push_str(&next_link(
        "/console/hosts",
        "after",
        full(&list)
            .then(|| list.last().map(|t| t.id.clone()))
            .flatten(),
        "",
    ));
    ok("Agent hosts", &who, &body)
}

pub(super) fn run_state(s: switchyard_protocol::hosts::RunState) -> String {
    let class = if s.is_terminal() {
        if s.as_str() == "completed" {
            "ok"
        } else {
            "bad"
        }
    } else if s.as_str() == "awaiting_approval" {
        "warn"
    } else {
        "muted"
    };
    format!(
        "<span class=\"{class} run-state\">{}</span>",
        esc(s.as_str())
    )
}

pub(super) async fn runs(
    State(st): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Query(c): Query<Cursor>,
    Query(s): Query<Search>,
) -> Response {
    let who = match viewer(&caller) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let states = switchyard_protocol::hosts::RunState::ALL.map(|s| s.as_str());
    let filter = match s.filter(&states) {
        Ok(f) => f,
        Err(m) => return error_page(StatusCode::BAD_REQUEST, Some(&who), m),
    };
    let before = split_cursor(c.before.as_deref());
    let list = match st
        .hosts
        .hub()
        .store()
        .search_runs(&filter, before, PAGE)
        .await
    {
        Ok(l) => l,
        Err(e) => return backend(&who, e),
    };
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|r| {
            vec![
                link(&format!("/console/runs/{}", html::url(&r.id)), &r.id),
                esc(&time(r.created_at)),
                code(&r.agent_id),
                code(&r.host_id),
                run_state(r.state),
                esc(&clip(&r.goal, 120)),
                r.event_count.to_string(),
            ]
        })
        .collect();
    let mut body = s.form("/console/runs", &states, false, "run_id");
    body.push_str(&table(
        &[
            "run_id", "created", "agent", "host", "state", "goal", "events",
        ],
        &rows,
    ));
    body.push_str(&next_link(
        "/console/runs",
        "before",
        full(&list)
            .then(|| list.last().map(|r| format!("{}.{}", r.created_at, r.id)))
            .flatten(),
        &s.query(),
    ));
    ok("Runs", &who, &body)
}

pub(super) async fn run_page(
    State(st): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(c): Query<Cursor>,
) -> Response {
    let who = match viewer(&caller) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let store = st.hosts.hub().store();
    let run = match store.get_run(&id).await {
        Ok(Some(r)) => r,
        Ok(None) => return error_page(StatusCode::NOT_FOUND, Some(&who), "no such run"),
        Err(e) => return backend(&who, e),
    };
    let after = c.after().and_then(|a| a.parse::<i64>().ok()).unwrap_or(0);
    let events = match store.run_events(&id, after, PAGE * 2).await {
        Ok(e) => e,
        Err(e) => return backend(&who, e),
    };
    let mut body = String::new();
    let _ = write!(
        body,
        "<table><tbody>\
         <tr><th>state</th><td id=\"run-state\">{}</td></tr>\
         <tr><th>agent</th><td>{}</td></tr><tr><th>host</th><td>{}</td></tr>\
         <tr><th>tenant</th><td>{}</td></tr><tr><th>goal</th><td>{}</td></tr>\
         <tr><th>created</th><td>{}</td></tr><tr><th>finished</th><td>{}</td></tr>\
         <tr><th>error</th><td>{}</td></tr><tr><th>summary</th><td>{}</td></tr>\
         </tbody></table><h2>Event log</h2>",
        run_state(run.state),
        code(&run.agent_id),
        code(&run.host_id),
        code(&run.tenant_id),
        esc(&clip(&run.goal, 2000)),
        esc(&time(run.created_at)),
        esc(&opt_time(run.finished_at)),
        esc(&format!(
            "{} {}",
            run.error_code.as_deref().unwrap_or(""),
            run.error_message.as_deref().unwrap_or("")
        )),
        esc(&clip(run.summary.as_deref().unwrap_or(""), 2000)),
    );
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            vec![
                e.seq.to_string(),
                esc(&e.timestamp),
                code(&e.kind),
                code(&clip(&e.payload.to_string(), 500)),
            ]
        })
        .collect();
    body.push_str(&table(&["seq", "time", "event", "payload"], &rows));
    body.push_str(&next_link(
        &format!("/console/runs/{}", html::url(&id)),
        "after",
        (events.len() == (PAGE * 2) as usize)
            .then(|| events.last().map(|e| e.seq.to_string()))
            .flatten(),
        "",
    ));
    ok(&format!("Run {}", run.id), &who, &body)
}

pub(super) async fn approvals(
    State(st): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Query(c): Query<Cursor>,
) -> Response {
    let who = match viewer(&caller) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let after = split_cursor(c.after());
    let list = match st
        .hosts
        .hub()
        .store()
        .page_approvals(ApprovalStatus::Pending, after, PAGE)
        .await
    {
        Ok(l) => l,
        Err(e) => return backend(&who, e),
    };
    let csrf = who.csrf.as_deref().unwrap_or("");
    let now = now_ms();
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|a| {
            let path = html::url(&a.id);
            vec![
                code(&a.id),
                link(&format!("/console/runs/{}", html::url(&a.run_id)), &a.run_id),
                code(&a.host_id),
                esc(&clip(&a.action, 500)),
                esc(&a.risk_level),
                esc(&format!("{} (expires in {})", time(a.created_at), span(a.expires_at - now))),
                format!(
                    "{} {}",
                    post_button(&format!("/console/approvals/{path}/grant"), csrf, "Grant", ""),
                    post_button(
                        &format!("/console/approvals/{path}/deny"),
                        csrf,
                        "Deny",
                        "<input name=\"reason\" placeholder=\"reason (optional)\" maxlength=\"500\"> "
                    )
                ),
            ]
        })
        .collect();
    let mut body = notice(&c, &who);
    let _ = write!(
        body,
        "<p class=\"muted\">Decisions are recorded with your operator name ({}) and sent to the host.</p>",
        esc(&who.name)
    );
    body.push_str(&table(
        &[
            "approval_id",
            "run",
            "host",
            "action",
            "risk",
            "requested",
            "decision",
        ],
        &rows,
    ));
    body.push_str(&next_link(
        "/console/approvals",
        "after",
        full(&list)
            .then(|| list.last().map(|a| format!("{}.{}", a.created_at, a.id)))
            .flatten(),
        "",
    ));
    ok("Pending approvals", &who, &body)
}

#[derive(Deserialize)]
pub(super) struct DecisionForm {
    #[serde(default)]
    pub(super) csrf: String,
    pub(super) reason: Option<String>,
}

pub(super) async fn decide(
    st: ConsoleState,
    caller: Caller,
    id: String,
    grant: bool,
    f: DecisionForm,
) -> Response {
    let who = match actor(&caller, &f.csrf) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let reason = f.reason.as_deref().map(str::trim).filter(|r| !r.is_empty());
    match st.hosts.decide(&id, None, grant, &who.name, reason).await {
        Ok(a) => {
            tracing::info!(operator = %who.name, approval = %a.id, status = a.status.as_str(), "approval decided in the console");
            see_other(&format!(
                "/console/approvals?notice=approval_{}",
                a.status.as_str()
            ))
        }
        Err(e) => {
            let status = ClientError::from(&e).status;
            error_page(status, Some(&who), &e.message)
        }
    }
}

pub(super) async fn approval_grant(
    State(st): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Form(f): Form<DecisionForm>,
) -> Response {
    decide(st, caller, id, true, f).await
}

pub(super) async fn approval_deny(
    State(st): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Form(f): Form<DecisionForm>,
) -> Response {
    decide(st, caller, id, false, f).await
}
