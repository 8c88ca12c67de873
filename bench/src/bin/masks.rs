//! What masked contributions cost (`dpca_common::secagg`), in one run: an
//! owner's masks against its encryption, the bytes of its deposit against its
//! upload's, and the holder's sum at 10, 100 and 400 owners, on one study's
//! layout (M = 1000 by default, `dp-mean`, 3072-bit key). Prints a table.

use std::time::Instant;

use clap::Parser;
use dpca_common::paillier::SecretKey;
use dpca_common::randomizer::Randomizer;
use dpca_common::secagg::{add_held_masks, held_mask_sum};
use dpca_common::study::{SpecDraft, StudyLayout};
use num_bigint::BigUint;
use prost::Message;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use rayon::prelude::*;

/// Masked contributions' costs.
#[derive(Parser, Debug)]
#[command(name = "masks", about)]
struct Args {
    /// Features of the study.
    #[arg(long, default_value_t = 1000)]
    features: usize,
    /// Key size in bits.
    #[arg(long, default_value_t = 3072)]
    key_bits: u64,
    /// Owner counts whose mask sum the holder computes.
    #[arg(long, value_delimiter = ',', default_value = "10,100,400")]
    owners: Vec<usize>,
    /// Plaintexts encrypted to price an owner's encryption (it encrypts them
    /// all, on every core, the same way).
    #[arg(long, default_value_t = 256)]
    priced: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut rng = ChaCha20Rng::seed_from_u64(59);
    let sk = SecretKey::generate(args.key_bits, &mut rng)?;
    let pk = sk.public().clone();
    let quorum = *args.owners.iter().max().unwrap_or(&10) as u32;
    let spec = SpecDraft {
        quorum,
        max_rows: 1 << 20,
        mask_holder: Some("https://holder:50051".into()),
        ..dpca_common::testing::test_draft(&pk, args.features)
    }
    .validate()?;
    let layout = StudyLayout::new(&spec)?;
    let count = layout.owner_ciphertexts();
    let n = pk.n().clone();
    let plaintexts: Vec<BigUint> = (0..count)
        .map(|_| dpca_common::arith::random_below(&n, &mut rng))
        .collect();

    // The owner: its masks over all its plaintexts, and its encryption priced
    // from `priced` of them encrypted as the owner does (fixed-base table, on
    // every core).
    let seed = [7u8; 32];
    let t = Instant::now();
    let mut masked = plaintexts.clone();
    add_held_masks(&mut masked, &seed, "study", "owner-001", &n)?;
    let mask_s = t.elapsed().as_secs_f64();
    let randomizer = Randomizer::new(&pk, Randomizer::window_for(count), &mut rng);
    let sample = &plaintexts[..args.priced.min(count)];
    let t = Instant::now();
    sample
        .par_iter()
        .map(|m| randomizer.encrypt(m, &mut rand::rngs::OsRng))
        .collect::<Result<Vec<_>, _>>()?;
    let encrypt_s = t.elapsed().as_secs_f64() * count as f64 / sample.len() as f64;

    let deposit = dpca_proto::v1::DepositSeedRequest {
        study_id: "0".repeat(32),
        owner_id: "owner-001".into(),
        contribution_id: "0".repeat(64),
        spec_digest: "0".repeat(64),
        seed: seed.to_vec(),
    };
    let upload_bytes = count * pk.ciphertext_bytes();
    println!(
        "M = {}, {}-bit key: {count} plaintexts an owner sends ({:.1} MB)",
        args.features,
        args.key_bits,
        upload_bytes as f64 / 1e6
    );
    println!();
    println!("| owner | s | of its encryption |");
    println!("|---|---|---|");
    println!(
        "| masks (one PRG expansion, added mod n) | {mask_s:.3} | {:.4} |",
        mask_s / encrypt_s
    );
    println!(
        "| encryption (priced from {} plaintexts) | {encrypt_s:.2} | 1 |",
        sample.len()
    );
    println!();
    println!(
        "an owner's deposit: {} bytes (one call), against its upload's {upload_bytes}: {:.2e}",
        deposit.encoded_len(),
        deposit.encoded_len() as f64 / upload_bytes as f64
    );
    println!();
    println!("| owners | holder's sum s | per owner ms | sum's bytes | per owner, of its masks |");
    println!("|---|---|---|---|---|");
    for &owners in &args.owners {
        let names: Vec<String> = (0..owners).map(|i| format!("owner-{i:03}")).collect();
        let held: Vec<(&str, [u8; 32])> = names
            .iter()
            .map(|o| {
                let mut s = [0u8; 32];
                rng.fill_bytes(&mut s);
                (o.as_str(), s)
            })
            .collect();
        let t = Instant::now();
        let sum = held_mask_sum(&held, "study", count, &n);
        let sum_s = t.elapsed().as_secs_f64();
        let bytes: usize = sum.iter().map(|v| v.to_bytes_be().len()).sum();
        println!(
            "| {owners} | {sum_s:.2} | {:.1} | {bytes} | {:.2} |",
            1e3 * sum_s / owners as f64,
            sum_s / owners as f64 / mask_s
        );
    }
    Ok(())
}
