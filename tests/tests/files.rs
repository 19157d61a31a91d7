//! Transfer plane: `POST /files/uploads` and `GET /files/refs/{file_ref}` (C-09..C-15, S-03, S-07).

use std::time::Duration;

use serde_json::{Value, json};
use switchyard_e2e::*;
use switchyard_xagent_sim::CHANNEL_HEADER;

async fn upload_raw(
    fx: &Fixture,
    key: Option<&str>,
    channel: Option<&str>,
    form: reqwest::multipart::Form,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{}/files/uploads", fx.pod.base_url()))
        .multipart(form);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    if let Some(c) = channel {
        req = req.header(CHANNEL_HEADER, c);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn file_form(name: &str, mime: &str, bytes: &[u8]) -> reqwest::multipart::Form {
    let part = reqwest::multipart::Part::bytes(bytes.to_vec())
        .file_name(name.to_owned())
        .mime_str(mime)
        .unwrap();
    reqwest::multipart::Form::new()
        .text("recipient_ref", "r-1")
        .part("file", part)
}

/// Receives an inbound file through the webhook and returns its (relative, signed) download_url.
async fn inbound_file_url(
    fx: &Fixture,
    message_id: &str,
    name: &str,
    mime: &str,
    bytes: &[u8],
) -> (String, String) {
    let req = InboundRequest::multipart(
        &fx.secret,
        &json!({"message_id": message_id}),
        &[(name, mime, bytes)],
    );
    assert_eq!(req.send(&fx.pod.base_url(), &fx.channel_id).await.0, 202);
    let msg = fx.next_chat().await;
    fx.conn
        .ack_chat_message(&msg, AckStatus::Accepted, None, None)
        .await
        .unwrap();
    let f = msg.at("/files/0").unwrap();
    (
        f["file_ref"].as_str().unwrap().to_owned(),
        f["download_url"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_are_checked_and_bound_to_their_channel() {
    let fx = Fixture::start(PodOptions::default().max_upload_bytes(1024)).await;
    let key = fx.pod.api_key().to_owned();
    let ch = fx.channel_id.clone();

    // C-09: a successful upload returns an opaque file_ref and its metadata.
    let (status, up) = upload_raw(
        &fx,
        Some(&key),
        Some(&ch),
        file_form("hello.txt", "text/plain", b"hello"),
    )
    .await;
    assert_eq!(status, 200, "{up}");
    let file_ref = up["file_ref"].as_str().unwrap();
    assert!(!file_ref.is_empty());
    assert_eq!(up["file_type"], "file");
    assert_eq!(up["filename"], "hello.txt");
    assert_eq!(up["byte_size"], 5);
    assert!(up["expires_at"].as_i64().unwrap() > switchyard_core::ids::now_ms());
    assert!(!up.to_string().contains(&key), "C-13");

    // Without a file -> 400; without the channel header -> 400.
    let no_file = reqwest::multipart::Form::new().text("recipient_ref", "r-1");
    assert_eq!(upload_raw(&fx, Some(&key), Some(&ch), no_file).await.0, 400);
    assert_eq!(
        upload_raw(
            &fx,
            Some(&key),
            None,
            file_form("a.txt", "text/plain", b"a")
        )
        .await
        .0,
        400
    );
    // Not multipart at all -> 400.
    let resp = reqwest::Client::new()
        .post(format!("{}/files/uploads", fx.pod.base_url()))
        .bearer_auth(&key)
        .header(CHANNEL_HEADER, &ch)
        .body("raw")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    // Unknown channel -> 404; another tenant's channel -> 403 (S-03).
    assert_eq!(
        upload_raw(
            &fx,
            Some(&key),
            Some("cch_unknown"),
            file_form("a.txt", "text/plain", b"a")
        )
        .await
        .0,
        404
    );
    let b = fx.pod.create_tenant("tenant-b").await;
    let sim_b = fx.pod.sim_with_key(Some(&b.api_key));
    let (conn_b, _) = hello(&sim_b, None, &[IM_V2]).await;
    let (ch_b, _) = open(&conn_b, None).await;
    assert_eq!(
        upload_raw(
            &fx,
            Some(&key),
            Some(&ch_b),
            file_form("a.txt", "text/plain", b"a")
        )
        .await
        .0,
        403
    );
    assert_eq!(
        upload_raw(
            &fx,
            Some(&b.api_key),
            Some(&ch),
            file_form("a.txt", "text/plain", b"a")
        )
        .await
        .0,
        403
    );
    // Over max_upload_bytes -> 413, and nothing is stored.
    let big = vec![b'x'; 4096];
    assert_eq!(
        upload_raw(
            &fx,
            Some(&key),
            Some(&ch),
            file_form("big.bin", "application/octet-stream", &big)
        )
        .await
        .0,
        413
    );
    // Exactly at the limit is fine.
    let fits = vec![b'y'; 1024];
    assert_eq!(
        upload_raw(
            &fx,
            Some(&key),
            Some(&ch),
            file_form("fits.bin", "application/octet-stream", &fits)
        )
        .await
        .0,
        200
    );

    // C-10: fetching with the system key through the owning channel works; another channel
    // or another tenant gets 403.
    let get = |key: Option<String>, channel: Option<String>| {
        let url = format!("{}/files/refs/{file_ref}", fx.pod.base_url());
        async move {
            let mut req = reqwest::Client::new().get(url);
            if let Some(k) = key {
                req = req.bearer_auth(k);
            }
            if let Some(c) = channel {
                req = req.header(CHANNEL_HEADER, c);
            }
            req.send().await.unwrap().status().as_u16()
        }
    };
    assert_eq!(get(Some(key.clone()), Some(ch.clone())).await, 200);
    let (other_ch, _) = open(&fx.conn, None).await;
    assert_eq!(get(Some(key.clone()), Some(other_ch)).await, 403);
    assert_eq!(get(Some(b.api_key.clone()), Some(ch.clone())).await, 403);
    // No key and no signature: the ref alone is not a credential (C-36).
    assert_eq!(get(None, None).await, 403);
    assert_eq!(get(Some("sy_00_wrong".into()), Some(ch.clone())).await, 401);
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_serve_bytes_and_refuse_tampering() {
    let fx = Fixture::start(PodOptions::default()).await;
    let bytes = "contents of the résumé".as_bytes().to_vec();
    let (file_ref, url) =
        inbound_file_url(&fx, "m-file-1", "résumé 1.pdf", "application/pdf", &bytes).await;
    assert!(
        url.starts_with(&format!("/files/refs/{file_ref}?")),
        "{url}"
    );

    // C-12: bytes, type and disposition, with no headers at all.
    let (status, headers, got) = fx.sim.download(&url).await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(got.to_vec(), bytes);
    assert_eq!(headers["content-type"], "application/pdf");
    assert_eq!(headers["content-length"], bytes.len().to_string().as_str());
    let cd = headers["content-disposition"].to_str().unwrap();
    assert!(cd.starts_with("attachment;"), "{cd}");
    assert!(
        cd.contains("filename*=UTF-8''r%C3%A9sum%C3%A9%201.pdf"),
        "{cd}"
    );

    // Tampered signature, tampered expiry, or a signature of another file -> 403.
    let (path, query) = url.split_once('?').unwrap();
    let params: Vec<(&str, &str)> = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let exp = params.iter().find(|(k, _)| *k == "exp").unwrap().1;
    let sig = params.iter().find(|(k, _)| *k == "sig").unwrap().1;
    let mut bad_sig = sig.to_owned();
    let last = bad_sig.pop().unwrap();
    bad_sig.push(if last == 'A' { 'B' } else { 'A' });
    assert_eq!(
        fx.sim
            .download(&format!("{path}?exp={exp}&sig={bad_sig}"))
            .await
            .unwrap()
            .0,
        403
    );
    let later: i64 = exp.parse::<i64>().unwrap() + 3_600_000;
    assert_eq!(
        fx.sim
            .download(&format!("{path}?exp={later}&sig={sig}"))
            .await
            .unwrap()
            .0,
        403
    );
    assert_eq!(
        fx.sim
            .download(&format!("{path}?sig={sig}"))
            .await
            .unwrap()
            .0,
        403
    );
    let (other_ref, _) =
        inbound_file_url(&fx, "m-file-2", "other.txt", "text/plain", b"other").await;
    assert_eq!(
        fx.sim
            .download(&format!("/files/refs/{other_ref}?{query}"))
            .await
            .unwrap()
            .0,
        403
    );

    // C-11: unknown refs -> 404.
    assert_eq!(
        fx.sim
            .download("/files/refs/file_0123456789abcdef0123456789abcdef")
            .await
            .unwrap()
            .0,
        404
    );
    // C-13: no secret in refs or URLs.
    for s in [
        fx.pod.api_key(),
        fx.secret.as_str(),
        "chat-system-path-token",
    ] {
        assert!(!url.contains(s) && !file_ref.contains(s));
    }
    // S-06: temporary download keys are not logged, although the requests above were.
    assert_not_logged(sig);
    fx.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_urls_expire() {
    let ttl = Duration::from_secs(2);
    let fx = Fixture::start(PodOptions::default().download_url_ttl(ttl)).await;
    let (_, url) = inbound_file_url(&fx, "m-exp", "short.txt", "text/plain", b"short lived").await;
    assert_eq!(fx.sim.download(&url).await.unwrap().0, 200);
    // C-14: short TTL: the same URL stops working (404, like an unknown ref).
    let status = eventually(
        ttl + Duration::from_secs(5),
        "the download URL to expire",
        || async {
            let s = fx.sim.download(&url).await.unwrap().0;
            (s != 200).then_some(s)
        },
    )
    .await;
    assert_eq!(status, 404);
    fx.assert_clean();
}
