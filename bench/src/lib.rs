//! What the bench binaries share: where the workspace and its data sets are, the
//! workspace's programs, built next to the running bench, and the timing of the
//! primitives every bound is priced with.

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
    let dir = bench_dir()?;
    dpca_user::programs::build_programs(&dir, packages)?;
    Ok(dir)
}

/// The running bench's folder (`target/<profile>`).
fn bench_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    Ok(exe
        .parent()
        .context("bench binary has no folder")?
        .to_path_buf())
}

/// The three programs, built into the running bench's folder as a run from the
/// source tree builds them ([`dpca_user::programs::build_all_programs`]).
pub fn built_all_programs() -> anyhow::Result<PathBuf> {
    let dir = bench_dir()?;
    dpca_user::programs::build_all_programs(&dir)?;
    Ok(dir)
}

/// As [`built_programs`], built without GMP (every role on num-bigint) into
/// their own target folder, `target/num-bigint`: the old engine, for a bench to
/// run beside the new one.
pub fn built_programs_on_num_bigint(packages: &[&str]) -> anyhow::Result<PathBuf> {
    let target = workspace_root().join("target").join("num-bigint");
    let dir = target.join("release");
    let target_arg = target.to_string_lossy().into_owned();
    dpca_user::programs::build_programs_with(
        &dir,
        packages,
        &["--no-default-features", "--target-dir", &target_arg],
    )?;
    Ok(dir)
}

/// The program `name` in `dir`.
pub fn program(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}

/// `f` run on a pool of one thread: the one-core cost of a primitive that
/// spreads its work over rayon's threads (the randomizer's table). Timed on the
/// global pool it gives the wall time on every core, less than its CPU.
pub fn on_one_core<T: Send>(f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .context("a one-thread pool")?;
    Ok(pool.install(f))
}

/// Mean seconds per call of `f` over `reps` calls.
pub fn time<T>(reps: usize, mut f: impl FnMut() -> T) -> f64 {
    let t = std::time::Instant::now();
    for _ in 0..reps {
        std::hint::black_box(f());
    }
    t.elapsed().as_secs_f64() / reps as f64
}

/// Seconds per call of `f` in the fastest of `blocks` blocks of `reps` calls: the
/// price of a floor. Interference (the other core's work, a clock step) only
/// slows a block, so the fastest block is the steadiest reading of what the
/// primitive costs; a single mean moved by a third between runs on one machine.
pub fn fastest<T>(blocks: usize, reps: usize, mut f: impl FnMut() -> T) -> f64 {
    (0..blocks.max(1))
        .map(|_| time(reps, &mut f))
        .fold(f64::INFINITY, f64::min)
}

/// GMP's own multiplication mod n^2 (`mpz_mul`, `mpz_mod`) on two random
/// ciphertexts of `pk`, with no conversion: the floor the bounds are priced at,
/// measured in the running bench (the fastest of nine blocks, [`fastest`]).
pub fn raw_gmp_mulmod<R: rand::RngCore + rand::CryptoRng>(
    pk: &dpca_common::paillier::PublicKey,
    rng: &mut R,
) -> f64 {
    use num_bigint::BigUint;
    use rug::integer::Order;
    let to = |x: &BigUint| rug::Integer::from_digits(&x.to_u64_digits(), Order::Lsf);
    let (a, b) = (to(&pk.random_mask(rng)), to(&pk.random_mask(rng)));
    let n2 = to(pk.n_squared());
    fastest(9, 1000, || {
        let mut p = rug::Integer::from(&a * &b);
        p %= &n2;
        p
    })
}
