//! Fixtures for tests and benches (feature `test-support`): one seeded Paillier
//! key and one valid study spec, so that tests do not each write their own and
//! a new field of the spec is set in one place. Never for a real study: whoever
//! knows the seed knows the key.

use std::sync::OnceLock;

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

use crate::dp::{Centering, Mechanism, PrivacyRequest};
use crate::encoding::FixedPoint;
use crate::paillier::{PublicKey, SecretKey};
use crate::study::{SpecDraft, StudySpec, MIN_KAPPA};

/// A 2048-bit key drawn from a fixed seed, generated once per process.
pub fn test_key() -> &'static SecretKey {
    static KEY: OnceLock<SecretKey> = OnceLock::new();
    KEY.get_or_init(|| {
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        match SecretKey::generate(2048, &mut rng) {
            Ok(key) => key,
            Err(e) => panic!("the seeded test key: {e}"),
        }
    })
}

/// [`test_draft`], validated.
pub fn test_spec(pk: &PublicKey, dim: usize) -> StudySpec {
    match test_draft(pk, dim).validate() {
        Ok(spec) => spec,
        Err(e) => panic!("the test spec: {e}"),
    }
}

/// A valid spec for `pk`, as a draft: `dim` features `f0, f1, ...` bounded in
/// [-1, 1], C = 1 on 16 fractional bits, N at most 1000, the default `gaussian`
/// and `dp-mean` at (1, 1e-6), sealed by 3 owners (1 at the deadline, which is
/// unset). Tests change what they are about with struct update syntax and
/// validate it.
pub fn test_draft(pk: &PublicKey, dim: usize) -> SpecDraft {
    let privacy = match PrivacyRequest::new(Mechanism::GAUSSIAN, Centering::DpMean, 1.0, 1e-6) {
        Ok(p) => p,
        Err(e) => panic!("the test request: {e}"),
    };
    SpecDraft {
        features: (0..dim).map(|i| format!("f{i}")).collect(),
        bounds: vec![(-1.0, 1.0); dim],
        fixed: FixedPoint {
            frac_bits: 16,
            row_norm_bound: 1.0,
        },
        max_rows: 1000,
        privacy,
        min_owners: 1,
        quorum: 3,
        deadline_unix_ms: 0,
        kappa: MIN_KAPPA,
        public_key: pk.clone(),
        baseline: false,
        classes: None,
        projection: None,
        norm_bins: None,
        marginals: None,
        expected_owners: Vec::new(),
        colluding_owners: 0,
        mask_holder: None,
    }
}
