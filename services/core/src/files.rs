//! File bytes: S3 in a cluster, a local folder on one node. Bytes are streamed both ways.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use tokio::io::AsyncWriteExt;

use crate::error::{BackendError, BackendResult, ErrorKind};

pub type ByteStream = BoxStream<'static, std::io::Result<Bytes>>;

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
        std::fs::create_dir_all(&root).map_err(|e| {
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
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|e| io_err("create dir", e))?;
        }
        let tmp = path.with_extension(format!("part-{}", crate::ids::random_secret(4)));
        let mut f = tokio::fs::File::create(&tmp)
            .await
            .map_err(|e| io_err("create", e))?;
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

    async fn ping(&self) -> BackendResult<()> {
        tokio::fs::metadata(&self.root)
            .await
            .map(|_| ())
            .map_err(|e| io_err("stat root", e))
    }
}
