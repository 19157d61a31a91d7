//! File bytes: S3 in a cluster, a local folder on one node. Bytes are streamed both ways.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use tokio::io::AsyncWriteExt;

use crate::error::{BackendError, BackendResult, ErrorKind};

pub type ByteStream = BoxStream<'static, std::io::Result<Bytes>>;

/// What a presigned URL lets its holder do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PresignMethod {
    Get,
    Put,
}

#[async_trait]
pub trait FileStore: Send + Sync + 'static {
    /// Streams `body` into `key`. Fails with `LimitExceeded` (and stores nothing) once more
    /// than `max_bytes` arrive. Returns the byte count.
    async fn put(&self, key: &str, body: ByteStream, max_bytes: u64) -> BackendResult<u64>;
    /// Streams the object; `NotFound` when absent.
    async fn get(&self, key: &str) -> BackendResult<ByteStream>;
    /// Deletes the object; deleting a missing object is not an error.
    async fn delete(&self, key: &str) -> BackendResult<()>;
    async fn ping(&self) -> BackendResult<()>;
    /// Size of a stored object; None when absent.
    async fn stat(&self, key: &str) -> BackendResult<Option<u64>>;
    /// A URL the holder can use without other credentials until `ttl` passes, when the
    /// backend supports it (S3); None otherwise.
    async fn presign(
        &self,
        key: &str,
        method: PresignMethod,
        ttl: std::time::Duration,
    ) -> BackendResult<Option<String>> {
        let _ = (key, method, ttl);
        Ok(None)
    }
}

/// Wraps a complete buffer as a stream (small inbound files, tests).
pub fn bytes_stream(b: impl Into<Bytes>) -> ByteStream {
    futures::stream::once(futures::future::ready(Ok(b.into()))).boxed()
}

/// Collects a stream fully, refusing more than `max` bytes.
pub async fn collect(mut s: ByteStream, max: u64) -> BackendResult<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(chunk) = s.next().await {
        let chunk = chunk
            .map_err(|e| BackendError::with_source(ErrorKind::Unavailable, "read stream", e))?;
        if (out.len() + chunk.len()) as u64 > max {
            return Err(BackendError::new(
                ErrorKind::LimitExceeded,
                "stream too large",
            ));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Local folder implementation: objects are files under `root`, written to a temporary name
/// and renamed into place so a reader never sees a partial object.
#[derive(Clone)]
pub struct LocalFileStore {
    root: PathBuf,
}

impl LocalFileStore {
    pub fn new(root: impl Into<PathBuf>) -> BackendResult<Self> {
        let root = root.into();
        private_dir_builder().create(&root).map_err(|e| {
            BackendError::with_source(ErrorKind::Internal, "create files folder", e)
        })?;
        Ok(Self { root })
    }

    fn path(&self, key: &str) -> BackendResult<PathBuf> {
        let ok = !key.is_empty()
            && key
                .split('/')
                .all(|p| !p.is_empty() && p != "." && p != "..")
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/'));
        if !ok {
            return Err(BackendError::new(ErrorKind::Internal, "invalid object key"));
        }
        Ok(self.root.join(Path::new(key)))
    }
}

/// Folders of the local store are the pod's own: 0700 where permissions exist.
fn private_dir_builder() -> std::fs::DirBuilder {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    b
}

fn io_err(ctx: &str, e: std::io::Error) -> BackendError {
    let kind = if e.kind() == std::io::ErrorKind::NotFound {
        ErrorKind::NotFound
    } else {
        ErrorKind::Internal
    };
    BackendError::with_source(kind, ctx.to_owned(), e)
}

#[async_trait]
impl FileStore for LocalFileStore {
    async fn put(&self, key: &str, mut body: ByteStream, max_bytes: u64) -> BackendResult<u64> {
        let path = self.path(key)?;
        if let Some(dir) = path.parent() {
            let dir = dir.to_path_buf();
            tokio::task::spawn_blocking(move || private_dir_builder().create(dir))
                .await
                .map_err(|e| BackendError::with_source(ErrorKind::Internal, "create dir", e))?
                .map_err(|e| io_err("create dir", e))?;
        }
        let tmp = path.with_extension(format!("part-{}", crate::ids::random_secret(4)));
        // Files are the pod's own too: 0600 where permissions exist.
        let mut opts = tokio::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        opts.mode(0o600);
        let mut f = opts.open(&tmp).await.map_err(|e| io_err("create", e))?;
        let mut n: u64 = 0;
        let result: BackendResult<()> = async {
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| {
                    BackendError::with_source(ErrorKind::Unavailable, "read upload", e)
                })?;
                n += chunk.len() as u64;
                if n > max_bytes {
                    return Err(BackendError::new(
                        ErrorKind::LimitExceeded,
                        "file too large",
                    ));
                }
                f.write_all(&chunk).await.map_err(|e| io_err("write", e))?;
            }
            f.flush().await.map_err(|e| io_err("flush", e))?;
            f.sync_all().await.map_err(|e| io_err("sync", e))?;
            Ok(())
        }
        .await;
        drop(f);
        if let Err(e) = result {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(e);
        }
        tokio::fs::rename(&tmp, &path)
            .await
            .map_err(|e| io_err("rename", e))?;
        Ok(n)
    }

    async fn get(&self, key: &str) -> BackendResult<ByteStream> {
        let f = tokio::fs::File::open(self.path(key)?)
            .await
            .map_err(|e| io_err("open", e))?;
        Ok(tokio_util::io::ReaderStream::new(f)
            .map_err(std::io::Error::other)
            .boxed())
    }

    async fn delete(&self, key: &str) -> BackendResult<()> {
        match tokio::fs::remove_file(self.path(key)?).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("delete", e)),
        }
    }

    async fn stat(&self, key: &str) -> BackendResult<Option<u64>> {
        match tokio::fs::metadata(self.path(key)?).await {
            // A folder is where keys with this prefix live, not an object.
            Ok(m) if m.is_file() => Ok(Some(m.len())),
            Ok(_) => Ok(None),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(io_err("stat", e)),
        }
    }

    async fn ping(&self) -> BackendResult<()> {
        tokio::fs::metadata(&self.root)
            .await
            .map(|_| ())
            .map_err(|e| io_err("stat root", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The shared behaviour of `stat` is in the conformance suite; a folder standing in for a
    // key prefix is particular to this store (S3 has no folders; the test S3 server, which
    // keeps objects as files, would report one, so the suite cannot hold every store to it).
    #[tokio::test]
    async fn stat_of_a_prefix_or_below_a_file_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalFileStore::new(dir.path()).unwrap();
        store
            .put("a/b/c", bytes_stream(&b"abc"[..]), 16)
            .await
            .unwrap();
        assert_eq!(store.stat("a/b/c").await.unwrap(), Some(3));
        assert_eq!(store.stat("a/b").await.unwrap(), None);
        assert_eq!(store.stat("a/b/c/d").await.unwrap(), None);
        assert!(store.stat("../x").await.is_err(), "keys are validated");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(
                mode(&dir.path().join("a/b/c")),
                0o600,
                "objects are private"
            );
            assert_eq!(mode(&dir.path().join("a/b")), 0o700, "folders are private");
            let fresh = dir.path().join("fresh");
            LocalFileStore::new(&fresh).unwrap();
            assert_eq!(mode(&fresh), 0o700);
        }
        assert_eq!(
            store
                .presign(
                    "a/b/c",
                    PresignMethod::Get,
                    std::time::Duration::from_secs(60)
                )
                .await
                .unwrap(),
            None,
            "a local folder has no presigned URLs"
        );
    }
}
