//! Hello, connector_id allocation and the offline lease, channel open/close, ownership and
//! Descriptors.

use std::collections::{HashMap, HashSet};

use switchyard_protocol::descriptor::TargetView;
use switchyard_protocol::packet::HelloPayload;
use switchyard_protocol::{ConnectionStatus, Descriptor, ErrorCode, profile, version_admitted};

use super::{Fault, MountedCard};
use crate::bus::Doorbell;
use crate::error::ErrorKind;
use crate::ids::{new_id, now_ms};
use crate::model::{ChannelOwner, ChannelRecord, ConnectorRecord, Reopened, SocketRecord};

/// Channels one `ChannelsTaken` notice names at most (a notice stays near 10 KB).
const TAKEN_PER_BELL: usize = 256;

/// Who is speaking on a data plane after hello.
#[derive(Debug, Clone)]
pub struct SessionIdent {
    pub tenant_id: String,
    pub connector_id: String,
    pub socket_id: String,
    /// hello's `supported_profiles`.
    pub supported_profiles: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct HelloOk {
    pub ident: SessionIdent,
    /// True when the presented connector_id was unknown and another one was issued.
    pub reissued: bool,
}

/// The answer to one `channel.open`: the channel routed to the socket, with its Descriptor.
pub type Opened = Result<(ChannelRecord, Descriptor), Fault>;

/// The answers to a batch of `channel.open`s, in order, and the reopened channels that had
/// nothing pending when they were routed here (delivery need not read them).
#[derive(Debug, Default)]
pub struct OpenedBatch {
    pub answers: Vec<Opened>,
    pub idle: HashSet<String>,
}

impl MountedCard {
    /// Handles `connector.hello`: checks Card, version and profiles, then resolves the
    /// tenant's connector_id for this Card (reusing it, or issuing one) and records the socket.
    pub async fn hello(
        &self,
        tenant_id: &str,
        socket_id: &str,
        p: &HelloPayload,
    ) -> Result<HelloOk, Fault> {
        let card = self.provider.card();
        if p.connector_card_id != card.connector_card_id {
            return Err(Fault::new(
                ErrorCode::ConnectorCardIdMismatch,
                format!(
                    "this endpoint serves connector_card_id {}",
                    card.connector_card_id
                ),
            ));
        }
        match p.protocol_version.as_deref() {
            Some(v) if version_admitted(v) => {}
            Some(_) => {
                return Err(Fault::new(
                    ErrorCode::UnsupportedProtocolVersion,
                    "protocol_version below 3.0 is not supported",
                ));
            }
            None => {
                return Err(Fault::new(
                    ErrorCode::UnsupportedProtocolVersion,
                    "protocol_version is required",
                ));
            }
        }
        let Some(supported) = &p.supported_profiles else {
            return Err(Fault::new(
                ErrorCode::InvalidPacket,
                "supported_profiles is required",
            ));
        };
        let target_type = &card.primary_target().target_type;
        if profile::negotiate(&card.supports.profiles, supported, target_type).is_empty() {
            return Err(Fault::new(
                ErrorCode::InvalidPacket,
                "supported_profiles has no profile in common with the Card",
            ));
        }

        let store = &self.hub.store;
        // A cheap early refusal; the count that holds is the one taken with the insert below.
        self.hub
            .quotas
            .admit_socket(store.as_ref(), tenant_id)
            .await?;
        let presented = p.connector_id.as_deref().filter(|s| !s.is_empty());
        let current = store.connector_for(tenant_id, self.card_id()).await?;
        let (connector_id, reissued) = match (presented, current) {
            (Some(id), Some(cur)) if cur.id == id => (cur.id, false),
            (presented, Some(cur)) => (cur.id, presented.is_some()),
            (presented, None) => {
                let rec = ConnectorRecord {
                    id: new_id("conn"),
                    tenant_id: tenant_id.to_owned(),
                    card_id: self.card_id().to_owned(),
                    created_at: now_ms(),
                    offline_since: None,
                };
                match store.insert_connector(&rec).await {
                    Ok(()) => (rec.id, presented.is_some()),
                    // Another socket of the same tenant won the race: use its id.
                    Err(e) if e.is(ErrorKind::Conflict) => {
                        match store.connector_for(tenant_id, self.card_id()).await? {
                            Some(cur) => {
                                let reissued = presented.is_some_and(|p| p != cur.id);
                                (cur.id, reissued)
                            }
                            None => return Err(e.into()),
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        };
        let max = self.hub.quotas.effective(tenant_id).sockets;
        let registered = store
            .register_socket_within(
                &SocketRecord {
                    id: socket_id.to_owned(),
                    connector_id: connector_id.clone(),
                    pod_id: self.hub.pod_id.clone(),
                    opened_at: now_ms(),
                },
                tenant_id,
                max,
            )
            .await;
        crate::quota::within(registered, "sockets", max, "close a socket")?;
        metrics::counter!("switchyard_hello_total", "card" => self.card_id().to_owned())
            .increment(1);
        Ok(HelloOk {
            ident: SessionIdent {
                tenant_id: tenant_id.to_owned(),
                connector_id,
                socket_id: socket_id.to_owned(),
                supported_profiles: supported.clone(),
            },
            reissued,
        })
    }

    /// The socket closed: its routes go, and the connector's offline time may start.
    pub async fn goodbye(&self, ident: &SessionIdent, routed: &[String]) {
        let now = now_ms();
        if let Err(e) = self
            .hub
            .store
            .clear_channel_routes_if(routed, &ident.socket_id, now)
            .await
        {
            // Left as a killed pod leaves them: the next socket to open a channel takes it.
            tracing::warn!(error = %e, channels = routed.len(), "clearing channel routes failed");
        }
        if let Err(e) = self
            .hub
            .store
            .unregister_socket(&ident.socket_id, now)
            .await
        {
            // The pod presence sweep removes it later.
            tracing::warn!(error = %e, "unregistering socket failed");
        }
    }

    /// Ownership check of an envelope `connector_channel_id`, before anything else happens.
    pub async fn owned_channel(
        &self,
        ident: &SessionIdent,
        channel_id: Option<&str>,
    ) -> Result<ChannelRecord, Fault> {
        let Some(id) = channel_id.filter(|c| !c.is_empty()) else {
            return Err(Fault::new(
                ErrorCode::ConnectorChannelIdRequired,
                "connector_channel_id is required",
            ));
        };
        let Some(ch) = self.hub.store.get_channel(id).await? else {
            return Err(Fault::new(
                ErrorCode::ConnectionNotFound,
                "unknown connector_channel_id",
            ));
        };
        self.check_owner(ident, &ch)?;
        Ok(ch)
    }

    /// The profiles a channel of this caller gets: the Card's and the caller's in common.
    fn negotiated(&self, ident: &SessionIdent) -> Vec<String> {
        let card = self.provider.card();
        profile::negotiate(
            &card.supports.profiles,
            &ident.supported_profiles,
            &card.primary_target().target_type,
        )
    }

    /// Whether `ident` may use the stored channel `ch`: its tenant, this Card, its
    /// connector_id.
    fn check_owner(&self, ident: &SessionIdent, ch: &ChannelRecord) -> Result<(), Fault> {
        if ch.tenant_id != ident.tenant_id {
            // Same answer shape as for an unknown id would leak less, but the spec asks for
            // a distinct code; the message carries nothing about the owner.
            return Err(Fault::new(
                ErrorCode::ConnectorChannelNotOwned,
                "connector_channel_id is not owned by this caller",
            ));
        }
        if ch.card_id != self.card_id() {
            return Err(Fault::new(
                ErrorCode::ConnectorChannelConnectorMismatch,
                "connector_channel_id belongs to another connector",
            ));
        }
        if ch.connector_id != ident.connector_id {
            return Err(Fault::new(
                ErrorCode::ConnectorChannelNotOwned,
                "connector_channel_id belongs to another connector_id",
            ));
        }
        Ok(())
    }

    /// `channel.open`: reuse a known channel of this caller, or issue a new one (first open,
    /// or an id this server does not know). A foreign channel is refused.
    pub async fn open_channel(&self, ident: &SessionIdent, requested: Option<&str>) -> Opened {
        let profiles = self.negotiated(ident);
        let now = now_ms();
        let existing = match requested.filter(|r| !r.is_empty()) {
            None => None,
            Some(id) => match self.owned_channel(ident, Some(id)).await {
                Ok(ch) => Some(ch),
                Err(f) if f.code == ErrorCode::ConnectionNotFound => None,
                Err(f) => return Err(f),
            },
        };
        let ch = match existing {
            Some(ch) => {
                self.hub
                    .store
                    .set_channel_route(&ch.id, Some(&ident.socket_id), &profiles, now)
                    .await?;
                ch
            }
            None => {
                // Stored already routed here: one write.
                let ch = ChannelRecord {
                    id: new_id("cch"),
                    tenant_id: ident.tenant_id.clone(),
                    connector_id: ident.connector_id.clone(),
                    card_id: self.card_id().to_owned(),
                    route_socket: Some(ident.socket_id.clone()),
                    profiles: profiles.clone(),
                    status: ConnectionStatus::Created,
                    view: serde_json::json!({}),
                    binding: None,
                    binding_key: None,
                    created_at: now,
                    updated_at: now,
                };
                let max = self.hub.quotas.effective(&ident.tenant_id).channels;
                let inserted = self.hub.store.insert_channel_within(&ch, max).await;
                crate::quota::within(inserted, "channels", max, "close a channel")?;
                ch
            }
        };
        Ok(self.routed_here(ident, ch, profiles).await)
    }

    /// The stored channel `ch`, now routed to `ident`'s socket with `profiles`, and its
    /// Descriptor. Another socket delivers it only if its old route pointed elsewhere: that
    /// socket is told to stop (a lost notice is caught by its route sweep); a new channel or
    /// one routed nowhere needs no notice.
    async fn routed_here(
        &self,
        ident: &SessionIdent,
        ch: ChannelRecord,
        profiles: Vec<String>,
    ) -> (ChannelRecord, Descriptor) {
        let (opened, taken) = self.routed(ident, ch, profiles);
        if taken {
            self.ring(
                &ident.connector_id,
                Doorbell::ChannelTaken {
                    channel_id: opened.0.id.clone(),
                    socket_id: ident.socket_id.clone(),
                },
            )
            .await;
        }
        opened
    }

    /// `ch` as routed to `ident`'s socket with `profiles`, its Descriptor, and whether its
    /// old route pointed at another socket (which must be told to stop).
    fn routed(
        &self,
        ident: &SessionIdent,
        mut ch: ChannelRecord,
        profiles: Vec<String>,
    ) -> ((ChannelRecord, Descriptor), bool) {
        let taken = ch
            .route_socket
            .as_deref()
            .is_some_and(|s| s != ident.socket_id);
        ch.route_socket = Some(ident.socket_id.clone());
        ch.profiles = profiles;
        let d = self.descriptor(&ch);
        ((ch, d), taken)
    }

    /// `channel.open` for a batch of requests (one per id asked for, `None` for a new
    /// channel), answered in order. A reconnecting backend reopens its channels by id: those
    /// of this caller are read and routed to this socket by one store call
    /// ([`Store::reopen_channels`](crate::store::Store::reopen_channels), one statement on
    /// Postgres), which also tells which have nothing pending ([`OpenedBatch::idle`]); a
    /// failover costs one statement per batch, not two per channel. New channels and ids this
    /// server does not know take [`MountedCard::open_channel`]'s path, `concurrency` at a time.
    pub async fn open_channels(
        &self,
        ident: &SessionIdent,
        requested: &[Option<String>],
        concurrency: usize,
    ) -> OpenedBatch {
        use futures::StreamExt;
        let ids: Vec<String> = requested
            .iter()
            .flatten()
            .filter(|id| !id.is_empty())
            .cloned()
            .collect();
        let profiles = self.negotiated(ident);
        let owner = ChannelOwner {
            tenant_id: &ident.tenant_id,
            card_id: self.card_id(),
            connector_id: &ident.connector_id,
        };
        let mut known: HashMap<String, Reopened> = HashMap::new();
        if !ids.is_empty() {
            // Read and routed here together: a message stored later rings this socket (the
            // session keeps such doorbells while the batch runs).
            match self
                .hub
                .store
                .reopen_channels(&ids, &owner, &ident.socket_id, &profiles, now_ms())
                .await
            {
                Ok(found) => known.extend(found.into_iter().map(|r| (r.channel.id.clone(), r))),
                Err(e) => {
                    let f = Fault::from(e);
                    return OpenedBatch {
                        answers: requested.iter().map(|_| Err(f.clone())).collect(),
                        idle: HashSet::new(),
                    };
                }
            }
        }
        // Known channels: reopened together, or refused; the rest one by one.
        let mut results: Vec<Option<Opened>> = Vec::with_capacity(requested.len());
        let mut idle = HashSet::new();
        let mut single: Vec<usize> = Vec::new();
        let mut taken = Vec::new();
        for (i, r) in requested.iter().enumerate() {
            results.push(None);
            let Some(found) = r
                .as_deref()
                .filter(|id| !id.is_empty())
                .and_then(|id| known.remove(id))
            else {
                single.push(i);
                continue;
            };
            if !found.moved {
                // Not this caller's: the store left it as it was.
                results[i] = Some(Err(self
                    .check_owner(ident, &found.channel)
                    .err()
                    .unwrap_or_else(|| Fault::new(ErrorCode::Internal, "internal error"))));
                continue;
            }
            if found.max_pending_seq.is_none() {
                idle.insert(found.channel.id.clone());
            }
            let (opened, was_elsewhere) = self.routed(ident, found.channel, profiles.clone());
            if was_elsewhere {
                taken.push(opened.0.id.clone());
            }
            results[i] = Some(Ok(opened));
        }
        // The sockets that had them are told in a few notices, not one a channel.
        for ids in taken.chunks(TAKEN_PER_BELL) {
            self.ring(
                &ident.connector_id,
                Doorbell::ChannelsTaken {
                    channel_ids: ids.to_vec(),
                    socket_id: ident.socket_id.clone(),
                },
            )
            .await;
        }
        let opened: Vec<(usize, Opened)> = futures::stream::iter(single)
            .map(|i| async move { (i, self.open_channel(ident, requested[i].as_deref()).await) })
            .buffered(concurrency.max(1))
            .collect()
            .await;
        for (i, r) in opened {
            results[i] = Some(r);
        }
        OpenedBatch {
            answers: results
                .into_iter()
                .map(|r| {
                    r.unwrap_or_else(|| Err(Fault::new(ErrorCode::Internal, "internal error")))
                })
                .collect(),
            idle,
        }
    }

    /// `channel.close`: the route goes; binding and pending messages stay.
    pub async fn close_channel(&self, ident: &SessionIdent, channel_id: &str) -> Result<(), Fault> {
        self.hub
            .store
            .clear_channel_route_if(channel_id, &ident.socket_id, now_ms())
            .await?;
        Ok(())
    }

    /// The Descriptor of a channel as stored now.
    pub fn descriptor(&self, ch: &ChannelRecord) -> Descriptor {
        let view: TargetView = serde_json::from_value(ch.view.clone()).unwrap_or_default();
        Descriptor::build(
            self.provider.card(),
            &ch.connector_id,
            &ch.id,
            ch.profiles.clone(),
            ch.status,
            view,
        )
    }

    /// Re-reads a channel (after a doorbell) for a Descriptor push.
    pub async fn fresh_descriptor(&self, channel_id: &str) -> Result<Option<Descriptor>, Fault> {
        Ok(self
            .hub
            .store
            .get_channel(channel_id)
            .await?
            .map(|ch| self.descriptor(&ch)))
    }
}
