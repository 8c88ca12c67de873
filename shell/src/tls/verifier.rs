//! The proxy's check of client certificates: the CA's, and a party named.

use std::sync::Arc;

use super::peer_of;

/// The CA's client verifier, which also refuses in the handshake a certificate
/// that names no party ([`peer_of`]: a role in its organizational unit and one
/// common name). The client then gets a fatal alert, which it knows not to retry,
/// and holds no connection slot; every certificate the proxy serves names a party
/// the service can authorize.
#[derive(Debug)]
pub(super) struct PartyVerifier(
    pub(super) Arc<dyn tokio_rustls::rustls::server::danger::ClientCertVerifier>,
);

impl tokio_rustls::rustls::server::danger::ClientCertVerifier for PartyVerifier {
    fn offer_client_auth(&self) -> bool {
        self.0.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.0.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[tokio_rustls::rustls::DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &tokio_rustls::rustls::pki_types::CertificateDer<'_>,
        intermediates: &[tokio_rustls::rustls::pki_types::CertificateDer<'_>],
        now: tokio_rustls::rustls::pki_types::UnixTime,
    ) -> Result<tokio_rustls::rustls::server::danger::ClientCertVerified, tokio_rustls::rustls::Error>
    {
        let verified = self.0.verify_client_cert(end_entity, intermediates, now)?;
        match peer_of(end_entity.as_ref()) {
            Ok(_) => Ok(verified),
            Err(why) => {
                tracing::warn!(reason = %why, "refused a client certificate that names no party");
                Err(tokio_rustls::rustls::Error::InvalidCertificate(
                    tokio_rustls::rustls::CertificateError::ApplicationVerificationFailure,
                ))
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &tokio_rustls::rustls::pki_types::CertificateDer<'_>,
        dss: &tokio_rustls::rustls::DigitallySignedStruct,
    ) -> Result<
        tokio_rustls::rustls::client::danger::HandshakeSignatureValid,
        tokio_rustls::rustls::Error,
    > {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &tokio_rustls::rustls::pki_types::CertificateDer<'_>,
        dss: &tokio_rustls::rustls::DigitallySignedStruct,
    ) -> Result<
        tokio_rustls::rustls::client::danger::HandshakeSignatureValid,
        tokio_rustls::rustls::Error,
    > {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<tokio_rustls::rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
