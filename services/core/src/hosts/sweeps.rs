//! Sweeps (janitor): silent hosts become lost, approvals expire, old runs are purged.

use switchyard_protocol::hosts::{HostLostPolicy, RunFact};

use crate::error::BackendError;
use crate::ids::now_ms;

use super::{HostBell, Hosts, ON_HOST, ms};

impl Hosts {
    /// Marks silent hosts lost (their runs follow the lost policy), expires approvals and
    /// purges old finished runs. Returns the artifact object keys to delete.
    pub async fn sweep(&self) -> Result<SweepReport, BackendError> {
        let now = now_ms();
        let mut report = SweepReport::default();
        let stale_before = now - ms(self.config.timeouts.host_lost_after);
        for host in self.hub.store.mark_hosts_lost(stale_before, now).await? {
            report.hosts_lost += 1;
            tracing::warn!(host_id = %host.id, "host lost: no heartbeat in time");
            // The channel first: once its runs move, the Descriptor already says offline.
            self.status_changed(&host).await;
            let policy = self.config.lost_policy;
            for run in self.hub.store.host_runs(&host.id, &ON_HOST).await? {
                self.apply(&run.id, RunFact::HostLost(policy), |r| {
                    if policy == HostLostPolicy::Fail {
                        r.error_code = Some("host_lost".into());
                        r.error_message = Some("the host stopped sending heartbeats".into());
                    }
                    r.dispatched_at = None;
                })
                .await?;
                report.runs_requeued_or_failed += 1;
            }
        }
        for a in self.hub.store.expire_approvals(now).await? {
            report.approvals_expired += 1;
            self.apply(&a.run_id, RunFact::ApprovalExpired, |_| {})
                .await?;
            self.ring_host(&a.host_id, HostBell::Work).await;
        }
        let purge = self
            .hub
            .store
            .purge_runs(now - ms(self.config.run_retention))
            .await?;
        report.runs_purged = purge.runs;
        for key in purge.object_keys {
            let _ = self.hub.files.delete(&key).await;
        }
        Ok(report)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub hosts_lost: u64,
    pub runs_requeued_or_failed: u64,
    pub approvals_expired: u64,
    pub runs_purged: u64,
}
