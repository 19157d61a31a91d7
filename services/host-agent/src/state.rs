//! The state dir: what enrollment leaves behind and what `run` reads.
//!
//! | file | what |
//! |---|---|
//! | `key.pem` (0600) | the host's P-256 private key |
//! | `cert.pem` | the certificate the host CA issued for it |
//! | `ca.pem` | the host CA; the only root `run` trusts |
//! | `host.json` | `{"host_id", "tenant_id", "name"}` |
//! | `agents.json` | generated agent ids (see [`crate::config`]) |
//! | `runs/<run_id>/` | per-run working dir, `artifacts/` and `inputs/` |

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const KEY_FILE: &str = "key.pem";
pub const CERT_FILE: &str = "cert.pem";
pub const CA_FILE: &str = "ca.pem";
pub const HOST_FILE: &str = "host.json";
pub const RUNS_DIR: &str = "runs";

/// `host.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostIdentity {
    pub host_id: String,
    pub tenant_id: String,
    pub name: String,
}

/// Everything `run` needs from the state dir.
#[derive(Clone)]
pub struct Enrollment {
    pub identity: HostIdentity,
    pub key_pem: String,
    pub cert_pem: String,
    pub ca_pem: String,
}

impl std::fmt::Debug for Enrollment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enrollment")
            .field("identity", &self.identity)
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(
        "{dir} holds no enrollment ({missing} is missing): run `switchyard-host enroll --server URL --token TOKEN --state-dir {dir}` first"
    )]
    NotEnrolled { dir: PathBuf, missing: &'static str },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid: {detail}")]
    Invalid { path: PathBuf, detail: String },
}

impl Enrollment {
    pub fn load(dir: &Path) -> Result<Self, StateError> {
        let read = |name: &'static str| -> Result<String, StateError> {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(|source| {
                if source.kind() == std::io::ErrorKind::NotFound {
                    StateError::NotEnrolled {
                        dir: dir.to_owned(),
                        missing: name,
                    }
                } else {
                    StateError::Read { path, source }
                }
            })
        };
        let host = read(HOST_FILE)?;
        let identity: HostIdentity =
            serde_json::from_str(&host).map_err(|e| StateError::Invalid {
                path: dir.join(HOST_FILE),
                detail: e.to_string(),
            })?;
        if identity.host_id.is_empty() {
            return Err(StateError::Invalid {
                path: dir.join(HOST_FILE),
                detail: "host_id is empty".into(),
            });
        }
        Ok(Self {
            identity,
            key_pem: read(KEY_FILE)?,
            cert_pem: read(CERT_FILE)?,
            ca_pem: read(CA_FILE)?,
        })
    }
}

/// Creates `dir` (and parents) with mode 0700 when it does not exist.
pub fn ensure_private_dir(dir: &Path) -> std::io::Result<()> {
    if !dir.exists() {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Writes `bytes` to `path` through a temporary file and a rename, created with `mode`, so a
/// crash never leaves half a file and a key is never readable by others, not even briefly.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_atomic_sets_mode_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("key.pem");
        write_atomic(&p, b"one", 0o600).unwrap();
        write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn load_reports_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let e = Enrollment::load(dir.path()).unwrap_err();
        assert!(e.to_string().contains("host.json is missing"), "{e}");
        std::fs::write(
            dir.path().join(HOST_FILE),
            r#"{"host_id":"h1","tenant_id":"t","name":"n"}"#,
        )
        .unwrap();
        let e = Enrollment::load(dir.path()).unwrap_err();
        assert!(e.to_string().contains("key.pem is missing"), "{e}");
        for f in [KEY_FILE, CERT_FILE, CA_FILE] {
            std::fs::write(dir.path().join(f), "pem").unwrap();
        }
        let e = Enrollment::load(dir.path()).unwrap();
        assert_eq!(e.identity.host_id, "h1");
        assert!(!format!("{e:?}").contains("pem\""), "key is redacted");
    }
}
