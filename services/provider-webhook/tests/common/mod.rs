//! What the webhook tests share: the settings, the binding's credentials, the fake chat
//! system (`switchyard-fake-webhook`, a real HTTP server on 127.0.0.1:0) and a services at the
//! public base URL the pairing links use. The in-memory services itself comes from
//! `switchyard_core::testkit`.

#![allow(dead_code)] // each test binary uses a different part of the harness

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use serde_json::{Value, json};
use switchyard_core::provider::Provider;
use switchyard_fake_webhook::FakeWebhook;
use switchyard_provider_webhook::{OutboundPolicy, PREFIX, WebhookConfig, WebhookProvider};

pub use switchyard_core::testkit::*;

pub const SECRET: &str = "s3cr3t-signing-key-0123";
pub const CHANNEL: &str = "cch_test";
/// The public base URL of the test deployment (pairing links and download URLs use it).
pub const BASE_URL: &str = "https://switchyard.example.com";

pub fn config() -> WebhookConfig {
    let mut cfg = WebhookConfig::new(build_info(), true);
    cfg.max_inbound_bytes = 64 * 1024;
    cfg.max_inbound_json_bytes = 32 * 1024;
    cfg.request_timeout = Duration::from_millis(500);
    // The fake endpoints listen on 127.0.0.1; the pairing tests bind an on-premises endpoint
    // in 10.0.0.0/8. Other internal ranges stay refused.
    cfg.outbound = OutboundPolicy::new(vec![
        "127.0.0.0/8".parse().unwrap(),
        "10.0.0.0/8".parse().unwrap(),
    ]);
    cfg
}

/// The services of a one-pod cluster at [`BASE_URL`].
pub fn fake_services() -> Arc<FakeServices> {
    FakeServices::new(Cluster::new(), "pod-a", BASE_URL, PREFIX)
}

/// The credentials of a channel bound to `endpoint_url`, signed with [`SECRET`].
pub fn creds(endpoint_url: &str) -> Value {
    json!({"endpoint_url": endpoint_url, "signing_secret": SECRET})
}

/// Serves the provider's ingress under its prefix, like the edge does; returns the base URL.
pub async fn serve_ingress(provider: &WebhookProvider) -> String {
    let router = provider.ingress().expect("webhook provider has ingress");
    serve(Router::new().nest(provider.prefix(), router)).await
}

pub async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{addr}")
}

/// The chat system's side: records every post and answers with a settable status.
pub async fn endpoint() -> FakeWebhook {
    FakeWebhook::start("/hooks/in?token=path-secret-token", None).await
}

/// A URL where nothing listens: bind a port, then free it.
pub async fn refused_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}/hooks/in?token=path-secret-token")
}
