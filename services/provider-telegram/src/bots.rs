//! This pod's view of the bound bots: which channel serves which chat of which bot. Built
//! from the services' bound channels and refreshed periodically and on demand (an update for an
//! unknown bot or chat may come from a binding made a moment ago on another pod).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use switchyard_core::crypto::Secret;
use switchyard_core::{BackendError, ProviderServices};
use tokio::time::Instant;

use crate::creds::{Credentials, token_fingerprint};

/// A channel bound to a chat of a bot.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    pub channel_id: String,
}

pub(crate) struct Bot {
    pub key: String,
    pub id: i64,
    pub token: Secret,
    pub token_fp: String,
    pub chats: HashMap<i64, Route>,
}

impl std::fmt::Debug for Bot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bot")
            .field("key", &self.key)
            .field("chats", &self.chats.len())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
pub(crate) struct Registry {
    bots: RwLock<HashMap<String, Arc<Bot>>>,
    loaded_at: RwLock<Option<Instant>>,
    /// Coalesces concurrent refreshes (a burst of unknown updates triggers one reload).
    refreshing: tokio::sync::Mutex<()>,
}

impl Registry {
    pub fn get(&self, key: &str) -> Option<Arc<Bot>> {
        self.bots
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
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

    /// Reloads every binding of the Card. Where channels of one bot hold different tokens
    /// (one was re-bound after a revocation), a token not in `revoked` is used.
    pub async fn refresh(
        &self,
        services: &dyn ProviderServices,
        revoked: &HashSet<String>,
    ) -> Result<(), BackendError> {
        let _one = self.refreshing.lock().await;
        self.load(services, revoked).await
    }

    /// Reloads unless the view is younger than `max_age` (or another caller just did).
    pub async fn refresh_if_older(
        &self,
        services: &dyn ProviderServices,
        revoked: &HashSet<String>,
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
        self.load(services, revoked).await
    }

    async fn load(
        &self,
        services: &dyn ProviderServices,
        revoked: &HashSet<String>,
    ) -> Result<(), BackendError> {
        let bindings = services.bound_channels().await?;
        let mut bots: HashMap<String, Bot> = HashMap::new();
        for b in bindings {
            let Some(c) = Credentials::from_stored(&b.credentials) else {
                tracing::warn!(connector_channel_id = %b.channel_id, "telegram binding with unreadable credentials skipped");
                continue;
            };
            let key = c.bot_key();
            let fp = token_fingerprint(&c.token);
            let bot = bots.entry(key.clone()).or_insert_with(|| Bot {
                key: key.clone(),
                id: c.bot_id,
                token: c.token.clone(),
                token_fp: fp.clone(),
                chats: HashMap::new(),
            });
            if revoked.contains(&bot.token_fp) && !revoked.contains(&fp) {
                bot.token = c.token.clone();
                bot.token_fp = fp.clone();
            }
            if bot.chats.contains_key(&c.chat_id) {
                // The core refuses a second binding of the same bot and chat within a tenant;
                // across tenants the first (oldest) binding keeps the chat.
                tracing::warn!(bot_key = %key, connector_channel_id = %b.channel_id, "chat already served by another channel; ignored");
                continue;
            }
            bot.chats.insert(
                c.chat_id,
                Route {
                    channel_id: b.channel_id.clone(),
                },
            );
        }
        let map = bots.into_iter().map(|(k, v)| (k, Arc::new(v))).collect();
        *self.bots.write().unwrap_or_else(|p| p.into_inner()) = map;
        *self.loaded_at.write().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        Ok(())
    }
}
