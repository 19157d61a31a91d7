//! The one counter every configured limit bumps when it refuses something:
//! `switchyard_limits_hit_total{limit="..."}`. Labels are fixed names, never ids.
//! Also the guard for log lines whose content a client chooses.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Counts one refusal by the limit named `limit` (a static name such as
/// `ingress_body_bytes`).
pub fn hit(limit: &'static str) {
    metrics::counter!("switchyard_limits_hit_total", "limit" => limit).increment(1);
}

/// Longest client-chosen value written to a log line, in characters before escaping.
pub const MAX_LOGGED_CHARS: usize = 64;
/// Client-reported error lines a pod writes per second; the rest are counted.
pub const CLIENT_ERROR_LINES_PER_SEC: u32 = 20;

/// A client-chosen string made safe for a log line: at most [`MAX_LOGGED_CHARS`] characters,
/// every control, quote, backslash and non-ASCII character escaped, so a value can neither
/// forge a line nor hide in one.
pub fn printable(s: &str) -> String {
    let mut out: String = s
        .chars()
        .take(MAX_LOGGED_CHARS)
        .flat_map(char::escape_default)
        .collect();
    if s.chars().nth(MAX_LOGGED_CHARS).is_some() {
        out.push_str("...");
    }
    out
}

/// A fixed-window budget of log lines.
pub struct LogGate {
    per_window: u32,
    window: Duration,
    state: Mutex<(Option<Instant>, u32, u64)>,
}

impl LogGate {
    pub const fn new(per_window: u32, window: Duration) -> Self {
        Self {
            per_window,
            window,
            state: Mutex::new((None, 0, 0)),
        }
    }

    /// Whether a line may be written at `now`; returns also how many lines the previous
    /// window suppressed when a new window opens (to be reported once).
    pub fn admit(&self, now: Instant) -> (bool, u64) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (start, used, suppressed) = &mut *st;
        let mut reported = 0;
        if start.is_none_or(|s| now.duration_since(s) >= self.window) {
            *start = Some(now);
            *used = 0;
            reported = std::mem::take(suppressed);
        }
        if *used < self.per_window {
            *used += 1;
            (true, reported)
        } else {
            *suppressed += 1;
            (false, reported)
        }
    }
}

static CLIENT_ERRORS: LogGate = LogGate::new(CLIENT_ERROR_LINES_PER_SEC, Duration::from_secs(1));

/// Logs an error a client reported about itself (an xAgent `error` packet): the code is
/// escaped and truncated, and the pod writes at most [`CLIENT_ERROR_LINES_PER_SEC`] such
/// lines a second, counting the rest as `limit="client_error_log"`.
pub fn client_error(source: &'static str, code: &str) {
    let (admitted, suppressed) = CLIENT_ERRORS.admit(Instant::now());
    if suppressed > 0 {
        tracing::info!(source, suppressed, "client error lines suppressed");
    }
    if admitted {
        tracing::info!(source, code = %printable(code), "client reported an error");
    } else {
        hit("client_error_log");
    }
}

/// Refused-signature lines a pod writes per second: anyone who knows an ingress URL can send
/// bad signatures, so one line each would let them fill the log. The rest are counted.
pub const SIGNATURE_REFUSAL_LINES_PER_SEC: u32 = 20;

static SIGNATURE_REFUSALS: LogGate =
    LogGate::new(SIGNATURE_REFUSAL_LINES_PER_SEC, Duration::from_secs(1));

/// Logs a provider ingress request refused for its signature (`source` names the ingress,
/// `channel` is the channel id from the path, escaped and truncated; `reason` a fixed
/// description), at most [`SIGNATURE_REFUSAL_LINES_PER_SEC`] lines a second, counting the
/// rest as `limit="signature_refusal_log"`. Returns whether the line was written.
pub fn signature_refused(source: &'static str, channel: &str, reason: &str) -> bool {
    let (admitted, suppressed) = SIGNATURE_REFUSALS.admit(Instant::now());
    if suppressed > 0 {
        tracing::info!(source, suppressed, "refused-signature lines suppressed");
    }
    if admitted {
        tracing::info!(
            source,
            connector_channel_id = %printable(channel),
            reason = %printable(reason),
            "ingress request refused: bad or stale signature"
        );
    } else {
        hit("signature_refusal_log");
    }
    admitted
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 23, finding 7: a flood of bad signatures writes a bounded number of lines.
    #[test]
    fn refused_signatures_are_logged_through_the_gate() {
        let written = (0..500)
            .filter(|i| signature_refused("test", &format!("ch_{i}"), "bad signature"))
            .count();
        // Within one second (or across one window boundary at most).
        assert!(
            written <= 2 * SIGNATURE_REFUSAL_LINES_PER_SEC as usize,
            "{written} lines for 500 refusals"
        );
        assert!(written >= 1);
    }

    #[test]
    fn client_strings_are_escaped_and_truncated() {
        assert_eq!(printable("rate_limited"), "rate_limited");
        assert_eq!(
            printable("x\n2026-01-01 ERROR forged \"line\""),
            "x\\n2026-01-01 ERROR forged \\\"line\\\""
        );
        assert_eq!(printable("\u{1b}[31mred"), "\\u{1b}[31mred");
        let long = printable(&"a".repeat(10_000));
        assert_eq!(long.len(), MAX_LOGGED_CHARS + 3);
        assert!(long.ends_with("..."));
    }

    #[test]
    fn the_gate_admits_a_budget_per_window_and_reports_the_rest() {
        let gate = LogGate::new(3, Duration::from_secs(1));
        let t0 = Instant::now();
        let admitted = (0..10).filter(|_| gate.admit(t0).0).count();
        assert_eq!(admitted, 3);
        assert_eq!(gate.admit(t0 + Duration::from_secs(1)), (true, 7));
        assert_eq!(gate.admit(t0 + Duration::from_millis(1500)), (true, 0));
    }
}
