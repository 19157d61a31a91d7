//! One run: the agent process from start to its terminal event.
//!
//! The process runs in its own process group with `SWITCHYARD_RUN_*` in its environment and
//! the run dir as working dir. Its stdout lines become events ([`crate::lines`]), its stderr
//! lines warnings (bounded). Cancel and timeout send SIGTERM to the group and SIGKILL after
//! the grace period. On a normal exit every regular file under the artifacts dir is
//! uploaded, then exit 0 is a `completion` and anything else a fatal `error` (5002).

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use switchyard_protocol::hosts::HostErrorCode;
use switchyard_protocol::hosts::HostMessage;
use switchyard_protocol::hosts::message::{
    ApprovalRequest, CompletionPayload, CreateRun, DownloadArtifact, ErrorEventPayload, RiskLevel,
    RunEvent, UploadArtifact, WarningPayload,
};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::adapter::{Launch, SummaryMode};
use crate::config::AgentConfig;
use crate::http::Transfers;
use crate::ids::{clip, dir_name};
use crate::lines::{LineItem, parse_line, progress};
use crate::outbox::{Outbox, RequestError};
use crate::requests::Reply;

mod group;

pub use group::stop_leftover;
use group::{record_group, signal_group};

/// Longest stdout/stderr line read; the rest of a longer line is skipped.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;
/// How many stderr lines of one run become warnings.
pub const MAX_STDERR_WARNINGS: u32 = 200;
/// At most this many stderr warnings per second; the rest are counted.
const STDERR_PER_SECOND: u32 = 20;
/// Longest summary of an `AllText` adapter (its tail is kept).
const MAX_SUMMARY_BYTES: usize = 16 * 1024;
/// After the process exits, how long its stdout/stderr may still be read (a grandchild may
/// hold them open).
const DRAIN: Duration = Duration::from_secs(2);
/// How many artifact files one run may upload.
const MAX_ARTIFACTS: usize = 1000;
/// Retries of a failed PUT/GET of artifact bytes.
const TRANSFER_RETRIES: u32 = 3;

/// What all runs share.
pub struct RunEnv {
    pub state_dir: PathBuf,
    pub kill_grace: Duration,
    pub outbox: Outbox,
    pub transfers: Transfers,
    /// How long one attempt of `upload_artifact`/`download_artifact` waits for an answer.
    pub request_timeout: Duration,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// With its terminal event: `completion` or a fatal `error`.
    Finished(RunEvent),
    /// Cancelled: answered with `run_cancelled`.
    Cancelled,
}

fn fatal(message: String) -> Outcome {
    Outcome::Finished(RunEvent::Error(ErrorEventPayload {
        message,
        code: Some(HostErrorCode::AdapterError),
        fatal: true,
    }))
}

/// The directories of a run under the state dir.
pub struct RunDirs {
    pub root: PathBuf,
    pub artifacts: PathBuf,
    pub inputs: PathBuf,
}

impl RunDirs {
    pub fn new(state_dir: &Path, run_id: &str) -> Self {
        let root = state_dir
            .join(crate::state::RUNS_DIR)
            .join(dir_name(run_id));
        Self {
            artifacts: root.join("artifacts"),
            inputs: root.join("inputs"),
            root,
        }
    }

    /// Fresh, empty artifacts and inputs dirs (a re-dispatched run starts over).
    fn prepare(&self) -> std::io::Result<()> {
        for d in [&self.artifacts, &self.inputs] {
            match std::fs::remove_dir_all(d) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            std::fs::create_dir_all(d)?;
        }
        Ok(())
    }
}

/// Runs `create` on `agent` with `launch` until it ends or `cancel` fires.
pub async fn execute(
    env: Arc<RunEnv>,
    agent: Arc<AgentConfig>,
    create: CreateRun,
    launch: Launch,
    cancel: CancellationToken,
) -> Outcome {
    let run_id = create.run_id.clone();
    let dirs = RunDirs::new(&env.state_dir, &run_id);
    if let Err(e) = dirs.prepare() {
        return fatal(format!("cannot prepare the run directory: {e}"));
    }
    let mut run = Run {
        env: env.clone(),
        agent,
        run_id: run_id.clone(),
        stdin: None,
        last_line: None,
        text: String::new(),
        completion: None,
        stderr: StderrBudget::default(),
        approvals: JoinSet::new(),
    };
    run.download_inputs(&create, &dirs.inputs).await;
    let context = json!({
        "context_bundle": create.context_bundle,
        "constraints": create.constraints,
    });
    let mut cmd = Command::new(&launch.program);
    cmd.args(&launch.args)
        .current_dir(&dirs.root)
        .env("SWITCHYARD_RUN_ID", &run_id)
        .env("SWITCHYARD_RUN_GOAL", &create.goal)
        .env("SWITCHYARD_RUN_ARTIFACTS", &dirs.artifacts)
        .env("SWITCHYARD_RUN_INPUTS", &dirs.inputs)
        .env("SWITCHYARD_RUN_CONTEXT", context.to_string())
        .stdin(if launch.goal_on_stdin {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return fatal(format!("cannot start {}: {e}", launch.program.display()));
        }
    };
    let pgid = child.id();
    tracing::info!(run_id, pid = pgid, program = %launch.program.display(), "run started");
    if let Some(pid) = pgid {
        // Lets a later process of this host stop the group if this one dies mid-run.
        if let Err(e) = record_group(&dirs.root, pid) {
            tracing::warn!(run_id, error = %e, "cannot record the run's process group");
        }
    }
    run.stdin = child.stdin.take();
    if launch.goal_on_stdin {
        let goal = format!("{}\n", create.goal);
        run.write_stdin(&goal).await;
    }
    let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        return fatal("the agent process has no stdout/stderr pipe".into());
    };
    // 0 reads as "no limit", like an absent one.
    let timeout = create
        .constraints
        .timeout_seconds
        .filter(|&s| s > 0)
        .map(Duration::from_secs);
    let stop = run
        .supervise(&mut child, pgid, out, err, timeout, &cancel)
        .await;
    match stop {
        Stop::Cancelled => {
            tracing::info!(run_id, "run cancelled");
            Outcome::Cancelled
        }
        Stop::TimedOut(t) => {
            tracing::info!(run_id, timeout_s = t.as_secs(), "run timed out");
            fatal(format!(
                "run timed out after {} s; the agent process was killed",
                t.as_secs()
            ))
        }
        Stop::Exited(status) => {
            let uploaded = run.upload_artifacts(&dirs.artifacts).await;
            tracing::info!(run_id, status = %status, artifacts = uploaded.len(), "run ended");
            if status.success() {
                let mut done = run.completion.take().unwrap_or_default();
                if done.summary.is_none() {
                    done.summary = match launch.summary {
                        SummaryMode::LastLine => run.last_line.take(),
                        SummaryMode::AllText => {
                            Some(std::mem::take(&mut run.text)).filter(|t| !t.is_empty())
                        }
                    };
                }
                done.artifacts.extend(uploaded);
                Outcome::Finished(RunEvent::Completion(done))
            } else {
                fatal(format!("agent process {}", describe(status)))
            }
        }
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        _ => format!("ended with {status}"),
    }
}

enum Stop {
    Exited(ExitStatus),
    Cancelled,
    TimedOut(Duration),
}

#[derive(Default)]
struct StderrBudget {
    sent: u32,
    window_start: Option<Instant>,
    in_window: u32,
    suppressed: u64,
}

struct Run {
    env: Arc<RunEnv>,
    agent: Arc<AgentConfig>,
    run_id: String,
    stdin: Option<ChildStdin>,
    last_line: Option<String>,
    text: String,
    completion: Option<CompletionPayload>,
    stderr: StderrBudget,
    approvals: JoinSet<(String, String, Result<Reply, RequestError>)>,
}

/// Far enough in the future to never fire.
fn never() -> Instant {
    Instant::now() + Duration::from_secs(365 * 24 * 3600)
}

impl Run {
    fn event(&self, e: RunEvent) {
        self.env.outbox.event(&self.run_id, e);
    }

    fn warning(&self, message: String) {
        self.event(RunEvent::Warning(WarningPayload { message }));
    }

    fn error(&self, message: String, code: Option<HostErrorCode>) {
        self.event(RunEvent::Error(ErrorEventPayload {
            message,
            code,
            fatal: false,
        }));
    }

    async fn write_stdin(&mut self, text: &str) {
        let Some(stdin) = self.stdin.as_mut() else {
            return;
        };
        let write = async {
            stdin.write_all(text.as_bytes()).await?;
            stdin.flush().await
        };
        match tokio::time::timeout(Duration::from_secs(5), write).await {
            Ok(Ok(())) => {}
            // The process closed its stdin or stopped reading: it does not want answers.
            Ok(Err(e)) => {
                tracing::debug!(run_id = self.run_id, error = %e, "agent stdin closed");
                self.stdin = None;
            }
            Err(_) => {
                tracing::warn!(run_id = self.run_id, "agent does not read its stdin");
                self.stdin = None;
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn supervise(
        &mut self,
        child: &mut Child,
        pgid: Option<u32>,
        out: tokio::process::ChildStdout,
        err: tokio::process::ChildStderr,
        timeout: Option<Duration>,
        cancel: &CancellationToken,
    ) -> Stop {
        let mut out = LineReader::new(BufReader::new(out));
        let mut err = LineReader::new(BufReader::new(err));
        let (mut out_done, mut err_done) = (false, false);
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut status: Option<ExitStatus> = None;
        let mut stop: Option<Stop> = None;
        let mut kill_at: Option<Instant> = None;
        let mut drain_until: Option<Instant> = None;
        loop {
            if status.is_some() && out_done && err_done {
                break;
            }
            tokio::select! {
                line = out.next_line(), if !out_done => match line {
                    Ok(Some(l)) => self.on_stdout(&l).await,
                    Ok(None) => out_done = true,
                    Err(e) => {
                        tracing::warn!(run_id = self.run_id, error = %e, "reading agent stdout failed");
                        out_done = true;
                    }
                },
                line = err.next_line(), if !err_done => match line {
                    Ok(Some(l)) => self.on_stderr(&l),
                    _ => err_done = true,
                },
                Some(done) = self.approvals.join_next(), if !self.approvals.is_empty() => {
                    if let Ok((id, action, result)) = done {
                        self.on_decision(id, action, result).await;
                    }
                }
                s = child.wait(), if status.is_none() => {
                    let s = match s {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::error!(run_id = self.run_id, error = %e, "waiting for the agent failed");
                            std::os::unix::process::ExitStatusExt::from_raw(255 << 8)
                        }
                    };
                    status = Some(s);
                    drain_until = Some(Instant::now() + DRAIN);
                    if stop.is_some() {
                        // Whatever the group leader left behind goes too.
                        signal_group(pgid, "KILL").await;
                    }
                }
                () = cancel.cancelled(), if stop.is_none() && status.is_none() => {
                    stop = Some(Stop::Cancelled);
                    signal_group(pgid, "TERM").await;
                    kill_at = Some(Instant::now() + self.env.kill_grace);
                }
                () = tokio::time::sleep_until(deadline.unwrap_or_else(never)),
                    if deadline.is_some() && stop.is_none() && status.is_none() => {
                    stop = Some(Stop::TimedOut(timeout.unwrap_or_default()));
                    signal_group(pgid, "TERM").await;
                    kill_at = Some(Instant::now() + self.env.kill_grace);
                }
                () = tokio::time::sleep_until(kill_at.unwrap_or_else(never)),
                    if kill_at.is_some() && status.is_none() => {
                    tracing::info!(run_id = self.run_id, "agent ignored SIGTERM, sending SIGKILL");
                    signal_group(pgid, "KILL").await;
                    if let Err(e) = child.start_kill() {
                        tracing::debug!(run_id = self.run_id, error = %e, "kill failed");
                    }
                    kill_at = None;
                }
                () = tokio::time::sleep_until(drain_until.unwrap_or_else(never)),
                    if drain_until.is_some() => {
                    // Something the agent started still holds its output: it goes too.
                    tracing::info!(run_id = self.run_id, "agent's children outlived it, killing them");
                    signal_group(pgid, "KILL").await;
                    break;
                }
            }
        }
        self.flush_stderr_suppressed();
        match stop {
            Some(s) => s,
            None => Stop::Exited(
                status.unwrap_or_else(|| std::os::unix::process::ExitStatusExt::from_raw(255 << 8)),
            ),
        }
    }

    async fn on_stdout(&mut self, line: &str) {
        match parse_line(line) {
            LineItem::Blank => {}
            LineItem::Progress(text) => {
                self.keep_text(&text);
                self.last_line = Some(text.clone());
                self.event(progress(text));
            }
            LineItem::Event(ev) => {
                if let RunEvent::Progress(p) = &ev
                    && let Some(m) = &p.message
                {
                    self.last_line = Some(m.clone());
                }
                self.event(ev);
            }
            LineItem::Completion(c) => self.completion = Some(c),
            LineItem::Approval { action, risk_level } => {
                self.on_approval(action, risk_level).await;
            }
        }
    }

    fn keep_text(&mut self, line: &str) {
        if !self.text.is_empty() {
            self.text.push('\n');
        }
        self.text.push_str(line);
        if self.text.len() > MAX_SUMMARY_BYTES {
            let mut cut = self.text.len() - MAX_SUMMARY_BYTES;
            while !self.text.is_char_boundary(cut) {
                cut += 1;
            }
            self.text.drain(..cut);
        }
    }

    async fn on_approval(&mut self, action: String, risk_level: RiskLevel) {
        if !self.agent.risky.matches(&action) {
            self.write_stdin("approved local\n").await;
            return;
        }
        let approval_id = crate::ids::new_uuid();
        tracing::info!(run_id = self.run_id, approval_id, "asking for approval");
        let msg = HostMessage::ApprovalRequest(ApprovalRequest {
            run_id: self.run_id.clone(),
            action: action.clone(),
            risk_level,
            approval_id: Some(approval_id.clone()),
        });
        let outbox = self.env.outbox.clone();
        // A person decides: no deadline of our own (the run's timeout still applies).
        self.approvals
            .spawn(async move { (approval_id, action, outbox.request(msg, None).await) });
    }

    async fn on_decision(
        &mut self,
        approval_id: String,
        action: String,
        result: Result<Reply, RequestError>,
    ) {
        match result {
            Ok(Reply::Granted(g)) => {
                tracing::info!(
                    run_id = self.run_id,
                    approval_id,
                    by = g.approved_by,
                    "approval granted"
                );
                self.write_stdin(&format!("approved {approval_id}\n")).await;
            }
            Ok(Reply::Denied(d)) => {
                tracing::info!(run_id = self.run_id, approval_id, "approval denied");
                let by = d
                    .denied_by
                    .map(|b| format!(" by {b}"))
                    .unwrap_or_else(|| " (expired)".into());
                let reason = d.reason.map(|r| format!(": {r}")).unwrap_or_default();
                self.warning(format!("approval denied{by} for {action:?}{reason}"));
                self.write_stdin(&format!("denied {approval_id}\n")).await;
            }
            Ok(other) => {
                self.error(
                    format!("approval request for {action:?} got an unexpected answer: {other:?}"),
                    Some(HostErrorCode::ConnectorInternalError),
                );
                self.write_stdin(&format!("denied {approval_id}\n")).await;
            }
            Err(e) => {
                let code = match &e {
                    RequestError::Server(m) => Some(m.code),
                    _ => Some(HostErrorCode::ConnectorInternalError),
                };
                self.error(format!("approval request for {action:?} failed: {e}"), code);
                self.write_stdin(&format!("denied {approval_id}\n")).await;
            }
        }
    }

    fn on_stderr(&mut self, line: &str) {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            return;
        }
        let now = Instant::now();
        let b = &mut self.stderr;
        if b.window_start
            .is_none_or(|s| now.duration_since(s) >= Duration::from_secs(1))
        {
            b.window_start = Some(now);
            b.in_window = 0;
        }
        if b.sent >= MAX_STDERR_WARNINGS || b.in_window >= STDERR_PER_SECOND {
            b.suppressed += 1;
            return;
        }
        b.sent += 1;
        b.in_window += 1;
        let suppressed = std::mem::take(&mut b.suppressed);
        if suppressed > 0 {
            self.warning(format!("{suppressed} stderr lines suppressed"));
        }
        self.warning(format!("stderr: {}", clip(line, 2048)));
    }

    fn flush_stderr_suppressed(&mut self) {
        let n = std::mem::take(&mut self.stderr.suppressed);
        if n > 0 {
            self.warning(format!("{n} stderr lines suppressed"));
        }
    }

    /// Fetches the run's input artifacts into the inputs dir. A failure is reported and the
    /// run goes on without that file.
    async fn download_inputs(&self, create: &CreateRun, dir: &Path) {
        for id in &create.context_bundle.artifacts {
            let msg = HostMessage::DownloadArtifact(DownloadArtifact {
                artifact_id: id.clone(),
            });
            let url = match self
                .env
                .outbox
                .request(msg, Some(self.env.request_timeout))
                .await
            {
                Ok(Reply::Download(ack)) => ack.download_url,
                Ok(other) => {
                    self.error(
                        format!("download_artifact {id}: unexpected answer {other:?}"),
                        Some(HostErrorCode::ConnectorInternalError),
                    );
                    continue;
                }
                Err(e) => {
                    let code = match &e {
                        RequestError::Server(m) => Some(m.code),
                        _ => Some(HostErrorCode::ConnectorInternalError),
                    };
                    self.error(format!("download_artifact {id} failed: {e}"), code);
                    continue;
                }
            };
            let path = dir.join(dir_name(id));
            let mut tries = 0;
            loop {
                match self.env.transfers.get_to_file(&url, &path).await {
                    Ok(n) => {
                        tracing::info!(
                            run_id = self.run_id,
                            artifact_id = id,
                            bytes = n,
                            "input downloaded"
                        );
                        break;
                    }
                    Err(e) if tries < TRANSFER_RETRIES => {
                        tries += 1;
                        tracing::warn!(run_id = self.run_id, artifact_id = id, error = %e, "download failed, retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(e) => {
                        self.error(
                            format!("downloading input artifact {id} failed: {e}"),
                            Some(HostErrorCode::ConnectorInternalError),
                        );
                        break;
                    }
                }
            }
        }
    }

    /// Uploads every regular file under `dir`; returns the artifact ids of those uploaded.
    async fn upload_artifacts(&self, dir: &Path) -> Vec<String> {
        let files = list_files(dir);
        if files.len() > MAX_ARTIFACTS {
            self.warning(format!(
                "{} artifact files; only the first {MAX_ARTIFACTS} are uploaded",
                files.len()
            ));
        }
        let mut ids = Vec::new();
        for (name, path, size) in files.into_iter().take(MAX_ARTIFACTS) {
            let content_type = mime_guess::from_path(&path)
                .first_or_octet_stream()
                .essence_str()
                .to_owned();
            let msg = HostMessage::UploadArtifact(UploadArtifact {
                run_id: self.run_id.clone(),
                name: name.clone(),
                content_type: content_type.clone(),
                size_bytes: size,
            });
            let ack = match self
                .env
                .outbox
                .request(msg, Some(self.env.request_timeout))
                .await
            {
                Ok(Reply::Upload(ack)) => ack,
                Ok(other) => {
                    self.error(
                        format!("upload_artifact {name:?}: unexpected answer {other:?}"),
                        Some(HostErrorCode::ConnectorInternalError),
                    );
                    continue;
                }
                Err(e) => {
                    let code = match &e {
                        RequestError::Server(m) => Some(m.code),
                        _ => Some(HostErrorCode::ConnectorInternalError),
                    };
                    self.error(format!("upload_artifact {name:?} failed: {e}"), code);
                    continue;
                }
            };
            let mut tries = 0;
            loop {
                match self
                    .env
                    .transfers
                    .put_file(&ack.upload_url, &path, &content_type)
                    .await
                {
                    Ok(()) => {
                        tracing::info!(
                            run_id = self.run_id,
                            artifact_id = ack.artifact_id,
                            bytes = size,
                            "artifact uploaded"
                        );
                        ids.push(ack.artifact_id.clone());
                        break;
                    }
                    Err(e) if tries < TRANSFER_RETRIES => {
                        tries += 1;
                        tracing::warn!(run_id = self.run_id, name, error = %e, "upload failed, retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(e) => {
                        self.error(
                            format!("uploading artifact {name:?} failed: {e}"),
                            Some(HostErrorCode::ConnectorInternalError),
                        );
                        break;
                    }
                }
            }
        }
        ids
    }
}

/// Regular files under `dir` (symlinks are not followed), as (relative name, path, size),
/// sorted by name.
pub fn list_files(dir: &Path) -> Vec<(String, PathBuf, u64)> {
    fn walk(base: &Path, dir: &Path, depth: u32, out: &mut Vec<(String, PathBuf, u64)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.is_file() {
                let name = path
                    .strip_prefix(base)
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default();
                out.push((name, path, meta.len()));
            } else if meta.is_dir() && depth < 16 {
                walk(base, &path, depth + 1, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, 0, &mut out);
    out.sort();
    out
}

/// Reads lines of at most [`MAX_LINE_BYTES`] (the rest of a longer line is dropped).
/// Cancel-safe: what was read stays in the buffer when a `select!` drops the future.
struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    eof: bool,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    fn new(inner: R) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            eof: false,
        }
    }

    async fn next_line(&mut self) -> std::io::Result<Option<String>> {
        if self.eof {
            return Ok(None);
        }
        loop {
            let available = self.inner.fill_buf().await?;
            if available.is_empty() {
                self.eof = true;
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(self.take()));
            }
            let (chunk, used, done) = match available.iter().position(|&b| b == b'\n') {
                Some(i) => (&available[..i], i + 1, true),
                None => (available, available.len(), false),
            };
            let room = MAX_LINE_BYTES.saturating_sub(self.buf.len());
            self.buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
            self.inner.consume(used);
            if done {
                return Ok(Some(self.take()));
            }
        }
    }

    fn take(&mut self) -> String {
        let line = String::from_utf8_lossy(&self.buf).into_owned();
        self.buf.clear();
        line
    }
}

#[cfg(test)]
mod tests;
