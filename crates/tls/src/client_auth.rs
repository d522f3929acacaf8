//! Client certificates on the servers' TLS ports, checked as Pulsar's broker
//! (Java's TLS stack) checks them: optional, and when sent, chained to the
//! trust file's CAs and valid now.
//!
//! Owns: [`ClientCertificates`], a rustls `ClientCertVerifier` that hands
//! X.509 v3 certificates to webpki's verifier and checks version 1
//! certificates itself: webpki refuses v1 outright, but Java accepts them
//! and Pulsar's own test certificates (the official clients' CI) are v1.
//! For a v1 certificate: it must be issued directly by a trust-file CA
//! (issuer = the CA's subject, signature verified with the CA's key by the
//! provider's webpki algorithms) and be within its validity period; the
//! handshake signature is verified with its key. Intermediates are not
//! followed for v1 certificates (v1 has no extensions, so no CA
//! constraints to check along a chain).
//! Never: accepts a certificate that neither check passed, or makes a
//! client certificate mandatory (a client without one is served; what it
//! may do is authentication's business).

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, Error, RootCertStore,
    SignatureScheme,
};
use rustls_pki_types::{CertificateDer, SubjectPublicKeyInfoDer, UnixTime};

use crate::x509::Certificate;

/// The verifier of the TLS ports' client certificates.
#[derive(Debug)]
pub(crate) struct ClientCertificates {
    webpki: Arc<dyn ClientCertVerifier>,
    /// The trust file's CA certificates (DER), for v1 client certificates.
    roots: Vec<CertificateDer<'static>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertificates {
    /// A verifier trusting `roots` (the DER certificates of `store`).
    pub(crate) fn new(
        store: RootCertStore,
        roots: Vec<CertificateDer<'static>>,
        provider: Arc<CryptoProvider>,
    ) -> Result<ClientCertificates, String> {
        let algorithms = provider.signature_verification_algorithms;
        let webpki = WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider)
            .allow_unauthenticated()
            .build()
            .map_err(|e| e.to_string())?;
        Ok(ClientCertificates {
            webpki,
            roots,
            algorithms,
        })
    }

    /// Checks a v1 client certificate (the module doc says how).
    fn verify_v1(&self, leaf: &Certificate<'_>, now: UnixTime) -> Result<(), Error> {
        let now_secs = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
        if now_secs < leaf.not_before_secs {
            return Err(CertificateError::NotValidYet.into());
        }
        if now_secs > leaf.not_after_secs {
            return Err(CertificateError::Expired.into());
        }
        for root in &self.roots {
            let Some(ca) = Certificate::parse(root) else {
                continue;
            };
            if ca.subject != leaf.issuer {
                continue;
            }
            let verified = self.algorithms.all.iter().any(|algorithm| {
                algorithm.signature_alg_id().as_ref() == leaf.signature_algorithm
                    && algorithm.public_key_alg_id().as_ref() == ca.spki_algorithm
                    && algorithm
                        .verify_signature(ca.public_key, leaf.tbs, leaf.signature)
                        .is_ok()
            });
            if verified {
                return Ok(());
            }
        }
        Err(CertificateError::UnknownIssuer.into())
    }

    /// A TLS 1.2 handshake signature by a v1 certificate's key: each
    /// algorithm of the scheme whose key type matches, as rustls does.
    fn verify_v1_tls12(
        &self,
        message: &[u8],
        leaf: &Certificate<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        let candidates = self
            .algorithms
            .mapping
            .iter()
            .filter(|(scheme, _)| *scheme == dss.scheme)
            .flat_map(|(_, algorithms)| algorithms.iter());
        for algorithm in candidates {
            if algorithm.public_key_alg_id().as_ref() != leaf.spki_algorithm {
                continue;
            }
            return algorithm
                .verify_signature(leaf.public_key, message, dss.signature())
                .map(|()| HandshakeSignatureValid::assertion())
                .map_err(|_| Error::InvalidCertificate(CertificateError::BadSignature));
        }
        Err(Error::InvalidCertificate(CertificateError::BadSignature))
    }
}

/// The certificate, parsed, when it is a v1 one (the others go to webpki).
fn as_v1<'a>(cert: &'a CertificateDer<'_>) -> Option<Certificate<'a>> {
    Certificate::parse(cert.as_ref()).filter(|c| c.is_v1)
}

impl ClientCertVerifier for ClientCertificates {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.webpki.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        match as_v1(end_entity) {
            Some(leaf) => self
                .verify_v1(&leaf, now)
                .map(|()| ClientCertVerified::assertion()),
            None => self
                .webpki
                .verify_client_cert(end_entity, intermediates, now),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        match as_v1(cert) {
            Some(leaf) => self.verify_v1_tls12(message, &leaf, dss),
            None => self.webpki.verify_tls12_signature(message, cert, dss),
        }
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        match as_v1(cert) {
            Some(leaf) => rustls::crypto::verify_tls13_signature_with_raw_key(
                message,
                &SubjectPublicKeyInfoDer::from(leaf.spki),
                dss,
                &self.algorithms,
            ),
            None => self.webpki.verify_tls13_signature(message, cert, dss),
        }
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}
