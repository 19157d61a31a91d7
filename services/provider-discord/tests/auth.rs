//! The `discord_bot_binding` form flow against the fake: the token checked with
//! `GET /users/@me`, clear failures, and no secret in what the binding shows.

mod common;

use common::*;
use switchyard_core::provider::AuthStep;

#[tokio::test]
async fn a_good_token_binds_the_bot_by_its_name() {
    let dc = fake().await;
    let pod = Pod::start(Cluster::new(), "pod-a", config(&dc.api_base()), false).await;
    match pod.auth("cch_1", TOKEN).await {
        AuthStep::Authenticated {
            credentials,
            view,
            binding_key,
        } => {
            assert_eq!(view.display_name, "switchyard_test_bot");
            assert_eq!(view.account_hint.as_deref(), Some("Discord bot …0001"));
            assert_eq!(credentials["bot_id"], BOT_ID);
            let key = binding_key.expect("a binding key");
            assert!(!key.contains(BOT_ID) && !key.contains("GhIjKl"));
        }
        other => panic!("{other:?}"),
    }
    // A pasted "Bot " prefix is the same token.
    let with_prefix = format!("Bot {TOKEN}");
    assert!(matches!(
        pod.auth("cch_1", &with_prefix).await,
        AuthStep::Authenticated { .. }
    ));
}

#[tokio::test]
async fn a_refused_or_malformed_token_fails_clearly() {
    let dc = fake().await;
    let pod = Pod::start(Cluster::new(), "pod-a", config(&dc.api_base()), false).await;
    let unknown = "MTEwMDAwMDAwMDAwMDAwMDk5OQ.ZzZzZz.not-a-real-token_0123456789abcdefgh";
    match pod.auth("cch_1", unknown).await {
        AuthStep::Failed { code, message } => {
            assert_eq!(code, "target_auth_failed");
            assert!(message.contains("Developer Portal"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(dc.calls("users_me"), 1, "refused once, not retried");
    for bad in ["", "not a token", "abc.def"] {
        match pod.auth("cch_1", bad).await {
            AuthStep::Failed { code, .. } => assert_eq!(code, "invalid_input", "{bad:?}"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert_eq!(
        dc.calls("users_me"),
        1,
        "malformed tokens never reach Discord"
    );
    // A revoked token is refused the same way.
    dc.revoke(TOKEN);
    assert!(matches!(
        pod.auth("cch_1", TOKEN).await,
        AuthStep::Failed { ref code, .. } if code == "target_auth_failed"
    ));
}
