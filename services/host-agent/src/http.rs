//! HTTP clients: one for the Switchyard listener (mTLS with the host CA as the only root),
//! one with the public roots for URLs elsewhere (a presigned S3 URL), and artifact transfers.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::io::ReaderStream;
use url::Url;

/// How the host reaches the server.
#[derive(Clone)]
pub enum TlsMode {
    /// TLS trusting only the host CA, presenting the host certificate.
    Mutual(Arc<rustls::ClientConfig>),
    /// No TLS at all (`http://`, `ws://`). Only for tests against an in-process server; the
    /// CLI never builds it.
    #[doc(hidden)]
    Plaintext,
}

impl std::fmt::Debug for TlsMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Mutual(_) => "Mutual",
            Self::Plaintext => "Plaintext",
        })
    }
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds the client for the Switchyard listener.
pub fn server_client(tls: &TlsMode) -> Result<reqwest::Client, reqwest::Error> {
    let b = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .user_agent(concat!("switchyard-host/", env!("CARGO_PKG_VERSION")));
    match tls {
        TlsMode::Mutual(cfg) => b.use_preconfigured_tls((**cfg).clone()).build(),
        TlsMode::Plaintext => b.build(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("invalid URL: {0}")]
    Url(#[from] url::ParseError),
    #[error("{}", crate::ids::error_chain(.0))]
    Http(#[from] reqwest::Error),
    #[error("HTTP {0}")]
    Status(reqwest::StatusCode),
}

/// Uploads and downloads of artifact bytes.
#[derive(Clone)]
pub struct Transfers {
    server: reqwest::Client,
    public: reqwest::Client,
    origin: url::Origin,
}

impl Transfers {
    pub fn new(base: &Url, server: reqwest::Client) -> Result<Self, reqwest::Error> {
        Ok(Self {
            server,
            public: reqwest::Client::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .build()?,
            origin: base.origin(),
        })
    }

    /// A URL on the Switchyard listener goes through the mTLS client (its certificate is
    /// issued by the host CA); anything else through the public roots.
    fn client_for(&self, url: &Url) -> &reqwest::Client {
        if url.origin() == self.origin {
            &self.server
        } else {
            &self.public
        }
    }

    /// PUTs the file at `path` to `url`.
    pub async fn put_file(
        &self,
        url: &str,
        path: &Path,
        content_type: &str,
    ) -> Result<(), TransferError> {
        let url = Url::parse(url)?;
        let file = tokio::fs::File::open(path).await?;
        let len = file.metadata().await?.len();
        let resp = self
            .client_for(&url)
            .put(url.clone())
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .header(reqwest::header::CONTENT_LENGTH, len)
            .body(reqwest::Body::wrap_stream(ReaderStream::new(file)))
            .send()
            .await?;
        if !resp.status().is_success() {
            return Err(TransferError::Status(resp.status()));
        }
        Ok(())
    }

    /// GETs `url` into a new file at `path`; returns its size.
    pub async fn get_to_file(&self, url: &str, path: &Path) -> Result<u64, TransferError> {
        use tokio::io::AsyncWriteExt;
        let url = Url::parse(url)?;
        let mut resp = self.client_for(&url).get(url.clone()).send().await?;
        if !resp.status().is_success() {
            return Err(TransferError::Status(resp.status()));
        }
        let mut file = tokio::fs::File::create(path).await?;
        let mut n = 0u64;
        while let Some(chunk) = resp.chunk().await? {
            file.write_all(&chunk).await?;
            n += chunk.len() as u64;
        }
        file.flush().await?;
        Ok(n)
    }
}
