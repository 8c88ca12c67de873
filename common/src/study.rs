//! The study: what every party agrees on before any data is touched, validated, and
//! the ciphertext layout all parties derive from it.

use num_bigint::BigUint;
use num_traits::One;

use crate::dp::{plan_noise_blocks, Centering, DpError, PrivacyRequest};
use crate::encoding::{vector_segments, EncodingError, FixedPoint, SlotBudget, TriangleLayout};
use crate::paillier::{PaillierError, PowerTable, PublicKey};

/// Smallest statistical hiding parameter of the mask b (bits).
pub const MIN_KAPPA: u32 = 40;
/// Default fractional bits of the fixed-point encoding.
pub const DEFAULT_FRAC_BITS: u32 = 20;
/// Largest pooled row count a study may declare (keeps exponents short).
pub const MAX_ROWS_LIMIT: u64 = 1 << 40;

/// Why a study specification is refused.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// Empty or inconsistent schema.
    #[error("invalid schema: {0}")]
    Schema(String),
    /// A parameter outside its range.
    #[error("invalid parameter `{name}`: {reason}")]
    Parameter {
        /// Parameter name.
        name: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// Privacy parameters.
    #[error(transparent)]
    Privacy(#[from] DpError),
    /// Key problems.
    #[error(transparent)]
    Key(#[from] PaillierError),
    /// The study does not fit the plaintext space.
    #[error(transparent)]
    Encoding(#[from] EncodingError),
}

fn param(name: &'static str, reason: impl Into<String>) -> SpecError {
    SpecError::Parameter {
        name,
        reason: reason.into(),
    }
}

/// How a classification study releases the class covariances.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClassCovariance {
    /// One within-class scatter shared by all classes (LDA-style): the total R~ is
    /// released once, so the noise is that of an unlabelled study.
    Shared,
    /// The paper's Algorithm 3: one R~_c per class, each with the full noise. With
    /// many small classes the per-class covariances drown in it.
    PerClass,
}

impl ClassCovariance {
    /// Parses the CLI/wire name.
    pub fn parse(name: &str) -> Result<Self, SpecError> {
        match name {
            "shared" => Ok(Self::Shared),
            "per-class" => Ok(Self::PerClass),
            other => Err(param(
                "class_covariance",
                format!("unknown value `{other}` (expected shared or per-class)"),
            )),
        }
    }

    /// The CLI/wire name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Shared => "shared",
            Self::PerClass => "per-class",
        }
    }
}

/// The classes of a classification study (PCA-Gauss Algorithm 3). Owners send, per
/// class c, the sum v~_c of its rows and its count scaled to Cq N_c; and either the
/// total R~ (shared covariance) or one R~_c per class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassSpec {
    /// Class labels (public), in the order of the released blocks.
    pub labels: Vec<String>,
    /// Shared or per-class covariance.
    pub covariance: ClassCovariance,
}

/// Public axes the owners project their rows onto before forming R (the second
/// round of PCA-Gauss: Pub-PCA, or the components of an earlier study). The sums v
/// stay M-dimensional, so the mean is not lost outside the span.
#[derive(Clone, Debug, PartialEq)]
pub struct Projection {
    /// k orthonormal rows of M values: W^T.
    pub axes: Vec<Vec<f64>>,
}

impl Projection {
    /// Number of axes k.
    pub fn rank(&self) -> usize {
        self.axes.len()
    }

    /// W^T x, scaled back to norm `c` should rounding have pushed it past.
    pub fn apply(&self, x: &[f64], c: f64) -> Vec<f64> {
        let mut y: Vec<f64> = self
            .axes
            .iter()
            .map(|w| w.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect();
        crate::data::clip_to_norm(&mut y, c);
        y
    }
}

/// A row-norm histogram study: instead of its rows, each owner sends one-hot rows
/// that mark the bin of each row's L2 norm (after the public bounds, before any
/// clipping), so the release is a DP histogram of the norms from which the user picks
/// the row-norm bound C of the real study (a DP quantile).
///
/// The study's own features are the bins, with bounds [-1, 1] (the identity
/// normalization) and C = 1: a one-hot row has norm exactly 1, so the ordinary
/// `dp-mean` sensitivities of a unit-norm study cover it, and replacing one data row
/// replaces one one-hot row. Bin b counts the norms in [edges[b], edges[b + 1]); the
/// last bin is open above.
#[derive(Clone, Debug, PartialEq)]
pub struct NormBins {
    /// The data columns the owners read (the real study's features).
    pub features: Vec<String>,
    /// Their public bounds.
    pub bounds: Vec<(f64, f64)>,
    /// Lower edges of the bins, starting at 0, strictly increasing.
    pub edges: Vec<f64>,
}

/// Most bins a row-norm histogram may have.
pub const MAX_NORM_BINS: usize = 64;

/// The largest norm a normalized row of `m` values can have (each at -1 or 1).
fn max_norm(m: usize) -> f64 {
    (m as f64).sqrt()
}

/// Bins of the standard row-norm histogram ([`NormBins::standard`]).
pub const STANDARD_NORM_BINS: usize = MAX_NORM_BINS;

impl NormBins {
    /// The histogram `user local --row-norm-quantile` runs: [`STANDARD_NORM_BINS`]
    /// geometric bins from sqrt(M) / 64 up to sqrt(M), about 7% apart, so the
    /// chosen C is at most that far above the quantile (norms tend to bunch: on
    /// optdigits 80% of them lie within 9% of each other).
    pub fn standard(features: Vec<String>, bounds: Vec<(f64, f64)>) -> Self {
        let lo = max_norm(features.len()) / 64.0;
        Self::geometric(features, bounds, lo, STANDARD_NORM_BINS)
    }

    /// Geometric bins from `lo` up to the largest norm possible, sqrt(M) (every
    /// value at a bound), with a first bin [0, lo).
    pub fn geometric(features: Vec<String>, bounds: Vec<(f64, f64)>, lo: f64, bins: usize) -> Self {
        let top = max_norm(features.len());
        let ratio = (top / lo).powf(1.0 / (bins.saturating_sub(2).max(1)) as f64);
        let mut edges = vec![0.0];
        edges.extend((0..bins.saturating_sub(1)).map(|i| lo * ratio.powi(i as i32)));
        Self {
            features,
            bounds,
            edges,
        }
    }

    /// The bin names, which are the histogram study's features.
    pub fn bin_names(&self) -> Vec<String> {
        self.edges
            .iter()
            .enumerate()
            .map(|(i, lo)| match self.edges.get(i + 1) {
                Some(hi) => format!("norm [{lo:.4}, {hi:.4})"),
                None => format!("norm >= {lo:.4}"),
            })
            .collect()
    }

    /// The bin of a norm.
    pub fn bin_of(&self, norm: f64) -> usize {
        self.edges.iter().rposition(|&e| norm >= e).unwrap_or(0)
    }

    /// The one-hot row an owner sends for a data row: 1 in the bin of its norm after
    /// the public bounds (unclipped), 0 elsewhere.
    pub fn one_hot(&self, row: &[f64]) -> Vec<f64> {
        let (x, _) = crate::data::normalize_row(row, &self.bounds, f64::INFINITY);
        let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt();
        let mut out = vec![0.0; self.edges.len()];
        out[self.bin_of(norm)] = 1.0;
        out
    }

    /// The q-quantile of the norms from noisy counts (negative counts taken as 0):
    /// the upper edge of the first bin where the cumulative count reaches q of the
    /// total, sqrt(M) for the open last bin. Rounding up to an edge clips at most
    /// the share 1 - q of the rows, up to the noise.
    pub fn quantile(&self, counts: &[f64], q: f64) -> f64 {
        let top = max_norm(self.features.len());
        let clipped: Vec<f64> = counts.iter().map(|c| c.max(0.0)).collect();
        let total: f64 = clipped.iter().sum();
        if total <= 0.0 {
            return top;
        }
        let mut acc = 0.0;
        for (b, c) in clipped.iter().enumerate() {
            acc += c;
            if acc >= q * total {
                return self.edges.get(b + 1).copied().unwrap_or(top);
            }
        }
        top
    }

    fn validate(&self, spec: &StudySpec) -> Result<(), SpecError> {
        let b = self.edges.len();
        if !(2..=MAX_NORM_BINS).contains(&b) {
            return Err(param(
                "norm_bins",
                format!("needs 2..={MAX_NORM_BINS} bins, got {b}"),
            ));
        }
        if self.edges[0] != 0.0
            || self
                .edges
                .windows(2)
                .any(|w| !(w[1].is_finite() && w[1] > w[0]))
        {
            return Err(param(
                "norm_bins",
                "edges must start at 0 and increase strictly",
            ));
        }
        if self.features.is_empty() || self.bounds.len() != self.features.len() {
            return Err(param(
                "norm_bins",
                format!(
                    "{} data features but {} bounds",
                    self.features.len(),
                    self.bounds.len()
                ),
            ));
        }
        if spec.features != self.bin_names()
            || spec.bounds.iter().any(|&b| b != (-1.0, 1.0))
            || spec.fixed.row_norm_bound != 1.0
        {
            return Err(param(
                "norm_bins",
                "a histogram study's features must be its bins, with bounds [-1, 1] and C = 1",
            ));
        }
        if spec.privacy.centering != Centering::DpMean
            || spec.classes.is_some()
            || spec.projection.is_some()
            || !spec.privacy.mechanism.proven()
        {
            return Err(param(
                "norm_bins",
                "a histogram study is a plain `dp-mean` study (gaussian or laplace): no classes, no projection",
            ));
        }
        Ok(())
    }
}

/// Most classes a study may declare (every class adds M + 1 released values).
pub const MAX_CLASSES: usize = 1000;

/// A validated study specification.
#[derive(Clone, Debug)]
pub struct StudySpec {
    /// Feature names, in column order.
    pub features: Vec<String>,
    /// Public per-feature bounds [lo, hi].
    pub bounds: Vec<(f64, f64)>,
    /// Fixed-point parameters (row norm bound C and fractional bits).
    pub fixed: FixedPoint,
    /// Upper bound on the pooled row count N (public; sizes the slots).
    pub max_rows: u64,
    /// Mechanism, centering, epsilon, delta.
    pub privacy: PrivacyRequest,
    /// Fewest owners with which the study may complete at its deadline.
    pub min_owners: u32,
    /// Owners after which the study seals at once.
    pub quorum: u32,
    /// Deadline, milliseconds since the Unix epoch.
    pub deadline_unix_ms: u64,
    /// Statistical hiding parameter of the mask (bits).
    pub kappa: u32,
    /// The data user's Paillier public key.
    pub public_key: PublicKey,
    /// The paper's way, for side-by-side speed measurements: one value per
    /// ciphertext, textbook r^n randomness, no CRT, one thread.
    pub baseline: bool,
    /// Classes of a classification study; `None` for PCA, clustering and regression.
    pub classes: Option<ClassSpec>,
    /// Public axes for a projected study; `None` releases R in all M dimensions.
    pub projection: Option<Projection>,
    /// A row-norm histogram study: owners send the one-hot bins of their rows'
    /// norms instead of the rows.
    pub norm_bins: Option<NormBins>,
    /// The owners invited, by id; empty: any authenticated owner may contribute.
    /// With a list, the proxy refuses others and says at the seal who is missing.
    pub expected_owners: Vec<String>,
}

impl StudySpec {
    /// Checks every field; the layout must also fit the key.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.features.is_empty() {
            return Err(SpecError::Schema("no features".into()));
        }
        if self.bounds.len() != self.features.len() {
            return Err(SpecError::Schema(format!(
                "{} features but {} bounds",
                self.features.len(),
                self.bounds.len()
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for name in &self.features {
            if name.is_empty() || !seen.insert(name.as_str()) {
                return Err(SpecError::Schema(format!(
                    "empty or duplicate feature name `{name}`"
                )));
            }
        }
        for (name, &(lo, hi)) in self.features.iter().zip(&self.bounds) {
            if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
                return Err(SpecError::Schema(format!(
                    "bounds of `{name}` must be finite with lo <= hi, got [{lo}, {hi}]"
                )));
            }
        }
        let c = self.fixed.row_norm_bound;
        if !(c.is_finite() && c > 0.0 && c <= 1e6) {
            return Err(param(
                "row_norm_bound",
                format!("must be in (0, 1e6], got {c}"),
            ));
        }
        if !(1..=30).contains(&self.fixed.frac_bits) {
            return Err(param(
                "frac_bits",
                format!("must be in 1..=30, got {}", self.fixed.frac_bits),
            ));
        }
        if self.fixed.norm_bound_int() == 0 {
            return Err(param("row_norm_bound", "C 2^f rounds to zero"));
        }
        if self.max_rows == 0 || self.max_rows > MAX_ROWS_LIMIT {
            return Err(param(
                "max_rows",
                format!("must be in 1..={MAX_ROWS_LIMIT}, got {}", self.max_rows),
            ));
        }
        if self.kappa < MIN_KAPPA || self.kappa > 256 {
            return Err(param(
                "kappa",
                format!("must be in {MIN_KAPPA}..=256, got {}", self.kappa),
            ));
        }
        if self.min_owners == 0 || self.min_owners > self.quorum {
            return Err(param(
                "min_owners",
                format!(
                    "must be in 1..=quorum ({}), got {}",
                    self.quorum, self.min_owners
                ),
            ));
        }
        if !self.expected_owners.is_empty() {
            let mut seen = std::collections::HashSet::new();
            for o in &self.expected_owners {
                if o.is_empty() || !seen.insert(o.as_str()) {
                    return Err(param(
                        "expected_owners",
                        format!("empty or duplicate owner id `{o}`"),
                    ));
                }
            }
            if self.quorum as usize > self.expected_owners.len() {
                return Err(param(
                    "quorum",
                    format!(
                        "{} is more than the {} owners invited",
                        self.quorum,
                        self.expected_owners.len()
                    ),
                ));
            }
        }
        if let Some(classes) = &self.classes {
            self.validate_classes(classes)?;
        }
        if let Some(p) = &self.projection {
            self.validate_projection(p)?;
        }
        if let Some(bins) = &self.norm_bins {
            bins.validate(self)?;
        }
        // Re-validates epsilon/delta/mechanism combinations.
        PrivacyRequest::new(
            self.privacy.mechanism,
            self.privacy.centering,
            self.privacy.epsilon,
            self.privacy.delta,
        )?;
        if self.noise_plan(self.max_rows).overflowed() {
            return Err(param(
                "epsilon",
                format!(
                    "the noise of epsilon {} at these bounds is too large to represent; \
                     ask for a larger epsilon",
                    self.privacy.epsilon
                ),
            ));
        }
        StudyLayout::new(self)?;
        Ok(())
    }

    /// The row-norm histogram study of this study's data: the same key, rows,
    /// owners and schedule; the standard bins as features; `privacy` (the share
    /// split off for it, `dp-mean`).
    pub fn norm_histogram(&self, privacy: PrivacyRequest) -> StudySpec {
        let bins = NormBins::standard(self.features.clone(), self.bounds.clone());
        StudySpec {
            features: bins.bin_names(),
            bounds: vec![(-1.0, 1.0); bins.edges.len()],
            fixed: FixedPoint {
                frac_bits: self.fixed.frac_bits,
                row_norm_bound: 1.0,
            },
            privacy,
            classes: None,
            projection: None,
            norm_bins: Some(bins),
            ..self.clone()
        }
    }

    /// What this study spends, block by block ([`crate::dp::budget_ledger`]); a
    /// histogram study's two blocks are named for what they count.
    pub fn budget_ledger(&self) -> crate::dp::BudgetLedger {
        let mut ledger = crate::dp::budget_ledger(&self.privacy, self.classes.is_some());
        if self.norm_bins.is_some() {
            for (p, name) in ledger
                .parts
                .iter_mut()
                .zip(["bin counts (diagonal of R)", "bin counts (sums v)"])
            {
                p.part = name.into();
            }
        }
        ledger
    }

    /// Number of features M.
    pub fn dim(&self) -> usize {
        self.features.len()
    }

    fn validate_classes(&self, classes: &ClassSpec) -> Result<(), SpecError> {
        let n = classes.labels.len();
        if !(2..=MAX_CLASSES).contains(&n) {
            return Err(param(
                "classes",
                format!("a classification study needs 2..={MAX_CLASSES} classes, got {n}"),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for label in &classes.labels {
            if label.is_empty() || !seen.insert(label.as_str()) {
                return Err(param(
                    "classes",
                    format!("empty or duplicate class label `{label}`"),
                ));
            }
        }
        if self.privacy.centering != Centering::DpMean {
            // The class means are released with their own noise; the mask of `mask`
            // centering would hide exactly what the synthesis needs.
            return Err(param(
                "classes",
                "classification releases noisy class means: it needs `dp-mean` centering",
            ));
        }
        if !self.privacy.mechanism.supports_classes() {
            return Err(param(
                "classes",
                "the Wishart mechanism has no class-aware sensitivity: use gaussian or laplace",
            ));
        }
        Ok(())
    }

    /// The noise plan of this study for a pooled table of `n_rows` rows.
    pub fn noise_plan(&self, n_rows: u64) -> crate::dp::NoisePlan {
        plan_noise_blocks(
            &self.privacy,
            self.matrix_dim(),
            self.dim(),
            self.fixed.norm_bound_int(),
            n_rows,
            self.classes.is_some(),
        )
    }

    fn validate_projection(&self, p: &Projection) -> Result<(), SpecError> {
        let (k, m) = (p.rank(), self.dim());
        if k == 0 || k > m {
            return Err(param("projection", format!("needs 1..={m} axes, got {k}")));
        }
        if let Some(i) = p
            .axes
            .iter()
            .position(|w| w.len() != m || w.iter().any(|v| !v.is_finite()))
        {
            return Err(param(
                "projection",
                format!("axis {} must hold {m} finite values", i + 1),
            ));
        }
        for i in 0..k {
            for j in i..k {
                let dot: f64 = p.axes[i].iter().zip(&p.axes[j]).map(|(a, b)| a * b).sum();
                let want = if i == j { 1.0 } else { 0.0 };
                if (dot - want).abs() > 1e-6 {
                    return Err(param(
                        "projection",
                        format!(
                            "axes must be orthonormal: axes {} and {} have inner product {dot}",
                            i + 1,
                            j + 1
                        ),
                    ));
                }
            }
        }
        if self.privacy.centering != Centering::DpMean {
            return Err(param(
                "projection",
                "a projected study releases the sums beside the projected R: it needs `dp-mean` centering",
            ));
        }
        Ok(())
    }

    /// Dimensions of the released matrix block: k with a projection, else M.
    pub fn matrix_dim(&self) -> usize {
        self.projection
            .as_ref()
            .map_or(self.dim(), Projection::rank)
    }

    /// Number of classes (0 when the study has none).
    pub fn class_count(&self) -> usize {
        self.classes.as_ref().map_or(0, |c| c.labels.len())
    }

    /// Whether each class gets its own released scatter.
    pub fn per_class_matrix(&self) -> bool {
        matches!(
            &self.classes,
            Some(ClassSpec {
                covariance: ClassCovariance::PerClass,
                ..
            })
        )
    }
}

/// The shape of a study's released blocks, without the packing: all a plaintext
/// reference computation needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockShape {
    /// Features M (of the vector block).
    pub dim: usize,
    /// Dimensions of the matrix block: k with a projection, else M.
    pub matrix_dim: usize,
    /// Matrix blocks: 1, or one per class with per-class covariances.
    pub matrix_blocks: usize,
    /// Classes (0 when the study has none).
    pub classes: usize,
    /// Grid value of one counted row in the vector block (Cq).
    pub count_scale: u64,
}

impl BlockShape {
    /// The shape of a study with `dim` features, `classes` classes (0 for none),
    /// per-class matrices or not, and integer row bound `cq`.
    pub fn new(dim: usize, classes: usize, per_class_matrix: bool, cq: u64) -> Self {
        Self {
            dim,
            matrix_dim: dim,
            matrix_blocks: if per_class_matrix && classes > 0 {
                classes
            } else {
                1
            },
            classes,
            count_scale: cq,
        }
    }

    /// The same shape with the matrix block in `k` projected dimensions.
    pub fn projected(self, k: usize) -> Self {
        Self {
            matrix_dim: k,
            ..self
        }
    }

    /// Values in the vector block: M, or G (M + 1).
    pub fn vector_len(&self) -> usize {
        if self.classes == 0 {
            self.dim
        } else {
            self.classes * (self.dim + 1)
        }
    }
}

/// The ciphertext layout of a study, derived identically by every party.
///
/// An owner sends, in order: `matrix_blocks` copies of the packed upper-triangle
/// segments (R~, or R~_c per class), the vector block (v~ unpacked in `mask`
/// centering, where the proxy's mask term needs each v_i alone; packed in `dp-mean`),
/// then N. The vector block of a classification study is v~_1, ..., v~_G followed by
/// Cq N_1, ..., Cq N_G.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StudyLayout {
    /// Slot width and slots per plaintext.
    pub budget: SlotBudget,
    /// Packed upper-triangle segments of one matrix block.
    pub triangle: TriangleLayout,
    /// Matrix blocks: 1, or one per class with per-class covariances.
    pub matrix_blocks: usize,
    /// Classes (0 when the study has none).
    pub classes: usize,
    /// Values in the vector block: M, or G (M + 1) with G classes.
    pub vector_len: usize,
    /// Features M of the vector block (the triangle has k with a projection).
    pub vector_dim: usize,
    /// Packed segments of the vector block (start, len), as released.
    pub vector: Vec<(usize, usize)>,
    /// Whether owners send the vector block packed (`dp-mean`) or one value per
    /// ciphertext (`mask`).
    pub vector_packed: bool,
    /// Grid value of one counted row in the vector block (Cq).
    pub count_scale: u64,
    /// Bits of the mask b: b is uniform in [0, 2^mask_bits).
    pub mask_bits: u64,
    /// The paper's way (see [`StudySpec::baseline`]).
    pub baseline: bool,
}

impl StudyLayout {
    /// Proves the slot width from the study's public bounds (N_max, Cq, kappa and the
    /// noise tail at N_max) and cuts the triangle into segments.
    pub fn new(spec: &StudySpec) -> Result<Self, SpecError> {
        let m = spec.dim();
        let cq_int = spec.fixed.norm_bound_int();
        let cq = BigUint::from(cq_int);
        let n = BigUint::from(spec.max_rows);
        let plan = spec.noise_plan(spec.max_rows);
        // Every vector entry (a sum of rows, or Cq times a count) is at most N Cq.
        let v_max = &n * &cq;
        // 2^vbits >= 2 max|v|, so v + b hides v up to statistical distance 2^-kappa.
        let mask_bits = (&v_max << 1usize).bits() + spec.kappa as u64;
        let (t_bound, v_bound) = match spec.privacy.centering {
            Centering::Mask => {
                let b = BigUint::one() << mask_bits as usize;
                let t = &n * &n * &cq * &cq
                    + (&v_max << 1usize) * &b
                    + &b * &b
                    + plan.matrix.tail_bound();
                (t, &v_max + &b)
            }
            Centering::DpMean => {
                let t = &n * &cq * &cq + plan.matrix.tail_bound();
                let tail_v = plan
                    .vector
                    .as_ref()
                    .map(|v| v.tail_bound())
                    .unwrap_or_default();
                (t, &v_max + tail_v)
            }
        };
        let mut budget = SlotBudget::for_bound(&t_bound.max(v_bound), spec.public_key.bits())?;
        if spec.baseline {
            budget.slots = 1;
        }
        let shape = BlockShape::new(m, spec.class_count(), spec.per_class_matrix(), cq_int)
            .projected(spec.matrix_dim());
        let vector_len = shape.vector_len();
        let slots = budget.slots;
        Ok(Self {
            budget,
            triangle: TriangleLayout::new(shape.matrix_dim, slots),
            vector_dim: m,
            matrix_blocks: shape.matrix_blocks,
            classes: shape.classes,
            vector_len,
            vector: vector_segments(vector_len, slots),
            vector_packed: spec.privacy.centering == Centering::DpMean,
            count_scale: cq_int,
            mask_bits,
            baseline: spec.baseline,
        })
    }

    /// The shape of the released blocks.
    pub fn shape(&self) -> BlockShape {
        BlockShape {
            dim: self.vector_dim,
            matrix_dim: self.triangle.dim,
            matrix_blocks: self.matrix_blocks,
            classes: self.classes,
            count_scale: self.count_scale,
        }
    }

    /// Ciphertexts of the matrix blocks.
    pub fn matrix_ciphertexts(&self) -> usize {
        self.matrix_blocks * self.triangle.len()
    }

    /// Ciphertexts of the vector block as owners send it.
    pub fn owner_vector_ciphertexts(&self) -> usize {
        if self.vector_packed {
            self.vector.len()
        } else {
            self.vector_len
        }
    }

    /// Ciphertexts one owner sends: the matrix blocks, the vector block, then N.
    pub fn owner_ciphertexts(&self) -> usize {
        self.matrix_ciphertexts() + self.owner_vector_ciphertexts() + 1
    }

    /// Window of the power tables in the proxy's mask term: each row's shifted bases
    /// serve every segment of that row, about (segments / M) uses each.
    pub fn mask_window(&self) -> usize {
        let uses = self.triangle.len().div_ceil(self.triangle.dim.max(1));
        PowerTable::window_for(self.mask_bits, uses)
    }

    /// Ciphertexts the proxy releases: the packed matrix blocks, then the packed
    /// vector block.
    pub fn release_ciphertexts(&self) -> usize {
        self.matrix_ciphertexts() + self.vector.len()
    }
}
