//! Costs of the cryptographic primitives on this machine, on both arithmetic
//! engines (num-bigint and GMP), measured in one run so the ratios are meaningful:
//! one multiplication mod n^2 (the floor every role is measured against), textbook
//! encryption r^n, short-exponent fixed-base encryption, decryption with and
//! without CRT (GMP: `mpz_powm_sec`, constant time in the secret exponent), and a
//! 16-term multi-exponentiation. GMP's raw multiplication,
//! with no conversion from and to num-bigint, is the floor. One thread; each cost
//! is the fastest of a few blocks of calls, as the floor is read. Last, the
//! randomizer's table and a key's generation, the primitives spread over the
//! cores: on one core and on all of them; and the `mask` release's mask term per
//! segment, computed the two ways the release has had (windowed simultaneous
//! exponentiation, Yao's method).

use clap::Parser;
use dpca_bench::{fastest, on_one_core, raw_gmp_mulmod, time};
use dpca_common::encoding::TriangleLayout;
use dpca_common::paillier::{random_below, Ciphertext, PowerTable, PublicKey, SecretKey};
use dpca_common::radix::{self, RadixPowers};
use dpca_common::randomizer::Randomizer;
use num_bigint::BigUint;
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

/// One engine's costs at one key size.
struct Costs {
    mul: f64,
    enc_textbook: f64,
    enc_short: f64,
    dec_crt: f64,
    dec_textbook: f64,
    multi_exp: f64,
}

/// The primitives on `sk`'s engine, on the same operands.
fn measure(sk: &SecretKey, rng: &mut ChaCha20Rng) -> anyhow::Result<Costs> {
    let pk = sk.public();
    let ring = pk.ring();
    let a = pk.random_mask(rng);
    let b = pk.random_mask(rng);
    // As the raw floor it is compared with is read.
    let mul = fastest(9, 1000, || ring.mul(&a, &b));
    let m = BigUint::from(123_456_789u64);
    let enc_textbook = fastest(3, 4, || pk.encrypt(&m, &mut *rng));
    let table = Randomizer::new(pk, Randomizer::DEFAULT_WINDOW_BITS, &mut *rng);
    let enc_short = fastest(5, 40, || table.encrypt(&m, &mut *rng));
    let c: Ciphertext = table.encrypt(&m, &mut *rng)?;
    let dec_crt = fastest(5, 4, || sk.decrypt(&c));
    let dec_textbook = fastest(3, 2, || sk.decrypt_textbook(&c));
    anyhow::ensure!(sk.decrypt(&c) == m, "CRT decryption");
    anyhow::ensure!(sk.decrypt_textbook(&c) == m, "textbook decryption");
    // 16 ciphertexts, each to a 64-bit power, multiplied.
    let cts: Vec<Ciphertext> = (0..16)
        .map(|i| table.encrypt(&BigUint::from(i as u64), &mut *rng))
        .collect::<Result<_, _>>()?;
    let ks: Vec<BigUint> = (0..16u64)
        .map(|i| BigUint::from(0x9e37_79b9_7f4a_7c15u64 ^ i))
        .collect();
    let terms: Vec<(&Ciphertext, &BigUint)> = cts.iter().zip(&ks).collect();
    let multi_exp = fastest(5, 4, || pk.multi_scale(&terms));
    Ok(Costs {
        mul,
        enc_textbook,
        enc_short,
        dec_crt,
        dec_textbook,
        multi_exp,
    })
}

/// The two half-size exponentiations of CRT decryption on GMP, with the
/// constant-time `mpz_powm_sec` (what decryption uses) and with `mpz_powm`.
fn powm_sec_cost(sk: &SecretKey, rng: &mut ChaCha20Rng) -> (f64, f64) {
    use dpca_common::arith::ModRing;
    let (p, q) = sk.primes();
    let one = BigUint::from(1u32);
    let halves: Vec<(ModRing, BigUint)> = [p, q]
        .iter()
        .map(|x| (ModRing::new(*x * *x), *x - &one))
        .collect();
    let c = sk.public().random_mask(rng);
    let run = |secret: bool| {
        fastest(5, 4, || {
            let mut out = Vec::with_capacity(2);
            for (ring, e) in &halves {
                out.push(if secret {
                    ring.pow_secret(&c, e)
                } else {
                    ring.pow(&c, e)
                });
            }
            out
        })
    };
    (run(true), run(false))
}

/// The randomizer's table at widths an owner and the proxy use, built on one
/// core and on every core of the pool in turn (the fastest of five each): its
/// bound in the study bench is the first, a role's wall time the second.
fn table_costs(pk: &PublicKey, rng: &mut ChaCha20Rng) -> anyhow::Result<Vec<(usize, f64, f64)>> {
    let mut out = Vec::new();
    for w in [5, 6, 8] {
        let (mut one, mut all) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..5 {
            one = one.min(on_one_core(|| time(1, || Randomizer::new(pk, w, rng)))?);
            all = all.min(time(1, || Randomizer::new(pk, w, rng)));
        }
        out.push((w, one, all));
    }
    Ok(out)
}

/// Keys generated in a row from fixed seeds: the mean seconds a key on a pool of
/// one thread and on the whole pool. The primes depend on the seed alone, so both
/// find the same keys.
fn keygen_costs(bits: u64) -> anyhow::Result<(f64, f64)> {
    const KEYS: u64 = 20;
    let all_keys = || -> anyhow::Result<f64> {
        let t = std::time::Instant::now();
        for seed in 0..KEYS {
            SecretKey::generate(bits, &mut ChaCha20Rng::seed_from_u64(seed))?;
        }
        Ok(t.elapsed().as_secs_f64() / KEYS as f64)
    };
    Ok((on_one_core(all_keys)??, all_keys()?))
}

/// The `mask` release's mask term for one full segment of a layout like M = 1000's
/// (slots of 69 bits, a 74-bit mask, as many segments a row as M = 1000 has at
/// this key size), both ways, on GMP: E\[v_seg\]^(b_i) prod_t E\[v_i 2^(69
/// t)]^(b_(j+t)) by windowed simultaneous exponentiation (each shifted base's
/// table built once a row, the segment's share of it charged here), and
/// E\[v_seg\]^(b_i) E\[v_i\]^(B_seg) by Yao's method on radix powers (v_seg's built
/// here; the row's come off the chain the shifts need anyway). The chain itself is
/// left out of both: the windowed way's ran through exponentiations by 2^69, Yao's
/// keeps its powers, one squaring at a time, and runs a few dozen squarings
/// further; the whole-study comparison in docs/BENCHMARKS.md includes it.
fn mask_term_costs(pk: &PublicKey, rng: &mut ChaCha20Rng) -> anyhow::Result<(f64, f64)> {
    const WIDTH: usize = 69;
    const MASK_BITS: usize = 74;
    const DIM: usize = 1000;
    let slots = (pk.bits() as usize - 1) / WIDTH;
    let segments_a_row = TriangleLayout::new(DIM, slots).len().div_ceil(DIM);
    let (v_i, v_seg) = (pk.random_mask(rng), pk.random_mask(rng));
    let b: Vec<BigUint> = (0..=slots)
        .map(|_| random_below(&(BigUint::from(1u8) << MASK_BITS), rng))
        .collect();
    let ring = pk.ring();
    let shifted: Vec<Ciphertext> = radix::squarings(pk, ring.elem(&v_i), &[(WIDTH as u64, slots)])
        .into_iter()
        .flatten()
        .map(|e| Ciphertext(e.to_big()))
        .collect();
    let window = PowerTable::window_for(MASK_BITS as u64, segments_a_row);
    let mut tables: Vec<PowerTable> = Vec::new();
    let row_tables = fastest(3, 1, || {
        tables = shifted.iter().map(|c| pk.power_table(c, window)).collect();
    });
    let straus = || {
        let v_table = pk.power_table(&Ciphertext(v_seg.clone()), window);
        let mut terms = vec![(&v_table, &b[slots])];
        terms.extend((0..slots).map(|t| (&tables[t], &b[t])));
        pk.multi_scale_tables(&terms)
    };
    let b_seg = radix::shifted_sum(&b[..slots], WIDTH);
    let r = radix::radix_for(b_seg.bits() + MASK_BITS as u64);
    let row = RadixPowers::new(pk, ring.elem(&v_i), r, b_seg.bits());
    let yao = || {
        let powers = RadixPowers::new(pk, ring.elem(&v_seg), r, MASK_BITS as u64);
        radix::product(pk, &[(&row, &b_seg), (&powers, &b[slots])])
    };
    anyhow::ensure!(yao()? == straus(), "the two ways of the mask term");
    let straus_cost = fastest(5, 4, straus) + row_tables / segments_a_row as f64;
    Ok((straus_cost, fastest(5, 4, yao)))
}

/// The GMP-only lines of one key size (raw multiplication, `powm_sec`, the
/// randomizer's table, key generation, the mask term), their figures also put
/// in `gmp_row`, the JSON row of GMP at that size.
fn gmp_extras(
    bits: u64,
    gmp: &Costs,
    raw: f64,
    gmp_key: &SecretKey,
    rng: &mut ChaCha20Rng,
    gmp_row: Option<&mut serde_json::Value>,
) -> anyhow::Result<()> {
    println!(
        "{bits:>5}  {:>10}  {:>7.2}us   (GMP's mpz_mul + mpz_mod with no conversion; our gmp mul is {:.2}x of it)",
        "raw gmp",
        raw * 1e6,
        gmp.mul / raw
    );
    let (sec, plain) = powm_sec_cost(gmp_key, rng);
    println!(
        "{bits:>5}  {:>10}  CRT exponentiations {:.2}ms with mpz_powm_sec, {:.2}ms with mpz_powm: constant time costs {:.2}x",
        "powm_sec",
        sec * 1e3,
        plain * 1e3,
        sec / plain
    );
    let tables = table_costs(gmp_key.public(), rng)?;
    print_table_costs(bits, &tables);
    let (one, all) = keygen_costs(bits)?;
    println!(
        "{bits:>5}  {:>10}  a key, mean of twenty: one core {:.0}ms, all cores {:.0}ms ({:.2}x)",
        "keygen",
        one * 1e3,
        all * 1e3,
        one / all
    );
    let (straus, yao) = mask_term_costs(gmp_key.public(), rng)?;
    println!(
        "{bits:>5}  {:>10}  a segment of M = 1000's: windowed {:.2}ms, Yao {:.2}ms ({:.2}x)",
        "mask term",
        straus * 1e3,
        yao * 1e3,
        yao / straus
    );
    if let Some(row) = gmp_row {
        row["keygen_one_core_s"] = serde_json::json!(one);
        row["keygen_all_cores_s"] = serde_json::json!(all);
        row["mask_term_windowed_s"] = serde_json::json!(straus);
        row["mask_term_yao_s"] = serde_json::json!(yao);
        row["table_build"] = tables
            .iter()
            .map(|(w, one, all)| {
                serde_json::json!({
                    "window_bits": w, "one_core_s": one, "all_cores_s": all,
                })
            })
            .collect();
    }
    Ok(())
}

/// The randomizer's table line: each window's one-core and all-core build.
fn print_table_costs(bits: u64, tables: &[(usize, f64, f64)]) {
    let shown: Vec<String> = tables
        .iter()
        .map(|(w, one, all)| {
            format!(
                "{w}-bit {:.1}/{:.1}ms ({:.2}x)",
                one * 1e3,
                all * 1e3,
                one / all
            )
        })
        .collect();
    println!(
        "{bits:>5}  {:>10}  fixed-base table, one core/all cores: {}",
        "table",
        shown.join(", ")
    );
}

/// One engine's line of the main table, and its JSON row.
fn engine_costs(
    bits: u64,
    sk: &SecretKey,
    raw: f64,
    rng: &mut ChaCha20Rng,
) -> anyhow::Result<(Costs, serde_json::Value)> {
    let c = measure(sk, rng)?;
    let engine = sk.public().ring().engine();
    println!(
        "{bits:>5}  {engine:>10}  {:>7.2}us  {:>10.2}ms  {:>8.3}ms  {:>8.2}ms  {:>9.2}ms  {:>9.2}ms  {:>10.0}",
        c.mul * 1e6,
        c.enc_textbook * 1e3,
        c.enc_short * 1e3,
        c.dec_crt * 1e3,
        c.dec_textbook * 1e3,
        c.multi_exp * 1e3,
        c.multi_exp / c.mul,
    );
    let row = serde_json::json!({
        "key_bits": bits,
        "engine": engine,
        "mul_mod_n2_s": c.mul,
        "encrypt_textbook_s": c.enc_textbook,
        "encrypt_short_exponent_s": c.enc_short,
        "decrypt_crt_s": c.dec_crt,
        "decrypt_textbook_s": c.dec_textbook,
        "multi_exp_16x64_s": c.multi_exp,
        "raw_gmp_mul_mod_n2_s": raw,
    });
    Ok((c, row))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut rows = Vec::new();
    println!(
        "{:>5}  {:>10}  {:>9}  {:>12}  {:>10}  {:>10}  {:>11}  {:>11}  {:>10}",
        "bits",
        "engine",
        "mul n^2",
        "enc textbook",
        "enc short",
        "dec CRT",
        "dec textbk",
        "multi-exp16",
        "= muls"
    );
    for &bits in &args.key_bits {
        let mut rng = ChaCha20Rng::seed_from_u64(bits);
        let gmp_key = SecretKey::generate(bits, &mut rng)?;
        let pure_key = gmp_key.on_num_bigint();
        let raw = raw_gmp_mulmod(gmp_key.public(), &mut rng);
        let mut by_engine = Vec::new();
        for sk in [&pure_key, &gmp_key] {
            let (c, row) = engine_costs(bits, sk, raw, &mut rng)?;
            rows.push(row);
            by_engine.push(c);
        }
        if let [pure, gmp] = by_engine.as_slice() {
            println!(
                "{bits:>5}  {:>10}  {:>8.1}x  {:>11.1}x  {:>9.1}x  {:>9.1}x  {:>10.1}x  {:>10.1}x   (num-bigint / gmp)",
                "speedup",
                pure.mul / gmp.mul,
                pure.enc_textbook / gmp.enc_textbook,
                pure.enc_short / gmp.enc_short,
                pure.dec_crt / gmp.dec_crt,
                pure.dec_textbook / gmp.dec_textbook,
                pure.multi_exp / gmp.multi_exp,
            );
            // In the GMP row of this key size, the last one pushed.
            gmp_extras(bits, gmp, raw, &gmp_key, &mut rng, rows.last_mut())?;
        }
    }
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}
