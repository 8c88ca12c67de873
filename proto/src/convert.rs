//! Validating conversions between wire types and the domain types of `dpca-common`.

use dpca_common::dp::{Centering, Mechanism, PrivacyRequest};
use dpca_common::encoding::FixedPoint;
use dpca_common::paillier::PublicKey;
use dpca_common::study::{
    ClassCovariance, ClassSpec, Marginals, NormBins, Projection, SpecDraft, SpecError, StudySpec,
    LAYOUT_VERSION,
};

use crate::v1;

/// Converts and fully validates a wire study spec.
pub fn spec_from_wire(w: &v1::StudySpec) -> Result<StudySpec, SpecError> {
    draft_from_wire(w)?.validate()
}

/// As [`spec_from_wire`], for a spec the proxy stored itself
/// ([`SpecDraft::validate_stored`]).
pub fn stored_spec_from_wire(w: &v1::StudySpec) -> Result<StudySpec, SpecError> {
    draft_from_wire(w)?.validate_stored()
}

/// The wire spec as a draft, its layout version and enumerations read.
fn draft_from_wire(w: &v1::StudySpec) -> Result<SpecDraft, SpecError> {
    let version = w.layout.max(1);
    if version != LAYOUT_VERSION {
        return Err(SpecError::Parameter {
            name: "layout",
            reason: format!(
                "the study's ciphertexts are packed with layout version {version} and this build packs with version {LAYOUT_VERSION}: every party of a study needs a build of the same layout"
            ),
        });
    }
    let mechanism = Mechanism::parse(&w.mechanism)?;
    let centering = Centering::parse(&w.centering)?;
    let privacy = PrivacyRequest::new(mechanism, centering, w.epsilon, w.delta)?;
    let classes = if w.classes.is_empty() && w.class_covariance.is_empty() {
        None
    } else {
        Some(ClassSpec {
            labels: w.classes.clone(),
            covariance: ClassCovariance::parse(&w.class_covariance)?,
        })
    };
    let projection = projection_from_wire(w)?;
    let norm_bins = if w.norm_edges.is_empty() && w.norm_features.is_empty() {
        None
    } else {
        Some(NormBins {
            features: w.norm_features.clone(),
            bounds: w.norm_bounds.iter().map(|b| (b.lo, b.hi)).collect(),
            edges: w.norm_edges.clone(),
        })
    };
    let spec = SpecDraft {
        features: w.features.clone(),
        bounds: w.bounds.iter().map(|b| (b.lo, b.hi)).collect(),
        fixed: FixedPoint {
            frac_bits: w.frac_bits,
            row_norm_bound: w.row_norm_bound,
        },
        max_rows: w.max_rows,
        privacy,
        min_owners: w.min_owners,
        quorum: w.quorum,
        deadline_unix_ms: w.deadline_unix_ms,
        kappa: w.kappa,
        public_key: PublicKey::from_bytes(&w.public_key)?,
        baseline: w.baseline,
        classes,
        projection,
        norm_bins,
        marginals: w.marginals.as_ref().map(|m| Marginals {
            per_octave: m.per_octave,
        }),
        expected_owners: w.expected_owners.clone(),
        colluding_owners: w.colluding_owners,
        mask_holder: (!w.mask_holder.is_empty()).then(|| w.mask_holder.clone()),
    };
    Ok(spec)
}

/// The projection's axes, `projection_rank` rows of one value per feature, if
/// the spec has any.
fn projection_from_wire(w: &v1::StudySpec) -> Result<Option<Projection>, SpecError> {
    match (w.projection_rank as usize, w.features.len()) {
        (0, _) if w.projection.is_empty() => Ok(None),
        (k, m) if k > 0 && m > 0 && w.projection.len() == k * m => Ok(Some(Projection {
            axes: w.projection.chunks(m).map(<[f64]>::to_vec).collect(),
        })),
        (k, m) => Err(SpecError::Parameter {
            name: "projection",
            reason: format!(
                "{} values do not make {k} axes of {m} features",
                w.projection.len()
            ),
        }),
    }
}

/// Converts a spec to its wire form (a draft too: tests send specs a proxy must
/// refuse).
pub fn spec_to_wire(s: &SpecDraft) -> v1::StudySpec {
    let (norm_features, norm_bounds, norm_edges) = match &s.norm_bins {
        Some(b) => (
            b.features.clone(),
            b.bounds
                .iter()
                .map(|&(lo, hi)| v1::Bounds { lo, hi })
                .collect(),
            b.edges.clone(),
        ),
        None => Default::default(),
    };
    v1::StudySpec {
        features: s.features.clone(),
        bounds: s
            .bounds
            .iter()
            .map(|&(lo, hi)| v1::Bounds { lo, hi })
            .collect(),
        row_norm_bound: s.fixed.row_norm_bound,
        frac_bits: s.fixed.frac_bits,
        max_rows: s.max_rows,
        mechanism: s.privacy.mechanism.name().to_string(),
        centering: s.privacy.centering.name().to_string(),
        epsilon: s.privacy.epsilon,
        delta: s.privacy.delta,
        min_owners: s.min_owners,
        quorum: s.quorum,
        deadline_unix_ms: s.deadline_unix_ms,
        kappa: s.kappa,
        public_key: s.public_key.to_bytes(),
        baseline: s.baseline,
        classes: s
            .classes
            .as_ref()
            .map(|c| c.labels.clone())
            .unwrap_or_default(),
        class_covariance: s
            .classes
            .as_ref()
            .map(|c| c.covariance.name().to_string())
            .unwrap_or_default(),
        projection: s
            .projection
            .as_ref()
            .map(|p| p.axes.concat())
            .unwrap_or_default(),
        projection_rank: s.projection.as_ref().map_or(0, |p| p.rank() as u32),
        norm_features,
        norm_bounds,
        norm_edges,
        expected_owners: s.expected_owners.clone(),
        layout: LAYOUT_VERSION,
        colluding_owners: s.colluding_owners,
        mask_holder: s.mask_holder.clone().unwrap_or_default(),
        marginals: s.marginals.as_ref().map(|m| v1::Marginals {
            per_octave: m.per_octave,
        }),
    }
}

/// Ciphertexts per streamed chunk: about 50 KB at 3072-bit keys, far below the
/// message size limit.
pub const CIPHERTEXTS_PER_CHUNK: usize = 64;

/// Largest gRPC message either side accepts (bytes).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use dpca_common::testing::{test_draft, test_key};

    /// A spec from a build of another ciphertext layout is refused by name, before
    /// any of its ciphertexts could be read at the wrong offsets; one of this
    /// build's layout reads back as itself.
    #[test]
    fn specs_of_another_layout_are_refused() {
        let draft = test_draft(test_key().public(), 4);
        let wire = spec_to_wire(&draft);
        assert_eq!(wire.layout, LAYOUT_VERSION);
        let back = spec_from_wire(&wire).expect("this build's layout");
        assert_eq!(spec_to_wire(&back), wire);
        for other in (0..LAYOUT_VERSION).chain([LAYOUT_VERSION + 1]) {
            let old = v1::StudySpec {
                layout: other,
                ..wire.clone()
            };
            let err = spec_from_wire(&old)
                .expect_err("another layout")
                .to_string();
            assert!(err.contains("layout version"), "{other}: {err}");
        }
    }
}
