//! `owner`: one data owner of private distributed PCA.

use std::path::PathBuf;

use clap::Parser;

/// Encrypts this owner's scatter share under the data user's key and streams it to
/// the proxy. Prints one JSON line with what was sent.
#[derive(Parser, Debug)]
#[command(name = "owner", version, about)]
struct Args {
    /// Proxy URL.
    #[arg(long, default_value = "http://127.0.0.1:50051", env = "DPCA_PROXY_URL")]
    proxy: String,
    /// Study to contribute to.
    #[arg(long, env = "DPCA_STUDY")]
    study: String,
    /// This owner's CSV file (header row, numeric feature columns).
    #[arg(long, env = "DPCA_DATA")]
    data: PathBuf,
    /// This owner's identity at the proxy.
    #[arg(long, env = "DPCA_OWNER_ID")]
    owner_id: String,
    /// SHA-256 fingerprint of the data user's public key, obtained out of band. The
    /// owner refuses to encrypt for any other key.
    #[arg(long, env = "DPCA_KEY_FINGERPRINT")]
    key_fingerprint: String,
    /// Label column to exclude from the features.
    #[arg(long)]
    label: Option<String>,
    /// Do not draw a progress bar.
    #[arg(long)]
    quiet: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    dpca_proto::logging::init();
    let args = Args::parse();
    let cfg = dpca_owner::OwnerConfig {
        proxy: args.proxy,
        study_id: args.study,
        data: args.data,
        owner_id: args.owner_id,
        key_fingerprint: args.key_fingerprint,
        label: args.label,
        progress: !args.quiet,
    };
    let report = dpca_owner::run(&cfg).await?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
