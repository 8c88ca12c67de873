//! The data user's key pair on disk: the secret key as the hex of its two primes in a
//! JSON file readable by its owner only, the public key as the hex of n.

use std::path::Path;

use anyhow::{bail, Context};
use dpca_common::paillier::{PublicKey, SecretKey};
use num_bigint::BigUint;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct KeyFile {
    kind: String,
    p: String,
    q: String,
}

const KIND: &str = "dpca-paillier-secret-key-v1";

fn parse_hex(s: &str, what: &str, path: &Path) -> anyhow::Result<BigUint> {
    BigUint::parse_bytes(s.as_bytes(), 16)
        .with_context(|| format!("{}: `{what}` is not hex", path.display()))
}

/// Writes the secret key; refuses to overwrite an existing file.
pub fn save_secret_key(sk: &SecretKey, path: &Path) -> anyhow::Result<()> {
    let (p, q) = sk.primes();
    let body = serde_json::to_string_pretty(&KeyFile {
        kind: KIND.into(),
        p: p.to_str_radix(16),
        q: q.to_str_radix(16),
    })?;
    dpca_shell::tls::write_file(path, body.as_bytes(), true)
        .with_context(|| "the secret key file must not exist yet".to_string())?;
    Ok(())
}

/// Reads a secret key written by [`save_secret_key`].
pub fn load_secret_key(path: &Path) -> anyhow::Result<SecretKey> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let kf: KeyFile = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a key file", path.display()))?;
    if kf.kind != KIND {
        bail!("{}: unknown key kind `{}`", path.display(), kf.kind);
    }
    let sk = SecretKey::from_primes(parse_hex(&kf.p, "p", path)?, parse_hex(&kf.q, "q", path)?)
        .with_context(|| format!("{}: invalid key", path.display()))?;
    // Re-check the size rule on load, not only at generation.
    PublicKey::from_modulus(sk.public().n().clone())
        .with_context(|| format!("{}", path.display()))?;
    Ok(sk)
}

/// Writes the public key as hex of n (owners may pin its fingerprint instead).
pub fn save_public_key(pk: &PublicKey, path: &Path) -> anyhow::Result<()> {
    std::fs::write(path, format!("{}\n", pk.n().to_str_radix(16)))
        .with_context(|| format!("cannot write {}", path.display()))
}
