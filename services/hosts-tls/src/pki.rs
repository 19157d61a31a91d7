//! The deployment's host CA and the certificates it issues (docs/agent-hosts.md, "Identity").
//!
//! Everything is ECDSA P-256. The CA signs two kinds of certificates: a client certificate per
//! host (from the host's CSR at enrollment) and the server certificate of the mTLS listener.
//! Nothing here stores anything: the caller keeps the CA's PEMs and the issued fingerprints.

use std::net::IpAddr;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use rand::RngCore as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType, SerialNumber, SignatureAlgorithm,
};
use sha2::{Digest as _, Sha256};
use time::OffsetDateTime;
use x509_parser::prelude::FromDer as _;

/// Lifetime of a CA made by [`HostCa::generate`].
const CA_VALIDITY_DAYS: i64 = 3650;
/// Lifetime of a listener certificate; it is cheap to make a new one at every start.
const SERVER_CERT_VALIDITY_DAYS: i64 = 397;
/// Issued certificates are valid from a little before now, so a host whose clock is slightly
/// behind the server's does not refuse its own fresh certificate.
const BACKDATE: time::Duration = time::Duration::minutes(5);
/// URI SAN of a host certificate: host ids (`host_<hex>`) are not valid DNS names.
pub const HOST_URI_PREFIX: &str = "urn:switchyard:host:";

const PEM_CERT_BEGIN: &str = "-----BEGIN CERTIFICATE-----";
const PEM_CERT_END: &str = "-----END CERTIFICATE-----";

/// What went wrong. Messages name the failing step only: never key material, and never the
/// text that failed to parse (it may be a secret pasted in the wrong place).
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{0} is not valid PEM")]
    Pem(&'static str),
    #[error("not a valid X.509 certificate")]
    Certificate,
    #[error("certificate signing request does not parse")]
    Csr,
    #[error("certificate signing request signature does not verify")]
    CsrSignature,
    #[error("unsupported public key algorithm (P-256, P-384, Ed25519 or RSA expected)")]
    UnsupportedKey,
    #[error("CA key does not match the CA certificate")]
    KeyMismatch,
    #[error("CA certificate is not a CA (basicConstraints cA missing)")]
    NotACa,
    #[error("forwarded client certificate does not decode")]
    ForwardedCertificate,
    #[error("invalid input: {0}")]
    InvalidInput(&'static str),
    /// Building or signing a certificate failed (rcgen's message, which carries no key).
    #[error("certificate generation failed: {0}")]
    Generation(String),
    /// Building a TLS configuration failed (rustls's message).
    #[error("tls configuration: {0}")]
    Tls(String),
}

impl From<rcgen::Error> for PkiError {
    fn from(e: rcgen::Error) -> Self {
        PkiError::Generation(e.to_string())
    }
}

impl From<rustls::Error> for PkiError {
    fn from(e: rustls::Error) -> Self {
        PkiError::Tls(e.to_string())
    }
}

/// A certificate the CA issued to a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedCert {
    pub pem: String,
    pub der: Vec<u8>,
    /// [`fingerprint_hex`] of `der`.
    pub fingerprint: String,
}

/// The deployment's host CA (self-signed, P-256 ECDSA). Cheap to clone.
#[derive(Clone)]
pub struct HostCa {
    inner: Arc<CaInner>,
}

struct CaInner {
    cert_pem: String,
    cert_der: Vec<u8>,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for HostCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostCa")
            .field("fingerprint", &fingerprint_hex(&self.inner.cert_der))
            .finish_non_exhaustive()
    }
}

impl HostCa {
    /// A new CA with a fresh key, valid for ten years.
    pub fn generate(common_name: &str) -> Result<HostCa, PkiError> {
        if common_name.trim().is_empty() {
            return Err(PkiError::InvalidInput("CA common name is empty"));
        }
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(common_name);
        // Path length 0: the CA signs end-entity certificates only.
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = now - BACKDATE;
        params.not_after = now + time::Duration::days(CA_VALIDITY_DAYS);
        params.serial_number = Some(random_serial());
        let cert = params.self_signed(&key)?;
        Self::build(cert.der().to_vec(), key)
    }

    /// The CA from its stored certificate and PKCS#8 key. Fails when the key is not the
    /// certificate's or the certificate is not a CA.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<HostCa, PkiError> {
        let cert_der = pem_to_der(cert_pem)?;
        let key = KeyPair::from_pem(key_pem).map_err(|_| PkiError::Pem("CA private key"))?;
        let (_, cert) =
            x509_parser::parse_x509_certificate(&cert_der).map_err(|_| PkiError::Certificate)?;
        if cert.tbs_certificate.subject_pki.raw != key.subject_public_key_info().as_slice() {
            return Err(PkiError::KeyMismatch);
        }
        let is_ca = cert
            .basic_constraints()
            .map_err(|_| PkiError::Certificate)?
            .is_some_and(|bc| bc.value.ca);
        if !is_ca {
            return Err(PkiError::NotACa);
        }
        Self::build(cert_der, key)
    }

    fn build(cert_der: Vec<u8>, key: KeyPair) -> Result<HostCa, PkiError> {
        let issuer = Issuer::from_ca_cert_der(&cert_der.as_slice().into(), key)?;
        Ok(HostCa {
            inner: Arc::new(CaInner {
                cert_pem: der_to_pem("CERTIFICATE", &cert_der),
                cert_der,
                issuer,
            }),
        })
    }

    pub fn cert_pem(&self) -> String {
        self.inner.cert_pem.clone()
    }

    /// The CA's private key as PKCS#8 PEM. A secret: store it like one.
    pub fn key_pem(&self) -> String {
        self.inner.issuer.key().serialize_pem()
    }

    pub fn cert_der(&self) -> Vec<u8> {
        self.inner.cert_der.clone()
    }

    /// Signs a host's CSR. Only the CSR's public key (after its signature verifies) is taken:
    /// subject CN = `host_id`, SAN = URI `urn:switchyard:host:<host_id>`, client-auth EKU,
    /// not a CA, random serial, valid for `valid_days`. Whatever names or extensions the CSR
    /// requests are ignored.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        host_id: &str,
        valid_days: u32,
    ) -> Result<IssuedCert, PkiError> {
        if !valid_host_id(host_id) {
            return Err(PkiError::InvalidInput(
                "host id must be 1-64 characters of A-Z a-z 0-9 _ . -",
            ));
        }
        if valid_days == 0 {
            return Err(PkiError::InvalidInput("validity must be at least one day"));
        }
        let public_key = csr_public_key(csr_pem)?;
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(host_id);
        params.subject_alt_names = vec![SanType::URI(
            format!("{HOST_URI_PREFIX}{host_id}")
                .try_into()
                .map_err(|_| PkiError::InvalidInput("host id"))?,
        )];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = now - BACKDATE;
        params.not_after = now + time::Duration::days(i64::from(valid_days));
        params.serial_number = Some(random_serial());
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&public_key, &self.inner.issuer)?;
        let der = cert.der().to_vec();
        Ok(IssuedCert {
            pem: cert.pem(),
            fingerprint: fingerprint_hex(&der),
            der,
        })
    }

    /// A fresh key and a server certificate for the mTLS listener: server-auth EKU, one SAN
    /// per name (an IP literal becomes an IP SAN, anything else a DNS SAN). Returns
    /// (certificate PEM, PKCS#8 key PEM).
    pub fn server_certificate(&self, names: &[String]) -> Result<(String, String), PkiError> {
        let Some(first) = names.first() else {
            return Err(PkiError::InvalidInput("server certificate needs a name"));
        };
        let sans = names
            .iter()
            .map(|n| server_san(n))
            .collect::<Result<Vec<_>, _>>()?;
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(first);
        params.subject_alt_names = sans;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = now - BACKDATE;
        params.not_after = now + time::Duration::days(SERVER_CERT_VALIDITY_DAYS);
        params.serial_number = Some(random_serial());
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.inner.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// An IP literal (bracketed or not, as in a URL's host part) becomes an IP SAN; anything
/// else must be a valid DNS name, as a TLS client would check it.
fn server_san(name: &str) -> Result<SanType, PkiError> {
    let unbracketed = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(name);
    if let Ok(ip) = unbracketed.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    rustls::pki_types::DnsName::try_from(name)
        .map_err(|_| PkiError::InvalidInput("server name is not a DNS name or IP address"))?;
    name.try_into()
        .map(SanType::DnsName)
        .map_err(|_| PkiError::InvalidInput("server name is not a DNS name or IP address"))
}

/// Host side: a new P-256 key and a CSR with CN = `name`. Returns (key PEM, CSR PEM).
pub fn new_host_key_and_csr(name: &str) -> Result<(String, String), PkiError> {
    if name.trim().is_empty() {
        return Err(PkiError::InvalidInput("host name is empty"));
    }
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = dn(name);
    let csr = params.serialize_request(&key)?;
    Ok((key.serialize_pem(), csr.pem()?))
}

/// Lowercase hex SHA-256 of a DER certificate (the store's lookup key).
pub fn fingerprint_hex(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
}

/// RFC 8705 `x5t#S256` of a DER certificate: base64url (no padding) of its SHA-256.
pub fn x5t_s256(der: &[u8]) -> String {
    switchyard_protocol::hosts::x5t_s256_from_digest(&Sha256::digest(der).into())
}

/// The first CERTIFICATE block of a PEM text, as DER. Line breaks inside the block may be
/// any whitespace (some proxies fold the PEM onto one line). The DER must parse as X.509.
pub fn pem_to_der(pem: &str) -> Result<Vec<u8>, PkiError> {
    let start = pem
        .find(PEM_CERT_BEGIN)
        .ok_or(PkiError::Pem("certificate"))?
        + PEM_CERT_BEGIN.len();
    let len = pem[start..]
        .find(PEM_CERT_END)
        .ok_or(PkiError::Pem("certificate"))?;
    let b64: String = pem[start..start + len]
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    let der = decode_base64(&b64).ok_or(PkiError::Pem("certificate"))?;
    check_x509(&der)?;
    Ok(der)
}

/// A client certificate forwarded by a trusted ingress in a header, as DER. Accepts
/// URL-encoded PEM (nginx `$ssl_client_escaped_cert`), plain PEM, or bare base64 DER.
pub fn decode_forwarded_cert(header_value: &str) -> Result<Vec<u8>, PkiError> {
    let value = header_value.trim();
    if value.is_empty() {
        return Err(PkiError::ForwardedCertificate);
    }
    let bad = |_| PkiError::ForwardedCertificate;
    if value.contains(PEM_CERT_BEGIN) {
        return pem_to_der(value).map_err(bad);
    }
    if value.contains('%') {
        let decoded = percent_encoding::percent_decode_str(value)
            .decode_utf8()
            .map_err(|_| PkiError::ForwardedCertificate)?;
        return pem_to_der(&decoded).map_err(bad);
    }
    let der = decode_base64(value).ok_or(PkiError::ForwardedCertificate)?;
    check_x509(&der).map_err(bad)?;
    Ok(der)
}

fn decode_base64(s: &str) -> Option<Vec<u8>> {
    STANDARD
        .decode(s)
        .or_else(|_| STANDARD_NO_PAD.decode(s))
        .ok()
}

/// The whole input must be exactly one X.509 certificate.
fn check_x509(der: &[u8]) -> Result<(), PkiError> {
    match x509_parser::parse_x509_certificate(der) {
        Ok(([], _)) => Ok(()),
        _ => Err(PkiError::Certificate),
    }
}

fn der_to_pem(label: &str, der: &[u8]) -> String {
    let b64 = STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    // Base64 output is ASCII, so splitting on byte boundaries is safe.
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

fn dn(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

/// 16 random bytes, positive and without a leading zero byte so the DER length is fixed.
fn random_serial() -> SerialNumber {
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    b[0] = (b[0] & 0x7f) | 0x40;
    SerialNumber::from_slice(&b)
}

fn valid_host_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// The subject public key of a CSR, once its self-signature verifies.
struct CsrKey {
    alg: &'static SignatureAlgorithm,
    raw: Vec<u8>,
}

impl PublicKeyData for CsrKey {
    fn der_bytes(&self) -> &[u8] {
        &self.raw
    }

    fn algorithm(&self) -> &'static SignatureAlgorithm {
        self.alg
    }
}

/// Parses the CSR with x509-parser rather than rcgen's `CertificateSigningRequestParams`,
/// which refuses CSRs carrying extensions it does not know; here all of them are ignored.
fn csr_public_key(csr_pem: &str) -> Result<CsrKey, PkiError> {
    let der = pem_block(csr_pem, "CERTIFICATE REQUEST")
        .or_else(|| pem_block(csr_pem, "NEW CERTIFICATE REQUEST"))
        .ok_or(PkiError::Pem("certificate signing request"))?;
    let (rest, csr) = x509_parser::certification_request::X509CertificationRequest::from_der(&der)
        .map_err(|_| PkiError::Csr)?;
    if !rest.is_empty() {
        return Err(PkiError::Csr);
    }
    csr.verify_signature().map_err(|_| PkiError::CsrSignature)?;
    let spki = &csr.certification_request_info.subject_pki;
    let raw = spki.subject_public_key.data.to_vec();
    // The algorithm whose encoding of this key reproduces the CSR's SubjectPublicKeyInfo
    // byte for byte: the issued certificate then carries exactly the key the host holds.
    [
        &rcgen::PKCS_ECDSA_P256_SHA256,
        &rcgen::PKCS_ECDSA_P384_SHA384,
        &rcgen::PKCS_ED25519,
        &rcgen::PKCS_RSA_SHA256,
    ]
    .into_iter()
    .map(|alg| CsrKey {
        alg,
        raw: raw.clone(),
    })
    .find(|k| k.subject_public_key_info() == spki.raw)
    .ok_or(PkiError::UnsupportedKey)
}

/// The content of the first `-----BEGIN {label}-----` block.
fn pem_block(pem: &str, label: &str) -> Option<Vec<u8>> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = pem.find(&begin)? + begin.len();
    let len = pem[start..].find(&end)?;
    let b64: String = pem[start..start + len]
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    decode_base64(&b64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> HostCa {
        HostCa::generate("Switchyard test host CA").unwrap()
    }

    #[test]
    fn ca_round_trips_through_pem() {
        let ca = ca();
        let back = HostCa::from_pem(&ca.cert_pem(), &ca.key_pem()).unwrap();
        assert_eq!(back.cert_der(), ca.cert_der());
        assert_eq!(back.cert_pem(), ca.cert_pem());
        assert_eq!(pem_to_der(&ca.cert_pem()).unwrap(), ca.cert_der());
        // A CA loaded from PEM signs certificates that chain to the original.
        let (_, csr) = new_host_key_and_csr("laptop").unwrap();
        let issued = back.sign_csr(&csr, "host_1", 30).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&issued.der).unwrap();
        let ca_der = ca.cert_der();
        let (_, ca_cert) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
        cert.verify_signature(Some(ca_cert.public_key())).unwrap();
    }

    #[test]
    fn ca_refuses_foreign_key_and_non_ca() {
        let a = ca();
        let b = ca();
        assert!(matches!(
            HostCa::from_pem(&a.cert_pem(), &b.key_pem()),
            Err(PkiError::KeyMismatch)
        ));
        let (leaf, leaf_key) = a.server_certificate(&["localhost".into()]).unwrap();
        assert!(matches!(
            HostCa::from_pem(&leaf, &leaf_key),
            Err(PkiError::NotACa)
        ));
        assert!(HostCa::from_pem("garbage", &a.key_pem()).is_err());
        assert!(HostCa::from_pem(&a.cert_pem(), "garbage").is_err());
    }

    #[test]
    fn debug_does_not_print_the_key() {
        let ca = ca();
        let dbg = format!("{ca:?}");
        let key_body: String = ca
            .key_pem()
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        assert!(!dbg.contains(&key_body[..20]), "{dbg}");
        assert!(!dbg.contains("PRIVATE"), "{dbg}");
        assert!(dbg.contains(&fingerprint_hex(&ca.cert_der())));
    }

    #[test]
    fn issued_certificate_has_the_host_identity_and_nothing_else() {
        let ca = ca();
        // A CSR asking for a CA certificate, server auth and another name: all ignored.
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::new(vec!["evil.example".to_owned()]).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let csr = params.serialize_request(&key).unwrap().pem().unwrap();

        let issued = ca.sign_csr(&csr, "host_abc", 90).unwrap();
        assert_eq!(issued.fingerprint, fingerprint_hex(&issued.der));
        assert_eq!(issued.fingerprint.len(), 64);
        assert_eq!(pem_to_der(&issued.pem).unwrap(), issued.der);

        let (_, cert) = x509_parser::parse_x509_certificate(&issued.der).unwrap();
        let cn: Vec<_> = cert
            .subject()
            .iter_common_name()
            .map(|c| c.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(cn, ["host_abc"]);
        assert_eq!(
            cert.tbs_certificate.subject_pki.raw,
            key.subject_public_key_info().as_slice(),
            "the certificate carries the CSR's key"
        );
        let san = cert.subject_alternative_name().unwrap().unwrap();
        let names: Vec<String> = san
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(names, ["URI(urn:switchyard:host:host_abc)"]);
        assert!(!cert.is_ca());
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth && !eku.any);
        let validity = cert.validity().time_to_expiration().unwrap();
        assert!(validity.whole_days() >= 89 && validity.whole_days() <= 90);
        // Serials are random: the same CSR signed twice gives two certificates.
        let again = ca.sign_csr(&csr, "host_abc", 90).unwrap();
        assert_ne!(again.fingerprint, issued.fingerprint);
    }

    #[test]
    fn tampered_csr_is_refused() {
        let ca = ca();
        let (_, csr) = new_host_key_and_csr("honest-name").unwrap();
        let mut der = pem_block(&csr, "CERTIFICATE REQUEST").unwrap();
        // Change one letter of the subject CN: the signature no longer covers it.
        let pos = der
            .windows(b"honest".len())
            .position(|w| w == b"honest")
            .unwrap();
        der[pos] = b'H';
        let tampered = der_to_pem("CERTIFICATE REQUEST", &der);
        assert!(matches!(
            ca.sign_csr(&tampered, "host_1", 30),
            Err(PkiError::CsrSignature)
        ));
    }

    #[test]
    fn garbage_is_refused() {
        let ca = ca();
        assert!(matches!(
            ca.sign_csr("not a pem", "host_1", 30),
            Err(PkiError::Pem(_))
        ));
        let junk = der_to_pem("CERTIFICATE REQUEST", b"\x30\x03\x02\x01\x00");
        assert!(matches!(
            ca.sign_csr(&junk, "host_1", 30),
            Err(PkiError::Csr)
        ));
        // A certificate is not a CSR.
        assert!(ca.sign_csr(&ca.cert_pem(), "host_1", 30).is_err());
        let (_, csr) = new_host_key_and_csr("n").unwrap();
        assert!(matches!(
            ca.sign_csr(&csr, "bad id/../x", 30),
            Err(PkiError::InvalidInput(_))
        ));
        assert!(matches!(
            ca.sign_csr(&csr, "host_1", 0),
            Err(PkiError::InvalidInput(_))
        ));
        assert!(pem_to_der("").is_err());
        assert!(pem_to_der(&der_to_pem("CERTIFICATE", b"hello")).is_err());
    }

    #[test]
    fn server_certificate_names() {
        let ca = ca();
        let (pem, key) = ca
            .server_certificate(&["localhost".into(), "127.0.0.1".into(), "[::1]".into()])
            .unwrap();
        assert!(key.contains("PRIVATE KEY"));
        let der = pem_to_der(&pem).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        use x509_parser::extensions::GeneralName;
        let san = cert.subject_alternative_name().unwrap().unwrap();
        match san.value.general_names.as_slice() {
            [
                GeneralName::DNSName("localhost"),
                GeneralName::IPAddress(v4),
                GeneralName::IPAddress(v6),
            ] => {
                assert_eq!(*v4, [127, 0, 0, 1]);
                assert_eq!(*v6, std::net::Ipv6Addr::LOCALHOST.octets());
            }
            other => panic!("unexpected SANs {other:?}"),
        }
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && !eku.client_auth);
        assert!(ca.server_certificate(&[]).is_err());
        assert!(ca.server_certificate(&["not a name".into()]).is_err());
    }

    #[test]
    fn forwarded_certificate_forms() {
        let ca = ca();
        let (_, csr) = new_host_key_and_csr("h").unwrap();
        let issued = ca.sign_csr(&csr, "host_1", 1).unwrap();

        // nginx $ssl_client_escaped_cert: the PEM, percent-encoded.
        let escaped: String =
            percent_encoding::utf8_percent_encode(&issued.pem, percent_encoding::NON_ALPHANUMERIC)
                .to_string();
        assert!(escaped.contains("%0A") && !escaped.contains('\n'));
        assert_eq!(decode_forwarded_cert(&escaped).unwrap(), issued.der);
        // Plain PEM, and PEM folded onto one line.
        assert_eq!(decode_forwarded_cert(&issued.pem).unwrap(), issued.der);
        let folded = issued.pem.replace('\n', " ");
        assert_eq!(decode_forwarded_cert(&folded).unwrap(), issued.der);
        // Bare base64 DER, with and without padding.
        let b64 = STANDARD.encode(&issued.der);
        assert_eq!(decode_forwarded_cert(&b64).unwrap(), issued.der);
        assert_eq!(
            decode_forwarded_cert(b64.trim_end_matches('=')).unwrap(),
            issued.der
        );

        for bad in [
            "",
            "   ",
            "%%%",
            "bm90IGEgY2VydA==",
            "-----BEGIN CERTIFICATE-----",
        ] {
            assert!(
                matches!(
                    decode_forwarded_cert(bad),
                    Err(PkiError::ForwardedCertificate)
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn thumbprints() {
        // SHA-256 of the empty input.
        assert_eq!(
            fingerprint_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(x5t_s256(b""), "47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU");
    }
}
