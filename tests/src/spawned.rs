//! The real binary as a pod of its own: `switchyard serve` in a temporary folder with the
//! embedded backends (SQLite, local files, in-process ephemeral state), for attacks measured
//! against what ships (hostile ingress, one tenant against another). `SWITCHYARD_E2E_BIN`
//! points the scenarios at another build (for the figures of a build before a fix).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::{free_port, switchyard_binary};

/// The binary under test: `SWITCHYARD_E2E_BIN`, else this workspace's (built first).
pub fn binary() -> PathBuf {
    std::env::var_os("SWITCHYARD_E2E_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(switchyard_binary)
}

/// A running `switchyard serve` and the first tenant's API key it printed.
pub struct SpawnedPod {
    pub child: Child,
    pub port: u16,
    pub api_key: String,
    pub metrics_port: u16,
    /// The operator listener's port, for builds that have one (`admin_listen`).
    pub admin_port: Option<u16>,
    bin: PathBuf,
    dir: PathBuf,
    env: Vec<(String, String)>,
}

/// The binary with no inherited `SWITCHYARD_*` variable, run in `dir` with its data there,
/// loopback endpoints allowed, and `env` on top.
fn command(
    bin: &Path,
    dir: &Path,
    port: u16,
    metrics_port: u16,
    env: &[(String, String)],
) -> Command {
    let mut cmd = Command::new(bin);
    for (k, _) in std::env::vars() {
        if k.starts_with("SWITCHYARD_") {
            cmd.env_remove(k);
        }
    }
    cmd.current_dir(dir)
        .env("SWITCHYARD_DATA_DIR", dir.join("data"))
        .env("SWITCHYARD_LISTEN", format!("127.0.0.1:{port}"))
        .env(
            "SWITCHYARD_METRICS_LISTEN",
            format!("127.0.0.1:{metrics_port}"),
        )
        .env(
            "SWITCHYARD_HOSTS_TLS_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        )
        .env("SWITCHYARD_OUTBOUND__ALLOW_PRIVATE", "127.0.0.0/8,::1/128")
        .env("SWITCHYARD_LOG__LEVEL", "warn")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

impl SpawnedPod {
    /// Starts `bin` in `dir` with `env` on top of the defaults; waits for the API key the
    /// first start prints.
    pub async fn start(bin: &Path, dir: &Path, env: &[(&str, &str)]) -> Self {
        let mut env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        // Pods started side by side each get their own operator listener, on builds that
        // have one (an older build refuses the unknown setting).
        let defaults = Command::new(bin)
            .arg("print-default-config")
            .output()
            .await
            .expect("print-default-config");
        let admin_port = String::from_utf8_lossy(&defaults.stdout)
            .contains("admin_listen")
            .then(free_port);
        if let Some(p) = admin_port {
            env.push(("SWITCHYARD_ADMIN_LISTEN".into(), format!("127.0.0.1:{p}")));
        }
        let (port, metrics_port) = (free_port(), free_port());
        let mut child = command(bin, dir, port, metrics_port, &env)
            .arg("serve")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn switchyard serve");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let api_key = tokio::time::timeout(Duration::from_secs(60), async {
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
        Self {
            child,
            port,
            api_key,
            metrics_port,
            admin_port,
            bin: bin.to_owned(),
            dir: dir.to_owned(),
            env,
        }
    }

    /// `http://127.0.0.1:PORT`
    pub fn root_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Where the console is served: the operator listener when the build has one, else the
    /// metrics listener it shared before.
    pub fn console_url(&self) -> String {
        format!(
            "http://127.0.0.1:{}",
            self.admin_port.unwrap_or(self.metrics_port)
        )
    }

    /// Another tenant, made by the admin CLI against the pod's data; its API key.
    pub async fn create_tenant(&self, name: &str) -> String {
        let out = command(
            &self.bin,
            &self.dir,
            self.port,
            self.metrics_port,
            &self.env,
        )
        .args(["tenant", "create", name, "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .expect("run tenant create");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("tenant create --json prints JSON");
        v["api_key"].as_str().expect("api_key").to_owned()
    }
}
