//! `deliver()` and the send tools against a fake endpoint: status mapping, signatures,
//! health reporting, and deterministic tool message ids.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{
    CHANNEL, FakeServices, NoProgress, SECRET, config, creds, endpoint, fake_services, refused_url,
};
use serde_json::{Map, Value, json};
use switchyard_core::provider::{Binding, OutboundMessage, Provider, ProviderErrorKind, ToolCall};
use switchyard_fake_webhook::Received;
use switchyard_protocol::ConnectionStatus;
use switchyard_provider_webhook::{TOOL_FILE_SEND, TOOL_MESSAGE_SEND, WebhookProvider};
use switchyard_webhook_signing::{self as signing, SIGNATURE_HEADER, TIMESTAMP_HEADER};

fn provider(services: &Arc<FakeServices>) -> WebhookProvider {
    WebhookProvider::new(config(), services.clone())
}

async fn deliver(
    p: &WebhookProvider,
    binding: &Binding,
    id: &str,
    text: &str,
) -> Result<(), switchyard_core::provider::ProviderError> {
    p.deliver(OutboundMessage {
        binding,
        message_id: id,
        text: Some(text),
        files: &[],
    })
    .await
}

fn header<'a>(r: &'a Received, name: &str) -> &'a str {
    r.headers.get(name).unwrap().to_str().unwrap()
}

#[tokio::test]
async fn delivers_signed_json() {
    let services = fake_services();
    let ep = endpoint().await;
    let binding = services.bind(CHANNEL, creds(ep.url()));
    let p = provider(&services);

    deliver(&p, &binding, "out_1", "hello there").await.unwrap();

    let got = ep.received();
    assert_eq!(got.len(), 1);
    let r = &got[0];
    assert_eq!(header(r, "content-type"), "application/json");
    signing::verify(
        SECRET.as_bytes(),
        Some(header(r, TIMESTAMP_HEADER)),
        Some(header(r, SIGNATURE_HEADER)),
        &r.raw,
        signing::unix_now(),
    )
    .expect("the endpoint can verify what it receives");
    let v: Value = serde_json::from_slice(&r.raw).unwrap();
    assert_eq!(
        v,
        json!({"message_id": "out_1", "connector_channel_id": CHANNEL, "text": "hello there"})
    );
    assert!(
        services.statuses().is_empty(),
        "a healthy endpoint reports nothing"
    );
}

/// A delivery made while a span is served (the engine's `switchyard.chat.message`) carries
/// its W3C `traceparent`, so the chat system's traces join the message's; one made with no
/// span carries none.
#[tokio::test]
async fn a_traced_delivery_carries_its_traceparent() {
    let services = fake_services();
    let ep = endpoint().await;
    let binding = services.bind(CHANNEL, creds(ep.url()));
    let p = provider(&services);

    deliver(&p, &binding, "out_plain", "no trace")
        .await
        .unwrap();
    let ctx = switchyard_core::trace::TraceContext::root();
    switchyard_core::trace::scope(ctx, deliver(&p, &binding, "out_traced", "traced"))
        .await
        .unwrap();

    let got = ep.received();
    assert_eq!(got.len(), 2);
    assert!(got[0].headers.get("traceparent").is_none());
    assert_eq!(header(&got[1], "traceparent"), ctx.header());
}

#[tokio::test]
async fn status_mapping() {
    let services = fake_services();
    let ep = endpoint().await;
    let binding = services.bind(CHANNEL, creds(ep.url()));
    let p = provider(&services);

    ep.answer(204);
    assert!(deliver(&p, &binding, "a", "x").await.is_ok());

    ep.answer(404);
    let e = deliver(&p, &binding, "b", "x").await.unwrap_err();
    assert_eq!(
        (e.kind, e.code.as_str(), e.retryable()),
        (ProviderErrorKind::Rejected, "target_delivery_failed", false)
    );
    assert_eq!(e.message, "endpoint answered 404");

    ep.answer(503);
    let e = deliver(&p, &binding, "c", "x").await.unwrap_err();
    assert_eq!(
        (e.kind, e.code.as_str(), e.retryable()),
        (ProviderErrorKind::Transient, "target_unavailable", true)
    );

    // Redirects are not followed: the signed body goes to the bound URL only.
    ep.answer(307);
    let e = deliver(&p, &binding, "d", "x").await.unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Rejected);
}

#[tokio::test]
async fn refused_connection_is_transient_and_leaks_nothing() {
    let services = fake_services();
    let url = refused_url().await;
    let binding = services.bind(CHANNEL, creds(&url));
    let p = provider(&services);
    let e = deliver(&p, &binding, "a", "x").await.unwrap_err();
    assert_eq!(
        (e.kind, e.code.as_str()),
        (ProviderErrorKind::Transient, "target_unavailable")
    );
    let shown = format!("{e} {e:?}");
    assert!(
        !shown.contains("path-secret-token")
            && !shown.contains("/hooks/in")
            && !shown.contains(SECRET),
        "{shown}"
    );
}

#[tokio::test]
async fn timeout_is_transient() {
    let services = fake_services();
    let ep = endpoint().await;
    ep.delay(Duration::from_secs(3)); // config() times out after 500 ms
    let binding = services.bind(CHANNEL, creds(ep.url()));
    let p = provider(&services);
    let e = deliver(&p, &binding, "a", "x").await.unwrap_err();
    assert_eq!(
        (e.kind, e.code.as_str()),
        (ProviderErrorKind::Transient, "target_unavailable")
    );
    assert!(!e.message.contains("path-secret-token"));
}

#[tokio::test]
async fn health_follows_the_endpoint() {
    let services = fake_services();
    let ep = endpoint().await;
    let binding = services.bind(CHANNEL, creds(ep.url()));
    let p = provider(&services);

    ep.answer(500);
    for id in ["a", "b", "c"] {
        assert!(deliver(&p, &binding, id, "x").await.is_err());
    }
    ep.answer(200);
    deliver(&p, &binding, "d", "x").await.unwrap();
    deliver(&p, &binding, "e", "x").await.unwrap();
    assert_eq!(
        services.statuses_of(CHANNEL),
        vec![
            ConnectionStatus::Degraded,
            ConnectionStatus::Degraded,
            ConnectionStatus::Offline,
            ConnectionStatus::Connected
        ]
    );
    assert!(services.statuses().iter().all(|(c, _)| c == CHANNEL));
}

#[tokio::test]
async fn outbound_files_carry_metadata_and_download_url() {
    let services = fake_services();
    let ep = endpoint().await;
    let binding = services.bind(CHANNEL, creds(ep.url()));
    services.add_upload(
        CHANNEL,
        "file_1",
        "report.pdf",
        "application/pdf",
        b"pdf bytes",
    );
    let p = provider(&services);

    let mut args = Map::new();
    args.insert("file_ref".into(), json!("file_1"));
    args.insert("text".into(), json!("the report"));
    let out = p
        .invoke_tool(ToolCall {
            binding: &binding,
            tool_id: TOOL_FILE_SEND,
            arguments: &args,
            idempotency_key: "k1",
            progress: &NoProgress,
        })
        .await
        .unwrap();
    let id = out["message_id"].as_str().unwrap().to_owned();
    assert_eq!(out["status"], "sent");

    let v: Value = serde_json::from_slice(&ep.received()[0].raw).unwrap();
    // A URL the deployment signed, under the webhook's prefix at its public base URL.
    let url = v["files"][0]["download_url"].as_str().unwrap();
    assert!(
        url.starts_with("https://switchyard.example.com/webhook/files/refs/file_1?exp=")
            && url.contains("&sig="),
        "{url}"
    );
    assert_eq!(
        v,
        json!({
            "message_id": id,
            "connector_channel_id": CHANNEL,
            "text": "the report",
            "files": [{
                "file_ref": "file_1",
                "filename": "report.pdf",
                "mime_type": "application/pdf",
                "byte_size": 9,
                "download_url": url
            }]
        })
    );
}

#[tokio::test]
async fn file_of_another_channel_is_file_not_found() {
    let services = fake_services();
    let ep = endpoint().await;
    let binding = services.bind(CHANNEL, creds(ep.url()));
    services.add_upload("cch_other", "file_x", "a.txt", "text/plain", b"x");
    let p = provider(&services);
    for file_ref in ["file_x", "file_missing"] {
        let mut args = Map::new();
        args.insert("file_ref".into(), json!(file_ref));
        let e = p
            .invoke_tool(ToolCall {
                binding: &binding,
                tool_id: TOOL_FILE_SEND,
                arguments: &args,
                idempotency_key: "k",
                progress: &NoProgress,
            })
            .await
            .unwrap_err();
        assert_eq!(
            (e.kind, e.code.as_str(), e.retryable()),
            (ProviderErrorKind::InvalidInput, "file_not_found", false)
        );
    }
    assert!(ep.received().is_empty());
}

#[tokio::test]
async fn message_tool_ids_are_stable_across_retries() {
    let services = fake_services();
    let ep = endpoint().await;
    let binding = services.bind(CHANNEL, creds(ep.url()));
    let p = provider(&services);
    let mut args = Map::new();
    args.insert("text".into(), json!("ping"));
    let call = |key: &'static str| {
        let (p, binding, args) = (&p, &binding, &args);
        async move {
            p.invoke_tool(ToolCall {
                binding,
                tool_id: TOOL_MESSAGE_SEND,
                arguments: args,
                idempotency_key: key,
                progress: &NoProgress,
            })
            .await
        }
    };

    ep.answer(502);
    assert!(call("call-1").await.unwrap_err().retryable());
    ep.answer(200);
    let out = call("call-1").await.unwrap();
    let other = call("call-2").await.unwrap();

    let ids: Vec<String> = ep
        .received()
        .iter()
        .map(|r| {
            serde_json::from_slice::<Value>(&r.raw).unwrap()["message_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(ids[0], ids[1], "a retried call re-sends the same id");
    assert_eq!(ids[1], out["message_id"]);
    assert_ne!(ids[2], ids[1]);
    assert_eq!(other["message_id"], json!(ids[2]));

    let mut empty = Map::new();
    empty.insert("text".into(), json!(""));
    let e = p
        .invoke_tool(ToolCall {
            binding: &binding,
            tool_id: TOOL_MESSAGE_SEND,
            arguments: &empty,
            idempotency_key: "k",
            progress: &NoProgress,
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::InvalidInput);
}

/// Issue 9, finding 3: without an allowed range, an endpoint on an internal address is never
/// reached, whether the URL names the address (in any spelling) or a name resolves to it
/// (checked on the resolved address at connect time, so DNS rebinding cannot get through).
#[tokio::test]
async fn internal_endpoints_are_never_connected_without_an_allowed_range() {
    let services = fake_services();
    let ep = endpoint().await;
    let port = ep
        .url()
        .split(':')
        .nth(2)
        .and_then(|p| p.split('/').next())
        .unwrap();
    let mut cfg = config();
    cfg.outbound = switchyard_provider_webhook::OutboundPolicy::default();
    let p = WebhookProvider::new(cfg, services.clone());
    // Stored bindings skip the binding-time check (made before the guard, or rebinding).
    for url in [
        ep.url().to_owned(),
        format!("http://localhost:{port}/hook"),
        format!("http://2130706433:{port}/hook"),
        format!("http://[::ffff:127.0.0.1]:{port}/hook"),
        format!("http://127.1:{port}/hook"),
    ] {
        let binding = services.bind(CHANNEL, creds(&url));
        let e = deliver(&p, &binding, "out_x", "hi").await.unwrap_err();
        assert_eq!(e.kind, ProviderErrorKind::Rejected, "{url}: {e:?}");
        assert!(e.message.contains("outbound.allow_private"), "{url}: {e:?}");
    }
    assert!(ep.received().is_empty(), "an internal endpoint was reached");
    // The operator's allowed range lets the same endpoint through.
    let binding = services.bind(CHANNEL, creds(ep.url()));
    deliver(&provider(&services), &binding, "out_z", "hi")
        .await
        .unwrap();
    assert_eq!(ep.received().len(), 1);
}

/// A redirect is not followed: it would replay the signed body to a URL nobody checked.
#[tokio::test]
async fn redirects_are_not_followed() {
    let services = fake_services();
    let target = endpoint().await;
    let location = target.url().to_owned();
    let redirector = common::serve(axum::Router::new().fallback(move || {
        let location = location.clone();
        async move {
            (
                axum::http::StatusCode::TEMPORARY_REDIRECT,
                [(axum::http::header::LOCATION, location)],
            )
        }
    }))
    .await;
    let binding = services.bind(CHANNEL, creds(&format!("{redirector}/hook")));
    let e = deliver(&provider(&services), &binding, "out_r", "hi")
        .await
        .unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Rejected, "{e:?}");
    assert!(target.received().is_empty(), "the redirect was followed");
}
