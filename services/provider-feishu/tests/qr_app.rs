//! `feishu_qr_create_app` against the fake accounts host: the QR of a new registration,
//! approval on Feishu and on Lark, refusal, expiry and refresh, `slow_down`.

mod common;

use common::*;
use serde_json::json;
use switchyard_core::model::AuthStatus;
use switchyard_core::provider::AuthStep;
use switchyard_fake_feishu::{Brand, FakeFeishu};

const CH: &str = "cch_fs_qr";

fn device_code(fake: &FakeFeishu, i: usize) -> String {
    fake.registrations()[i].device_code.clone()
}

/// Moves the flow's clock: edits the session's provider state as time passing would.
fn edit_state(cluster: &Cluster, id: &str, f: impl FnOnce(&mut serde_json::Value)) {
    cluster.edit_session_state(id, f);
}

#[tokio::test]
async fn qr_creates_a_feishu_app_and_binds_it_like_the_form() {
    let fake = fake().await;
    // Feishu gives no interval: the provider takes the SDKs' 5 s (the fake checks none).
    fake.set_registration_timing(0, 600);
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fake.base_url()), false).await;
    let step = pod.qr_start(CH, "auth_qr_1").await;
    match &step {
        AuthStep::Pending {
            status,
            qr_code_text,
            poll_interval_ms,
            ..
        } => {
            assert_eq!(*status, AuthStatus::Pending);
            assert!(qr_code_text.is_none(), "the QR comes a moment later");
            assert_eq!(*poll_interval_ms, 500);
        }
        other => panic!("{other:?}"),
    }
    let s = pod.qr_shown("auth_qr_1").await;
    let reg = fake.registrations()[0].clone();
    assert_eq!(fake.registration_inits(), 1, "init comes before begin");
    assert!(
        s.qr_code_text
            .as_deref()
            .unwrap()
            .starts_with(&format!("{}&", reg.verification_uri_complete)),
        "Feishu's link with the SDK's parameters: {:?}",
        s.qr_code_text
    );
    assert!(
        s.qr_code_image
            .as_deref()
            .unwrap()
            .starts_with("data:image/png;base64,iVBOR")
    );
    assert_eq!(s.poll_interval_ms, 5000);
    // Another pod answers from the session state alone; nothing approved yet.
    let other = Pod::start(cluster.clone(), "b", config(&fake.base_url()), false).await;
    let s = other.qr_status("auth_qr_1", false).await;
    assert_eq!(s.status, AuthStatus::Pending);
    assert!(s.qr_code_text.is_some());
    assert_eq!(fake.registrations()[0].polls.len(), 1);
    // Asked again at once: Feishu is not polled before its interval has passed.
    let s = pod.qr_status("auth_qr_1", false).await;
    assert_eq!(s.status, AuthStatus::Pending);
    assert_eq!(fake.registrations()[0].polls.len(), 1);

    // The next poll (after the interval) finds the app approved.
    let (app_id, secret) = fake
        .approve_registration(&reg.device_code, Brand::Feishu)
        .unwrap();
    edit_state(&cluster, "auth_qr_1", |st| st["next_poll_at"] = json!(0));
    let s = other.qr_status("auth_qr_1", false).await;
    assert_eq!(s.status, AuthStatus::Authenticated, "{s:?}");
    let creds = s.credentials.clone().unwrap();
    assert_eq!(creds["app_id"], app_id);
    assert_eq!(creds["domain"], "feishu");
    assert!(creds["verification_token"].is_null(), "long connection");
    assert_eq!(creds["bot_name"], "xAgent Assistant");
    assert_eq!(cluster.binding(CH).credentials["app_secret"], secret);

    // The same app through the form: the same binding key, so the core refuses it twice.
    let form = pod
        .auth("cch_other", json!({"app_id": app_id, "app_secret": secret}))
        .await;
    match form {
        AuthStep::Authenticated { binding_key, .. } => assert_eq!(binding_key, s.binding_key),
        other => panic!("{other:?}"),
    }
    assert!(!captured_logs().contains(&secret));
    assert!(!captured_logs().contains(&reg.device_code));
    assert!(!s.message.contains(&secret));
}

#[tokio::test]
async fn a_lark_user_moves_the_registration_to_lark() {
    let feishu = FakeFeishu::start().await;
    let lark = FakeFeishu::start().await;
    lark.set_accounts_brand(Brand::Lark);
    let mut cfg = config("http://127.0.0.1:9");
    cfg.accounts_base = feishu.base_url();
    cfg.lark_accounts_base = lark.base_url();
    cfg.lark_api_base = lark.base_url();
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", cfg, false).await;
    pod.qr_start(CH, "auth_qr_l").await;
    pod.qr_shown("auth_qr_l").await;
    let dc = device_code(&feishu, 0);
    assert!(feishu.approve_registration(&dc, Brand::Lark).is_none());
    let (app_id, _) = lark.approve_registration(&dc, Brand::Lark).unwrap();
    let s = pod.qr_status("auth_qr_l", false).await;
    assert_eq!(s.status, AuthStatus::Authenticated, "{s:?}");
    let creds = s.credentials.unwrap();
    assert_eq!(creds["app_id"], app_id);
    assert_eq!(creds["domain"], "lark", "bound on the Lark API base");
    assert_eq!(feishu.registrations()[0].polls.len(), 1);
    assert_eq!(lark.registrations()[0].polls.len(), 1);
}

#[tokio::test]
async fn a_refusal_fails_the_flow() {
    let fake = fake().await;
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fake.base_url()), false).await;
    pod.qr_start(CH, "auth_qr_d").await;
    pod.qr_shown("auth_qr_d").await;
    fake.deny_registration(&device_code(&fake, 0));
    let s = pod.qr_status("auth_qr_d", false).await;
    assert_eq!(s.status, AuthStatus::Failed);
    assert_eq!(s.failure_code.as_deref(), Some("target_auth_failed"));
    assert!(s.message.contains("refused"), "{}", s.message);
    assert!(cluster.bindings().is_empty());
}

#[tokio::test]
async fn an_expired_code_asks_for_a_refresh_which_brings_a_new_qr() {
    let fake = fake().await;
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fake.base_url()), false).await;
    pod.qr_start(CH, "auth_qr_e").await;
    let first = pod.qr_shown("auth_qr_e").await;
    fake.expire_registration(&device_code(&fake, 0));
    let s = pod.qr_status("auth_qr_e", false).await;
    assert_eq!(s.status, AuthStatus::QrRefreshRequired);
    assert!(s.qr_code_text.is_none() && s.qr_code_image.is_none());
    // Waiting for the refresh: Feishu is not asked again.
    let s = pod.qr_status("auth_qr_e", false).await;
    assert_eq!(s.status, AuthStatus::QrRefreshRequired);
    assert_eq!(fake.registrations()[0].polls.len(), 1);
    let s = pod.qr_status("auth_qr_e", true).await;
    assert_eq!(s.status, AuthStatus::Pending);
    assert_eq!(fake.registrations().len(), 2, "a new registration");
    assert_ne!(s.qr_code_text, first.qr_code_text);
    assert!(
        s.qr_code_text
            .as_deref()
            .unwrap()
            .starts_with(&fake.registrations()[1].verification_uri_complete)
    );
    // Past the lifetime Feishu gave the code, no poll is needed to know.
    let polls = fake.registrations()[1].polls.len();
    edit_state(&cluster, "auth_qr_e", |st| st["qr_expires_at"] = json!(1));
    let s = pod.qr_status("auth_qr_e", false).await;
    assert_eq!(s.status, AuthStatus::QrRefreshRequired);
    assert_eq!(fake.registrations()[1].polls.len(), polls);
}

#[tokio::test]
async fn slow_down_lengthens_the_interval_and_is_honoured() {
    let fake = fake().await;
    fake.set_registration_timing(2, 600);
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fake.base_url()), false).await;
    pod.qr_start(CH, "auth_qr_s").await;
    let s = pod.qr_shown("auth_qr_s").await;
    assert_eq!(s.poll_interval_ms, 2000);
    let dc = device_code(&fake, 0);
    fake.slow_down_registration(&dc, 1);
    let s = pod.qr_status("auth_qr_s", false).await;
    assert_eq!(s.status, AuthStatus::Pending);
    assert_eq!(s.poll_interval_ms, 7000, "5 s more");
    assert!(s.message.contains("less often"), "{}", s.message);
    assert!(s.qr_code_text.is_some(), "the QR stays");
    // The client asks again at once (and again): the accounts host is not polled.
    fake.approve_registration(&dc, Brand::Feishu).unwrap();
    for _ in 0..3 {
        let s = pod.qr_status("auth_qr_s", false).await;
        assert_eq!(s.status, AuthStatus::Pending);
    }
    assert_eq!(fake.registrations()[0].polls.len(), 1);
    // Once the longer interval passed, the poll goes out and the fake finds it on time.
    let st = cluster.session("auth_qr_s").state;
    assert_eq!(st["interval_s"], 7);
    let next = st["next_poll_at"].as_i64().unwrap();
    assert!(next >= fake.registrations()[0].polls[0] + 6_500);
    edit_state(&cluster, "auth_qr_s", |st| st["next_poll_at"] = json!(0));
    let s = pod.qr_status("auth_qr_s", false).await;
    // Rewinding the provider's clock does not rewind the fake's: polled too early, it says
    // slow_down again, which the provider takes in its stride.
    assert_eq!(s.status, AuthStatus::Pending);
    assert_eq!(s.poll_interval_ms, 12_000);
}

/// The QR link carries what node-sdk's `registerApp` adds (`from`, `tp`, `source`,
/// `createOnly`, `addons`): the app the user creates with it has the bot, the message
/// permissions, the contact permission and the `im.message.receive_v1` subscription, so it
/// receives and answers messages with no visit to the developer console.
#[tokio::test]
async fn the_qr_link_creates_an_app_that_receives_and_answers_messages() {
    let fake = fake().await;
    fake.set_registration_timing(1, 600);
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fake.base_url()), true).await;
    pod.qr_start(CH, "auth_qr_link").await;
    let s = pod.qr_shown("auth_qr_link").await;
    let link = s.qr_code_text.clone().unwrap();
    // The user opens the link shown as the QR code and approves.
    let (app_id, _) = fake
        .scan_registration(&link, Brand::Feishu)
        .expect("the link names the registration");
    let reg = fake.registrations()[0].clone();
    let l = reg.link.clone().unwrap();
    assert_eq!(
        (l.param("from"), l.param("tp"), l.param("createOnly")),
        (Some("sdk"), Some("sdk"), Some("true"))
    );
    let (scopes, events) = fake.app_config(&app_id).unwrap();
    assert!(
        events.contains(switchyard_fake_feishu::MESSAGE_EVENT),
        "{events:?}"
    );
    for scope in switchyard_fake_feishu::MESSAGE_SCOPES
        .iter()
        .chain([&switchyard_fake_feishu::CONTACT_SCOPE])
    {
        assert!(scopes.contains(*scope), "{scope} in {scopes:?}");
    }
    edit_state(&cluster, "auth_qr_link", |st| st["next_poll_at"] = json!(0));
    let s = pod.qr_status("auth_qr_link", false).await;
    assert_eq!(s.status, AuthStatus::Authenticated, "{s:?}");
    pod.provider.refresh().await.unwrap();
    eventually(WAIT, "long connection", || async {
        (fake.connections(&app_id) == 1).then_some(())
    })
    .await;
    fake.add_user("ou_creator", "Grace Hopper");
    let pushed = fake.push_text(
        &app_id,
        &switchyard_fake_feishu::Chat::P2p {
            user_open_id: "ou_creator".into(),
        },
        "hello new app",
    );
    let got = inbound_n(&cluster, 1).await;
    assert_eq!(got[0].1.message_id, pushed.message_id);
    assert_eq!(got[0].1.sender_name.as_deref(), Some("Grace Hopper"));
    pod.deliver(CH, "msg_answer", Some("hello Grace"), &[])
        .await
        .unwrap();
    assert_eq!(fake.sent_messages(&pushed.chat_id).len(), 1);
}

/// The code's lifetime is Feishu's `expires_in` (node-sdk's name): past it the flow asks
/// for a refresh without waiting for the next poll.
#[tokio::test]
async fn the_code_lifetime_is_read_from_expires_in() {
    let fake = fake().await;
    fake.set_registration_timing(30, 1);
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fake.base_url()), false).await;
    pod.qr_start(CH, "auth_qr_x").await;
    pod.qr_shown("auth_qr_x").await;
    let st = cluster.session("auth_qr_x").state;
    let lifetime = st["qr_expires_at"].as_i64().unwrap() - st["started_at"].as_i64().unwrap();
    assert!((900..=1500).contains(&lifetime), "{lifetime} ms");
    let s = eventually(WAIT, "expired", || async {
        let s = pod.qr_status("auth_qr_x", false).await;
        (s.status != AuthStatus::Pending).then_some(s)
    })
    .await;
    assert_eq!(s.status, AuthStatus::QrRefreshRequired);
    assert!(
        fake.registrations()[0].polls.len() <= 1,
        "expiry known without polling"
    );
}
