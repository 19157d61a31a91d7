//! Artifacts: upload and download URLs handed to hosts, and noticing bytes that went
//! straight to object storage.

use switchyard_protocol::hosts::message::{DownloadArtifactAck, UploadArtifactAck};
use switchyard_protocol::hosts::{HostErrorCode, HostMessage, format_rfc3339};

use crate::error::BackendError;
use crate::hoststore::{ArtifactRecord, RunRecord};
use crate::ids::{new_id, now_ms};

use super::{ArtifactUrls, HostSession, Hosts, clip, error_msg, internal, ms};

impl Hosts {
    /// An artifact whose bytes are stored. Bytes PUT straight to object storage through a
    /// presigned URL are noticed here (the store learns the size on first use); an object
    /// larger than the limit or than the size its upload declared (what the tenant's stored
    /// bytes quota reserved) is deleted and counts as absent.
    pub async fn uploaded_artifact(
        &self,
        id: &str,
    ) -> Result<Option<ArtifactRecord>, BackendError> {
        let Some(mut art) = self.hub.store.get_artifact(id).await? else {
            return Ok(None);
        };
        if art.uploaded_at.is_some() {
            return Ok(Some(art));
        }
        let Some(size) = self.hub.files.stat(&art.object_key).await? else {
            return Ok(None);
        };
        if size > self.config.max_artifact_bytes || size > art.size_bytes.max(0) as u64 {
            tracing::warn!(
                artifact_id = id,
                size,
                "artifact over the size limit; deleted"
            );
            self.hub.files.delete(&art.object_key).await?;
            return Ok(None);
        }
        let now = now_ms();
        self.hub
            .store
            .artifact_uploaded(id, size as i64, now)
            .await?;
        art.size_bytes = size as i64;
        art.uploaded_at = Some(now);
        Ok(Some(art))
    }

    pub(super) async fn upload_artifact(
        &self,
        run: RunRecord,
        m: switchyard_protocol::hosts::message::UploadArtifact,
        urls: &dyn ArtifactUrls,
    ) -> Result<Vec<HostMessage>, BackendError> {
        if m.size_bytes > self.config.max_artifact_bytes {
            return Ok(vec![error_msg(
                HostErrorCode::QuotaExceeded,
                format!(
                    "artifacts are limited to {} bytes",
                    self.config.max_artifact_bytes
                ),
                Some(&run.id),
            )]);
        }
        let now = now_ms();
        let id = new_id("art");
        let name = crate::engine::clean_filename(&m.name);
        let rec = ArtifactRecord {
            id: id.clone(),
            run_id: run.id.clone(),
            tenant_id: run.tenant_id.clone(),
            host_id: run.host_id.clone(),
            name: name.clone(),
            content_type: clip(&m.content_type, 128),
            size_bytes: m.size_bytes as i64,
            object_key: format!("artifacts/{}/{id}", run.tenant_id),
            uploaded_at: None,
            created_at: now,
        };
        let max = self.hub.quotas.effective(&run.tenant_id).stored_bytes;
        match self.hub.store.insert_artifact_within(&rec, max).await {
            Ok(()) => {}
            Err(e) if e.is(crate::error::ErrorKind::LimitExceeded) => {
                let f = crate::quota::reached("stored_bytes", max, "wait for files to expire");
                return Ok(vec![error_msg(
                    HostErrorCode::QuotaExceeded,
                    f.message,
                    Some(&run.id),
                )]);
            }
            Err(e) => return Err(e),
        }
        let ttl = self.config.timeouts.upload_url_ttl;
        let url = urls.upload_url(&rec, ttl).await?;
        Ok(vec![HostMessage::UploadArtifactAck(UploadArtifactAck {
            upload_url: url,
            artifact_id: id,
            run_id: Some(run.id),
            name: Some(name),
            expires_at: Some(format_rfc3339(now + ms(ttl))),
        })])
    }

    pub(super) async fn download_artifact(
        &self,
        session: &HostSession,
        artifact_id: &str,
        urls: &dyn ArtifactUrls,
    ) -> Vec<HostMessage> {
        let art = match self.uploaded_artifact(artifact_id).await {
            Ok(Some(a)) if a.tenant_id == session.tenant_id => a,
            Ok(_) => {
                return vec![error_msg(
                    HostErrorCode::RunNotFound,
                    "no such artifact",
                    None,
                )];
            }
            Err(e) => return vec![internal(e, None)],
        };
        let ttl = self.config.timeouts.download_url_ttl;
        match urls.download_url(&art, ttl).await {
            Ok(url) => vec![HostMessage::DownloadArtifactAck(DownloadArtifactAck {
                download_url: url,
                artifact_id: Some(art.id),
                expires_at: Some(format_rfc3339(now_ms() + ms(ttl))),
            })],
            Err(e) => vec![internal(e, None)],
        }
    }
}
