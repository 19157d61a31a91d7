//! Hand-written HTML: every value goes through [`esc`] (text and attribute values alike), the
//! layout is one inline stylesheet, and there is no script and no external asset.

use std::fmt::Write as _;

/// Escapes text for an HTML text node or a quoted attribute value.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// Percent-encodes a value for a query string or a path segment.
pub fn url(s: &str) -> String {
    percent_encode(s)
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SSZ` (UTC).
pub fn time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

pub fn opt_time(ms: Option<i64>) -> String {
    ms.map(time).unwrap_or_else(|| "—".into())
}

/// A span of milliseconds as `3d 4h`, `5m 7s`, `12s`.
pub fn span(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Shows the start and end of an identifier of the target (an account or chat hint), never
/// the whole: `@su…ot`.
pub fn mask(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    if chars.len() <= 6 {
        return "•••".into();
    }
    let head: String = chars[..3].iter().collect();
    let tail: String = chars[chars.len() - 2..].iter().collect();
    format!("{head}…{tail}")
}

/// Cuts text to `max` characters.
pub fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max).collect();
    out.push('…');
    out
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}\
header{background:#243447;color:#fff;padding:.5em 1em;display:flex;gap:1em;align-items:center;flex-wrap:wrap}\
header a{color:#cfe3ff;text-decoration:none}header a:hover{text-decoration:underline}\
header form{margin-left:auto}main{padding:1em}\
table{border-collapse:collapse;background:#fff;width:100%;margin:.5em 0}\
th,td{border:1px solid #ddd;padding:.3em .5em;text-align:left;vertical-align:top}\
th{background:#eef1f5}code{font-size:12px}\
.ok{color:#17702b}.bad{color:#b3261e}.warn{color:#8a5a00}.muted{color:#777}\
.cards{display:flex;gap:1em;flex-wrap:wrap}.card{background:#fff;border:1px solid #ddd;padding:.7em 1em;min-width:9em}\
.card b{display:block;font-size:1.6em}.notice{background:#fff7d6;border:1px solid #e6cf70;padding:.6em}\
form.inline{display:inline}button{cursor:pointer}\
form.search{background:#fff;border:1px solid #ddd;padding:.5em;margin:.5em 0}\
.charts{display:flex;gap:1em;flex-wrap:wrap}figure.chart{margin:0;background:#fff;border:1px solid #ddd;padding:.4em}\
figure.chart figcaption{font-weight:600;font-size:13px}.legend{font-size:12px;max-width:420px}";

/// The page around `body`, with the navigation and the logout form when signed in.
pub fn layout(title: &str, operator: Option<(&str, &str)>, body: &str) -> String {
    let mut out = String::with_capacity(body.len() + 2048);
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <title>{} · Switchyard console</title><style>{STYLE}</style></head><body><header>\
         <strong>Switchyard</strong>",
        esc(title)
    );
    if let Some((name, csrf)) = operator {
        for (href, label) in [
            ("/console", "Overview"),
            ("/console/tenants", "Tenants"),
            ("/console/connectors", "Connectors"),
            ("/console/channels", "Channels"),
            ("/console/bindings", "Bindings"),
            ("/console/failures", "Failures"),
            ("/console/hosts", "Hosts"),
            ("/console/runs", "Runs"),
            ("/console/approvals", "Approvals"),
        ] {
            let _ = write!(out, "<a href=\"{href}\">{label}</a>");
        }
        let _ = write!(
            out,
            "<form method=\"post\" action=\"/console/logout\"><span>{}</span> \
             <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
             <button type=\"submit\">Log out</button></form>",
            esc(name),
            esc(csrf)
        );
    }
    let _ = write!(
        out,
        "</header><main><h1>{}</h1>{body}</main></body></html>",
        esc(title)
    );
    out
}

/// A table with a header row; each cell of `rows` is already HTML.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = String::from("<table><thead><tr>");
    for h in headers {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    if rows.is_empty() {
        let _ = write!(
            out,
            "<tr><td colspan=\"{}\" class=\"muted\">nothing here</td></tr>",
            headers.len()
        );
    }
    for r in rows {
        out.push_str("<tr>");
        for c in r {
            let _ = write!(out, "<td>{c}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

/// A link to the next page when the page was full.
pub fn next_link(path: &str, param: &str, cursor: Option<String>, extra: &str) -> String {
    match cursor {
        Some(c) => format!(
            "<p><a rel=\"next\" href=\"{}?{param}={}{}\">Next page →</a></p>",
            esc(path),
            esc(&url(&c)),
            esc(extra)
        ),
        None => "<p class=\"muted\">end of list</p>".into(),
    }
}

pub fn link(href: &str, text: &str) -> String {
    format!("<a href=\"{}\">{}</a>", esc(href), esc(text))
}

pub fn code(text: &str) -> String {
    format!("<code>{}</code>", esc(text))
}

/// A POST form with the CSRF token and one button (plus extra fields, already HTML).
pub fn post_button(action: &str, csrf: &str, label: &str, fields: &str) -> String {
    format!(
        "<form class=\"inline\" method=\"post\" action=\"{}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">{fields}\
         <button type=\"submit\">{}</button></form>",
        esc(action),
        esc(csrf),
        esc(label)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_everything_that_matters() {
        assert_eq!(
            esc("<a href=\"x\" onclick='y'>&</a>"),
            "&lt;a href=&quot;x&quot; onclick=&#39;y&#39;&gt;&amp;&lt;/a&gt;"
        );
        assert_eq!(url("a b/é"), "a%20b%2F%C3%A9");
    }

    #[test]
    fn times_and_spans() {
        assert_eq!(time(0), "1970-01-01 00:00:00Z");
        assert_eq!(time(1_767_225_600_000), "2026-01-01 00:00:00Z");
        assert_eq!(time(951_782_400_000 + 86_399_000), "2000-02-29 23:59:59Z");
        assert_eq!(span(59_999), "59s");
        assert_eq!(span(61_000), "1m 1s");
        assert_eq!(span(3 * 86_400_000 + 7_200_000), "3d 2h");
    }

    #[test]
    fn masks_keep_only_the_ends() {
        assert_eq!(mask("@support_bot"), "@su…ot");
        assert_eq!(mask("short"), "•••");
        assert_eq!(clip("abcdef", 3), "abc…");
    }
}
