//! Whole studies through the real programs (`user local`: proxy and owners as
//! processes over loopback gRPC), two tables and one JSON file: per scenario and key
//! size, ciphertexts and bytes per owner, wall and CPU time of the busiest owner
//! (and the largest owner's peak memory), the proxy and the user, each role's CPU
//! time against its primitive bound, the speedup over the baseline mode and over
//! the build without GMP, and the proxy's memory with 10, 100 and 200 owners. The
//! end-to-end time is also given in GMP multiplications mod n^2 measured in the
//! same run: seconds are not comparable between runs on a shared machine whose
//! speed varies, that count is.
//!
//! The primitive bound of a role is the count of each primitive operation the design
//! prescribes for it (ARCHITECTURE.md, "Where the time goes"), times that
//! primitive's one-core cost measured by this program in the same run:
//! - owner: one fixed-base table, then K short-exponent encryptions; where the
//!   owners add the noise (`dp-mean` under `gaussian`, study.json's
//!   `trust.noise_from`), also the draws below, its share of them;
//! - proxy: one exact draw of noise per released matrix entry, and per vector entry
//!   under `dp-mean` (the exact samplers of `dp::sampler`, at the study's scale),
//!   measured as one draw of the study's mechanism and scale in this run (none
//!   where the owners draw them);
//! - proxy: per received ciphertext one validation (range, and a divisibility test
//!   by n) and one multiplication of its fold (on values held in the key's ring);
//!   per column k one chain of squarings of E\[v_k\] (`StudyLayout::mask_chain`: as
//!   far as its shifts E[v_k 2^(t w)] and the radix powers of row k's mask
//!   exponents reach); per value of the vector block but the last of each segment
//!   one shift and one multiplication (Horner's rule); per released segment len - 1
//!   multiplications assembling v_seg, the radix powers of v_seg (a chain over the
//!   mask's bits), one Yao product over the digits of B_seg and b_i
//!   (`dpca_common::radix`), one exponentiation by N, two multiplications (the mask
//!   and clear terms added) and one re-randomization;
//!   per vector segment one multiplication (its clear term) and one
//!   re-randomization; one fixed-base table;
//!   (that is the paper's `mask` centering; under `dp-mean`, the default, the proxy
//!   adds its noise to each released ciphertext with one multiplication and
//!   re-randomizes it, with no mask term);
//! - user: one CRT decryption per released ciphertext and one for N.
//!
//! Both centerings run (`--centerings`): `dp-mean` is what a study gets unless it
//! asks for `mask`, and `mask` is the paper's protocol, whose mask term is most of the
//! proxy's work.

use dpca_bench::{
    built_all_programs, built_programs_on_num_bigint, fastest, on_one_core, program,
    raw_gmp_mulmod, workspace_root,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use clap::Parser;
use dpca_common::dp::{Centering, NoiseScale};
use dpca_common::encoding::{vector_segments, SlotBudget, TriangleLayout};
use dpca_common::paillier::{random_below, Ciphertext, PublicKey, SecretKey};
use dpca_common::radix::{self, RadixPowers};
use dpca_common::randomizer::Randomizer;
use dpca_common::study::StudyLayout;
use dpca_proto::convert::CIPHERTEXTS_PER_CHUNK;
use dpca_user::report::{NoiseFrom, StudyReport};
use num_bigint::BigUint;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use rand_distr::StandardNormal;
use serde::Serialize;

/// Whole-study speed benchmark.
#[derive(Parser, Debug)]
#[command(name = "study", about)]
struct Args {
    /// Scenarios to run: 1 optdigits (10 owners), 2 movement_libras (24 x 15 rows),
    /// 3 tissue_gene_expression (4 owners), 4 generated M = 1000 (3 owners).
    /// End to end is `user local` from start to outputs written; key generation is
    /// also reported apart, since a key is made once and reused across studies.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4")]
    scenarios: Vec<u32>,
    /// Key sizes in bits.
    #[arg(long, value_delimiter = ',', default_value = "2048,3072")]
    key_bits: Vec<u64>,
    /// Key sizes at which scenario 1 also runs in the baseline mode (the flag alone:
    /// none). The baseline takes minutes: about 4 at 2048 bits and 13 more at 3072
    /// in the runs docs/BENCHMARKS.md reports.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "2048")]
    baseline_bits: Vec<u64>,
    /// Owner counts for the proxy-memory comparison on scenario 1 (at the first key
    /// size); the flag alone skips it.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "10,100,200")]
    memory_owners: Vec<usize>,
    /// Scenarios also run, at every key size, on the programs built without GMP
    /// (num-bigint, the old engine) beside the GMP run; the flag alone skips it.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "1")]
    num_bigint_scenarios: Vec<u32>,
    /// Centerings every scenario runs in: `mask` (the paper's, and the baseline's
    /// and the num-bigint comparison's) and `dp-mean` (the default of a study).
    #[arg(long, value_delimiter = ',', default_value = "mask,dp-mean", value_parser = Centering::parse)]
    centerings: Vec<Centering>,
    /// Working folder: scenario data, each study's outputs and `study-bench.json`.
    #[arg(long, default_value = "target/bench-study")]
    out: PathBuf,
}

/// One-core costs of the primitives, in seconds, at one key size.
#[derive(Clone, Debug, Serialize)]
struct Primitives {
    key_bits: u64,
    /// A multiplication of ciphertexts held as `BigUint` (`PublicKey::add`), as
    /// the release's additions and the last multiplication of an encryption or
    /// a re-randomization multiply (their other products stay in GMP).
    mulmod: f64,
    /// A multiplication of the proxy's fold, on values held in the key's ring.
    fold_mulmod: f64,
    /// A squaring on a value held in the key's ring, as the mask term's chains
    /// run them.
    square: f64,
    /// GMP's raw multiplication mod n^2, measured in this run.
    gmp_mulmod: f64,
    validate: f64,
    decrypt_crt: f64,
}

struct Keyed {
    sk: SecretKey,
    rng: ChaCha20Rng,
    prims: Primitives,
    /// (table build, one encryption) by window width, measured once: rows that
    /// share a width share a price, which a slow spell of the machine during
    /// one row's reading no longer sets apart.
    randomizer: HashMap<usize, (f64, f64)>,
    /// Exponentiations of a ciphertext, by kind and length of exponent.
    scales: HashMap<(Exponent, u64), f64>,
    /// The mask term's Yao products, by radix and the bits of their two exponents.
    products: HashMap<(usize, u64, u64), f64>,
    /// A ciphertext of this key, the base the exponentiations are priced on.
    sample: Ciphertext,
}

impl Keyed {
    fn new(bits: u64) -> anyhow::Result<Self> {
        let mut rng = ChaCha20Rng::seed_from_u64(bits);
        let sk = SecretKey::generate(bits, &mut rng)?;
        let pk = sk.public().clone();
        let a = pk.encrypt(&BigUint::from(3u8), &mut rng)?;
        let b = pk.encrypt(&BigUint::from(5u8), &mut rng)?;
        let chunk = vec![pk.ciphertext_to_bytes(&a); CIPHERTEXTS_PER_CHUNK];
        let prims = Primitives {
            key_bits: bits,
            // Read as the raw floor below is.
            mulmod: fastest(9, 1000, || pk.add(&a, &b)),
            fold_mulmod: {
                let ring = pk.ring();
                let (x, y) = (ring.elem(&a.0), ring.elem(&b.0));
                fastest(9, 1000, || ring.mul_elem(&x, &y))
            },
            square: {
                let ring = pk.ring();
                let x = ring.elem(&a.0);
                fastest(9, 1000, || ring.mul_elem(&x, &x))
            },
            gmp_mulmod: raw_gmp_mulmod(&pk, &mut rng),
            // Per ciphertext, in chunks as the proxy receives them, read into the
            // key's ring as its fold reads them (no conversion).
            validate: fastest(5, 4, || pk.elems_from_bytes(&chunk, 0))
                / CIPHERTEXTS_PER_CHUNK as f64,
            decrypt_crt: fastest(5, 20, || sk.decrypt(&a)),
        };
        Ok(Self {
            sk,
            rng,
            prims,
            randomizer: HashMap::new(),
            scales: HashMap::new(),
            products: HashMap::new(),
            sample: a,
        })
    }

    fn pk(&self) -> &PublicKey {
        self.sk.public()
    }

    /// (table build, one encryption) with the window a job of `count` gets, each
    /// on one core: the table's rows are built on every core of the pool, and
    /// timed there its wall time is less than its CPU: on two cores by up to a
    /// quarter at 5-bit windows (half the build is the base's exponentiation and
    /// the squarings, one thread's work) and two fifths at 8-bit.
    fn randomizer_costs(&mut self, count: usize) -> anyhow::Result<(f64, f64)> {
        let window = Randomizer::window_for(count);
        if let Some(&costs) = self.randomizer.get(&window) {
            return Ok(costs);
        }
        let pk = self.pk().clone();
        let rng = &mut self.rng;
        let build = on_one_core(|| fastest(5, 1, || Randomizer::new(&pk, window, rng)))?;
        let r = Randomizer::new(&pk, window, rng);
        let m = BigUint::from(7u8);
        let enc = fastest(9, 10, || r.encrypt(&m, rng));
        self.randomizer.insert(window, (build, enc));
        Ok((build, enc))
    }

    /// One Yao product of the mask term as the release runs it
    /// ([`radix::product`]): B_seg of `b_bits` bits on a row's radix powers and a
    /// mask of `mask_bits` bits on v_seg's, in radix 2^`radix`.
    fn radix_product_cost(&mut self, radix: usize, b_bits: u64, mask_bits: u64) -> f64 {
        let key = (radix, b_bits, mask_bits);
        if let Some(&cost) = self.products.get(&key) {
            return cost;
        }
        let pk = self.pk().clone();
        let ring = pk.ring();
        let row = RadixPowers::new(&pk, ring.elem(&self.sample.0), radix, b_bits);
        let v_seg = RadixPowers::new(&pk, ring.elem(&self.sample.0), radix, mask_bits);
        let b_seg = exponent_of_bits(&mut self.rng, b_bits);
        let b_i = exponent_of_bits(&mut self.rng, mask_bits);
        let cost = fastest(5, 4, || {
            radix::product(&pk, &[(&row, &b_seg), (&v_seg, &b_i)])
        });
        self.products.insert(key, cost);
        cost
    }

    /// One exact draw of the study's matrix noise (its mechanism at its scale on
    /// the grid, as study.json reports them), one core.
    fn noise_draw_cost(&mut self, report: &StudyReport) -> anyhow::Result<f64> {
        let grid: BigUint = report
            .noise_scale_grid
            .parse()
            .with_context(|| format!("noise scale `{}`", report.noise_scale_grid))?;
        let scale = match report.mechanism.as_str() {
            "gaussian" | "gaussian-classic" => NoiseScale::Gaussian { sigma: grid },
            "laplace" => NoiseScale::Laplace { t: grid },
            other => bail!("no noise draw priced for mechanism `{other}`"),
        };
        const DRAWS: usize = 2000;
        let rng = &mut self.rng;
        Ok(fastest(3, 1, || scale.sample_vector(DRAWS, rng)) / DRAWS as f64)
    }

    /// One shift E\[x\] -> E\[x 2^width\], as the release computes it: one
    /// exponentiation by 2^width, that is width squarings inside GMP's.
    fn shift_cost(&mut self, width: u64) -> f64 {
        self.scale_priced((Exponent::Shift, width), |_| {
            BigUint::from(1u8) << width as usize
        })
    }

    /// One exponentiation of a ciphertext by an exponent of `bits` bits.
    fn scale_cost(&mut self, bits: u64) -> f64 {
        self.scale_priced((Exponent::Bits, bits), |rng| exponent_of_bits(rng, bits))
    }

    /// A ciphertext's exponentiation by the exponent `draw` gives, on a real
    /// ciphertext, priced once per kind and length of exponent.
    fn scale_priced(
        &mut self,
        key: (Exponent, u64),
        draw: impl FnOnce(&mut ChaCha20Rng) -> BigUint,
    ) -> f64 {
        if let Some(&cost) = self.scales.get(&key) {
            return cost;
        }
        let e = draw(&mut self.rng);
        let (pk, c) = (self.sk.public(), &self.sample);
        let cost = fastest(5, 8, || pk.scale(c, &e));
        self.scales.insert(key, cost);
        cost
    }
}

/// The kinds of exponent a release raises ciphertexts to.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Exponent {
    /// 2^w: a shift by w bits.
    Shift,
    /// A number of the given bits, its top bit set (N, say).
    Bits,
}

/// An exponent of exactly `bits` bits (top bit set): a short exponent's worst case.
fn exponent_of_bits(rng: &mut ChaCha20Rng, bits: u64) -> BigUint {
    let top = BigUint::from(1u8) << (bits.max(1) as usize - 1);
    random_below(&top, rng) | top
}

/// A scenario's input.
struct Scenario {
    id: u32,
    name: &'static str,
    data: PathBuf,
    bounds: Option<PathBuf>,
    label: Option<&'static str>,
    owners: usize,
}

fn scenarios(root: &Path, work: &Path) -> anyhow::Result<Vec<Scenario>> {
    let data = root.join("data");
    let generated = work.join("generated-m1000.csv");
    let generated_bounds = work.join("generated-m1000.bounds.csv");
    if !generated.exists() {
        write_generated(&generated, &generated_bounds, 1000, 3000)?;
    }
    Ok(vec![
        Scenario {
            id: 1,
            name: "optdigits",
            data: data.join("optdigits.csv"),
            bounds: Some(data.join("optdigits.bounds.csv")),
            label: Some("label"),
            owners: 10,
        },
        Scenario {
            id: 2,
            name: "movement_libras",
            data: data.join("movement_libras.csv"),
            bounds: None,
            label: Some("label"),
            owners: 24,
        },
        Scenario {
            id: 3,
            name: "tissue_gene_expression",
            data: data.join("tissue_gene_expression.csv"),
            bounds: None,
            label: Some("label"),
            owners: 4,
        },
        Scenario {
            id: 4,
            name: "generated M=1000",
            data: generated,
            bounds: Some(generated_bounds),
            label: None,
            owners: 3,
        },
    ])
}

/// A low-rank table with noise: 10 latent factors, values clipped to [-4, 4].
fn write_generated(path: &Path, bounds: &Path, dim: usize, rows: usize) -> anyhow::Result<()> {
    let mut rng = ChaCha20Rng::seed_from_u64(1000);
    let rank = 10;
    let mut normal = move || -> f64 { rng.sample(StandardNormal) };
    let w: Vec<f64> = (0..dim * rank)
        .map(|_| normal() / (rank as f64).sqrt())
        .collect();
    let mut out = csv::Writer::from_path(path)?;
    out.write_record((0..dim).map(|j| format!("g{j}")))?;
    for _ in 0..rows {
        let z: Vec<f64> = (0..rank).map(|_| normal()).collect();
        out.write_record((0..dim).map(|j| {
            let x: f64 = (0..rank).map(|r| w[j * rank + r] * z[r]).sum::<f64>() + 0.3 * normal();
            format!("{:.4}", x.clamp(-4.0, 4.0))
        }))?;
    }
    out.flush()?;
    let mut b = csv::Writer::from_path(bounds)?;
    b.write_record(["feature", "lo", "hi"])?;
    b.write_record(["*", "-4", "4"])?;
    b.flush()?;
    Ok(())
}

/// One measured study.
#[derive(Clone, Debug, Serialize)]
struct Row {
    scenario: u32,
    name: String,
    key_bits: u64,
    baseline: bool,
    centering: &'static str,
    owners: usize,
    n_rows: u64,
    features: usize,
    ciphertexts_per_owner: usize,
    bytes_per_owner: usize,
    release_ciphertexts: usize,
    owner_wall: f64,
    owner_cpu: f64,
    owner_peak_mib: f64,
    owner_bound: f64,
    proxy_release_wall: f64,
    proxy_cpu: f64,
    proxy_peak_mib: f64,
    proxy_bound: f64,
    user_wall: f64,
    user_cpu: f64,
    user_peak_mib: f64,
    user_bound: f64,
    total_wall: f64,
    keygen: f64,
    /// GMP's reference multiplication over this run's: prices the bounds at GMP.
    gmp_factor: f64,
    /// GMP's multiplication mod n^2 in this run, seconds: the end-to-end time in
    /// these units compares across runs on machines of different speed.
    gmp_mulmod: f64,
    /// GMP's multiplication read again right after the study, over the one the
    /// bounds are priced at: above 1, the machine was slower around the study
    /// than when its primitives were priced, and every ratio of the row reads
    /// that much high.
    floor_drift: f64,
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn run_study(
    user_bin: &Path,
    sc: &Scenario,
    bits: u64,
    baseline: bool,
    centering: Centering,
    owners: usize,
    out: &Path,
) -> anyhow::Result<StudyReport> {
    let mut cmd = Command::new(user_bin);
    cmd.arg("local")
        .arg("--data")
        .arg(&sc.data)
        .args(["--owners", &owners.to_string()])
        .args(["--key-bits", &bits.to_string()])
        .args(["--k", "5", "--no-build"])
        // `user local`'s owners accept `mask` by name.
        .args(["--centering", centering.name()])
        .arg("--out")
        .arg(out);
    if let Some(b) = &sc.bounds {
        cmd.arg("--bounds").arg(b);
    }
    if let Some(l) = sc.label {
        cmd.args(["--label", l]);
    }
    if baseline {
        cmd.arg("--baseline");
    }
    eprintln!(
        "== scenario {} ({}), {bits} bits, {owners} owners, {}{}",
        sc.id,
        sc.name,
        centering.name(),
        if baseline { ", BASELINE" } else { "" }
    );
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {}", user_bin.display()))?;
    if !status.success() {
        bail!("scenario {} at {bits} bits failed ({status})", sc.id);
    }
    let json = std::fs::read_to_string(out.join("study.json"))
        .with_context(|| format!("{}/study.json", out.display()))?;
    Ok(serde_json::from_str(&json)?)
}

fn measure(
    keyed: &mut Keyed,
    sc: &Scenario,
    report: &StudyReport,
    centering: Centering,
    owners: usize,
) -> anyhow::Result<Row> {
    // Read first, while the machine is as it was during the study.
    let floor_after = raw_gmp_mulmod(keyed.sk.public(), &mut keyed.rng);
    let p = keyed.prims.clone();
    let k = report.encryption.ciphertexts_per_owner;
    let (owner_table, owner_enc) = keyed.randomizer_costs(k)?;
    let owner_bound = owner_table + k as f64 * owner_enc;
    let (proxy_table, rerand) = keyed.randomizer_costs(report.encryption.release_ciphertexts)?;
    let received = (owners * k) as f64 * (p.validate + p.fold_mulmod);
    // Every released entry's noise is one exact draw, in either centering; the
    // vector block's too under dp-mean.
    let m = report.n_features;
    let drawn = m * (m + 1) / 2
        + match centering {
            Centering::Mask => 0,
            Centering::DpMean => m,
        };
    // Priced at the release's scale: a share's is smaller, but a draw's time
    // grows with the scale's bits alone.
    let noise = drawn as f64 * keyed.noise_draw_cost(report)?;
    let (owner_noise, proxy_noise) = match report.trust.noise_from {
        NoiseFrom::Owners => (noise, 0.0),
        NoiseFrom::Proxy | NoiseFrom::None => (0.0, noise),
    };
    let owner_bound = owner_bound + owner_noise;
    let release = match centering {
        Centering::Mask => mask_release_bound(keyed, report, rerand),
        Centering::DpMean => report.encryption.release_ciphertexts as f64 * (p.mulmod + rerand),
    };
    let proxy_bound = received + proxy_noise + release + proxy_table;
    let user_bound = (report.encryption.release_ciphertexts + 1) as f64 * p.decrypt_crt;
    let bounds = [owner_bound, proxy_bound, user_bound];
    Ok(row_of(
        sc,
        report,
        centering,
        owners,
        bounds,
        &p,
        floor_after,
    ))
}

/// The study's layout, rebuilt from what study.json reports of it.
fn layout_of(report: &StudyReport) -> StudyLayout {
    let m = report.n_features;
    let slots = report.encryption.slots.max(1);
    StudyLayout {
        budget: SlotBudget {
            slot_width: report.encryption.slot_width,
            slots,
        },
        triangle: TriangleLayout::new(m, slots),
        // The speed scenarios are unlabelled `mask` studies.
        matrix_blocks: 1,
        classes: 0,
        vector_len: m,
        vector_dim: m,
        vector: vector_segments(m, report.encryption.vector_slots.max(1)),
        vector_budget: SlotBudget {
            slot_width: report.encryption.vector_slot_width,
            slots: report.encryption.vector_slots.max(1),
        },
        vector_packed: false,
        count_scale: 0,
        mask_bits: report.encryption.mask_bits,
        baseline: report.baseline,
    }
}

/// The `mask` release's bound: its noise, re-randomization and mask terms, priced
/// with this run's primitives.
fn mask_release_bound(keyed: &mut Keyed, report: &StudyReport, rerand: f64) -> f64 {
    let p = keyed.prims.clone();
    let layout = layout_of(report);
    let (m, slots) = (layout.triangle.dim, layout.budget.slots);
    // The mask term: per column one chain of squarings (its shifts and its row's
    // radix powers); per segment v_seg assembled by len - 1 multiplications in the
    // ring, v_seg's radix powers (a chain over the mask's bits) and one Yao
    // product, whose cost grows linearly in the segment's digits (fit a + b len
    // from a one-entry and a full segment).
    let radix = layout.mask_radix();
    let one = keyed.radix_product_cost(
        radix,
        layout.mask_exponent_bits(1),
        report.encryption.mask_bits,
    );
    let full = keyed.radix_product_cost(
        radix,
        layout.mask_exponent_bits(slots),
        report.encryption.mask_bits,
    );
    let per_entry = (full - one) / (slots.max(2) - 1) as f64;
    let v_seg_chain =
        radix::digits_of(report.encryption.mask_bits, radix).saturating_sub(1) * radix;
    let n_bits = u64::from(64 - report.n_rows.leading_zeros());
    let scale_n = keyed.scale_cost(n_bits.max(1));
    let segs: f64 = layout
        .triangle
        .segments
        .iter()
        // Besides the mask term: the exponentiation by N, the mask term's and the
        // clear term's additions, the re-randomization.
        .map(|s| {
            (s.len - 1) as f64 * p.fold_mulmod
                + v_seg_chain as f64 * p.square
                + one
                + per_entry * (s.len - 1) as f64
                + scale_n
                + 2.0 * p.mulmod
                + rerand
        })
        .sum();
    let chains = (0..m)
        .map(|k| layout.mask_chain(k).squarings())
        .sum::<u64>() as f64
        * p.square;
    // v' by Horner's rule: a shift of the vector slot width per value.
    let horner = (m - layout.vector.len()) as f64
        * (keyed.shift_cost(report.encryption.vector_slot_width) + p.mulmod);
    // Each vector segment: its clear term's addition and a re-randomization.
    chains + segs + horner + layout.vector.len() as f64 * (p.mulmod + rerand)
}

/// A row of the tables from a study's report, its roles' bounds (owner, proxy,
/// user) and GMP's multiplication read right after it.
fn row_of(
    sc: &Scenario,
    report: &StudyReport,
    centering: Centering,
    owners: usize,
    [owner_bound, proxy_bound, user_bound]: [f64; 3],
    p: &Primitives,
    floor_after: f64,
) -> Row {
    let owner_usage = report
        .usage
        .owners
        .iter()
        .flatten()
        .max_by(|a, b| a.cpu_seconds.total_cmp(&b.cpu_seconds))
        .copied()
        .unwrap_or_default();
    let owner_peak = report
        .usage
        .owners
        .iter()
        .flatten()
        .map(|u| u.peak_rss_bytes)
        .max()
        .unwrap_or(0);
    let proxy = report.usage.proxy.unwrap_or_default();
    let user = report.usage.user.unwrap_or_default();
    Row {
        scenario: sc.id,
        name: sc.name.to_string(),
        key_bits: report.encryption.key_bits,
        baseline: report.baseline,
        centering: centering.name(),
        owners,
        n_rows: report.n_rows,
        features: report.n_features,
        ciphertexts_per_owner: report.encryption.ciphertexts_per_owner,
        bytes_per_owner: report.encryption.bytes_per_owner,
        release_ciphertexts: report.encryption.release_ciphertexts,
        owner_wall: report.seconds.owner,
        owner_cpu: owner_usage.cpu_seconds,
        owner_peak_mib: mib(owner_peak),
        owner_bound,
        proxy_release_wall: report.seconds.proxy,
        proxy_cpu: proxy.cpu_seconds,
        proxy_peak_mib: mib(proxy.peak_rss_bytes),
        proxy_bound,
        user_wall: report.seconds.user,
        user_cpu: user.cpu_seconds,
        user_peak_mib: mib(user.peak_rss_bytes),
        user_bound,
        total_wall: report.seconds.total,
        keygen: report.seconds.keygen,
        gmp_factor: p.gmp_mulmod / p.mulmod,
        gmp_mulmod: p.gmp_mulmod,
        floor_drift: floor_after / p.gmp_mulmod,
    }
}

fn print_table(rows: &[Row]) {
    println!(
        "\n| scenario | bits | mode | L | M | cts/owner | KB/owner | owner wall / cpu s | proxy release wall / cpu s | user wall / cpu s | total s (keygen) | total in GMP mults (10^6) | peak MiB owner / proxy / user |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} {} | {} | {} | {} | {} | {} | {:.0} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} / {:.2} | {:.1} ({:.1}) | {:.2} | {:.0} / {:.0} / {:.0} |",
            r.scenario,
            r.name,
            r.key_bits,
            if r.baseline { "baseline" } else { r.centering },
            r.owners,
            r.features,
            r.ciphertexts_per_owner,
            r.bytes_per_owner as f64 / 1000.0,
            r.owner_wall,
            r.owner_cpu,
            r.proxy_release_wall,
            r.proxy_cpu,
            r.user_wall,
            r.user_cpu,
            r.total_wall,
            r.keygen,
            r.total_wall / r.gmp_mulmod / 1e6,
            r.owner_peak_mib,
            r.proxy_peak_mib,
            r.user_peak_mib,
        );
    }
    println!(
        "\nCPU time / primitive bound (bound priced with this run's primitives; in brackets priced with GMP's multiplication):"
    );
    println!("\n| scenario | bits | centering | owner bound s | owner x | proxy bound s | proxy x | user bound s | user x | floor after / priced |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in rows.iter().filter(|r| !r.baseline) {
        let g = r.gmp_factor;
        println!(
            "| {} {} | {} | {} | {:.2} | {:.2} ({:.2}) | {:.2} | {:.2} ({:.2}) | {:.2} | {:.2} ({:.2}) | {:.2} |",
            r.scenario,
            r.name,
            r.key_bits,
            r.centering,
            r.owner_bound,
            r.owner_cpu / r.owner_bound,
            r.owner_cpu / (r.owner_bound * g),
            r.proxy_bound,
            r.proxy_cpu / r.proxy_bound,
            r.proxy_cpu / (r.proxy_bound * g),
            r.user_bound,
            r.user_cpu / r.user_bound,
            r.user_cpu / (r.user_bound * g),
            r.floor_drift,
        );
    }
}

/// Everything the JSON file holds.
#[derive(Serialize)]
struct Output {
    primitives: Vec<Primitives>,
    studies: Vec<Row>,
    speedups: Vec<serde_json::Value>,
    /// num-bigint's CPU time over GMP's, per role, on the same study.
    engines: Vec<serde_json::Value>,
    proxy_memory: Vec<serde_json::Value>,
}

/// The programs a study runs: this build's, and the build without GMP.
struct Programs<'a> {
    user: &'a Path,
    num_bigint: Option<&'a Path>,
}

/// The study on num-bigint over the same study on GMP: each role's CPU and the
/// whole study's wall time.
fn engine_ratio(scenario: u32, bits: u64, pure: &Row, row: &Row) -> serde_json::Value {
    serde_json::json!({
        "scenario": scenario,
        "key_bits": bits,
        "owner_cpu": pure.owner_cpu / row.owner_cpu,
        "proxy_cpu": pure.proxy_cpu / row.proxy_cpu,
        "user_cpu": pure.user_cpu / row.user_cpu,
        "total_wall": pure.total_wall / row.total_wall,
    })
}

/// A scenario's baseline study over this build's: [`engine_ratio`]'s ratios and
/// each role's wall time.
fn speedup(scenario: u32, bits: u64, base: &Row, row: &Row) -> serde_json::Value {
    let mut out = engine_ratio(scenario, bits, base, row);
    let walls = serde_json::json!({
        "owner_wall": base.owner_wall / row.owner_wall,
        "proxy_release_wall": base.proxy_release_wall / row.proxy_release_wall,
        "user_wall": base.user_wall / row.user_wall,
        "study_wall_without_keygen": (base.total_wall - base.keygen)
            / (row.total_wall - row.keygen),
    });
    if let (Some(out), Some(walls)) = (out.as_object_mut(), walls.as_object()) {
        out.extend(walls.clone());
    }
    out
}

/// A scenario's `mask` study, with the baseline and the num-bigint build beside it
/// where asked for.
fn mask_studies(
    args: &Args,
    programs: &Programs<'_>,
    keyed: &mut Keyed,
    sc: &Scenario,
    bits: u64,
    out: &mut Output,
) -> anyhow::Result<()> {
    let dir = args.out.join(format!("s{}-{bits}", sc.id));
    let report = run_study(
        programs.user,
        sc,
        bits,
        false,
        Centering::Mask,
        sc.owners,
        &dir,
    )?;
    let row = measure(keyed, sc, &report, Centering::Mask, sc.owners)?;
    if sc.id == 1 && args.baseline_bits.contains(&bits) {
        let dir = args.out.join(format!("s1-{bits}-baseline"));
        let base = run_study(
            programs.user,
            sc,
            bits,
            true,
            Centering::Mask,
            sc.owners,
            &dir,
        )?;
        let base_row = measure(keyed, sc, &base, Centering::Mask, sc.owners)?;
        out.speedups.push(speedup(sc.id, bits, &base_row, &row));
        out.studies.push(base_row);
    }
    if let Some(pure_bin) = programs
        .num_bigint
        .filter(|_| args.num_bigint_scenarios.contains(&sc.id))
    {
        let dir = args.out.join(format!("s{}-{bits}-num-bigint", sc.id));
        let report = run_study(pure_bin, sc, bits, false, Centering::Mask, sc.owners, &dir)?;
        let mut pure = measure(keyed, sc, &report, Centering::Mask, sc.owners)?;
        pure.name = format!("{} (num-bigint)", pure.name);
        out.engines.push(engine_ratio(sc.id, bits, &pure, &row));
        out.studies.push(pure);
    }
    out.studies.push(row);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let root = workspace_root();
    std::fs::create_dir_all(&args.out)?;
    let user_bin = program(&built_all_programs()?, "user");
    let all = scenarios(&root, &args.out)?;

    let mut out = Output {
        primitives: Vec::new(),
        studies: Vec::new(),
        speedups: Vec::new(),
        engines: Vec::new(),
        proxy_memory: Vec::new(),
    };
    let pure_bin = if args.num_bigint_scenarios.is_empty() {
        None
    } else {
        Some(program(
            &built_programs_on_num_bigint(&["user", "proxy", "owner"])?,
            "user",
        ))
    };
    for &bits in &args.key_bits {
        let mut keyed = Keyed::new(bits)?;
        eprintln!("primitives at {bits} bits: {:?}", keyed.prims);
        out.primitives.push(keyed.prims.clone());
        for sc in all.iter().filter(|s| args.scenarios.contains(&s.id)) {
            if args.centerings.contains(&Centering::Mask) {
                let programs = Programs {
                    user: &user_bin,
                    num_bigint: pure_bin.as_deref(),
                };
                mask_studies(&args, &programs, &mut keyed, sc, bits, &mut out)?;
            }
            if args.centerings.contains(&Centering::DpMean) {
                let dir = args.out.join(format!("s{}-{bits}-dp-mean", sc.id));
                let c = Centering::DpMean;
                let report = run_study(&user_bin, sc, bits, false, c, sc.owners, &dir)?;
                out.studies
                    .push(measure(&mut keyed, sc, &report, c, sc.owners)?);
            }
            print_table(&out.studies);
        }
    }
    if let (Some(&bits), Some(sc)) = (args.key_bits.first(), all.first()) {
        out.proxy_memory = proxy_memory(&args, &user_bin, sc, bits)?;
    }
    print_summary(&out);
    let path = args.out.join("study-bench.json");
    std::fs::write(&path, serde_json::to_string_pretty(&out)? + "\n")
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!("\nJSON: {}", path.display());
    Ok(())
}

/// The proxy's peak memory and CPU on scenario 1 with each of `--memory-owners`.
fn proxy_memory(
    args: &Args,
    user_bin: &Path,
    sc: &Scenario,
    bits: u64,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let c = args
        .centerings
        .first()
        .copied()
        .unwrap_or(Centering::DpMean);
    let mut rows = Vec::new();
    for &owners in &args.memory_owners {
        let dir = args.out.join(format!("s1-{bits}-{owners}-owners"));
        let report = run_study(user_bin, sc, bits, false, c, owners, &dir)?;
        let proxy = report.usage.proxy.unwrap_or_default();
        rows.push(serde_json::json!({
            "owners": owners,
            "key_bits": bits,
            "proxy_peak_mib": mib(proxy.peak_rss_bytes),
            "proxy_cpu": proxy.cpu_seconds,
            "total_wall": report.seconds.total,
        }));
    }
    Ok(rows)
}

/// The studies' tables, then the comparisons the run made.
fn print_summary(out: &Output) {
    print_table(&out.studies);
    if !out.speedups.is_empty() {
        println!("\nspeedup of the product over the baseline (same run, same machine):");
        for s in &out.speedups {
            println!("{s}");
        }
    }
    if !out.engines.is_empty() {
        println!("\nnum-bigint over GMP, CPU time per role (same study, same run):");
        for s in &out.engines {
            println!("{s}");
        }
    }
    if !out.proxy_memory.is_empty() {
        println!("\nproxy peak memory against owners (scenario 1):");
        for s in &out.proxy_memory {
            println!("{s}");
        }
    }
}
