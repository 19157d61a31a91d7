//! rustls helpers both halves use: the ring provider and PEM parsing.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};

use crate::pki::PkiError;

pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub(crate) fn parse_certs(
    pem: &str,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, PkiError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| PkiError::Pem(what))?;
    if certs.is_empty() {
        return Err(PkiError::Pem(what));
    }
    Ok(certs)
}

pub(crate) fn parse_key(pem: &str, what: &'static str) -> Result<PrivateKeyDer<'static>, PkiError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|_| PkiError::Pem(what))
}
