//! The search form of the channels, bindings, failures and runs pages: what it may hold
//! (a tenant, a Card, a status from the page's closed set, an id prefix), the store filter it
//! becomes, and the query string that keeps it on the next page's link.

use std::fmt::Write as _;

use serde::Deserialize;
use switchyard_core::model::ConsoleFilter;

use super::html::{esc, url};

/// Longest tenant id, Card id or id prefix the form takes.
const MAX_FIELD: usize = 128;

/// The search fields of a page's query string; empty fields are absent.
#[derive(Deserialize, Default, Debug)]
pub struct Search {
    tenant: Option<String>,
    card: Option<String>,
    status: Option<String>,
    /// The start of an id.
    q: Option<String>,
}

fn given(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

fn plain(v: &str) -> bool {
    v.len() <= MAX_FIELD && !v.chars().any(char::is_control)
}

impl Search {
    /// The store filter, or why the form is refused. `statuses` is the page's closed set.
    pub fn filter(&self, statuses: &[&str]) -> Result<ConsoleFilter, &'static str> {
        let tenant = given(&self.tenant);
        let card = given(&self.card);
        if !tenant.is_none_or(plain) || !card.is_none_or(plain) {
            return Err("a tenant or Card is at most 128 printable characters");
        }
        let status = given(&self.status);
        if status.is_some_and(|s| !statuses.contains(&s)) {
            return Err("unknown status");
        }
        let prefix = given(&self.q);
        if prefix.is_some_and(|p| {
            p.len() > MAX_FIELD
                || !p
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        }) {
            return Err("an id prefix is letters, digits, _ and - (at most 128)");
        }
        Ok(ConsoleFilter {
            tenant_id: tenant.map(str::to_owned),
            card_id: card.map(str::to_owned),
            status: status.map(str::to_owned),
            id_prefix: prefix.map(str::to_owned),
        })
    }

    /// `&tenant=…&card=…` for the next page's link (percent-encoded, not yet HTML-escaped).
    pub fn query(&self) -> String {
        let mut out = String::new();
        for (name, v) in [
            ("tenant", &self.tenant),
            ("card", &self.card),
            ("status", &self.status),
            ("q", &self.q),
        ] {
            if let Some(v) = given(v) {
                let _ = write!(out, "&{name}={}", url(v));
            }
        }
        out
    }

    /// The GET form, filled with the current search. `with_card` is false on the runs page.
    pub fn form(&self, action: &str, statuses: &[&str], with_card: bool, id_label: &str) -> String {
        let value = |v: &Option<String>| esc(given(v).unwrap_or(""));
        let mut out = format!(
            "<form class=\"search\" method=\"get\" action=\"{}\">\
             <label>tenant <input name=\"tenant\" id=\"f-tenant\" size=\"20\" value=\"{}\"></label> ",
            esc(action),
            value(&self.tenant)
        );
        if with_card {
            let _ = write!(
                out,
                "<label>Card <input name=\"card\" id=\"f-card\" size=\"14\" value=\"{}\"></label> ",
                value(&self.card)
            );
        }
        out.push_str(
            "<label>status <select name=\"status\" id=\"f-status\"><option value=\"\">any</option>",
        );
        let current = given(&self.status);
        for s in statuses {
            let _ = write!(
                out,
                "<option{}>{}</option>",
                if current == Some(s) { " selected" } else { "" },
                esc(s)
            );
        }
        let _ = write!(
            out,
            "</select></label> <label>{} starts with <input name=\"q\" id=\"f-q\" size=\"24\" value=\"{}\"></label> \
             <button type=\"submit\" id=\"f-search\">Search</button> <a href=\"{}\">clear</a></form>",
            esc(id_label),
            value(&self.q),
            esc(action)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search(q: &str) -> Search {
        let uri: axum::http::Uri = format!("/x?{q}").parse().unwrap();
        axum::extract::Query::<Search>::try_from_uri(&uri)
            .unwrap()
            .0
    }

    #[test]
    fn fields_become_the_filter_and_empty_ones_match_all() {
        let f = search("tenant=ten_1&card=&status=connected&q=cch_ab")
            .filter(&["connected", "created"])
            .unwrap();
        assert_eq!(
            f,
            ConsoleFilter {
                tenant_id: Some("ten_1".into()),
                card_id: None,
                status: Some("connected".into()),
                id_prefix: Some("cch_ab".into()),
            }
        );
        assert!(search("").filter(&[]).unwrap().is_empty());
    }

    #[test]
    fn a_status_outside_the_page_set_or_an_odd_prefix_is_refused() {
        assert!(search("status=drop+table").filter(&["failed"]).is_err());
        assert!(search("q=ab%25").filter(&[]).is_err(), "no LIKE wildcards");
        assert!(search("q=a'b").filter(&[]).is_err());
        assert!(search("tenant=a%0Ab").filter(&[]).is_err());
    }

    #[test]
    fn the_form_and_the_next_link_keep_the_search_escaped() {
        let s = search("tenant=%3Cb%3E&q=run_1");
        let form = s.form("/console/runs", &["running"], false, "run_id");
        assert!(form.contains("value=\"&lt;b&gt;\""), "{form}");
        assert!(!form.contains("<b>"));
        assert!(!form.contains("name=\"card\""));
        assert_eq!(s.query(), "&tenant=%3Cb%3E&q=run_1");
    }
}
