//! The operator console: server-rendered pages under `/console` on the internal listener
//! (next to `/metrics` and the operator API), behind the operator tokens.
//!
//! Signing in exchanges an operator token for a session: a random id in an `HttpOnly`,
//! `SameSite=Strict` cookie (`Secure` when the request came over TLS through a proxy), whose
//! hash keys the session (operator name and CSRF token) in the shared ephemeral state, so any
//! pod serves it and logout ends it everywhere. A `Bearer` operator token works too (scripts);
//! browsers never send that one on their own, so only cookie sessions need the CSRF token that
//! every form carries. Every page is a keyset-paginated, indexed query, and no page ever shows
//! a secret: API keys (but once, in the answer that creates one), tokens, signing or
//! encryption keys, bot tokens, binding credentials, pairing codes.

mod html;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Form, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use switchyard_core::crypto::{ct_eq, sha256_hex};
use switchyard_core::error::BackendError;
use switchyard_core::hosts::Hosts;
use switchyard_core::hoststore::ApprovalStatus;
use switchyard_core::ids::{now_ms, random_secret};
use switchyard_core::model::OutboxState;

use html::{
    clip, code, esc, layout, link, mask, next_link, opt_time, post_button, span, table, time,
};

const SESSION_COOKIE: &str = "sy_console";
const LOGIN_COOKIE: &str = "sy_console_login";
const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
const LOGIN_TTL: Duration = Duration::from_secs(600);
/// Rows per page.
const PAGE: u32 = 50;
/// The overview counts stop here ("10000+").
const COUNT_CAP: u64 = 10_000;
const MAX_FORM_BYTES: usize = 16 * 1024;
const LOGIN_ATTEMPTS_PER_MINUTE: u64 = 30;

#[derive(Clone)]
pub struct ConsoleState {
    pub hosts: Arc<Hosts>,
    /// Operators: (name, token).
    pub operators: Arc<Vec<(String, String)>>,
}

/// `/console` routes (mounted on the internal listener only).
pub fn router(state: ConsoleState) -> Router {
    Router::new()
        .route("/console", get(overview))
        .route("/console/", get(overview))
        .route("/console/login", get(login_form).post(login))
        .route("/console/logout", post(logout))
        .route("/console/tenants", get(tenants).post(tenant_create))
        .route("/console/tenants/{id}", get(tenant_page))
        .route("/console/tenants/{id}/keys", post(key_create))
        .route("/console/keys/{id}/revoke", post(key_revoke))
        .route("/console/connectors", get(connectors))
        .route("/console/channels", get(channels))
        .route("/console/bindings", get(bindings))
        .route("/console/failures", get(failures))
        .route("/console/hosts", get(hosts_page))
        .route("/console/runs", get(runs))
        .route("/console/runs/{id}", get(run_page))
        .route("/console/approvals", get(approvals))
        .route("/console/approvals/{id}/grant", post(approval_grant))
        .route("/console/approvals/{id}/deny", post(approval_deny))
        .layer(DefaultBodyLimit::max(MAX_FORM_BYTES))
        .with_state(state)
}

// -------------------------------------------------------------------------------------
// responses

/// Headers of every console answer: never cached, never framed, no script, no outside
/// resource, forms post only here.
fn hardened(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

fn page(status: StatusCode, title: &str, who: Option<&Operator>, body: &str) -> Response {
    let html = layout(
        title,
        who.map(|w| (w.name.as_str(), w.csrf.as_deref().unwrap_or(""))),
        body,
    );
    hardened(
        (
            status,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            html,
        )
            .into_response(),
    )
}

fn ok(title: &str, who: &Operator, body: &str) -> Response {
    page(StatusCode::OK, title, Some(who), body)
}

fn error_page(status: StatusCode, who: Option<&Operator>, message: &str) -> Response {
    page(
        status,
        status.canonical_reason().unwrap_or("Error"),
        who,
        &format!("<p class=\"bad\">{}</p>", esc(message)),
    )
}

fn backend(who: &Operator, e: BackendError) -> Response {
    tracing::warn!(error = %e, "backend error in the console");
    error_page(
        StatusCode::SERVICE_UNAVAILABLE,
        Some(who),
        "a backend is unavailable; retry",
    )
}

fn see_other(to: &str) -> Response {
    hardened(Redirect::to(to).into_response())
}

// -------------------------------------------------------------------------------------
// sign-in, sessions, CSRF

/// A signed-in operator. `csrf` is the session's form token; None for a Bearer caller.
struct Operator {
    name: String,
    csrf: Option<String>,
}

#[derive(serde::Serialize, Deserialize)]
struct Session {
    operator: String,
    csrf: String,
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

/// The internal listener speaks plain HTTP; behind a TLS-terminating proxy the cookie is
/// marked `Secure`.
fn over_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

fn set_cookie(headers: &HeaderMap, name: &str, value: &str, max_age: Duration) -> HeaderValue {
    let secure = if over_tls(headers) { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{name}={value}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        max_age.as_secs()
    ))
    .unwrap_or_else(|_| HeaderValue::from_static(""))
}

fn session_key(id: &str) -> String {
    // Only a hash of the cookie is stored, so the ephemeral state cannot be replayed as one.
    format!("console-session:{}", sha256_hex(id.as_bytes()))
}

fn token_operator(st: &ConsoleState, presented: &str) -> Option<String> {
    let presented = presented.trim();
    if presented.is_empty() {
        return None;
    }
    st.operators
        .iter()
        .find(|(_, token)| ct_eq(token.as_bytes(), presented.as_bytes()))
        .map(|(name, _)| name.clone())
}

/// Who is calling: a Bearer operator token, or a live session cookie.
async fn identify(
    st: &ConsoleState,
    headers: &HeaderMap,
) -> Result<Option<Operator>, BackendError> {
    if let Some(bearer) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    {
        return Ok(token_operator(st, bearer).map(|name| Operator { name, csrf: None }));
    }
    let Some(id) = cookie(headers, SESSION_COOKIE).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let Some(raw) = st.hosts.hub.ephemeral.get(&session_key(id)).await? else {
        return Ok(None);
    };
    let Ok(s) = serde_json::from_slice::<Session>(&raw) else {
        return Ok(None);
    };
    // A token removed from the configuration ends its sessions.
    if !st.operators.iter().any(|(n, _)| *n == s.operator) {
        return Ok(None);
    }
    Ok(Some(Operator {
        name: s.operator,
        csrf: Some(s.csrf),
    }))
}

/// A page's caller, or the answer to give instead (sign-in page, refusal).
async fn viewer(st: &ConsoleState, headers: &HeaderMap) -> Result<Operator, Response> {
    if st.operators.is_empty() {
        return Err(disabled());
    }
    match identify(st, headers).await {
        Ok(Some(op)) => Ok(op),
        Ok(None) if headers.contains_key(header::AUTHORIZATION) => Err(error_page(
            StatusCode::UNAUTHORIZED,
            None,
            "an operator token is required",
        )),
        Ok(None) => Err(see_other("/console/login")),
        Err(e) => {
            tracing::warn!(error = %e, "console session lookup failed");
            Err(error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                None,
                "session state is unavailable; retry",
            ))
        }
    }
}

/// The caller of a POST: as [`viewer`], and for a cookie session the form's CSRF token must
/// be the session's.
async fn actor(st: &ConsoleState, headers: &HeaderMap, csrf: &str) -> Result<Operator, Response> {
    let op = match viewer(st, headers).await {
        Ok(op) => op,
        Err(_) if !headers.contains_key(header::AUTHORIZATION) && !st.operators.is_empty() => {
            return Err(error_page(
                StatusCode::FORBIDDEN,
                None,
                "sign in first (the session has ended)",
            ));
        }
        Err(r) => return Err(r),
    };
    if let Some(expected) = &op.csrf
        && !ct_eq(expected.as_bytes(), csrf.as_bytes())
    {
        return Err(error_page(
            StatusCode::FORBIDDEN,
            Some(&op),
            "the form's CSRF token does not match this session; reload the page",
        ));
    }
    Ok(op)
}

fn disabled() -> Response {
    error_page(
        StatusCode::NOT_FOUND,
        None,
        "the console is disabled: no operator tokens are configured (operator_tokens)",
    )
}

async fn login_form(State(st): State<ConsoleState>, headers: HeaderMap) -> Response {
    if st.operators.is_empty() {
        return disabled();
    }
    login_page(&headers, StatusCode::OK, None)
}

/// The sign-in form. Its CSRF token is a double submit: the same random value in a short
/// cookie and in the form.
fn login_page(headers: &HeaderMap, status: StatusCode, problem: Option<&str>) -> Response {
    let csrf = random_secret(16);
    let mut body = String::new();
    if let Some(p) = problem {
        let _ = write!(body, "<p class=\"bad\">{}</p>", esc(p));
    }
    let _ = write!(
        body,
        "<form method=\"post\" action=\"/console/login\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <p><label>Operator token <input type=\"password\" name=\"token\" id=\"token\" \
         autocomplete=\"current-password\" required size=\"40\"></label></p>\
         <p><button type=\"submit\" id=\"login\">Sign in</button></p></form>\
         <p class=\"muted\">The token is one of the deployment's <code>operator_tokens</code>; \
         the console keeps a session, not the token.</p>",
        esc(&csrf)
    );
    let mut r = page(status, "Sign in", None, &body);
    r.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(headers, LOGIN_COOKIE, &csrf, LOGIN_TTL),
    );
    r
}

#[derive(Deserialize)]
struct LoginForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    token: String,
}

async fn login(
    State(st): State<ConsoleState>,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    if st.operators.is_empty() {
        return disabled();
    }
    let expected = cookie(&headers, LOGIN_COOKIE).unwrap_or_default();
    if expected.is_empty() || !ct_eq(expected.as_bytes(), f.csrf.as_bytes()) {
        return login_page(
            &headers,
            StatusCode::FORBIDDEN,
            Some("the sign-in form expired; try again"),
        );
    }
    // Bounds guessing: sign-in attempts per minute, across the deployment.
    match st
        .hosts
        .hub
        .ephemeral
        .incr("console-login-attempts", Duration::from_secs(60))
        .await
    {
        Ok(n) if n > LOGIN_ATTEMPTS_PER_MINUTE => {
            switchyard_core::limits::hit("console_login");
            return login_page(
                &headers,
                StatusCode::TOO_MANY_REQUESTS,
                Some("too many sign-in attempts; wait a minute"),
            );
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "counting console sign-in attempts failed"),
    }
    let Some(name) = token_operator(&st, &f.token) else {
        tracing::info!("console sign-in refused");
        return login_page(
            &headers,
            StatusCode::UNAUTHORIZED,
            Some("that is not an operator token"),
        );
    };
    let id = random_secret(32);
    let session = Session {
        operator: name.clone(),
        csrf: random_secret(16),
    };
    let Ok(raw) = serde_json::to_vec(&session) else {
        return error_page(StatusCode::INTERNAL_SERVER_ERROR, None, "internal error");
    };
    if let Err(e) = st
        .hosts
        .hub
        .ephemeral
        .put(&session_key(&id), raw, SESSION_TTL)
        .await
    {
        tracing::warn!(error = %e, "storing a console session failed");
        return error_page(
            StatusCode::SERVICE_UNAVAILABLE,
            None,
            "session state is unavailable; retry",
        );
    }
    tracing::info!(operator = %name, "console sign-in");
    let mut r = see_other("/console");
    let h = r.headers_mut();
    h.append(
        header::SET_COOKIE,
        set_cookie(&headers, SESSION_COOKIE, &id, SESSION_TTL),
    );
    h.append(
        header::SET_COOKIE,
        set_cookie(&headers, LOGIN_COOKIE, "", Duration::ZERO),
    );
    r
}

#[derive(Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

async fn logout(
    State(st): State<ConsoleState>,
    headers: HeaderMap,
    Form(f): Form<CsrfForm>,
) -> Response {
    if let Err(r) = actor(&st, &headers, &f.csrf).await {
        return r;
    }
    if let Some(id) = cookie(&headers, SESSION_COOKIE)
        && let Err(e) = st.hosts.hub.ephemeral.delete(&session_key(id)).await
    {
        tracing::warn!(error = %e, "ending a console session failed");
    }
    let mut r = see_other("/console/login");
    r.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(&headers, SESSION_COOKIE, "", Duration::ZERO),
    );
    r
}

// -------------------------------------------------------------------------------------
// pages

#[derive(Deserialize, Default)]
struct Cursor {
    after: Option<String>,
    before: Option<String>,
    notice: Option<String>,
}

impl Cursor {
    fn after(&self) -> Option<&str> {
        self.after.as_deref().filter(|s| !s.is_empty())
    }
}

/// `created_at.id` composite cursors.
fn split_cursor(c: Option<&str>) -> Option<(i64, &str)> {
    let (at, id) = c?.split_once('.')?;
    Some((at.parse().ok()?, id))
}

fn full<T>(rows: &[T]) -> bool {
    rows.len() == PAGE as usize
}

fn capped(n: u64) -> String {
    if n >= COUNT_CAP {
        format!("{COUNT_CAP}+")
    } else {
        n.to_string()
    }
}

fn notice(c: &Cursor) -> String {
    c.notice
        .as_deref()
        .map(|n| {
            format!(
                "<p class=\"notice\" id=\"notice\">{}</p>",
                esc(&clip(n, 300))
            )
        })
        .unwrap_or_default()
}

async fn overview(State(st): State<ConsoleState>, headers: HeaderMap) -> Response {
    let who = match viewer(&st, &headers).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let o = match st.hosts.hub.store.overview(COUNT_CAP).await {
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
        esc(&st.hosts.hub.pod_id)
    );
    ok("Overview", &who, &body)
}

async fn tenants(
    State(st): State<ConsoleState>,
    headers: HeaderMap,
    Query(c): Query<Cursor>,
) -> Response {
    let who = match viewer(&st, &headers).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let list = match st.hosts.hub.store.page_tenants(c.after(), PAGE).await {
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
    let mut body = notice(&c);
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
struct NameForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    name: String,
}

/// The one answer that shows a secret: the new API key, once, never stored or cached.
fn key_shown_once(who: &Operator, title: &str, intro: &str, key: &str, back: &str) -> Response {
    let body = format!(
        "<p>{}</p><p class=\"notice\">API key (shown once, copy it now): <code id=\"new-key\">{}</code></p><p>{}</p>",
        esc(intro),
        esc(key),
        link(back, "Back")
    );
    ok(title, who, &body)
}

async fn tenant_create(
    State(st): State<ConsoleState>,
    headers: HeaderMap,
    Form(f): Form<NameForm>,
) -> Response {
    let who = match actor(&st, &headers, &f.csrf).await {
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
    match switchyard_core::engine::create_tenant(st.hosts.hub.store.as_ref(), name).await {
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

async fn tenant_page(
    State(st): State<ConsoleState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(c): Query<Cursor>,
) -> Response {
    let who = match viewer(&st, &headers).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let store = &st.hosts.hub.store;
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
    let mut body = notice(&c);
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
    ok(&format!("Tenant {}", tenant.name), &who, &body)
}

async fn key_create(
    State(st): State<ConsoleState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<CsrfForm>,
) -> Response {
    let who = match actor(&st, &headers, &f.csrf).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    match st.hosts.hub.store.get_tenant(&id).await {
        Ok(Some(_)) => {}
        Ok(None) => return error_page(StatusCode::NOT_FOUND, Some(&who), "no such tenant"),
        Err(e) => return backend(&who, e),
    }
    match switchyard_core::engine::create_key(st.hosts.hub.store.as_ref(), &id).await {
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

async fn key_revoke(
    State(st): State<ConsoleState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<CsrfForm>,
) -> Response {
    let who = match actor(&st, &headers, &f.csrf).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let store = &st.hosts.hub.store;
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
        "/console/tenants/{}?notice={}",
        html::url(&key.tenant_id),
        html::url(&format!("key {id} revoked"))
    ))
}

async fn connectors(
    State(st): State<ConsoleState>,
    headers: HeaderMap,
    Query(c): Query<Cursor>,
) -> Response {
    let who = match viewer(&st, &headers).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let list = match st.hosts.hub.store.page_connectors(c.after(), PAGE).await {
        Ok(l) => l,
        Err(e) => return backend(&who, e),
    };
    let grace = st.hosts.hub.config.connector_grace.as_millis() as i64;
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

fn status_class(s: switchyard_protocol::ConnectionStatus) -> &'static str {
    use switchyard_protocol::ConnectionStatus as S;
    match s {
        S::Connected => "ok",
        S::Degraded => "warn",
        S::Expired | S::Revoked => "bad",
        _ => "muted",
    }
}

/// The Descriptor's target as shown: display name, and the account hint masked.
fn target(view: &serde_json::Value) -> String {
    let name = view["display_name"].as_str().unwrap_or("");
    let hint = view["account_hint"].as_str().map(mask);
    match (name.is_empty(), hint) {
        (true, None) => "<span class=\"muted\">—</span>".into(),
        (_, Some(h)) => format!("{} <span class=\"muted\">{}</span>", esc(name), esc(&h)),
        (false, None) => esc(name),
    }
}

fn channel_rows(
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
                code(&c.id),
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
fn health(c: &switchyard_core::model::ChannelSummary, now: i64) -> String {
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

const CHANNEL_HEADERS: [&str; 10] = [
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

async fn channels(
    State(st): State<ConsoleState>,
    headers: HeaderMap,
    Query(c): Query<Cursor>,
) -> Response {
    let who = match viewer(&st, &headers).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let list = match st
        .hosts
        .hub
        .store
        .page_channels(c.after(), false, PAGE)
        .await
    {
        Ok(l) => l,
        Err(e) => return backend(&who, e),
    };
    let mut body = table(&CHANNEL_HEADERS, &channel_rows(&list, false));
    body.push_str(&next_link(
        "/console/channels",
        "after",
        full(&list)
            .then(|| list.last().map(|t| t.id.clone()))
            .flatten(),
        "",
    ));
    ok("Channels", &who, &body)
}

async fn bindings(
    State(st): State<ConsoleState>,
    headers: HeaderMap,
    Query(c): Query<Cursor>,
) -> Response {
    let who = match viewer(&st, &headers).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let list = match st
        .hosts
        .hub
        .store
        .page_channels(c.after(), true, PAGE)
        .await
    {
        Ok(l) => l,
        Err(e) => return backend(&who, e),
    };
    let mut headers_ = CHANNEL_HEADERS.to_vec();
    headers_.push("health");
    let mut body = String::from(
        "<p class=\"muted\">Provider bindings (Telegram, WeChat, Feishu, webhook, agent hosts): \
         bound channels; credentials are never shown.</p>",
    );
    body.push_str(&table(&headers_, &channel_rows(&list, true)));
    body.push_str(&next_link(
        "/console/bindings",
        "after",
        full(&list)
            .then(|| list.last().map(|t| t.id.clone()))
            .flatten(),
        "",
    ));
    ok("Provider bindings", &who, &body)
}

async fn failures(
    State(st): State<ConsoleState>,
    headers: HeaderMap,
    Query(c): Query<Cursor>,
) -> Response {
    let who = match viewer(&st, &headers).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let before = c.before.as_deref().and_then(|b| b.parse::<i64>().ok());
    let list = match st.hosts.hub.store.page_failures(before, PAGE).await {
        Ok(l) => l,
        Err(e) => return backend(&who, e),
    };
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|f| {
            vec![
                esc(&time(f.created_at)),
                code(&f.channel_id),
                code(&f.card_id),
                code(&f.message_id),
                match f.state {
                    OutboxState::Failed => "<span class=\"bad\">failed</span>".into(),
                    OutboxState::Pending => "<span class=\"warn\">retrying</span>".into(),
                },
                f.attempts.to_string(),
                esc(&clip(&f.reason, 300)),
            ]
        })
        .collect();
    let mut body = table(
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
    );
    body.push_str(&next_link(
        "/console/failures",
        "before",
        full(&list)
            .then(|| list.last().map(|f| f.seq.to_string()))
            .flatten(),
        "",
    ));
    ok("Recent delivery failures", &who, &body)
}

async fn hosts_page(
    State(st): State<ConsoleState>,
    headers: HeaderMap,
    Query(c): Query<Cursor>,
) -> Response {
    let who = match viewer(&st, &headers).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let store = &st.hosts.hub.store;
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

fn run_state(s: switchyard_protocol::hosts::RunState) -> String {
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

async fn runs(
    State(st): State<ConsoleState>,
    headers: HeaderMap,
    Query(c): Query<Cursor>,
) -> Response {
    let who = match viewer(&st, &headers).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let before = split_cursor(c.before.as_deref());
    let list = match st.hosts.hub.store.page_runs(before, PAGE).await {
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
    let mut body = table(
        &[
            "run_id", "created", "agent", "host", "state", "goal", "events",
        ],
        &rows,
    );
    body.push_str(&next_link(
        "/console/runs",
        "before",
        full(&list)
            .then(|| list.last().map(|r| format!("{}.{}", r.created_at, r.id)))
            .flatten(),
        "",
    ));
    ok("Runs", &who, &body)
}

async fn run_page(
    State(st): State<ConsoleState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(c): Query<Cursor>,
) -> Response {
    let who = match viewer(&st, &headers).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let store = &st.hosts.hub.store;
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

async fn approvals(
    State(st): State<ConsoleState>,
    headers: HeaderMap,
    Query(c): Query<Cursor>,
) -> Response {
    let who = match viewer(&st, &headers).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let after = split_cursor(c.after());
    let list = match st
        .hosts
        .hub
        .store
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
    let mut body = notice(&c);
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
struct DecisionForm {
    #[serde(default)]
    csrf: String,
    reason: Option<String>,
}

async fn decide(
    st: ConsoleState,
    headers: HeaderMap,
    id: String,
    grant: bool,
    f: DecisionForm,
) -> Response {
    let who = match actor(&st, &headers, &f.csrf).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let reason = f.reason.as_deref().map(str::trim).filter(|r| !r.is_empty());
    match st.hosts.decide(&id, None, grant, &who.name, reason).await {
        Ok(a) => {
            tracing::info!(operator = %who.name, approval = %a.id, status = a.status.as_str(), "approval decided in the console");
            see_other(&format!(
                "/console/approvals?notice={}",
                html::url(&format!("{} {} by {}", a.id, a.status.as_str(), who.name))
            ))
        }
        Err(e) => {
            let status = StatusCode::from_u16(e.code.http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            error_page(status, Some(&who), &e.message)
        }
    }
}

async fn approval_grant(
    State(st): State<ConsoleState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<DecisionForm>,
) -> Response {
    decide(st, headers, id, true, f).await
}

async fn approval_deny(
    State(st): State<ConsoleState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<DecisionForm>,
) -> Response {
    decide(st, headers, id, false, f).await
}
