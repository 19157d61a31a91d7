//! What provider crates' tests share: a [`Cluster`] of test pods, each running the real
//! engine's provider services (`CardServices` on a hub of its own) over one in-memory store,
//! bus, ephemeral store and file folder; a [`ProviderPod`] that runs a provider on one of
//! them as the core would; a log capture to grep for secrets; bounded waits; and the
//! provider conformance suite ([`provider_conformance_tests!`](crate::provider_conformance_tests)).
//!
//! So the rules a provider meets in its tests are the engine's own: inbound messages dedupe
//! per channel and message id before the queue cap is checked, only bound channels take
//! inbound messages, leases are renewed by their holder and taken over once expired with a
//! new generation, auth sessions stop answering once terminal. What a test cannot cause on
//! cue is a switch: every queue at its cap ([`Cluster::set_full`]), a pod's commit backlog
//! full (`Cluster::overloaded`), a dead pod (`FakeServices::dead`).

mod cluster;
pub mod conformance;
mod logs;
mod pod;
mod services;

use std::time::Duration;

use switchyard_protocol::BuildInfo;

use crate::provider::{InboundMessage, ProgressSink};

pub use cluster::{AuthSession, CARD, Cluster, StoredFile};
pub use logs::{captured_logs, init_logs, init_logs_with};
pub use pod::ProviderPod;
pub use services::FakeServices;

/// The tenant every binding of a test cluster belongs to.
pub const TENANT: &str = "ten_1";

/// The bound of the waits of provider tests.
pub const WAIT: Duration = Duration::from_secs(10);

/// The build a test provider reports in its Card.
pub fn build_info() -> BuildInfo {
    BuildInfo {
        version: "0.1.0".into(),
        git_tag: "v0.1.0".into(),
        git_rev: "abc1234".into(),
        build_time: "2607241200".into(),
    }
}

/// A progress sink that drops what it is told.
pub struct NoProgress;

impl ProgressSink for NoProgress {
    fn progress(&self, _status: &str, _message: &str, _progress: Option<f64>) {}
}

/// Polls `f` every 20 ms until it yields `Some`, or panics after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `n` inbound messages are stored in the cluster; returns them.
pub async fn inbound_n(cluster: &Cluster, n: usize) -> Vec<(String, InboundMessage)> {
    eventually(WAIT, &format!("{n} inbound messages"), || async {
        let got = cluster.inbound();
        (got.len() >= n).then_some(got)
    })
    .await
}

/// The file type of `chat.message.files[]` a MIME type maps to.
fn file_type(mime: &str) -> &'static str {
    match mime.split('/').next() {
        Some("image") => "image",
        Some("video") => "video",
        Some("audio") => "audio",
        _ => "file",
    }
}
