//! The run state machine of issue 5 point 4, driven by protocol facts.
//!
//! [`transition`] is the one place that decides which fact moves a run where; the gateway
//! stores the result and never reasons about states itself. Terminal states accept nothing.

use serde::{Deserialize, Serialize};

use super::error::{HostErrorCode, RetryStep};
use super::message::RunEvent;

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Waiting for a host (new, re-queued, or backing off after 4005).
    Queued,
    /// `create_run` sent; no `run_accepted` yet.
    Dispatched,
    /// `run_accepted` received; no event yet.
    Accepted,
    /// The host reported activity.
    Running,
    /// An `approval_request` is pending a person's decision.
    AwaitingApproval,
    Completed,
    Failed,
    Cancelled,
}

impl RunState {
    pub const ALL: [Self; 8] = [
        Self::Queued,
        Self::Dispatched,
        Self::Accepted,
        Self::Running,
        Self::AwaitingApproval,
        Self::Completed,
        Self::Failed,
        Self::Cancelled,
    ];

    /// Stable snake_case name (the wire and store form).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Dispatched => "dispatched",
            Self::Accepted => "accepted",
            Self::Running => "running",
            Self::AwaitingApproval => "awaiting_approval",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// True while a host holds the run (it must be re-queued or failed if the host is lost).
    pub fn is_on_host(self) -> bool {
        matches!(
            self,
            Self::Dispatched | Self::Accepted | Self::Running | Self::AwaitingApproval
        )
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happens to the runs of a host that stopped sending heartbeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostLostPolicy {
    /// Put them back in the queue; re-dispatch carries the same `run_id`.
    Requeue,
    /// Fail them.
    Fail,
}

/// A protocol fact about one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunFact {
    /// `create_run` was sent to a host.
    Dispatched,
    /// `run_accepted` arrived.
    Accepted,
    /// No `run_accepted` within `Timeouts::create_run_accept`: re-queue.
    AcceptTimeout,
    /// The host answered `create_run` with an `error`; `retries_done` counts earlier
    /// immediate retries of this run. The code's retry policy decides.
    Rejected {
        code: HostErrorCode,
        retries_done: u32,
    },
    /// A non-final `run_event`: thinking, tool_call, tool_result, progress, warning, or an
    /// error that is not fatal.
    Progress,
    /// `approval_request` arrived.
    ApprovalRequested,
    /// A person granted the pending approval.
    ApprovalGranted,
    /// A person denied the pending approval (the host is told with code 4008).
    ApprovalDenied,
    /// Nobody decided in time; treated like a denial towards the host.
    ApprovalExpired,
    /// `run_event` `completion`.
    Completed,
    /// A fatal `run_event` `error`, or the server giving up on the run.
    Failed,
    /// Someone asked to cancel; a run on a host waits for `run_cancelled`.
    CancelRequested,
    /// `run_cancelled` arrived.
    CancelConfirmed,
    /// No `run_cancelled` within `Timeouts::cancel_confirm`: the run counts as cancelled.
    CancelTimeout,
    /// The host holding the run was declared lost.
    HostLost(HostLostPolicy),
}

impl RunFact {
    /// The fact a received `run_event` stands for.
    pub fn from_run_event(event: &RunEvent) -> Self {
        match event {
            RunEvent::Completion(_) => Self::Completed,
            RunEvent::Error(e) if e.fatal => Self::Failed,
            RunEvent::Thinking(_)
            | RunEvent::ToolCall(_)
            | RunEvent::ToolResult(_)
            | RunEvent::Progress(_)
            | RunEvent::Warning(_)
            | RunEvent::Error(_) => Self::Progress,
        }
    }
}

/// A fact that does not apply to a run in its current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("run in state {from} cannot take {fact:?}")]
pub struct InvalidTransition {
    pub from: RunState,
    pub fact: RunFact,
}

/// The state a run in `from` moves to on `fact`.
pub fn transition(from: RunState, fact: RunFact) -> Result<RunState, InvalidTransition> {
    use RunFact as F;
    use RunState as S;
    let to = match (from, fact) {
        (s, _) if s.is_terminal() => None,
        (S::Queued, F::Dispatched) => Some(S::Dispatched),
        (S::Dispatched, F::Accepted) => Some(S::Accepted),
        (S::Dispatched, F::AcceptTimeout) => Some(S::Queued),
        (S::Dispatched, F::Rejected { code, retries_done }) => {
            Some(match code.retry_policy().next_step(retries_done) {
                RetryStep::RetryAfter(_) | RetryStep::Requeue(_) => S::Queued,
                RetryStep::StopAndNotifyOperator | RetryStep::Fail => S::Failed,
            })
        }
        // An event before `run_accepted` proves the host took the run: this happens when a
        // run is re-dispatched to a host that was already executing it.
        (S::Dispatched | S::Accepted | S::Running, F::Progress) => Some(S::Running),
        (S::AwaitingApproval, F::Progress) => Some(S::AwaitingApproval),
        // One pending approval per run: an agent waits for the answer before going on.
        (S::Accepted | S::Running, F::ApprovalRequested) => Some(S::AwaitingApproval),
        (S::AwaitingApproval, F::ApprovalGranted | F::ApprovalDenied | F::ApprovalExpired) => {
            Some(S::Running)
        }
        // The host is the authority on how its run ends, even with an approval pending.
        (s, F::Completed) if s.is_on_host() => Some(S::Completed),
        (_, F::Failed) => Some(S::Failed),
        // Nothing holds a queued run, so cancelling it needs no confirmation.
        (S::Queued, F::CancelRequested) => Some(S::Cancelled),
        (s, F::CancelRequested) => Some(s),
        (s, F::CancelConfirmed | F::CancelTimeout) if s.is_on_host() => Some(S::Cancelled),
        (s, F::HostLost(policy)) if s.is_on_host() => Some(match policy {
            HostLostPolicy::Requeue => S::Queued,
            HostLostPolicy::Fail => S::Failed,
        }),
        _ => None,
    };
    to.ok_or(InvalidTransition { from, fact })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hosts::message::{CompletionPayload, ErrorEventPayload, WarningPayload};
    use HostErrorCode as C;
    use RunFact as F;
    use RunState as S;

    fn rejected(code: HostErrorCode, retries_done: u32) -> RunFact {
        F::Rejected { code, retries_done }
    }

    /// Every fact, with each parameter value that matters.
    fn all_facts() -> Vec<RunFact> {
        vec![
            F::Dispatched,
            F::Accepted,
            F::AcceptTimeout,
            rejected(C::AgentBusy, 0),
            rejected(C::ConnectorInternalError, 0),
            rejected(C::AdapterError, 2),
            rejected(C::AdapterError, 3),
            rejected(C::QuotaExceeded, 0),
            rejected(C::AgentNotFound, 0),
            rejected(C::InvalidRequestFormat, 0),
            F::Progress,
            F::ApprovalRequested,
            F::ApprovalGranted,
            F::ApprovalDenied,
            F::ApprovalExpired,
            F::Completed,
            F::Failed,
            F::CancelRequested,
            F::CancelConfirmed,
            F::CancelTimeout,
            F::HostLost(HostLostPolicy::Requeue),
            F::HostLost(HostLostPolicy::Fail),
        ]
    }

    /// The complete table of allowed transitions; every pair not listed must be rejected.
    fn allowed() -> Vec<(RunState, RunFact, RunState)> {
        let mut t = vec![
            (S::Queued, F::Dispatched, S::Dispatched),
            (S::Queued, F::Failed, S::Failed),
            (S::Queued, F::CancelRequested, S::Cancelled),
            (S::Dispatched, F::Accepted, S::Accepted),
            (S::Dispatched, F::AcceptTimeout, S::Queued),
            (S::Dispatched, rejected(C::AgentBusy, 0), S::Queued),
            (
                S::Dispatched,
                rejected(C::ConnectorInternalError, 0),
                S::Queued,
            ),
            (S::Dispatched, rejected(C::AdapterError, 2), S::Queued),
            (S::Dispatched, rejected(C::AdapterError, 3), S::Failed),
            (S::Dispatched, rejected(C::QuotaExceeded, 0), S::Failed),
            (S::Dispatched, rejected(C::AgentNotFound, 0), S::Failed),
            (
                S::Dispatched,
                rejected(C::InvalidRequestFormat, 0),
                S::Failed,
            ),
            (S::Dispatched, F::Progress, S::Running),
            (S::Accepted, F::Progress, S::Running),
            (S::Running, F::Progress, S::Running),
            (S::AwaitingApproval, F::Progress, S::AwaitingApproval),
            (S::Accepted, F::ApprovalRequested, S::AwaitingApproval),
            (S::Running, F::ApprovalRequested, S::AwaitingApproval),
            (S::AwaitingApproval, F::ApprovalGranted, S::Running),
            (S::AwaitingApproval, F::ApprovalDenied, S::Running),
            (S::AwaitingApproval, F::ApprovalExpired, S::Running),
        ];
        for s in [S::Dispatched, S::Accepted, S::Running, S::AwaitingApproval] {
            t.extend([
                (s, F::Completed, S::Completed),
                (s, F::Failed, S::Failed),
                (s, F::CancelRequested, s),
                (s, F::CancelConfirmed, S::Cancelled),
                (s, F::CancelTimeout, S::Cancelled),
                (s, F::HostLost(HostLostPolicy::Requeue), S::Queued),
                (s, F::HostLost(HostLostPolicy::Fail), S::Failed),
            ]);
        }
        t
    }

    #[test]
    fn exhaustive_table() {
        let allowed = allowed();
        let facts = all_facts();
        for &(from, fact, _) in &allowed {
            assert!(facts.contains(&fact), "{fact:?} missing from all_facts");
            assert!(!from.is_terminal());
        }
        let mut checked = 0;
        for from in RunState::ALL {
            for &fact in &facts {
                let want = allowed
                    .iter()
                    .find(|(f, x, _)| *f == from && *x == fact)
                    .map(|(_, _, to)| *to);
                let got = transition(from, fact);
                match want {
                    Some(to) => assert_eq!(got, Ok(to), "{from} + {fact:?}"),
                    None => assert_eq!(
                        got,
                        Err(InvalidTransition { from, fact }),
                        "{from} + {fact:?} must be rejected"
                    ),
                }
                checked += 1;
            }
        }
        assert_eq!(checked, 8 * facts.len());
    }

    #[test]
    fn terminal_states_accept_nothing() {
        for s in [S::Completed, S::Failed, S::Cancelled] {
            assert!(s.is_terminal());
            for f in all_facts() {
                assert!(transition(s, f).is_err(), "{s} + {f:?}");
            }
        }
    }

    #[test]
    fn a_typical_life() {
        let facts = [
            F::Dispatched,
            F::AcceptTimeout,
            F::Dispatched,
            rejected(C::AgentBusy, 0),
            F::Dispatched,
            F::Accepted,
            F::Progress,
            F::ApprovalRequested,
            F::ApprovalGranted,
            F::Progress,
            F::Completed,
        ];
        let mut s = S::Queued;
        for f in facts {
            s = transition(s, f).unwrap();
        }
        assert_eq!(s, S::Completed);
    }

    #[test]
    fn names_and_wire_form() {
        let names = [
            "queued",
            "dispatched",
            "accepted",
            "running",
            "awaiting_approval",
            "completed",
            "failed",
            "cancelled",
        ];
        for (s, n) in RunState::ALL.into_iter().zip(names) {
            assert_eq!(s.as_str(), n);
            assert_eq!(RunState::parse(n), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), n);
        }
        assert_eq!(RunState::parse("done"), None);
        let e = transition(S::Completed, F::Progress).unwrap_err();
        assert_eq!(e.to_string(), "run in state completed cannot take Progress");
    }

    #[test]
    fn facts_from_run_events() {
        let err = |fatal| {
            RunEvent::Error(ErrorEventPayload {
                message: "boom".into(),
                code: None,
                fatal,
            })
        };
        assert_eq!(RunFact::from_run_event(&err(true)), F::Failed);
        assert_eq!(RunFact::from_run_event(&err(false)), F::Progress);
        let done = RunEvent::Completion(CompletionPayload::default());
        assert_eq!(RunFact::from_run_event(&done), F::Completed);
        let warn = RunEvent::Warning(WarningPayload {
            message: "slow".into(),
        });
        assert_eq!(RunFact::from_run_event(&warn), F::Progress);
    }
}
