//! The loadtest as an operator's tool: `switchyard-loadtest --target` against a `switchyard`
//! pod it did not start (the real binary, a tenant made with `switchyard tenant create
//! --json`). One run meets its thresholds and exits 0; one with an impossible `--min-rate`
//! exits 4. Both write the JSON and the HTML report with real deliveries in them, and the API
//! key never appears in either.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use switchyard_e2e::{build_workspace_binary, eventually, free_port, switchyard_binary};
use tokio::process::{Child, Command};

/// The documented exit status of a breached threshold (loadtest/README.md).
const EXIT_THRESHOLD: i32 = 4;

fn pod_command(bin: &Path, dir: &Path) -> Command {
    let mut cmd = Command::new(bin);
    for (k, _) in std::env::vars() {
        if k.starts_with("SWITCHYARD_") {
            cmd.env_remove(k);
        }
    }
    cmd.current_dir(dir)
        .env("SWITCHYARD_DATA_DIR", dir.join("data"))
        .env("SWITCHYARD_LOG__LEVEL", "warn")
        // The loadtest's fake webhook target listens on loopback.
        .env("SWITCHYARD_OUTBOUND__ALLOW_PRIVATE", "127.0.0.0/8,::1/128")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

struct Deployment {
    child: Child,
    base: String,
    metrics: String,
    key: String,
}

async fn deployment(bin: &Path, dir: &Path) -> Deployment {
    let out = pod_command(bin, dir)
        .args(["tenant", "create", "operator-loadtest", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .expect("switchyard tenant create");
    assert!(out.status.success(), "tenant create: {out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().rev().find(|l| !l.trim().is_empty()).unwrap();
    let v: Value = serde_json::from_str(line).expect("tenant create --json prints JSON");
    let key = v["api_key"].as_str().expect("api_key").to_owned();

    let (port, mport) = (free_port(), free_port());
    let child = pod_command(bin, dir)
        .arg("serve")
        .env("SWITCHYARD_LISTEN", format!("127.0.0.1:{port}"))
        .env("SWITCHYARD_METRICS_LISTEN", format!("127.0.0.1:{mport}"))
        .env(
            "SWITCHYARD_HOSTS_TLS_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("switchyard serve");
    let metrics = format!("http://127.0.0.1:{mport}");
    let ready = format!("{metrics}/readyz");
    eventually(Duration::from_secs(60), "the pod to be ready", || {
        let url = ready.clone();
        async move {
            reqwest::get(&url)
                .await
                .ok()
                .filter(|r| r.status() == 200)
                .map(|_| ())
        }
    })
    .await;
    Deployment {
        child,
        base: format!("http://127.0.0.1:{port}"),
        metrics,
        key,
    }
}

struct Run {
    code: i32,
    stdout: String,
    json: Value,
    html: String,
}

async fn loadtest(lt: &Path, d: &Deployment, json: &Path, extra: &[&str]) -> Run {
    let pid = d.child.id().expect("pod running").to_string();
    let out = Command::new(lt)
        .args(["--target", &d.base, "--metrics-url", &d.metrics])
        .args(["--pod-pid", &pid])
        .args(["--channels", "8", "--settle", "40s"])
        .args([
            "--tool-rate",
            "5",
            "--outbound-rate",
            "5",
            "--file-rate",
            "1",
        ])
        .arg("--json")
        .arg(json)
        .args(extra)
        // The key comes from the environment, as an operator's CI would pass it.
        .env("SWITCHYARD_LOADTEST_API_KEY", &d.key)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run switchyard-loadtest");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let code = out.status.code().unwrap_or(-1);
    let raw = std::fs::read_to_string(json)
        .unwrap_or_else(|e| panic!("json report (exit {code}): {e}\n{stdout}\n{stderr}"));
    let html_path = json.with_extension("html");
    let html = std::fs::read_to_string(&html_path)
        .unwrap_or_else(|e| panic!("html report beside the json: {e}\n{stdout}"));
    assert!(
        !raw.contains(&d.key),
        "the API key is not in the JSON report"
    );
    assert!(
        !html.contains(&d.key),
        "the API key is not in the HTML report"
    );
    assert!(!stdout.contains(&d.key) && !stderr.contains(&d.key));
    Run {
        code,
        stdout,
        json: serde_json::from_str(&raw).expect("json report parses"),
        html,
    }
}

fn flow<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["flows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["flow"] == name)
        .unwrap_or_else(|| panic!("flow {name} in the report"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loadtest_runs_against_an_existing_pod_and_exits_by_its_thresholds() {
    let (bin, lt): (PathBuf, PathBuf) = tokio::task::spawn_blocking(|| {
        (
            switchyard_binary(),
            build_workspace_binary("switchyard-loadtest", "switchyard-loadtest"),
        )
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut d = deployment(&bin, dir.path()).await;

    // Within its thresholds: exit 0.
    let ok_json = dir.path().join("ok.json");
    let ok = loadtest(
        &lt,
        &d,
        &ok_json,
        &[
            "--duration",
            "4s",
            "--inbound-rate",
            "40",
            "--max-p99",
            "20s",
            "--max-lost",
            "0",
            "--max-dup",
            "0",
            "--min-rate",
            "1",
        ],
    )
    .await;
    assert_eq!(
        ok.code, 0,
        "a run within its thresholds exits 0:\n{}",
        ok.stdout
    );
    let r = &ok.json;
    assert_eq!(r["target_url"], d.base.as_str());
    assert!(r["breaches"].as_array().unwrap().is_empty());
    for name in ["inbound", "tool", "outbound", "file"] {
        let f = flow(r, name);
        assert!(
            f["delivered"].as_u64().unwrap() > 0,
            "{name} delivered: {f}"
        );
        assert_eq!(f["lost"], 0, "{name}");
    }
    // 40/s for 4 s, each counted where it arrived.
    assert_eq!(flow(r, "inbound")["delivered"], 160);
    // The second-by-second series: rates, percentiles and the pod's RSS from /proc.
    let t_s = r["series"]["t_s"].as_array().unwrap();
    assert!(t_s.len() >= 4, "one sample a second: {t_s:?}");
    let inbound = &r["series"]["flows"][0];
    let delivered: f64 = inbound["delivered_per_s"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .sum();
    assert!(delivered > 100.0, "per-second inbound deliveries {inbound}");
    let pod = r["series"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["source"] == "proc")
        .expect("the pod's /proc series (--pod-pid)");
    assert!(
        pod["rss_mib"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v.as_f64().unwrap_or(0.0) > 1.0)
    );
    // The pod's /metrics was scraped.
    let scraped = r["pod_resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "metrics-0")
        .expect("metrics-0 scraped");
    assert!(!scraped["metrics"].as_array().unwrap().is_empty());
    // Self-contained HTML with the plots.
    let html = &ok.html;
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(
        html.matches("<svg").count() >= 4 * 2 + 2,
        "throughput + latency per flow, RSS, CPU"
    );
    assert!(html.contains("inbound throughput") && html.contains("pod RSS"));
    assert!(!html.contains("<script") && !html.contains("src=\"http"));

    // An impossible threshold: the run completes, the reports are written, exit 4.
    let bad_json = dir.path().join("bad.json");
    let bad = loadtest(
        &lt,
        &d,
        &bad_json,
        &[
            "--ramp",
            "0:60/s:3s",
            "--min-rate",
            "1000000",
            "--max-lost",
            "0",
        ],
    )
    .await;
    assert_eq!(
        bad.code, EXIT_THRESHOLD,
        "breached threshold:\n{}",
        bad.stdout
    );
    let breaches = bad.json["breaches"].as_array().unwrap();
    assert_eq!(breaches.len(), 1, "{breaches:?}");
    assert!(breaches[0].as_str().unwrap().contains("--min-rate"));
    assert!(bad.stdout.contains("thresholds: BREACHED"));
    assert_eq!(bad.json["duration_s"], 3.0, "the ramp sets the length");
    // 0 -> 60/s over 3 s: 90 messages offered and delivered.
    assert_eq!(flow(&bad.json, "inbound")["delivered"], 90);
    assert!(bad.html.contains("thresholds breached"));

    let _ = d.child.start_kill();
    let _ = d.child.wait().await;
}
