//! This pod's identity: the holder name of its leases, the owner of its sockets' routes and
//! the key of its presence row.
//!
//! The identity must survive a restart of the same pod, so that a pod killed with SIGKILL and
//! started again takes back at once the leases it held itself (a Feishu long connection, a
//! Telegram or WeChat poller, the janitor) instead of waiting them out like a stranger; a
//! lease held by another, silent pod is still taken only when it expires. In Kubernetes the
//! chart sets `SWITCHYARD_POD_ID` to the pod's name (downward API), which a container restart
//! keeps. Without it the identity is generated once (hostname + random suffix) and kept in the
//! data directory, locked for as long as the process runs: a second process started on the
//! same data directory gets a fresh identity of its own, never the first one's.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use switchyard_core::ids::random_secret;

use crate::config::Config;

/// The file in the data directory that keeps a generated identity.
pub const POD_ID_FILE: &str = "pod-id";

/// A pod identity and, when it is the data directory's, the lock that keeps it this
/// process's: drop it only when the pod has stopped.
#[derive(Debug)]
pub struct PodIdentity {
    pub id: String,
    /// Where the identity came from, for the start-up log line.
    pub source: IdentitySource,
    _lock: Option<File>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentitySource {
    /// `pod_id` / `SWITCHYARD_POD_ID`.
    Configured,
    /// Read from (or first written to) the data directory.
    DataDir,
    /// Generated for this process only: the data directory was unusable or in use.
    Ephemeral,
}

/// The configured identity, else the data directory's, else a fresh one for this process.
pub fn pod_identity(cfg: &Config) -> PodIdentity {
    if let Some(id) = cfg.pod_id.clone().filter(|id| !id.trim().is_empty()) {
        return PodIdentity {
            id,
            source: IdentitySource::Configured,
            _lock: None,
        };
    }
    match from_data_dir(&cfg.data_dir) {
        Ok(Some((id, lock))) => PodIdentity {
            id,
            source: IdentitySource::DataDir,
            _lock: Some(lock),
        },
        Ok(None) => {
            tracing::warn!(
                data_dir = %cfg.data_dir.display(),
                "another process holds this data directory's pod identity; using a fresh one, \
                 so leases held before a restart are taken back only when they expire"
            );
            fresh()
        }
        Err(e) => {
            tracing::warn!(
                data_dir = %cfg.data_dir.display(),
                error = %e,
                "pod identity cannot be kept in the data directory; using a fresh one, so \
                 leases held before a restart are taken back only when they expire \
                 (set SWITCHYARD_POD_ID to keep one)"
            );
            fresh()
        }
    }
}

fn fresh() -> PodIdentity {
    PodIdentity {
        id: generated_id(),
        source: IdentitySource::Ephemeral,
        _lock: None,
    }
}

/// Hostname + random suffix: unique among pods that share a host name.
pub fn generated_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| sanitize(h.trim()))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "pod".into());
    format!("{host}-{}", random_secret(3))
}

/// Keeps identities to a safe alphabet: they appear in lease rows, NATS subjects and logs.
fn sanitize(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(63)
        .collect()
}

/// Reads the data directory's identity, writing a new one the first time. `Ok(None)` when
/// another live process holds it (the file lock is taken).
fn from_data_dir(dir: &Path) -> std::io::Result<Option<(String, File)>> {
    super::backends::create_private_dir(dir)?;
    let mut opts = OpenOptions::new();
    opts.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut file = opts.open(dir.join(POD_ID_FILE))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
        Err(std::fs::TryLockError::Error(e)) => return Err(e),
    }
    let mut kept = String::new();
    file.read_to_string(&mut kept)?;
    let kept = sanitize(kept.trim());
    if !kept.is_empty() {
        return Ok(Some((kept, file)));
    }
    let id = generated_id();
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(format!("{id}\n").as_bytes())?;
    file.sync_all()?;
    Ok(Some((id, file)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(dir: &Path) -> Config {
        Config {
            data_dir: dir.to_path_buf(),
            ..Config::default()
        }
    }

    #[test]
    fn configured_identity_wins() {
        let dir = tempfile::tempdir().expect("dir");
        let mut c = cfg(dir.path());
        c.pod_id = Some("switchyard-0".into());
        let id = pod_identity(&c);
        assert_eq!(
            (id.id.as_str(), id.source),
            ("switchyard-0", IdentitySource::Configured)
        );
        assert!(
            !dir.path().join(POD_ID_FILE).exists(),
            "a configured identity writes nothing"
        );
    }

    #[test]
    fn data_dir_identity_survives_a_restart() {
        let dir = tempfile::tempdir().expect("dir");
        let first = pod_identity(&cfg(dir.path()));
        assert_eq!(first.source, IdentitySource::DataDir);
        let first_id = first.id.clone();
        drop(first); // the process ends
        let again = pod_identity(&cfg(dir.path()));
        assert_eq!(again.source, IdentitySource::DataDir);
        assert_eq!(again.id, first_id, "the restarted pod is the same pod");
    }

    #[test]
    fn a_second_process_on_the_same_data_dir_gets_its_own_identity() {
        let dir = tempfile::tempdir().expect("dir");
        let first = pod_identity(&cfg(dir.path()));
        // The lock is per open file description, so a second open in this process stands
        // for a second process.
        let second = pod_identity(&cfg(dir.path()));
        assert_eq!(second.source, IdentitySource::Ephemeral);
        assert_ne!(second.id, first.id, "two live pods never share an identity");
        drop(second);
        let third = pod_identity(&cfg(dir.path()));
        assert_eq!(
            third.source,
            IdentitySource::Ephemeral,
            "still held by the first"
        );
        drop(first);
        drop(third);
        assert_eq!(
            pod_identity(&cfg(dir.path())).source,
            IdentitySource::DataDir
        );
    }

    #[test]
    fn a_tampered_identity_is_kept_to_a_safe_alphabet() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join(POD_ID_FILE), "pod a/b\n\u{7}x").expect("write");
        assert_eq!(pod_identity(&cfg(dir.path())).id, "podabx");
    }
}
