//! Time of the user's symmetric eigen-decomposition (all eigenpairs, as `pca` does)
//! against the dimension M, on random symmetric matrices like a noisy scatter, beside
//! nalgebra's one-thread `SymmetricEigen` (what `pca` used before) on the same
//! matrices.

use std::time::Instant;

use clap::Parser;
use dpca_common::linalg::pca;
use nalgebra::DMatrix;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// Eigen-decomposition time against M.
#[derive(Parser, Debug)]
#[command(name = "eigen", about)]
struct Args {
    /// Dimensions to time.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "64,90,500,1000,2000,4000"
    )]
    dims: Vec<usize>,
    /// Skip nalgebra above this M (it takes minutes at 4000).
    #[arg(long, default_value_t = 2000)]
    nalgebra_max: usize,
}

fn main() {
    let args = Args::parse();
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    println!("| M | pca (faer) s | nalgebra s | speedup |");
    println!("|---|---|---|---|");
    for &m in &args.dims {
        let a = DMatrix::from_fn(m, m, |_, _| rng.gen_range(-1.0..1.0));
        let s = &a + a.transpose();
        let t = Instant::now();
        let p = pca(&s, 10.min(m));
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(p);
        if m <= args.nalgebra_max {
            let t = Instant::now();
            std::hint::black_box(nalgebra::SymmetricEigen::new(s.clone()));
            let old = t.elapsed().as_secs_f64();
            println!("| {m} | {secs:.3} | {old:.3} | {:.1}x |", old / secs);
        } else {
            println!("| {m} | {secs:.3} | skipped | |");
        }
    }
}
