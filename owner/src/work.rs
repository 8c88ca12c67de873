//! How much encryption an owner does for one study, whatever the proxy's spec
//! asks. The layout, and so the owner's work, follows from fields the proxy
//! serves: a hostile proxy could ask the paper's baseline layout (one value per
//! ciphertext, each encrypted with a full r^n: 501,501 of them at M = 1000, one
//! to three hours of one core at 2048 bits), or shrink the packing with extreme
//! but valid parameters (tens of times the honest ciphertexts, and their
//! upload). The owner refuses such a study before it parses its table, and
//! before it builds the study's layout: the size is counted from the spec
//! ([`StudyLayout::plan`]), since the layout of a spec with hundreds of
//! thousands of features is itself gigabytes of segments.

use anyhow::Context;
use dpca_common::study::{LayoutSize, StudyLayout, StudySpec, DEFAULT_MAX_CIPHERTEXTS};

/// The most encryption work an owner takes on for one study.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCap {
    /// Ciphertexts in its contribution (`--max-ciphertexts`; by default the
    /// proxy's default cap on a contribution, [`DEFAULT_MAX_CIPHERTEXTS`]).
    pub max_ciphertexts: usize,
    /// Whether it encrypts the paper's way when a study asks (`--allow-baseline`):
    /// a speed comparison, never needed for a result.
    pub allow_baseline: bool,
}

impl Default for WorkCap {
    fn default() -> Self {
        Self {
            max_ciphertexts: DEFAULT_MAX_CIPHERTEXTS,
            allow_baseline: false,
        }
    }
}

/// A study that asks more work of the owner than its cap allows.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WorkRefused {
    /// The baseline layout, not allowed.
    #[error(
        "study `{study}` asks for the paper's baseline encryption (one value per \
         ciphertext, each with a full r^n: hours of CPU at large M); refusing to encrypt \
         for it unless you pass --allow-baseline"
    )]
    Baseline {
        /// The study.
        study: String,
    },
    /// More ciphertexts than the cap.
    #[error(
        "study `{study}` asks for {count} ciphertexts from this owner; refusing to encrypt \
         more than {max} (--max-ciphertexts)"
    )]
    Ciphertexts {
        /// The study.
        study: String,
        /// Ciphertexts its layout asks of the owner.
        count: usize,
        /// The cap.
        max: usize,
    },
}

impl WorkCap {
    /// The layout of `spec`, built once its size is within the cap.
    pub fn layout(&self, study: &str, spec: &StudySpec) -> anyhow::Result<StudyLayout> {
        let plan =
            StudyLayout::plan(spec).with_context(|| format!("study `{study}` has no layout"))?;
        self.check(study, plan.size())?;
        Ok(plan.cut())
    }

    /// Refuses a study whose layout asks more than the cap.
    pub fn check(&self, study: &str, layout: LayoutSize) -> Result<(), WorkRefused> {
        if layout.baseline && !self.allow_baseline {
            return Err(WorkRefused::Baseline {
                study: study.to_string(),
            });
        }
        let count = layout.owner_ciphertexts;
        if count > self.max_ciphertexts {
            return Err(WorkRefused::Ciphertexts {
                study: study.to_string(),
                count,
                max: self.max_ciphertexts,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpca_common::testing::{test_draft, test_key};
    use dpca_proto::convert::{spec_from_wire, spec_to_wire};

    /// A spec of 200,000 features, as a hostile proxy may serve one: about 1 MB
    /// on the wire, within what an owner decodes. Its layout would be 2 x 10^10
    /// segments (baseline) or some 10^9 (packed), hundreds of gigabytes, which
    /// the owner built while validating the spec, before its cap was read.
    fn huge_wire_spec(baseline: bool) -> dpca_proto::v1::StudySpec {
        let draft = dpca_common::study::SpecDraft {
            baseline,
            ..test_draft(test_key().public(), 3)
        };
        let mut wire = spec_to_wire(&draft);
        let bound = wire.bounds[0];
        let m = 200_000;
        wire.features = (0..m).map(|i| format!("f{i}")).collect();
        wire.bounds = vec![bound; m];
        wire
    }

    #[test]
    fn a_spec_whose_layout_is_past_the_cap_is_refused_before_it_is_built() {
        for baseline in [true, false] {
            let spec = spec_from_wire(&huge_wire_spec(baseline)).expect("a valid spec");
            let refused = |cap: WorkCap| {
                cap.layout("s1", &spec)
                    .expect_err("a layout past the cap was built")
                    .downcast::<WorkRefused>()
                    .expect("refused by the cap")
            };
            let allowing = WorkCap {
                allow_baseline: true,
                ..WorkCap::default()
            };
            match refused(allowing) {
                WorkRefused::Ciphertexts { count, max, .. } => {
                    assert_eq!(max, DEFAULT_MAX_CIPHERTEXTS);
                    assert!(
                        count > 1_000_000_000 / if baseline { 1 } else { 100 },
                        "{count}"
                    );
                }
                other => panic!("refused for another reason: {other}"),
            }
            if baseline {
                assert!(matches!(
                    refused(WorkCap::default()),
                    WorkRefused::Baseline { .. }
                ));
            }
        }
        // Within the cap, the layout is the one the spec derives.
        let spec = test_draft(test_key().public(), 5)
            .validate()
            .expect("valid");
        let layout = WorkCap::default()
            .layout("s1", &spec)
            .expect("within the cap");
        assert_eq!(layout, StudyLayout::new(&spec).expect("layout"));
    }
}
