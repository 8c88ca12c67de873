//! Costs of the cryptographic primitives on this machine, measured in one run so the
//! ratios are meaningful: one multiplication mod n^2 (the floor every role is
//! measured against), textbook encryption r^n, short-exponent fixed-base encryption,
//! decryption with and without CRT. One thread.

use std::time::Instant;

use clap::Parser;
use dpca_common::paillier::{Ciphertext, SecretKey};
use dpca_common::randomizer::Randomizer;
use num_bigint::BigUint;
use num_integer::Integer;
use num_traits::One;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

/// Per-operation costs of Paillier at several key sizes.
#[derive(Parser, Debug)]
#[command(name = "crypto", about)]
struct Args {
    /// Key sizes in bits.
    #[arg(long, value_delimiter = ',', default_value = "2048,3072")]
    key_bits: Vec<u64>,
    /// Also write the table as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// Mean seconds per call of `f` over `reps` calls.
fn time<T>(reps: usize, mut f: impl FnMut() -> T) -> f64 {
    let t = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(f());
    }
    t.elapsed().as_secs_f64() / reps as f64
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut rows = Vec::new();
    println!(
        "{:>5}  {:>10}  {:>12}  {:>12}  {:>10}  {:>12}  {:>12}  {:>12}  {:>9}",
        "bits",
        "mul n^2",
        "enc textbook",
        "enc short",
        "= muls",
        "table build",
        "dec no-CRT",
        "dec CRT",
        "enc gain"
    );
    for &bits in &args.key_bits {
        let mut rng = ChaCha20Rng::seed_from_u64(bits);
        let sk = SecretKey::generate(bits, &mut rng)?;
        let pk = sk.public().clone();
        let n2 = pk.n_squared().clone();
        let a = pk.random_mask(&mut rng);
        let b = pk.random_mask(&mut rng);
        let mul = time(2000, || (&a * &b) % &n2);
        let m = BigUint::from(123_456_789u64);
        let enc_textbook = time(10, || pk.encrypt(&m, &mut rng));
        let t = Instant::now();
        let table = Randomizer::new(&pk, Randomizer::DEFAULT_WINDOW_BITS, &mut rng);
        let build = t.elapsed().as_secs_f64();
        let enc_short = time(200, || table.encrypt(&m, &mut rng));
        let c: Ciphertext = table.encrypt(&m, &mut rng)?;
        let dec_crt = time(20, || sk.decrypt(&c));
        // Textbook decryption: L(c^lambda mod n^2) * mu mod n.
        let (p, q) = sk.primes();
        let one = BigUint::one();
        let lambda = (p - &one).lcm(&(q - &one));
        let n = pk.n();
        let l = |x: BigUint| (x - &one) / n;
        let mu = l((n + &one).modpow(&lambda, &n2))
            .modinv(n)
            .ok_or_else(|| anyhow::anyhow!("mu not invertible"))?;
        let dec_plain = time(5, || (l(c.0.modpow(&lambda, &n2)) * &mu) % n);
        assert_eq!(
            (l(c.0.modpow(&lambda, &n2)) * &mu) % n,
            m,
            "textbook decryption"
        );
        println!(
            "{bits:>5}  {:>8.1}us  {:>10.2}ms  {:>10.3}ms  {:>10.0}  {:>11.2}s  {:>10.2}ms  {:>10.2}ms  {:>8.0}x",
            mul * 1e6,
            enc_textbook * 1e3,
            enc_short * 1e3,
            enc_short / mul,
            build,
            dec_plain * 1e3,
            dec_crt * 1e3,
            enc_textbook / enc_short
        );
        rows.push(serde_json::json!({
            "key_bits": bits,
            "mul_mod_n2_s": mul,
            "encrypt_textbook_s": enc_textbook,
            "encrypt_short_exponent_s": enc_short,
            "table_build_s": build,
            "decrypt_textbook_s": dec_plain,
            "decrypt_crt_s": dec_crt,
        }));
    }
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}
