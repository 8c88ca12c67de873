//! Time of the user's symmetric eigen-decomposition (all eigenpairs, as `pca` does)
//! against the dimension M, on random symmetric matrices like a noisy scatter.

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
    #[arg(long, value_delimiter = ',', default_value = "64,90,500,1000,2000")]
    dims: Vec<usize>,
}

fn main() {
    let args = Args::parse();
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    println!("{:>6}  {:>10}", "M", "seconds");
    for &m in &args.dims {
        let a = DMatrix::from_fn(m, m, |_, _| rng.gen_range(-1.0..1.0));
        let s = &a + a.transpose();
        let t = Instant::now();
        let p = pca(&s, 10.min(m));
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(p);
        println!("{m:>6}  {secs:>10.3}");
    }
}
