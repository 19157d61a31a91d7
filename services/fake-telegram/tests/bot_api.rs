//! The fake against the Bot API's documented behaviour.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use switchyard_fake_telegram::{Failure, FakeTelegram};

const TOKEN: &str = "42:TestTokenForTheFakeServer";

async fn setup() -> (FakeTelegram, reqwest::Client) {
    let tg = FakeTelegram::start().await;
    tg.add_bot(TOKEN, "fake_bot");
    tg.add_chat(10, "private", "Ada");
    (tg, reqwest::Client::new())
}

async fn call(
    http: &reqwest::Client,
    tg: &FakeTelegram,
    method: &str,
    body: Value,
) -> (u16, Value) {
    let r = http
        .post(format!("{}/bot{TOKEN}/{method}", tg.base_url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test]
async fn envelope_limits_and_knobs() {
    let (tg, http) = setup().await;
    let (s, v) = call(&http, &tg, "getMe", json!({})).await;
    assert_eq!(
        (
            s,
            v["ok"].clone(),
            v["result"]["id"].clone(),
            v["result"]["is_bot"].clone()
        ),
        (200, json!(true), json!(42), json!(true))
    );
    let (s, v) = call(
        &http,
        &tg,
        "sendMessage",
        json!({"chat_id": 10, "text": "x".repeat(4097)}),
    )
    .await;
    assert_eq!(s, 400);
    assert_eq!(
        v,
        json!({"ok": false, "error_code": 400, "description": "Bad Request: message is too long"})
    );
    let (s, _) = call(
        &http,
        &tg,
        "sendMessage",
        json!({"chat_id": 10, "text": "😀".repeat(2048)}),
    )
    .await;
    assert_eq!(s, 200, "4096 UTF-16 units fit");
    let (s, v) = call(
        &http,
        &tg,
        "sendMessage",
        json!({"chat_id": 11, "text": "hi"}),
    )
    .await;
    assert_eq!(
        (s, v["description"].as_str().unwrap()),
        (400, "Bad Request: chat not found")
    );
    tg.fail_next("sendMessage", 1, Failure::RetryAfter(7));
    let (s, v) = call(
        &http,
        &tg,
        "sendMessage",
        json!({"chat_id": 10, "text": "hi"}),
    )
    .await;
    assert_eq!(s, 429);
    assert_eq!(v["parameters"]["retry_after"], 7);
    assert_eq!(
        tg.sent_messages(10).len(),
        1,
        "an injected failure sends nothing"
    );
    tg.slow("getMe", Duration::from_millis(200));
    let t = Instant::now();
    call(&http, &tg, "getMe", json!({})).await;
    assert!(t.elapsed() >= Duration::from_millis(200));
    assert_eq!(tg.call_count("sendMessage"), 4);
    tg.revoke(TOKEN);
    let (s, v) = call(&http, &tg, "getMe", json!({})).await;
    assert_eq!(
        (s, v["description"].as_str().unwrap()),
        (401, "Unauthorized")
    );
}

#[tokio::test]
async fn long_poll_offsets_and_conflicts() {
    let (tg, http) = setup().await;
    let first = tg.push_text(TOKEN, 10, "one");
    let (_, v) = call(&http, &tg, "getUpdates", json!({"timeout": 0})).await;
    assert_eq!(v["result"][0]["message"]["text"], "one");
    // Not confirmed until a higher offset is passed.
    let (_, v) = call(&http, &tg, "getUpdates", json!({})).await;
    assert_eq!(v["result"].as_array().unwrap().len(), 1);
    // A long poll returns as soon as an update arrives.
    let poll = call(
        &http,
        &tg,
        "getUpdates",
        json!({"offset": first.update_id + 1, "timeout": 5}),
    );
    let push = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        tg.push_text(TOKEN, 10, "two");
    };
    let t = Instant::now();
    let ((_, v), ()) = tokio::join!(poll, push);
    assert!(t.elapsed() < Duration::from_secs(3));
    assert_eq!(v["result"][0]["message"]["text"], "two");
    assert_eq!(
        tg.pending_updates(TOKEN),
        1,
        "the first update was confirmed"
    );
    // A second concurrent poller ends the first with 409.
    let older = call(
        &http,
        &tg,
        "getUpdates",
        json!({"offset": 999_999_999_999i64, "timeout": 5}),
    );
    let newer = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        call(
            &http,
            &tg,
            "getUpdates",
            json!({"offset": 999_999_999_999i64, "timeout": 0}),
        )
        .await
    };
    let ((s, v), _) = tokio::join!(older, newer);
    assert_eq!(s, 409);
    assert!(
        v["description"]
            .as_str()
            .unwrap()
            .contains("terminated by other getUpdates request")
    );
    assert_eq!(tg.poll_conflicts(TOKEN), 1);
}

#[tokio::test]
async fn webhook_delivery_with_secret_until_accepted() {
    let (tg, http) = setup().await;
    let got: Arc<Mutex<Vec<(HeaderMap, Value)>>> = Arc::default();
    let answers = Arc::new(Mutex::new(vec![503u16, 200]));
    let (g, a) = (got.clone(), answers.clone());
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: axum::Json<Value>| {
            let (g, a) = (g.clone(), a.clone());
            async move {
                g.lock().unwrap().push((headers, body.0));
                let mut a = a.lock().unwrap();
                StatusCode::from_u16(if a.is_empty() { 200 } else { a.remove(0) }).unwrap()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let (s, v) = call(
        &http,
        &tg,
        "setWebhook",
        json!({"url": url, "secret_token": "bad secret!"}),
    )
    .await;
    assert_eq!(
        (s, v["description"].as_str().unwrap()),
        (
            400,
            "Bad Request: secret token contains unallowed characters"
        )
    );
    let (s, v) = call(
        &http,
        &tg,
        "setWebhook",
        json!({"url": url, "secret_token": "s3cret_-X"}),
    )
    .await;
    assert_eq!(
        (s, v["description"].as_str().unwrap()),
        (200, "Webhook was set")
    );
    let (s, v) = call(&http, &tg, "getUpdates", json!({})).await;
    assert_eq!(s, 409);
    assert!(
        v["description"]
            .as_str()
            .unwrap()
            .contains("webhook is active")
    );
    tg.push_text(TOKEN, 10, "pushed");
    for _ in 0..100 {
        if tg.pending_updates(TOKEN) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(tg.pending_updates(TOKEN), 0);
    let got = got.lock().unwrap().clone();
    assert_eq!(got.len(), 2, "retried after the 503");
    assert_eq!(got[1].0["x-telegram-bot-api-secret-token"], "s3cret_-X");
    assert_eq!(got[1].1["message"]["text"], "pushed");
    let (_, v) = call(&http, &tg, "getWebhookInfo", json!({})).await;
    assert_eq!(v["result"]["url"], url.as_str());
    assert!(
        v["result"]["last_error_message"]
            .as_str()
            .unwrap()
            .contains("503")
    );
    let (_, v) = call(&http, &tg, "deleteWebhook", json!({})).await;
    assert_eq!(v["description"], "Webhook was deleted");
}

#[tokio::test]
async fn uploads_files_and_edits() {
    let (tg, http) = setup().await;
    let form = reqwest::multipart::Form::new()
        .text("chat_id", "10")
        .text("caption", "a doc")
        .part(
            "document",
            reqwest::multipart::Part::bytes(b"file body".to_vec())
                .file_name("a.txt")
                .mime_str("text/plain")
                .unwrap(),
        );
    let r = http
        .post(format!("{}/bot{TOKEN}/sendDocument", tg.base_url()))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let file_id = v["result"]["document"]["file_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let sent = tg.sent_messages(10);
    let f = sent[0].file.clone().unwrap();
    assert_eq!(
        (f.field.as_str(), f.bytes.as_slice(), f.filename.as_deref()),
        ("document", b"file body".as_slice(), Some("a.txt"))
    );
    let (_, v) = call(&http, &tg, "getFile", json!({"file_id": file_id})).await;
    let path = v["result"]["file_path"].as_str().unwrap();
    let body = http
        .get(format!("{}/file/bot{TOKEN}/{path}", tg.base_url()))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(&body[..], b"file body");
    let (_, v) = call(
        &http,
        &tg,
        "sendMessage",
        json!({"chat_id": 10, "text": "v1"}),
    )
    .await;
    let id = v["result"]["message_id"].clone();
    let (s, _) = call(
        &http,
        &tg,
        "editMessageText",
        json!({"chat_id": 10, "message_id": id, "text": "v2"}),
    )
    .await;
    assert_eq!(s, 200);
    let (s, v) = call(
        &http,
        &tg,
        "editMessageText",
        json!({"chat_id": 10, "message_id": id, "text": "v2"}),
    )
    .await;
    assert_eq!(s, 400);
    assert!(
        v["description"]
            .as_str()
            .unwrap()
            .starts_with("Bad Request: message is not modified")
    );
    assert_eq!(tg.sent_messages(10)[1].edits, vec!["v1".to_owned()]);
    let (s, _) = call(
        &http,
        &tg,
        "sendChatAction",
        json!({"chat_id": 10, "action": "typing"}),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(tg.chat_actions(10), vec!["typing".to_owned()]);
}

#[tokio::test]
async fn a_group_upgraded_to_a_supergroup_moves_its_chat_id() {
    let (tg, http) = setup().await;
    tg.add_chat(-4001, "group", "Ops");
    let (s, _) = call(
        &http,
        &tg,
        "sendMessage",
        json!({"chat_id": -4001, "text": "before"}),
    )
    .await;
    assert_eq!(s, 200);
    let (from, to) = tg.migrate_group(TOKEN, -4001, -1004001);
    assert!(from.update_id > 0 && to.update_id == from.update_id + 1);
    // The two service messages, new chat first; the old id is refused with the new one.
    let (_, v) = call(&http, &tg, "getUpdates", json!({})).await;
    let updates = v["result"].as_array().unwrap();
    assert_eq!(updates.len(), 2);
    assert_eq!(updates[0]["message"]["chat"]["id"], json!(-1004001));
    assert_eq!(updates[0]["message"]["chat"]["type"], json!("supergroup"));
    assert_eq!(updates[0]["message"]["migrate_from_chat_id"], json!(-4001));
    assert_eq!(updates[1]["message"]["chat"]["id"], json!(-4001));
    assert_eq!(updates[1]["message"]["migrate_to_chat_id"], json!(-1004001));
    for (method, body) in [
        ("sendMessage", json!({"chat_id": -4001, "text": "after"})),
        ("getChat", json!({"chat_id": -4001})),
        (
            "sendChatAction",
            json!({"chat_id": -4001, "action": "typing"}),
        ),
    ] {
        let (s, v) = call(&http, &tg, method, body).await;
        assert_eq!(s, 400, "{method}");
        assert_eq!(
            v,
            json!({"ok": false, "error_code": 400, "description": "Bad Request: group chat was upgraded to a supergroup chat", "parameters": {"migrate_to_chat_id": -1004001}}),
            "{method}"
        );
    }
    let (s, v) = call(
        &http,
        &tg,
        "sendMessage",
        json!({"chat_id": -1004001, "text": "after"}),
    )
    .await;
    assert_eq!(
        (s, v["result"]["chat"]["type"].clone()),
        (200, json!("supergroup"))
    );
    assert_eq!(
        tg.sent_messages(-4001).len(),
        1,
        "nothing more reaches the old group"
    );
    // Nobody posts in the old group any more; a supergroup is never upgraded again.
    assert_eq!(tg.push_text(TOKEN, -4001, "late").update_id, 0);
    assert_eq!(tg.migrate_group(TOKEN, -1004001, -1005001).0.update_id, 0);
}

#[tokio::test]
async fn edits_come_as_edited_message_only_to_bots_that_ask_for_them() {
    let (tg, http) = setup().await;
    let original = tg.push_text(TOKEN, 10, "helo");
    // Asking for messages only: an edit creates no update at all.
    let (_, v) = call(
        &http,
        &tg,
        "getUpdates",
        json!({"allowed_updates": ["message"]}),
    )
    .await;
    let first = v["result"][0]["update_id"].as_i64().unwrap();
    assert_eq!(
        tg.push_edit(TOKEN, 10, original.message_id, json!({"text": "hello"}))
            .update_id,
        0
    );
    // The default list (empty) includes edits; the stored message took the new text.
    call(
        &http,
        &tg,
        "getUpdates",
        json!({"offset": first + 1, "allowed_updates": []}),
    )
    .await;
    let edit = tg.push_edit(TOKEN, 10, original.message_id, json!({"text": "hello!"}));
    assert!(edit.update_id > first);
    let (_, v) = call(&http, &tg, "getUpdates", json!({"offset": first + 1})).await;
    let u = &v["result"][0];
    assert_eq!(u["update_id"], json!(edit.update_id));
    assert!(u.get("message").is_none());
    let m = &u["edited_message"];
    assert_eq!(
        (m["message_id"].clone(), m["text"].clone()),
        (json!(original.message_id), json!("hello!"))
    );
    assert!(m["edit_date"].as_i64().unwrap() >= m["date"].as_i64().unwrap());
    // A bot's own message or an unknown one: no update.
    let (_, v) = call(
        &http,
        &tg,
        "sendMessage",
        json!({"chat_id": 10, "text": "mine"}),
    )
    .await;
    let mine = v["result"]["message_id"].as_i64().unwrap();
    assert_eq!(
        tg.push_edit(TOKEN, 10, mine, json!({"text": "x"}))
            .update_id,
        0
    );
    assert_eq!(
        tg.push_edit(TOKEN, 10, 999, json!({"text": "x"})).update_id,
        0
    );
}
