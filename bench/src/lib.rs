//! What the bench binaries share: where the workspace and its data sets are, and
//! the workspace's programs, built next to the running bench.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// The workspace the benches were built from.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The bundled data sets.
pub fn data_dir() -> PathBuf {
    workspace_root().join("data")
}

/// Builds the programs of `packages` into the running bench's folder (same
/// profile) and returns that folder.
pub fn built_programs(packages: &[&str]) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("bench binary has no folder")?;
    dpca_user::programs::build_programs(dir, packages)?;
    Ok(dir.to_path_buf())
}

/// The program `name` in `dir`.
pub fn program(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}
