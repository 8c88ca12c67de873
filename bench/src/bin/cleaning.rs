//! Null-space cleaning on real data: the tables of Figures 1-3 of "Enhancing the
//! Privacy of Predictors" on two bundled data sets, 10 random 90/10 splits.
//!
//! Per split: features standardized and labels centered and scaled by the training
//! rows; A_d and A_c fitted by least squares on the training rows (A_d stands for
//! the known predictor); every test vector cleaned to e_utility = epsilon.
//! - e_utility = |A_d^T (x - x~)|^2, e_privacy = |f_c(x~) - A_c^T x|^2 (how far the
//!   confidential prediction moved from what the raw features give);
//! - complete privacy (CP): |f_c(x~) - y_c|^2 > |f_c(mean) - y_c|^2 on the true
//!   labels, the mean vector being 0 after centering;
//! - f_c = A_c without the attack; with it, the adversary cleans the training rows
//!   the same way and re-fits A_c' on them (the paper's attack);
//! - the Laplace mechanism: i.i.d. Laplace noise on every feature, its scale set
//!   so that the mean e_utility over the test rows equals epsilon exactly (one draw,
//!   rescaled); the attacked version re-fits on noised training rows.
//!
//! Label sets (all derived from the bundled files):
//! - diamonds: features carat, depth, table, x, y, z (the stone's measurements);
//!   labels log price, cut, color, clarity. A valuation service should predict the
//!   price from the measurements without handing a buyer the grading: the price
//!   (and then cut, then color) is desired, the remaining grades confidential.
//! - optdigits: features the 64 pixels; desired labels the ten one-hot digit
//!   indicators (a digit reader); confidential labels traits of the writer's hand:
//!   ink (total pixel mass: pen pressure and stroke width), slant (ink on the
//!   upper-right/lower-left diagonal minus the other) and width (ink in the outer
//!   columns minus the inner ones).

use dpca_bench::data_dir;

use anyhow::{bail, Context};
use clap::Parser;
use dpca_common::cleaning::{
    attack, clean_rows, laplace_noise, laplace_scale, least_squares, score, Cleaner, Scores,
};
use dpca_common::data::read_csv;
use nalgebra::{DMatrix, DVector};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

/// Null-space cleaning against a linear adversary, with and without the attack,
/// and against the Laplace mechanism at equal e_utility.
#[derive(Parser, Debug)]
#[command(name = "cleaning", about)]
struct Args {
    /// Random 90/10 splits per setting.
    #[arg(long, default_value_t = 10)]
    splits: usize,
    /// epsilon of Figures 1 and 2.
    #[arg(long, default_value_t = 0.01)]
    epsilon: f64,
    /// epsilons of Figure 3.
    #[arg(long, value_delimiter = ',', default_value = "0.01,0.02,0.03")]
    fig3_epsilons: Vec<f64>,
    /// Seed of the splits and the Laplace draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// A data set with its derived label columns.
struct Labeled {
    name: &'static str,
    x: DMatrix<f64>,
    /// Label columns, in the order they move from confidential to desired.
    labels: Vec<(String, DVector<f64>)>,
}

fn diamonds() -> anyhow::Result<Labeled> {
    let path = data_dir().join("diamonds.csv");
    let t = read_csv(std::fs::File::open(&path)?, "diamonds.csv", None)?;
    let col = |name: &str| -> anyhow::Result<usize> {
        t.features
            .iter()
            .position(|f| f == name)
            .with_context(|| format!("diamonds.csv has no column {name}"))
    };
    let feats = ["carat", "depth", "table", "x", "y", "z"]
        .iter()
        .map(|f| col(f))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let x = DMatrix::from_fn(t.rows.len(), feats.len(), |i, j| t.rows[i][feats[j]]);
    let mut labels = Vec::new();
    for (name, f) in [
        ("log price", "price"),
        ("cut", "cut"),
        ("color", "color"),
        ("clarity", "clarity"),
    ] {
        let c = col(f)?;
        let v = DVector::from_fn(t.rows.len(), |i, _| {
            let y = t.rows[i][c];
            if f == "price" {
                y.ln()
            } else {
                y
            }
        });
        labels.push((name.to_string(), v));
    }
    Ok(Labeled {
        name: "diamonds",
        x,
        labels,
    })
}

fn optdigits() -> anyhow::Result<Labeled> {
    let path = data_dir().join("optdigits.csv");
    let t = read_csv(std::fs::File::open(&path)?, "optdigits.csv", Some("label"))?;
    let (_, digits) = t.label.clone().context("optdigits has labels")?;
    let n = t.rows.len();
    let x = DMatrix::from_fn(n, 64, |i, j| t.rows[i][j]);
    let mut labels = Vec::new();
    for d in 0..10 {
        let v = DVector::from_fn(n, |i, _| f64::from(u8::from(digits[i] == d.to_string())));
        labels.push((format!("digit {d}"), v));
    }
    // Pixel (r, c) of the 8 x 8 image is feature 8 r + c.
    let trait_of = |w: &dyn Fn(usize, usize) -> f64| {
        DVector::from_fn(n, |i, _| {
            (0..64).map(|p| w(p / 8, p % 8) * t.rows[i][p]).sum::<f64>()
        })
    };
    labels.push(("ink".into(), trait_of(&|_, _| 1.0)));
    labels.push((
        "slant".into(),
        trait_of(&|r, c| match (r < 4, c < 4) {
            (true, false) | (false, true) => 1.0,
            _ => -1.0,
        }),
    ));
    labels.push((
        "width".into(),
        trait_of(&|_, c| if !(2..6).contains(&c) { 1.0 } else { -1.0 }),
    ));
    Ok(Labeled {
        name: "optdigits",
        x,
        labels,
    })
}

/// Columns standardized (features) or centered and scaled (labels) by the training
/// rows' mean and sd.
fn standardize(train: &DMatrix<f64>, test: &DMatrix<f64>) -> (DMatrix<f64>, DMatrix<f64>) {
    let mut a = train.clone();
    let mut b = test.clone();
    for j in 0..train.ncols() {
        let col = train.column(j);
        let mean = col.mean();
        let sd = col.variance().sqrt();
        let sd = if sd > 0.0 { sd } else { 1.0 };
        a.column_mut(j).apply(|v| *v = (*v - mean) / sd);
        b.column_mut(j).apply(|v| *v = (*v - mean) / sd);
    }
    (a, b)
}

fn rows(m: &DMatrix<f64>, idx: &[usize]) -> DMatrix<f64> {
    DMatrix::from_fn(idx.len(), m.ncols(), |i, j| m[(idx[i], j)])
}

/// Results of one setting over the splits: (mean, sd) of each score.
struct Row {
    values: Vec<Vec<f64>>,
}

impl Row {
    fn push(&mut self, i: usize, v: f64) {
        if self.values.len() <= i {
            self.values.resize(i + 1, Vec::new());
        }
        self.values[i].push(v);
    }

    fn mean(&self, i: usize) -> f64 {
        let v = &self.values[i];
        v.iter().sum::<f64>() / v.len() as f64
    }

    fn sd(&self, i: usize) -> f64 {
        let v = &self.values[i];
        let m = self.mean(i);
        (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
    }
}

/// Columns of a result row.
const ALG: usize = 0;
const ALG_ATTACK: usize = 3;
const LAP: usize = 6;
const LAP_ATTACK: usize = 9;
const NULL: usize = 12;
/// Share of test vectors whose every component costs less than epsilon (cleaned
/// completely, e_utility below epsilon).
const BELOW: usize = 15;

/// One split of a data set: 90% to fit on, 10% to clean and score, both
/// standardized on the training part; the desired and confidential predictors
/// fitted on it, and the cleaner between them.
struct Split {
    x_tr: DMatrix<f64>,
    x_te: DMatrix<f64>,
    yc_tr: DMatrix<f64>,
    yc_te: DMatrix<f64>,
    a_d: DMatrix<f64>,
    a_c: DMatrix<f64>,
    cleaner: Cleaner,
}

impl Split {
    /// A random split of `d`, whose first `nd` labels are the desired ones.
    fn draw(
        d: &Labeled,
        y_all: &DMatrix<f64>,
        nd: usize,
        rng: &mut ChaCha20Rng,
    ) -> anyhow::Result<Self> {
        let n = d.x.nrows();
        let mut idx: Vec<usize> = (0..n).collect();
        idx.shuffle(rng);
        let cut = n * 9 / 10;
        let (tr, te) = idx.split_at(cut);
        let (x_tr, x_te) = standardize(&rows(&d.x, tr), &rows(&d.x, te));
        let (y_tr, y_te) = standardize(&rows(y_all, tr), &rows(y_all, te));
        let k = d.labels.len();
        let (yd_tr, yc_tr) = (
            y_tr.columns(0, nd).into_owned(),
            y_tr.columns(nd, k - nd).into_owned(),
        );
        let yc_te = y_te.columns(nd, k - nd).into_owned();
        let a_d = least_squares(&x_tr, &yd_tr)?;
        let a_c = least_squares(&x_tr, &yc_tr)?;
        let cleaner = Cleaner::new(&a_d, &a_c)?;
        Ok(Self {
            x_tr,
            x_te,
            yc_tr,
            yc_te,
            a_d,
            a_c,
            cleaner,
        })
    }

    /// The scores of `released` test rows against an adversary's predictor `a_c_adv`.
    fn score(&self, a_c_adv: &DMatrix<f64>, released: &DMatrix<f64>) -> Scores {
        score(
            &self.a_d,
            &self.a_c,
            a_c_adv,
            &self.x_te,
            released,
            &self.yc_te,
        )
    }

    /// Each method's scores on this split, pushed to `row`.
    fn run(&self, epsilon: f64, rng: &mut ChaCha20Rng, row: &mut Row) -> anyhow::Result<()> {
        let put = |row: &mut Row, at: usize, sc: Scores| {
            row.push(at, sc.e_utility);
            row.push(at + 1, sc.e_privacy);
            row.push(at + 2, sc.complete_privacy);
        };
        let (cleaned, below) = clean_rows(&self.cleaner, &self.x_te, Some(epsilon))?;
        row.push(BELOW, below as f64 / self.x_te.nrows() as f64);
        put(row, ALG, self.score(&self.a_c, &cleaned));
        let a_c_attack = attack(&self.cleaner, &self.x_tr, &self.yc_tr, Some(epsilon))?;
        put(row, ALG_ATTACK, self.score(&a_c_attack, &cleaned));
        // Laplace at the same mean e_utility: one draw, rescaled.
        let noise = laplace_noise(rng, self.x_te.nrows(), self.x_te.ncols());
        let b = laplace_scale(&self.a_d, &noise, epsilon)?;
        let noised = &self.x_te + noise * b;
        put(row, LAP, self.score(&self.a_c, &noised));
        // The attacked Laplace: the adversary re-fits on noised training rows.
        let noised_tr = &self.x_tr + laplace_noise(rng, self.x_tr.nrows(), self.x_tr.ncols()) * b;
        let a_c_lap = least_squares(&noised_tr, &self.yc_tr)?;
        put(row, LAP_ATTACK, self.score(&a_c_lap, &noised));
        let (null, _) = clean_rows(&self.cleaner, &self.x_te, None)?;
        put(row, NULL, self.score(&self.a_c, &null));
        Ok(())
    }
}

/// Runs every split of one (data set, N_d) setting at `epsilon`.
fn run_setting(
    d: &Labeled,
    nd: usize,
    epsilon: f64,
    splits: usize,
    seed: u64,
) -> anyhow::Result<Row> {
    let mut row = Row { values: Vec::new() };
    let y_all = DMatrix::from_columns(&d.labels.iter().map(|(_, v)| v.clone()).collect::<Vec<_>>());
    for s in 0..splits {
        let mut rng = ChaCha20Rng::seed_from_u64(seed.wrapping_add(s as u64));
        let split = Split::draw(d, &y_all, nd, &mut rng)?;
        split.run(epsilon, &mut rng, &mut row)?;
    }
    Ok(row)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.splits == 0 {
        bail!("--splits must be at least 1");
    }
    let sets = [diamonds()?, optdigits()?];
    println!(
        "Null-space cleaning, epsilon = {}, {} random 90/10 splits (mean; sd over splits in parentheses)\n",
        args.epsilon, args.splits
    );
    for figure in figures_1_and_2(&args, &sets)? {
        println!("{figure}");
    }
    figure_3(&args, &sets)
}

/// The first `nd + nc` labels of `d`: the first `nd` desired, the rest confidential.
fn with_labels(d: &Labeled, nd: usize, nc: usize) -> Labeled {
    Labeled {
        name: d.name,
        x: d.x.clone(),
        labels: d.labels[..nd + nc].to_vec(),
    }
}

/// Figures 1 and 2 and the exact null-space variant, as three markdown tables:
/// diamonds with 1 to 3 desired labels, optdigits with 10 desired and 1 to 3
/// confidential.
fn figures_1_and_2(args: &Args, sets: &[Labeled; 2]) -> anyhow::Result<[String; 3]> {
    let titles = [
        "Figure 1: no attack",
        "Figure 2: with the attack (the adversary cleans the training rows and re-fits)",
        "Exact null-space variant (epsilon unused), no attack",
    ];
    let mut fig = titles.map(|title| {
        format!(
            "{title}\n\n| data set | N_d | N_c | desired | confidential | e_utility | e_privacy | CP | below epsilon |\n|---|---|---|---|---|---|---|---|---|\n"
        )
    });
    let diamonds_settings = [1usize, 2, 3].map(|nd| (nd, sets[0].labels.len() - nd));
    let settings = diamonds_settings
        .into_iter()
        .map(|s| (&sets[0], s))
        .chain([1usize, 2, 3].map(|nc| (&sets[1], (10, nc))));
    for (d, (nd, nc)) in settings {
        let sub = with_labels(d, nd, nc);
        let row = run_setting(&sub, nd, args.epsilon, args.splits, args.seed)?;
        let names = |r: std::ops::Range<usize>| {
            let v: Vec<&str> = sub.labels[r].iter().map(|(n, _)| n.as_str()).collect();
            if v.len() > 3 {
                format!("{} .. {}", v[0], v[v.len() - 1])
            } else {
                v.join(", ")
            }
        };
        for (f, at) in [(0, ALG), (1, ALG_ATTACK), (2, NULL)] {
            let below = if at == NULL {
                "-".to_string()
            } else {
                format!("{:.1}%", 100.0 * row.mean(BELOW))
            };
            fig[f].push_str(&format!(
                "| {} | {nd} | {nc} | {} | {} | {:.4} | {:.3} ({:.3}) | {:.1}% | {below} |\n",
                d.name,
                names(0..nd),
                names(nd..nd + nc),
                row.mean(at),
                row.mean(at + 1),
                row.sd(at + 1),
                100.0 * row.mean(at + 2),
            ));
        }
    }
    Ok(fig)
}

/// Figure 3: against the Laplace mechanism at equal e_utility, 3 confidential
/// labels, at each of `--fig3-epsilons`.
fn figure_3(args: &Args, sets: &[Labeled; 2]) -> anyhow::Result<()> {
    println!(
        "Figure 3: against the Laplace mechanism at equal e_utility\n\n| data set | N_d | N_c | e_utility | Laplace e_privacy | Laplace CP | Laplace, attacked: e_privacy | CP | Alg. 1 e_privacy | CP | Alg. 1, attacked: e_privacy | CP |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for (d, nd) in [(&sets[0], 1usize), (&sets[1], 10)] {
        let nc = 3;
        let sub = with_labels(d, nd, nc);
        for &eps in &args.fig3_epsilons {
            let row = run_setting(&sub, nd, eps, args.splits, args.seed)?;
            println!(
                "| {} | {nd} | {nc} | {:.4} | {:.4} | {:.1}% | {:.4} | {:.1}% | {:.3} | {:.1}% | {:.3} | {:.1}% |",
                d.name,
                row.mean(LAP),
                row.mean(LAP + 1),
                100.0 * row.mean(LAP + 2),
                row.mean(LAP_ATTACK + 1),
                100.0 * row.mean(LAP_ATTACK + 2),
                row.mean(ALG + 1),
                100.0 * row.mean(ALG + 2),
                row.mean(ALG_ATTACK + 1),
                100.0 * row.mean(ALG_ATTACK + 2),
            );
        }
    }
    Ok(())
}
