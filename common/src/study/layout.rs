//! The ciphertext layout every party derives from a validated spec.

use num_bigint::BigUint;
use num_traits::One;

use super::{SpecDraft, SpecError, StudySpec};
use crate::dp::Centering;
use crate::encoding::{vector_segments, SlotBudget, TriangleLayout};
use crate::radix;

/// The version of the ciphertext layout [`StudyLayout::new`] derives from a spec.
///
/// Every party derives the layout on its own, so two builds that derive different
/// layouts from one spec would read each other's ciphertexts at the wrong offsets:
/// noise added where no value is, values decoded with no noise on them. Specs carry
/// this version on the wire and a party refuses a spec of another one. Bump it with
/// any change to the slot widths, the segment order or the blocks.
///
/// - 1 (no version on the wire): one slot width for every block, sized in `mask`
///   centering for T and its b b^T.
/// - 2: `mask` slots sized for N S~ + E' (the user subtracts v' v'^T before it
///   unpacks); the vector block with slots of its own.
/// - 3: a marginal histogram study ([`crate::study::Marginals`]): its vector block
///   alone, every feature's bins then the count, and no matrix block. The
///   layouts of other studies are those of version 2.
/// - 4: in a study whose owners add the noise ([`crate::dp::distributed`]), the
///   slots hold the sum of up to `quorum` owners' shares, and every owner adds
///   its share before it encrypts (an owner of version 3 adds none).
pub const LAYOUT_VERSION: u32 = 4;

/// The most ciphertexts one contribution holds by default, at the proxy (which
/// holds every owner's while it folds) and at an owner (which encrypts its
/// own): the M = 1000 study at 2048 bits fits (about 40,000 ciphertexts); at
/// 4096 bits this is 64 MiB per contribution held.
pub const DEFAULT_MAX_CIPHERTEXTS: usize = 1 << 16;

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
    /// Slot width and slots per plaintext of the matrix blocks.
    pub budget: SlotBudget,
    /// Slot width and slots per plaintext of the vector block, whose final values
    /// (v + b, or v + e_v and the counts) have bounds of their own.
    pub vector_budget: SlotBudget,
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
    /// The paper's way (see [`SpecDraft::baseline`](crate::study::SpecDraft::baseline)).
    pub baseline: bool,
}

impl StudyLayout {
    /// Proves the slot widths from the study's public bounds (N_max, Cq, kappa and the
    /// noise tail at N_max) and cuts the triangle into segments. Its M^2 / 2
    /// segments are the caller's to bound first ([`StudyLayout::plan`]) where
    /// the spec came from another party.
    pub fn new(spec: &StudySpec) -> Result<Self, SpecError> {
        Ok(Self::plan(spec)?.cut())
    }

    /// Whether a spec being validated has a layout that fits its key (the last
    /// check of its validation), proven without cutting a segment.
    pub(super) fn check_fits(spec: &SpecDraft) -> Result<(), SpecError> {
        LayoutPlan::of(spec).map(|_| ())
    }

    /// `spec`'s layout before its segments are cut, its size counted
    /// ([`LayoutPlan::size`]): what a party checks against its caps before it
    /// cuts ([`LayoutPlan::cut`]) a layout for a spec another party sent, whose
    /// M^2 / 2 segments would otherwise be the allocation those caps are there
    /// to stop.
    pub fn plan(spec: &StudySpec) -> Result<LayoutPlan, SpecError> {
        LayoutPlan::of(spec)
    }

    /// The ciphertexts this layout holds (its plan's [`LayoutPlan::size`]).
    pub fn size(&self) -> LayoutSize {
        LayoutSize {
            baseline: self.baseline,
            owner_ciphertexts: self.owner_ciphertexts(),
            release_ciphertexts: self.release_ciphertexts(),
        }
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

    /// The radix of the Yao products of the proxy's mask term ([`crate::radix`]):
    /// one product reads a full segment's B_seg and v_seg's b_i.
    pub fn mask_radix(&self) -> usize {
        let longest = self.budget.slots.min(self.triangle.dim);
        radix::radix_for(self.mask_exponent_bits(longest) + self.mask_bits)
    }

    /// Bits B_seg = sum_t b_(j+t) 2^(t w) can have, for a segment of `len`
    /// entries: the last mask's top bit, and one more for the carry of the masks
    /// below it, which overlap where a mask is wider than a slot (at M = 1000,
    /// 74 bits in slots of 69).
    pub fn mask_exponent_bits(&self, len: usize) -> u64 {
        let len = len.max(1) as u64;
        (len - 1) * self.budget.slot_width + self.mask_bits + u64::from(len > 1)
    }

    /// What the mask term takes off the chain of squarings of E\[v_k\]: the shifts
    /// E[v_k 2^(t w)] that segments starting at columns j = k - t read (t <= k), and
    /// the radix powers that read B_seg of every segment of row k.
    pub fn mask_chain(&self, k: usize) -> MaskChain {
        let slots = self.budget.slots.max(1);
        let longest = slots.min(self.triangle.dim.saturating_sub(k)).max(1);
        let radix = self.mask_radix();
        MaskChain {
            shifts: slots.min(k + 1),
            width: self.budget.slot_width,
            digits: radix::digits_of(self.mask_exponent_bits(longest), radix),
            radix,
        }
    }

    /// Ciphertexts the proxy releases: the packed matrix blocks, then the packed
    /// vector block.
    pub fn release_ciphertexts(&self) -> usize {
        self.matrix_ciphertexts() + self.vector.len()
    }
}

/// How many ciphertexts a study's layout holds: what the caps of the proxy and
/// of an owner read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutSize {
    /// The paper's way, one value per ciphertext.
    pub baseline: bool,
    /// Ciphertexts one owner sends ([`StudyLayout::owner_ciphertexts`]).
    pub owner_ciphertexts: usize,
    /// Ciphertexts the proxy releases ([`StudyLayout::release_ciphertexts`]).
    pub release_ciphertexts: usize,
}

/// A layout before its triangle is cut into segments: its slot widths proven
/// from the spec's bounds and its sizes known, at a cost linear in M.
pub struct LayoutPlan {
    budget: SlotBudget,
    vector_budget: SlotBudget,
    shape: BlockShape,
    vector_packed: bool,
    mask_bits: u64,
    baseline: bool,
}

impl LayoutPlan {
    /// Proves the slot widths from the study's public bounds (N_max, Cq, kappa and
    /// the noise tail at N_max: of the sum of up to `quorum` shares, where the
    /// owners add the noise, as the proxy seals at its quorum).
    ///
    /// A slot needs to hold only the value that is decoded from it. In `mask`
    /// centering that is N S~ + E', not T: the user subtracts v' v'^T from the
    /// packed plaintext mod n before unpacking (packing is linear), so the mask's
    /// b b^T (about 2 (log2(N Cq) + kappa) bits) never has to fit a slot.
    fn of(spec: &SpecDraft) -> Result<Self, SpecError> {
        let cq_int = spec.fixed.norm_bound_int();
        let cq = BigUint::from(cq_int);
        let n = BigUint::from(spec.max_rows);
        let plan = spec.release_plan(Some(spec.max_rows), false, spec.quorum as usize);
        // Every vector entry (a sum of rows, or Cq times a count) is at most N Cq.
        let v_max = &n * &cq;
        // 2^vbits >= 2 max|v|, so v + b hides v up to statistical distance 2^-kappa.
        let mask_bits = (&v_max << 1usize).bits() + spec.kappa as u64;
        let (t_bound, v_bound) = match spec.privacy.centering {
            Centering::Mask => {
                // |N S~_ij| <= sqrt(N S~_ii N S~_jj) <= N R~_ii <= N^2 Cq^2.
                let t = &n * &n * &cq * &cq + plan.matrix.tail_bound();
                (t, &v_max + (BigUint::one() << mask_bits as usize))
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
        let key_bits = spec.public_key.bits();
        let mut budget = SlotBudget::for_bound(&t_bound, key_bits)?;
        let mut vector_budget = SlotBudget::for_bound(&v_bound, key_bits)?;
        if spec.baseline {
            budget.slots = 1;
            vector_budget.slots = 1;
        }
        let shape = BlockShape::new(
            spec.vector_dim(),
            spec.class_count(),
            spec.per_class_matrix(),
            cq_int,
        )
        .projected(spec.matrix_dim());
        Ok(Self {
            budget,
            vector_budget,
            shape,
            vector_packed: spec.privacy.centering == Centering::DpMean,
            mask_bits,
            baseline: spec.baseline,
        })
    }

    /// The sizes [`LayoutPlan::cut`] gives, counted.
    pub fn size(&self) -> LayoutSize {
        let matrix = TriangleLayout::count(self.shape.matrix_dim, self.budget.slots)
            .saturating_mul(self.shape.matrix_blocks);
        let vector_len = self.shape.vector_len();
        let packed = vector_len.div_ceil(self.vector_budget.slots.max(1));
        let sent = if self.vector_packed {
            packed
        } else {
            vector_len
        };
        LayoutSize {
            baseline: self.baseline,
            owner_ciphertexts: matrix.saturating_add(sent).saturating_add(1),
            release_ciphertexts: matrix.saturating_add(packed),
        }
    }

    /// The layout, its triangle and vector cut into segments.
    pub fn cut(self) -> StudyLayout {
        let vector_len = self.shape.vector_len();
        StudyLayout {
            triangle: TriangleLayout::new(self.shape.matrix_dim, self.budget.slots),
            vector: vector_segments(vector_len, self.vector_budget.slots),
            budget: self.budget,
            vector_budget: self.vector_budget,
            vector_dim: self.shape.dim,
            matrix_blocks: self.shape.matrix_blocks,
            classes: self.shape.classes,
            vector_len,
            vector_packed: self.vector_packed,
            count_scale: self.shape.count_scale,
            mask_bits: self.mask_bits,
            baseline: self.baseline,
        }
    }
}

/// The powers the `mask` release takes off one chain of squarings of a column's
/// E\[v_k\] ([`StudyLayout::mask_chain`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaskChain {
    /// Shifts E[v_k 2^(t w)], t below this.
    pub shifts: usize,
    /// The slot width w, in bits.
    pub width: u64,
    /// Radix powers E\[v_k\]^(2^(r u)), u below this.
    pub digits: usize,
    /// The radix r, in bits.
    pub radix: usize,
}

impl MaskChain {
    /// Squarings the chain takes to reach its last power.
    pub fn squarings(&self) -> u64 {
        let last = |count: usize, step: u64| count.saturating_sub(1) as u64 * step;
        last(self.shifts, self.width).max(last(self.digits, self.radix as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dp::{Mechanism, PrivacyRequest};
    use crate::study::{ClassCovariance, ClassSpec, Projection};
    use crate::testing::{test_draft, test_key};

    /// The sizes counted before a layout is built are the built layout's, for
    /// every shape a spec can ask for: both centerings, both noise mechanisms'
    /// tails, the paper's baseline, classes with a shared or per-class matrix,
    /// and a projection.
    #[test]
    fn a_layouts_size_is_counted_before_it_is_built() {
        let a = 1.0 / 2f64.sqrt();
        let two_axes = Projection {
            axes: vec![vec![a, a, 0.0, 0.0, 0.0], vec![0.0, 0.0, 0.6, 0.8, 0.0]],
        };
        let classes = |covariance| ClassSpec {
            labels: vec!["a".into(), "b".into(), "c".into()],
            covariance,
        };
        let mut checked = 0;
        let shapes = [5usize, 9, 70].into_iter().flat_map(|dim| {
            [Centering::Mask, Centering::DpMean]
                .into_iter()
                .flat_map(move |c| [Mechanism::GAUSSIAN, Mechanism::LAPLACE].map(|m| (dim, c, m)))
        });
        for (dim, centering, mechanism) in shapes {
            for baseline in [false, true] {
                let base = SpecDraft {
                    privacy: PrivacyRequest::new(mechanism, centering, 1.0, 1e-6).expect("valid"),
                    baseline,
                    ..test_draft(test_key().public(), dim)
                };
                let mut drafts = vec![base.clone()];
                if centering == Centering::DpMean {
                    for covariance in [ClassCovariance::Shared, ClassCovariance::PerClass] {
                        drafts.push(SpecDraft {
                            classes: Some(classes(covariance)),
                            ..base.clone()
                        });
                    }
                }
                if dim == 5 && centering == Centering::DpMean {
                    drafts.push(SpecDraft {
                        projection: Some(two_axes.clone()),
                        ..base.clone()
                    });
                }
                for draft in drafts {
                    let spec = draft.validate().expect("a valid spec");
                    let built = StudyLayout::new(&spec).expect("layout");
                    let planned = StudyLayout::plan(&spec).expect("plan").size();
                    assert_eq!(planned, built.size());
                    checked += 1;
                }
            }
        }
        // 24 plain shapes, 24 with classes, 4 projected.
        assert_eq!(checked, 52);
    }

    /// The layout is part of the protocol: builds that derive different layouts
    /// from one spec misread each other's ciphertexts. A change here is a change of
    /// [`LAYOUT_VERSION`] (bump it, and the widths below, together).
    #[test]
    fn layouts_are_frozen_for_this_version() {
        let layout = |centering| {
            let draft = SpecDraft {
                privacy: PrivacyRequest::new(Mechanism::GAUSSIAN, centering, 1.0, 1e-6)
                    .expect("valid"),
                ..test_draft(test_key().public(), 70)
            };
            StudyLayout::new(&draft.validate().expect("valid")).expect("layout")
        };
        let frozen = |l: &StudyLayout| {
            (
                l.budget.slot_width,
                l.budget.slots,
                l.vector_budget.slot_width,
                l.vector_budget.slots,
                l.mask_bits,
                l.owner_ciphertexts(),
                l.release_ciphertexts(),
            )
        };
        assert_eq!(LAYOUT_VERSION, 4);
        // N_max = 1000 rows, Cq = 2^16, kappa = 40: v_max = 65,536,000 (26 bits),
        // so b has 27 + 40 = 67 bits and v' = v + b needs 68 bits, plus sign and
        // margin: 70-bit vector slots, 29 to a 2046-bit plaintext.
        assert_eq!(
            frozen(&layout(Centering::Mask)),
            (59, 34, 70, 29, 67, 179, 111)
        );
        // dp-mean: R~ + E_R in the matrix slots, v + e_v (no mask) in the vector's,
        // the noise the sum of a quorum of 3 owners' shares (one bit more than one
        // draw of the whole noise).
        assert_eq!(
            frozen(&layout(Centering::DpMean)),
            (48, 42, 34, 60, 67, 101, 100)
        );
    }
}
