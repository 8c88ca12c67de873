//! An owner's encrypted row count E\[N_i\], signed with the key of its certificate.
//!
//! Under `mask` centering the user decrypts E\[N\] and proves N to the proxy. A proxy
//! that sent another ciphertext as E\[N\] (one owner's E\[N_i\], a class count) would
//! use the user as a decryption oracle. So each owner signs (study, E\[N_i\]) with
//! its TLS key, the proxy forwards the signed counts at the seal, and the user
//! decrypts only the product it forms itself of counts it verified: each signed by
//! a certificate of the study's CA that names an owner counted in the study.
//!
//! Each signature is over a domain-separated message, so it can be taken for
//! nothing else the key signs (the TLS handshake signs other structures).

use dpca_common::encoding::length_prefixed;
use ring::signature::{self, UnparsedPublicKey, VerificationAlgorithm};
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION,
    OID_SIG_ED25519,
};
use x509_parser::prelude::*;

use crate::tls::{peer_of, LoadedTls, Role, Transport};
use dpca_common::dp::Centering;

/// Why a signed count was refused.
#[derive(Debug, thiserror::Error)]
pub enum CountSignatureError {
    /// The certificate or CA does not parse.
    #[error("certificate: {0}")]
    Certificate(String),
    /// The certificate is not from the study's CA, or not valid now.
    #[error("the certificate of `{owner}` is not one the CA issued and holds valid: {why}")]
    Untrusted {
        /// The owner named.
        owner: String,
        /// What failed.
        why: String,
    },
    /// The certificate names another party than the owner counted.
    #[error("the count of owner `{owner}` is signed by the certificate of {signer}")]
    WrongSigner {
        /// The owner counted.
        owner: String,
        /// Who the certificate names.
        signer: String,
    },
    /// The certificate's key type is not one this code verifies.
    #[error("the certificate of `{0}` has a key type this proxy and user do not verify")]
    KeyType(String),
    /// The signature does not verify.
    #[error("the signature of `{0}` over its count or key does not verify")]
    BadSignature(String),
    /// Signing failed (the owner's own key).
    #[error("cannot sign the count or key: {0}")]
    Sign(String),
}

/// The TLS identity counts are signed and checked with, where they are: under
/// `mask`, whose E\[N\] the user decrypts for the proxy, over TLS (on plaintext
/// there is no key). The one rule owner, proxy and user follow.
pub fn signing_identity(centering: Centering, transport: &Transport) -> Option<&LoadedTls> {
    match (centering, transport) {
        (Centering::Mask, Transport::Tls(tls)) => Some(tls),
        (Centering::DpMean, _) | (Centering::Mask, Transport::InsecurePlaintext) => None,
    }
}

/// The message an owner signs for its count in a study: domain, study id, the
/// fingerprint of the user's key the study uses (the proxy chooses study ids, the
/// user the key, so a count cannot be replayed under another key) and the
/// ciphertext's bytes, each length-prefixed.
pub fn count_message(study_id: &str, key_fingerprint: &str, ciphertext: &[u8]) -> Vec<u8> {
    length_prefixed(&[
        b"dpca signed row count v1",
        study_id.as_bytes(),
        key_fingerprint.as_bytes(),
        ciphertext,
    ])
}

/// Signs the count with the owner's private key (PEM, as its certificate's).
#[cfg(feature = "count-signing")]
pub fn sign_count(
    key_pem: &[u8],
    study_id: &str,
    key_fingerprint: &str,
    ciphertext: &[u8],
) -> Result<Vec<u8>, CountSignatureError> {
    sign_message(
        key_pem,
        &count_message(study_id, key_fingerprint, ciphertext),
    )
}

/// `message` signed with the private key `key_pem`.
#[cfg(feature = "count-signing")]
fn sign_message(key_pem: &[u8], message: &[u8]) -> Result<Vec<u8>, CountSignatureError> {
    use rcgen::SigningKey;
    let pem = std::str::from_utf8(key_pem)
        .map_err(|e| CountSignatureError::Sign(format!("key is not PEM text: {e}")))?;
    let key =
        rcgen::KeyPair::from_pem(pem).map_err(|e| CountSignatureError::Sign(e.to_string()))?;
    key.sign(message)
        .map_err(|e| CountSignatureError::Sign(e.to_string()))
}

/// What a signed count claims: who signed which ciphertext for which study.
#[derive(Clone, Copy, Debug)]
pub struct CountClaim<'a> {
    /// The owner counted.
    pub owner: &'a str,
    /// The study.
    pub study_id: &'a str,
    /// The fingerprint of the study's (the user's) Paillier key.
    pub key_fingerprint: &'a str,
    /// E\[N_i\] as sent.
    pub ciphertext: &'a [u8],
}

/// Verifies that the claimed owner signed the claimed ciphertext for the study and
/// key with a certificate (`certificate`, DER) that the CA (`ca_pem`) issued
/// directly (no intermediate CA), that is valid now, is no CA itself and names
/// that owner.
pub fn verify_count(
    ca_pem: &[u8],
    certificate: &[u8],
    claim: CountClaim<'_>,
    signature: &[u8],
) -> Result<(), CountSignatureError> {
    let message = count_message(claim.study_id, claim.key_fingerprint, claim.ciphertext);
    verify_owner_signature(ca_pem, certificate, claim.owner, &message, signature)
}

/// Verifies that `owner` signed `message` with a certificate (`certificate`,
/// DER) that the CA (`ca_pem`) issued directly (no intermediate CA), that is
/// valid now, is no CA itself and names that owner.
fn verify_owner_signature(
    ca_pem: &[u8],
    certificate: &[u8],
    owner: &str,
    message: &[u8],
    signature: &[u8],
) -> Result<(), CountSignatureError> {
    let cert_err = |e: String| CountSignatureError::Certificate(e);
    let (_, ca_block) =
        x509_parser::pem::parse_x509_pem(ca_pem).map_err(|e| cert_err(format!("CA: {e}")))?;
    let ca = ca_block
        .parse_x509()
        .map_err(|e| cert_err(format!("CA: {e}")))?;
    let (_, leaf) =
        parse_x509_certificate(certificate).map_err(|e| cert_err(format!("of `{owner}`: {e}")))?;
    let untrusted = |why: String| CountSignatureError::Untrusted {
        owner: owner.to_string(),
        why,
    };
    if leaf.issuer() != ca.subject() {
        return Err(untrusted("another issuer".into()));
    }
    leaf.verify_signature(Some(ca.public_key()))
        .map_err(|e| untrusted(format!("the CA's signature: {e}")))?;
    if !leaf.validity().is_valid() {
        return Err(untrusted("outside its validity".into()));
    }
    if matches!(leaf.basic_constraints(), Ok(Some(bc)) if bc.value.ca) {
        return Err(untrusted("it is a CA certificate".into()));
    }
    let signer = peer_of(certificate).map_err(cert_err)?;
    if signer.role != Role::Owner || signer.name != owner {
        return Err(CountSignatureError::WrongSigner {
            owner: owner.to_string(),
            signer: signer.to_string(),
        });
    }
    let spki = leaf.public_key();
    let alg = algorithm(spki).ok_or_else(|| CountSignatureError::KeyType(owner.to_string()))?;
    UnparsedPublicKey::new(alg, &spki.subject_public_key.data)
        .verify(message, signature)
        .map_err(|_| CountSignatureError::BadSignature(owner.to_string()))
}

/// The algorithm the owner's key signs with (as `rcgen` signs: ECDSA with the
/// curve's hash, Ed25519, RSA PKCS#1 v1.5 with SHA-256).
fn algorithm(spki: &SubjectPublicKeyInfo<'_>) -> Option<&'static dyn VerificationAlgorithm> {
    let oid = &spki.algorithm.algorithm;
    if *oid == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki.algorithm.parameters.as_ref()?.as_oid().ok()?;
        if curve == OID_EC_P256 {
            return Some(&signature::ECDSA_P256_SHA256_ASN1);
        }
        if curve == OID_NIST_EC_P384 {
            return Some(&signature::ECDSA_P384_SHA384_ASN1);
        }
        return None;
    }
    if *oid == OID_SIG_ED25519 {
        return Some(&signature::ED25519);
    }
    if *oid == OID_PKCS1_RSAENCRYPTION {
        return Some(&signature::RSA_PKCS1_2048_8192_SHA256);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::write_dev_pki;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn der_of(pem: &[u8]) -> Vec<u8> {
        let (_, block) = x509_parser::pem::parse_x509_pem(pem).expect("pem");
        block.contents
    }

    fn claim<'a>(owner: &'a str, study_id: &'a str, ciphertext: &'a [u8]) -> CountClaim<'a> {
        CountClaim {
            owner,
            study_id,
            key_fingerprint: "k1",
            ciphertext,
        }
    }

    /// A development PKI (server `localhost`, user `user`) with `owners`, in a
    /// folder that lives as long as the PKI is used.
    fn pki_with(owners: &[&str]) -> (tempfile::TempDir, crate::tls::DevPki) {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = write_dev_pki(
            dir.path(),
            &strings(&["localhost"]),
            &strings(&["user"]),
            &strings(owners),
        )
        .expect("pki");
        (dir, pki)
    }

    fn read(p: &std::path::Path) -> Vec<u8> {
        std::fs::read(p).expect("read")
    }

    #[test]
    fn a_count_verifies_only_for_its_owner_study_ciphertext_and_ca() {
        let (_dir, pki) = pki_with(&["a", "b"]);
        let (_other_dir, other) = pki_with(&["a"]);
        let files = |pki: &crate::tls::DevPki, n: &str| pki.files(n).expect("files").clone();
        let (a, b, user) = (files(&pki, "a"), files(&pki, "b"), files(&pki, "user"));
        let ca = read(&a.ca);
        let cert_a = der_of(&read(&a.cert));
        let ct = vec![7u8; 512];
        let sig = sign_count(&read(&a.key), "s1", "k1", &ct).expect("sign");
        verify_count(&ca, &cert_a, claim("a", "s1", &ct), &sig).expect("the honest count");
        // The same count under another key of the user's (a replayed study id).
        let other_key = CountClaim {
            key_fingerprint: "k2",
            ..claim("a", "s1", &ct)
        };
        assert!(verify_count(&ca, &cert_a, other_key, &sig).is_err());
        // Another study, another ciphertext, another owner's name: refused.
        assert!(verify_count(&ca, &cert_a, claim("a", "s2", &ct), &sig).is_err());
        let mut forged = ct.clone();
        forged[0] ^= 1;
        assert!(matches!(
            verify_count(&ca, &cert_a, claim("a", "s1", &forged), &sig),
            Err(CountSignatureError::BadSignature(_))
        ));
        assert!(matches!(
            verify_count(&ca, &cert_a, claim("b", "s1", &ct), &sig),
            Err(CountSignatureError::WrongSigner { .. })
        ));
        // b's certificate with a's signature; a user's certificate; another CA.
        let cert_b = der_of(&read(&b.cert));
        assert!(verify_count(&ca, &cert_b, claim("b", "s1", &ct), &sig).is_err());
        let user_cert = der_of(&read(&user.cert));
        let user_sig = sign_count(&read(&user.key), "s1", "k1", &ct).expect("sign");
        assert!(matches!(
            verify_count(&ca, &user_cert, claim("user", "s1", &ct), &user_sig),
            Err(CountSignatureError::WrongSigner { .. })
        ));
        let foreign = files(&other, "a");
        let foreign_sig = sign_count(&read(&foreign.key), "s1", "k1", &ct).expect("sign");
        let foreign_cert = der_of(&read(&foreign.cert));
        assert!(matches!(
            verify_count(&ca, &foreign_cert, claim("a", "s1", &ct), &foreign_sig),
            Err(CountSignatureError::Untrusted { .. })
        ));
    }
}
