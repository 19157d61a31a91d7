//! Signing in, sessions and CSRF: an operator token exchanged for a session cookie (or a
//! Bearer token for scripts), and the checks every page and form runs first.

use super::*;

// -------------------------------------------------------------------------------------
// sign-in, sessions, CSRF

/// A signed-in operator. `csrf` is the session's form token; None for a Bearer caller.
pub(super) struct Operator {
    pub(super) name: String,
    pub(super) csrf: Option<String>,
}

#[derive(serde::Serialize, Deserialize)]
pub(super) struct Session {
    pub(super) operator: String,
    pub(super) csrf: String,
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

/// The internal listener speaks plain HTTP; behind a TLS-terminating proxy the cookie is
/// marked `Secure`.
pub(super) fn over_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
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

pub(super) fn token_operator(st: &ConsoleState, presented: &str) -> Option<String> {
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
pub(super) async fn identify(
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
pub(super) async fn viewer(st: &ConsoleState, headers: &HeaderMap) -> Result<Operator, Response> {
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
pub(super) async fn actor(
    st: &ConsoleState,
    headers: &HeaderMap,
    csrf: &str,
) -> Result<Operator, Response> {
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
pub(super) struct CsrfForm {
    #[serde(default)]
    pub(super) csrf: String,
}

pub(super) async fn logout(
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
