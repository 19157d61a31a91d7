//! One trace per message across pods (OpenTelemetry): the W3C trace context and the spans a
//! pod records. The context arrives with a request (`traceparent`) or starts here, is kept
//! beside the stored message's payload (so the outbox row and the carried doorbell hold it)
//! and becomes the parent of the delivery on whichever pod holds the channel's socket.
//!
//! Recording never blocks and costs nothing when export is off: a [`Tracer`] without an
//! exporter starts no span. With one, finished spans go to a bounded queue the exporter
//! (the edge's OTLP client) drains; a full queue drops the span and counts it. A span holds
//! ids, names and counts, never message text or secrets.

use std::borrow::Cow;
use std::future::Future;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;

/// Key of the message's trace context kept beside its outbox payload (not sent to xAgent:
/// delivery renders the typed payload only).
pub const STORED_KEY: &str = "traceparent";

/// A W3C trace context: the trace, the span that is the parent of what comes next, and
/// whether the trace is sampled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
}

impl TraceContext {
    /// Parses a `traceparent` header (version 00, or a later version's first four fields).
    /// Invalid values (all-zero ids, version ff, wrong lengths, uppercase hex) are `None`:
    /// the caller starts a new trace, as the W3C recommendation asks.
    pub fn parse(header: &str) -> Option<Self> {
        let h = header.trim();
        let mut parts = h.split('-');
        let version = parts.next()?;
        let trace = parts.next()?;
        let span = parts.next()?;
        let flags = parts.next()?;
        if version.len() != 2 || !is_lower_hex(version) || version == "ff" {
            return None;
        }
        // Version 00 has exactly four fields; a later version may add more after them.
        if version == "00" && parts.next().is_some() {
            return None;
        }
        if trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
            return None;
        }
        if !is_lower_hex(trace) || !is_lower_hex(span) || !is_lower_hex(flags) {
            return None;
        }
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        hex::decode_to_slice(trace, &mut trace_id).ok()?;
        hex::decode_to_slice(span, &mut span_id).ok()?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        let flags = u8::from_str_radix(flags, 16).ok()?;
        Some(Self {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }

    /// The `traceparent` header naming this span as the parent.
    pub fn header(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            hex::encode(self.trace_id),
            hex::encode(self.span_id),
            u8::from(self.sampled)
        )
    }

    /// A new sampled trace.
    pub fn root() -> Self {
        Self {
            trace_id: nonzero(),
            span_id: nonzero(),
            sampled: true,
        }
    }

    /// A new span in the same trace.
    pub fn child(&self) -> Self {
        Self {
            span_id: nonzero(),
            ..*self
        }
    }
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn nonzero<const N: usize>() -> [u8; N] {
    loop {
        let id: [u8; N] = rand::random();
        if id != [0; N] {
            return id;
        }
    }
}

tokio::task_local! {
    static CURRENT: TraceContext;
}

/// The trace context of the request this task serves, if any.
pub fn current() -> Option<TraceContext> {
    CURRENT.try_with(|c| *c).ok()
}

/// The W3C header a provider's request to its target carries so the target's traces join the
/// message's: `traceparent` of the span being served (a tool call, a message delivered), or
/// None when no span is (tracing off, or unsampled).
pub fn outgoing() -> Option<(&'static str, String)> {
    current().map(|c| (HEADER, c.header()))
}

/// The name of the W3C trace context header.
pub const HEADER: &str = "traceparent";

/// Runs `f` with `ctx` as the current context ([`current`]).
pub async fn scope<F: Future>(ctx: TraceContext, f: F) -> F::Output {
    CURRENT.scope(ctx, f).await
}

/// What a span is to its trace (OTLP's `SpanKind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanKind {
    Internal = 1,
    Server = 2,
    Client = 3,
    Producer = 4,
    Consumer = 5,
}

/// A finished span, ready for export.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub ctx: TraceContext,
    pub parent: Option<[u8; 8]>,
    pub name: Cow<'static, str>,
    pub kind: SpanKind,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attrs: Vec<(&'static str, String)>,
    /// Set when the span's work failed: a stable code or short reason, never message text.
    pub error: Option<String>,
}

/// A span that runs: its `ctx` is the parent of what it causes.
#[derive(Debug)]
pub struct Started {
    span: Span,
}

impl Started {
    /// The context its children name as parent.
    pub fn ctx(&self) -> TraceContext {
        self.span.ctx
    }

    /// Adds an attribute (an id, a status, a count: never message text or a secret).
    pub fn attr(&mut self, key: &'static str, value: impl Into<String>) {
        self.span.attrs.push((key, value.into()));
    }

    /// Ends the span now; `error` marks it failed.
    pub fn end(mut self, tracer: &Tracer, error: Option<&str>) {
        self.span.end_ns = now_ns().max(self.span.start_ns);
        self.span.error = error.map(str::to_owned);
        tracer.record(self.span);
    }
}

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Where a pod's finished spans go; cheap to clone. Without an exporter it starts nothing.
#[derive(Clone, Debug, Default)]
pub struct Tracer {
    tx: Option<mpsc::Sender<Span>>,
}

impl Tracer {
    /// Records nothing.
    pub fn disabled() -> Self {
        Self::default()
    }

    /// A tracer whose spans the exporter takes from the returned queue (at most `queue`
    /// waiting; more are dropped and counted).
    pub fn channel(queue: usize) -> (Self, mpsc::Receiver<Span>) {
        let (tx, rx) = mpsc::channel(queue.max(1));
        (Self { tx: Some(tx) }, rx)
    }

    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Starts a span under `parent` (a new trace when `None`). `None` when export is off or
    /// the parent's trace is not sampled: then nothing is recorded for it.
    pub fn start(
        &self,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
        parent: Option<TraceContext>,
    ) -> Option<Started> {
        self.tx.as_ref()?;
        let (ctx, parent) = match parent {
            Some(p) if !p.sampled => return None,
            Some(p) => (p.child(), Some(p.span_id)),
            None => (TraceContext::root(), None),
        };
        Some(Started {
            span: Span {
                ctx,
                parent,
                name: name.into(),
                kind,
                start_ns: now_ns(),
                end_ns: 0,
                attrs: Vec::new(),
                error: None,
            },
        })
    }

    /// A span that already happened (its start was noted earlier, e.g. when a message went
    /// out on a socket and its ack came later).
    #[allow(clippy::too_many_arguments)]
    pub fn finished(
        &self,
        name: &'static str,
        kind: SpanKind,
        parent: TraceContext,
        start_ns: u64,
        attrs: Vec<(&'static str, String)>,
        error: Option<&str>,
    ) {
        if self.tx.is_none() || !parent.sampled {
            return;
        }
        self.record(Span {
            ctx: parent.child(),
            parent: Some(parent.span_id),
            name: Cow::Borrowed(name),
            kind,
            start_ns,
            end_ns: now_ns().max(start_ns),
            attrs,
            error: error.map(str::to_owned),
        });
    }

    fn record(&self, span: Span) {
        let Some(tx) = &self.tx else { return };
        if tx.try_send(span).is_err() {
            metrics::counter!("switchyard_trace_spans_dropped_total").increment(1);
        }
    }
}

/// Runs `f` in a new span, current while it runs (so what `f` calls continues its trace);
/// `failed` reads a failure code off the result. A new trace: xAgent's packets carry no
/// context.
pub async fn traced<T, F: Future<Output = T>>(
    tracer: &Tracer,
    name: &'static str,
    attrs: Vec<(&'static str, String)>,
    f: F,
    failed: impl FnOnce(&T) -> Option<String>,
) -> T {
    let Some(mut span) = tracer.start(name, SpanKind::Server, None) else {
        return f.await;
    };
    for (k, v) in attrs {
        span.attr(k, v);
    }
    let out = scope(span.ctx(), f).await;
    let error = failed(&out);
    span.end(tracer, error.as_deref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_round_trips() {
        let c = TraceContext::parse(VALID).expect("valid");
        assert_eq!(hex::encode(c.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex::encode(c.span_id), "00f067aa0ba902b7");
        assert!(c.sampled);
        assert_eq!(c.header(), VALID);
        let unsampled = TraceContext::parse(&VALID.replace("-01", "-00")).expect("valid");
        assert!(!unsampled.sampled);
        // A later version may carry more fields after the four it shares with 00.
        assert!(TraceContext::parse(&format!("{}-extra", VALID.replacen("00", "01", 1))).is_some());
    }

    #[test]
    fn invalid_traceparents_start_a_new_trace() {
        for bad in [
            "",
            "garbage",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn spans_name_their_parent_and_nothing_is_started_when_off_or_unsampled() {
        assert!(
            Tracer::disabled()
                .start("x", SpanKind::Internal, None)
                .is_none()
        );
        let (tracer, mut rx) = Tracer::channel(4);
        let parent = TraceContext::parse(VALID).unwrap();
        let mut s = tracer
            .start("store", SpanKind::Internal, Some(parent))
            .expect("sampled");
        assert_eq!(s.ctx().trace_id, parent.trace_id);
        assert_ne!(s.ctx().span_id, parent.span_id);
        s.attr("switchyard.outcome", "stored");
        let child_ctx = s.ctx();
        s.end(&tracer, None);
        let got = rx.try_recv().expect("recorded");
        assert_eq!(got.parent, Some(parent.span_id));
        assert_eq!(got.ctx, child_ctx);
        assert!(got.end_ns >= got.start_ns);
        assert_eq!(got.attrs, [("switchyard.outcome", "stored".to_owned())]);

        let unsampled = TraceContext {
            sampled: false,
            ..parent
        };
        assert!(
            tracer
                .start("x", SpanKind::Internal, Some(unsampled))
                .is_none()
        );
        let root = tracer
            .start("root", SpanKind::Server, None)
            .expect("a new trace");
        assert!(root.ctx().sampled);
        assert_ne!(root.ctx().trace_id, parent.trace_id);
    }

    #[test]
    fn a_full_queue_drops_instead_of_waiting() {
        let (tracer, mut rx) = Tracer::channel(1);
        for _ in 0..3 {
            tracer
                .start("x", SpanKind::Internal, None)
                .unwrap()
                .end(&tracer, None);
        }
        assert!(rx.try_recv().is_ok());
        assert!(rx.try_recv().is_err(), "the rest were dropped");
    }

    #[tokio::test]
    async fn the_current_context_is_the_scope_s() {
        assert_eq!(current(), None);
        let c = TraceContext::root();
        assert_eq!(scope(c, async { current() }).await, Some(c));
    }
}
