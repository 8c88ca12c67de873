//! `user`: the data user of private distributed PCA. Parses the command line
//! (`dpca_user::cli`) and calls the library.

use std::path::Path;

use anyhow::Context;
use dpca_common::data::read_csv;
use dpca_common::paillier::SecretKey;
use dpca_shell::tls::{write_dev_pki_with, DevPkiLayout};
use dpca_user::cli::{Cli, Cmd, DevCertsArgs};
use dpca_user::local::SliceLayout;
use rand::rngs::OsRng;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    dpca_shell::text::exit(run().await)
}

/// The command the line names, run.
async fn run() -> anyhow::Result<()> {
    let cli: Cli = dpca_shell::config::parse()?;
    dpca_shell::logging::init(&cli.log);
    match cli.command {
        Cmd::Keygen {
            key_bits,
            secret,
            public,
        } => keygen(key_bits, &secret, &public),
        Cmd::DevCerts(a) => dev_certs(&a),
        Cmd::Split {
            data,
            owners,
            out,
            per_party_dirs,
            keep_existing,
        } => {
            let layout = SliceLayout {
                per_party: per_party_dirs,
                keep_existing,
            };
            split(&data, owners, &out, layout)
        }
        Cmd::Clean(a) => clean(&a.options()),
        Cmd::Local(a) => {
            let (opts, sweep) = a.options()?;
            if sweep.is_empty() {
                dpca_user::local::run(&opts).await.map(drop)
            } else {
                dpca_user::local::sweep(&opts, &sweep).await.map(drop)
            }
        }
        Cmd::Study(a) => {
            let opts = a.options().context("transport")?;
            dpca_user::local::run(&opts).await.map(drop)
        }
    }
}

/// `user keygen`: the key pair, and its fingerprint on standard output.
fn keygen(key_bits: u64, secret: &Path, public: &Path) -> anyhow::Result<()> {
    let sk = SecretKey::generate(key_bits, &mut OsRng).context("key generation")?;
    dpca_user::keys::save_secret_key(&sk, secret)?;
    dpca_user::keys::save_public_key(sk.public(), public)?;
    println!("{}", sk.public().fingerprint());
    Ok(())
}

/// `user dev-certs`: a development CA and every party's certificate.
fn dev_certs(a: &DevCertsArgs) -> anyhow::Result<()> {
    let layout = DevPkiLayout {
        per_party: a.per_party_dirs,
        keep_existing: a.keep_existing,
    };
    let pki = write_dev_pki_with(&a.out, &a.proxy_hosts, &a.users, &a.owner_names(), layout)?;
    println!(
        "wrote a development CA and certificates for the proxy ({}), users {} \
         and {} to {}",
        a.proxy_hosts.join(", "),
        a.users.join(", "),
        dpca_shell::text::count(pki.owners.len() as u64, "owner"),
        a.out.display()
    );
    Ok(())
}

/// `user split`: a table's rows in one slice per owner.
fn split(data: &Path, owners: usize, out: &Path, layout: SliceLayout) -> anyhow::Result<()> {
    let name = data.display().to_string();
    let file = std::fs::File::open(data).with_context(|| format!("cannot open {name}"))?;
    let table = read_csv(file, &name, None)?;
    let sizes = dpca_user::local::equal_slices(table.rows.len(), owners)?;
    let files = dpca_user::local::split_rows(&table, &sizes, out, layout)?;
    println!(
        "{} rows of {name} in {} slices under {}",
        table.rows.len(),
        files.len(),
        out.display()
    );
    Ok(())
}

/// `user clean`: cleaned vectors and their metrics.
fn clean(opts: &dpca_user::clean::CleanOptions) -> anyhow::Result<()> {
    let s = dpca_user::clean::run(opts)?;
    let cp = s
        .complete_privacy
        .map(|c| format!(", complete privacy {:.1}%", 100.0 * c))
        .unwrap_or_default();
    println!(
        "{} vectors cleaned: mean e_utility {:.6}, mean e_privacy {:.6}{cp}; \
         {} and {}",
        s.vectors,
        s.e_utility,
        s.e_privacy,
        opts.out.join("cleaned.csv").display(),
        opts.out.join("metrics.csv").display()
    );
    Ok(())
}
