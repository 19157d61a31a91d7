//! Credentials a target refused (a revoked or replaced token, an uninstalled app), by their
//! fingerprint: kept durably in the provider's key/value store (`revoked:<fingerprint>`, so a
//! restarted pod and every other pod know it too) and in memory (so a supervisor that reloads
//! its bound bots reads each mark once, not once per binding every time). Which channels hold
//! the credentials, and what their status becomes, stays the provider's: only it can read its
//! credentials.

use std::collections::HashSet;
use std::sync::Mutex;

use switchyard_core::ProviderServices;

/// Above this many fingerprints known not to be refused, the memo starts over (bounded
/// memory; a forgotten one costs one key/value read).
const KNOWN_GOOD_MAX: usize = 100_000;

/// One provider's refused credentials on this pod (see the module doc).
#[derive(Debug, Default)]
pub struct RevokedTokens {
    revoked: Mutex<HashSet<String>>,
    known_good: Mutex<HashSet<String>>,
}

fn key(fingerprint: &str) -> String {
    format!("revoked:{fingerprint}")
}

fn lock(m: &Mutex<HashSet<String>>) -> std::sync::MutexGuard<'_, HashSet<String>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RevokedTokens {
    /// Whether this pod knows `fingerprint` was refused (no store read).
    pub fn contains(&self, fingerprint: &str) -> bool {
        lock(&self.revoked).contains(fingerprint)
    }

    /// Every fingerprint this pod knows was refused.
    pub fn snapshot(&self) -> HashSet<String> {
        lock(&self.revoked).clone()
    }

    /// Whether `fingerprint` was refused, on any pod. Not knowing (the store does not answer)
    /// is not refused: the consumer tries, and the target says.
    pub async fn is_revoked(&self, services: &dyn ProviderServices, fingerprint: &str) -> bool {
        if self.contains(fingerprint) {
            return true;
        }
        if lock(&self.known_good).contains(fingerprint) {
            return false;
        }
        match services.kv_get(&key(fingerprint)).await {
            Ok(Some(v)) if v == "1" => {
                lock(&self.revoked).insert(fingerprint.to_owned());
                true
            }
            Ok(_) => {
                let mut good = lock(&self.known_good);
                if good.len() >= KNOWN_GOOD_MAX {
                    good.clear();
                }
                good.insert(fingerprint.to_owned());
                false
            }
            Err(_) => false,
        }
    }

    /// The target refused `fingerprint`: remembered here and durably. True the first time
    /// on this pod (the caller counts and logs it then).
    pub async fn mark(&self, services: &dyn ProviderServices, fingerprint: &str) -> bool {
        let first = lock(&self.revoked).insert(fingerprint.to_owned());
        lock(&self.known_good).remove(fingerprint);
        if let Err(e) = services.kv_put(&key(fingerprint), "1").await {
            tracing::warn!(error = %e, "revocation mark not stored");
        }
        first
    }

    /// Credentials with `fingerprint` work again (bound anew and checked by the target).
    pub async fn clear(&self, services: &dyn ProviderServices, fingerprint: &str) {
        lock(&self.revoked).remove(fingerprint);
        if let Err(e) = services.kv_put(&key(fingerprint), "0").await {
            tracing::warn!(error = %e, "revocation mark not cleared");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use switchyard_core::testkit::{Cluster, FakeServices};

    use super::RevokedTokens;

    fn pod(cluster: &Arc<Cluster>, name: &str) -> Arc<FakeServices> {
        FakeServices::new(cluster.clone(), name, "http://127.0.0.1:9", "/kit")
    }

    #[tokio::test]
    async fn a_mark_is_seen_by_every_pod_until_cleared() {
        let cluster = Cluster::new();
        let (a, b) = (pod(&cluster, "pod-a"), pod(&cluster, "pod-b"));
        let on_a = RevokedTokens::default();
        assert!(!on_a.is_revoked(a.as_ref(), "fp1").await);

        assert!(on_a.mark(a.as_ref(), "fp1").await, "first mark on this pod");
        assert!(!on_a.mark(a.as_ref(), "fp1").await, "second mark");
        assert!(on_a.contains("fp1"));
        assert!(on_a.is_revoked(a.as_ref(), "fp1").await);
        assert!(!on_a.is_revoked(a.as_ref(), "fp2").await, "another token");

        // Another pod (or this one restarted) reads the durable mark.
        let on_b = RevokedTokens::default();
        assert!(!on_b.contains("fp1"));
        assert!(on_b.is_revoked(b.as_ref(), "fp1").await);
        assert_eq!(on_b.snapshot().into_iter().collect::<Vec<_>>(), ["fp1"]);

        on_a.clear(a.as_ref(), "fp1").await;
        assert!(!on_a.is_revoked(a.as_ref(), "fp1").await);
        let restarted = RevokedTokens::default();
        assert!(!restarted.is_revoked(b.as_ref(), "fp1").await);
    }

    #[tokio::test]
    async fn a_token_known_good_is_marked_at_once_and_a_mark_not_stored_stays_local() {
        let cluster = Cluster::new();
        let a = pod(&cluster, "pod-a");
        let r = RevokedTokens::default();
        assert!(!r.is_revoked(a.as_ref(), "fp1").await);
        assert!(r.mark(a.as_ref(), "fp1").await);
        assert!(r.is_revoked(a.as_ref(), "fp1").await, "the memo is dropped");

        // A pod whose store takes no write still stops using the token itself.
        let dead = pod(&cluster, "pod-dead");
        dead.dead.store(true, Ordering::SeqCst);
        let on_dead = RevokedTokens::default();
        assert!(on_dead.mark(dead.as_ref(), "fp2").await);
        assert!(on_dead.is_revoked(dead.as_ref(), "fp2").await);
        assert!(!RevokedTokens::default().is_revoked(a.as_ref(), "fp2").await);
    }
}
