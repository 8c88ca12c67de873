//! A development CA and a certificate for every party, for local runs, tests and
//! the container simulation (feature `dev-ca`: the proxy and the owner need none of
//! it).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use super::{check_name, write_file, Role, TlsError, TlsFiles};

/// The files of a development PKI.
#[derive(Clone, Debug)]
pub struct DevPki {
    /// The folder holding everything.
    pub dir: PathBuf,
    /// The proxy's files.
    pub proxy: TlsFiles,
    /// The operator's client certificate (role `dpca-proxy`, name `operator`), for
    /// `proxy status`.
    pub operator: TlsFiles,
    /// Each data user's name and files.
    pub users: Vec<(String, TlsFiles)>,
    /// Each owner's name and files.
    pub owners: Vec<(String, TlsFiles)>,
}

impl DevPki {
    /// The files of the user or owner called `name`.
    pub fn files(&self, name: &str) -> Option<&TlsFiles> {
        self.users
            .iter()
            .chain(&self.owners)
            .find(|(n, _)| n == name)
            .map(|(_, f)| f)
    }

    /// A revocation list (PEM) of the development CA naming the certificates of
    /// the parties `revoked` (users and owners by name, `proxy`, `operator`):
    /// for trials of `--tls-crl`.
    pub fn revocation_list(&self, revoked: &[&str]) -> Result<String, TlsError> {
        use rcgen::{
            CertificateRevocationListParams, KeyIdMethod, RevocationReason, RevokedCertParams,
            SerialNumber,
        };
        let now = time::OffsetDateTime::now_utc();
        let mut revoked_certs = Vec::new();
        for name in revoked {
            let files = match *name {
                "proxy" => Some(&self.proxy),
                "operator" => Some(&self.operator),
                _ => self.files(name),
            }
            .ok_or_else(|| TlsError::Flags(format!("no certificate of `{name}` to revoke")))?;
            revoked_certs.push(RevokedCertParams {
                serial_number: SerialNumber::from_slice(&serial_of(&files.cert)?),
                revocation_time: now,
                reason_code: Some(RevocationReason::KeyCompromise),
                invalidity_date: None,
            });
        }
        let key = super::read(&self.dir.join("ca.key"))?;
        let key = KeyPair::from_pem(&String::from_utf8_lossy(&key)).map_err(generation)?;
        let issuer = Issuer::new(ca_params(now), key);
        let list = CertificateRevocationListParams {
            this_update: now - time::Duration::days(1),
            next_update: now + time::Duration::days(DEV_VALIDITY_DAYS),
            crl_number: SerialNumber::from(now.unix_timestamp().unsigned_abs()),
            issuing_distribution_point: None,
            revoked_certs,
            key_identifier_method: KeyIdMethod::Sha256,
        };
        list.signed_by(&issuer)
            .and_then(|l| l.pem())
            .map_err(generation)
    }
}

/// The serial number of the certificate at `path` (PEM).
fn serial_of(path: &Path) -> Result<Vec<u8>, TlsError> {
    let invalid = |reason: String| TlsError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let pem = super::read(path)?;
    let (_, block) =
        x509_parser::pem::parse_x509_pem(&pem).map_err(|e| invalid(format!("not PEM: {e}")))?;
    let cert = block
        .parse_x509()
        .map_err(|e| invalid(format!("not a certificate: {e}")))?;
    Ok(cert.raw_serial().to_vec())
}

/// How long development certificates are valid.
const DEV_VALIDITY_DAYS: i64 = 90;

/// Writes a development CA (`ca.pem`, `ca.key`) and certificates into `dir`: the
/// proxy's (`proxy.pem`, `proxy.key`, valid for `proxy_hosts`: DNS names or IP
/// addresses), the operator's (`operator.pem`, `operator.key`, for `proxy status`), one per user (`USER.pem`, `USER.key`) and one per owner
/// (`OWNER.pem`, `OWNER.key`). Private keys are readable by their owner only.
/// Refuses, before writing anything, if any of the files exists or a name is unsafe.
pub fn write_dev_pki(
    dir: &Path,
    proxy_hosts: &[String],
    users: &[String],
    owners: &[String],
) -> Result<DevPki, TlsError> {
    write_dev_pki_with(dir, proxy_hosts, users, owners, DevPkiLayout::default())
}

/// Where [`write_dev_pki_with`] puts the files, and what it does with a folder
/// that holds them already.
#[derive(Clone, Copy, Debug, Default)]
pub struct DevPkiLayout {
    /// One subfolder per party (`proxy/`, each user's and owner's), holding
    /// `ca.pem` and that party's certificate and key only (the operator's go with
    /// the proxy's), so each can be handed to its party whole; the CA key stays
    /// at the top.
    pub per_party: bool,
    /// When every file is there already, keep them and succeed (a rerun of a
    /// setup step); when only some are, still refuse.
    pub keep_existing: bool,
}

/// [`write_dev_pki`] with a choice of layout.
pub fn write_dev_pki_with(
    dir: &Path,
    proxy_hosts: &[String],
    users: &[String],
    owners: &[String],
    layout: DevPkiLayout,
) -> Result<DevPki, TlsError> {
    if proxy_hosts.is_empty() {
        return Err(TlsError::Flags(
            "the proxy needs at least one host name".into(),
        ));
    }
    let mut names: Vec<&str> = vec!["ca", "proxy", "operator"];
    names.extend(users.iter().chain(owners).map(String::as_str));
    check_names(&names)?;
    let paths = PkiPaths { dir, layout };
    let pki = || DevPki {
        dir: dir.to_path_buf(),
        proxy: paths.files_of("proxy"),
        operator: paths.files_of("operator"),
        users: users
            .iter()
            .map(|u| (u.clone(), paths.files_of(u)))
            .collect(),
        owners: owners
            .iter()
            .map(|o| (o.clone(), paths.files_of(o)))
            .collect(),
    };
    let files: Vec<PathBuf> = names
        .iter()
        .flat_map(|n| {
            let f = paths.files_of(n);
            [f.ca, f.cert, f.key]
        })
        .collect();
    if layout.keep_existing && files.iter().all(|p| p.exists()) {
        return Ok(pki());
    }
    refuse_existing(&files)?;
    let ca = DevCa::new(dir, &paths.create_dirs(&names)?)?;
    let issue = |name: &str, role, hosts| ca.issue(&paths.files_of(name), name, role, hosts);
    issue("proxy", Role::Proxy, Some(proxy_hosts))?;
    issue("operator", Role::Proxy, None)?;
    for u in users {
        issue(u, Role::User, None)?;
    }
    for o in owners {
        issue(o, Role::Owner, None)?;
    }
    Ok(pki())
}

/// Every name safe as a file name and used once (`ca`, `proxy` and `operator`
/// among them).
fn check_names(names: &[&str]) -> Result<(), TlsError> {
    for n in names {
        check_name(n).map_err(TlsError::Flags)?;
    }
    for (i, n) in names.iter().enumerate() {
        if names[..i].contains(n) {
            return Err(TlsError::Flags(format!(
                "name `{n}` is used twice (ca, proxy and operator are reserved)"
            )));
        }
    }
    Ok(())
}

/// Where each party's files go in a layout.
struct PkiPaths<'a> {
    dir: &'a Path,
    layout: DevPkiLayout,
}

impl PkiPaths<'_> {
    fn party_dir(&self, name: &str) -> PathBuf {
        match (self.layout.per_party, name) {
            (false, _) | (true, "ca") => self.dir.to_path_buf(),
            (true, "operator") => self.dir.join("proxy"),
            (true, n) => self.dir.join(n),
        }
    }

    fn files_of(&self, name: &str) -> TlsFiles {
        TlsFiles::in_dir(&self.party_dir(name), name)
    }

    /// Creates the folders of every party named, and returns them: each gets the
    /// CA's certificate (the top one only, or each party's).
    fn create_dirs(&self, names: &[&str]) -> Result<Vec<PathBuf>, TlsError> {
        let mut dirs: Vec<PathBuf> = names.iter().map(|n| self.party_dir(n)).collect();
        dirs.sort();
        dirs.dedup();
        for d in &dirs {
            std::fs::create_dir_all(d).map_err(|source| TlsError::Write {
                path: d.clone(),
                source,
            })?;
        }
        Ok(dirs)
    }
}

/// Refuses, naming the first, if any of `files` exists.
fn refuse_existing(files: &[PathBuf]) -> Result<(), TlsError> {
    match files.iter().find(|p| p.exists()) {
        None => Ok(()),
        Some(existing) => Err(TlsError::Write {
            path: existing.clone(),
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "exists already; development certificates are never overwritten. To add a \
                 party, make a new development PKI (every party's files) in an empty folder \
                 (--out) and hand each party its new files; a deployment's CA issues \
                 certificates one by one (docs/DEPLOYING.md)",
            ),
        }),
    }
}

fn generation(e: rcgen::Error) -> TlsError {
    TlsError::Generate(e.to_string())
}

/// A day back for clocks slightly behind the issuer's, and `DEV_VALIDITY_DAYS`
/// ahead.
fn set_validity(p: &mut CertificateParams, now: time::OffsetDateTime) {
    p.not_before = now - time::Duration::days(1);
    p.not_after = now + time::Duration::days(DEV_VALIDITY_DAYS);
}

/// The development CA's certificate, as issued at `now`: what it signs with,
/// whether a certificate or a revocation list.
fn ca_params(now: time::OffsetDateTime) -> CertificateParams {
    let mut ca = CertificateParams::default();
    ca.distinguished_name = subject("dpca development CA", "dpca-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    set_validity(&mut ca, now);
    ca
}

/// The development CA, its certificate written to every folder that holds
/// certificates and its key to the top one.
struct DevCa {
    issuer: Issuer<'static, KeyPair>,
    now: time::OffsetDateTime,
}

impl DevCa {
    fn new(dir: &Path, cert_dirs: &[PathBuf]) -> Result<Self, TlsError> {
        let now = time::OffsetDateTime::now_utc();
        let key = KeyPair::generate().map_err(generation)?;
        let ca = ca_params(now);
        let cert = ca.self_signed(&key).map_err(generation)?;
        for d in cert_dirs {
            write_file(&d.join("ca.pem"), cert.pem().as_bytes(), false)?;
        }
        write_file(&dir.join("ca.key"), key.serialize_pem().as_bytes(), true)?;
        Ok(Self {
            issuer: Issuer::new(ca, key),
            now,
        })
    }

    /// Issues `name`'s certificate and key into `files`: a server's for the
    /// proxy's host names when `server_hosts` is given, else a client's.
    fn issue(
        &self,
        files: &TlsFiles,
        name: &str,
        role: Role,
        server_hosts: Option<&[String]>,
    ) -> Result<(), TlsError> {
        let key = KeyPair::generate().map_err(generation)?;
        let mut p = CertificateParams::default();
        p.distinguished_name = subject(name, role.unit());
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        match server_hosts {
            Some(hosts) => {
                p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
                p.subject_alt_names = hosts
                    .iter()
                    .map(|h| host_name(h))
                    .collect::<Result<_, _>>()?;
            }
            None => p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth],
        }
        set_validity(&mut p, self.now);
        let cert = p.signed_by(&key, &self.issuer).map_err(generation)?;
        write_file(&files.cert, cert.pem().as_bytes(), false)?;
        write_file(&files.key, key.serialize_pem().as_bytes(), true)
    }
}

/// A host name or IP address as a subject alternative name.
fn host_name(h: &str) -> Result<SanType, TlsError> {
    match h.parse::<std::net::IpAddr>() {
        Ok(ip) => Ok(SanType::IpAddress(ip)),
        Err(_) => h
            .to_string()
            .try_into()
            .map(SanType::DnsName)
            .map_err(|_| TlsError::Flags(format!("`{h}` is not a host name"))),
    }
}

pub(super) fn subject(name: &str, unit: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "dpca");
    dn.push(DnType::OrganizationalUnitName, unit);
    dn.push(DnType::CommonName, name);
    dn
}
