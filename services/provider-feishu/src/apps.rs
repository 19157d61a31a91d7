//! This pod's view of the bound apps: which channel serves which app. Built from the services'
//! bound channels, refreshed periodically and on demand (an event for an app bound a moment
//! ago on another pod).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use switchyard_core::{BackendError, ProviderServices};

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

impl App {
    /// The app a binding serves; None when its credentials are not readable as ours.
    pub fn of_binding(b: &switchyard_core::provider::Binding) -> Option<Self> {
        let creds = Credentials::from_stored(&b.credentials)?;
        Some(Self {
            key: creds.app_key(),
            channel_id: b.channel_id.clone(),
            creds,
        })
    }
}

#[derive(Default)]
pub(crate) struct Registry {
    apps: RwLock<HashMap<String, Arc<App>>>,
    by_channel: RwLock<HashMap<String, Arc<App>>>,
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

    pub async fn refresh(&self, services: &dyn ProviderServices) -> Result<(), BackendError> {
        let _one = self.refreshing.lock().await;
        self.load(services).await
    }

    async fn load(&self, services: &dyn ProviderServices) -> Result<(), BackendError> {
        let bindings = services.bound_channels().await?;
        let mut apps: HashMap<String, Arc<App>> = HashMap::new();
        let mut by_channel = HashMap::new();
        for b in bindings {
            let Some(app) = App::of_binding(&b) else {
                tracing::warn!(connector_channel_id = %b.channel_id, "feishu binding with unreadable credentials skipped");
                continue;
            };
            let key = app.key.clone();
            let app = Arc::new(app);
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
        Ok(())
    }
}
