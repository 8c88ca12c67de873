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
    let bad = |r: String| TlsError::Flags(r);
    if proxy_hosts.is_empty() {
        return Err(bad("the proxy needs at least one host name".into()));
    }
    let mut names: Vec<&str> = vec!["ca", "proxy", "operator"];
    names.extend(users.iter().chain(owners).map(String::as_str));
    for n in &names {
        check_name(n).map_err(bad)?;
    }
    for (i, n) in names.iter().enumerate() {
        if names[..i].contains(n) {
            return Err(bad(format!(
                "name `{n}` is used twice (ca, proxy and operator are reserved)"
            )));
        }
    }
    let party_dir = |name: &str| match (layout.per_party, name) {
        (false, _) | (true, "ca") => dir.to_path_buf(),
        (true, "operator") => dir.join("proxy"),
        (true, n) => dir.join(n),
    };
    let files_of = |name: &str| TlsFiles::in_dir(&party_dir(name), name);
    let files: Vec<PathBuf> = names
        .iter()
        .flat_map(|n| {
            let f = files_of(n);
            [f.ca, f.cert, f.key]
        })
        .collect();
    let pki = || DevPki {
        dir: dir.to_path_buf(),
        proxy: files_of("proxy"),
        operator: files_of("operator"),
        users: users.iter().map(|u| (u.clone(), files_of(u))).collect(),
        owners: owners.iter().map(|o| (o.clone(), files_of(o))).collect(),
    };
    if layout.keep_existing && files.iter().all(|p| p.exists()) {
        return Ok(pki());
    }
    if let Some(existing) = files.iter().find(|p| p.exists()) {
        return Err(TlsError::Write {
            path: existing.clone(),
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "exists already; development certificates are never overwritten. To add a \
                 party, make a new development PKI (every party's files) in an empty folder \
                 (--out) and hand each party its new files; a deployment's CA issues \
                 certificates one by one (docs/DEPLOYING.md)",
            ),
        });
    }
    // Every folder holding certificates gets the CA's certificate: the top one
    // only, or each party's.
    let mut dirs: Vec<PathBuf> = names.iter().map(|n| party_dir(n)).collect();
    dirs.sort();
    dirs.dedup();
    for d in &dirs {
        std::fs::create_dir_all(d).map_err(|source| TlsError::Write {
            path: d.clone(),
            source,
        })?;
    }
    let gen = |e: rcgen::Error| TlsError::Generate(e.to_string());
    let now = time::OffsetDateTime::now_utc();
    let validity = |p: &mut CertificateParams| {
        // A day back for clocks slightly behind the issuer's.
        p.not_before = now - time::Duration::days(1);
        p.not_after = now + time::Duration::days(DEV_VALIDITY_DAYS);
    };

    let ca_key = KeyPair::generate().map_err(gen)?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name = subject("dpca development CA", "dpca-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    validity(&mut ca);
    let ca_cert = ca.self_signed(&ca_key).map_err(gen)?;
    for d in &dirs {
        write_file(&d.join("ca.pem"), ca_cert.pem().as_bytes(), false)?;
    }
    write_file(&dir.join("ca.key"), ca_key.serialize_pem().as_bytes(), true)?;
    let issuer = Issuer::new(ca, ca_key);

    // `server`: the proxy's own certificate; every other is a client's.
    let issue = |name: &str, role: Role, server: bool| -> Result<(), TlsError> {
        let key = KeyPair::generate().map_err(gen)?;
        let mut p = CertificateParams::default();
        p.distinguished_name = subject(name, role.unit());
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        if server {
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            p.subject_alt_names = proxy_hosts
                .iter()
                .map(|h| match h.parse::<std::net::IpAddr>() {
                    Ok(ip) => Ok(SanType::IpAddress(ip)),
                    Err(_) => h
                        .clone()
                        .try_into()
                        .map(SanType::DnsName)
                        .map_err(|_| TlsError::Flags(format!("`{h}` is not a host name"))),
                })
                .collect::<Result<_, _>>()?;
        } else {
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        }
        validity(&mut p);
        let cert = p.signed_by(&key, &issuer).map_err(gen)?;
        let files = files_of(name);
        write_file(&files.cert, cert.pem().as_bytes(), false)?;
        write_file(&files.key, key.serialize_pem().as_bytes(), true)
    };
    issue("proxy", Role::Proxy, true)?;
    issue("operator", Role::Proxy, false)?;
    for u in users {
        issue(u, Role::User, false)?;
    }
    for o in owners {
        issue(o, Role::Owner, false)?;
    }
    Ok(pki())
}

pub(super) fn subject(name: &str, unit: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "dpca");
    dn.push(DnType::OrganizationalUnitName, unit);
    dn.push(DnType::CommonName, name);
    dn
}
