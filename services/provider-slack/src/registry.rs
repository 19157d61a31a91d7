//! This pod's view of the bound channels: which channel holds which Slack credentials, and
//! which channels share one app's Socket Mode connection (an app installed in several
//! workspaces has one connection for all; its events are routed by `team_id`). Built from
//! the services' bound channels, refreshed periodically and on demand.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use switchyard_core::provider::Binding;
use switchyard_core::{BackendError, ProviderServices};

use crate::creds::Credentials;

pub(crate) struct Bound {
    pub channel_id: String,
    pub tenant_id: String,
    pub creds: Credentials,
}

impl std::fmt::Debug for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bound")
            .field("channel_id", &self.channel_id)
            .finish_non_exhaustive()
    }
}

impl Bound {
    pub fn of_binding(b: &Binding) -> Option<Self> {
        Some(Self {
            channel_id: b.channel_id.clone(),
            tenant_id: b.tenant_id.clone(),
            creds: Credentials::from_stored(&b.credentials)?,
        })
    }
}

#[derive(Default)]
pub(crate) struct Registry {
    by_channel: RwLock<HashMap<String, Arc<Bound>>>,
    refreshing: tokio::sync::Mutex<()>,
}

impl Registry {
    pub fn of_channel(&self, channel_id: &str) -> Option<Arc<Bound>> {
        self.by_channel
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(channel_id)
            .cloned()
    }

    pub fn all(&self) -> Vec<Arc<Bound>> {
        self.by_channel
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// The channels of each Socket Mode app, by app key; within an app, one channel per
    /// workspace (the first bound keeps a workspace's events when two tenants bind it).
    pub fn socket_apps(&self) -> HashMap<String, Vec<Arc<Bound>>> {
        let mut all = self.all();
        all.sort_by(|a, b| a.channel_id.cmp(&b.channel_id));
        let mut out: HashMap<String, Vec<Arc<Bound>>> = HashMap::new();
        for b in all {
            let Some(key) = b.creds.app_key() else {
                continue;
            };
            let list = out.entry(key).or_default();
            if list.iter().any(|x| x.creds.team_id == b.creds.team_id) {
                tracing::warn!(connector_channel_id = %b.channel_id, "slack workspace already served by another channel; its events go there");
                continue;
            }
            list.push(b);
        }
        out
    }

    pub async fn refresh(&self, services: &dyn ProviderServices) -> Result<(), BackendError> {
        let _one = self.refreshing.lock().await;
        let mut by_channel = HashMap::new();
        for b in services.bound_channels().await? {
            match Bound::of_binding(&b) {
                Some(x) => {
                    by_channel.insert(b.channel_id.clone(), Arc::new(x));
                }
                None => {
                    tracing::warn!(connector_channel_id = %b.channel_id, "slack binding with unreadable credentials skipped");
                }
            }
        }
        *self.by_channel.write().unwrap_or_else(|p| p.into_inner()) = by_channel;
        Ok(())
    }
}
