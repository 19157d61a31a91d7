//! The memory a pod holds under unauthenticated webhook floods (issue 9, finding 1): 24
//! parallel ~19.5 MiB POSTs with a garbage signature against a bound channel of the real
//! binary, as JSON and as multipart. Ignored by default (it moves ~1 GiB through loopback);
//! run it with
//! `cargo test -p switchyard-e2e --test hostile_ingress -- --ignored --nocapture`, and with
//! `SWITCHYARD_E2E_BIN=path/to/switchyard` to measure another build.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use switchyard_e2e::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const PARALLEL: usize = 24;
const BODY_BYTES: usize = 19 * 1024 * 1024 + 512 * 1024;
/// What the pod may grow by under the flood with the limits in place.
const MAX_GROWTH_KIB: u64 = 160 * 1024;

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

async fn start(bin: &Path, dir: &Path) -> (Child, u16, String) {
    let port = free_port();
    let mut cmd = Command::new(bin);
    for (k, _) in std::env::vars() {
        if k.starts_with("SWITCHYARD_") {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .arg("serve")
        .current_dir(dir)
        .env("SWITCHYARD_DATA_DIR", dir.join("data"))
        .env("SWITCHYARD_LISTEN", format!("127.0.0.1:{port}"))
        .env(
            "SWITCHYARD_METRICS_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        )
        .env(
            "SWITCHYARD_HOSTS_TLS_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        )
        .env("SWITCHYARD_OUTBOUND__ALLOW_PRIVATE", "127.0.0.0/8,::1/128")
        .env("SWITCHYARD_LOG__LEVEL", "warn")
        // `HOSTILE_PER_CHANNEL=24` lets every request of the flood stream at once.
        .env(
            "SWITCHYARD_INGRESS__MAX_CONCURRENT_PER_CHANNEL",
            std::env::var("HOSTILE_PER_CHANNEL").unwrap_or_else(|_| "8".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn switchyard serve");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let key = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(l)) = lines.next_line().await {
            if l.starts_with("sy_") && !l.contains(char::is_whitespace) {
                return l;
            }
        }
        panic!("no API key printed");
    })
    .await
    .expect("the first start prints an API key");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, port, key)
}

fn binary() -> PathBuf {
    std::env::var_os("SWITCHYARD_E2E_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(switchyard_binary)
}

/// A well-formed multipart body: a message part and one file part of ~19.5 MiB.
fn multipart_body() -> Vec<u8> {
    let mut b = b"--zzz\r\nContent-Disposition: form-data; name=\"message\"\r\n\r\n{\"message_id\":\"m\",\"text\":\"t\"}\r\n--zzz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.bin\"\r\n\r\n".to_vec();
    b.resize(BODY_BYTES - 12, b'a');
    b.extend_from_slice(b"\r\n--zzz--\r\n");
    b
}

/// Floods the channel; returns the peak RSS growth (KiB) and the answers' statuses.
async fn flood(pid: u32, url: &str, content_type: &str, body: Vec<u8>) -> (u64, Vec<u16>) {
    let base = rss_kib(pid);
    let peak = Arc::new(AtomicU64::new(base));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                peak.fetch_max(rss_kib(pid), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let body = bytes::Bytes::from(body);
    let http = reqwest::Client::new();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let tasks: Vec<_> = (0..PARALLEL)
        .map(|_| {
            let req = http
                .post(url)
                .header("content-type", content_type)
                .header("x-switchyard-timestamp", now.to_string())
                .header("x-switchyard-signature", format!("v1={}", "0".repeat(64)))
                .body(body.clone());
            tokio::spawn(async move { req.send().await.map(|r| r.status().as_u16()).unwrap_or(0) })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    done.store(true, Ordering::SeqCst);
    sampler.await.unwrap();
    statuses.sort_unstable();
    (peak.load(Ordering::SeqCst).saturating_sub(base), statuses)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "moves ~1 GiB through loopback; run for the memory figures"]
async fn garbage_signature_floods_keep_the_pod_small() {
    let bin = tokio::task::spawn_blocking(binary).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (child, port, key) = start(&bin, dir.path()).await;
    let pid = child.id().expect("running");
    let base = format!("http://127.0.0.1:{port}{PREFIX}");
    let sim = Sim::new(&base, Some(&key)).unwrap();
    let secret = new_secret();
    let endpoint = fake_endpoint(&secret).await;
    let (conn, _) = hello(&sim, None, &[IM_V2]).await;
    let (ch, _) = bind_channel(&conn, endpoint.url(), &secret).await;
    let url = format!("{base}/inbound/{ch}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = rss_kib(pid);
    let (json_growth, json_statuses) =
        flood(pid, &url, "application/json", vec![b'a'; BODY_BYTES]).await;
    let (mp_growth, mp_statuses) = flood(
        pid,
        &url,
        "multipart/form-data; boundary=zzz",
        multipart_body(),
    )
    .await;
    let after = rss_kib(pid);
    let files = walk_size(&dir.path().join("data").join("files"));
    println!(
        "binary {}: idle RSS {} MiB; {PARALLEL} x {:.1} MiB garbage-signature POSTs: JSON peak +{} MiB (statuses {:?}), multipart peak +{} MiB (statuses {:?}); RSS after {} MiB; bytes left in the files folder {files}",
        bin.display(),
        idle / 1024,
        BODY_BYTES as f64 / 1048576.0,
        json_growth / 1024,
        dedup(&json_statuses),
        mp_growth / 1024,
        dedup(&mp_statuses),
        after / 1024,
    );
    assert!(
        json_growth < MAX_GROWTH_KIB,
        "JSON flood grew RSS by {json_growth} KiB"
    );
    assert!(
        mp_growth < MAX_GROWTH_KIB,
        "multipart flood grew RSS by {mp_growth} KiB"
    );
    assert_eq!(files, 0, "bytes of refused requests were kept");
}

fn dedup(s: &[u16]) -> Vec<(u16, usize)> {
    let mut out: Vec<(u16, usize)> = Vec::new();
    for &x in s {
        match out.last_mut() {
            Some((v, n)) if *v == x => *n += 1,
            _ => out.push((x, 1)),
        }
    }
    out
}

fn walk_size(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => walk_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}
