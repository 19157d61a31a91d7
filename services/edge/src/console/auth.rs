//! Signing in, sessions and CSRF: an operator token exchanged for a session cookie (or a
//! Bearer token for scripts), and the checks every page and form runs first.

use std::fmt::Write as _;
use std::time::Duration;

use axum::extract::{Extension, Form, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use serde::Deserialize;
use switchyard_core::crypto::{ct_eq, sha256_hex};
use switchyard_core::error::BackendError;
use switchyard_core::ids::random_secret;

use super::html::esc;
use super::{
    ConsoleState, LOGIN_COOKIE, LOGIN_TTL, SESSION_COOKIE, SESSION_TTL, error_page, page, see_other,
};
use crate::operators::Denied;

// -------------------------------------------------------------------------------------
// sign-in, sessions, CSRF

/// A signed-in operator. `csrf` is the session's form token; None for a Bearer caller.
#[derive(Clone)]
pub(super) struct Operator {
    pub(super) name: String,
    pub(super) csrf: Option<String>,
}

/// Who is calling a console page, decided by [`guard`] before the page's handler runs:
/// None = signed out.
#[derive(Clone)]
pub(super) struct Caller(pub(super) Option<Operator>);

#[derive(serde::Serialize, Deserialize)]
pub(super) struct Session {
    pub(super) operator: String,
    pub(super) csrf: String,
    /// The fingerprint of the token the session was opened with (absent in sessions of
    /// older builds, which thus end).
    #[serde(default)]
    pub(super) token: String,
}

pub(super) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

/// The admin listener speaks plain HTTP; reached through a TLS-terminating proxy (which says
/// so in `X-Forwarded-Proto` or in the standard `Forwarded` header, RFC 7239), the cookie is
/// marked `Secure`.
pub(super) fn over_tls(headers: &HeaderMap) -> bool {
    let xfp = headers
        .get_all("x-forwarded-proto")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.trim().eq_ignore_ascii_case("https"));
    let forwarded = headers
        .get_all(header::FORWARDED)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split([',', ';']))
        .filter_map(|kv| kv.trim().split_once('='))
        .any(|(k, v)| {
            k.trim().eq_ignore_ascii_case("proto")
                && v.trim().trim_matches('"').eq_ignore_ascii_case("https")
        });
    xfp || forwarded
}

pub(super) fn set_cookie(
    headers: &HeaderMap,
    name: &str,
    value: &str,
    max_age: Duration,
) -> HeaderValue {
    let secure = if over_tls(headers) { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{name}={value}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        max_age.as_secs()
    ))
    .unwrap_or_else(|_| HeaderValue::from_static(""))
}

pub(super) fn session_key(id: &str) -> String {
    // Only a hash of the cookie is stored, so the ephemeral state cannot be replayed as one.
    format!("console-session:{}", sha256_hex(id.as_bytes()))
}

/// The operator of a live session cookie, if its token is still the operator's.
async fn session(st: &ConsoleState, headers: &HeaderMap) -> Result<Option<Operator>, BackendError> {
    let Some(id) = cookie(headers, SESSION_COOKIE).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let Some(raw) = st.hosts.hub().ephemeral().get(&session_key(id)).await? else {
        return Ok(None);
    };
    let Ok(s) = serde_json::from_slice::<Session>(&raw) else {
        return Ok(None);
    };
    // A token removed or replaced in the configuration ends the sessions opened with it.
    if !st.operators.holds(&s.operator, &s.token) {
        return Ok(None);
    }
    Ok(Some(Operator {
        name: s.operator,
        csrf: Some(s.csrf),
    }))
}

/// A refusal of operator authentication as a console page (with `Retry-After` on 429/503).
fn denied_page(d: Denied) -> Response {
    let mut r = error_page(d.status(), None, d.message());
    if let Some(after) = d.client_error().effective_retry_after() {
        r.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(after.as_secs().max(1)),
        );
    }
    r
}

/// Runs before every console page and form (not sign-in): decides the caller from a Bearer
/// operator token (through the limiter) or a live session cookie, before the request's
/// query or form is read.
pub(super) async fn guard(
    State(st): State<ConsoleState>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if st.operators.is_empty() {
        return disabled();
    }
    let caller = if let Some(b) = crate::operators::bearer(req.headers()) {
        let source = crate::operators::source(req.extensions());
        match st.operators.authenticate(source, b).await {
            Ok((name, _)) => Some(Operator { name, csrf: None }),
            Err(d) => return denied_page(d),
        }
    } else {
        match session(&st, req.headers()).await {
            Ok(Some(op)) => {
                if let Err(d) = st.operators.admit(&op.name).await {
                    return denied_page(d);
                }
                Some(op)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "console session lookup failed");
                return error_page(
                    StatusCode::SERVICE_UNAVAILABLE,
                    None,
                    "session state is unavailable; retry",
                );
            }
        }
    };
    req.extensions_mut().insert(Caller(caller));
    next.run(req).await
}

/// A page's caller, or the sign-in page to go to.
// The error is the answer itself, returned at once by the handler: boxing it buys nothing.
#[allow(clippy::result_large_err)]
pub(super) fn viewer(caller: &Caller) -> Result<Operator, Response> {
    caller.0.clone().ok_or_else(|| see_other("/console/login"))
}

/// The caller of a POST: signed in, and for a cookie session the form's CSRF token must be
/// the session's.
// As `viewer`: the error is the answer.
#[allow(clippy::result_large_err)]
pub(super) fn actor(caller: &Caller, csrf: &str) -> Result<Operator, Response> {
    let Some(op) = caller.0.clone() else {
        return Err(error_page(
            StatusCode::FORBIDDEN,
            None,
            "sign in first (the session has ended)",
        ));
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

pub(super) fn disabled() -> Response {
    error_page(
        StatusCode::NOT_FOUND,
        None,
        "the console is disabled: no operator tokens are configured (operator_tokens)",
    )
}

pub(super) async fn login_form(State(st): State<ConsoleState>, headers: HeaderMap) -> Response {
    if st.operators.is_empty() {
        return disabled();
    }
    login_page(&headers, StatusCode::OK, None)
}

/// The sign-in form. Its CSRF token is a double submit: the same random value in a short
/// cookie and in the form.
pub(super) fn login_page(
    headers: &HeaderMap,
    status: StatusCode,
    problem: Option<&str>,
) -> Response {
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
pub(super) struct LoginForm {
    #[serde(default)]
    pub(super) csrf: String,
    #[serde(default)]
    pub(super) token: String,
}

pub(super) async fn login(
    State(st): State<ConsoleState>,
    conn: Option<Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
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
    // Guessing is bounded per source address; the operator elsewhere is not locked out.
    let source = conn.map(|c| c.0.0.ip());
    let (name, token) = match st.operators.authenticate(source, &f.token).await {
        Ok(found) => found,
        Err(Denied::Unauthorized) => {
            tracing::info!("console sign-in refused");
            return login_page(
                &headers,
                StatusCode::UNAUTHORIZED,
                Some("that is not an operator token"),
            );
        }
        Err(d) => {
            let mut r = login_page(&headers, d.status(), Some(d.message()));
            if let Some(after) = d.client_error().effective_retry_after() {
                r.headers_mut().insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(after.as_secs().max(1)),
                );
            }
            return r;
        }
    };
    let id = random_secret(32);
    let session = Session {
        operator: name.clone(),
        csrf: random_secret(16),
        token,
    };
    let Ok(raw) = serde_json::to_vec(&session) else {
        return error_page(StatusCode::INTERNAL_SERVER_ERROR, None, "internal error");
    };
    if let Err(e) = st
        .hosts
        .hub()
        .ephemeral()
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
pub(super) struct CsrfForm {
    #[serde(default)]
    pub(super) csrf: String,
}

pub(super) async fn logout(
    State(st): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Form(f): Form<CsrfForm>,
) -> Response {
    if let Err(r) = actor(&caller, &f.csrf) {
        return r;
    }
    if let Some(id) = cookie(&headers, SESSION_COOKIE)
        && let Err(e) = st.hosts.hub().ephemeral().delete(&session_key(id)).await
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

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    /// Issue 23, finding 7: the session cookie is `Secure` wherever the console is reached
    /// over TLS, whichever header the proxy uses to say so.
    #[test]
    fn the_cookie_is_secure_behind_any_tls_proxy() {
        let secure = |h: &HeaderMap| {
            set_cookie(h, SESSION_COOKIE, "x", SESSION_TTL)
                .to_str()
                .unwrap()
                .contains("; Secure")
        };
        assert!(!secure(&headers(&[])));
        assert!(secure(&headers(&[("x-forwarded-proto", "https")])));
        assert!(secure(&headers(&[("x-forwarded-proto", "https, http")])));
        assert!(secure(&headers(&[(
            "forwarded",
            "for=192.0.2.60;proto=https;by=203.0.113.43"
        )])));
        assert!(secure(&headers(&[(
            "forwarded",
            "for=\"[2001:db8::1]\";proto=\"HTTPS\""
        )])));
        assert!(!secure(&headers(&[(
            "forwarded",
            "for=192.0.2.60;proto=http"
        )])));
    }
}
