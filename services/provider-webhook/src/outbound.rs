//! Posting messages to a channel's endpoint, and the channel health that follows from it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use serde::Serialize;
use switchyard_core::ProviderServices;
use switchyard_core::limits;
use switchyard_core::netguard::{OutboundPolicy, Refused};
use switchyard_core::provider::{OutboundFile, ProviderError};
use switchyard_protocol::ConnectionStatus;

use crate::binding::Credentials;
use switchyard_webhook_signing::{self as signing, SIGNATURE_HEADER, TIMESTAMP_HEADER};

/// Consecutive transient failures from which the target is reported offline.
const OFFLINE_AFTER: u64 = 3;
const FAILURE_TTL: Duration = Duration::from_secs(3600);

#[derive(Serialize)]
struct Payload<'a> {
    message_id: &'a str,
    connector_channel_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    files: Vec<FilePayload<'a>>,
}

#[derive(Serialize)]
struct FilePayload<'a> {
    file_ref: &'a str,
    filename: &'a str,
    mime_type: &'a str,
    byte_size: u64,
    download_url: &'a str,
}

pub(crate) struct Message<'a> {
    pub channel_id: &'a str,
    pub message_id: &'a str,
    pub text: Option<&'a str>,
    pub files: &'a [OutboundFile],
}

/// How a post ended, as far as the endpoint's health is concerned.
enum Outcome {
    Accepted,
    /// The endpoint answered, but refused; it is reachable.
    Refused(u16),
    /// 5xx, timeout or no connection.
    Unavailable(ProviderError),
    /// The endpoint is an internal address the outbound policy refuses; not retryable.
    Blocked(ProviderError),
}

pub(crate) struct Sender {
    client: reqwest::Client,
    timeout: Duration,
    policy: Arc<OutboundPolicy>,
}

/// Resolves endpoint names and drops every address the outbound policy refuses, so a name
/// that resolves (or re-resolves, DNS rebinding) to an internal address is never connected.
struct GuardedResolver {
    policy: Arc<OutboundPolicy>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let found = tokio::net::lookup_host((name.as_str(), 0)).await?;
            let allowed: Vec<SocketAddr> =
                found.filter(|a| policy.check_ip(a.ip()).is_ok()).collect();
            if allowed.is_empty() {
                return Err(
                    Box::new(Refused::NoAllowedAddress) as Box<dyn std::error::Error + Send + Sync>
                );
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// True when the request failed because the guard refused every address.
fn refused_by_guard(e: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<Refused>() {
            return true;
        }
        source = err.source();
    }
    false
}

impl Sender {
    pub fn new(timeout: Duration, policy: OutboundPolicy) -> Self {
        let policy = Arc::new(policy);
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .dns_resolver(Arc::new(GuardedResolver {
                policy: policy.clone(),
            }))
            // A proxy would resolve the endpoint itself, beyond the guard.
            .no_proxy()
            // A redirect would replay a signed body to a URL nobody validated (or drop it as a
            // GET); the endpoint must answer itself.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("switchyard-webhook/", env!("CARGO_PKG_VERSION")))
            .build()
            // Only fails when the TLS backend cannot initialise, which is a broken build.
            .expect("reqwest client with static settings");
        Self {
            client,
            timeout,
            policy,
        }
    }

    /// Posts one message; its health is reported to `services`.
    pub async fn send(
        &self,
        services: &dyn ProviderServices,
        creds: &Credentials,
        msg: Message<'_>,
    ) -> Result<(), ProviderError> {
        let outcome = self.post(creds, &msg).await;
        track_health(
            services,
            msg.channel_id,
            matches!(outcome, Outcome::Unavailable(_) | Outcome::Blocked(_)),
        )
        .await;
        match outcome {
            Outcome::Accepted => Ok(()),
            Outcome::Refused(status) => Err(ProviderError::rejected(format!(
                "endpoint answered {status}"
            ))),
            Outcome::Unavailable(e) | Outcome::Blocked(e) => Err(e),
        }
    }

    async fn post(&self, creds: &Credentials, msg: &Message<'_>) -> Outcome {
        // Addresses written in the URL are never resolved, so the resolver cannot see them;
        // bindings made before the guard existed are caught here too.
        if self.policy.check_url(&creds.endpoint).is_err() {
            return blocked(msg.channel_id);
        }
        let payload = Payload {
            message_id: msg.message_id,
            connector_channel_id: msg.channel_id,
            text: msg.text.filter(|t| !t.is_empty()),
            files: msg
                .files
                .iter()
                .map(|f| FilePayload {
                    file_ref: &f.record.file_ref,
                    filename: &f.record.filename,
                    mime_type: &f.record.mime_type,
                    byte_size: f.record.byte_size,
                    download_url: &f.download_url,
                })
                .collect(),
        };
        let body = match serde_json::to_vec(&payload) {
            Ok(b) => b,
            Err(_) => {
                return Outcome::Unavailable(ProviderError::transient(
                    "the message could not be encoded",
                ));
            }
        };
        let ts = signing::unix_now();
        let signature = signing::sign(creds.secret.expose().as_bytes(), ts, &body);
        let mut request = self
            .client
            .post(creds.endpoint.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(TIMESTAMP_HEADER, ts.to_string())
            .header(SIGNATURE_HEADER, signature);
        // The chat system's traces join the message's (W3C traceparent), when it is traced.
        if let Some((name, value)) = switchyard_core::trace::outgoing() {
            request = request.header(name, value);
        }
        let result = request.body(body).send().await;
        // reqwest's errors print the URL, whose path or query may hold a token: only the
        // category of a failure is ever logged or returned.
        match result {
            Ok(resp) if resp.status().is_success() => Outcome::Accepted,
            Ok(resp) if resp.status().is_server_error() => {
                let status = resp.status().as_u16();
                tracing::warn!(
                    connector_channel_id = msg.channel_id,
                    status,
                    "webhook endpoint failed"
                );
                Outcome::Unavailable(ProviderError::transient(format!(
                    "endpoint answered {status}"
                )))
            }
            Ok(resp) => {
                let status = resp.status().as_u16();
                tracing::info!(
                    connector_channel_id = msg.channel_id,
                    status,
                    "webhook endpoint refused message"
                );
                Outcome::Refused(status)
            }
            Err(e) if refused_by_guard(&e) => blocked(msg.channel_id),
            Err(e) => {
                let (kind, text) = if e.is_timeout() {
                    (
                        "timeout",
                        format!(
                            "endpoint did not answer within {} ms",
                            self.timeout.as_millis()
                        ),
                    )
                } else if e.is_connect() {
                    ("connect", "endpoint could not be reached".to_owned())
                } else {
                    ("request", "request to the endpoint failed".to_owned())
                };
                tracing::warn!(
                    connector_channel_id = msg.channel_id,
                    kind,
                    "webhook endpoint unreachable"
                );
                Outcome::Unavailable(ProviderError::transient(text))
            }
        }
    }
}

fn blocked(channel_id: &str) -> Outcome {
    limits::hit("outbound_private_address");
    tracing::warn!(
        connector_channel_id = channel_id,
        "webhook endpoint refused: internal address"
    );
    Outcome::Blocked(ProviderError::rejected(
        "endpoint_url resolves to a loopback, private, link-local or otherwise internal address; the operator can allow its range with outbound.allow_private",
    ))
}

fn failure_key(channel_id: &str) -> String {
    format!("webhook:fail:{channel_id}")
}

/// Health is best effort: a failing ephemeral store or status update never fails a delivery.
async fn track_health(services: &dyn ProviderServices, channel_id: &str, failed: bool) {
    let eph = services.ephemeral();
    let key = failure_key(channel_id);
    let status = if failed {
        match eph.incr(&key, FAILURE_TTL).await {
            Ok(n) if n >= OFFLINE_AFTER => ConnectionStatus::Offline,
            Ok(_) => ConnectionStatus::Degraded,
            Err(e) => {
                tracing::warn!(connector_channel_id = channel_id, error = %e, "webhook failure counter unavailable");
                ConnectionStatus::Degraded
            }
        }
    } else {
        match eph.get(&key).await {
            Ok(None) => return,
            Ok(Some(_)) => {
                if let Err(e) = eph.delete(&key).await {
                    tracing::warn!(connector_channel_id = channel_id, error = %e, "webhook failure counter not reset");
                }
                ConnectionStatus::Connected
            }
            Err(e) => {
                tracing::warn!(connector_channel_id = channel_id, error = %e, "webhook failure counter unavailable");
                return;
            }
        }
    };
    if let Err(e) = services.set_target_status(channel_id, status).await {
        tracing::warn!(connector_channel_id = channel_id, status = status.as_str(), error = %e, "target status not updated");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names are judged by the addresses they resolve to, at connect time (DNS rebinding).
    #[tokio::test]
    async fn the_resolver_drops_internal_addresses() {
        let strict = GuardedResolver {
            policy: Arc::new(OutboundPolicy::default()),
        };
        let name: Name = "localhost".parse().unwrap();
        let err = strict.resolve(name).await.err().expect("refused");
        assert!(err.is::<Refused>(), "{err}");
        let allowed = GuardedResolver {
            policy: Arc::new(OutboundPolicy::new(vec!["127.0.0.0/8".parse().unwrap()])),
        };
        let addrs: Vec<SocketAddr> = allowed
            .resolve("localhost".parse().unwrap())
            .await
            .unwrap()
            .collect();
        assert!(!addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback()));
    }
}
