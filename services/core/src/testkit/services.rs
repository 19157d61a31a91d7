//! One pod's [`ProviderServices`] over the shared [`Cluster`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use switchyard_protocol::ConnectionStatus;
use switchyard_protocol::descriptor::TargetView;
use switchyard_protocol::im::{ChatMessagePayload, FileItem};

use super::cluster::{Cluster, Lease, StoredFile};
use super::{TENANT, file_type};
use crate::ephemeral::Ephemeral;
use crate::error::BackendError;
use crate::files::{ByteStream, bytes_stream, collect};
use crate::ids::now_ms;
use crate::model::{AuthStatus, FileDirection, FileRecord};
use crate::provider::{
    AuthStep, Binding, InboundMessage, InboundOutcome, OutboundFile, ProviderServices,
    ServicesError,
};

/// The largest inbound file the fake file store takes.
const MAX_FILE: u64 = 1 << 20;

/// One pod's services: its name (the lease holder), its public base URL, and the cluster
/// state it shares with the other pods. It reads as its cluster (`services.inbound()`).
pub struct FakeServices {
    pub pod: String,
    pub base_url: String,
    /// The provider's mount prefix (`/telegram`): signed download URLs live under it.
    pub prefix: String,
    pub cluster: Arc<Cluster>,
    /// A "crashed" pod: it can neither renew nor take a lease, nor store (`accept_inbound`,
    /// `kv_put`, `secret_put` fail as unavailable).
    pub dead: AtomicBool,
}

impl FakeServices {
    pub fn new(cluster: Arc<Cluster>, pod: &str, base_url: &str, prefix: &str) -> Arc<Self> {
        Arc::new(Self {
            pod: pod.into(),
            base_url: base_url.into(),
            prefix: prefix.into(),
            cluster,
            dead: AtomicBool::new(false),
        })
    }

    fn alive(&self) -> Result<(), BackendError> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(BackendError::unavailable("pod is dead"));
        }
        Ok(())
    }

    fn download_url(&self, file_ref: &str, signature: &str) -> String {
        format!(
            "{}{}/files/refs/{file_ref}?{signature}",
            self.base_url, self.prefix
        )
    }
}

impl std::ops::Deref for FakeServices {
    type Target = Cluster;

    fn deref(&self) -> &Cluster {
        &self.cluster
    }
}

#[async_trait]
impl ProviderServices for FakeServices {
    async fn binding(&self, channel_id: &str) -> Result<Option<Binding>, BackendError> {
        Ok(self.cluster.find_binding(channel_id))
    }

    async fn bound_channels(&self) -> Result<Vec<Binding>, BackendError> {
        Ok(self.cluster.bindings.lock().unwrap().clone())
    }

    /// The core's order: the channel must be bound, the message valid and the pod not
    /// saturated; then a repeated id is a duplicate even when the queue is full.
    async fn accept_inbound(
        &self,
        channel_id: &str,
        msg: InboundMessage,
    ) -> Result<InboundOutcome, ServicesError> {
        self.alive()?;
        let c = &self.cluster;
        c.accept_calls.fetch_add(1, Ordering::SeqCst);
        if c.find_binding(channel_id).is_none() {
            return Err(ServicesError::UnknownChannel);
        }
        ChatMessagePayload {
            message_id: msg.message_id.clone(),
            text: msg.text.clone().filter(|t| !t.is_empty()),
            files: msg.files.clone(),
            created_at: None,
            sender_name: None,
        }
        .validate()
        .map_err(ServicesError::Invalid)?;
        if c.overloaded.load(Ordering::SeqCst) {
            return Err(ServicesError::Overloaded);
        }
        let mut inbound = c.inbound.lock().unwrap();
        if inbound
            .iter()
            .any(|(ch, m)| ch == channel_id && m.message_id == msg.message_id)
        {
            return Ok(InboundOutcome::Duplicate);
        }
        if c.full.load(Ordering::SeqCst) {
            return Err(ServicesError::Full);
        }
        inbound.push((channel_id.into(), msg));
        Ok(InboundOutcome::Stored)
    }

    async fn store_inbound_file(
        &self,
        channel_id: &str,
        filename: &str,
        mime_type: Option<&str>,
        body: ByteStream,
    ) -> Result<FileItem, ServicesError> {
        self.cluster.storing.store(true, Ordering::SeqCst);
        let bytes = collect(body, MAX_FILE)
            .await
            .map_err(|_| ServicesError::TooLarge)?;
        let file_ref = format!(
            "file_in_{}",
            self.cluster.next_file.fetch_add(1, Ordering::SeqCst)
        );
        let item = FileItem {
            file_type: file_type(mime_type.unwrap_or("")).into(),
            file_ref: file_ref.clone(),
            filename: Some(filename.into()),
            mime_type: mime_type.map(Into::into),
            byte_size: Some(bytes.len() as u64),
            expires_at: None,
            download_url: Some(self.download_url(&file_ref, "exp=1&sig=x")),
        };
        self.cluster.files.lock().unwrap().insert(
            file_ref,
            StoredFile {
                channel_id: channel_id.into(),
                filename: filename.into(),
                mime_type: mime_type.map(Into::into),
                bytes,
                direction: FileDirection::Inbound,
            },
        );
        Ok(item)
    }

    /// The core's rule: missing is fine, another channel's or an outbound file is not found.
    async fn discard_inbound_file(
        &self,
        channel_id: &str,
        file_ref: &str,
    ) -> Result<(), ServicesError> {
        let mut files = self.cluster.files.lock().unwrap();
        let Some(f) = files.get(file_ref) else {
            return Ok(());
        };
        if f.channel_id != channel_id || f.direction != FileDirection::Inbound {
            return Err(ServicesError::FileNotFound);
        }
        files.remove(file_ref);
        self.cluster.discarded.lock().unwrap().push(file_ref.into());
        Ok(())
    }

    /// Only the channel's uploaded (outbound) files open.
    async fn open_file(
        &self,
        channel_id: &str,
        file_ref: &str,
    ) -> Result<(OutboundFile, ByteStream), ServicesError> {
        let f = self.cluster.files.lock().unwrap().get(file_ref).cloned();
        let f = f
            .filter(|f| f.channel_id == channel_id && f.direction == FileDirection::Outbound)
            .ok_or(ServicesError::FileNotFound)?;
        let mime = f
            .mime_type
            .clone()
            .unwrap_or_else(|| "application/octet-stream".into());
        let record = FileRecord {
            file_ref: file_ref.into(),
            tenant_id: TENANT.into(),
            channel_id: channel_id.into(),
            direction: FileDirection::Outbound,
            filename: f.filename.clone(),
            mime_type: mime.clone(),
            file_type: file_type(&mime).into(),
            byte_size: f.bytes.len() as u64,
            storage_key: format!("k/{file_ref}"),
            created_at: 0,
            expires_at: i64::MAX,
        };
        let download_url = self.download_url(file_ref, "exp=9&sig=abc");
        Ok((
            OutboundFile {
                record,
                download_url,
            },
            bytes_stream(f.bytes),
        ))
    }

    /// Unfinished sessions only, as the core answers.
    async fn auth_state(
        &self,
        auth_session_id: &str,
    ) -> Result<Option<(String, AuthStatus, Value)>, BackendError> {
        Ok(self
            .cluster
            .sessions
            .lock()
            .unwrap()
            .get(auth_session_id)
            .filter(|s| !s.status.is_terminal())
            .map(|s| (s.channel_id.clone(), s.status, s.state.clone())))
    }

    /// The core's rules: an unknown session is refused, a finished one takes no more steps.
    async fn advance_auth(
        &self,
        auth_session_id: &str,
        step: AuthStep,
    ) -> Result<(), ServicesError> {
        let status = self
            .cluster
            .sessions
            .lock()
            .unwrap()
            .get(auth_session_id)
            .map(|s| s.status);
        match status {
            None => return Err(ServicesError::UnknownChannel),
            Some(s) if s.is_terminal() => {
                return Err(ServicesError::Invalid(
                    "authentication session is no longer pending".into(),
                ));
            }
            Some(_) => {}
        }
        self.cluster
            .steps
            .lock()
            .unwrap()
            .push((auth_session_id.into(), step.clone()));
        self.cluster.apply(auth_session_id, step);
        Ok(())
    }

    async fn set_target_status(
        &self,
        channel_id: &str,
        status: ConnectionStatus,
    ) -> Result<(), ServicesError> {
        self.cluster
            .statuses
            .lock()
            .unwrap()
            .push((channel_id.into(), status));
        Ok(())
    }

    /// The core's rule without the uniqueness check (the cluster keeps no binding keys): a
    /// bound channel takes the new credentials; the call is recorded in `rebinds`.
    async fn rebind(
        &self,
        channel_id: &str,
        credentials: &Value,
        view: &TargetView,
        binding_key: Option<&str>,
    ) -> Result<(), ServicesError> {
        self.alive()?;
        {
            let mut bindings = self.cluster.bindings.lock().unwrap();
            let b = bindings
                .iter_mut()
                .find(|b| b.channel_id == channel_id)
                .ok_or(ServicesError::UnknownChannel)?;
            b.credentials = credentials.clone();
        }
        self.cluster.rebinds.lock().unwrap().push((
            channel_id.into(),
            view.clone(),
            binding_key.map(str::to_owned),
        ));
        Ok(())
    }

    fn public_base_url(&self) -> String {
        self.base_url.clone()
    }

    fn ephemeral(&self) -> Arc<dyn Ephemeral> {
        self.cluster.eph.clone()
    }

    /// The store's rule: the holder renews; anyone takes an expired lease with a new generation.
    async fn acquire_lease(&self, name: &str, ttl: Duration) -> Result<Option<i64>, BackendError> {
        self.alive()?;
        let now = now_ms();
        let until = now + i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX / 2);
        let mut leases = self.cluster.leases.lock().unwrap();
        let l = leases.entry(name.to_owned()).or_insert(Lease {
            holder: String::new(),
            generation: 0,
            expires_at: 0,
        });
        if l.holder == self.pod && l.expires_at > now {
            l.expires_at = until;
            return Ok(Some(l.generation));
        }
        if l.expires_at <= now || l.holder.is_empty() {
            l.holder = self.pod.clone();
            l.generation += 1;
            l.expires_at = until;
            return Ok(Some(l.generation));
        }
        Ok(None)
    }

    async fn release_lease(&self, name: &str) -> Result<(), BackendError> {
        let mut leases = self.cluster.leases.lock().unwrap();
        if let Some(l) = leases.get_mut(name)
            && l.holder == self.pod
        {
            l.expires_at = 0;
        }
        Ok(())
    }

    async fn kv_get(&self, key: &str) -> Result<Option<String>, BackendError> {
        Ok(self.cluster.kv(key))
    }

    async fn kv_put(&self, key: &str, value: &str) -> Result<(), BackendError> {
        self.alive()?;
        self.cluster
            .kv
            .lock()
            .unwrap()
            .insert(key.into(), value.into());
        Ok(())
    }

    async fn secret_get(&self, key: &str) -> Result<Option<Value>, BackendError> {
        Ok(self.cluster.secrets.lock().unwrap().get(key).cloned())
    }

    async fn secret_put(&self, key: &str, value: &Value) -> Result<(), BackendError> {
        self.alive()?;
        self.cluster
            .secrets
            .lock()
            .unwrap()
            .insert(key.into(), value.clone());
        Ok(())
    }
}
