//! The fake chat system: the `endpoint_url` every channel is bound to, one endpoint per
//! tenant (`/hook/<n>`, checked against that tenant's secret). The server is
//! `switchyard-fake-webhook` in strict mode (401 on a bad signature, 400 on a body that is not
//! a message, downloading attached files to check they are really there); this module only
//! counts the posts by flow, from the stamp in their text.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use serde::Serialize;
use switchyard_fake_webhook::FakeWebhook;

use crate::stats::{Flows, parse_stamp};

/// What the target saw, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct TargetReport {
    pub posts: u64,
    pub bad_signature: u64,
    pub malformed: u64,
    pub unknown_flow: u64,
    pub file_downloads_ok: u64,
    pub file_download_failures: BTreeMap<String, u64>,
}

pub struct Target {
    fake: FakeWebhook,
    unknown_flow: Arc<AtomicU64>,
}

impl Target {
    /// Listens on `listen`; channels are bound to `public_url` (default `http://<bound
    /// address>`), the address by which the pods reach this server.
    pub async fn start(
        secrets: Vec<String>,
        flows: Arc<Flows>,
        listen: &str,
        public_url: Option<&str>,
    ) -> anyhow::Result<Self> {
        let unspecified = listen
            .parse::<SocketAddr>()
            .is_ok_and(|a| a.ip().is_unspecified());
        if unspecified && public_url.is_none() {
            anyhow::bail!(
                "--webhook-listen {listen} is not an address the pods can post to; give --webhook-public-url"
            );
        }
        let unknown_flow = Arc::new(AtomicU64::new(0));
        let unknown = unknown_flow.clone();
        let mut fake = FakeWebhook::builder()
            .listen(listen)
            .public_url(public_url)
            .strict()
            .no_record()
            .fetch_files()
            .on_message(move |m| {
                let stamp = m.text.as_deref().and_then(parse_stamp);
                let flow = match stamp.map(|(f, _)| f) {
                    Some("out") => &flows.outbound,
                    Some("tool") => &flows.tool,
                    Some("file") => &flows.file,
                    _ => {
                        unknown.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                };
                flow.delivered(&m.message_id, stamp.map(|(_, ts)| ts));
            });
        for (i, secret) in secrets.iter().enumerate() {
            fake = fake.endpoint(&format!("/hook/{i}"), Some(secret));
        }
        let fake = fake
            .start()
            .await
            .with_context(|| format!("fake webhook target: listening on {listen}"))?;
        Ok(Self { fake, unknown_flow })
    }

    /// The `endpoint_url` for tenant `index`.
    pub fn endpoint(&self, index: usize) -> String {
        format!("{}/hook/{index}", self.fake.base())
    }

    pub fn base(&self) -> &str {
        self.fake.base()
    }

    pub fn report(&self) -> TargetReport {
        let s = self.fake.stats();
        TargetReport {
            posts: s.posts,
            bad_signature: s.bad_signature,
            // A post to no tenant's endpoint is as malformed as a body that is no message.
            malformed: s.malformed + s.unknown_endpoint,
            unknown_flow: self.unknown_flow.load(Ordering::Relaxed),
            file_downloads_ok: s.file_downloads_ok,
            file_download_failures: s.file_download_failures,
        }
    }
}
