//! The real `switchyard` binary as an operator meets it (issue 12): configuration refused
//! with the key and the allowed values named, a bind failure naming its address, plain logs
//! when redirected, the first start saying where to point xAgent, and `switchyard check`.

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use switchyard_e2e::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// A command with a clean environment (no `SWITCHYARD_*`, no `NO_COLOR`) on `dir`.
fn command(dir: &Path) -> Command {
    let mut cmd = Command::new(switchyard_binary());
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOSTNAME", "ops-e2e")
        .current_dir(dir)
        .env("SWITCHYARD_DATA_DIR", dir.join("data"))
        .env("SWITCHYARD_LISTEN", format!("127.0.0.1:{}", free_port()))
        .env(
            "SWITCHYARD_METRICS_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        )
        .env(
            "SWITCHYARD_HOSTS_TLS_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn run(mut cmd: Command) -> Output {
    tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the command ends by itself")
        .expect("run switchyard")
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn binary_ready() {
    tokio::task::spawn_blocking(switchyard_binary)
        .await
        .expect("build");
}

#[tokio::test]
async fn bad_configuration_is_refused_naming_the_key_and_the_choices() {
    binary_ready().await;
    let dir = tempfile::tempdir().unwrap();
    for (var, value, expect) in [
        (
            "SWITCHYARD_LEASE__CONECTOR_GRACE",
            "2h",
            &[
                "unknown key `lease.conector_grace`",
                "SWITCHYARD_LEASE__CONECTOR_GRACE",
            ][..],
        ),
        (
            "SWITCHYARD_INGRESS__MAX_JSON_BYTE",
            "10",
            &["unknown key `ingress.max_json_byte`"][..],
        ),
        (
            "SWITCHYARD_LOG__LEVEL",
            "verbose",
            &["log.level", "`verbose` is not a log level", "debug"][..],
        ),
        (
            "SWITCHYARD_LOG__FORMAT",
            "JSON",
            &["log.format", "SWITCHYARD_LOG__FORMAT", "text, json"][..],
        ),
        (
            "SWITCHYARD_TELEGRAM__MODE",
            "webhooks",
            &["telegram.mode", "auto, webhook, polling"][..],
        ),
        (
            "SWITCHYARD_HOSTS__LOST_POLICY",
            "retry",
            &["hosts.lost_policy", "requeue, fail"][..],
        ),
    ] {
        let mut cmd = command(dir.path());
        cmd.env(var, value).arg("serve");
        let out = run(cmd).await;
        let (stdout, stderr) = text(&out);
        assert!(
            !out.status.success(),
            "{var}={value} was accepted: {stdout}"
        );
        for e in expect {
            assert!(
                stderr.contains(e),
                "{var}={value}: {e:?} missing in {stderr}"
            );
        }
        assert!(
            !dir.path().join("data").exists(),
            "{var}={value}: refused before anything was created"
        );
    }
}

#[tokio::test]
async fn the_printed_default_config_is_a_valid_config_file() {
    binary_ready().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = command(dir.path());
    cmd.arg("print-default-config");
    let out = run(cmd).await;
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).unwrap();
    // Keys that used to land in the last table ([log]) sit before the first table.
    let top = printed.split("\n[").next().unwrap();
    for key in ["hosts_tls_listen =", "operator_tokens ="] {
        assert!(
            top.lines().any(|l| l.starts_with(key)),
            "{key} at the top level"
        );
    }
    let file = dir.path().join("printed.toml");
    std::fs::write(&file, &printed).unwrap();
    let mut cmd = command(dir.path());
    cmd.arg("--config").arg(&file).arg("check");
    let out = run(cmd).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // The same file with a key under the wrong table is refused, naming the file.
    let moved = printed.replacen("operator_tokens = \"\"\n", "", 1) + "operator_tokens = \"\"\n";
    std::fs::write(&file, moved).unwrap();
    let mut cmd = command(dir.path());
    cmd.arg("--config").arg(&file).arg("check");
    let out = run(cmd).await;
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(
        stdout.contains("config     FAILED")
            && stderr.contains("unknown key `hosts.operator_tokens`"),
        "{stdout}\n{stderr}"
    );
    assert!(stderr.contains("printed.toml"), "{stderr}");
}

#[tokio::test]
async fn a_bind_failure_names_the_address() {
    binary_ready().await;
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    for var in ["SWITCHYARD_LISTEN", "SWITCHYARD_METRICS_LISTEN"] {
        let mut cmd = command(dir.path());
        cmd.env(var, &addr).arg("serve");
        let out = run(cmd).await;
        let (_, stderr) = text(&out);
        assert!(!out.status.success());
        assert!(
            stderr.contains(&addr) && stderr.contains("binding"),
            "{var}: {stderr}"
        );
    }
}

#[tokio::test]
async fn the_first_start_says_where_to_point_xagent_in_plain_text() {
    binary_ready().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let metrics_port = free_port();
    let mut cmd = command(dir.path());
    cmd.env("SWITCHYARD_LISTEN", format!("127.0.0.1:{port}"))
        .env(
            "SWITCHYARD_METRICS_LISTEN",
            format!("127.0.0.1:{metrics_port}"),
        )
        .arg("serve");
    let mut child = cmd.spawn().expect("spawn serve");
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut lines = Vec::new();
    let key = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(l) = stdout.next_line().await.unwrap() {
            let is_key = l.starts_with("sy_") && !l.contains(' ');
            lines.push(l.clone());
            if is_key {
                return l;
            }
        }
        panic!("stdout closed before the key: {lines:?}");
    })
    .await
    .expect("the first start prints a key");
    let printed = lines.join("\n");
    for (card, prefix) in [
        ("im.webhook", "/webhook"),
        ("im.telegram", "/telegram"),
        ("device.agent-host", "/hosts"),
    ] {
        let url = format!("http://127.0.0.1:{port}{prefix}");
        assert!(
            lines
                .iter()
                .any(|l| l.contains(card) && l.trim_end().ends_with(&url)),
            "{card} at {url} in {printed}"
        );
    }
    assert!(
        printed.contains(&format!("http://127.0.0.1:{metrics_port}/metrics")),
        "{printed}"
    );
    assert_eq!(
        lines.last(),
        Some(&key),
        "the key is alone on the last line"
    );
    // The printed Base URL is the one that serves the Card.
    let card = reqwest::get(format!(
        "http://127.0.0.1:{port}/webhook/connector-card.json"
    ))
    .await
    .unwrap();
    assert_eq!(card.status(), 200);

    let pid = child.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("exits after SIGTERM")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("switchyard serving"),
        "the log was captured: {stderr}"
    );
    assert!(
        !stderr.contains('\u{1b}'),
        "no ANSI colour codes in a redirected log: {stderr:?}"
    );
    assert!(!stderr.contains(&key), "the key is never logged");
}

fn lines_of(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_owned(), w.next()?.to_owned()))
        })
        .collect()
}

#[tokio::test]
async fn check_reaches_every_backend_and_fails_loudly() {
    binary_ready().await;
    let dir = tempfile::tempdir().unwrap();

    // Embedded: everything in-process or local, all fine, nothing created but the store.
    let mut cmd = command(dir.path());
    cmd.arg("check");
    let out = run(cmd).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let verdicts = lines_of(&stdout);
    for name in ["config", "keys", "store", "bus", "ephemeral", "files"] {
        assert!(
            verdicts.iter().any(|(n, v)| n == name && v == "ok"),
            "{name} ok in {stdout}"
        );
    }
    assert!(
        !dir.path().join("data/keys.json").exists(),
        "check generates no keys"
    );

    // Unreachable NATS and Redis: both named, the others still checked, non-zero exit.
    let (nats, redis) = (free_port(), free_port());
    let mut cmd = command(dir.path());
    cmd.env("SWITCHYARD_NATS_URL", format!("nats://127.0.0.1:{nats}"))
        .env(
            "SWITCHYARD_REDIS_URL",
            format!("redis://:hunter2-secret@127.0.0.1:{redis}"),
        )
        .args(["check", "--timeout", "3s"]);
    let out = run(cmd).await;
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}");
    let verdicts = lines_of(&stdout);
    let verdict = |name: &str| {
        verdicts
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert_eq!(verdict("bus"), "FAILED", "{stdout}");
    assert_eq!(verdict("ephemeral"), "FAILED", "{stdout}");
    assert_eq!(verdict("store"), "ok", "{stdout}");
    assert_eq!(verdict("files"), "ok", "{stdout}");
    assert!(stderr.contains("check failed: bus, ephemeral"), "{stderr}");
    assert!(
        !stdout.contains("hunter2") && !stderr.contains("hunter2"),
        "no password from a URL is printed"
    );
}

#[tokio::test]
async fn check_against_the_shared_backends_wants_a_migrated_schema() {
    binary_ready().await;
    let dir = tempfile::tempdir().unwrap();
    let schema = format!(
        "ops_check_{}",
        switchyard_core::ids::random_secret(4).to_lowercase()
    );
    let env = |cmd: &mut Command| {
        let get = |k: &str, d: &str| {
            std::env::var(k)
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| d.to_owned())
        };
        cmd.env(
            "SWITCHYARD_DATABASE_URL",
            get(
                "SWITCHYARD_TEST_POSTGRES_URL",
                "postgres://postgres@127.0.0.1:5432/test",
            ),
        )
        .env("SWITCHYARD_DATABASE_SCHEMA", &schema)
        .env(
            "SWITCHYARD_NATS_URL",
            get("SWITCHYARD_TEST_NATS_URL", "nats://127.0.0.1:4222"),
        )
        .env(
            "SWITCHYARD_REDIS_URL",
            get("SWITCHYARD_TEST_REDIS_URL", "redis://127.0.0.1:6379"),
        )
        .env(
            "SWITCHYARD_SIGNING_KEYS",
            "0123456789abcdef0123456789abcdef",
        )
        .env(
            "SWITCHYARD_ENCRYPTION_KEYS",
            switchyard_core::crypto::Cipher::generate_key(),
        );
    };
    let mut cmd = command(dir.path());
    env(&mut cmd);
    cmd.arg("check");
    let out = run(cmd).await;
    let (stdout, _) = text(&out);
    assert!(
        !out.status.success(),
        "an unmigrated schema fails: {stdout}"
    );
    let store = stdout
        .lines()
        .find(|l| l.starts_with("store"))
        .unwrap_or_default();
    assert!(
        store.contains("FAILED") && store.contains("run `switchyard migrate`"),
        "{stdout}"
    );
    for name in ["bus", "ephemeral", "keys"] {
        assert!(
            lines_of(&stdout)
                .iter()
                .any(|(n, v)| n == name && v == "ok"),
            "{name} ok: {stdout}"
        );
    }

    let mut cmd = command(dir.path());
    env(&mut cmd);
    cmd.arg("migrate");
    assert!(run(cmd).await.status.success());
    let mut cmd = command(dir.path());
    env(&mut cmd);
    cmd.arg("check");
    let out = run(cmd).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("Postgres at postgres://127.0.0.1:5432"),
        "{stdout}"
    );

    // Missing keys with a shared database are named.
    let mut cmd = command(dir.path());
    env(&mut cmd);
    cmd.env_remove("SWITCHYARD_SIGNING_KEYS").arg("check");
    let out = run(cmd).await;
    let (stdout, _) = text(&out);
    assert!(!out.status.success());
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("keys") && l.contains("SWITCHYARD_SIGNING_KEYS")),
        "{stdout}"
    );
}

/// The image's build (issue 12): both bases are pinned by digest, and the git revision, which
/// a container build cannot read (`.git` is not in its context), is passed to the build.
#[test]
fn the_image_pins_its_bases_and_passes_the_revision() {
    let dockerfile = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Dockerfile"))
        .expect("the Dockerfile");
    for arg in ["RUST_IMAGE", "RUNTIME_IMAGE"] {
        let line = dockerfile
            .lines()
            .find(|l| l.starts_with(&format!("ARG {arg}=")))
            .unwrap_or_else(|| panic!("ARG {arg}"));
        let digest = line.split_once("@sha256:").map(|(_, d)| d).unwrap_or("");
        assert!(
            digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
            "{arg} is pinned by digest: {line}"
        );
    }
    assert!(dockerfile.contains("ARG SWITCHYARD_GIT_REVISION"));
    assert!(
        dockerfile.contains("export SWITCHYARD_GIT_REVISION;"),
        "the build step sees the revision"
    );
}

/// The revision a build reports is the one it was built from: `SWITCHYARD_GIT_REVISION`
/// when the build was given one, else the checkout's HEAD (scripts/test.sh builds the
/// binary from this checkout right before the tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_the_revision_it_was_built_from() {
    let expected = match std::env::var("SWITCHYARD_GIT_REVISION") {
        Ok(r) if !r.trim().is_empty() => r.trim().chars().take(12).collect::<String>(),
        _ => {
            let out = std::process::Command::new("git")
                .args(["rev-parse", "--short=7", "HEAD"])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .output()
                .expect("git");
            if !out.status.success() {
                eprintln!("not a git checkout: the build says `unknown`, nothing to compare");
                return;
            }
            String::from_utf8(out.stdout).unwrap().trim().to_owned()
        }
    };
    let pod = Pod::start(PodOptions::default()).await;
    let health: serde_json::Value = reqwest::Client::new()
        .get(format!("{}/health", pod.base_url()))
        .bearer_auth(pod.api_key())
        .send()
        .await
        .expect("/health")
        .json()
        .await
        .expect("/health JSON");
    assert_eq!(health["build"]["git_rev"], expected.as_str());
}
