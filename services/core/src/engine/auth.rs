//! Auth sessions: `auth.start/status/cancel/logout` for form and QR flows, and the steps a
//! provider reports from outside the data plane (pairing pages, QR scans).

use serde_json::{Map, Value, json};
use switchyard_protocol::packet::{AuthCancelPayload, AuthStartPayload, AuthStatusPayload};
use switchyard_protocol::{ConnectionStatus, ErrorCode};

use super::{CardServices, Fault, MountedCard, ms};
use crate::bus::Doorbell;
use crate::crypto::rows;
use crate::ids::{new_id, now_ms};
use crate::model::{AuthSessionRecord, AuthStatus, ChannelRecord};
use crate::provider::{AuthPoll, AuthRequest, AuthStep, Binding, Provider};

impl MountedCard {
    pub async fn auth_start(
        &self,
        ch: &ChannelRecord,
        p: &AuthStartPayload,
    ) -> Result<Value, Fault> {
        let card = self.provider.card();
        let Some(flow) = card.flow(&p.flow_id) else {
            return Err(Fault::new(
                ErrorCode::UnknownAuthFlow,
                "flow_id is not an auth flow of this Card",
            ));
        };
        let now = now_ms();
        // Reusable login: a bound channel asked again without input is simply authenticated.
        if ch.binding.is_some() && p.input.is_empty() && ch.status.is_bound() {
            let rec = AuthSessionRecord {
                id: new_id("auth"),
                channel_id: ch.id.clone(),
                flow_id: flow.id.clone(),
                status: AuthStatus::Authenticated,
                state: None,
                public: json!({}),
                created_at: now,
                expires_at: now + ms(self.hub.config.auth_session_ttl),
            };
            self.hub.store.insert_auth_session(&rec).await?;
            return Ok(self.auth_ack(ch, &rec, Some(ch)));
        }
        self.supersede_sessions(&ch.id).await?;
        let mut rec = AuthSessionRecord {
            id: new_id("auth"),
            channel_id: ch.id.clone(),
            flow_id: flow.id.clone(),
            status: AuthStatus::Pending,
            state: None,
            public: json!({}),
            created_at: now,
            expires_at: now + ms(self.hub.config.auth_session_ttl),
        };
        self.hub.store.insert_auth_session(&rec).await?;
        let mut ch = ch.clone();
        if ch.binding.is_none() {
            self.hub
                .store
                .set_channel_status(&ch.id, ConnectionStatus::Authenticating, &ch.view, now)
                .await?;
            // Keep the local copy in step, so a failed step resets the stored status.
            ch.status = ConnectionStatus::Authenticating;
        }
        let step = self
            .provider
            .auth_start(AuthRequest {
                tenant_id: &ch.tenant_id,
                channel_id: &ch.id,
                auth_session_id: &rec.id,
                flow,
                input: &p.input,
            })
            .await
            .unwrap_or_else(|e| AuthStep::Failed {
                code: e.code.to_string(),
                message: e.message.clone(),
            });
        let ch = self
            .apply_step(Some(self.provider.as_ref()), &ch, &mut rec, step)
            .await?;
        Ok(self.auth_ack(&ch, &rec, Some(&ch)))
    }

    pub async fn auth_status(
        &self,
        ch: &ChannelRecord,
        p: &AuthStatusPayload,
    ) -> Result<Value, Fault> {
        let Some(session_id) = p.auth_session_id.as_deref().filter(|s| !s.is_empty()) else {
            // No session named: report the channel's own authentication state.
            let status = if ch.binding.is_some() {
                "authenticated"
            } else {
                "unauthenticated"
            };
            let mut out = Map::new();
            out.insert("connector_channel_id".into(), json!(ch.id));
            out.insert(
                "flow_id".into(),
                json!(p.flow_id.clone().unwrap_or_default()),
            );
            out.insert("status".into(), json!(status));
            if ch.binding.is_some() {
                out.insert("connection_descriptor".into(), json!(self.descriptor(ch)));
            }
            return Ok(Value::Object(out));
        };
        let mut rec = self.session_of(ch, session_id).await?;
        let now = now_ms();
        let mut ch = ch.clone();
        if !rec.status.is_terminal() && now >= rec.expires_at {
            rec.status = AuthStatus::Expired;
            if self.hub.store.update_open_auth_session(&rec).await? {
                ch = self.unbind_if_authenticating(&ch).await?;
            } else {
                rec = self.session_of(&ch, session_id).await?;
            }
        } else if !rec.status.is_terminal() {
            let flow = self.provider.card().flow(&rec.flow_id).cloned();
            if let Some(flow) = flow {
                let state = match &rec.state {
                    Some(blob) => self
                        .hub
                        .cipher
                        .decrypt_json(&rows::auth_session(&rec.id), blob)
                        .unwrap_or(Value::Null),
                    None => Value::Null,
                };
                let polled = self
                    .provider
                    .auth_poll(AuthPoll {
                        channel_id: &ch.id,
                        auth_session_id: &rec.id,
                        flow: &flow,
                        status: rec.status,
                        state: &state,
                        refresh: p.refresh,
                    })
                    .await
                    .unwrap_or_else(|e| {
                        Some(AuthStep::Failed {
                            code: e.code.to_string(),
                            message: e.message.clone(),
                        })
                    });
                if let Some(step) = polled {
                    ch = self
                        .apply_step(Some(self.provider.as_ref()), &ch, &mut rec, step)
                        .await?;
                }
            }
        }
        let fresh = self.hub.store.get_channel(&ch.id).await?.unwrap_or(ch);
        Ok(self.auth_ack(&fresh, &rec, Some(&fresh)))
    }

    pub async fn auth_cancel(
        &self,
        ch: &ChannelRecord,
        p: &AuthCancelPayload,
    ) -> Result<Value, Fault> {
        let auth_status = |c: &ChannelRecord| {
            if c.binding.is_some() {
                "authenticated"
            } else {
                "unauthenticated"
            }
        };
        let session_id = p.auth_session_id.clone().unwrap_or_default();
        let found = match self.session_of(ch, &session_id).await {
            Ok(rec) => Some(rec),
            Err(f) if f.code == ErrorCode::AuthSessionNotFound => None,
            Err(f) => return Err(f),
        };
        let mut out = json!({
            "connector_channel_id": ch.id,
            "auth_session_id": session_id,
        });
        match found {
            None => {
                out["status"] = json!("not_found");
                out["auth_status"] = json!(auth_status(ch));
                out["message"] = json!("no such authentication session on this channel");
            }
            Some(rec) if rec.status == AuthStatus::Authenticated => {
                out["status"] = json!("ignored");
                out["auth_status"] = json!("authenticated");
                out["message"] = json!("authentication already completed");
                out["connection_descriptor"] = json!(self.descriptor(ch));
            }
            Some(mut rec) => {
                if !rec.status.is_terminal() {
                    // What the flow showed (a QR code, a link, a code to type) must not be
                    // shown after a cancel, and its state must not complete a binding late.
                    rec.status = AuthStatus::Canceled;
                    rec.state = None;
                    rec.public =
                        json!({"message": "authentication canceled", "code": "auth_canceled"});
                    if !self.hub.store.update_open_auth_session(&rec).await? {
                        // It ended meanwhile (authenticated on another pod, say): answer
                        // as it is now.
                        let fresh = self.hub.store.get_channel(&ch.id).await?;
                        let fresh = fresh.unwrap_or_else(|| ch.clone());
                        return Box::pin(self.auth_cancel(&fresh, p)).await;
                    }
                }
                let ch = self.unbind_if_authenticating(ch).await?;
                out["status"] = json!("canceled");
                out["auth_status"] = json!(auth_status(&ch));
                out["message"] = json!("authentication canceled");
            }
        }
        Ok(out)
    }

    /// `auth.logout`: releases the target binding and clears the credentials.
    pub async fn auth_logout(&self, ch: &ChannelRecord) -> Result<Value, Fault> {
        // Local credentials go regardless: logout must not be blocked by the target.
        if let Some(binding) = self.decrypt_binding(ch)
            && let Err(e) = self.provider.release(&binding).await
        {
            tracing::warn!(code = %e.code, "provider release failed during logout");
        }
        self.supersede_sessions(&ch.id).await?;
        let now = now_ms();
        let view = json!({});
        self.hub
            .store
            .set_channel_binding(&ch.id, None, None, ConnectionStatus::Created, &view, now)
            .await?;
        self.binding_changed(&ch.id).await;
        let mut fresh = ch.clone();
        fresh.binding = None;
        fresh.binding_key = None;
        fresh.status = ConnectionStatus::Created;
        fresh.view = view;
        self.ring(
            &ch.connector_id,
            Doorbell::Descriptor {
                channel_id: ch.id.clone(),
            },
        )
        .await;
        Ok(json!({ "status": "ok", "connection_descriptor": self.descriptor(&fresh) }))
    }
}

impl CardServices {
    /// Applies a provider step to a session and its channel; returns the channel as stored.
    /// A channel that binds takes the status `provider` gives it ([`Provider::bound_status`]),
    /// `connected` without one (a step the provider reports itself through its services).
    pub(crate) async fn apply_step(
        &self,
        provider: Option<&dyn Provider>,
        ch: &ChannelRecord,
        rec: &mut AuthSessionRecord,
        step: AuthStep,
    ) -> Result<ChannelRecord, Fault> {
        // A session that ended while the provider was answering (an `auth.cancel` during a
        // long poll, on any pod) takes no late step: every write of the session below is
        // made only while the stored one is unfinished, and a channel binds only after its
        // session took the step.
        let now = now_ms();
        let mut ch = ch.clone();
        match step {
            AuthStep::Authenticated {
                credentials,
                view,
                binding_key,
            } => {
                if let Some(key) = &binding_key
                    && let Some(other) = self
                        .hub
                        .store
                        .find_channel_by_binding_key(&ch.tenant_id, &ch.card_id, key)
                        .await?
                    && other.id != ch.id
                {
                    rec.status = AuthStatus::Failed;
                    rec.public = json!({"message": "this target is already bound to another channel of this tenant", "code": "binding_conflict"});
                    if !self.hub.store.update_open_auth_session(rec).await? {
                        return self.ended_meanwhile(rec, ch).await;
                    }
                    return self.unbind_if_authenticating(&ch).await;
                }
                let pending = rec.clone();
                rec.status = AuthStatus::Authenticated;
                rec.state = None;
                rec.public = json!({"message": "authenticated"});
                if !self.hub.store.update_open_auth_session(rec).await? {
                    return self.ended_meanwhile(rec, ch).await;
                }
                let blob = self
                    .hub
                    .cipher
                    .encrypt_json(&rows::channel(&ch.id), &credentials);
                let view_json = json!(view);
                let status = match provider {
                    Some(p) => p.bound_status(&credentials).await,
                    None => ConnectionStatus::Connected,
                };
                if let Err(e) = self
                    .hub
                    .store
                    .set_channel_binding(
                        &ch.id,
                        Some(&blob),
                        binding_key.as_deref(),
                        status,
                        &view_json,
                        now,
                    )
                    .await
                {
                    // The session must not say authenticated for a channel left unbound.
                    *rec = AuthSessionRecord {
                        status: AuthStatus::Failed,
                        state: None,
                        public: json!({"message": "the binding could not be stored; start again", "code": "unavailable"}),
                        ..pending
                    };
                    let _ = self.hub.store.update_auth_session(rec).await;
                    return Err(e.into());
                }
                self.binding_changed(&ch.id).await;
                ch.binding = Some(blob);
                ch.binding_key = binding_key;
                ch.status = status;
                ch.view = view_json;
                self.ring(
                    &ch.connector_id,
                    Doorbell::Descriptor {
                        channel_id: ch.id.clone(),
                    },
                )
                .await;
                metrics::counter!("switchyard_auth_completed_total", "card" => self.card_id().to_owned()).increment(1);
            }
            AuthStep::Pending {
                status,
                qr_code_text,
                qr_code_image,
                message,
                poll_interval_ms,
                expires_at,
                state,
            } => {
                rec.status = status;
                rec.state = Some(
                    self.hub
                        .cipher
                        .encrypt_json(&rows::auth_session(&rec.id), &state),
                );
                rec.expires_at = expires_at
                    .min(now + ms(self.hub.config.auth_session_ttl))
                    .max(now);
                rec.public = json!({
                    "qr_code_text": qr_code_text,
                    "qr_code_image": qr_code_image,
                    "message": message,
                    "poll_interval_millis": poll_interval_ms,
                });
                if !self.hub.store.update_open_auth_session(rec).await? {
                    return self.ended_meanwhile(rec, ch).await;
                }
            }
            AuthStep::Failed { code, message } => {
                rec.status = AuthStatus::Failed;
                rec.state = None;
                rec.public = json!({"message": message, "code": code});
                if !self.hub.store.update_open_auth_session(rec).await? {
                    return self.ended_meanwhile(rec, ch).await;
                }
                ch = self.unbind_if_authenticating(&ch).await?;
            }
        }
        Ok(ch)
    }

    /// The session ended while its step was on its way: it is read back as it is, and the
    /// channel is left as it is.
    async fn ended_meanwhile(
        &self,
        rec: &mut AuthSessionRecord,
        ch: ChannelRecord,
    ) -> Result<ChannelRecord, Fault> {
        if let Some(current) = self.hub.store.get_auth_session(&rec.id).await? {
            *rec = current;
        }
        Ok(ch)
    }
}

impl MountedCard {
    /// Payload of `auth.start.ack` / `auth.status.ack`.
    fn auth_ack(
        &self,
        ch: &ChannelRecord,
        rec: &AuthSessionRecord,
        with_descriptor: Option<&ChannelRecord>,
    ) -> Value {
        let mut out = Map::new();
        out.insert("connector_channel_id".into(), json!(ch.id));
        out.insert("flow_id".into(), json!(rec.flow_id));
        out.insert("auth_session_id".into(), json!(rec.id));
        // `canceled` is not an auth status on the wire; a canceled session reads as failed.
        let status = match rec.status {
            AuthStatus::Canceled => "failed",
            s => s.as_str(),
        };
        out.insert("status".into(), json!(status));
        out.insert("expires_at".into(), json!(rec.expires_at));
        if let Value::Object(public) = &rec.public {
            for (k, v) in public {
                if !v.is_null() && k != "code" {
                    out.insert(k.clone(), v.clone());
                }
            }
        }
        if rec.status == AuthStatus::Authenticated
            && let Some(c) = with_descriptor
        {
            out.insert("connection_descriptor".into(), json!(self.descriptor(c)));
        }
        Value::Object(out)
    }

    async fn session_of(&self, ch: &ChannelRecord, id: &str) -> Result<AuthSessionRecord, Fault> {
        match self.hub.store.get_auth_session(id).await? {
            Some(rec) if rec.channel_id == ch.id => Ok(rec),
            _ => Err(Fault::new(
                ErrorCode::AuthSessionNotFound,
                "authentication session not found",
            )),
        }
    }

    /// A new flow replaces unfinished ones of the same channel.
    async fn supersede_sessions(&self, channel_id: &str) -> Result<(), Fault> {
        for mut old in self.hub.store.open_auth_sessions(channel_id).await? {
            old.status = AuthStatus::Canceled;
            old.state = None;
            old.public = json!({
                "message": "replaced by a newer authentication on this channel",
                "code": "auth_canceled"
            });
            // One that finished meanwhile (on another pod) stays as it finished.
            self.hub.store.update_open_auth_session(&old).await?;
        }
        Ok(())
    }
}

impl CardServices {
    /// An unbound channel that was authenticating goes back to `created`.
    async fn unbind_if_authenticating(&self, ch: &ChannelRecord) -> Result<ChannelRecord, Fault> {
        let mut ch = ch.clone();
        if ch.binding.is_none() && ch.status != ConnectionStatus::Created {
            ch.status = ConnectionStatus::Created;
            self.hub
                .store
                .set_channel_status(&ch.id, ConnectionStatus::Created, &ch.view, now_ms())
                .await?;
        }
        Ok(ch)
    }

    /// Decrypts a channel's credentials for a provider call.
    pub(crate) fn decrypt_binding(&self, ch: &ChannelRecord) -> Option<Binding> {
        let blob = ch.binding.as_ref()?;
        match self.hub.cipher.decrypt_json(&rows::channel(&ch.id), blob) {
            Ok(credentials) => Some(Binding {
                channel_id: ch.id.clone(),
                tenant_id: ch.tenant_id.clone(),
                credentials,
            }),
            Err(e) => {
                tracing::error!(error = %e, "channel credentials cannot be decrypted with the configured keys");
                None
            }
        }
    }

    /// Marks a channel's target status (revoked, degraded...) and pushes the Descriptor when
    /// it changed.
    pub(crate) async fn set_status(
        &self,
        ch: &ChannelRecord,
        status: ConnectionStatus,
    ) -> Result<(), Fault> {
        Ok(self.hub.set_channel_status(ch, status).await?)
    }
}
