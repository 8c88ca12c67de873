//! The preprocessing a run chooses: the public bounds, or bounds chosen by a
//! central marginal histogram release; then C from a central row-norm
//! histogram release, as `user local` runs both.

use anyhow::Context;
use dpca_common::data::normalize_row;
use dpca_common::dp::{
    plan_marginal_noise, plan_noise_blocks, split_request, Centering, PrivacyRequest,
};
use dpca_common::encoding::FixedPoint;
use dpca_common::protocol::{central_release, ReleaseSecrets, Share};
use dpca_common::scaling::choose_scales_with;
use dpca_common::study::{BlockShape, Marginals, NormBins, DEFAULT_FRAC_BITS};
use rand_chacha::ChaCha20Rng;
use serde::Serialize;

use crate::tables::Table;

/// How a run chooses its bounds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub(crate) enum Prep {
    /// The table's public bounds file: today's preprocessing.
    Public,
    /// Chosen privately: a marginal histogram study with this many bins per
    /// octave (`user local`'s default without a bounds file at
    /// [`dpca_common::study::STANDARD_PER_OCTAVE`]), the scale reaching the
    /// given tail quantiles (0: the whole range, `scaling::TAIL`).
    Private(u32, f64),
}

impl Prep {
    /// The name tables and `--preps` use.
    pub(crate) fn name(&self) -> String {
        match self {
            Self::Public => "public".into(),
            Self::Private(p, t) if *t > 0.0 => format!("private-{p}-t{t}"),
            Self::Private(p, _) => format!("private-{p}"),
        }
    }

    /// Parses a name of [`Prep::name`].
    pub(crate) fn parse(name: &str) -> anyhow::Result<Self> {
        if name == "public" {
            return Ok(Self::Public);
        }
        let unknown =
            || format!("unknown preprocessing `{name}` (public, private-P, private-P-tT)");
        let rest = name.strip_prefix("private-").with_context(unknown)?;
        let (p, t) = rest.split_once("-t").unwrap_or((rest, "0"));
        let per_octave = p.parse().ok().with_context(unknown)?;
        let tail = t
            .parse()
            .ok()
            .filter(|t| (0.0..0.5).contains(t))
            .with_context(unknown)?;
        Ok(Self::Private(per_octave, tail))
    }
}

/// How a run chooses the row-norm bound C.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub(crate) enum RowBound {
    /// The DP quantile of the rows' norms, from a row-norm histogram release.
    Quantile(f64),
    /// A fixed C, spending nothing.
    Fixed(f64),
}

impl RowBound {
    /// The name tables and `--row-bounds` use: `q0.9`, `c1`.
    pub(crate) fn name(&self) -> String {
        match self {
            Self::Quantile(q) => format!("q{q}"),
            Self::Fixed(c) => format!("c{c}"),
        }
    }

    /// Parses a name of [`RowBound::name`].
    pub(crate) fn parse(name: &str) -> anyhow::Result<Self> {
        let number = |s: &str| s.parse::<f64>().ok().filter(|v| *v > 0.0);
        let parsed = match name.split_at(1.min(name.len())) {
            ("q", q) => number(q).filter(|q| *q < 1.0).map(Self::Quantile),
            ("c", c) => number(c).map(Self::Fixed),
            _ => None,
        };
        parsed.with_context(|| format!("unknown row bound `{name}` (qQ or cC, as q0.9, c1)"))
    }
}

/// A run's preprocessing, and the request left for its study.
pub(crate) struct Chosen {
    /// Bounds mapped to [-1, 1].
    pub(crate) bounds: Vec<(f64, f64)>,
    /// Where synthetic values are kept.
    pub(crate) ranges: Vec<(f64, f64)>,
    /// The row-norm bound.
    pub(crate) c: f64,
    /// What the study itself spends.
    pub(crate) study: PrivacyRequest,
}

/// The shares of the whole request the two preparatory studies spend.
#[derive(Clone, Copy)]
pub(crate) struct Shares {
    pub(crate) bounds: f64,
    pub(crate) quantile: f64,
}

/// Chooses `prep`'s bounds and C (by `row_bound`) for `table` out of `req`, as
/// `user local` does.
pub(crate) fn choose(
    table: &Table,
    (prep, row_bound): (Prep, RowBound),
    req: &PrivacyRequest,
    shares: Shares,
    rng: &mut ChaCha20Rng,
) -> anyhow::Result<Chosen> {
    let (bounds, ranges, left, taken) = match prep {
        Prep::Public => (
            table.public_bounds.clone(),
            table.public_bounds.clone(),
            *req,
            0.0,
        ),
        Prep::Private(per_octave, tail) => {
            let (spent, left) = split_request(req, shares.bounds)?;
            let grid = Marginals { per_octave };
            let (bounds, ranges) = private_bounds(&table.train, (grid, tail), &spent, rng)?;
            (bounds, ranges, left, shares.bounds)
        }
    };
    let (c, study) = match row_bound {
        RowBound::Fixed(c) => (c, left),
        RowBound::Quantile(q) => {
            let (h, study) = split_request(&left, shares.quantile / (1.0 - taken))?;
            (row_norm(&table.train, &bounds, q, &h, rng), study)
        }
    };
    Ok(Chosen {
        bounds,
        ranges,
        c,
        study,
    })
}

/// The grid's fixed point: a preparatory study's C = 1.
fn unit_ball() -> FixedPoint {
    FixedPoint {
        frac_bits: DEFAULT_FRAC_BITS,
        row_norm_bound: 1.0,
    }
}

/// One central release of a vector-only or dp-mean study of `share`.
fn release_vector(
    share: &Share,
    shape: &BlockShape,
    plan: &dpca_common::dp::NoisePlan,
    rng: &mut ChaCha20Rng,
) -> dpca_common::protocol::Opened {
    let secrets = ReleaseSecrets {
        mask: Vec::new(),
        matrix_noise: plan.matrix.sample_upper(shape.matrix_dim, rng),
        vector_noise: plan
            .vector
            .as_ref()
            .map(|v| v.sample_vector(shape.vector_len(), rng))
            .unwrap_or_default(),
    };
    central_release(
        share,
        shape,
        Centering::DpMean,
        None,
        &secrets,
        DEFAULT_FRAC_BITS,
    )
}

/// Per feature, an interval.
type Intervals = Vec<(f64, f64)>;

/// Bounds and ranges from a central marginal release of `rows` with `req`.
fn private_bounds(
    rows: &[Vec<f64>],
    (grid, tail): (Marginals, f64),
    req: &PrivacyRequest,
    rng: &mut ChaCha20Rng,
) -> anyhow::Result<(Intervals, Intervals)> {
    let m = rows.first().map_or(0, Vec::len);
    let fixed = unit_ball();
    let share = grid.share(rows, m, &fixed);
    let plan = plan_marginal_noise(req, fixed.norm_bound_int(), m);
    let shape = BlockShape::new(grid.width(m), 0, false, fixed.norm_bound_int()).projected(0);
    let opened = release_vector(&share, &shape, &plan, rng);
    let counts = grid.counts(&opened.vector_grid, m, &fixed);
    let noise = plan.vector.context("a marginal plan noises its vector")?;
    let unit = Marginals::unit(m, &fixed) as f64;
    let scaling = choose_scales_with(&grid, &counts, (&noise, unit), tail);
    Ok((
        scaling.features.iter().map(|f| f.bounds()).collect(),
        scaling.features.iter().map(|f| (f.lo, f.hi)).collect(),
    ))
}

/// C as the `q` quantile of the rows' norms under `bounds`, from a central
/// row-norm histogram release with `req`.
fn row_norm(
    rows: &[Vec<f64>],
    bounds: &[(f64, f64)],
    q: f64,
    req: &PrivacyRequest,
    rng: &mut ChaCha20Rng,
) -> f64 {
    let m = bounds.len();
    let names = (0..m).map(|i| format!("x{i}")).collect();
    let bins = NormBins::standard(names, bounds.to_vec());
    let b = bins.edges.len();
    let hot: Vec<Vec<f64>> = rows.iter().map(|r| bins.one_hot(r)).collect();
    let fixed = unit_ball();
    let (share, _) = Share::from_raw_rows(&hot, &vec![(-1.0, 1.0); b], &fixed, None, None);
    let cq = fixed.norm_bound_int();
    let shape = BlockShape::new(b, 0, false, cq);
    let plan = plan_noise_blocks(req, b, b, cq, share.n, false);
    let opened = release_vector(&share, &shape, &plan, rng);
    bins.quantile(&opened.bin_counts(&bins, &plan, &fixed), q)
}

/// `rows` as the study sees them: mapped by `bounds`, clipped to `c`.
pub(crate) fn normalized(rows: &[Vec<f64>], bounds: &[(f64, f64)], c: f64) -> Vec<Vec<f64>> {
    rows.iter().map(|r| normalize_row(r, bounds, c).0).collect()
}
