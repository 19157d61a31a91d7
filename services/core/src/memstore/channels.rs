//! Channels, their auth sessions and the cascade that deletes a channel with everything
//! hanging off it (`store-sql`'s `ops/channels.rs`).

use switchyard_protocol::ConnectionStatus;

use crate::error::BackendResult;
use crate::model::*;

use super::{Tables, by_created, duplicate, missing};

impl Tables {
    pub(super) fn insert_channel(&mut self, c: &ChannelRecord) -> BackendResult<()> {
        if self.channels.contains_key(&c.id) {
            return Err(duplicate("channel"));
        }
        if !self.connectors.contains_key(&c.connector_id) {
            return Err(missing("connector"));
        }
        self.channels.insert(c.id.clone(), c.clone());
        Ok(())
    }

    /// Channels matching `pick`, oldest first.
    fn channels_where(&self, pick: impl Fn(&ChannelRecord) -> bool) -> Vec<ChannelRecord> {
        let mut out: Vec<ChannelRecord> = self
            .channels
            .values()
            .filter(|c| pick(c))
            .cloned()
            .collect();
        by_created(&mut out, |c| (c.created_at, &c.id));
        out
    }

    pub(super) fn list_channels(&self, connector_id: &str) -> Vec<ChannelRecord> {
        self.channels_where(|c| c.connector_id == connector_id)
    }

    pub(super) fn set_channel_route(
        &mut self,
        id: &str,
        socket: Option<&str>,
        profiles: &[String],
        now: i64,
    ) {
        if let Some(c) = self.channels.get_mut(id) {
            c.route_socket = socket.map(str::to_owned);
            c.profiles = profiles.to_vec();
            c.updated_at = now;
        }
    }

    pub(super) fn clear_channel_route_if(&mut self, id: &str, socket: &str, now: i64) {
        if let Some(c) = self.channels.get_mut(id)
            && c.route_socket.as_deref() == Some(socket)
        {
            c.route_socket = None;
            c.updated_at = now;
        }
    }

    pub(super) fn set_channel_binding(
        &mut self,
        id: &str,
        binding: Option<&[u8]>,
        binding_key: Option<&str>,
        status: ConnectionStatus,
        view: &serde_json::Value,
        now: i64,
    ) {
        if let Some(c) = self.channels.get_mut(id) {
            c.binding = binding.map(<[u8]>::to_vec);
            c.binding_key = binding_key.map(str::to_owned);
            c.status = status;
            c.view = view.clone();
            c.updated_at = now;
        }
    }

    pub(super) fn set_channel_status(
        &mut self,
        id: &str,
        status: ConnectionStatus,
        view: &serde_json::Value,
        now: i64,
    ) {
        if let Some(c) = self.channels.get_mut(id) {
            c.status = status;
            c.view = view.clone();
            c.updated_at = now;
        }
    }

    pub(super) fn find_channel_by_binding_key(
        &self,
        tenant_id: &str,
        card_id: &str,
        key: &str,
    ) -> Option<ChannelRecord> {
        self.channels_where(|c| {
            c.tenant_id == tenant_id
                && c.card_id == card_id
                && c.binding_key.as_deref() == Some(key)
                && c.binding.is_some()
        })
        .into_iter()
        .next()
    }

    pub(super) fn bound_channels(&self, card_id: &str) -> Vec<ChannelRecord> {
        self.channels_where(|c| c.card_id == card_id && c.binding.is_some())
    }

    pub(super) fn stale_unbound_channels(&self, before: i64) -> Vec<ChannelRecord> {
        let mut out: Vec<ChannelRecord> = self
            .channels
            .values()
            .filter(|c| c.binding.is_none() && c.route_socket.is_none() && c.updated_at < before)
            .cloned()
            .collect();
        out.sort_by(|a, b| (a.updated_at, &a.id).cmp(&(b.updated_at, &b.id)));
        out
    }

    /// Deletes the channels `pick` chooses with their files, auth sessions, outbox rows,
    /// seen-records and claims; returns the channels and files, oldest first.
    pub(super) fn delete_channels(&mut self, pick: impl Fn(&ChannelRecord) -> bool) -> Cascade {
        let channels = self.channels_where(pick);
        let ids: std::collections::HashSet<&str> = channels.iter().map(|c| c.id.as_str()).collect();
        let mut files: Vec<FileRecord> = Vec::new();
        self.files.retain(|_, f| {
            let gone = ids.contains(f.channel_id.as_str());
            if gone {
                files.push(f.clone());
            }
            !gone
        });
        files.sort_by(|a, b| (a.created_at, &a.file_ref).cmp(&(b.created_at, &b.file_ref)));
        self.auth_sessions
            .retain(|_, a| !ids.contains(a.channel_id.as_str()));
        self.outbox
            .retain(|_, m| !ids.contains(m.channel_id.as_str()));
        self.outbox_ids
            .retain(|(ch, _), _| !ids.contains(ch.as_str()));
        self.seen.retain(|(ch, _), _| !ids.contains(ch.as_str()));
        self.acked.retain(|ch, _| !ids.contains(ch.as_str()));
        self.claims
            .retain(|(_, ch, _), _| !ids.contains(ch.as_str()));
        for c in &channels {
            self.channels.remove(&c.id);
        }
        Cascade { channels, files }
    }

    pub(super) fn insert_auth_session(&mut self, a: &AuthSessionRecord) -> BackendResult<()> {
        if self.auth_sessions.contains_key(&a.id) {
            return Err(duplicate("auth session"));
        }
        if !self.channels.contains_key(&a.channel_id) {
            return Err(missing("channel"));
        }
        self.auth_sessions.insert(a.id.clone(), a.clone());
        Ok(())
    }

    pub(super) fn update_auth_session(&mut self, a: &AuthSessionRecord) {
        // The owning channel and the creation time are fixed at insert.
        if let Some(s) = self.auth_sessions.get_mut(&a.id) {
            s.flow_id = a.flow_id.clone();
            s.status = a.status;
            s.state = a.state.clone();
            s.public = a.public.clone();
            s.expires_at = a.expires_at;
        }
    }

    pub(super) fn open_auth_sessions(&self, channel_id: &str) -> Vec<AuthSessionRecord> {
        let open = [
            AuthStatus::Pending,
            AuthStatus::Scanned,
            AuthStatus::QrRefreshRequired,
        ];
        let mut out: Vec<AuthSessionRecord> = self
            .auth_sessions
            .values()
            .filter(|a| a.channel_id == channel_id && open.contains(&a.status))
            .cloned()
            .collect();
        by_created(&mut out, |a| (a.created_at, &a.id));
        out
    }

    pub(super) fn purge_auth_sessions(&mut self, before: i64) -> u64 {
        let n = self.auth_sessions.len();
        self.auth_sessions.retain(|_, a| a.expires_at >= before);
        (n - self.auth_sessions.len()) as u64
    }
}
