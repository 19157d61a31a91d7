//! Dispatch: what the server owes a host (`create_run`, `cancel_run`, decisions) and the
//! seed's retry policy when a host answers with an error.

use switchyard_protocol::hosts::message::{
    ApprovalDenied, ApprovalGranted, CancelRun, ErrorMessage,
};
use switchyard_protocol::hosts::{
    HostErrorCode, HostLostPolicy, HostMessage, RetryStep, RunFact, RunState,
};

use crate::error::BackendError;
use crate::hoststore::ApprovalStatus;
use crate::ids::now_ms;

use super::{
    HostBell, HostSession, Hosts, LIVE, clip, create_run, error_msg, internal, ms, wire_approval_id,
};

impl Hosts {
    /// The host answered one of our messages with an error: the seed's retry policy.
    pub(super) async fn host_error(
        &self,
        session: &HostSession,
        e: ErrorMessage,
    ) -> Vec<HostMessage> {
        let Some(run_id) = e.run_id.clone() else {
            tracing::info!(code = e.code.code(), "host reported an error");
            return vec![];
        };
        let Ok(Some(run)) = self.hub.store.get_run(&run_id).await else {
            return vec![];
        };
        if run.host_id != session.host_id {
            return vec![error_msg(
                HostErrorCode::UnauthorizedAction,
                "the run belongs to another host",
                Some(&run_id),
            )];
        }
        metrics::counter!("switchyard_host_run_rejections_total", "code" => e.code.name())
            .increment(1);
        let message = clip(&e.message, 1024);
        let result = match e.code {
            // The host does not know the run: if we were cancelling it, it is gone; else
            // dispatch it again.
            HostErrorCode::RunNotFound if run.cancel_requested_at.is_some() => {
                self.apply(&run_id, RunFact::CancelConfirmed, |_| {}).await
            }
            HostErrorCode::RunNotFound => {
                if run.state == RunState::Dispatched {
                    self.apply(&run_id, RunFact::AcceptTimeout, |_| {}).await
                } else {
                    self.apply(&run_id, RunFact::HostLost(HostLostPolicy::Requeue), |_| {})
                        .await
                }
            }
            code if run.state == RunState::Dispatched => {
                let step = code.retry_policy().next_step(run.attempts);
                let busy_until = match step {
                    RetryStep::Requeue(after) => Some(now_ms() + ms(after)),
                    _ => None,
                };
                if step == RetryStep::StopAndNotifyOperator {
                    tracing::warn!(run_id, host_id = %run.host_id, code = code.code(), "run stopped: quota exceeded on the host; operator attention needed");
                    metrics::counter!("switchyard_host_operator_notices_total", "code" => code.name())
                        .increment(1);
                }
                let immediate = matches!(step, RetryStep::RetryAfter(_));
                self.apply(
                    &run_id,
                    RunFact::Rejected {
                        code,
                        retries_done: run.attempts,
                    },
                    |r| {
                        if immediate {
                            r.attempts += 1;
                        }
                        r.not_before = busy_until;
                        r.error_code = Some(code.name().to_owned());
                        r.error_message = Some(message.clone());
                    },
                )
                .await
            }
            code => {
                // An error about a run already accepted: 5001/5002 and others end it.
                self.apply(&run_id, RunFact::Failed, |r| {
                    r.error_code = Some(code.name().to_owned());
                    r.error_message = Some(message.clone());
                })
                .await
            }
        };
        if let Err(err) = result {
            return vec![internal(err, Some(&run_id))];
        }
        self.ring_host(&session.host_id, HostBell::Work).await;
        vec![]
    }

    /// What the server must (re)send to the host now: `create_run` for queued runs and
    /// runs whose acceptance timed out (same `run_id`), every held run again after a
    /// reconnect, `cancel_run` until confirmed, and decided approvals.
    pub async fn outgoing(
        &self,
        session: &mut HostSession,
    ) -> Result<Vec<HostMessage>, BackendError> {
        if !session.registered {
            return Ok(vec![]);
        }
        let now = now_ms();
        let resend_all = std::mem::take(&mut session.resend_all);
        let t = &self.config.timeouts;
        let mut out = Vec::new();
        for run in self.hub.store.host_runs(&session.host_id, &LIVE).await? {
            if run.cancel_requested_at.is_some() && run.state.is_on_host() {
                let due = resend_all
                    || run
                        .cancel_sent_at
                        .is_none_or(|at| at + ms(t.cancel_confirm) <= now);
                if run
                    .cancel_sent_at
                    .is_some_and(|at| at + ms(t.cancel_confirm) <= now)
                {
                    // Not confirmed in time: the run counts as cancelled.
                    self.apply(&run.id, RunFact::CancelTimeout, |r| {
                        r.error_code = Some("cancel_timeout".into());
                        r.error_message = Some("the host did not confirm the cancel".into());
                    })
                    .await?;
                    continue;
                }
                if due && self.touch(&run, |r| r.cancel_sent_at = Some(now)).await? {
                    out.push(HostMessage::CancelRun(CancelRun {
                        run_id: run.id.clone(),
                    }));
                }
                continue;
            }
            match run.state {
                RunState::Queued if run.not_before.is_none_or(|t| t <= now) => {
                    let moved = self
                        .apply(&run.id, RunFact::Dispatched, |r| {
                            r.dispatched_at = Some(now)
                        })
                        .await?;
                    if moved.is_some() {
                        out.push(create_run(&run));
                    }
                }
                RunState::Dispatched => {
                    let timed_out = run
                        .dispatched_at
                        .is_none_or(|at| at + ms(t.create_run_accept) <= now);
                    if timed_out {
                        metrics::counter!("switchyard_host_accept_timeouts_total").increment(1);
                        tracing::info!(run_id = %run.id, "no run_accepted in time; dispatching again");
                        self.apply(&run.id, RunFact::AcceptTimeout, |_| {}).await?;
                        if self
                            .apply(&run.id, RunFact::Dispatched, |r| {
                                r.dispatched_at = Some(now)
                            })
                            .await?
                            .is_some()
                        {
                            out.push(create_run(&run));
                        }
                    } else if resend_all
                        && self.touch(&run, |r| r.dispatched_at = Some(now)).await?
                    {
                        out.push(create_run(&run));
                    }
                }
                RunState::Accepted | RunState::Running | RunState::AwaitingApproval
                    if resend_all =>
                {
                    out.push(create_run(&run));
                }
                _ => {}
            }
        }
        for a in self
            .hub
            .store
            .undelivered_decisions(&session.host_id)
            .await?
        {
            out.push(match a.status {
                ApprovalStatus::Granted => HostMessage::ApprovalGranted(ApprovalGranted {
                    approval_id: wire_approval_id(&a),
                    approved_by: a.decided_by.clone().unwrap_or_default(),
                    run_id: Some(a.run_id.clone()),
                }),
                _ => HostMessage::ApprovalDenied(ApprovalDenied {
                    approval_id: wire_approval_id(&a),
                    code: HostErrorCode::ApprovalDenied,
                    denied_by: a.decided_by.clone(),
                    run_id: Some(a.run_id.clone()),
                    reason: a.reason.clone().or_else(|| {
                        (a.status == ApprovalStatus::Expired)
                            .then(|| "nobody decided in time".to_owned())
                    }),
                }),
            });
        }
        Ok(out)
    }
}
