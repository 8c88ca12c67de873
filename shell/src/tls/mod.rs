//! Mutual TLS between the three roles (rustls through tonic).
//!
//! Every party holds a certificate from one CA that the proxy's operator runs, and
//! every connection authenticates both ends. The proxy presents a server
//! certificate for its host names. Owners and the user present client certificates
//! whose subject says who they are: organizational unit = role (`dpca-owner`,
//! `dpca-user`, `dpca-proxy`), common name = the party's name. An owner's name is its
//! owner id at the proxy. Client certificates carry no subject alternative name and
//! only the clientAuth usage, so no owner or user can pose as the proxy with its own
//! certificate; the proxy's carries only serverAuth, so it cannot pose as an owner.
//!
//! Plaintext runs only with an explicit `--insecure-plaintext`, which logs a warning.
//! `write_dev_pki` (feature `dev-ca`) creates a development CA and certificates for
//! a local run.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[cfg(feature = "dev-ca")]
mod dev_pki;
pub mod lane;
mod verifier;

#[cfg(feature = "dev-ca")]
pub use dev_pki::{write_dev_pki, write_dev_pki_with, DevPki, DevPkiLayout};
use verifier::PartyVerifier;

/// A party's role, written in its certificate's organizational unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The aggregation server.
    Proxy,
    /// The data user: opens studies, reveals N, fetches the release.
    User,
    /// A data owner: contributes its encrypted share.
    Owner,
}

impl Role {
    /// The organizational unit that names this role in a certificate.
    pub fn unit(self) -> &'static str {
        match self {
            Role::Proxy => "dpca-proxy",
            Role::User => "dpca-user",
            Role::Owner => "dpca-owner",
        }
    }

    fn from_unit(unit: &str) -> Option<Self> {
        [Role::Proxy, Role::User, Role::Owner]
            .into_iter()
            .find(|r| r.unit() == unit)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Proxy => "proxy",
            Role::User => "user",
            Role::Owner => "owner",
        })
    }
}

/// Who is at the other end of a connection, as its certificate says.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Peer {
    /// The role (organizational unit).
    pub role: Role,
    /// The name (common name); an owner's owner id.
    pub name: String,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} `{}`", self.role, self.name)
    }
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file could not be written (or exists already).
    #[error("cannot create {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file's content is not what it should be.
    #[error("{}: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The flags do not describe one transport.
    #[error("{0}")]
    Flags(String),
    /// Certificate generation failed.
    #[error("certificate generation: {0}")]
    Generate(String),
    /// The TLS configuration could not be built from the files read.
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// Reads the role and name off a DER certificate's subject. Exactly one
/// organizational unit naming a role and exactly one non-empty common name.
pub fn peer_of(der: &[u8]) -> Result<Peer, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let subject = cert.subject();
    let unit = single(subject.iter_organizational_unit(), "organizational unit")?;
    let name = single(subject.iter_common_name(), "common name")?;
    let role = Role::from_unit(&unit).ok_or_else(|| {
        format!("organizational unit `{unit}` names no role (dpca-owner, dpca-user, dpca-proxy)")
    })?;
    check_name(&name)?;
    Ok(Peer { role, name })
}

/// The one value of a subject attribute, read as text.
fn single<'a>(
    values: impl Iterator<Item = &'a x509_parser::x509::AttributeTypeAndValue<'a>>,
    what: &str,
) -> Result<String, String> {
    let values: Vec<&str> = values
        .map(|a| a.as_str().map_err(|e| format!("unreadable {what}: {e}")))
        .collect::<Result<_, _>>()?;
    match values.as_slice() {
        [v] => Ok((*v).to_string()),
        [] => Err(format!("the subject has no {what}")),
        _ => Err(format!("the subject has {} {what}s", values.len())),
    }
}

/// Party names become file names and owner ids: keep them to a safe alphabet.
fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !name.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "name `{name}`: use 1 to 64 of A-Z a-z 0-9 - _ . (not starting with a dot)"
        ))
    }
}

/// The three PEM files of one party.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA certificate every peer is checked against.
    pub ca: PathBuf,
    /// This party's certificate.
    pub cert: PathBuf,
    /// This party's private key.
    pub key: PathBuf,
}

impl TlsFiles {
    /// The files [`write_dev_pki`] writes for `name` in `dir`.
    pub fn in_dir(dir: &Path, name: &str) -> Self {
        Self {
            ca: dir.join("ca.pem"),
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}.key")),
        }
    }

    /// The flags that point a program at these files.
    pub fn args(&self) -> Vec<std::ffi::OsString> {
        vec![
            "--tls-ca".into(),
            self.ca.clone().into(),
            "--tls-cert".into(),
            self.cert.clone().into(),
            "--tls-key".into(),
            self.key.clone().into(),
        ]
    }

    /// Reads the files and checks that the certificate is `role`'s.
    pub fn load(&self, role: Role) -> Result<LoadedTls, TlsError> {
        let (ca_pem, cert_pem, key_pem) = (read(&self.ca)?, read(&self.cert)?, read(&self.key)?);
        let invalid = |path: &Path, reason: String| TlsError::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        let der = |path: &Path, pem: &[u8]| -> Result<Vec<u8>, TlsError> {
            let (_, block) = x509_parser::pem::parse_x509_pem(pem)
                .map_err(|e| invalid(path, format!("not a PEM certificate: {e}")))?;
            Ok(block.contents)
        };
        // The CA's subject names no party; only its form is checked here.
        der(&self.ca, &ca_pem)?;
        let me = peer_of(&der(&self.cert, &cert_pem)?).map_err(|r| invalid(&self.cert, r))?;
        if me.role != role {
            return Err(invalid(
                &self.cert,
                format!(
                    "this certificate is the {me}'s (organizational unit {}); the {role} \
                     needs one with organizational unit {}",
                    me.role.unit(),
                    role.unit()
                ),
            ));
        }
        if !String::from_utf8_lossy(&key_pem).contains("PRIVATE KEY-----") {
            return Err(invalid(&self.key, "not a PEM private key".into()));
        }
        Ok(LoadedTls {
            ca_pem,
            cert_pem,
            key_pem,
            me,
            crl: None,
        })
    }
}

/// The CA as roots, a certificate chain and its key.
type ParsedIdentity = (
    tokio_rustls::rustls::RootCertStore,
    Vec<tokio_rustls::rustls::pki_types::CertificateDer<'static>>,
    tokio_rustls::rustls::pki_types::PrivateKeyDer<'static>,
);

/// The bytes of the file at `path`, or which file could not be read.
pub(crate) fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Why `der` is not a revocation list `ca` issued and signed, if it is not.
fn check_crl_of(der: &[u8], ca: &x509_parser::certificate::X509Certificate) -> Result<(), String> {
    let (_, crl) = x509_parser::parse_x509_crl(der).map_err(|e| format!("does not parse: {e}"))?;
    if crl.issuer().as_raw() != ca.subject().as_raw() {
        return Err(format!(
            "issued by `{}`, not by the CA (`{}`)",
            crl.issuer(),
            ca.subject()
        ));
    }
    crl.verify_signature(ca.public_key())
        .map_err(|e| format!("not signed by the CA's key: {e}"))?;
    // Lists the handshake would find cover no party's certificate, and refuse
    // every client: said now rather than at the first handshake.
    use x509_parser::oid_registry::{
        OID_X509_EXT_DELTA_CRL_INDICATOR, OID_X509_EXT_ISSUER_DISTRIBUTION_POINT,
    };
    for ext in crl.extensions() {
        if ext.oid == OID_X509_EXT_ISSUER_DISTRIBUTION_POINT {
            return Err(
                "its scope is limited (issuing distribution point): give a full list".into(),
            );
        }
        if ext.oid == OID_X509_EXT_DELTA_CRL_INDICATOR {
            return Err("it is a delta list: give a full list".into());
        }
    }
    match ca.key_usage() {
        Ok(Some(usage)) if !usage.value.crl_sign() => {
            Err("the CA's key usage does not allow it to sign lists (cRLSign)".into())
        }
        Ok(_) => Ok(()),
        Err(e) => Err(format!("the CA's key usage does not parse: {e}")),
    }
}

/// A configuration that rustls refused, as a [`TlsError::Config`].
fn config_error(what: &str, e: &dyn fmt::Display) -> TlsError {
    TlsError::Config(format!("{what}: {e}"))
}

/// A party's CA, certificate and key, read and checked.
#[derive(Clone)]
pub struct LoadedTls {
    ca_pem: Vec<u8>,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    /// Who this party's certificate says it is.
    pub me: Peer,
    /// The CA's revocation list (`--tls-crl`) the peer's certificate is checked
    /// against: a client's at the proxy, the proxy's at a client, and an owner's
    /// count signature at the user; none, and no check, unless given.
    crl: Option<tokio_rustls::rustls::pki_types::CertificateRevocationListDer<'static>>,
}

impl fmt::Debug for LoadedTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the private key.
        f.debug_struct("LoadedTls").field("me", &self.me).finish()
    }
}

impl LoadedTls {
    /// This party's private key, as read: secret material for deriving keys only
    /// this party can compute (an owner's contribution ids). Never to be sent.
    pub fn private_key_pem(&self) -> &[u8] {
        &self.key_pem
    }

    /// The CA every peer is checked against (PEM).
    pub fn ca_pem(&self) -> &[u8] {
        &self.ca_pem
    }

    /// This party's files with the CA's certificate revocation list in the PEM
    /// file at `path` (one `X509 CRL` block): a peer whose certificate it lists
    /// is refused in the handshake (a client at the proxy, the proxy at a
    /// client). It must be the CA's, signed by its key, and a full list: one the
    /// handshake would find covers no certificate would leave every peer's
    /// status unknown, and every peer refused.
    pub fn with_crls(mut self, path: &Path) -> Result<Self, TlsError> {
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        use tokio_rustls::rustls::pki_types::CertificateRevocationListDer;
        let invalid = |reason: String| TlsError::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        let pem = read(path)?;
        let mut crls = CertificateRevocationListDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(format!("not a PEM revocation list: {e}")))?;
        let crl = match crls.len() {
            0 => return Err(invalid("holds no `X509 CRL` block".into())),
            1 => crls.remove(0),
            n => {
                return Err(invalid(format!(
                    "holds {n} lists: of lists of one CA, the handshake reads the first \
                     alone, so a later one's revocations would not count; give the CA's \
                     newest list alone"
                )))
            }
        };
        let (_, ca) = x509_parser::pem::parse_x509_pem(&self.ca_pem)
            .map_err(|e| invalid(format!("the CA certificate: {e}")))?;
        let ca = ca
            .parse_x509()
            .map_err(|e| invalid(format!("the CA certificate: {e}")))?;
        check_crl_of(&crl, &ca).map_err(invalid)?;
        // Read here as the handshake will read it: rustls's reader refuses some
        // lists the check above passes (a version 1 list, one without
        // `nextUpdate`), which would otherwise fail every connection later.
        let (roots, _, _) = self.parsed()?;
        tokio_rustls::rustls::client::WebPkiServerVerifier::builder(roots.into())
            .with_crls([crl.clone()])
            .build()
            .map_err(|e| invalid(format!("the TLS library cannot read it: {e}")))?;
        self.crl = Some(crl);
        Ok(self)
    }

    /// The proxy's TLS configuration, for its listener, which runs the handshake
    /// itself: its identity, client certificates required and checked against the
    /// CA (and its revocation list, if given: [`LoadedTls::with_crls`]), and
    /// HTTP/2 by ALPN (as tonic's own server configuration).
    pub fn rustls_server_config(&self) -> Result<tokio_rustls::rustls::ServerConfig, TlsError> {
        use tokio_rustls::rustls::server::WebPkiClientVerifier;
        use tokio_rustls::rustls::ServerConfig;
        let (roots, certs, key) = self.parsed()?;
        let mut clients = WebPkiClientVerifier::builder(roots.into());
        if let Some(crl) = &self.crl {
            // The CA issues every party's certificate itself: the end entity's
            // status is the one a list gives (an unknown one is refused).
            clients = clients
                .with_crls([crl.clone()])
                .only_check_end_entity_revocation();
        }
        let verifier = Arc::new(PartyVerifier(
            clients
                .build()
                .map_err(|e| config_error("client verifier", &e))?,
        ));
        let mut config = ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)
            .map_err(|e| config_error("identity", &e))?;
        config.alpn_protocols.push(b"h2".to_vec());
        Ok(config)
    }

    /// A client's configuration: the proxy checked against the CA (and its
    /// revocation list, if given: [`LoadedTls::with_crls`]), this party's
    /// certificate presented, HTTP/2 and then `extra_alpn` offered (the status
    /// lane's hint, [`lane::STATUS_LANE_ALPN`]).
    pub fn rustls_client_config(
        &self,
        extra_alpn: &[&[u8]],
    ) -> Result<tokio_rustls::rustls::ClientConfig, TlsError> {
        use tokio_rustls::rustls::client::WebPkiServerVerifier;
        let (roots, certs, key) = self.parsed()?;
        let mut server = WebPkiServerVerifier::builder(roots.into());
        if let Some(crl) = &self.crl {
            // The CA issues the proxy's certificate itself, as the server side
            // reads a client's.
            server = server
                .with_crls([crl.clone()])
                .only_check_end_entity_revocation();
        }
        let server = server
            .build()
            .map_err(|e| config_error("server verifier", &e))?;
        let mut config = tokio_rustls::rustls::ClientConfig::builder()
            .with_webpki_verifier(server)
            .with_client_auth_cert(certs, key)
            .map_err(|e| config_error("identity", &e))?;
        config.alpn_protocols = std::iter::once(&b"h2"[..])
            .chain(extra_alpn.iter().copied())
            .map(<[u8]>::to_vec)
            .collect();
        Ok(config)
    }

    /// The CA as roots, this party's certificate chain and its key, parsed.
    fn parsed(&self) -> Result<ParsedIdentity, TlsError> {
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = |pem: &[u8]| {
            CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| config_error("certificate", &e))
        };
        let mut roots = tokio_rustls::rustls::RootCertStore::empty();
        roots.add_parsable_certificates(certs(&self.ca_pem)?);
        let key =
            PrivateKeyDer::from_pem_slice(&self.key_pem).map_err(|e| config_error("key", &e))?;
        Ok((roots, certs(&self.cert_pem)?, key))
    }

    /// Whether the CA's revocation list given ([`LoadedTls::with_crls`]) names
    /// `certificate` (DER), which the caller has checked the CA issued: by its
    /// serial number, which a CA gives one certificate only.
    pub fn revokes(&self, certificate: &[u8]) -> Result<bool, TlsError> {
        let invalid = |reason: String| TlsError::Config(reason);
        let Some(der) = &self.crl else {
            return Ok(false);
        };
        let (_, cert) = x509_parser::parse_x509_certificate(certificate)
            .map_err(|e| invalid(format!("a certificate to check for revocation: {e}")))?;
        // Parsed when loaded; a list that no longer parses is an error, not a pass.
        let (_, crl) = x509_parser::parse_x509_crl(der)
            .map_err(|e| invalid(format!("the revocation list: {e}")))?;
        let listed = crl
            .iter_revoked_certificates()
            .any(|r| r.raw_serial() == cert.raw_serial());
        Ok(listed)
    }
}

/// How a party talks to the proxy.
#[derive(Clone, Debug)]
pub enum Transport {
    /// Mutual TLS.
    Tls(Arc<LoadedTls>),
    /// Plaintext, unauthenticated: only when asked for by name.
    InsecurePlaintext,
}

impl Transport {
    /// Reads a party's files from `dir` as [`write_dev_pki`] wrote them.
    pub fn from_dir(dir: &Path, name: &str, role: Role) -> Result<Self, TlsError> {
        Ok(Transport::Tls(Arc::new(
            TlsFiles::in_dir(dir, name).load(role)?,
        )))
    }

    /// The scheme a proxy URL must have on this transport.
    pub fn scheme(&self) -> &'static str {
        match self {
            Transport::Tls(_) => "https",
            Transport::InsecurePlaintext => "http",
        }
    }
}

/// The transport flags every program takes.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TransportArgs {
    /// CA certificate (PEM) that every peer's certificate must chain to.
    #[arg(long, env = "DPCA_TLS_CA", value_name = "PEM")]
    pub tls_ca: Option<PathBuf>,
    /// This party's certificate (PEM), issued by that CA for this party's role.
    #[arg(long, env = "DPCA_TLS_CERT", value_name = "PEM")]
    pub tls_cert: Option<PathBuf>,
    /// This party's private key (PEM).
    #[arg(long, env = "DPCA_TLS_KEY", value_name = "PEM")]
    pub tls_key: Option<PathBuf>,
    /// The CA's certificate revocation list (PEM, one `X509 CRL` block, signed
    /// by the CA). The proxy refuses in the handshake an owner, user or operator
    /// whose certificate it lists; an owner, user or operator refuses a proxy
    /// whose certificate it lists, and the user refuses an owner's count signed
    /// under a listed certificate. Read at startup: a program started before a
    /// new list takes it up when started again.
    #[arg(long, env = "DPCA_TLS_CRL", value_name = "PEM")]
    pub tls_crl: Option<PathBuf>,
    /// INSECURE: plaintext gRPC without authentication, instead of mutual TLS.
    /// Anyone on the network can read the traffic and pose as any party.
    #[arg(long, env = "DPCA_INSECURE_PLAINTEXT",
          conflicts_with_all = ["tls_ca", "tls_cert", "tls_key", "tls_crl"])]
    pub insecure_plaintext: bool,
}

impl TransportArgs {
    /// The transport the flags ask for, as `role`. TLS unless plaintext is asked for
    /// by name; then a warning is logged.
    pub fn transport(&self, role: Role) -> Result<Transport, TlsError> {
        self.transport_as(&[role])
    }

    /// [`TransportArgs::transport`] for a program that may run as any of `roles`
    /// (`proxy status`: the operator or a user), as the certificate's role says;
    /// refused with the first role's error if it is none of them.
    pub fn transport_as(&self, roles: &[Role]) -> Result<Transport, TlsError> {
        if self.insecure_plaintext {
            tracing::warn!(
                "--insecure-plaintext: no TLS; traffic is readable and parties are \
                 not authenticated"
            );
            return Ok(Transport::InsecurePlaintext);
        }
        match (&self.tls_ca, &self.tls_cert, &self.tls_key) {
            (Some(ca), Some(cert), Some(key)) => {
                let files = TlsFiles {
                    ca: ca.clone(),
                    cert: cert.clone(),
                    key: key.clone(),
                };
                let mut tls = load_as(&files, roles)?;
                if let Some(crl) = &self.tls_crl {
                    tls = tls
                        .with_crls(crl)
                        .map_err(|e| TlsError::Flags(format!("--tls-crl: {e}")))?;
                }
                Ok(Transport::Tls(Arc::new(tls)))
            }
            (ca, cert, key) => {
                let missing: Vec<&str> =
                    [("--tls-ca", ca), ("--tls-cert", cert), ("--tls-key", key)]
                        .into_iter()
                        .filter(|(_, v)| v.is_none())
                        .map(|(f, _)| f)
                        .collect();
                Err(TlsError::Flags(format!(
                    "mutual TLS needs {} (a development set: `user dev-certs`), or \
                     --insecure-plaintext to run without TLS",
                    missing.join(", ")
                )))
            }
        }
    }
}

/// `files` read as the first of `roles` their certificate is; the first role's
/// error if none.
fn load_as(files: &TlsFiles, roles: &[Role]) -> Result<LoadedTls, TlsError> {
    let mut first = None;
    for role in roles {
        match files.load(*role) {
            Ok(tls) => return Ok(tls),
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    Err(first.unwrap_or_else(|| TlsError::Flags("no role to load the certificate as".into())))
}

/// Creates `path` (never overwriting); secret files are readable by their owner only.
pub fn write_file(path: &Path, body: &[u8], secret: bool) -> Result<(), TlsError> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = secret;
    let wrap = |source| TlsError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut f = opts.open(path).map_err(wrap)?;
    f.write_all(body).map_err(wrap)
}

#[cfg(test)]
mod tests {
    use super::dev_pki::subject;
    use super::*;
    use rcgen::{CertificateParams, KeyPair};

    fn names(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("owner-{i:02}")).collect()
    }

    /// The proxy takes only its CA's revocation list, alone: one signed by
    /// another key under the same name (which would leave every client's status
    /// unknown, and every client refused), a file holding none, or two (the
    /// handshake would read the first alone) is refused by name.
    #[test]
    fn a_revocation_list_must_be_the_cas() {
        let dirs = [(); 2].map(|()| tempfile::tempdir().expect("tempdir"));
        let [pki, other] = [0, 1].map(|i| {
            write_dev_pki(dirs[i].path(), &names(1), &names(1), &["a".into()]).expect("pki")
        });
        let proxy = pki.proxy.load(Role::Proxy).expect("the proxy's files");
        let write = |name: &str, body: &[u8]| {
            let path = dirs[0].path().join(name);
            std::fs::write(&path, body).expect("write");
            path
        };
        let own_list = pki.revocation_list(&["a"]).expect("list");
        let own = write("own.pem", own_list.as_bytes());
        let checked = proxy.clone().with_crls(&own).expect("the CA's own list");
        checked
            .rustls_server_config()
            .expect("a configuration with it");
        let foreign = other.revocation_list(&["a"]).expect("list");
        let two = format!("{}{}", pki.revocation_list(&[]).expect("list"), own_list);
        for (path, says) in [
            (write("two.pem", two.as_bytes()), "holds 2 lists"),
            (
                write("foreign.pem", foreign.as_bytes()),
                "not signed by the CA's key",
            ),
            (
                write("none.pem", &std::fs::read(&pki.proxy.ca).expect("CA")),
                "no `X509 CRL`",
            ),
        ] {
            let err = proxy.clone().with_crls(&path).expect_err("refused");
            assert!(err.to_string().contains(says), "{err}");
            assert!(
                err.to_string().contains(&path.display().to_string()),
                "{err}"
            );
        }
    }

    /// `body` as one DER value of `tag`.
    fn der(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        match u8::try_from(body.len()) {
            Ok(n) if n < 0x80 => out.push(n),
            _ => {
                let len = body.len().to_be_bytes();
                let skip = len.iter().take_while(|&&b| b == 0).count();
                out.push(0x80 | (len.len() - skip) as u8);
                out.extend_from_slice(&len[skip..]);
            }
        }
        out.extend_from_slice(body);
        out
    }

    /// A revocation list (DER) the CA `ca`, whose key is in `dir`, issued and
    /// signed, of version 1 and with no `nextUpdate` (RFC 5280 allows both),
    /// revoking nothing: one rcgen cannot make, made field by field.
    fn version_1_list_without_next_update(
        dir: &Path,
        ca: &x509_parser::certificate::X509Certificate,
    ) -> Vec<u8> {
        use rcgen::SigningKey;
        let key = std::fs::read_to_string(dir.join("ca.key")).expect("CA key");
        let key = KeyPair::from_pem(&key).expect("CA key");
        assert_eq!(key.algorithm(), &rcgen::PKCS_ECDSA_P256_SHA256);
        // ecdsa-with-SHA256, no parameters.
        let algorithm = der(0x30, &der(0x06, &[0x2a, 0x86, 0x48, 0xce, 0x3d, 4, 3, 2]));
        let this_update = der(0x17, b"250101000000Z");
        let issuer = ca.subject().as_raw();
        let tbs = der(0x30, &[&algorithm[..], issuer, &this_update].concat());
        let signature = key.sign(&tbs).expect("signed");
        let bits = der(0x03, &[&[0u8][..], &signature].concat());
        der(0x30, &[tbs, algorithm, bits].concat())
    }

    /// A list the check of the CA's lists passes but the TLS library cannot read
    /// (version 1, no `nextUpdate`: both allowed by RFC 5280, refused by
    /// rustls's reader) is refused when it is given, naming the file, rather than
    /// failing every handshake later.
    #[test]
    fn a_revocation_list_the_tls_library_cannot_read_is_refused_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = write_dev_pki(dir.path(), &names(1), &names(1), &["a".into()]).expect("pki");
        let proxy = pki.proxy.load(Role::Proxy).expect("the proxy's files");
        let (_, ca) = x509_parser::pem::parse_x509_pem(proxy.ca_pem()).expect("CA PEM");
        let ca = ca.parse_x509().expect("CA certificate");
        let list = version_1_list_without_next_update(dir.path(), &ca);
        check_crl_of(&list, &ca).expect("the CA's own list");
        let path = dir.path().join("v1.pem");
        let pem = pem::encode(&pem::Pem::new("X509 CRL", list));
        std::fs::write(&path, pem).expect("write");
        let err = proxy.with_crls(&path).expect_err("refused");
        assert!(
            err.to_string().contains("the TLS library cannot read it"),
            "{err}"
        );
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn dev_pki_certificates_name_their_roles() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = write_dev_pki(
            dir.path(),
            &["localhost".into()],
            &["analyst".into()],
            &names(2),
        )
        .expect("dev pki");
        assert_eq!(pki.proxy.load(Role::Proxy).expect("proxy").me.name, "proxy");
        assert_eq!(
            pki.files("analyst")
                .expect("analyst")
                .load(Role::User)
                .expect("user")
                .me,
            Peer {
                role: Role::User,
                name: "analyst".into()
            }
        );
        for (name, files) in &pki.owners {
            assert_eq!(&files.load(Role::Owner).expect("owner").me.name, name);
        }
        // A certificate loaded for the wrong role is refused, naming the file.
        let err = pki.owners[0]
            .1
            .load(Role::User)
            .expect_err("owner cert as user");
        assert!(err.to_string().contains("owner-01.pem"), "{err}");
        assert!(err.to_string().contains("owner `owner-01`"), "{err}");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&pki.users[0].1.key)
                .expect("key")
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "private key readable by others: {mode:o}");
        }
    }

    #[test]
    fn dev_pki_refuses_existing_files_and_unsafe_names_before_writing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let hosts = ["localhost".to_string()];
        let user = ["user".to_string()];
        let err =
            write_dev_pki(dir.path(), &hosts, &user, &["../evil".into()]).expect_err("unsafe name");
        assert!(err.to_string().contains("../evil"), "{err}");
        let err =
            write_dev_pki(dir.path(), &hosts, &user, &["proxy".into()]).expect_err("reserved name");
        assert!(err.to_string().contains("twice"), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);
        write_dev_pki(dir.path(), &hosts, &user, &names(1)).expect("first");
        let err = write_dev_pki(dir.path(), &hosts, &user, &names(1)).expect_err("second");
        assert!(err.to_string().contains("ca.pem"), "{err}");
    }

    #[test]
    fn per_party_folders_hold_one_party_each_and_a_rerun_keeps_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let hosts = ["proxy".to_string()];
        let user = ["user".to_string()];
        let layout = DevPkiLayout {
            per_party: true,
            keep_existing: true,
        };
        let pki = write_dev_pki_with(dir.path(), &hosts, &user, &names(2), layout).expect("pki");
        let listing = |d: &str| {
            let mut v: Vec<String> = std::fs::read_dir(dir.path().join(d))
                .expect("party dir")
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            listing("owner-02"),
            ["ca.pem", "owner-02.key", "owner-02.pem"]
        );
        assert_eq!(
            listing("proxy"),
            [
                "ca.pem",
                "operator.key",
                "operator.pem",
                "proxy.key",
                "proxy.pem"
            ]
        );
        assert!(dir.path().join("ca.key").exists());
        assert_eq!(
            pki.owners[1].1.load(Role::Owner).expect("owner-02").me.name,
            "owner-02"
        );
        assert_eq!(
            pki.operator.load(Role::Proxy).expect("operator").me.name,
            "operator"
        );
        // A rerun keeps what is there (same certificate), ...
        let before = std::fs::read(&pki.proxy.cert).expect("proxy cert");
        write_dev_pki_with(dir.path(), &hosts, &user, &names(2), layout).expect("rerun");
        assert_eq!(std::fs::read(&pki.proxy.cert).expect("again"), before);
        // ... but a set with a file missing, or one more party, is refused.
        std::fs::remove_file(&pki.owners[0].1.key).expect("remove");
        let err = write_dev_pki_with(dir.path(), &hosts, &user, &names(2), layout)
            .expect_err("partial set");
        assert!(err.to_string().contains("exists already"), "{err}");
        let err = write_dev_pki_with(dir.path(), &hosts, &user, &names(3), layout)
            .expect_err("one more owner");
        assert!(err.to_string().contains("exists already"), "{err}");
    }

    #[test]
    fn transport_flags_name_what_is_missing() {
        let args = TransportArgs {
            tls_ca: Some("ca.pem".into()),
            ..Default::default()
        };
        let err = args.transport(Role::Owner).expect_err("incomplete");
        let msg = err.to_string();
        assert!(msg.contains("--tls-cert, --tls-key"), "{msg}");
        assert!(!msg.contains("--tls-ca,"), "{msg}");
        let plain = TransportArgs {
            insecure_plaintext: true,
            ..Default::default()
        };
        assert!(matches!(
            plain.transport(Role::Owner),
            Ok(Transport::InsecurePlaintext)
        ));
    }

    #[test]
    fn peer_of_refuses_certificates_without_a_role() {
        let key = KeyPair::generate().expect("key");
        let mut p = CertificateParams::default();
        p.distinguished_name = subject("someone", "marketing");
        let cert = p.self_signed(&key).expect("cert");
        let err = peer_of(cert.der()).expect_err("no role");
        assert!(err.contains("marketing"), "{err}");
        assert!(peer_of(b"not a certificate").is_err());
    }
}
