//! The delivery journal in the console: a message's timeline (`/console/messages/{id}`,
//! oldest step first, with the time since the first step) and a channel's newest steps
//! (`/console/channels/{id}/journal`, keyset-paged). Ids, step names and clipped codes only;
//! the journal holds no message text.

use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use switchyard_core::model::JournalRecord;

use super::auth::{Caller, viewer};
use super::html::{self, code, esc, link, next_link, table, time};
use super::{ConsoleState, Cursor, PAGE, backend, error_page, ok};

/// Steps of one message shown at most.
const MESSAGE_STEPS: u32 = 500;

/// An id in `<code>`, linked to `href`.
fn code_link(href: &str, id: &str) -> String {
    format!("<a href=\"{}\">{}</a>", esc(href), code(id))
}

/// A message id linked to its timeline.
pub(super) fn message_link(message_id: &str) -> String {
    code_link(
        &format!("/console/messages/{}", html::url(message_id)),
        message_id,
    )
}

/// A channel id linked to its journal.
pub(super) fn channel_link(channel_id: &str) -> String {
    code_link(
        &format!("/console/channels/{}/journal", html::url(channel_id)),
        channel_id,
    )
}

fn step_cell(e: &JournalRecord) -> String {
    let class = match (e.step.as_str(), e.detail.as_str()) {
        ("acked", d)
            if d.starts_with("accepted") || d.starts_with("duplicate") || d == "written" =>
        {
            "ok"
        }
        ("acked" | "attempt", d) if d.starts_with("rejected") || d.starts_with("failed") => "bad",
        ("acked" | "attempt", d) if d.starts_with("retry") || d == "timeout" => "warn",
        ("expired", _) => "bad",
        _ => "",
    };
    format!("<span class=\"{class}\">{}</span>", esc(&e.step))
}

pub(super) async fn message_page(
    State(st): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    let who = match viewer(&caller) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let steps = match st
        .hosts
        .hub()
        .store()
        .journal_for_message(&id, MESSAGE_STEPS)
        .await
    {
        Ok(s) => s,
        Err(e) => return backend(&who, e),
    };
    if steps.is_empty() {
        return error_page(
            StatusCode::NOT_FOUND,
            Some(&who),
            "nothing is journaled for this message (never seen, or purged)",
        );
    }
    let first = steps[0].at;
    let rows: Vec<Vec<String>> = steps
        .iter()
        .map(|e| {
            vec![
                esc(&time(e.at)),
                format!("+{} ms", e.at - first),
                step_cell(e),
                code(&e.detail),
                code(&e.pod_id),
                channel_link(&e.channel_id),
            ]
        })
        .collect();
    let mut body = format!(
        "<p>Message {} of tenant {}: each step with its pod, oldest first.</p>",
        code(&id),
        link(
            &format!("/console/tenants/{}", html::url(&steps[0].tenant_id)),
            &steps[0].tenant_id
        ),
    );
    body.push_str("<div id=\"timeline\">");
    body.push_str(&table(
        &["time", "since first", "step", "detail", "pod", "channel"],
        &rows,
    ));
    body.push_str("</div>");
    ok("Message timeline", &who, &body)
}

pub(super) async fn channel_page(
    State(st): State<ConsoleState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(c): Query<Cursor>,
) -> Response {
    let who = match viewer(&caller) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let before = c.before.as_deref().and_then(|b| b.parse::<i64>().ok());
    let steps = match st
        .hosts
        .hub()
        .store()
        .journal_for_channel(&id, before, PAGE)
        .await
    {
        Ok(s) => s,
        Err(e) => return backend(&who, e),
    };
    let rows: Vec<Vec<String>> = steps
        .iter()
        .map(|e| {
            vec![
                esc(&time(e.at)),
                message_link(&e.message_id),
                step_cell(e),
                code(&e.detail),
                code(&e.pod_id),
            ]
        })
        .collect();
    let mut body = format!(
        "<p>Channel {}: its messages' newest steps first.</p>",
        code(&id)
    );
    body.push_str(&table(&["time", "message", "step", "detail", "pod"], &rows));
    body.push_str(&next_link(
        &format!("/console/channels/{}/journal", html::url(&id)),
        "before",
        (steps.len() == PAGE as usize)
            .then(|| steps.last().map(|e| e.id.to_string()))
            .flatten(),
        "",
    ));
    ok("Channel journal", &who, &body)
}
