//! This pod's view of the bound bots: which channel serves which bot. Built from the services'
//! bound channels, refreshed periodically and when a binding is made or released here.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use switchyard_core::{BackendError, ProviderServices};

use crate::creds::Credentials;

pub(crate) struct Bot {
    pub key: String,
    pub channel_id: String,
    pub creds: Credentials,
}

impl std::fmt::Debug for Bot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bot")
            .field("key", &self.key)
            .field("channel_id", &self.channel_id)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
pub(crate) struct Registry {
    bots: RwLock<HashMap<String, Arc<Bot>>>,
    by_channel: RwLock<HashMap<String, Arc<Bot>>>,
    refreshing: tokio::sync::Mutex<()>,
}

impl Registry {
    pub fn of_channel(&self, channel_id: &str) -> Option<Arc<Bot>> {
        self.by_channel
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(channel_id)
            .cloned()
    }

    pub fn all(&self) -> Vec<Arc<Bot>> {
        self.bots
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    pub async fn refresh(&self, services: &dyn ProviderServices) -> Result<(), BackendError> {
        let _one = self.refreshing.lock().await;
        let mut bots: HashMap<String, Arc<Bot>> = HashMap::new();
        let mut by_channel = HashMap::new();
        for b in services.bound_channels().await? {
            let Some(creds) = Credentials::from_stored(&b.credentials) else {
                tracing::warn!(connector_channel_id = %b.channel_id, "discord binding with unreadable credentials skipped");
                continue;
            };
            let bot = Arc::new(Bot {
                key: creds.bot_key(),
                channel_id: b.channel_id.clone(),
                creds,
            });
            by_channel.insert(b.channel_id.clone(), bot.clone());
            if bots.contains_key(&bot.key) {
                // The core refuses the same bot twice in a tenant; across tenants the first
                // binding keeps the bot's events (one Gateway session per bot).
                tracing::warn!(bot_key = %bot.key, connector_channel_id = %b.channel_id, "bot already served by another channel; its events go there");
                continue;
            }
            bots.insert(bot.key.clone(), bot);
        }
        *self.bots.write().unwrap_or_else(|p| p.into_inner()) = bots;
        *self.by_channel.write().unwrap_or_else(|p| p.into_inner()) = by_channel;
        Ok(())
    }
}
