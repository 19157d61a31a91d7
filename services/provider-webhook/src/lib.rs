//! Generic webhook IM provider (`im.webhook`): binds chat systems that have no dedicated
//! provider through two signed HTTP webhooks, one per direction (CONTRACT.md, "The generic
//! webhook IM").
//!
//! The [`Provider`] trait hands the services only to [`Provider::ingress`], while delivery,
//! tools and pairing also need it (health, files, the public URL). The provider therefore
//! keeps the services it is given at mount time; [`WebhookProvider::attach`] does the same for
//! callers that never mount ingress.

mod binding;
mod card;
mod ingress;
mod outbound;
mod pairing;

/// Entry points of the fuzz targets (`fuzz/`): the parsers of pre-authentication input.
#[doc(hidden)]
pub mod fuzzing {
    /// A JSON webhook body through parse, file decoding and validation.
    pub fn json_message(raw: &[u8]) -> Result<usize, String> {
        crate::ingress::check_json_message(raw)
    }
    /// A multipart body through the part scanner, fed in `chunk`-byte pieces.
    pub fn multipart(boundary: &str, body: &[u8], chunk: usize) -> bool {
        crate::ingress::scan_multipart(boundary, body, chunk)
    }
}

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use switchyard_core::ProviderServices;
use switchyard_core::crypto::sha256_hex;
pub use switchyard_core::netguard::{Cidr, OutboundPolicy};
use switchyard_core::provider::{
    AuthRequest, AuthStep, Binding, OutboundMessage, Provider, ProviderError, ProviderErrorKind,
    ServicesError, ToolCall,
};
use switchyard_protocol::im::ActivityStatus;
use switchyard_protocol::{BuildInfo, Card, ErrorCode};

use crate::binding::Credentials;
pub use crate::card::{CARD_ID, FLOW_BINDING, FLOW_PAIRING, TOOL_FILE_SEND, TOOL_MESSAGE_SEND};

pub const PREFIX: &str = "/webhook";

#[derive(Debug, Clone)]
pub struct WebhookConfig {
    pub build: BuildInfo,
    pub api_key_required: bool,
    /// Largest inbound multipart body, files included (file parts stream to the file store).
    pub max_inbound_bytes: u64,
    /// Largest inbound JSON body (and multipart `message` part), held until verified.
    pub max_inbound_json_bytes: u64,
    /// Time allowed to receive an inbound body.
    pub inbound_body_timeout: Duration,
    /// After this much of the body time, an inbound body must have come at
    /// `inbound_min_body_rate` on average.
    pub inbound_body_grace: Duration,
    /// Slowest average an inbound body may arrive at after the grace, in bytes a second
    /// (0 = only the timeout).
    pub inbound_min_body_rate: u64,
    /// Inbound requests in flight per pod; more are answered 503.
    pub max_inbound_concurrent: usize,
    /// Inbound requests in flight per tenant; more are answered 429.
    pub max_inbound_concurrent_per_tenant: usize,
    /// Inbound requests in flight per channel; more are answered 429.
    pub max_inbound_concurrent_per_channel: usize,
    /// Which internal address ranges an endpoint may reach (none by default).
    pub outbound: OutboundPolicy,
    /// Whole-request timeout of an outbound post.
    pub request_timeout: Duration,
    /// Lifetime of a pairing link.
    pub pairing_ttl: Duration,
}

impl WebhookConfig {
    /// The defaults: 20 MiB multipart and 1 MiB JSON inbound within 30 s and at 4 KiB/s
    /// after the first 2 s, 64 inbound requests in flight per pod, 16 per tenant and 8 per
    /// channel, no internal endpoints, 10 s outbound timeout, 10 min pairing links.
    pub fn new(build: BuildInfo, api_key_required: bool) -> Self {
        Self {
            build,
            api_key_required,
            max_inbound_bytes: 20 * 1024 * 1024,
            max_inbound_json_bytes: 1024 * 1024,
            inbound_body_timeout: Duration::from_secs(30),
            inbound_body_grace: Duration::from_secs(2),
            inbound_min_body_rate: 4096,
            max_inbound_concurrent: 64,
            max_inbound_concurrent_per_tenant: 16,
            max_inbound_concurrent_per_channel: 8,
            outbound: OutboundPolicy::default(),
            request_timeout: Duration::from_secs(10),
            pairing_ttl: Duration::from_secs(600),
        }
    }
}

pub struct WebhookProvider {
    card: Card,
    skill: String,
    ingress_limits: Arc<ingress::IngressLimits>,
    outbound: OutboundPolicy,
    pairing_ttl: Duration,
    sender: outbound::Sender,
    services: Arc<dyn ProviderServices>,
}

impl WebhookProvider {
    pub fn new(cfg: WebhookConfig, services: Arc<dyn ProviderServices>) -> Self {
        Self {
            card: card::build(cfg.build, cfg.api_key_required),
            skill: card::skill(),
            ingress_limits: Arc::new(ingress::IngressLimits::new(
                cfg.max_inbound_json_bytes,
                cfg.max_inbound_bytes,
                switchyard_core::bounded_body::Pace {
                    timeout: cfg.inbound_body_timeout,
                    grace: cfg.inbound_body_grace,
                    min_rate: cfg.inbound_min_body_rate,
                },
                switchyard_core::admission::IngressShares {
                    per_pod: cfg.max_inbound_concurrent,
                    per_tenant: cfg.max_inbound_concurrent_per_tenant,
                    per_channel: cfg.max_inbound_concurrent_per_channel,
                },
            )),
            pairing_ttl: cfg.pairing_ttl,
            sender: outbound::Sender::new(cfg.request_timeout, cfg.outbound.clone()),
            outbound: cfg.outbound,
            services,
        }
    }

    async fn send(
        &self,
        binding: &Binding,
        msg: outbound::Message<'_>,
    ) -> Result<(), ProviderError> {
        let creds = credentials(binding)?;
        self.sender.send(self.services.as_ref(), &creds, msg).await
    }
}

fn internal(message: &str) -> ProviderError {
    ProviderError::new(ProviderErrorKind::Internal, ErrorCode::Internal, message)
}

fn credentials(binding: &Binding) -> Result<Credentials, ProviderError> {
    Credentials::from_stored(&binding.credentials).ok_or_else(|| {
        tracing::error!(connector_channel_id = %binding.channel_id, "webhook binding has unreadable credentials");
        internal("the channel's binding is unreadable; bind it again")
    })
}

/// The same logical call always yields the same id, so the endpoint can drop a retried send.
fn tool_message_id(idempotency_key: &str) -> String {
    format!("tool_{}", &sha256_hex(idempotency_key.as_bytes())[..32])
}

fn str_arg<'a>(args: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, ProviderError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(_) => Err(ProviderError::invalid(format!("{name} must be a string"))),
    }
}

fn required_str<'a>(args: &'a Map<String, Value>, name: &str) -> Result<&'a str, ProviderError> {
    str_arg(args, name)?
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            ProviderError::invalid(format!("{name} is required and must be a non-empty string"))
        })
}

#[async_trait]
impl Provider for WebhookProvider {
    fn card(&self) -> &Card {
        &self.card
    }

    fn skill(&self) -> Option<&str> {
        Some(&self.skill)
    }

    fn prefix(&self) -> &'static str {
        PREFIX
    }

    async fn auth_start(&self, req: AuthRequest<'_>) -> Result<AuthStep, ProviderError> {
        match req.flow.id.as_str() {
            FLOW_BINDING => Ok(
                match Credentials::from_new_input(req.input, &self.outbound) {
                    Ok(creds) => creds.into_step(),
                    Err(m) => AuthStep::Failed {
                        code: "invalid_input".into(),
                        message: m.into(),
                    },
                },
            ),
            FLOW_PAIRING => {
                let base = self.services.public_base_url();
                pairing::start(&base, PREFIX, req.auth_session_id, self.pairing_ttl)
            }
            _ => Err(ProviderError::new(
                ProviderErrorKind::InvalidInput,
                ErrorCode::UnknownAuthFlow,
                "unknown auth flow",
            )),
        }
    }

    async fn invoke_tool(&self, call: ToolCall<'_>) -> Result<Value, ProviderError> {
        let message_id = tool_message_id(call.idempotency_key);
        let channel_id = call.binding.channel_id.as_str();
        match call.tool_id {
            TOOL_MESSAGE_SEND => {
                let text = required_str(call.arguments, "text")?;
                let msg = outbound::Message {
                    channel_id,
                    message_id: &message_id,
                    text: Some(text),
                    files: &[],
                };
                self.send(call.binding, msg).await?;
            }
            TOOL_FILE_SEND => {
                let file_ref = required_str(call.arguments, "file_ref")?;
                let text = str_arg(call.arguments, "text")?;
                // Only the metadata and signed URL are sent: the endpoint fetches the bytes.
                let (file, _bytes) = self.services.open_file(channel_id, file_ref).await.map_err(|e| match e {
                    ServicesError::Full | ServicesError::Overloaded | ServicesError::Backend(_) => {
                        tracing::warn!(connector_channel_id = channel_id, error = %e, "file lookup failed");
                        ProviderError::new(ProviderErrorKind::Transient, ErrorCode::Unavailable, "file storage is unavailable")
                    }
                    _ => ProviderError::new(
                        ProviderErrorKind::InvalidInput,
                        ErrorCode::FileNotFound,
                        "file_ref is not a file uploaded to this channel",
                    ),
                })?;
                let files = [file];
                let msg = outbound::Message {
                    channel_id,
                    message_id: &message_id,
                    text,
                    files: &files,
                };
                self.send(call.binding, msg).await?;
            }
            other => {
                return Err(ProviderError::new(
                    ProviderErrorKind::InvalidInput,
                    ErrorCode::UnknownTool,
                    format!("unknown tool {other}"),
                ));
            }
        }
        Ok(json!({"status": "sent", "message_id": message_id}))
    }

    async fn deliver(&self, msg: OutboundMessage<'_>) -> Result<(), ProviderError> {
        let out = outbound::Message {
            channel_id: &msg.binding.channel_id,
            message_id: msg.message_id,
            text: msg.text,
            files: msg.files,
        };
        self.send(msg.binding, out).await
    }

    /// The webhook contract has no typing indicator.
    async fn activity(
        &self,
        _binding: &Binding,
        _status: ActivityStatus,
    ) -> Result<(), ProviderError> {
        Ok(())
    }

    /// Nothing is registered at the endpoint; forgetting the credentials is the core's job.
    async fn release(&self, _binding: &Binding) -> Result<(), ProviderError> {
        Ok(())
    }

    fn ingress(&self) -> Option<axum::Router> {
        Some(ingress::router(ingress::IngressState {
            services: self.services.clone(),
            limits: self.ingress_limits.clone(),
            outbound: self.outbound.clone(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_ids_are_stable() {
        let a = tool_message_id("call-1");
        assert_eq!(a, tool_message_id("call-1"));
        assert_ne!(a, tool_message_id("call-2"));
        assert_eq!(a.len(), 5 + 32);
        assert!(a.starts_with("tool_"));
    }
}
