//! The `telegram_bot_binding` form flow against the fake Bot API.

mod common;

use common::*;
use serde_json::json;
use switchyard_core::provider::AuthStep;
use switchyard_provider_telegram::Mode;

fn failed(step: &AuthStep) -> (String, String) {
    match step {
        AuthStep::Failed { code, message } => (code.clone(), message.clone()),
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[tokio::test]
async fn good_token_and_chat_bind_with_a_masked_descriptor() {
    let tg = fake().await;
    let pod = Pod::start(
        Cluster::new(),
        "pod-a",
        config(&tg.base_url(), Mode::Polling),
        false,
    )
    .await;
    let step = pod.auth("cch_1", TOKEN, json!(GROUP.to_string())).await;
    let AuthStep::Authenticated {
        credentials,
        view,
        binding_key,
    } = step
    else {
        panic!("{step:?}")
    };
    assert_eq!(view.display_name, "@switchyard_test_bot");
    assert_eq!(view.account_hint.as_deref(), Some("group …7890"));
    assert!(!serde_json::to_string(&view).unwrap().contains(TOKEN));
    assert_eq!(credentials["chat_id"], json!(GROUP));
    assert_eq!(credentials["bot_id"], json!(BOT_ID));
    assert_eq!(credentials["chat_type"], "supergroup");
    let key = binding_key.expect("binding key");
    assert!(!key.contains(TOKEN) && !key.contains("123456789"));
    // The same bot and chat give the same key (the core refuses the second channel);
    // another chat of the same bot gives another key.
    let AuthStep::Authenticated {
        binding_key: again, ..
    } = pod.auth("cch_2", TOKEN, json!(GROUP)).await
    else {
        panic!()
    };
    assert_eq!(again.as_deref(), Some(key.as_str()));
    let AuthStep::Authenticated {
        binding_key: other, ..
    } = pod.auth("cch_3", TOKEN, json!(CHAT)).await
    else {
        panic!()
    };
    assert_ne!(other.as_deref(), Some(key.as_str()));
    assert_eq!(tg.call_count("getMe"), 3);
    assert_eq!(tg.call_count("getChat"), 3);
}

#[tokio::test]
async fn public_username_is_normalised_to_the_numeric_chat() {
    let tg = fake().await;
    tg.set_chat_username(GROUP, "ops_chat");
    let pod = Pod::start(
        Cluster::new(),
        "pod-a",
        config(&tg.base_url(), Mode::Polling),
        false,
    )
    .await;
    let AuthStep::Authenticated { credentials, .. } =
        pod.auth("cch_1", TOKEN, json!("@ops_chat")).await
    else {
        panic!()
    };
    assert_eq!(credentials["chat_id"], json!(GROUP));
}

#[tokio::test]
async fn bad_token_wrong_chat_and_non_bots_are_refused() {
    let tg = fake().await;
    tg.add_account("987654321:UserAccountTokenNotABot", "ada_user", false);
    let pod = Pod::start(
        Cluster::new(),
        "pod-a",
        config(&tg.base_url(), Mode::Polling),
        false,
    )
    .await;

    let unknown = "111111111:NoSuchBotTokenAtTelegramXYZ";
    let (code, message) = failed(&pod.auth("cch_1", unknown, json!(CHAT)).await);
    assert_eq!(code, "target_auth_failed");
    assert!(!message.contains(unknown));

    let (code, _) = failed(&pod.auth("cch_1", TOKEN, json!(424242)).await);
    assert_eq!(code, "chat_not_found");

    let (code, message) = failed(
        &pod.auth("cch_1", "987654321:UserAccountTokenNotABot", json!(CHAT))
            .await,
    );
    assert_eq!(code, "invalid_input");
    assert!(message.contains("bot"));

    tg.add_chat(BOT_ID, "private", "the bot");
    let (_, message) = failed(&pod.auth("cch_1", TOKEN, json!(BOT_ID)).await);
    assert!(message.contains("bot itself"), "{message}");

    // Malformed input never reaches Telegram (the token becomes part of a URL path).
    let calls = tg.call_count("getMe");
    for bad in ["", "not-a-token", "123:abc/../../x", "123:abcdefgh?x=1"] {
        let (code, _) = failed(&pod.auth("cch_1", bad, json!(CHAT)).await);
        assert_eq!(code, "invalid_input", "{bad}");
    }
    let (code, _) = failed(&pod.auth("cch_1", TOKEN, json!("@a b")).await);
    assert_eq!(code, "invalid_input");
    assert_eq!(tg.call_count("getMe"), calls);
    assert!(!captured_logs().contains(unknown));
}

#[tokio::test]
async fn telegram_outage_during_binding_is_retryable() {
    let tg = fake().await;
    let pod = Pod::start(
        Cluster::new(),
        "pod-a",
        config(&tg.base_url(), Mode::Polling),
        false,
    )
    .await;
    // Two 502s are retried in place (getMe is a read); the third attempt succeeds.
    tg.fail_next("getMe", 2, switchyard_fake_telegram::Failure::Status(502));
    assert!(matches!(
        pod.auth("cch_1", TOKEN, json!(CHAT)).await,
        AuthStep::Authenticated { .. }
    ));
    // A lasting outage surfaces as a retryable provider error.
    tg.fail_next(
        "getChat",
        10,
        switchyard_fake_telegram::Failure::Status(500),
    );
    let flow = pod
        .provider
        .card()
        .flow("telegram_bot_binding")
        .unwrap()
        .clone();
    let mut input = serde_json::Map::new();
    input.insert("bot_token".into(), json!(TOKEN));
    input.insert("chat_id".into(), json!(CHAT));
    use switchyard_core::provider::Provider;
    let err = pod
        .provider
        .auth_start(switchyard_core::provider::AuthRequest {
            tenant_id: "t",
            channel_id: "c",
            auth_session_id: "a",
            flow: &flow,
            input: &input,
        })
        .await
        .unwrap_err();
    assert!(err.retryable(), "{err:?}");
    assert!(!err.message.contains(TOKEN));
}
