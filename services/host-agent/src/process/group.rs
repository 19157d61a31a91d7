//! The process group of a run: recorded in the run's folder with the leader's start time, so
//! a restarted agent stops what an earlier one left running, and never a process that
//! reused the pid.

use std::path::Path;
use std::time::Duration;

use tokio::process::Command;

use super::RunDirs;

const GROUP_FILE: &str = "pgid";

/// The kernel's start time of a process (field 22 of /proc/PID/stat): with the pid it names
/// one process, never a later one that reused the pid.
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19).map(str::to_owned)
}

pub(super) fn record_group(run_root: &Path, pid: u32) -> std::io::Result<()> {
    let started = start_time(pid).unwrap_or_default();
    std::fs::write(run_root.join(GROUP_FILE), format!("{pid} {started}\n"))
}

/// Stops the process group a dead earlier process of this host left running for a run:
/// SIGTERM, then SIGKILL after `grace`. Only when the recorded leader is still the same
/// process (pid and start time match).
pub async fn stop_leftover(state_dir: &Path, run_id: &str, grace: Duration) {
    let root = RunDirs::new(state_dir, run_id).root;
    let Ok(recorded) = std::fs::read_to_string(root.join(GROUP_FILE)) else {
        return;
    };
    let mut parts = recorded.split_whitespace();
    let (Some(Ok(pid)), Some(started)) = (parts.next().map(str::parse::<u32>), parts.next()) else {
        return;
    };
    if start_time(pid).as_deref() != Some(started) {
        return;
    }
    tracing::warn!(
        run_id,
        pgid = pid,
        "stopping the agent processes an earlier host agent left running"
    );
    signal_group(Some(pid), "TERM").await;
    let deadline = tokio::time::Instant::now() + grace;
    while tokio::time::Instant::now() < deadline {
        if start_time(pid).as_deref() != Some(started) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    signal_group(Some(pid), "KILL").await;
}

/// Sends SIGTERM/SIGKILL to the whole process group through kill(1): the workspace forbids
/// `unsafe`, and a process group cannot be signalled through `std`.
pub(super) async fn signal_group(pgid: Option<u32>, signal: &str) {
    let Some(pgid) = pgid else {
        return;
    };
    let result = Command::new("kill")
        .args(["-s", signal, "--", &format!("-{pgid}")])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await;
    if let Err(e) = result {
        tracing::warn!(pgid, signal, error = %e, "cannot run kill(1)");
    }
}
