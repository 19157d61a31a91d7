//! The `webhook_binding` form and the `webhook_pairing` link flow.

mod common;

use std::sync::Arc;

use common::{CHANNEL, FakeServices, config, fake_services, serve_ingress};
use serde_json::{Map, Value, json};
use switchyard_core::model::AuthStatus;
use switchyard_core::provider::{AuthRequest, AuthStep, Provider};
use switchyard_provider_webhook::{FLOW_BINDING, FLOW_PAIRING, WebhookProvider};

const GOOD_SECRET: &str = "correct-horse-battery";

async fn start(p: &WebhookProvider, flow: &str, session: &str, input: Value) -> AuthStep {
    let flow = p.card().flow(flow).unwrap();
    let input: Map<String, Value> = input.as_object().unwrap().clone();
    p.auth_start(AuthRequest {
        tenant_id: "ten_1",
        channel_id: CHANNEL,
        auth_session_id: session,
        flow,
        input: &input,
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn form_binds_valid_input() {
    let p = WebhookProvider::new(config(), fake_services());
    let step = start(
        &p,
        FLOW_BINDING,
        "as_1",
        json!({"endpoint_url": "https://chat.example.com/api/hook?token=abc", "signing_secret": GOOD_SECRET}),
    )
    .await;
    let AuthStep::Authenticated {
        credentials,
        view,
        binding_key,
    } = step
    else {
        panic!("{step:?}")
    };
    assert_eq!(
        credentials["endpoint_url"],
        "https://chat.example.com/api/hook?token=abc"
    );
    assert_eq!(credentials["signing_secret"], GOOD_SECRET);
    assert_eq!(view.display_name, "Webhook chat.example.com");
    assert_eq!(view.account_hint.as_deref(), Some("chat.example.com"));
    assert!(binding_key.is_none());
}

#[tokio::test]
async fn form_refuses_bad_input_without_echoing_secrets() {
    let p = WebhookProvider::new(config(), fake_services());
    let cases = [
        json!({"endpoint_url": "not a url", "signing_secret": GOOD_SECRET}),
        json!({"endpoint_url": "ftp://chat.example.com/x", "signing_secret": GOOD_SECRET}),
        json!({"endpoint_url": "https://admin:pw@chat.example.com/x", "signing_secret": GOOD_SECRET}),
        json!({"endpoint_url": "https://chat.example.com/x#frag", "signing_secret": GOOD_SECRET}),
        json!({"endpoint_url": "https://chat.example.com/x", "signing_secret": "tooShort-secret"}),
        json!({"endpoint_url": "https://chat.example.com/x"}),
        json!({"signing_secret": GOOD_SECRET}),
        json!({"endpoint_url": 5, "signing_secret": GOOD_SECRET}),
    ];
    for input in cases {
        let step = start(&p, FLOW_BINDING, "as_1", input.clone()).await;
        let AuthStep::Failed { code, message } = step else {
            panic!("{input} -> {step:?}")
        };
        assert_eq!(code, "invalid_input");
        assert!(!message.is_empty());
        if let Some(secret) = input["signing_secret"].as_str() {
            assert!(!message.contains(secret), "{message}");
        }
        assert!(
            !message.contains("pw@") && !message.contains("chat.example.com/x"),
            "{message}"
        );
    }
}

struct Pairing {
    services: Arc<FakeServices>,
    base: String,
    link: String,
    http: reqwest::Client,
    _provider: WebhookProvider,
}

/// Starts a pairing as the core would: auth_start, then the session stored with its state.
async fn pairing(session: &str) -> Pairing {
    let services = fake_services();
    let p = WebhookProvider::new(config(), services.clone());
    let base = serve_ingress(&p).await;
    let step = start(&p, FLOW_PAIRING, session, json!({})).await;
    let AuthStep::Pending {
        status,
        qr_code_text,
        poll_interval_ms,
        expires_at,
        state,
        ..
    } = step
    else {
        panic!("{step:?}")
    };
    assert_eq!(status, AuthStatus::Pending);
    assert_eq!(poll_interval_ms, 2000);
    assert!(expires_at > switchyard_core::ids::now_ms() + 9 * 60 * 1000);
    let qr = qr_code_text.unwrap();
    let prefix = format!("https://switchyard.example.com/webhook/pair/{session}?token=");
    assert!(qr.starts_with(&prefix), "{qr}");
    let token = qr.strip_prefix(&prefix).unwrap();
    assert!(token.len() >= 32);
    assert!(
        !state.to_string().contains(token),
        "only a hash of the token is kept"
    );
    services.open_session(session, CHANNEL, state);
    // Same path on the test server instead of the public base URL.
    let link = qr.replace("https://switchyard.example.com", &base);
    Pairing {
        services,
        base,
        link,
        http: reqwest::Client::new(),
        _provider: p,
    }
}

#[tokio::test]
async fn pairing_get_marks_scanned_and_post_completes() {
    let t = pairing("as_pair1").await;

    let resp = t.http.get(&t.link).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["cache-control"], "no-store");
    let page: Value = resp.json().await.unwrap();
    assert_eq!(page["submit"]["method"], "POST");
    {
        let steps = t.services.steps.lock().unwrap();
        assert_eq!(steps.len(), 1);
        assert!(matches!(
            steps[0].1,
            AuthStep::Pending {
                status: AuthStatus::Scanned,
                ..
            }
        ));
    }
    // A second visit does not advance again.
    let html = t
        .http
        .get(&t.link)
        .header("accept", "text/html")
        .send()
        .await
        .unwrap();
    assert!(
        html.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    assert!(html.text().await.unwrap().contains("<form"));
    assert_eq!(t.services.steps.lock().unwrap().len(), 1);

    // Invalid input leaves the session open.
    let resp = t
        .http
        .post(&t.link)
        .json(&json!({"endpoint_url": "https://chat.example.com/hook", "signing_secret": "short"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_input");

    let resp = t
        .http
        .post(&t.link)
        .json(&json!({"endpoint_url": "https://chat.example.com/hook?k=1", "signing_secret": GOOD_SECRET}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        v,
        json!({"status": "authenticated", "display_name": "Webhook chat.example.com"})
    );
    let steps = t.services.steps.lock().unwrap();
    let AuthStep::Authenticated {
        credentials, view, ..
    } = &steps[1].1
    else {
        panic!("{:?}", steps[1].1)
    };
    assert_eq!(steps[1].0, "as_pair1");
    assert_eq!(credentials["signing_secret"], GOOD_SECRET);
    assert_eq!(view.account_hint.as_deref(), Some("chat.example.com"));
}

#[tokio::test]
async fn pairing_accepts_the_html_form_post() {
    let t = pairing("as_pair2").await;
    // An internal range the operator did not allow is refused, with a reason.
    let refused = t
        .http
        .post(&t.link)
        .form(&[
            ("endpoint_url", "http://192.168.1.5:8080/in"),
            ("signing_secret", GOOD_SECRET),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 400);
    let v: Value = refused.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("outbound.allow_private"),
        "{v}"
    );
    let resp = t
        .http
        .post(&t.link)
        .header("accept", "text/html")
        .form(&[
            ("endpoint_url", "http://10.0.0.5:8080/in"),
            ("signing_secret", GOOD_SECRET),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert!(resp.text().await.unwrap().contains("Webhook 10.0.0.5"));
    assert!(matches!(
        t.services.steps.lock().unwrap()[0].1,
        AuthStep::Authenticated { .. }
    ));
}

#[tokio::test]
async fn pairing_refuses_bad_tokens_and_unknown_sessions() {
    let t = pairing("as_pair3").await;
    let bad = format!("{}/webhook/pair/as_pair3?token=0000", t.base);
    let resp = t.http.get(&bad).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 403);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_token");
    let resp = t
        .http
        .post(&bad)
        .json(&json!({"endpoint_url": "https://chat.example.com/hook", "signing_secret": GOOD_SECRET}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 403);
    let no_token = format!("{}/webhook/pair/as_pair3", t.base);
    assert_eq!(
        t.http
            .get(&no_token)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        403
    );
    assert!(t.services.steps.lock().unwrap().is_empty());

    let unknown = t.link.replace("as_pair3", "as_missing");
    assert_eq!(
        t.http.get(&unknown).send().await.unwrap().status().as_u16(),
        404
    );

    // Completed sessions are gone: the link cannot rebind the channel.
    let ok =
        json!({"endpoint_url": "https://chat.example.com/hook", "signing_secret": GOOD_SECRET});
    assert_eq!(
        t.http
            .post(&t.link)
            .json(&ok)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    assert_eq!(
        t.http
            .post(&t.link)
            .json(&ok)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        404
    );
}

#[tokio::test]
async fn pairing_link_expires() {
    let t = pairing("as_pair4").await;
    // Age the stored state past its expiry.
    t.services.edit_session_state("as_pair4", |state| {
        state["expires_at"] = json!(switchyard_core::ids::now_ms() - 1);
    });
    assert_eq!(
        t.http.get(&t.link).send().await.unwrap().status().as_u16(),
        404
    );
}
