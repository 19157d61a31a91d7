//! Posting messages to a channel's endpoint, and the channel health that follows from it.

use std::time::Duration;

use serde::Serialize;
use switchyard_core::ProviderHost;
use switchyard_core::provider::{OutboundFile, ProviderError};
use switchyard_protocol::ConnectionStatus;

use crate::binding::Credentials;
use crate::signing::{self, SIGNATURE_HEADER, TIMESTAMP_HEADER};

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
}

pub(crate) struct Sender {
    client: reqwest::Client,
    timeout: Duration,
}

impl Sender {
    pub fn new(timeout: Duration) -> Self {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            // A redirect would replay a signed body to a URL nobody validated (or drop it as a
            // GET); the endpoint must answer itself.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("switchyard-webhook/", env!("CARGO_PKG_VERSION")))
            .build()
            // Only fails when the TLS backend cannot initialise, which is a broken build.
            .expect("reqwest client with static settings");
        Self { client, timeout }
    }

    /// Posts one message; health is reported to `host` when one is attached.
    pub async fn send(
        &self,
        host: Option<&dyn ProviderHost>,
        creds: &Credentials,
        msg: Message<'_>,
    ) -> Result<(), ProviderError> {
        let outcome = self.post(creds, &msg).await;
        if let Some(host) = host {
            track_health(
                host,
                msg.channel_id,
                matches!(outcome, Outcome::Unavailable(_)),
            )
            .await;
        }
        match outcome {
            Outcome::Accepted => Ok(()),
            Outcome::Refused(status) => Err(ProviderError::rejected(format!(
                "endpoint answered {status}"
            ))),
            Outcome::Unavailable(e) => Err(e),
        }
    }

    async fn post(&self, creds: &Credentials, msg: &Message<'_>) -> Outcome {
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
        let result = self
            .client
            .post(creds.endpoint.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(TIMESTAMP_HEADER, ts.to_string())
            .header(SIGNATURE_HEADER, signature)
            .body(body)
            .send()
            .await;
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

fn failure_key(channel_id: &str) -> String {
    format!("webhook:fail:{channel_id}")
}

/// Health is best effort: a failing ephemeral store or status update never fails a delivery.
async fn track_health(host: &dyn ProviderHost, channel_id: &str, failed: bool) {
    let eph = host.ephemeral();
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
    if let Err(e) = host.set_target_status(channel_id, status).await {
        tracing::warn!(connector_channel_id = channel_id, status = status.as_str(), error = %e, "target status not updated");
    }
}
