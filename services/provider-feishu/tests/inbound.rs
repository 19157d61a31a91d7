//! Binding and long-connection ingress against the fake Open Platform.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use serde_json::json;
use switchyard_core::provider::AuthStep;
use switchyard_fake_feishu::{Chat, FakeFeishu};

fn p2p() -> Chat {
    Chat::P2p {
        user_open_id: USER.into(),
    }
}

#[tokio::test]
async fn binding_checks_the_credentials_and_shows_the_bot_name() {
    let fs = fake().await;
    let cluster = Cluster::new();
    let pod = Pod::start(cluster.clone(), "a", config(&fs.base_url()), false).await;
    let bad = pod
        .auth("ch_1", json!({"app_id": APP, "app_secret": "wrong-secret"}))
        .await;
    assert!(
        matches!(&bad, AuthStep::Failed { code, .. } if code == "target_auth_failed"),
        "{bad:?}"
    );
    let bad = pod
        .auth(
            "ch_1",
            json!({"app_id": "not-an-app", "app_secret": SECRET}),
        )
        .await;
    assert!(
        matches!(&bad, AuthStep::Failed { code, .. } if code == "invalid_input"),
        "{bad:?}"
    );
    let bad = pod
        .auth(
            "ch_1",
            json!({"app_id": APP, "app_secret": SECRET, "domain": "mars"}),
        )
        .await;
    assert!(
        matches!(&bad, AuthStep::Failed { code, .. } if code == "invalid_input"),
        "{bad:?}"
    );
    let ok = pod.bind("ch_1", app_fields()).await;
    let AuthStep::Authenticated {
        view,
        binding_key,
        credentials,
    } = ok
    else {
        panic!("authenticated: {ok:?}")
    };
    assert_eq!(view.display_name, "Switchyard Test Bot");
    assert_eq!(view.account_hint.as_deref(), Some("Feishu app …0001"));
    let key = binding_key.expect("binding key");
    assert!(!key.contains(APP) && !key.contains(SECRET));
    assert_eq!(
        credentials["app_secret"], SECRET,
        "kept for the encrypted binding"
    );
    let again = pod.auth("ch_2", app_fields()).await;
    let AuthStep::Authenticated {
        binding_key: key2, ..
    } = again
    else {
        panic!()
    };
    assert_eq!(
        key2.as_deref(),
        Some(key.as_str()),
        "the same app twice has the same key"
    );
    assert!(!format!("{view:?}").contains(SECRET));
}

async fn bound_running_pod(fs: &FakeFeishu, cluster: &std::sync::Arc<Cluster>, name: &str) -> Pod {
    let pod = Pod::start(cluster.clone(), name, config(&fs.base_url()), true).await;
    if cluster.bindings().is_empty() {
        let step = pod.bind("ch_1", app_fields()).await;
        assert!(matches!(step, AuthStep::Authenticated { .. }));
    }
    pod.provider.refresh().await.unwrap();
    pod
}

#[tokio::test]
async fn long_connection_text_is_stored_then_acked() {
    let fs = fake().await;
    let cluster = Cluster::new();
    let _pod = bound_running_pod(&fs, &cluster, "a").await;
    eventually(WAIT, "long connection", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    let pushed = fs.push_text(APP, &p2p(), "hello from feishu");
    let got = inbound_n(&cluster, 1).await;
    assert_eq!(got[0].0, "ch_1");
    assert_eq!(got[0].1.message_id, pushed.message_id);
    assert_eq!(got[0].1.text.as_deref(), Some("hello from feishu"));
    assert_eq!(got[0].1.sender_id.as_deref(), Some(USER));
    // The app has no contact permission: the redacted open_id stands in for the name.
    assert_eq!(got[0].1.sender_name.as_deref(), Some("ou_…_ada"));
    eventually(WAIT, "ack", || async {
        (fs.acked_events(APP) == vec![pushed.event_id.clone()]).then_some(())
    })
    .await;
    assert_eq!(fs.pending_events(APP), 0);
    assert_eq!(fs.connection_stats(APP).1, 1, "one connection per app");
}

/// Every message names its sender, from the contact API (cached), also in a group where
/// several people talk; a user the app may not see, or an app without the contact
/// permission, gets the redacted open_id, and that refusal is cached too.
#[tokio::test]
async fn senders_are_named_from_the_contact_api_in_groups_too() {
    let fs = fake().await;
    fs.set_scope(APP, switchyard_fake_feishu::CONTACT_SCOPE, true);
    fs.add_user("ou_ada_lovelace", "Ada Lovelace");
    fs.add_user("ou_bob_builder", "Bob");
    let cluster = Cluster::new();
    let _pod = bound_running_pod(&fs, &cluster, "a").await;
    eventually(WAIT, "long connection", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    let group = Chat::Group {
        chat_id: GROUP.into(),
    };
    let a1 = fs.push_text_from(APP, &group, "ou_ada_lovelace", "@_user_1 one");
    inbound_n(&cluster, 1).await;
    let b1 = fs.push_text_from(APP, &group, "ou_bob_builder", "@_user_1 two");
    inbound_n(&cluster, 2).await;
    let a2 = fs.push_text_from(APP, &group, "ou_ada_lovelace", "@_user_1 three");
    inbound_n(&cluster, 3).await;
    let stranger = fs.push_text(APP, &p2p(), "who am I");
    inbound_n(&cluster, 4).await;
    let again = fs.push_text(APP, &p2p(), "still me");
    let got = inbound_n(&cluster, 5).await;
    let named = |id: &str| {
        got.iter()
            .find(|(_, m)| m.message_id == id)
            .map(|(_, m)| (m.sender_id.clone(), m.sender_name.clone()))
            .unwrap()
    };
    let some = |s: &str| Some(s.to_owned());
    assert_eq!(
        named(&a1.message_id),
        (some("ou_ada_lovelace"), some("Ada Lovelace"))
    );
    assert_eq!(named(&b1.message_id), (some("ou_bob_builder"), some("Bob")));
    assert_eq!(
        named(&a2.message_id),
        (some("ou_ada_lovelace"), some("Ada Lovelace"))
    );
    assert_eq!(named(&stranger.message_id), (some(USER), some("ou_…_ada")));
    assert_eq!(named(&again.message_id), (some(USER), some("ou_…_ada")));
    // One lookup per user: Ada, Bob and the stranger (refused with 41050, kept as refused).
    assert_eq!(fs.call_count("contact_user"), 3);

    // Without the permission (99991672) the redacted open_id stands in, asked once.
    fs.set_scope(APP, switchyard_fake_feishu::CONTACT_SCOPE, false);
    // One after the other: events are handled concurrently, and two first lookups of one
    // user at once would both ask (the cache answers the ones that come after).
    fs.push_text_from(APP, &group, "ou_carol_new", "@_user_1 four");
    inbound_n(&cluster, 6).await;
    fs.push_text_from(APP, &group, "ou_carol_new", "@_user_1 five");
    let got = inbound_n(&cluster, 7).await;
    let carol: Vec<_> = got
        .iter()
        .filter(|(_, m)| m.sender_id.as_deref() == Some("ou_carol_new"))
        .map(|(_, m)| m.sender_name.clone())
        .collect();
    assert_eq!(carol, vec![some("ou_…_new"), some("ou_…_new")]);
    assert_eq!(fs.call_count("contact_user"), 4);
    assert!(
        fs.log()
            .iter()
            .any(|e| e.route == "contact_user" && e.code == 99991672)
    );
}

#[tokio::test]
async fn an_event_is_not_acked_until_it_is_stored() {
    let fs = fake().await;
    fs.set_ack_timeout(Duration::from_millis(300));
    let cluster = Cluster::new();
    let _pod = bound_running_pod(&fs, &cluster, "a").await;
    eventually(WAIT, "long connection", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    cluster.set_full(true);
    let pushed = fs.push_text(APP, &p2p(), "wait for me");
    eventually(WAIT, "refused store attempts", || async {
        (cluster.accept_calls.load(Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    assert!(
        fs.acked_events(APP).is_empty(),
        "nothing acked while the store refuses"
    );
    assert_eq!(fs.pending_events(APP), 1);
    cluster.set_full(false);
    let got = inbound_n(&cluster, 1).await;
    assert_eq!(got[0].1.message_id, pushed.message_id);
    eventually(WAIT, "ack", || async {
        (fs.pending_events(APP) == 0).then_some(())
    })
    .await;
    assert_eq!(cluster.inbound().len(), 1);
}

#[tokio::test]
async fn fragments_repeats_and_reconnects() {
    let fs = fake().await;
    fs.set_fragments(3);
    let cluster = Cluster::new();
    let _pod = bound_running_pod(&fs, &cluster, "a").await;
    eventually(WAIT, "long connection", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    let a = fs.push_text(APP, &p2p(), &"long text ".repeat(100));
    inbound_n(&cluster, 1).await;
    // Feishu's at-least-once delivery: the same event again is acked and not stored twice.
    assert!(fs.repeat_event(APP, &a.event_id));
    eventually(WAIT, "repeat acked", || async {
        (fs.acked_events(APP).len() == 2).then_some(())
    })
    .await;
    assert_eq!(cluster.inbound().len(), 1);
    // The connection drops; the client reconnects and receives what came meanwhile.
    fs.drop_connections(APP);
    let b = fs.push_text(APP, &p2p(), "after the drop");
    let got = inbound_n(&cluster, 2).await;
    assert_eq!(got[1].1.message_id, b.message_id);
    // The drop may land after `b` went out on the old connection; the reconnect follows.
    eventually(WAIT, "reconnected", || async {
        (fs.connection_stats(APP).0 >= 2 && fs.connections(APP) == 1).then_some(())
    })
    .await;
    assert_eq!(
        fs.connection_stats(APP).1,
        1,
        "never two connections at once"
    );
}

#[tokio::test]
async fn group_rich_text_and_media_are_normalised() {
    let fs = fake().await;
    let cluster = Cluster::new();
    let _pod = bound_running_pod(&fs, &cluster, "a").await;
    eventually(WAIT, "long connection", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    let group = Chat::Group {
        chat_id: GROUP.into(),
    };
    let g = fs.push_text(APP, &group, "@_user_1 status?");
    fs.push_post(
        APP,
        &p2p(),
        json!({"title": "Plan", "content": [[{"tag": "text", "text": "step "}, {"tag": "a", "text": "doc", "href": "https://example.com"}]]}),
    );
    fs.push_image(APP, &p2p(), b"PNG-BYTES");
    fs.push_file(APP, &p2p(), "file", "report.pdf", b"%PDF-1.4");
    fs.push_file(APP, &p2p(), "audio", "voice", b"OPUS");
    fs.push_file(APP, &p2p(), "media", "clip.mp4", b"MP4");
    fs.push_sticker(APP, &p2p(), b"STICKER");
    let got = inbound_n(&cluster, 7).await;
    let by_id = |id: &str| {
        got.iter()
            .find(|(_, m)| m.message_id == id)
            .map(|(_, m)| m.clone())
            .unwrap()
    };
    let gm = by_id(&g.message_id);
    assert_eq!(
        gm.text.as_deref(),
        Some(
            format!(
                "[group message: reply with reply_ref {}]\n@Switchyard Test Bot status?",
                g.message_id
            )
            .as_str()
        )
    );
    let texts: Vec<Option<String>> = got.iter().map(|(_, m)| m.text.clone()).collect();
    assert!(
        texts.contains(&Some("Plan\nstep doc (https://example.com)".into())),
        "{texts:?}"
    );
    let files: Vec<_> = got.iter().flat_map(|(_, m)| m.files.clone()).collect();
    assert_eq!(files.len(), 6, "the video comes with its cover: {files:?}");
    let bytes: Vec<Vec<u8>> = files
        .iter()
        .map(|f| cluster.file(&f.file_ref).bytes)
        .collect();
    for want in [&b"PNG-BYTES"[..], b"%PDF-1.4", b"OPUS", b"MP4", b"STICKER"] {
        assert!(bytes.iter().any(|b| b == want), "{want:?}");
    }
    let names: Vec<String> = files.iter().filter_map(|f| f.filename.clone()).collect();
    assert!(names.contains(&"report.pdf".to_owned()), "{names:?}");
    assert!(files.iter().any(|f| f.file_type == "image"));
    assert!(
        files
            .iter()
            .any(|f| f.mime_type.as_deref() == Some("audio/opus"))
    );
}

/// A video message carries its cover image (`image_key`) beside the video.
#[tokio::test]
async fn a_video_message_carries_its_cover_image() {
    let fs = fake().await;
    let cluster = Cluster::new();
    let _pod = bound_running_pod(&fs, &cluster, "a").await;
    eventually(WAIT, "long connection", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    let pushed = fs.push_video(APP, &p2p(), "clip.mp4", b"MP4-BYTES", b"COVER-BYTES");
    let got = inbound_n(&cluster, 1).await;
    assert_eq!(got[0].1.message_id, pushed.message_id);
    let files = &got[0].1.files;
    assert_eq!(files.len(), 2, "{files:?}");
    let video = files
        .iter()
        .find(|f| f.mime_type.as_deref() == Some("video/mp4"))
        .expect("the video");
    assert_eq!(cluster.file(&video.file_ref).bytes, b"MP4-BYTES");
    assert_eq!(video.filename.as_deref(), Some("clip.mp4"));
    let cover = files
        .iter()
        .find(|f| f.file_type == "image")
        .expect("the cover image");
    assert_eq!(cluster.file(&cover.file_ref).bytes, b"COVER-BYTES");
}

#[tokio::test]
async fn lark_apps_use_the_lark_base() {
    let lark = fake().await;
    let cluster = Cluster::new();
    // The Feishu base points nowhere: only the Lark base can answer.
    let mut cfg = config("http://127.0.0.1:9");
    cfg.lark_api_base = lark.base_url();
    let pod = Pod::start(cluster.clone(), "a", cfg, true).await;
    let step = pod
        .bind(
            "ch_1",
            json!({"app_id": APP, "app_secret": SECRET, "domain": "lark"}),
        )
        .await;
    let AuthStep::Authenticated { view, .. } = step else {
        panic!("{step:?}")
    };
    assert_eq!(view.account_hint.as_deref(), Some("Lark app …0001"));
    pod.provider.refresh().await.unwrap();
    eventually(WAIT, "long connection", || async {
        (lark.connections(APP) == 1).then_some(())
    })
    .await;
    lark.push_text(APP, &p2p(), "hi from lark");
    let got = inbound_n(&cluster, 1).await;
    assert_eq!(got[0].1.text.as_deref(), Some("hi from lark"));
}

#[tokio::test]
async fn no_secret_or_token_in_logs() {
    let fs = fake().await;
    let cluster = Cluster::new();
    let pod = bound_running_pod(&fs, &cluster, "a").await;
    eventually(WAIT, "long connection", || async {
        (fs.connections(APP) == 1).then_some(())
    })
    .await;
    fs.push_text(APP, &p2p(), "hi");
    inbound_n(&cluster, 1).await;
    pod.deliver("ch_1", "msg_1", Some("answer"), &[])
        .await
        .unwrap();
    fs.expire_tokens();
    pod.deliver("ch_1", "msg_2", Some("answer 2"), &[])
        .await
        .unwrap();
    let logs = captured_logs();
    assert!(!logs.contains(SECRET), "app secret logged");
    let tokens = fs.issued_tokens();
    assert!(tokens.len() >= 2, "a second token after expiry");
    for t in tokens {
        assert!(!logs.contains(&t), "a tenant token logged");
    }
    // tungstenite itself traces the handshake request line (with the one-time ticket) at
    // TRACE; nothing of ours logs it, and the edge never enables tungstenite=trace by default.
    assert!(
        !logs
            .lines()
            .any(|l| l.contains("ticket=") && !l.contains("tungstenite::handshake")),
        "a connection ticket logged"
    );
}
