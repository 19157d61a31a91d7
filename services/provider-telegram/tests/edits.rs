//! Edited messages: delivered as new `chat.message`s marked as edits of the original (never
//! as fresh user messages), in both ingress modes; edits that change nothing are not.

mod common;

use common::*;
use serde_json::json;
use switchyard_fake_telegram::FakeTelegram;
use switchyard_provider_telegram::Mode;

fn texts(cluster: &Cluster) -> Vec<(String, String)> {
    cluster
        .inbound()
        .iter()
        .map(|(_, m)| (m.message_id.clone(), m.text.clone().unwrap_or_default()))
        .collect()
}

/// A text, its edit, and an edit that changes nothing visible; returns the original.
async fn text_and_edits(tg: &FakeTelegram, cluster: &Cluster) -> (i64, i64) {
    let original = tg.push_text(TOKEN, CHAT, "meet at 5");
    inbound_n(cluster, 1).await;
    let edit = tg.push_edit(
        TOKEN,
        CHAT,
        original.message_id,
        json!({"text": "meet at 6"}),
    );
    assert!(edit.update_id > 0, "the bot asked for edited_message");
    inbound_n(cluster, 2).await;
    tg.push_edit(TOKEN, CHAT, original.message_id, json!({}));
    // A later message shows the no-op edit was handled (and skipped) before it.
    tg.push_text(TOKEN, CHAT, "thanks");
    inbound_n(cluster, 3).await;
    (original.message_id, edit.update_id)
}

fn check_text_edits(cluster: &Cluster, original: i64, edit_update: i64) {
    let got = texts(cluster);
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(
        got[0],
        (format!("{CHAT}:{original}"), "meet at 5".to_owned())
    );
    assert_eq!(
        got[1],
        (
            format!("{CHAT}:{original}:edit:{edit_update}"),
            format!(
                "[Edited message {CHAT}:{original}: this replaces its earlier version]\nmeet at 6"
            )
        )
    );
    assert_eq!(got[2].1, "thanks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polled_edits_arrive_marked_as_edits_of_the_original() {
    let tg = fake().await;
    let cluster = Cluster::new();
    let pod = Pod::start(
        cluster.clone(),
        "pod-a",
        config(&tg.base_url(), Mode::Polling),
        true,
    )
    .await;
    pod.bind("cch_p", TOKEN, json!(CHAT)).await;
    let (original, edit_update) = text_and_edits(&tg, &cluster).await;
    check_text_edits(&cluster, original, edit_update);
    // The edit's id answers the edited message.
    pod.tool(
        "cch_p",
        "telegram_message_reply",
        json!({"reply_to_message_id": format!("{CHAT}:{original}:edit:{edit_update}"), "text": "ok, 6"}),
        "r1",
    )
    .await
    .unwrap();
    assert_eq!(
        tg.sent_messages(CHAT)[0].reply_to_message_id,
        Some(original)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_edits_arrive_marked_and_unchanged_files_are_not_fetched_again() {
    let tg = fake().await;
    let cluster = Cluster::new();
    let pod = Pod::start(
        cluster.clone(),
        "pod-a",
        config(&tg.base_url(), Mode::Webhook),
        true,
    )
    .await;
    pod.bind("cch_p", TOKEN, json!(CHAT)).await;
    pod.provider.step().await.unwrap();
    let (original, edit_update) = text_and_edits(&tg, &cluster).await;
    check_text_edits(&cluster, original, edit_update);
    // A caption edit: the text changes, the photo does not come again.
    let photo = tg.push_photo(TOKEN, CHAT, Some("draft"), &[(800, 600, b"PHOTO".to_vec())]);
    inbound_n(&cluster, 4).await;
    let downloads = tg.call_count("getFile");
    tg.push_edit(TOKEN, CHAT, photo.message_id, json!({"caption": "final"}));
    let got = inbound_n(&cluster, 5).await;
    let edit = &got[4].1;
    assert_eq!(
        edit.text.as_deref(),
        Some(
            format!(
                "[Edited message {CHAT}:{}: this replaces its earlier version; its files are unchanged]\nfinal",
                photo.message_id
            )
            .as_str()
        )
    );
    assert!(edit.files.is_empty());
    assert_eq!(tg.call_count("getFile"), downloads);
}
