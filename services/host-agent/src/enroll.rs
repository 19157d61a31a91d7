//! `switchyard-host enroll`: a new key and CSR, `POST /hosts/v1/enroll` with the one-time
//! token, and the certificate, CA and identity kept in the state dir.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use url::Url;

use crate::state::{CA_FILE, CERT_FILE, HOST_FILE, HostIdentity, KEY_FILE, write_atomic};
use crate::token::{Secret, api_error};

#[derive(Debug, thiserror::Error)]
pub enum EnrollError {
    #[error("--server must be an http:// or https:// URL, not {0:?}")]
    BadUrl(String),
    #[error("{0} already holds an enrollment (host.json); use another --state-dir or remove it")]
    AlreadyEnrolled(PathBuf),
    #[error("cannot read --ca {path}: {source}")]
    Ca {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--ca {0} is not a PEM certificate")]
    BadCa(PathBuf),
    #[error("cannot make the host key: {0}")]
    Key(#[from] switchyard_hosts_tls::pki::PkiError),
    #[error("cannot build the HTTP client: {0}")]
    Client(reqwest::Error),
    #[error("cannot reach the server at {url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error(
        "the server refused the enrollment token ({code}): it is wrong, expired or already used{message}"
    )]
    Rejected { code: String, message: String },
    #[error("the server answered HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("the server's answer is not an enrollment: {0}")]
    BadResponse(String),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What `enroll` needs.
pub struct EnrollArgs {
    pub server: String,
    pub token: Secret,
    pub state_dir: PathBuf,
    /// Trust only this CA for an https:// server (default: the public roots).
    pub ca: Option<PathBuf>,
    /// The name in the CSR (the machine's host name).
    pub csr_name: String,
}

#[derive(Serialize)]
struct EnrollRequest<'a> {
    token: &'a str,
    csr_pem: &'a str,
}

#[derive(Deserialize)]
struct EnrollResponse {
    host_id: String,
    tenant_id: String,
    name: String,
    certificate_pem: String,
    ca_pem: String,
}

/// Enrolls this host; returns its identity.
pub async fn enroll(args: EnrollArgs) -> Result<HostIdentity, EnrollError> {
    let base = Url::parse(&args.server)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
        .ok_or_else(|| EnrollError::BadUrl(args.server.clone()))?;
    if args.state_dir.join(HOST_FILE).exists() {
        return Err(EnrollError::AlreadyEnrolled(args.state_dir));
    }
    let mut client = reqwest::Client::builder().connect_timeout(Duration::from_secs(10));
    if let Some(ca) = &args.ca {
        let pem = std::fs::read(ca).map_err(|source| EnrollError::Ca {
            path: ca.clone(),
            source,
        })?;
        let cert =
            reqwest::Certificate::from_pem(&pem).map_err(|_| EnrollError::BadCa(ca.clone()))?;
        client = client
            .add_root_certificate(cert)
            .tls_built_in_root_certs(false);
    }
    let client = client.build().map_err(EnrollError::Client)?;
    let (key_pem, csr_pem) = switchyard_hosts_tls::pki::new_host_key_and_csr(&args.csr_name)?;
    let url = crate::transport::endpoint(&base, "/hosts/v1/enroll");
    tracing::info!(url = %url, "enrolling");
    let resp = client
        .post(url.clone())
        .json(&EnrollRequest {
            token: args.token.expose(),
            csr_pem: &csr_pem,
        })
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .map_err(|e| EnrollError::Unreachable {
            url: url.to_string(),
            detail: crate::ids::error_chain(&e),
        })?;
    let status = resp.status();
    let body = resp.text().await.unwrap_or_default();
    if status == reqwest::StatusCode::UNAUTHORIZED {
        let e = api_error(&body);
        return Err(EnrollError::Rejected {
            code: e
                .as_ref()
                .map_or_else(|| "unauthorized".into(), |e| e.code.clone()),
            message: e
                .map(|e| e.message)
                .filter(|m| !m.is_empty())
                .map(|m| format!(" ({m})"))
                .unwrap_or_default(),
        });
    }
    if !status.is_success() {
        return Err(EnrollError::Status {
            status: status.as_u16(),
            body: crate::ids::clip(&body, 500),
        });
    }
    let r: EnrollResponse =
        serde_json::from_str(&body).map_err(|e| EnrollError::BadResponse(e.to_string()))?;
    if r.host_id.is_empty() || !r.certificate_pem.contains("BEGIN CERTIFICATE") {
        return Err(EnrollError::BadResponse(
            "host_id or certificate_pem missing".into(),
        ));
    }
    let identity = HostIdentity {
        host_id: r.host_id,
        tenant_id: r.tenant_id,
        name: r.name,
    };
    save(
        &args.state_dir,
        &key_pem,
        &r.certificate_pem,
        &r.ca_pem,
        &identity,
    )?;
    Ok(identity)
}

fn save(
    dir: &Path,
    key: &str,
    cert: &str,
    ca: &str,
    identity: &HostIdentity,
) -> Result<(), EnrollError> {
    let werr = |path: PathBuf| move |source| EnrollError::Write { path, source };
    crate::state::ensure_private_dir(dir).map_err(werr(dir.to_owned()))?;
    let host = serde_json::to_string_pretty(identity).unwrap_or_default();
    for (name, bytes, mode) in [
        (KEY_FILE, key.as_bytes(), 0o600),
        (CERT_FILE, cert.as_bytes(), 0o644),
        (CA_FILE, ca.as_bytes(), 0o644),
        // Last: its presence means the enrollment is complete.
        (HOST_FILE, host.as_bytes(), 0o644),
    ] {
        let path = dir.join(name);
        write_atomic(&path, bytes, mode).map_err(werr(path))?;
    }
    Ok(())
}
