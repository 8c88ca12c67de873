//! The one logging setup every role binary shares: `tracing` to stderr (stdout
//! carries the programs' machine-readable output), filtered by `RUST_LOG`.

/// Installs the stderr subscriber; call once at the start of `main`.
pub fn init() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
}
