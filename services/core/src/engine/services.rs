//! What a provider may ask of the core ([`ProviderServices`]), implemented by
//! [`CardServices`]: one Card's handle on the hub, made before its provider and handed to the
//! provider's factory. It holds no provider, so a provider holds it from its first moment.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use switchyard_protocol::ConnectionStatus;
use switchyard_protocol::descriptor::TargetView;
use switchyard_protocol::im::FileItem;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::{Fault, Hub};
use crate::bindings::{BindingCache, CachedBinding};
use crate::bus::Doorbell;
use crate::crypto::rows;
use crate::ephemeral::Ephemeral;
use crate::error::BackendError;
use crate::files::ByteStream;
use crate::model::{AuthStatus, ChannelRecord, FileDirection};
use crate::provider::{
    AuthStep, Binding, InboundMessage, InboundOutcome, OutboundFile, ProviderServices,
    ServicesError,
};

/// What the core offers one Card's provider: the hub seen through the Card (its channels,
/// leases, state and secrets are namespaced by the Card id), and the prefix its file URLs live
/// under.
pub struct CardServices {
    pub(crate) hub: Arc<Hub>,
    card_id: String,
    prefix: &'static str,
    /// Bound channels of this Card read lately, kept until a bus notice says they changed,
    /// so ingress reads no channel (`crate::bindings`).
    bindings: BindingCache,
}

impl std::fmt::Debug for CardServices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CardServices({})", self.card_id)
    }
}

impl CardServices {
    /// The services of Card `card_id`, mounted under `prefix` (`/slack`).
    pub fn new(hub: Arc<Hub>, card_id: &str, prefix: &'static str) -> Arc<Self> {
        Arc::new(Self {
            bindings: BindingCache::new(hub.bus.clone()),
            hub,
            card_id: card_id.to_owned(),
            prefix,
        })
    }

    pub fn card_id(&self) -> &str {
        &self.card_id
    }

    /// The pod's hub this Card is mounted on.
    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    pub fn prefix(&self) -> &'static str {
        self.prefix
    }

    /// Rings a connector's doorbell. A lost notice only delays work (sessions also sweep).
    pub(crate) async fn ring(&self, connector_id: &str, bell: Doorbell) {
        self.hub.ring(connector_id, bell).await;
    }

    async fn own_channel(&self, channel_id: &str) -> Result<Option<ChannelRecord>, BackendError> {
        Ok(self
            .hub
            .store
            .get_channel(channel_id)
            .await?
            .filter(|c| c.card_id == self.card_id()))
    }

    async fn bound_channel(&self, channel_id: &str) -> Result<ChannelRecord, ServicesError> {
        match self.own_channel(channel_id).await? {
            Some(ch) if ch.binding.is_some() => Ok(ch),
            _ => Err(ServicesError::UnknownChannel),
        }
    }

    /// The channel's binding as ingress needs it: from memory, else read (and kept).
    async fn cached_binding(
        &self,
        channel_id: &str,
    ) -> Result<Option<CachedBinding>, BackendError> {
        self.bindings
            .get_or_load(channel_id, || async {
                let Some(ch) = self.own_channel(channel_id).await? else {
                    return Ok(None);
                };
                Ok(self.decrypt_binding(&ch).map(|binding| CachedBinding {
                    connector_id: ch.connector_id,
                    binding,
                }))
            })
            .await
    }

    /// After a binding of this Card changed in the store: forgotten here at once, announced
    /// to every pod's cache.
    pub(crate) async fn binding_changed(&self, channel_id: &str) {
        let ids = [channel_id.to_owned()];
        self.bindings.forget(&ids);
        crate::bindings::announce(self.hub.bus.as_ref(), &ids).await;
    }

    fn fault_to_services(f: Fault) -> ServicesError {
        ServicesError::Invalid(f.message)
    }
}

#[async_trait]
impl ProviderServices for CardServices {
    async fn binding(&self, channel_id: &str) -> Result<Option<Binding>, BackendError> {
        Ok(self.cached_binding(channel_id).await?.map(|c| c.binding))
    }

    async fn bound_channels(&self) -> Result<Vec<Binding>, BackendError> {
        let chans = self.hub.store.bound_channels(self.card_id()).await?;
        Ok(chans
            .iter()
            .filter_map(|c| self.decrypt_binding(c))
            .collect())
    }

    async fn accept_inbound(
        &self,
        channel_id: &str,
        msg: InboundMessage,
    ) -> Result<InboundOutcome, ServicesError> {
        // From memory when the channel was read lately (the provider's own binding lookup,
        // or an earlier message): the message costs its share of the batch insert only.
        let c = self
            .cached_binding(channel_id)
            .await?
            .ok_or(ServicesError::UnknownChannel)?;
        self.enqueue_inbound(channel_id, &c.connector_id, &c.binding.tenant_id, msg)
            .await
    }

    async fn store_inbound_file(
        &self,
        channel_id: &str,
        filename: &str,
        mime_type: Option<&str>,
        body: ByteStream,
    ) -> Result<FileItem, ServicesError> {
        let ch = self.bound_channel(channel_id).await?;
        let rec = self
            .store_file(&ch, FileDirection::Inbound, filename, mime_type, body)
            .await?;
        // An absolute signed URL the provider may hand out (tool results); a queued message
        // gets a fresh one at delivery.
        let mut item = CardServices::file_item(&rec);
        item.download_url = Some(self.absolute_download_url(&rec));
        Ok(item)
    }

    async fn discard_inbound_file(
        &self,
        channel_id: &str,
        file_ref: &str,
    ) -> Result<(), ServicesError> {
        let Some(rec) = self.hub.store.get_file(file_ref).await? else {
            return Ok(());
        };
        if rec.channel_id != channel_id || rec.direction != FileDirection::Inbound {
            return Err(ServicesError::FileNotFound);
        }
        self.hub.store.delete_file(file_ref).await?;
        self.hub.files.delete(&rec.storage_key).await?;
        Ok(())
    }

    async fn open_file(
        &self,
        channel_id: &str,
        file_ref: &str,
    ) -> Result<(OutboundFile, ByteStream), ServicesError> {
        let ch = self
            .own_channel(channel_id)
            .await?
            .ok_or(ServicesError::UnknownChannel)?;
        let of = self
            .outbound_file(&ch, file_ref)
            .await
            .map_err(|()| ServicesError::Backend(BackendError::unavailable("file lookup")))?;
        let of = of.ok_or(ServicesError::FileNotFound)?;
        let stream = self
            .hub
            .files
            .get(&of.record.storage_key)
            .await
            .map_err(|e| {
                if e.is(crate::error::ErrorKind::NotFound) {
                    ServicesError::FileNotFound
                } else {
                    ServicesError::Backend(e)
                }
            })?;
        Ok((of, stream))
    }

    async fn auth_state(
        &self,
        auth_session_id: &str,
    ) -> Result<Option<(String, AuthStatus, Value)>, BackendError> {
        let Some(rec) = self.hub.store.get_auth_session(auth_session_id).await? else {
            return Ok(None);
        };
        if rec.status.is_terminal() || rec.expires_at <= crate::ids::now_ms() {
            return Ok(None);
        }
        if self.own_channel(&rec.channel_id).await?.is_none() {
            return Ok(None);
        }
        let state = match &rec.state {
            Some(blob) => self
                .hub
                .cipher
                .decrypt_json(&crate::crypto::rows::auth_session(&rec.id), blob)
                .unwrap_or(Value::Null),
            None => Value::Null,
        };
        Ok(Some((rec.channel_id, rec.status, state)))
    }

    async fn advance_auth(
        &self,
        auth_session_id: &str,
        step: AuthStep,
    ) -> Result<(), ServicesError> {
        let Some(mut rec) = self.hub.store.get_auth_session(auth_session_id).await? else {
            return Err(ServicesError::UnknownChannel);
        };
        if rec.status.is_terminal() || rec.expires_at <= crate::ids::now_ms() {
            return Err(ServicesError::Invalid(
                "authentication session is no longer pending".into(),
            ));
        }
        let ch = self
            .own_channel(&rec.channel_id)
            .await?
            .ok_or(ServicesError::UnknownChannel)?;
        // The provider reports this step itself; its channel binds as connected.
        self.apply_step(None, &ch, &mut rec, step)
            .await
            .map_err(CardServices::fault_to_services)?;
        Ok(())
    }

    async fn set_target_status(
        &self,
        channel_id: &str,
        status: ConnectionStatus,
    ) -> Result<(), ServicesError> {
        let ch = self.bound_channel(channel_id).await?;
        self.set_status(&ch, status)
            .await
            .map_err(CardServices::fault_to_services)
    }

    async fn rebind(
        &self,
        channel_id: &str,
        credentials: &Value,
        view: &TargetView,
        binding_key: Option<&str>,
    ) -> Result<(), ServicesError> {
        let ch = self.bound_channel(channel_id).await?;
        if let Some(key) = binding_key
            && let Some(other) = self
                .hub
                .store
                .find_channel_by_binding_key(&ch.tenant_id, &ch.card_id, key)
                .await?
            && other.id != ch.id
        {
            return Err(ServicesError::Backend(BackendError::conflict(
                "the new target is already bound to another channel of this tenant",
            )));
        }
        let blob = self
            .hub
            .cipher
            .encrypt_json(&rows::channel(&ch.id), credentials);
        self.hub
            .store
            .set_channel_binding(
                &ch.id,
                Some(&blob),
                binding_key,
                ch.status,
                &serde_json::json!(view),
                crate::ids::now_ms(),
            )
            .await?;
        self.binding_changed(&ch.id).await;
        self.ring(
            &ch.connector_id,
            Doorbell::Descriptor {
                channel_id: ch.id.clone(),
            },
        )
        .await;
        Ok(())
    }

    fn public_base_url(&self) -> String {
        self.hub.public_base_url.clone()
    }

    fn ephemeral(&self) -> Arc<dyn Ephemeral> {
        self.hub.ephemeral.clone()
    }

    async fn acquire_lease(
        &self,
        name: &str,
        ttl: std::time::Duration,
    ) -> Result<Option<i64>, BackendError> {
        let name = format!("{}:{name}", self.card_id());
        let lease = self
            .hub
            .store
            .acquire_lease(
                &name,
                &self.hub.pod_id,
                ttl.as_millis() as i64,
                crate::ids::now_ms(),
            )
            .await?;
        Ok(lease.map(|l| l.generation))
    }

    async fn release_lease(&self, name: &str) -> Result<(), BackendError> {
        self.hub
            .store
            .release_lease(&format!("{}:{name}", self.card_id()), &self.hub.pod_id)
            .await
    }

    async fn kv_get(&self, key: &str) -> Result<Option<String>, BackendError> {
        self.hub.store.kv_get(self.card_id(), key).await
    }

    async fn kv_put(&self, key: &str, value: &str) -> Result<(), BackendError> {
        self.hub.store.kv_put(self.card_id(), key, value).await
    }

    async fn secret_get(&self, key: &str) -> Result<Option<Value>, BackendError> {
        let ns = secret_namespace(self.card_id());
        let Some(stored) = self.hub.store.kv_get(&ns, key).await? else {
            return Ok(None);
        };
        let blob = STANDARD
            .decode(stored)
            .map_err(|_| BackendError::internal("a stored provider secret is not base64"))?;
        self.hub
            .cipher
            .decrypt_json(&rows::kv(&ns, key), &blob)
            .map(Some)
            .map_err(|e| BackendError::internal(format!("provider secret: {e}")))
    }

    async fn secret_put(&self, key: &str, value: &Value) -> Result<(), BackendError> {
        let ns = secret_namespace(self.card_id());
        let blob = self.hub.cipher.encrypt_json(&rows::kv(&ns, key), value);
        self.hub
            .store
            .kv_put(&ns, key, &STANDARD.encode(blob))
            .await
    }
}

/// The kv namespace of a provider's secrets: apart from its plain state.
fn secret_namespace(card_id: &str) -> String {
    format!("{card_id}#secrets")
}
