//! The overview, tenants and their API keys (created, shown once, revoked).

use std::fmt::Write as _;

use axum::extract::{Extension, Form, Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use switchyard_core::error::BackendError;
use switchyard_core::ids::now_ms;

use super::auth::{Caller, CsrfForm, Operator, actor, viewer};
use super::html::{code, esc, link, next_link, opt_time, post_button, table, time};
use super::{
    COUNT_CAP, ConsoleState, Cursor, PAGE, backend, capped, charts, error_page, full, html, notice,
    ok, pulse, see_other,
};

pub(super) async fn overview(
    State(st): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
) -> Response {
    let who = match viewer(&caller) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let o = match st.hosts.hub().store().overview(COUNT_CAP).await {
        Ok(o) => o,
        Err(e) => return backend(&who, e),
    };
    let mut body = String::from("<div class=\"cards\">");
    for (label, n, href) in [
        ("tenants", o.tenants, "/console/tenants"),
        ("connector_ids", o.connectors, "/console/connectors"),
        (
            "offline connectors",
            o.connectors_offline,
            "/console/connectors",
        ),
        ("channels", o.channels, "/console/channels"),
        ("bound channels", o.bound_channels, "/console/bindings"),
        ("outbox messages", o.outbox, "/console/channels"),
        ("failed deliveries", o.outbox_failed, "/console/failures"),
        ("hosts online", o.hosts_online, "/console/hosts"),
        (
            "pending approvals",
            o.approvals_pending,
            "/console/approvals",
        ),
    ] {
        let _ = write!(
            body,
            "<a class=\"card\" href=\"{href}\"><b>{}</b>{}</a>",
            esc(&capped(n)),
            esc(label)
        );
    }
    body.push_str("</div>");
    let _ = write!(
        body,
        "<p class=\"muted\">Pod {} · counts stop at {COUNT_CAP}.</p>",
        esc(st.hosts.hub().pod_id())
    );
    let (pods, span) = pulse(&st).await;
    let _ = write!(
        body,
        "<h2>Last {}</h2><p class=\"muted\" id=\"pulse-pods\" data-pods=\"{}\">A point per {} from \
         each pod's own counters ({} reporting: the thick lines are the deployment's sum, the \
         thin ones each pod's).</p>",
        esc(&span),
        pods.len(),
        esc(&html::span(st.pulse.interval_ms())),
        pods.len()
    );
    let at = charts::points(now_ms(), st.pulse.interval_ms());
    body.push_str(&charts::section(&charts::deployment(&pods, &at), &span));
    ok("Overview", &who, &body)
}

/// Every pod's pulse rows and how far back the charts reach.
async fn pulse(st: &ConsoleState) -> (Vec<pulse::PodRows>, String) {
    let pods = st.pulse.pods().await;
    let span = html::span(st.pulse.interval_ms() * pulse::POINTS as i64);
    (pods, span)
}

pub(super) async fn tenants(
    State(st): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Query(c): Query<Cursor>,
) -> Response {
    let who = match viewer(&caller) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let list = match st.hosts.hub().store().page_tenants(c.after(), PAGE).await {
        Ok(l) => l,
        Err(e) => return backend(&who, e),
    };
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|t| {
            vec![
                link(&format!("/console/tenants/{}", html::url(&t.id)), &t.name),
                code(&t.id),
                esc(&time(t.created_at)),
            ]
        })
        .collect();
    let mut body = notice(&c, &who);
    body.push_str(&table(&["name", "tenant_id", "created"], &rows));
    body.push_str(&next_link(
        "/console/tenants",
        "after",
        full(&list)
            .then(|| list.last().map(|t| t.id.clone()))
            .flatten(),
        "",
    ));
    let _ = write!(
        body,
        "<h2>New tenant</h2>{}",
        post_button(
            "/console/tenants",
            who.csrf.as_deref().unwrap_or(""),
            "Create tenant",
            "<label>Name <input name=\"name\" required maxlength=\"100\"></label> "
        )
    );
    ok("Tenants", &who, &body)
}

#[derive(Deserialize)]
pub(super) struct NameForm {
    #[serde(default)]
    pub(super) csrf: String,
    #[serde(default)]
    pub(super) name: String,
}

/// The one answer that shows a secret: the new API key, once, never stored or cached.
pub(super) fn key_shown_once(
    who: &Operator,
    title: &str,
    intro: &str,
    key: &str,
    back: &str,
) -> Response {
    let body = format!(
        "<p>{}</p><p class=\"notice\">API key (shown once, copy it now): <code id=\"new-key\">{}</code></p><p>{}</p>",
        esc(intro),
        esc(key),
        link(back, "Back")
    );
    ok(title, who, &body)
}

pub(super) async fn tenant_create(
    State(st): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Form(f): Form<NameForm>,
) -> Response {
    let who = match actor(&caller, &f.csrf) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let name = f.name.trim();
    if name.is_empty() || name.len() > 100 || name.chars().any(char::is_control) {
        return error_page(
            StatusCode::BAD_REQUEST,
            Some(&who),
            "a tenant name is 1 to 100 printable characters",
        );
    }
    match switchyard_core::engine::create_tenant(st.hosts.hub().store().as_ref(), name).await {
        Ok((t, key)) => {
            tracing::info!(operator = %who.name, tenant = %t.id, "tenant created in the console");
            key_shown_once(
                &who,
                "Tenant created",
                &format!(
                    "Tenant {} ({}) was created with its first API key.",
                    t.name, t.id
                ),
                key.key.expose(),
                &format!("/console/tenants/{}", html::url(&t.id)),
            )
        }
        Err(e) if e.kind == switchyard_core::ErrorKind::Conflict => error_page(
            StatusCode::CONFLICT,
            Some(&who),
            "a tenant with that name exists",
        ),
        Err(e) => backend(&who, e),
    }
}

pub(super) async fn tenant_page(
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
    let tenant = match store.get_tenant(&id).await {
        Ok(Some(t)) => t,
        Ok(None) => return error_page(StatusCode::NOT_FOUND, Some(&who), "no such tenant"),
        Err(e) => return backend(&who, e),
    };
    let keys = match store.tenant_keys(&id).await {
        Ok(k) => k,
        Err(e) => return backend(&who, e),
    };
    let csrf = who.csrf.as_deref().unwrap_or("");
    let rows: Vec<Vec<String>> = keys
        .iter()
        .map(|k| {
            let state = match k.revoked_at {
                Some(at) => format!("<span class=\"bad\">revoked {}</span>", esc(&time(at))),
                None => "<span class=\"ok\">active</span>".into(),
            };
            let action = if k.revoked_at.is_none() {
                post_button(
                    &format!("/console/keys/{}/revoke", html::url(&k.id)),
                    csrf,
                    "Revoke",
                    "",
                )
            } else {
                String::new()
            };
            vec![
                code(&k.id),
                esc(&time(k.created_at)),
                esc(&opt_time(k.last_used_at)),
                state,
                action,
            ]
        })
        .collect();
    let mut body = notice(&c, &who);
    let _ = write!(
        body,
        "<p>tenant_id {} · created {}</p><h2>API keys</h2>",
        code(&tenant.id),
        esc(&time(tenant.created_at))
    );
    body.push_str(&table(
        &["key id", "created", "last used", "state", ""],
        &rows,
    ));
    body.push_str(&post_button(
        &format!("/console/tenants/{}/keys", html::url(&tenant.id)),
        csrf,
        "Create API key",
        "",
    ));
    match tenant_now(&st, &tenant.id).await {
        Ok(now) => body.push_str(&now),
        Err(e) => return backend(&who, e),
    }
    let pods = st.pulse.tenant_pods(&tenant.id).await;
    let span = html::span(st.pulse.interval_ms() * pulse::POINTS as i64);
    let at = charts::points(now_ms(), st.pulse.interval_ms());
    let _ = write!(
        body,
        "<h2>This tenant, last {}</h2><p class=\"muted\">The tenant's own messages and tool \
         calls, counted by each pod for its {} busiest tenants.</p>",
        esc(&span),
        pulse::TENANTS_PUBLISHED
    );
    let mine = charts::tenant(&pods, &at);
    body.push_str(&charts::section(&mine, &span));
    ok(&format!("Tenant {}", tenant.name), &who, &body)
}

/// The tenant's own figures now, from the store: channels and live sockets (bounded
/// counts), and the outbox of its first page of channels, with links to its filtered pages.
async fn tenant_now(st: &ConsoleState, tenant_id: &str) -> Result<String, BackendError> {
    let store = st.hosts.hub().store();
    let channels = store.count_tenant_channels(tenant_id, COUNT_CAP).await?;
    let sockets = store.count_tenant_sockets(tenant_id, COUNT_CAP).await?;
    let filter = switchyard_core::model::ConsoleFilter {
        tenant_id: Some(tenant_id.to_owned()),
        ..Default::default()
    };
    let first = store.search_channels(&filter, None, false, PAGE).await?;
    let pending: u64 = first.iter().map(|c| c.pending).sum();
    let failed: u64 = first.iter().map(|c| c.failed).sum();
    let of = if full(&first) {
        format!(" (in its first {PAGE} channels)")
    } else {
        String::new()
    };
    let q = format!("?tenant={}", html::url(tenant_id));
    let mut out = String::from("<h2>This tenant now</h2><div class=\"cards\" id=\"tenant-now\">");
    for (label, n, href) in [
        (
            "channels",
            capped(channels),
            format!("/console/channels{q}"),
        ),
        (
            "live sockets",
            capped(sockets),
            format!("/console/channels{q}"),
        ),
        (
            &*format!("outbox messages{of}"),
            pending.to_string(),
            format!("/console/channels{q}"),
        ),
        (
            &*format!("failed deliveries{of}"),
            failed.to_string(),
            format!("/console/failures{q}"),
        ),
    ] {
        let _ = write!(
            out,
            "<a class=\"card\" href=\"{}\"><b>{}</b>{}</a>",
            esc(&href),
            esc(&n),
            esc(label)
        );
    }
    let _ = write!(
        out,
        "</div><p>{} · {} · {} · {}</p>",
        link(&format!("/console/channels{q}"), "its channels"),
        link(&format!("/console/bindings{q}"), "its bindings"),
        link(&format!("/console/failures{q}"), "its failures"),
        link(&format!("/console/runs{q}"), "its runs")
    );
    Ok(out)
}

pub(super) async fn key_create(
    State(st): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Form(f): Form<CsrfForm>,
) -> Response {
    let who = match actor(&caller, &f.csrf) {
        Ok(w) => w,
        Err(r) => return r,
    };
    match st.hosts.hub().store().get_tenant(&id).await {
        Ok(Some(_)) => {}
        Ok(None) => return error_page(StatusCode::NOT_FOUND, Some(&who), "no such tenant"),
        Err(e) => return backend(&who, e),
    }
    match switchyard_core::engine::create_key(st.hosts.hub().store().as_ref(), &id).await {
        Ok(key) => {
            tracing::info!(operator = %who.name, tenant = %id, key_id = %key.id, "api key created in the console");
            key_shown_once(
                &who,
                "API key created",
                &format!("Key {} of tenant {id}.", key.id),
                key.key.expose(),
                &format!("/console/tenants/{}", html::url(&id)),
            )
        }
        Err(e) => backend(&who, e),
    }
}

pub(super) async fn key_revoke(
    State(st): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Form(f): Form<CsrfForm>,
) -> Response {
    let who = match actor(&caller, &f.csrf) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let store = st.hosts.hub().store();
    let key = match store.get_api_key(&id).await {
        Ok(Some(k)) => k,
        Ok(None) => return error_page(StatusCode::NOT_FOUND, Some(&who), "no such key"),
        Err(e) => return backend(&who, e),
    };
    if let Err(e) = store.revoke_api_key(&id, now_ms()).await {
        return backend(&who, e);
    }
    tracing::info!(operator = %who.name, key_id = %id, "api key revoked in the console");
    see_other(&format!(
        "/console/tenants/{}?notice=key_revoked",
        html::url(&key.tenant_id)
    ))
}
