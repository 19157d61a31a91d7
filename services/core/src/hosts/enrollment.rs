//! Enrollment and identity: a host is created with a one-time token, redeemed once for a
//! certificate, and revoked by an operator.

use serde_json::json;
use switchyard_protocol::hosts::RunFact;

use crate::error::ErrorKind;
use crate::hoststore::{EnrollmentRecord, HostRecord, HostStatus};
use crate::ids::{new_id, now_ms};

use super::{
    AgentHostRefusal, AgentHostRefusalCode, Enrollment, HostBell, Hosts, LIVE, ms, pairing_code,
    random_token, token_hash,
};

impl Hosts {
    /// Creates a host in `enrolling` state and its one-time token.
    pub async fn enroll(
        &self,
        tenant_id: &str,
        name: &str,
    ) -> Result<Enrollment, AgentHostRefusal> {
        let name = name.trim();
        if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
            return Err(AgentHostRefusal::new(
                AgentHostRefusalCode::InvalidArguments,
                "a host name is 1-128 printable characters",
            ));
        }
        if self.hub.store.get_tenant(tenant_id).await?.is_none() {
            return Err(AgentHostRefusal::new(
                AgentHostRefusalCode::TenantNotFound,
                "no such tenant",
            ));
        }
        let now = now_ms();
        let host = HostRecord {
            id: new_id("hst"),
            tenant_id: tenant_id.to_owned(),
            name: name.to_owned(),
            status: HostStatus::Enrolling,
            cert_fingerprint: None,
            cert_pem: None,
            pairing_code: pairing_code(),
            hostname: None,
            agent_version: None,
            adapters: vec![],
            pod_id: None,
            session_id: None,
            connected_at: None,
            last_seen_at: None,
            metrics: json!({}),
            config: json!({}),
            created_at: now,
            revoked_at: None,
        };
        let token = random_token();
        let expires_at = now + ms(self.config.enrollment_ttl);
        let rec = EnrollmentRecord {
            token_hash: token_hash(&token),
            host_id: host.id.clone(),
            tenant_id: tenant_id.to_owned(),
            created_at: now,
            expires_at,
            used_at: None,
        };
        match self.hub.store.insert_enrollment(&host, &rec).await {
            Ok(()) => Ok(Enrollment {
                host,
                token,
                expires_at,
            }),
            Err(e) if e.kind == ErrorKind::Conflict => Err(AgentHostRefusal::new(
                AgentHostRefusalCode::HostExists,
                "the tenant already has a host of that name",
            )),
            Err(e) => Err(e.into()),
        }
    }

    /// Consumes a token; None when unknown, used or expired.
    pub async fn redeem(&self, token: &str) -> Result<Option<HostRecord>, AgentHostRefusal> {
        let Some(rec) = self
            .hub
            .store
            .consume_enrollment(&token_hash(token), now_ms())
            .await?
        else {
            return Ok(None);
        };
        let host = self.hub.store.get_host(&rec.host_id).await?;
        Ok(host.filter(|h| h.status != HostStatus::Revoked))
    }

    /// Revokes a host: its connections close, its runs fail, its channel shows `revoked`.
    pub async fn revoke(&self, host_id: &str) -> Result<HostRecord, AgentHostRefusal> {
        let host = match self.hub.store.revoke_host(host_id, now_ms()).await {
            Ok(h) => h,
            Err(e) if e.kind == ErrorKind::NotFound => {
                return Err(AgentHostRefusal::new(
                    AgentHostRefusalCode::HostNotFound,
                    "no such host",
                ));
            }
            Err(e) => return Err(e.into()),
        };
        self.ring_host(host_id, HostBell::Revoked).await;
        for run in self.hub.store.host_runs(host_id, &LIVE).await? {
            let _ = self
                .apply(&run.id, RunFact::Failed, |r| {
                    r.error_code = Some("host_revoked".into());
                    r.error_message = Some("the host was revoked by an operator".into());
                })
                .await;
        }
        self.status_changed(&host).await;
        tracing::info!(host_id, "host revoked");
        Ok(host)
    }
}
