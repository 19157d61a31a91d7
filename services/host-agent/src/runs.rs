//! The runs this host holds: `create_run` and `cancel_run`, exactly once.
//!
//! A run is known by its `run_id` for the life of the process (finished ones for a day), so
//! a re-sent `create_run` never starts a second process: a running run is answered with
//! `run_accepted` (`running`) again, a finished one with its terminal event again (or
//! `run_cancelled`). Runs are not queued on the host: an agent at `max_concurrent_runs`
//! answers 4005 and the server retries later.

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use switchyard_protocol::hosts::HostErrorCode;
use switchyard_protocol::hosts::HostMessage;
use switchyard_protocol::hosts::message::{
    AcceptedStatus, CreateRun, ErrorMessage, RunAccepted, RunCancelled, RunEventMessage,
};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::AgentConfig;
use crate::outbox::Outbox;
use crate::process::{Outcome, RunEnv, execute};

/// Finished runs are remembered this long for de-duplication.
const REMEMBER_FINISHED: Duration = Duration::from_secs(24 * 3600);
/// And at most this many of them.
const MAX_FINISHED: usize = 10_000;

/// How a finished run is reported again.
#[derive(Debug, Clone, PartialEq)]
pub enum Terminal {
    Event(RunEventMessage),
    Cancelled,
}

enum State {
    Running(CancellationToken),
    Finished(Terminal, Instant),
}

struct Record {
    agent_id: String,
    state: State,
}

pub struct RunManager {
    agents: HashMap<String, Arc<AgentConfig>>,
    runs: Mutex<HashMap<String, Record>>,
    env: Arc<RunEnv>,
    /// Overrides `PATH` when looking up adapter binaries (tests).
    search_path: Option<OsString>,
    /// Parent of every run's cancel token: host shutdown stops them all.
    stopping: CancellationToken,
    tasks: TaskTracker,
}

fn error(code: HostErrorCode, message: String, run_id: &str) -> HostMessage {
    HostMessage::Error(ErrorMessage {
        code,
        message,
        run_id: Some(run_id.to_owned()),
    })
}

impl RunManager {
    pub fn new(
        agents: &[AgentConfig],
        env: Arc<RunEnv>,
        search_path: Option<OsString>,
    ) -> Arc<Self> {
        Arc::new(Self {
            agents: agents
                .iter()
                .map(|a| (a.agent_id.clone(), Arc::new(a.clone())))
                .collect(),
            runs: Mutex::new(HashMap::new()),
            env,
            search_path,
            stopping: CancellationToken::new(),
            tasks: TaskTracker::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Record>> {
        self.runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn outbox(&self) -> &Outbox {
        &self.env.outbox
    }

    /// Handles `create_run`; returns the immediate answers.
    pub fn create_run(self: &Arc<Self>, c: CreateRun) -> Vec<HostMessage> {
        let mut runs = self.lock();
        if let Some(rec) = runs.get(&c.run_id) {
            tracing::info!(run_id = c.run_id, "create_run repeated");
            return vec![match &rec.state {
                State::Running(_) => HostMessage::RunAccepted(RunAccepted {
                    run_id: c.run_id,
                    status: AcceptedStatus::Running,
                }),
                State::Finished(Terminal::Event(m), _) => HostMessage::RunEvent(m.clone()),
                State::Finished(Terminal::Cancelled, _) => {
                    HostMessage::RunCancelled(RunCancelled { run_id: c.run_id })
                }
            }];
        }
        // A run an earlier process of this host started (its directory exists) is never
        // started again: that process is gone with its work, so the run ends as failed. The
        // event carries no seq: the server's replay filter must not drop it.
        if crate::process::RunDirs::new(&self.env.state_dir, &c.run_id)
            .root
            .exists()
        {
            tracing::warn!(
                run_id = c.run_id,
                "create_run for a run an earlier process started; not starting it again"
            );
            // Its agent processes may have outlived that process: stop them.
            let (dir, id, grace) = (
                self.env.state_dir.clone(),
                c.run_id.clone(),
                self.env.kill_grace,
            );
            self.tasks.spawn(async move {
                crate::process::stop_leftover(&dir, &id, grace).await;
            });
            return vec![HostMessage::RunEvent(RunEventMessage {
                run_id: c.run_id,
                timestamp: crate::ids::now_rfc3339(),
                seq: None,
                event: switchyard_protocol::hosts::message::RunEvent::Error(
                    switchyard_protocol::hosts::message::ErrorEventPayload {
                        message: "the host agent restarted while this run was running; it is not started twice".into(),
                        code: Some(HostErrorCode::AdapterError),
                        fatal: true,
                    },
                ),
            })];
        }
        let Some(agent) = self.agents.get(&c.agent_id).cloned() else {
            tracing::warn!(
                run_id = c.run_id,
                agent_id = c.agent_id,
                "create_run for an unknown agent"
            );
            return vec![error(
                HostErrorCode::AgentNotFound,
                format!("agent {:?} is not on this host", c.agent_id),
                &c.run_id,
            )];
        };
        let active = runs
            .values()
            .filter(|r| r.agent_id == c.agent_id && matches!(r.state, State::Running(_)))
            .count();
        if active >= agent.max_concurrent_runs as usize {
            tracing::info!(
                run_id = c.run_id,
                agent_id = c.agent_id,
                active,
                "agent busy"
            );
            return vec![error(
                HostErrorCode::AgentBusy,
                format!(
                    "agent busy: {active} of {} runs active",
                    agent.max_concurrent_runs
                ),
                &c.run_id,
            )];
        }
        let launch = match crate::adapter::launch(&agent, &c, self.search_path.as_deref()) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(run_id = c.run_id, runtime = %agent.runtime, error = %e, "cannot start run");
                return vec![error(HostErrorCode::AdapterError, e.to_string(), &c.run_id)];
            }
        };
        let cancel = self.stopping.child_token();
        runs.insert(
            c.run_id.clone(),
            Record {
                agent_id: c.agent_id.clone(),
                state: State::Running(cancel.clone()),
            },
        );
        drop(runs);
        let run_id = c.run_id.clone();
        let this = self.clone();
        let env = self.env.clone();
        let task_run_id = run_id.clone();
        self.tasks.spawn(async move {
            let outcome = execute(env, agent, c, launch, cancel).await;
            this.finish(&task_run_id, outcome);
        });
        vec![HostMessage::RunAccepted(RunAccepted {
            run_id,
            status: AcceptedStatus::Running,
        })]
    }

    fn finish(&self, run_id: &str, outcome: Outcome) {
        let terminal = match outcome {
            Outcome::Finished(event) => Terminal::Event(self.outbox().event(run_id, event)),
            Outcome::Cancelled => {
                self.outbox().events.close(run_id);
                if !self.stopping.is_cancelled() {
                    self.outbox().send(HostMessage::RunCancelled(RunCancelled {
                        run_id: run_id.to_owned(),
                    }));
                }
                Terminal::Cancelled
            }
        };
        let now = Instant::now();
        let mut runs = self.lock();
        if let Some(rec) = runs.get_mut(run_id) {
            rec.state = State::Finished(terminal, now);
        }
        runs.retain(|_, r| match r.state {
            State::Finished(_, at) => now.duration_since(at) < REMEMBER_FINISHED,
            State::Running(_) => true,
        });
        let finished = runs
            .values()
            .filter(|r| matches!(r.state, State::Finished(..)))
            .count();
        if finished > MAX_FINISHED {
            let mut by_age: Vec<(Instant, String)> = runs
                .iter()
                .filter_map(|(id, r)| match r.state {
                    State::Finished(_, at) => Some((at, id.clone())),
                    State::Running(_) => None,
                })
                .collect();
            by_age.sort();
            for (_, id) in by_age.into_iter().take(finished - MAX_FINISHED) {
                runs.remove(&id);
            }
        }
    }

    /// Handles `cancel_run`; returns the immediate answers (a running run is answered with
    /// `run_cancelled` once its process is gone).
    pub fn cancel_run(&self, run_id: &str) -> Vec<HostMessage> {
        match self.lock().get(run_id).map(|r| &r.state) {
            None => vec![error(
                HostErrorCode::RunNotFound,
                format!("run {run_id:?} is not on this host"),
                run_id,
            )],
            Some(State::Running(cancel)) => {
                tracing::info!(run_id, "cancelling run");
                cancel.cancel();
                Vec::new()
            }
            Some(State::Finished(..)) => vec![HostMessage::RunCancelled(RunCancelled {
                run_id: run_id.to_owned(),
            })],
        }
    }

    /// Runs with a live process.
    pub fn active_runs(&self) -> u32 {
        self.lock()
            .values()
            .filter(|r| matches!(r.state, State::Running(_)))
            .count() as u32
    }

    /// The terminal state of a finished run, `None` while it runs or when unknown.
    pub fn terminal(&self, run_id: &str) -> Option<Terminal> {
        match self.lock().get(run_id).map(|r| &r.state) {
            Some(State::Finished(t, _)) => Some(t.clone()),
            _ => None,
        }
    }

    /// Stops every run (SIGTERM, then SIGKILL after the grace period) and waits for them,
    /// at most `within`. Nothing is reported: the server re-dispatches the runs of a host
    /// that went away.
    pub async fn shutdown(&self, within: Duration) {
        self.stopping.cancel();
        self.tasks.close();
        if tokio::time::timeout(within, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("runs still stopping at exit");
        }
    }
}
