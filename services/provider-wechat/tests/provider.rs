//! `im.wechat` against the fake iLink server: QR login, ingress of every item type, egress
//! of text and media, typing, stale tokens and failures.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use switchyard_core::model::AuthStatus;
use switchyard_core::provider::AuthStep;
use switchyard_fake_wechat::{Failure, FakeWechat, Item, MediaUrls};
use switchyard_protocol::ConnectionStatus;
use switchyard_provider_wechat::{FLOW_QR, WechatConfig};

const CH: &str = "cch_wx_1";

#[tokio::test]
async fn qr_login_pending_at_once_then_scanned_then_authenticated() {
    let fake = FakeWechat::start().await;
    fake.slow("get_bot_qrcode", Duration::from_millis(300));
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fake), false).await;
    let t = Instant::now();
    let step = pod.auth_start(CH, "auth_1").await;
    assert!(
        t.elapsed() < Duration::from_millis(250),
        "auth.start does not wait for the QR"
    );
    match &step {
        AuthStep::Pending {
            status,
            qr_code_text,
            poll_interval_ms,
            ..
        } => {
            assert_eq!(*status, AuthStatus::Pending);
            assert!(qr_code_text.is_none());
            assert_eq!(*poll_interval_ms, 500);
        }
        other => panic!("{other:?}"),
    }
    // Polled while the QR is being fetched: nothing changes.
    let s = pod.auth_status("auth_1", false).await;
    assert!(s.qr_code_text.is_none());
    let s = eventually(WAIT, "QR in the session", || async {
        let s = cluster.session("auth_1");
        s.qr_code_text.is_some().then_some(s)
    })
    .await;
    let code = fake.qr_codes()[0].clone();
    assert_eq!(s.qr_code_text, fake.qr_content(&code));
    assert!(
        s.qr_code_image
            .as_deref()
            .unwrap()
            .starts_with("data:image/png;base64,iVBOR")
    );
    // Any pod answers auth.status from the session state alone.
    let other = Pod::start(cluster.clone(), "b", config(&fake), false).await;
    assert_eq!(
        other.auth_status("auth_1", false).await.status,
        AuthStatus::Pending
    );
    fake.scan(&code);
    let s = other.auth_status("auth_1", false).await;
    assert_eq!(s.status, AuthStatus::Scanned);
    assert!(s.qr_code_text.is_some(), "the QR stays while scanned");
    // A confirmation naming another host is not followed: the configured api_base is used.
    fake.set_confirm_baseurl(Some("http://203.0.113.9:1"));
    let bot = fake.confirm(&code).unwrap();
    let s = pod.auth_status("auth_1", false).await;
    assert_eq!(s.status, AuthStatus::Authenticated);
    let creds = s.credentials.unwrap();
    assert_eq!(creds["ilink_bot_id"], bot.bot_id);
    assert_eq!(creds["ilink_user_id"], bot.user_id);
    assert_eq!(creds["base_url"], fake.base_url());
    assert_eq!(cluster.binding(CH).credentials["bot_token"], bot.token);
    assert!(!captured_logs().contains(&bot.token));
}

/// Issue 22 point 1: `get_bot_qrcode` is a POST with the official body (iLink refuses a GET),
/// and `get_qrcode_status` is a long poll held up to the official client's 35 s.
#[tokio::test]
async fn the_qr_code_is_asked_for_with_a_post_and_its_status_is_a_held_long_poll() {
    assert_eq!(
        WechatConfig::new(build_info(), "https://a", "https://b").qr_status_timeout,
        Duration::from_secs(35)
    );
    let fake = FakeWechat::start().await;
    let cluster = Cluster::new();
    let mut cfg = config(&fake);
    cfg.qr_status_timeout = Duration::from_secs(5);
    fake.set_qr_hold(Duration::from_secs(1));
    let pod = Pod::start(cluster.clone(), "a", cfg, false).await;
    pod.auth_start(CH, "auth_p").await;
    eventually(WAIT, "QR", || async {
        let s = cluster.session("auth_p");
        assert_ne!(s.status, AuthStatus::Failed, "{s:?}");
        s.qr_code_text.is_some().then_some(())
    })
    .await;
    let reqs = fake.qr_requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0]["local_token_list"], json!([]));
    assert!(reqs[0]["base_info"]["channel_version"].is_string());
    // A `wait` is held by iLink and waited for, not cut after a few seconds.
    let t = Instant::now();
    let s = pod.auth_status("auth_p", false).await;
    assert_eq!(s.status, AuthStatus::Pending);
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    // A scan during the hold is answered at once.
    let code = fake.qr_codes()[0].clone();
    let t = Instant::now();
    let (s, ()) = tokio::join!(pod.auth_status("auth_p", false), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        fake.scan(&code);
    });
    assert_eq!(s.status, AuthStatus::Scanned);
    assert!(
        t.elapsed() < Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
}

/// Issue 22 point 2: `scaned_but_redirect` moves the status poll to `redirect_host`, where
/// the login completes (the first site never reports it).
#[tokio::test]
async fn a_login_redirected_to_another_data_centre_completes() {
    let fake = FakeWechat::start().await;
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fake), false).await;
    pod.auth_start(CH, "auth_r").await;
    eventually(WAIT, "QR", || async {
        cluster
            .session("auth_r")
            .qr_code_text
            .is_some()
            .then_some(())
    })
    .await;
    let code = fake.qr_codes()[0].clone();
    fake.redirect_qr(&code);
    fake.scan(&code);
    let s = pod.auth_status("auth_r", false).await;
    assert_eq!(s.status, AuthStatus::Scanned);
    assert_eq!(s.state["base"], format!("http://{}", fake.idc2_host()));
    let bot = fake.confirm(&code).unwrap();
    // Any pod continues there: the data centre is in the session state.
    let other = Pod::start(cluster.clone(), "b", config(&fake), false).await;
    let s = other.auth_status("auth_r", false).await;
    assert_eq!(s.status, AuthStatus::Authenticated, "{s:?}");
    assert_eq!(cluster.binding(CH).credentials["bot_token"], bot.token);
    assert!(
        fake.calls()
            .iter()
            .any(|c| c.endpoint == "get_qrcode_status" && c.outcome == "ok_idc2")
    );
}

/// Waits for the QR of a session; returns the fake's QR code.
async fn qr_of(fake: &FakeWechat, cluster: &Cluster, session: &str) -> String {
    eventually(WAIT, "QR", || async {
        cluster
            .session(session)
            .qr_code_text
            .is_some()
            .then_some(())
    })
    .await;
    fake.qr_codes().last().cloned().expect("qr")
}

/// Issue 22 point 3: `need_verifycode` asks the user for the phone's number (the flow's
/// message says how: `auth.start` with `verify_code`), the status poll is repeated with it,
/// and the login completes.
#[tokio::test]
async fn a_login_that_needs_the_phone_number_asks_for_it_and_continues_with_it() {
    let fake = FakeWechat::start().await;
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fake), false).await;
    pod.auth_start(CH, "auth_v1").await;
    let code = qr_of(&fake, &cluster, "auth_v1").await;
    let number = fake.require_verify_code(&code);
    fake.scan(&code);
    let s = pod.auth_status("auth_v1", false).await;
    assert_eq!(s.status, AuthStatus::Scanned, "{s:?}");
    assert!(
        s.message.contains("verify_code") && s.message.contains("auth.start"),
        "{}",
        s.message
    );
    let flow = pod.flow(FLOW_QR);
    assert!(
        flow.fields
            .iter()
            .any(|f| f.name == "verify_code" && !f.required)
    );
    // A wrong number is said to be wrong; the login goes on.
    let step = pod
        .session_start(FLOW_QR, CH, "auth_v2", json!({"verify_code": "000000x"}))
        .await;
    assert!(
        matches!(
            step,
            AuthStep::Pending {
                status: AuthStatus::Scanned,
                ..
            }
        ),
        "{step:?}"
    );
    let s = pod.auth_status("auth_v2", false).await;
    assert!(s.message.contains("did not match"), "{}", s.message);
    // The right number: iLink accepts it, the phone confirms, the channel is bound.
    pod.session_start(FLOW_QR, CH, "auth_v3", json!({"verify_code": number}))
        .await;
    let s = pod.auth_status("auth_v3", false).await;
    assert_eq!(s.status, AuthStatus::Scanned);
    assert!(s.message.contains("matched"), "{}", s.message);
    let bot = fake.confirm(&code).unwrap();
    let s = pod.auth_status("auth_v3", false).await;
    assert_eq!(s.status, AuthStatus::Authenticated, "{s:?}");
    assert_eq!(cluster.binding(CH).credentials["bot_token"], bot.token);
    // Nothing waits for a number any more.
    let e = pod
        .try_auth(
            &flow,
            CH,
            "auth_v4",
            json!({"verify_code": "123456"}).as_object().unwrap(),
        )
        .await
        .unwrap_err();
    assert!(e.message.contains("no WeChat login"), "{e:?}");
}

/// Issue 22 point 3: three wrong numbers end the login with a clear message.
#[tokio::test]
async fn a_blocked_verify_code_fails_the_login_with_a_clear_message() {
    let fake = FakeWechat::start().await;
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fake), false).await;
    pod.auth_start(CH, "auth_b0").await;
    let code = qr_of(&fake, &cluster, "auth_b0").await;
    fake.require_verify_code(&code);
    fake.scan(&code);
    pod.auth_status("auth_b0", false).await;
    let mut last = None;
    for n in 1..=3 {
        let sid = format!("auth_b{n}");
        pod.session_start(FLOW_QR, CH, &sid, json!({"verify_code": "1"}))
            .await;
        last = Some(pod.auth_status(&sid, false).await);
    }
    let s = last.unwrap();
    assert_eq!(s.status, AuthStatus::Failed, "{s:?}");
    assert!(
        s.message.contains("too many wrong numbers"),
        "{}",
        s.message
    );
}

/// Issue 22 point 4: a confirmation's `baseurl` on an allowed host (or the API host on
/// another port) is where the bot is polled; before, it was replaced by the API base.
#[tokio::test]
async fn a_bot_assigned_to_another_allowed_host_is_polled_there() {
    let fake = FakeWechat::start().await;
    fake.set_long_poll(Duration::from_millis(300));
    let cluster = Cluster::new();
    let mut cfg = config(&fake);
    cfg.allowed_base_hosts = vec!["localhost".into()];
    let pod = Pod::start(cluster.clone(), "a", cfg, true).await;
    let port = fake.addr().port();
    let other = format!("http://localhost:{port}");
    fake.set_confirm_baseurl(Some(&other));
    let bot = pod.login(&fake, CH).await;
    assert_eq!(cluster.binding(CH).credentials["base_url"], other);
    fake.push_text(&bot.token, "via the assigned host");
    let got = inbound_n(&cluster, 1).await;
    assert_eq!(got[0].1.text.as_deref(), Some("via the assigned host"));
    // The API host on another port is the same host.
    let idc2 = format!("http://{}", fake.idc2_host());
    fake.set_confirm_baseurl(Some(&idc2));
    pod.login(&fake, "cch_wx_2").await;
    assert_eq!(cluster.binding("cch_wx_2").credentials["base_url"], idc2);
    // Elsewhere is refused, with the reason logged.
    fake.set_confirm_baseurl(Some("http://example.com"));
    pod.login(&fake, "cch_wx_3").await;
    assert_eq!(
        cluster.binding("cch_wx_3").credentials["base_url"],
        fake.base_url()
    );
    assert!(captured_logs().contains("host is neither the API host nor under an allowed host"));
}

/// Issue 22 point 5: media iLink addresses only by `full_url` / `upload_full_url` is
/// downloaded and uploaded there (an image-only message is not dropped as empty), and a
/// voice note's audio is fetched beside its transcript.
#[tokio::test]
async fn media_with_only_full_urls_and_voice_audio_arrive_and_go_out() {
    let fake = FakeWechat::start().await;
    fake.set_long_poll(Duration::from_millis(300));
    fake.set_media_urls(MediaUrls::FullUrl);
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fake), true).await;
    let bot = pod.login(&fake, CH).await;
    let me = bot.user_id.clone();
    fake.push(&bot.token, &me, &[Item::Image(b"ONLY-AN-IMAGE".to_vec())]);
    fake.push(
        &bot.token,
        &me,
        &[Item::VoiceNote {
            text: Some("明天开会".into()),
            audio: b"#!SILK_V3 spoken words".to_vec(),
        }],
    );
    fake.push(
        &bot.token,
        &me,
        &[Item::File {
            name: "a.txt".into(),
            bytes: b"file body".to_vec(),
        }],
    );
    let got = inbound_n(&cluster, 3).await;
    let m = |i: usize| &got[i].1;
    assert_eq!(m(0).text, None);
    assert_eq!(
        cluster.file(&m(0).files[0].file_ref).bytes,
        b"ONLY-AN-IMAGE"
    );
    assert_eq!(m(1).text.as_deref(), Some("[Voice message] 明天开会"));
    let voice = cluster.file(&m(1).files[0].file_ref);
    assert_eq!(voice.bytes, b"#!SILK_V3 spoken words");
    assert_eq!(voice.mime_type.as_deref(), Some("audio/silk"));
    assert_eq!(cluster.file(&m(2).files[0].file_ref).bytes, b"file body");
    // Out: getuploadurl answers only upload_full_url.
    cluster.add_upload(CH, "file_up_9", "pic.png", "image/png", b"PNG-OUT");
    pod.deliver(CH, "msg_fu", None, &["file_up_9"])
        .await
        .unwrap();
    let sent = fake.sent(&bot.token);
    assert_eq!(sent.last().unwrap().media[0], b"PNG-OUT");
}

/// `iLink-App-ClientVersion` as api.ts encodes a version: `0x00MMNNPP` in decimal.
fn encoded(version: &str) -> String {
    let p: Vec<u32> = version.split('.').map(|x| x.parse().unwrap()).collect();
    ((p[0] << 16) | (p[1] << 8) | p[2]).to_string()
}

/// Issue 22 point 7: every call's `iLink-App-ClientVersion` header encodes the
/// `base_info.channel_version` its bodies name.
#[tokio::test]
async fn every_call_names_one_client_version() {
    let fake = FakeWechat::start().await;
    fake.set_long_poll(Duration::from_millis(300));
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fake), true).await;
    let bot = pod.login(&fake, CH).await;
    fake.push_text(&bot.token, "hi");
    inbound_n(&cluster, 1).await;
    eventually(WAIT, "reply token", || async {
        cluster
            .kv_keys()
            .iter()
            .any(|k| k.starts_with("peers:"))
            .then_some(())
    })
    .await;
    pod.deliver(CH, "msg_v", Some("hello"), &[]).await.unwrap();
    let seen = fake.client_versions();
    let named: Vec<&str> = seen
        .iter()
        .filter_map(|v| v.channel_version.as_deref())
        .collect();
    assert!(named.len() >= 3, "{seen:?}");
    let version = named[0];
    assert!(named.iter().all(|v| *v == version), "{seen:?}");
    for v in &seen {
        assert_eq!(
            v.header.as_deref(),
            Some(encoded(version).as_str()),
            "{v:?}"
        );
    }
    for ep in [
        "get_bot_qrcode",
        "get_qrcode_status",
        "getupdates",
        "sendmessage",
    ] {
        assert!(seen.iter().any(|v| v.endpoint == ep), "{ep}: {seen:?}");
    }
}

/// Issue 22 point 8: the user cancels while `auth.status` waits on iLink's long poll, then
/// the phone confirms: nothing is bound and the session ends failed.
#[tokio::test]
async fn a_confirmation_after_cancel_binds_nothing() {
    let fake = FakeWechat::start().await;
    let cluster = Cluster::new();
    let mut cfg = config(&fake);
    cfg.qr_status_timeout = Duration::from_secs(5);
    fake.set_qr_hold(Duration::from_secs(3));
    let pod = Pod::start(cluster.clone(), "a", cfg, false).await;
    pod.auth_start(CH, "auth_c").await;
    let code = qr_of(&fake, &cluster, "auth_c").await;
    let (s, ()) = tokio::join!(pod.auth_status("auth_c", false), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        // auth.cancel as the core does it: the session is closed.
        cluster.cancel_session("auth_c");
        fake.scan(&code);
        fake.confirm(&code);
    });
    assert!(
        cluster.bindings().iter().all(|b| b.channel_id != CH),
        "a late confirmation bound the channel"
    );
    assert_eq!(s.status, AuthStatus::Failed, "{s:?}");
    assert_eq!(s.failure_code.as_deref(), Some("auth_canceled"));
}

#[tokio::test]
async fn expired_qr_is_refreshed_three_times_then_the_flow_fails() {
    let fake = FakeWechat::start().await;
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fake), false).await;
    pod.auth_start(CH, "auth_2").await;
    eventually(WAIT, "QR", || async {
        cluster
            .session("auth_2")
            .qr_code_text
            .is_some()
            .then_some(())
    })
    .await;
    for n in 1..=3 {
        let code = fake.qr_codes().last().cloned().unwrap();
        fake.expire_qr(&code);
        let s = pod.auth_status("auth_2", false).await;
        assert_eq!(s.status, AuthStatus::Pending, "refresh {n}");
        assert_eq!(fake.qr_codes().len(), n + 1);
        assert_eq!(
            s.qr_code_text,
            fake.qr_content(fake.qr_codes().last().unwrap())
        );
    }
    fake.expire_qr(fake.qr_codes().last().unwrap());
    let s = pod.auth_status("auth_2", false).await;
    assert_eq!(s.status, AuthStatus::Failed);
    assert_eq!(fake.qr_codes().len(), 4);
    // refresh=true asks for a new QR explicitly.
    pod.auth_start(CH, "auth_3").await;
    eventually(WAIT, "QR", || async {
        cluster
            .session("auth_3")
            .qr_code_text
            .is_some()
            .then_some(())
    })
    .await;
    let before = fake.qr_codes().len();
    pod.auth_status("auth_3", true).await;
    assert_eq!(fake.qr_codes().len(), before + 1);
}

#[tokio::test]
async fn inbound_every_item_type_and_replies_with_the_context_token() {
    let fake = FakeWechat::start().await;
    fake.set_long_poll(Duration::from_millis(500));
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fake), true).await;
    let bot = pod.login(&fake, CH).await;
    eventually(WAIT, "poller", || async {
        (fake.call_count("getupdates") > 0).then_some(())
    })
    .await;
    assert_eq!(fake.notifies(&bot.token).0, 1, "notifystart once");
    let me = bot.user_id.clone();
    let id_text = fake.push_named(&bot.token, &me, Some("张三"), &[Item::Text("你好".into())]);
    fake.push(&bot.token, &me, &[Item::Image(b"PNG-BYTES-1".to_vec())]);
    fake.push(
        &bot.token,
        &me,
        &[Item::Voice(Some("帮我查一下日程".into()))],
    );
    fake.push(&bot.token, &me, &[Item::Voice(None)]);
    fake.push(
        &bot.token,
        &me,
        &[Item::File {
            name: "report.pdf".into(),
            bytes: b"%PDF-1.4 body".to_vec(),
        }],
    );
    fake.push(&bot.token, &me, &[Item::Video(vec![7u8; 5000])]);
    fake.push(
        &bot.token,
        &me,
        &[Item::Quote {
            text: "this one".into(),
            title: "张三".into(),
            quoted: Box::new(Item::Text("earlier words".into())),
        }],
    );
    let got = inbound_n(&cluster, 7).await;
    let m = |i: usize| &got[i].1;
    assert_eq!(m(0).message_id, id_text.to_string());
    assert_eq!(m(0).text.as_deref(), Some("你好"));
    assert_eq!(m(0).sender_id.as_deref(), Some(me.as_str()));
    assert_eq!(m(0).sender_name.as_deref(), Some("张三"));
    assert_eq!(m(1).files.len(), 1);
    assert_eq!(m(1).files[0].file_type, "image");
    assert_eq!(cluster.file(&m(1).files[0].file_ref).bytes, b"PNG-BYTES-1");
    assert_eq!(m(2).text.as_deref(), Some("[Voice message] 帮我查一下日程"));
    assert_eq!(
        cluster.file(&m(2).files[0].file_ref).bytes,
        switchyard_fake_wechat::VOICE_SILK
    );
    assert!(m(3).text.as_deref().unwrap().contains("no transcript"));
    assert_eq!(m(4).files[0].filename.as_deref(), Some("report.pdf"));
    assert_eq!(
        cluster.file(&m(4).files[0].file_ref).bytes,
        b"%PDF-1.4 body"
    );
    assert_eq!(cluster.file(&m(5).files[0].file_ref).bytes, vec![7u8; 5000]);
    assert_eq!(m(5).files[0].file_type, "video");
    assert_eq!(
        m(6).text.as_deref(),
        Some("[Quoting 张三: \"earlier words\"]\nthis one")
    );
    // The cursor moved; nothing arrives twice.
    eventually(WAIT, "cursor stored", || async {
        cluster
            .kv_keys()
            .iter()
            .any(|k| k.starts_with("cursor:"))
            .then_some(())
    })
    .await;
    // The reply goes to the latest sender with its latest context token, once.
    pod.deliver(CH, "msg_r1", Some("收到"), &[]).await.unwrap();
    pod.deliver(CH, "msg_r1", Some("收到"), &[]).await.unwrap();
    let sent = fake.sent(&bot.token);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].to_user_id, me);
    assert_eq!(sent[0].text(), Some("收到"));
    assert!(
        fake.context_tokens(&bot.token, &me)
            .contains(&sent[0].context_token)
    );
    // No context token is in the store in readable form.
    for k in cluster.kv_keys() {
        let v = cluster.kv(&k).unwrap_or_default();
        assert!(!v.contains(&sent[0].context_token));
    }
    assert_eq!(cluster.inbound().len(), 7);
    let logs = captured_logs();
    assert!(!logs.contains(&bot.token));
    assert!(!logs.contains(&sent[0].context_token));
}

#[tokio::test]
async fn a_timed_out_send_is_repeated_with_the_same_client_id() {
    let fake = FakeWechat::start().await;
    fake.set_long_poll(Duration::from_millis(300));
    let cluster = Cluster::new();
    let mut cfg = config(&fake);
    cfg.request_timeout = Duration::from_millis(400);
    let pod = Pod::start(cluster.clone(), "a", cfg, true).await;
    let bot = pod.login(&fake, CH).await;
    fake.push_text(&bot.token, "hi");
    inbound_n(&cluster, 1).await;
    eventually(WAIT, "reply token stored", || async {
        cluster
            .kv_keys()
            .iter()
            .any(|k| k.starts_with("peers:"))
            .then_some(())
    })
    .await;
    // iLink takes the message but answers too late; the retry carries the same client_id.
    fake.lag("sendmessage", Duration::from_millis(700));
    let r = pod.deliver(CH, "msg_slow", Some("only once"), &[]).await;
    fake.lag("sendmessage", Duration::ZERO);
    if r.is_err() {
        // The core would retry the same message_id later: same client id again.
        pod.deliver(CH, "msg_slow", Some("only once"), &[])
            .await
            .unwrap();
    }
    let sent = fake.sent(&bot.token);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(sent[0].attempts >= 2, "{sent:?}");
}

#[tokio::test]
async fn media_out_is_encrypted_for_the_cdn_and_typing_ends_before_the_reply() {
    let fake = FakeWechat::start().await;
    fake.set_long_poll(Duration::from_millis(300));
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fake), true).await;
    let bot = pod.login(&fake, CH).await;
    fake.push_text(&bot.token, "send me the chart");
    inbound_n(&cluster, 1).await;
    eventually(WAIT, "reply token", || async {
        cluster
            .kv_keys()
            .iter()
            .any(|k| k.starts_with("peers:"))
            .then_some(())
    })
    .await;
    let binding = cluster.binding(CH);
    use switchyard_core::provider::Provider;
    pod.provider
        .activity(&binding, switchyard_protocol::im::ActivityStatus::Thinking)
        .await
        .unwrap();
    assert_eq!(fake.typing(&bot.token), vec![(bot.user_id.clone(), 1)]);
    let png: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    cluster.add_upload(CH, "file_up_1", "chart.png", "image/png", &png);
    cluster.add_upload(CH, "file_up_2", "notes.txt", "text/plain", b"plain notes");
    cluster.add_upload(CH, "file_up_3", "clip.mp4", "video/mp4", &[9u8; 100]);
    pod.deliver(
        CH,
        "msg_media",
        Some("here it is"),
        &["file_up_1", "file_up_2"],
    )
    .await
    .unwrap();
    assert_eq!(
        fake.typing(&bot.token),
        vec![(bot.user_id.clone(), 1), (bot.user_id.clone(), 2)],
        "typing cancelled before the reply"
    );
    let sent = fake.sent(&bot.token);
    assert_eq!(sent.len(), 3);
    assert_eq!(sent[0].text(), Some("here it is"));
    assert_eq!(sent[1].item_list[0]["type"], 2);
    assert_eq!(
        sent[1].media[0], png,
        "the CDN ciphertext decrypts to the file"
    );
    let param = sent[1].item_list[0]["image_item"]["media"]["encrypt_query_param"]
        .as_str()
        .unwrap();
    let obj = fake.cdn_object(param).unwrap();
    assert_eq!(obj.ciphertext.len(), (png.len() / 16 + 1) * 16);
    assert_ne!(&obj.ciphertext[..16], &png[..16]);
    assert_eq!(sent[2].item_list[0]["type"], 4);
    assert_eq!(sent[2].item_list[0]["file_item"]["file_name"], "notes.txt");
    assert_eq!(sent[2].media[0], b"plain notes");
    // The media tool: caption first, then the video.
    let r = pod
        .tool(
            CH,
            "wechat_message_send_media",
            json!({"file_ref": "file_up_3", "text": "clip"}),
            "call_1",
        )
        .await
        .unwrap();
    assert_eq!(r["status"], "sent");
    let sent = fake.sent(&bot.token);
    assert_eq!(sent.len(), 5);
    assert_eq!(sent[3].text(), Some("clip"));
    assert_eq!(sent[4].item_list[0]["type"], 5);
    assert_eq!(r["message_id"], sent[4].client_id);
    // Repeating the call sends nothing new.
    pod.tool(
        CH,
        "wechat_message_send_media",
        json!({"file_ref": "file_up_3", "text": "clip"}),
        "call_1",
    )
    .await
    .unwrap();
    assert_eq!(fake.sent(&bot.token).len(), 5);
    // Unknown files and strangers are refused with clear errors.
    let e = pod
        .tool(
            CH,
            "wechat_message_send_media",
            json!({"file_ref": "nope"}),
            "call_2",
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, "file_not_found");
    let e = pod
        .tool(
            CH,
            "wechat_message_send",
            json!({"text": "x", "recipient_ref": "stranger@im.wechat"}),
            "call_3",
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, "invalid_arguments");
    let r = pod
        .tool(
            CH,
            "wechat_message_send",
            json!({"text": "tool text"}),
            "call_4",
        )
        .await
        .unwrap();
    assert!(!r.to_string().contains(&sent[0].context_token));
    assert_eq!(
        fake.sent(&bot.token).last().unwrap().text(),
        Some("tool text")
    );
}

/// Issue 22 point 6: errcode -14 pauses the bot (no polls, sends refused as retryable, the
/// channel `degraded` with the resume time), then it goes on with the same token; it never
/// becomes `expired`.
#[tokio::test]
async fn a_session_timeout_pauses_the_bot_and_resumes_with_the_same_token() {
    let fake = FakeWechat::start().await;
    fake.set_long_poll(Duration::from_millis(300));
    let cluster = Cluster::new();
    let mut cfg = config(&fake);
    cfg.session_pause = Duration::from_millis(2500);
    let pod = Pod::start(cluster.clone(), "a", cfg, true).await;
    let bot = pod.login(&fake, CH).await;
    fake.push_text(&bot.token, "hello");
    inbound_n(&cluster, 1).await;
    fake.pause_session(&bot.token);
    eventually(WAIT, "degraded status", || async {
        cluster
            .statuses()
            .contains(&(CH.to_owned(), ConnectionStatus::Degraded))
            .then_some(())
    })
    .await;
    let shown = cluster.rebinds.lock().unwrap().last().cloned().unwrap();
    assert!(shown.1.display_name.contains("paused until"), "{shown:?}");
    // Resting: no poll, and a send is refused as retryable with the reason.
    let polls = fake.call_count("getupdates");
    let e = pod
        .deliver(CH, "msg_x", Some("hello?"), &[])
        .await
        .unwrap_err();
    assert!(e.retryable() && e.message.contains("-14"), "{e:?}");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(fake.call_count("getupdates"), polls, "no poll while paused");
    // iLink resumes the session: the same token polls again after the pause.
    fake.resume_session(&bot.token);
    fake.push_text(&bot.token, "after the pause");
    let got = inbound_n(&cluster, 2).await;
    assert_eq!(got[1].1.text.as_deref(), Some("after the pause"));
    eventually(WAIT, "connected again", || async {
        (cluster.statuses_of(CH).last() == Some(&ConnectionStatus::Connected)).then_some(())
    })
    .await;
    assert!(!cluster.statuses_of(CH).contains(&ConnectionStatus::Expired));
    assert_eq!(cluster.binding(CH).credentials["bot_token"], bot.token);
    let shown = cluster.rebinds.lock().unwrap().last().cloned().unwrap();
    assert!(!shown.1.display_name.contains("paused"), "{shown:?}");
    pod.deliver(CH, "msg_y", Some("back"), &[]).await.unwrap();
    assert_eq!(fake.sent(&bot.token).last().unwrap().text(), Some("back"));
}

#[tokio::test]
async fn failures_back_off_and_keep_the_cursor() {
    let fake = FakeWechat::start().await;
    fake.set_long_poll(Duration::from_millis(300));
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fake), true).await;
    let bot = pod.login(&fake, CH).await;
    fake.fail_next("getupdates", 2, Failure::Http(502));
    fake.fail_next("getupdates", 1, Failure::Ret(-1));
    fake.push_text(&bot.token, "one");
    inbound_n(&cluster, 1).await;
    // The store refuses: the batch is fetched again and stored once it accepts.
    cluster.set_full(true);
    fake.push_text(&bot.token, "two");
    eventually(WAIT, "refused attempts", || async {
        (cluster.accept_calls.load(Ordering::SeqCst) >= 3).then_some(())
    })
    .await;
    // A CDN outage holds a media message back the same way.
    fake.fail_next("cdn_download", 2, Failure::Http(503));
    fake.push(&bot.token, &bot.user_id, &[Item::Image(b"IMG".to_vec())]);
    cluster.set_full(false);
    let got = inbound_n(&cluster, 3).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let got2 = cluster.inbound();
    assert_eq!(got.len(), 3);
    assert_eq!(got2.len(), 3);
    assert_eq!(got2[1].1.text.as_deref(), Some("two"));
    assert_eq!(cluster.file(&got2[2].1.files[0].file_ref).bytes, b"IMG");
    assert_eq!(cluster.files().len(), 1, "media stored once");
    assert!(
        fake.calls()
            .iter()
            .any(|c| c.endpoint == "getupdates" && c.outcome == "http_502")
    );
}
