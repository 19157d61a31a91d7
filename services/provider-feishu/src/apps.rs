//! This pod's view of the bound apps: which channel serves which app. Built from the host's
//! bound channels, refreshed periodically and on demand (an event for an app bound a moment
//! ago on another pod).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use switchyard_core::{BackendError, ProviderHost};
use tokio::time::Instant;

use crate::creds::Credentials;

pub(crate) struct App {
    pub key: String,
    pub channel_id: String,
    pub creds: Credentials,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("key", &self.key)
            .field("channel_id", &self.channel_id)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
pub(crate) struct Registry {
    apps: RwLock<HashMap<String, Arc<App>>>,
    by_channel: RwLock<HashMap<String, Arc<App>>>,
    loaded_at: RwLock<Option<Instant>>,
    refreshing: tokio::sync::Mutex<()>,
}

impl Registry {
    pub fn of_channel(&self, channel_id: &str) -> Option<Arc<App>> {
        self.by_channel
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(channel_id)
            .cloned()
    }

    pub fn all(&self) -> Vec<Arc<App>> {
        self.apps
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    pub async fn refresh(&self, host: &dyn ProviderHost) -> Result<(), BackendError> {
        let _one = self.refreshing.lock().await;
        self.load(host).await
    }

    pub async fn refresh_if_older(
        &self,
        host: &dyn ProviderHost,
        max_age: Duration,
    ) -> Result<(), BackendError> {
        let _one = self.refreshing.lock().await;
        let fresh = self
            .loaded_at
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|t| t.elapsed() < max_age);
        if fresh {
            return Ok(());
        }
        self.load(host).await
    }

    async fn load(&self, host: &dyn ProviderHost) -> Result<(), BackendError> {
        let bindings = host.bound_channels().await?;
        let mut apps: HashMap<String, Arc<App>> = HashMap::new();
        let mut by_channel = HashMap::new();
        for b in bindings {
            let Some(c) = Credentials::from_stored(&b.credentials) else {
                tracing::warn!(connector_channel_id = %b.channel_id, "feishu binding with unreadable credentials skipped");
                continue;
            };
            let key = c.app_key();
            let app = Arc::new(App {
                key: key.clone(),
                channel_id: b.channel_id.clone(),
                creds: c,
            });
            by_channel.insert(b.channel_id.clone(), app.clone());
            if apps.contains_key(&key) {
                // The core refuses the same app twice in a tenant; across tenants the first
                // binding keeps the app's events.
                tracing::warn!(app_key = %key, connector_channel_id = %b.channel_id, "app already served by another channel; its events go there");
                continue;
            }
            apps.insert(key, app);
        }
        *self.apps.write().unwrap_or_else(|p| p.into_inner()) = apps;
        *self.by_channel.write().unwrap_or_else(|p| p.into_inner()) = by_channel;
        *self.loaded_at.write().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        Ok(())
    }
}
