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

mod auth;
mod channels;
mod charts;
mod hosts;
mod html;
mod journal;
mod pulse;
mod search;
mod tenants;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use switchyard_core::error::BackendError;
use switchyard_core::hosts::Hosts;

use html::{esc, layout};

pub use pulse::{ConsoleConfig, Pulse};

use auth::{Operator, guard, login, login_form, logout};
use channels::{bindings, channels, connectors, failures};
use hosts::{approval_deny, approval_grant, approvals, hosts_page, run_page, runs};
use tenants::{key_create, key_revoke, overview, tenant_create, tenant_page, tenants};

const SESSION_COOKIE: &str = "sy_console";
const LOGIN_COOKIE: &str = "sy_console_login";
const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
const LOGIN_TTL: Duration = Duration::from_secs(600);
/// Rows per page.
const PAGE: u32 = 50;
/// The overview counts stop here ("10000+").
const COUNT_CAP: u64 = 10_000;
const MAX_FORM_BYTES: usize = 16 * 1024;

#[derive(Clone)]
pub struct ConsoleState {
    pub hosts: Arc<Hosts>,
    /// This pod's sampler of the charts' series, and the reader of every pod's.
    pub pulse: Arc<Pulse>,
    /// Operators, with their limiter.
    pub operators: crate::operators::Operators,
}

/// `/console` routes (mounted on the internal listener only).
pub fn router(state: ConsoleState) -> Router {
    // Every page and form but sign-in: the caller is decided before the request is read.
    let pages = Router::new()
        .route("/console", get(overview))
        .route("/console/", get(overview))
        .route("/console/logout", post(logout))
        .route("/console/tenants", get(tenants).post(tenant_create))
        .route("/console/tenants/{id}", get(tenant_page))
        .route("/console/tenants/{id}/keys", post(key_create))
        .route("/console/keys/{id}/revoke", post(key_revoke))
        .route("/console/connectors", get(connectors))
        .route("/console/channels", get(channels))
        .route("/console/bindings", get(bindings))
        .route("/console/failures", get(failures))
        .route("/console/messages/{id}", get(journal::message_page))
        .route("/console/channels/{id}/journal", get(journal::channel_page))
        .route("/console/hosts", get(hosts_page))
        .route("/console/runs", get(runs))
        .route("/console/runs/{id}", get(run_page))
        .route("/console/approvals", get(approvals))
        .route("/console/approvals/{id}/grant", post(approval_grant))
        .route("/console/approvals/{id}/deny", post(approval_deny))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), guard));
    Router::new()
        .route("/console/login", get(login_form).post(login))
        .merge(pages)
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
    let r = e.refusal();
    let status = StatusCode::from_u16(r.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    error_page(status, Some(who), r.message())
}

fn see_other(to: &str) -> Response {
    hardened(Redirect::to(to).into_response())
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

/// The notice a redirect asked for: a code from a closed set, rendered with fixed text, so
/// a link cannot put words of its own on a console page.
fn notice(c: &Cursor, who: &Operator) -> String {
    let text = match c.notice.as_deref() {
        Some("approval_granted") => format!("The approval was granted by {}.", who.name),
        Some("approval_denied") => format!("The approval was denied by {}.", who.name),
        Some("key_revoked") => "The API key was revoked.".to_owned(),
        _ => return String::new(),
    };
    format!("<p class=\"notice\" id=\"notice\">{}</p>", esc(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(n: &str) -> Cursor {
        Cursor {
            notice: Some(n.to_owned()),
            ..Cursor::default()
        }
    }

    /// Issue 23, finding 7: `?notice=` took free text into the page; now only codes.
    #[test]
    fn a_notice_is_a_code_never_free_text() {
        let who = Operator {
            name: "alice".into(),
            csrf: None,
        };
        assert_eq!(
            notice(&with("Your session expired: call +1 555 0100"), &who),
            ""
        );
        assert_eq!(notice(&with("<b>hi</b>"), &who), "");
        let granted = notice(&with("approval_granted"), &who);
        assert!(granted.contains("granted by alice"), "{granted}");
        assert!(notice(&with("key_revoked"), &who).contains("revoked"));
    }
}
