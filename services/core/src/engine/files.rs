//! The transfer plane: uploads bound to a channel, signed downloads any pod can verify.

use serde::Serialize;
use switchyard_protocol::im::FileItem;

use super::{CardServices, Fault, MountedCard, ms};
use crate::crypto::SignatureCheck;
use crate::error::ErrorKind;
use crate::files::ByteStream;
use crate::ids::{new_id, now_ms};
use crate::model::{ChannelRecord, FileDirection, FileRecord};
use crate::provider::ServicesError;
use switchyard_protocol::ErrorCode;

/// Response of `POST /files/uploads`.
#[derive(Debug, Clone, Serialize)]
pub struct UploadedFile {
    pub file_ref: String,
    pub file_type: String,
    pub filename: String,
    pub byte_size: u64,
    pub expires_at: i64,
}

/// Outcome of a download request.
pub enum DownloadCheck {
    Ok(Box<FileRecord>, ByteStream),
    /// Unknown or expired file, or expired URL.
    NotFound,
    /// Bad signature, or a channel/tenant that does not own the file.
    Forbidden,
}

/// How a downloader proved itself.
pub enum DownloadAuth<'a> {
    /// `?exp=&sig=` from a signed URL.
    Signed {
        exp: i64,
        sig: &'a str,
    },
    /// The system API key's tenant plus the `X-XAgent-Connector-Channel-ID` header.
    Tenant {
        tenant_id: &'a str,
        channel_id: Option<&'a str>,
    },
    None,
}

/// `files[].type` from a MIME type.
pub fn file_type_of(mime: &str) -> &'static str {
    match mime.split('/').next().unwrap_or("") {
        "image" => "image",
        "video" => "video",
        "audio" => "audio",
        _ => "file",
    }
}

/// A filename safe to store and echo: no path parts, no control characters, bounded.
pub fn clean_filename(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or("");
    let cleaned: String = base
        .chars()
        .filter(|c| !c.is_control() && *c != '"')
        .take(200)
        .collect();
    if cleaned.trim().is_empty() {
        "file".to_owned()
    } else {
        cleaned
    }
}

/// The refusal of a file that does not fit in the tenant's stored bytes quota, counted.
fn stored_bytes_full(max: u64) -> ServicesError {
    ServicesError::QuotaExceeded(
        crate::quota::reached("stored_bytes", max, "wait for files to expire").message,
    )
}

impl MountedCard {
    /// `POST /files/uploads`: the channel must belong to the caller's tenant and this Card.
    pub async fn upload(
        &self,
        tenant_id: &str,
        channel_id: Option<&str>,
        filename: &str,
        mime: Option<&str>,
        body: ByteStream,
    ) -> Result<UploadedFile, Fault> {
        let Some(channel_id) = channel_id.filter(|c| !c.is_empty()) else {
            return Err(Fault::new(
                ErrorCode::ConnectorChannelIdRequired,
                "X-XAgent-Connector-Channel-ID header is required",
            ));
        };
        let ch = match self.hub.store.get_channel(channel_id).await? {
            Some(ch) if ch.tenant_id == tenant_id && ch.card_id == self.card_id() => ch,
            Some(_) => {
                return Err(Fault::new(
                    ErrorCode::ConnectorChannelNotOwned,
                    "channel is not owned by this caller",
                ));
            }
            None => {
                return Err(Fault::new(
                    ErrorCode::ConnectionNotFound,
                    "unknown connector_channel_id",
                ));
            }
        };
        let rec = self
            .store_file(&ch, FileDirection::Outbound, filename, mime, body)
            .await
            .map_err(|e| match e {
                ServicesError::TooLarge => Fault::new(
                    ErrorCode::PacketTooLarge,
                    "file exceeds the upload size limit",
                ),
                ServicesError::QuotaExceeded(m) => Fault::new(ErrorCode::Busy, m),
                ServicesError::UnknownChannel => Fault::new(
                    ErrorCode::ConnectionNotFound,
                    "unknown connector_channel_id",
                ),
                ServicesError::Backend(b) => b.into(),
                other => Fault::new(ErrorCode::Internal, other.to_string()),
            })?;
        Ok(UploadedFile {
            file_ref: rec.file_ref,
            file_type: rec.file_type,
            filename: rec.filename,
            byte_size: rec.byte_size,
            expires_at: rec.expires_at,
        })
    }
}

impl CardServices {
    /// Streams bytes into the file store and records the file, within the tenant's stored
    /// bytes quota (checked before a byte is read, and again with the insert, which is what
    /// holds against concurrent uploads). Nothing is kept when the bytes do not all arrive or
    /// do not fit.
    pub(crate) async fn store_file(
        &self,
        ch: &ChannelRecord,
        direction: FileDirection,
        filename: &str,
        mime: Option<&str>,
        body: ByteStream,
    ) -> Result<FileRecord, ServicesError> {
        let filename = clean_filename(filename);
        let mime = mime
            .filter(|m| !m.is_empty() && m.contains('/'))
            .map(str::to_owned)
            .unwrap_or_else(|| guess_mime(&filename));
        let max = self.hub.quotas.effective(&ch.tenant_id).stored_bytes;
        // Refused before a byte is read when the tenant is already at its quota.
        if max > 0 && self.hub.store.tenant_stored_bytes(&ch.tenant_id).await? >= max {
            return Err(stored_bytes_full(max));
        }
        let file_ref = new_id("file");
        let storage_key = format!("{}/{}/{}", ch.tenant_id, ch.id, file_ref);
        let size = match self
            .hub
            .files
            .put(&storage_key, body, self.hub.config.max_upload_bytes)
            .await
        {
            Ok(n) => n,
            Err(e) if e.is(ErrorKind::LimitExceeded) => return Err(ServicesError::TooLarge),
            Err(e) => return Err(ServicesError::Backend(e)),
        };
        let now = now_ms();
        let rec = FileRecord {
            file_ref,
            tenant_id: ch.tenant_id.clone(),
            channel_id: ch.id.clone(),
            direction,
            filename,
            file_type: file_type_of(&mime).to_owned(),
            mime_type: mime,
            byte_size: size,
            storage_key,
            created_at: now,
            expires_at: now + ms(self.hub.config.file_ttl),
        };
        if let Err(e) = self.hub.store.insert_file_within(&rec, max).await {
            let _ = self.hub.files.delete(&rec.storage_key).await;
            if e.is(ErrorKind::LimitExceeded) {
                return Err(stored_bytes_full(max));
            }
            // The channel was removed (janitor, cascade) while the bytes streamed in.
            if e.is(ErrorKind::NotFound) {
                return Err(ServicesError::UnknownChannel);
            }
            return Err(ServicesError::Backend(e));
        }
        metrics::counter!("switchyard_files_stored_total", "card" => self.card_id().to_owned())
            .increment(1);
        metrics::counter!("switchyard_file_bytes_total", "card" => self.card_id().to_owned())
            .increment(size);
        Ok(rec)
    }

    /// The item an inbound message carries for a stored file (URL added at delivery).
    pub(crate) fn file_item(rec: &FileRecord) -> FileItem {
        FileItem {
            file_type: rec.file_type.clone(),
            file_ref: rec.file_ref.clone(),
            filename: Some(rec.filename.clone()),
            mime_type: Some(rec.mime_type.clone()),
            byte_size: Some(rec.byte_size),
            expires_at: Some(rec.expires_at),
            download_url: None,
        }
    }
}

impl MountedCard {
    /// `GET /files/refs/{file_ref}`.
    pub async fn download(
        &self,
        file_ref: &str,
        auth: DownloadAuth<'_>,
    ) -> Result<DownloadCheck, Fault> {
        let now = now_ms();
        if let DownloadAuth::Signed { exp, sig } = auth {
            match self.hub.signer.verify(file_ref, exp, sig, now) {
                SignatureCheck::Valid => {}
                SignatureCheck::Expired => return Ok(DownloadCheck::NotFound),
                SignatureCheck::Invalid => return Ok(DownloadCheck::Forbidden),
            }
        }
        let Some(rec) = self.hub.store.get_file(file_ref).await? else {
            return Ok(DownloadCheck::NotFound);
        };
        if rec.expires_at <= now {
            return Ok(DownloadCheck::NotFound);
        }
        match auth {
            DownloadAuth::Signed { .. } => {}
            DownloadAuth::Tenant {
                tenant_id,
                channel_id,
            } => {
                if rec.tenant_id != tenant_id || channel_id.is_some_and(|c| c != rec.channel_id) {
                    return Ok(DownloadCheck::Forbidden);
                }
            }
            DownloadAuth::None => return Ok(DownloadCheck::Forbidden),
        }
        // A file of another Card is not served under this prefix.
        match self.hub.store.get_channel(&rec.channel_id).await? {
            Some(ch) if ch.card_id == self.card_id() => {}
            Some(_) => return Ok(DownloadCheck::Forbidden),
            None => return Ok(DownloadCheck::NotFound),
        }
        match self.hub.files.get(&rec.storage_key).await {
            Ok(stream) => Ok(DownloadCheck::Ok(Box::new(rec), stream)),
            Err(e) if e.is(ErrorKind::NotFound) => Ok(DownloadCheck::NotFound),
            Err(e) => Err(e.into()),
        }
    }
}

fn guess_mime(filename: &str) -> String {
    let ext = filename
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "mp4" => "video/mp4",
        "webm" => "video/webm",
        "mp3" => "audio/mpeg",
        "ogg" | "oga" => "audio/ogg",
        "wav" => "audio/wav",
        "pdf" => "application/pdf",
        "txt" => "text/plain",
        "json" => "application/json",
        _ => "application/octet-stream",
    }
    .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filenames_are_cleaned() {
        assert_eq!(clean_filename("../../etc/passwd"), "passwd");
        assert_eq!(clean_filename("a\"b\n.txt"), "ab.txt");
        assert_eq!(clean_filename(""), "file");
        assert_eq!(file_type_of("image/png"), "image");
        assert_eq!(file_type_of("application/pdf"), "file");
    }
}
