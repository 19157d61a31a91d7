//! The Gateway session against the fake: what is delivered, and that drops, Reconnect,
//! Invalid Session, zombie connections, refusals and a takeover by another pod lose nothing
//! and deliver nothing twice.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use switchyard_fake_discord::FakeDiscord;
use switchyard_protocol::ConnectionStatus;
use switchyard_provider_discord::TOOL_MESSAGE_SEND;

const CH: &str = "cch_discord";

async fn live() -> (FakeDiscord, Pod) {
    let dc = fake().await;
    let pod = Pod::start(Cluster::new(), "pod-a", config(&dc.api_base()), true).await;
    bind_live(&pod, &dc, CH).await;
    (dc, pod)
}

/// Waits until `n` messages are stored; returns their texts.
async fn texts(pod: &Pod, n: usize) -> Vec<String> {
    eventually(WAIT, "messages stored", || async {
        let s = stored(pod.cluster(), CH);
        (s.len() >= n).then(|| s.into_iter().map(|m| m.text.unwrap_or_default()).collect())
    })
    .await
}

#[tokio::test]
async fn dms_and_mentions_arrive_with_the_authors_name_and_nothing_else_does() {
    let (dc, pod) = live().await;
    assert_eq!(
        dc.gateway_stats(BOT_ID).intents,
        Some((1 << 9) | (1 << 12) | (1 << 15)),
        "GUILD_MESSAGES | DIRECT_MESSAGES | MESSAGE_CONTENT"
    );
    let dm = dc.push_message(BOT_ID, DM, USER, "hello in private", false, &[]);
    dc.push_message(BOT_ID, GUILD_CHANNEL, USER, "not for the bot", false, &[]);
    dc.push_message(
        BOT_ID,
        GUILD_CHANNEL,
        OTHER_BOT,
        "a bot mentioning",
        true,
        &[],
    );
    dc.push_edit(BOT_ID, &dm.message_id, "hello, edited");
    // The bot's own message comes back over the Gateway too.
    pod.tool(
        CH,
        TOOL_MESSAGE_SEND,
        json!({"connector_channel_id": CH, "text": "from the bot", "recipient_ref": DM}),
        "k1",
    )
    .await
    .expect("sent");
    let mention = dc.push_message(
        BOT_ID,
        GUILD_CHANNEL,
        USER,
        "hello in the server",
        true,
        &[],
    );
    let got = texts(&pod, 2).await;
    assert_eq!(got, ["hello in private", "hello in the server"]);
    // Everything after the mention was handled too (the session moved past it), nothing more.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let all = stored(pod.cluster(), CH);
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[0].message_id, format!("{DM}:{}", dm.message_id));
    assert_eq!(
        all[1].message_id,
        format!("{GUILD_CHANNEL}:{}", mention.message_id)
    );
    for m in &all {
        assert_eq!(m.sender_name.as_deref(), Some("Ada Lovelace"));
        assert_eq!(m.sender_id.as_deref(), Some(USER));
    }
}

#[tokio::test]
async fn a_dropped_connection_resumes_the_session_with_no_loss_and_no_repeat() {
    let (dc, pod) = live().await;
    for i in 0..3 {
        dc.push_message(BOT_ID, DM, USER, &format!("before {i}"), false, &[]);
    }
    texts(&pod, 3).await;
    dc.drop_connections(BOT_ID);
    // Logged by the session while nobody is connected; replayed on resume.
    for i in 0..3 {
        dc.push_message(BOT_ID, DM, USER, &format!("while down {i}"), false, &[]);
    }
    let got = texts(&pod, 6).await;
    assert_eq!(
        got,
        [
            "before 0",
            "before 1",
            "before 2",
            "while down 0",
            "while down 1",
            "while down 2"
        ]
    );
    let s = dc.gateway_stats(BOT_ID);
    assert_eq!(s.identifies, 1, "resumed, not identified again");
    assert!(
        s.resumes_at_resume_url >= 1,
        "resumed at resume_gateway_url: {s:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(stored(pod.cluster(), CH).len(), 6, "nothing twice");
}

#[tokio::test]
async fn reconnect_resumes_and_invalid_session_identifies_anew() {
    let (dc, pod) = live().await;
    dc.send_reconnect(BOT_ID);
    eventually(WAIT, "resumed after op 7", || async {
        (dc.gateway_stats(BOT_ID).resumes >= 1 && dc.gateway_stats(BOT_ID).live_sessions == 1)
            .then_some(())
    })
    .await;
    dc.push_message(BOT_ID, DM, USER, "after reconnect", false, &[]);
    texts(&pod, 1).await;
    assert_eq!(dc.gateway_stats(BOT_ID).identifies, 1);
    dc.invalidate_sessions(BOT_ID);
    eventually(WAIT, "identified after op 9", || async {
        let s = dc.gateway_stats(BOT_ID);
        (s.identifies == 2 && s.live_sessions == 1).then_some(())
    })
    .await;
    dc.push_message(BOT_ID, DM, USER, "after invalid session", false, &[]);
    assert_eq!(texts(&pod, 2).await[1], "after invalid session");
}

#[tokio::test]
async fn an_unacknowledged_heartbeat_reconnects_and_resumes() {
    let (dc, pod) = live().await;
    let before = dc.gateway_stats(BOT_ID);
    dc.mute_heartbeat_acks(BOT_ID, true);
    eventually(WAIT, "zombie connection replaced", || async {
        (dc.gateway_stats(BOT_ID).resumes > before.resumes).then_some(())
    })
    .await;
    dc.mute_heartbeat_acks(BOT_ID, false);
    dc.push_message(BOT_ID, DM, USER, "after the zombie", false, &[]);
    assert_eq!(texts(&pod, 1).await, ["after the zombie"]);
    assert_eq!(dc.gateway_stats(BOT_ID).identifies, 1);
}

#[tokio::test]
async fn a_revoked_token_marks_the_channel_and_a_disallowed_intent_fails_it() {
    let (dc, pod) = live().await;
    dc.revoke(TOKEN);
    eventually(WAIT, "channel revoked", || async {
        pod.cluster()
            .statuses_of(CH)
            .contains(&ConnectionStatus::Revoked)
            .then_some(())
    })
    .await;

    let dc = fake().await;
    dc.allow_message_content(BOT_ID, false);
    let pod = Pod::start(Cluster::new(), "pod-b", config(&dc.api_base()), true).await;
    pod.bind(CH, TOKEN).await;
    pod.provider.refresh().await.unwrap();
    eventually(WAIT, "channel failed on 4014", || async {
        pod.cluster()
            .statuses_of(CH)
            .contains(&ConnectionStatus::Error)
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        dc.gateway_stats(BOT_ID).connections,
        0,
        "no session was opened"
    );
    assert!(dc.calls("gateway_bot") <= 2, "no reconnect loop after 4014");
}

#[tokio::test]
async fn another_pod_takes_the_session_over_and_resumes_it() {
    let dc = fake().await;
    let cluster = Cluster::new();
    let a = Pod::start(cluster.clone(), "pod-a", config(&dc.api_base()), true).await;
    bind_live(&a, &dc, CH).await;
    let b = Pod::start(cluster.clone(), "pod-b", config(&dc.api_base()), true).await;
    b.provider.refresh().await.unwrap();
    dc.push_message(BOT_ID, DM, USER, "on a", false, &[]);
    texts(&a, 1).await;
    // Pod a drains: its connection closes with 4000, the lease is given up.
    a.stop.cancel();
    for i in 0..3 {
        dc.push_message(BOT_ID, DM, USER, &format!("handover {i}"), false, &[]);
    }
    let got = texts(&b, 4).await;
    assert_eq!(got, ["on a", "handover 0", "handover 1", "handover 2"]);
    let s = dc.gateway_stats(BOT_ID);
    assert_eq!(s.identifies, 1, "the session was resumed by pod b: {s:?}");
    assert_eq!(s.max_live_sessions, 1, "never two sessions at once");
    assert_eq!(
        cluster
            .lease_holder(&format!("gw:{}", bot_key()))
            .as_deref(),
        Some("pod-b")
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(stored(&cluster, CH).len(), 4, "nothing twice");
}

#[tokio::test]
async fn a_message_not_stored_yet_is_resumed_before_not_skipped() {
    let (dc, pod) = live().await;
    dc.push_message(BOT_ID, DM, USER, "first", false, &[]);
    texts(&pod, 1).await;
    // The store refuses for a while: the session must not move past these.
    pod.cluster()
        .overloaded
        .store(true, std::sync::atomic::Ordering::SeqCst);
    dc.push_message(BOT_ID, DM, USER, "second", false, &[]);
    dc.push_message(BOT_ID, DM, USER, "third", false, &[]);
    eventually(WAIT, "a resume after the refusal", || async {
        (dc.gateway_stats(BOT_ID).resumes >= 1).then_some(())
    })
    .await;
    pod.cluster()
        .overloaded
        .store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(texts(&pod, 3).await, ["first", "second", "third"]);
    assert_eq!(
        dc.gateway_stats(BOT_ID).identifies,
        1,
        "the same session throughout"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(stored(pod.cluster(), CH).len(), 3, "nothing twice");
}

#[tokio::test]
async fn a_crashed_pods_session_is_taken_over_from_its_last_kept_sequence() {
    let dc = fake().await;
    let cluster = Cluster::new();
    let a = Pod::start(cluster.clone(), "pod-a", config(&dc.api_base()), true).await;
    bind_live(&a, &dc, CH).await;
    let b = Pod::start(cluster.clone(), "pod-b", config(&dc.api_base()), true).await;
    b.provider.refresh().await.unwrap();
    dc.push_message(BOT_ID, DM, USER, "before the crash", false, &[]);
    texts(&a, 1).await;
    // Pod a can no longer store, renew or take leases: its connection closes when the next
    // renewal fails; pod b takes the lease once it expires and resumes the kept session.
    a.services
        .dead
        .store(true, std::sync::atomic::Ordering::SeqCst);
    for i in 0..3 {
        dc.push_message(BOT_ID, DM, USER, &format!("after {i}"), false, &[]);
    }
    let got = texts(&b, 4).await;
    assert_eq!(got, ["before the crash", "after 0", "after 1", "after 2"]);
    assert_eq!(
        cluster
            .lease_holder(&format!("gw:{}", bot_key()))
            .as_deref(),
        Some("pod-b")
    );
    let s = dc.gateway_stats(BOT_ID);
    assert_eq!(s.max_live_sessions, 1, "never two sessions at once: {s:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(stored(&cluster, CH).len(), 4, "nothing twice");
}
