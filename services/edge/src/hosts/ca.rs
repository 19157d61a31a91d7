//! The deployment's host CA: configured, or generated once and shared by every pod through
//! the store.

use std::time::Duration;

use anyhow::{Context as _, bail};
use switchyard_core::engine::Hub;
use switchyard_core::ids::now_ms;
use switchyard_hosts_tls::pki::HostCa;

use crate::config::Config;

/// The host CA: configured (PEM text or file path), or generated once per deployment and
/// kept in the store, encrypted with the encryption key, so every pod uses the same one.
pub async fn host_ca(cfg: &Config, hub: &Hub) -> anyhow::Result<HostCa> {
    fn pem_or_file(v: &str) -> anyhow::Result<String> {
        if v.trim_start().starts_with("-----BEGIN") {
            Ok(v.to_owned())
        } else {
            std::fs::read_to_string(v).with_context(|| format!("reading {v}"))
        }
    }
    if let (Some(c), Some(k)) = (&cfg.hosts_ca_cert, &cfg.hosts_ca_key) {
        return HostCa::from_pem(&pem_or_file(c)?, &pem_or_file(k)?).context("host CA");
    }
    use switchyard_core::crypto::rows;
    const NS: &str = "hosts";
    const KEY: &str = "ca";
    let load = |stored: &str| -> anyhow::Result<HostCa> {
        use base64::Engine as _;
        let blob = base64::engine::general_purpose::STANDARD.decode(stored)?;
        let v = hub
            .cipher()
            .decrypt_json(&rows::kv(NS, KEY), &blob)
            .context("decrypting the stored host CA")?;
        let cert = v["cert"].as_str().unwrap_or_default();
        let key = v["key"].as_str().unwrap_or_default();
        HostCa::from_pem(cert, key).context("stored host CA")
    };
    for _ in 0..50 {
        if let Some(stored) = hub.store().kv_get(NS, KEY).await? {
            return load(&stored);
        }
        // One pod generates; the others wait for it.
        let lease = hub
            .store()
            .acquire_lease("hosts-ca-init", hub.pod_id(), 10_000, now_ms())
            .await?;
        if lease.is_some() {
            if let Some(stored) = hub.store().kv_get(NS, KEY).await? {
                return load(&stored);
            }
            let ca = HostCa::generate("Switchyard host CA").context("generating the host CA")?;
            use base64::Engine as _;
            let blob = hub.cipher().encrypt_json(
                &rows::kv(NS, KEY),
                &serde_json::json!({"cert": ca.cert_pem(), "key": ca.key_pem()}),
            );
            hub.store()
                .kv_put(
                    NS,
                    KEY,
                    &base64::engine::general_purpose::STANDARD.encode(blob),
                )
                .await?;
            let _ = hub
                .store()
                .release_lease("hosts-ca-init", hub.pod_id())
                .await;
            tracing::info!("generated the deployment's host CA");
            return Ok(ca);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("another pod holds the host CA initialisation lease and did not finish")
}
