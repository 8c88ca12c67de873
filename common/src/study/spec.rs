//! The study spec every party agrees on, and its checks.

use super::{
    param, ClassCovariance, ClassSpec, Marginals, NormBins, Projection, SpecError, StudyLayout,
    MAX_ROWS_LIMIT, MIN_KAPPA,
};
use crate::dp::distributed::{honest_shares, OwnerNoise};
use crate::dp::{plan_marginal_noise, plan_noise_blocks, Centering, PrivacyRequest};
use crate::encoding::FixedPoint;
use crate::paillier::PublicKey;

/// Each feature's bounds finite with lo <= hi, or what is wrong with the first
/// that is not.
pub(super) fn check_intervals(features: &[String], bounds: &[(f64, f64)]) -> Result<(), String> {
    match features
        .iter()
        .zip(bounds)
        .find(|(_, (lo, hi))| !(lo.is_finite() && hi.is_finite() && lo <= hi))
    {
        Some((name, (lo, hi))) => Err(format!(
            "bounds of `{name}` must be finite with lo <= hi, got [{lo}, {hi}]"
        )),
        None => Ok(()),
    }
}

/// Whether `c` changes how a terminal shows the text after it: a C0 or C1 control
/// or DEL (escape sequences that retitle or clear a terminal, carriage returns and
/// line feeds that overwrite or fake a line), or a bidirectional embedding,
/// override or isolate (which reorders the rest of a line). The marks (LRM, RLM,
/// ALM) are let through: they move no text past another, and right-to-left column
/// names exported by spreadsheets carry them. The names and ids one party shows
/// another may hold none ([`check_no_terminal_controls`]); free text (a refusal)
/// is escaped where it is printed.
pub fn is_terminal_control(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// `text` (`what`: "feature name", "owner id") if it holds no
/// [`is_terminal_control`] character; else what is wrong, with the text escaped.
pub fn check_no_terminal_controls(what: &str, text: &str) -> Result<(), String> {
    match text.chars().find(|&c| is_terminal_control(c)) {
        Some(c) => Err(format!(
            "{what} {text:?} holds the control character U+{:04X}",
            u32::from(c)
        )),
        None => Ok(()),
    }
}

/// Most classes a study may declare (every class adds M + 1 released values).
pub const MAX_CLASSES: usize = 1000;

/// The longest id (of a study, an owner, a contribution) the protocol carries: the
/// proxy keeps each with its study, in memory and in its stored record, and
/// refuses an upload naming a longer one, so no longer owner may be invited.
pub const MAX_ID_BYTES: usize = 256;

/// A study specification as written (by a user, a test, or read off the wire),
/// not yet checked: fill it in, then [`SpecDraft::validate`] it into a
/// [`StudySpec`]. Nothing but a draft can be changed; a [`StudySpec`] is edited by
/// turning it back into a draft ([`StudySpec::to_draft`]) and validating again.
#[derive(Clone, Debug)]
pub struct SpecDraft {
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
    /// A marginal histogram study: owners send the bin of each value on a public
    /// grid instead of the rows; `features` are the data columns.
    pub marginals: Option<Marginals>,
    /// The owners invited, by id; empty: any authenticated owner may contribute.
    /// With a list, the proxy refuses others and says at the seal who is missing.
    pub expected_owners: Vec<String>,
    /// Owners that may work with the proxy and the user (t). In a study whose
    /// owners add the noise ([`SpecDraft::owner_noise`]) each share is calibrated
    /// for `min_owners - t` honest owners; 0 in any other study.
    pub colluding_owners: u32,
    /// The URL of the study's mask holder: a second proxy, run by another
    /// operator, that keeps each owner's mask seed and gives the user the sum of
    /// the counted owners' masks once ([`crate::secagg`]). `None`: owners send
    /// their shares unmasked, and the proxy with the user reads each.
    pub mask_holder: Option<String>,
}

/// The longest mask holder URL a spec may name.
pub const MAX_MASK_HOLDER_URL: usize = 256;

/// A study specification that passed every check of [`SpecDraft::validate`]: the
/// only kind a study is opened with, a layout derived from and a party acts on.
/// Its fields are read through [`SpecDraft`] (it dereferences to one) and cannot be
/// changed in place.
#[derive(Clone, Debug)]
pub struct StudySpec(SpecDraft);

impl std::ops::Deref for StudySpec {
    type Target = SpecDraft;

    fn deref(&self) -> &SpecDraft {
        &self.0
    }
}

impl StudySpec {
    /// A copy to edit; validate it again to use it.
    pub fn to_draft(&self) -> SpecDraft {
        self.0.clone()
    }

    /// The row-norm histogram study of this study's data: the same key, rows,
    /// owners and schedule; the standard bins as features; `privacy` (the share
    /// split off for it, `dp-mean`).
    pub fn norm_histogram(&self, privacy: PrivacyRequest) -> Result<StudySpec, SpecError> {
        let bins = NormBins::standard(self.features.clone(), self.bounds.clone());
        SpecDraft {
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
            marginals: None,
            ..self.to_draft()
        }
        .validate()
    }

    /// The marginal histogram study of this study's data: the same key, rows,
    /// owners and schedule and the same data columns, read on `grid` in place of
    /// the bounds; `privacy` (the share split off for it, `dp-mean`).
    pub fn marginal_histograms(
        &self,
        grid: Marginals,
        privacy: PrivacyRequest,
    ) -> Result<StudySpec, SpecError> {
        SpecDraft {
            bounds: vec![(-1.0, 1.0); self.dim()],
            fixed: FixedPoint {
                frac_bits: self.fixed.frac_bits,
                row_norm_bound: 1.0,
            },
            privacy,
            classes: None,
            projection: None,
            norm_bins: None,
            marginals: Some(grid),
            ..self.to_draft()
        }
        .validate()
    }
}

impl SpecDraft {
    /// Checks every field (the layout must also fit the key) and returns the
    /// validated spec.
    pub fn validate(self) -> Result<StudySpec, SpecError> {
        self.check()?;
        self.check_names()?;
        Ok(StudySpec(self))
    }

    /// As [`SpecDraft::validate`], but for a spec read back from the proxy's own
    /// state: its names and ids are not checked for terminal controls, so a study
    /// a build before that check took in is still restored (each owner refuses
    /// it on the spec it is served, and the status table shows its names escaped).
    pub fn validate_stored(self) -> Result<StudySpec, SpecError> {
        self.check()?;
        Ok(StudySpec(self))
    }

    /// The names and ids other parties print hold no terminal control: feature
    /// names (a histogram's data features too), class labels and invited owners.
    fn check_names(&self) -> Result<(), SpecError> {
        for label in self.classes.iter().flat_map(|c| &c.labels) {
            check_no_terminal_controls("class label", label).map_err(|e| param("classes", e))?;
        }
        for name in &self.features {
            check_no_terminal_controls("feature name", name).map_err(SpecError::Schema)?;
        }
        for name in self.norm_bins.iter().flat_map(|b| &b.features) {
            check_no_terminal_controls("feature name", name).map_err(|e| param("norm_bins", e))?;
        }
        for owner in &self.expected_owners {
            check_no_terminal_controls("owner id", owner)
                .map_err(|e| param("expected_owners", e))?;
        }
        Ok(())
    }

    fn check(&self) -> Result<(), SpecError> {
        self.check_schema()?;
        self.check_fixed_point()?;
        self.check_counts()?;
        self.check_invitations()?;
        if let Some(classes) = &self.classes {
            self.validate_classes(classes)?;
        }
        if let Some(p) = &self.projection {
            self.validate_projection(p)?;
        }
        if let Some(bins) = &self.norm_bins {
            bins.validate(self)?;
        }
        if let Some(grid) = &self.marginals {
            grid.validate(self)?;
        }
        self.check_privacy()?;
        StudyLayout::check_fits(self)
    }

    /// Features named once each, one finite interval apiece.
    fn check_schema(&self) -> Result<(), SpecError> {
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
        check_intervals(&self.features, &self.bounds).map_err(SpecError::Schema)
    }

    /// The ball C and the fixed-point scale it is encoded at.
    fn check_fixed_point(&self) -> Result<(), SpecError> {
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
        Ok(())
    }

    /// Rows, statistical security and owners within their ranges.
    fn check_counts(&self) -> Result<(), SpecError> {
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
        self.check_colluding()?;
        self.check_mask_holder()
    }

    /// A mask holder only where the owners add the noise (elsewhere the proxy
    /// must read each contribution's count or noise it), named by an `http` or
    /// `https` URL of printable characters.
    fn check_mask_holder(&self) -> Result<(), SpecError> {
        let Some(url) = &self.mask_holder else {
            return Ok(());
        };
        if !self.owners_add_noise() {
            return Err(param(
                "mask_holder",
                "masked contributions need a study whose owners add the noise (`dp-mean` \
                 centering with the gaussian mechanism)"
                    .to_string(),
            ));
        }
        let scheme = url.starts_with("https://") || url.starts_with("http://");
        let printable = url.chars().all(|c| c.is_ascii_graphic());
        if !scheme || !printable || url.len() > MAX_MASK_HOLDER_URL {
            return Err(param(
                "mask_holder",
                format!(
                    "must be an http(s) URL of at most {MAX_MASK_HOLDER_URL} printable \
                     characters, got {url:?}"
                ),
            ));
        }
        Ok(())
    }

    /// t below min_owners (one honest share at least), and 0 where the proxy
    /// draws the noise: no owner's share is then left to defend against it.
    fn check_colluding(&self) -> Result<(), SpecError> {
        let t = self.colluding_owners;
        if t == 0 {
            return Ok(());
        }
        if !self.owners_add_noise() {
            return Err(param(
                "colluding_owners",
                format!(
                    "{t} colluding owners need a study whose owners add the noise \
                     (`dp-mean` centering with the gaussian mechanism); in this one the \
                     proxy draws it"
                ),
            ));
        }
        if t >= self.min_owners {
            return Err(param(
                "colluding_owners",
                format!(
                    "must be below min_owners ({}), so one honest owner's noise is left; got {t}",
                    self.min_owners
                ),
            ));
        }
        Ok(())
    }

    /// An invitation list, where there is one: distinct ids of bounded length, at
    /// least a quorum of them.
    fn check_invitations(&self) -> Result<(), SpecError> {
        if self.expected_owners.is_empty() {
            return Ok(());
        }
        let mut seen = std::collections::HashSet::new();
        for o in &self.expected_owners {
            if o.is_empty() || !seen.insert(o.as_str()) {
                return Err(param(
                    "expected_owners",
                    format!("empty or duplicate owner id `{o}`"),
                ));
            }
            if o.len() > MAX_ID_BYTES {
                return Err(param(
                    "expected_owners",
                    format!("an owner id of {} bytes; at most {MAX_ID_BYTES}", o.len()),
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
        Ok(())
    }

    /// The mechanism, centering, epsilon and delta as one request, and noise that
    /// the fixed-point encoding can hold at these bounds.
    fn check_privacy(&self) -> Result<(), SpecError> {
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
        Ok(())
    }

    /// What this study spends, block by block ([`crate::dp::budget_ledger`]); a
    /// histogram study's two blocks are named for what they count.
    pub fn budget_ledger(&self) -> crate::dp::BudgetLedger {
        if self.marginals.is_some() {
            return crate::dp::marginal_budget_ledger(&self.privacy);
        }
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

    /// Values in the released vector block before classes: M, or a marginal
    /// study's bins of every feature and its count.
    pub fn vector_dim(&self) -> usize {
        match &self.marginals {
            Some(grid) => grid.width(self.dim()),
            None => self.dim(),
        }
    }

    /// Whether `owner` may contribute: any owner when no list is given, else one
    /// the list names.
    pub fn invites(&self, owner: &str) -> bool {
        self.expected_owners.is_empty() || self.expected_owners.iter().any(|o| o == owner)
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
        if self.marginals.is_some() {
            return plan_marginal_noise(&self.privacy, self.fixed.norm_bound_int(), self.dim());
        }
        plan_noise_blocks(
            &self.privacy,
            self.matrix_dim(),
            self.dim(),
            self.fixed.norm_bound_int(),
            n_rows,
            self.classes.is_some(),
        )
    }

    /// Whether the owners add this study's noise: `dp-mean` centering with a
    /// mechanism that splits over owners ([`crate::dp::distributed`]). In the
    /// others (`mask`, Laplace, Wishart, the classic Gaussian) the proxy draws it.
    pub fn owners_add_noise(&self) -> bool {
        self.privacy.centering == Centering::DpMean && self.privacy.mechanism.splits_over_owners()
    }

    /// The share of noise each owner adds, where the owners add it: the plan's
    /// scales split over `min_owners - colluding_owners` honest owners.
    pub fn owner_noise(&self) -> Option<OwnerNoise> {
        if !self.owners_add_noise() {
            return None;
        }
        let honest = honest_shares(self.min_owners, self.colluding_owners);
        OwnerNoise::for_plan(&self.noise_plan(self.max_rows), honest)
    }

    /// The noise the proxy draws for a release: the plan for `n_rows`, none where
    /// the owners add it, none at all on a study opened noise-free for testing.
    /// The proxy reports its scale, and the user checks it against this.
    pub fn proxy_plan(&self, n_rows: Option<u64>, noise_free: bool) -> crate::dp::NoisePlan {
        let mut plan = self.noise_plan(n_rows.unwrap_or(0));
        if noise_free || self.owners_add_noise() {
            plan.matrix = crate::dp::NoiseScale::None;
            plan.vector = plan.vector.map(|_| crate::dp::NoiseScale::None);
        }
        if noise_free {
            plan.epsilon = f64::INFINITY;
        }
        plan
    }

    /// The noise a release of this study carries: the plan for `n_rows` (N, proven
    /// to the proxy under `mask`; `None` under `dp-mean`, whose plan reads none),
    /// or none at all on a study opened noise-free for testing. The proxy draws it;
    /// the user, who knows all three, computes it too rather than take the
    /// proxy's word for it.
    ///
    /// Where the owners add the noise, it is the sum of the `owners` shares
    /// counted ([`OwnerNoise::sum_plan`]); an owner adds none to a study opened
    /// noise-free, which it has accepted by name.
    pub fn release_plan(
        &self,
        n_rows: Option<u64>,
        noise_free: bool,
        owners: usize,
    ) -> crate::dp::NoisePlan {
        match (noise_free, self.owner_noise()) {
            (false, Some(shares)) => shares.sum_plan(&self.noise_plan(n_rows.unwrap_or(0)), owners),
            _ => self.proxy_plan(n_rows, noise_free),
        }
    }

    /// The standard deviation of `plan`'s noise per entry of the scatter S, in
    /// the table's normalized units: the `mask` release is N S~ on the fixed-point
    /// grid squared (N as proven), the `dp-mean` release S~ on that grid.
    pub fn noise_sd_per_entry(&self, plan: &crate::dp::NoisePlan, n_rows: Option<u64>) -> f64 {
        let grid = f64::from(self.fixed.frac_bits).exp2();
        plan.matrix.std_dev() / (n_rows.unwrap_or(1) as f64 * grid * grid)
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

    /// Dimensions of the released matrix block: k with a projection, none in a
    /// marginal study, else M.
    pub fn matrix_dim(&self) -> usize {
        if self.marginals.is_some() {
            return 0;
        }
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
