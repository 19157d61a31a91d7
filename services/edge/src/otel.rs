//! OpenTelemetry export: the pod's spans ([`switchyard_core::trace`]) sent in batches to an
//! OTLP/HTTP receiver as JSON, configured by the standard `OTEL_*` variables and off unless
//! an endpoint is set. A request's `traceparent` becomes the parent of its server span, so a
//! message is one trace from the webhook POST on one pod to xAgent's ack on another.
//!
//! Read: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as it is) or `OTEL_EXPORTER_OTLP_ENDPOINT`
//! (`/v1/traces` appended), `OTEL_EXPORTER_OTLP_[TRACES_]HEADERS`, `..._TIMEOUT`,
//! `..._PROTOCOL` (`http/json` only: anything else is refused at start), `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_EXPORTER=none` and `OTEL_SDK_DISABLED=true` (off),
//! `OTEL_BSP_SCHEDULE_DELAY`, `OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`.
//! Header values may hold credentials: they are sent and never logged.

use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use switchyard_core::trace::{Span, TraceContext, Tracer};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How spans are exported; from the environment ([`OtlpConfig::from_env`]).
#[derive(Clone)]
pub struct OtlpConfig {
    /// Where batches are POSTed (`.../v1/traces`).
    pub endpoint: url::Url,
    headers: Vec<(String, String)>,
    pub timeout: Duration,
    pub service_name: String,
    /// `OTEL_RESOURCE_ATTRIBUTES`, beside service name, version and instance.
    pub resource: Vec<(String, String)>,
    /// Longest a finished span waits before its batch goes.
    pub delay: Duration,
    pub queue: usize,
    pub batch: usize,
}

impl std::fmt::Debug for OtlpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values are credentials: only their names are shown.
        let names: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("OtlpConfig")
            .field("endpoint", &self.shown_endpoint())
            .field("headers", &names)
            .field("timeout", &self.timeout)
            .field("service_name", &self.service_name)
            .finish_non_exhaustive()
    }
}

impl OtlpConfig {
    /// The endpoint as logs show it: without a user name or password in the URL.
    pub fn shown_endpoint(&self) -> String {
        let mut u = self.endpoint.clone();
        let _ = u.set_username("");
        let _ = u.set_password(None);
        u.to_string()
    }

    /// The export settings `var` gives (the process environment in a pod), `None` when no
    /// endpoint is set or export is turned off.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> anyhow::Result<Option<Self>> {
        let get = |k: &str| {
            var(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let signal = |k: &str| {
            get(&format!("OTEL_EXPORTER_OTLP_TRACES_{k}"))
                .or_else(|| get(&format!("OTEL_EXPORTER_OTLP_{k}")))
        };
        if get("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || get("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
        {
            return Ok(None);
        }
        let endpoint = match (
            get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            get("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(e), _) => e,
            (None, Some(base)) => format!("{}/v1/traces", base.trim_end_matches('/')),
            (None, None) => return Ok(None),
        };
        let endpoint = url::Url::parse(&endpoint)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .with_context(|| "the OTLP traces endpoint is not an http(s) URL")?;
        if let Some(p) = signal("PROTOCOL")
            && p != "http/json"
        {
            bail!(
                "OTEL_EXPORTER_OTLP_PROTOCOL={p} is not supported: switchyard exports OTLP over \
                 http/json (a collector's HTTP receiver, port 4318, takes it); set it to \
                 http/json or leave it unset"
            );
        }
        let headers = match signal("HEADERS") {
            None => Vec::new(),
            Some(h) => {
                pairs(&h).context("OTEL_EXPORTER_OTLP_HEADERS is not a list of key=value")?
            }
        };
        let resource = match get("OTEL_RESOURCE_ATTRIBUTES") {
            None => Vec::new(),
            Some(r) => pairs(&r).context("OTEL_RESOURCE_ATTRIBUTES is not a list of key=value")?,
        };
        let millis = |k: &str, default: u64| -> anyhow::Result<Duration> {
            match get(k) {
                None => Ok(Duration::from_millis(default)),
                Some(v) => v
                    .parse::<u64>()
                    .map(Duration::from_millis)
                    .with_context(|| format!("{k} is not a number of milliseconds")),
            }
        };
        let count = |k: &str, default: usize| -> anyhow::Result<usize> {
            match get(k) {
                None => Ok(default),
                Some(v) => v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n > 0)
                    .with_context(|| format!("{k} is not a positive number")),
            }
        };
        let timeout = match signal("TIMEOUT") {
            None => Duration::from_secs(10),
            Some(v) => v
                .parse::<u64>()
                .map(Duration::from_millis)
                .context("OTEL_EXPORTER_OTLP_TIMEOUT is not a number of milliseconds")?,
        };
        Ok(Some(Self {
            endpoint,
            headers,
            timeout,
            service_name: get("OTEL_SERVICE_NAME").unwrap_or_else(|| "switchyard".to_owned()),
            resource,
            delay: millis("OTEL_BSP_SCHEDULE_DELAY", 5000)?,
            queue: count("OTEL_BSP_MAX_QUEUE_SIZE", 2048)?,
            batch: count("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?,
        }))
    }
}

/// `k1=v1,k2=v2` with percent-encoded values (the OTel environment's list format).
fn pairs(s: &str) -> Option<Vec<(String, String)>> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=')?;
            let k = k.trim();
            if k.is_empty() {
                return None;
            }
            let v = url::form_urlencoded::parse(
                format!("v={}", v.trim().replace('+', "%2B")).as_bytes(),
            )
            .next()
            .map(|(_, v)| v.into_owned())?;
            Some((k.to_owned(), v))
        })
        .collect()
}

/// The resource every span of this pod is exported under.
struct Resource {
    attributes: Value,
}

/// Starts the exporter: returns the tracer the hub records through and the task that sends
/// batches until `stop`, then sends what is still queued (within the export timeout).
pub fn start(
    cfg: OtlpConfig,
    pod_id: &str,
    version: &str,
    stop: CancellationToken,
) -> anyhow::Result<(Tracer, JoinHandle<()>)> {
    let mut headers = reqwest::header::HeaderMap::new();
    for (k, v) in &cfg.headers {
        let name = reqwest::header::HeaderName::try_from(k.as_str())
            .with_context(|| format!("OTLP header name {k:?} is not valid"))?;
        let mut value = reqwest::header::HeaderValue::try_from(v.as_str())
            .with_context(|| format!("the value of OTLP header {k:?} is not valid"))?;
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    let client = reqwest::Client::builder()
        .default_headers(headers)
        .timeout(cfg.timeout)
        .tcp_nodelay(true)
        .build()
        .context("building the OTLP client")?;
    let mut attrs = vec![
        ("service.name".to_owned(), cfg.service_name.clone()),
        ("service.version".to_owned(), version.to_owned()),
        ("service.instance.id".to_owned(), pod_id.to_owned()),
    ];
    for (k, v) in &cfg.resource {
        if !attrs.iter().any(|(have, _)| have == k) {
            attrs.push((k.clone(), v.clone()));
        }
    }
    let resource = Resource {
        attributes: Value::Array(attrs.iter().map(|(k, v)| attr(k, v)).collect()),
    };
    let (tracer, rx) = Tracer::channel(cfg.queue);
    tracing::info!(endpoint = %cfg.shown_endpoint(), "exporting traces over OTLP/HTTP (json)");
    let task = tokio::spawn(export_loop(cfg, client, resource, rx, stop));
    Ok((tracer, task))
}

async fn export_loop(
    cfg: OtlpConfig,
    client: reqwest::Client,
    resource: Resource,
    mut rx: mpsc::Receiver<Span>,
    stop: CancellationToken,
) {
    let mut batch: Vec<Span> = Vec::with_capacity(cfg.batch);
    let mut failing = false;
    loop {
        let deadline = tokio::time::sleep(cfg.delay);
        tokio::pin!(deadline);
        // Fill a batch until it is full, the delay passes or the pod stops.
        let stopping = loop {
            tokio::select! {
                _ = stop.cancelled() => break true,
                _ = &mut deadline => break false,
                span = rx.recv() => match span {
                    Some(s) => {
                        batch.push(s);
                        if batch.len() >= cfg.batch {
                            break false;
                        }
                    }
                    None => break true,
                },
            }
        };
        if stopping {
            while let Ok(s) = rx.try_recv() {
                batch.push(s);
            }
        }
        for chunk in batch.chunks(cfg.batch) {
            let ok = send(&cfg, &client, &resource, chunk).await;
            if ok == failing {
                // Logged when the state changes, not per batch.
                if ok {
                    tracing::info!("OTLP export works again");
                } else {
                    tracing::warn!(endpoint = %cfg.shown_endpoint(), "OTLP export failed; spans are dropped until it works");
                }
                failing = !ok;
            }
        }
        batch.clear();
        if stopping {
            return;
        }
    }
}

/// POSTs one batch; false when it did not reach the receiver.
async fn send(
    cfg: &OtlpConfig,
    client: &reqwest::Client,
    resource: &Resource,
    spans: &[Span],
) -> bool {
    let body = encode(resource, spans);
    let r = client
        .post(cfg.endpoint.clone())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_string())
        .send()
        .await;
    let ok = matches!(&r, Ok(resp) if resp.status().is_success());
    if ok {
        metrics::counter!("switchyard_trace_spans_exported_total").increment(spans.len() as u64);
    } else {
        metrics::counter!("switchyard_trace_export_failures_total").increment(1);
        if let Ok(resp) = &r {
            tracing::debug!(status = %resp.status(), "OTLP receiver refused a batch");
        }
    }
    ok
}

fn attr(k: &str, v: &str) -> Value {
    json!({"key": k, "value": {"stringValue": v}})
}

/// An `ExportTraceServiceRequest` in OTLP's JSON encoding (hex ids, times as decimal
/// strings of unix nanoseconds).
fn encode(resource: &Resource, spans: &[Span]) -> Value {
    let spans: Vec<Value> = spans
        .iter()
        .map(|s| {
            let mut v = json!({
                "traceId": hex(&s.ctx.trace_id),
                "spanId": hex(&s.ctx.span_id),
                "name": s.name,
                "kind": s.kind as i32,
                "startTimeUnixNano": s.start_ns.to_string(),
                "endTimeUnixNano": s.end_ns.to_string(),
                "attributes": s.attrs.iter().map(|(k, v)| attr(k, v)).collect::<Vec<_>>(),
                "flags": 0x100 | u32::from(s.ctx.sampled),
            });
            if let Some(p) = s.parent {
                v["parentSpanId"] = json!(hex(&p));
            }
            v["status"] = match &s.error {
                Some(e) => json!({"code": 2, "message": e}),
                None => json!({"code": 0}),
            };
            v
        })
        .collect();
    json!({
        "resourceSpans": [{
            "resource": {"attributes": resource.attributes},
            "scopeSpans": [{
                "scope": {"name": "switchyard", "version": env!("CARGO_PKG_VERSION")},
                "spans": spans,
            }],
        }],
    })
}

fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
}

/// The public listener's span per request: the parent is the request's `traceparent` (a
/// new trace without a valid one), the span is the current context while the request is
/// served, so a message it stores continues it. Names carry the method and the Card's
/// prefix only: paths and query strings can carry tokens.
pub async fn server_span(
    tracer: Tracer,
    prefix: &'static str,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let parent = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(TraceContext::parse);
    let name = format!("{} {prefix}", req.method());
    let Some(mut span) = tracer.start(name, switchyard_core::trace::SpanKind::Server, parent)
    else {
        return next.run(req).await;
    };
    span.attr("http.request.method", req.method().as_str());
    span.attr("http.route", prefix);
    let resp = switchyard_core::trace::scope(span.ctx(), next.run(req)).await;
    let status = resp.status();
    span.attr("http.response.status_code", status.as_str());
    let error = status.is_server_error().then_some(status.as_str());
    span.end(&tracer, error);
    resp
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use switchyard_core::trace::SpanKind;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn off_unless_an_endpoint_is_set_or_when_turned_off() {
        assert!(OtlpConfig::from_env(env(&[])).unwrap().is_none());
        let on = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")];
        assert!(OtlpConfig::from_env(env(&on)).unwrap().is_some());
        for off in [
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_SDK_DISABLED", "true"),
        ] {
            let vars = [on[0], off];
            assert!(
                OtlpConfig::from_env(env(&vars)).unwrap().is_none(),
                "{off:?}"
            );
        }
    }

    #[test]
    fn the_endpoint_headers_and_resource_follow_the_otel_variables() {
        let c = OtlpConfig::from_env(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "api-key=s%3Dcret,x-tenant = blue",
            ),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod"),
            ("OTEL_SERVICE_NAME", "edge-eu"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint.as_str(), "http://collector:4318/v1/traces");
        assert_eq!(
            c.headers,
            [
                ("api-key".to_owned(), "s=cret".to_owned()),
                ("x-tenant".to_owned(), "blue".to_owned())
            ]
        );
        assert_eq!(
            c.resource,
            [("deployment.environment".to_owned(), "prod".to_owned())]
        );
        assert_eq!(c.service_name, "edge-eu");
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(c.delay, Duration::from_millis(200));
        // The signal's own endpoint is used as it is, and wins.
        let c = OtlpConfig::from_env(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://b/custom/path",
            ),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint.as_str(), "https://b/custom/path");
        // Credentials never show in the config's debug form.
        let shown = format!(
            "{:?}",
            OtlpConfig::from_env(env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "authorization=Bearer%20sekrit"
                ),
            ]))
            .unwrap()
            .unwrap()
        );
        assert!(
            shown.contains("authorization") && !shown.contains("sekrit"),
            "{shown}"
        );
        // Nor does a password in the endpoint's URL.
        let c = OtlpConfig::from_env(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "https://ops:pa55word@collector:4318",
        )]))
        .unwrap()
        .unwrap();
        assert_eq!(c.shown_endpoint(), "https://collector:4318/v1/traces");
        assert!(!format!("{c:?}").contains("pa55word"));
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_with_a_clear_error() {
        let base = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        for (vars, says) in [
            (
                vec![base, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
                "http/json",
            ),
            (
                vec![
                    base,
                    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
                ],
                "http/json",
            ),
            (
                vec![base, ("OTEL_EXPORTER_OTLP_HEADERS", "novalue")],
                "key=value",
            ),
            (
                vec![base, ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon")],
                "milliseconds",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")],
                "http(s) URL",
            ),
        ] {
            let e = OtlpConfig::from_env(env(&vars)).unwrap_err();
            assert!(format!("{e:#}").contains(says), "{vars:?}: {e:#}");
        }
        let json = [base, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")];
        assert!(OtlpConfig::from_env(env(&json)).unwrap().is_some());
    }

    #[test]
    fn spans_are_encoded_as_otlp_json() {
        let (tracer, mut rx) = Tracer::channel(4);
        let parent =
            TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let mut s = tracer
            .start("POST /webhook", SpanKind::Server, Some(parent))
            .unwrap();
        s.attr("http.response.status_code", "500");
        s.end(&tracer, Some("500"));
        let span = rx.try_recv().unwrap();
        let resource = Resource {
            attributes: json!([attr("service.name", "switchyard")]),
        };
        let body = encode(&resource, std::slice::from_ref(&span));
        let got = &body["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(got["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(got["parentSpanId"], "00f067aa0ba902b7");
        assert_eq!(got["spanId"], hex(&span.ctx.span_id));
        assert_eq!(got["kind"], 2);
        assert_eq!(got["startTimeUnixNano"], span.start_ns.to_string());
        assert_eq!(got["status"]["code"], 2);
        assert_eq!(got["attributes"][0]["key"], "http.response.status_code");
        assert_eq!(got["attributes"][0]["value"]["stringValue"], "500");
        assert_eq!(
            body["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"],
            "switchyard"
        );
    }
}
