//! The proxy against a model, in process and on a clock moved by hand: random
//! sequences of contributions, retries, second contributions, uninvited owners,
//! restarts, deadlines passing, releases and fetches, each checked against what the
//! proxy must have done ([`dpca_tests::sim`]). Each operation takes milliseconds
//! and nothing waits on a real deadline.

use dpca_common::dp::Centering;
use dpca_tests::sim::{Op, Sim, DEADLINE, INVITED, OWNERS};
use proptest::prelude::*;

/// Rows of three values in [-1, 1] (some outside the unit ball, so clipped).
fn table() -> impl Strategy<Value = Vec<Vec<f64>>> {
    prop::collection::vec(prop::collection::vec(-1.0..1.0f64, 3), 1..4)
}

fn tables() -> impl Strategy<Value = Vec<[Vec<Vec<f64>>; 2]>> {
    prop::collection::vec((table(), table()).prop_map(|(a, b)| [a, b]), OWNERS.len())
}

fn op() -> impl Strategy<Value = Op> {
    let deadline = DEADLINE.as_secs();
    prop_oneof![
        8 => (0..OWNERS.len(), 0..2usize).prop_map(|(owner, variant)| Op::Contribute { owner, variant }),
        2 => (0..deadline / 2).prop_map(|seconds| Op::Advance { seconds }),
        2 => Just(Op::Restart),
        3 => Just(Op::Reveal),
        1 => Just(Op::Fetch),
    ]
}

fn centering() -> impl Strategy<Value = Centering> {
    prop_oneof![Just(Centering::DpMean), Just(Centering::Mask)]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// After every operation the proxy agrees with the model: phase, owners counted
    /// once each, budgets spent, the release stable across restarts and equal to the
    /// central mechanism with the same secrets.
    #[test]
    fn the_proxy_follows_the_model_under_any_sequence(
        centering in centering(),
        tables in tables(),
        ops in prop::collection::vec(op(), 4..24),
    ) {
        let mut sim = Sim::new(centering, tables);
        for op in ops {
            sim.apply(op);
        }
    }
}

fn contribute(owner: usize) -> Op {
    Op::Contribute { owner, variant: 0 }
}

fn sample_tables() -> Vec<[Vec<Vec<f64>>; 2]> {
    (0..OWNERS.len())
        .map(|i| {
            let x = i as f64 / 10.0;
            [
                vec![vec![x, -0.5, 0.25], vec![0.1, x, -x], vec![0.9, 0.9, 0.9]],
                vec![vec![-x, 0.5, 0.0]],
            ]
        })
        .collect()
}

/// Sealed by its quorum, the study's release survives restarts before and after
/// it is computed, equals the central mechanism, and is served the same each
/// time; a retry is answered "already counted" and a second table is refused.
#[test]
fn a_release_survives_restarts_and_equals_the_central_mechanism() {
    for centering in [Centering::DpMean, Centering::Mask] {
        let mut sim = Sim::new(centering, sample_tables());
        for op in [
            contribute(0),
            Op::Restart,
            contribute(0),
            contribute(1),
            contribute(INVITED),
            contribute(2),
            Op::Restart,
            Op::Reveal,
            Op::Restart,
            Op::Fetch,
            Op::Contribute {
                owner: 0,
                variant: 1,
            },
            contribute(1),
            Op::Reveal,
        ] {
            sim.apply(op);
        }
        assert_eq!(sim.model.counted.len(), INVITED);
    }
}

/// At its deadline a study with at least its minimum of owners seals with those
/// that came and names the rest; with fewer it aborts, refuses latecomers with the
/// reason and releases nothing. An owner not invited is refused and not counted.
/// No real time passes.
#[test]
fn a_deadline_seals_or_aborts_the_study_at_once() {
    let mut sealed = Sim::new(Centering::DpMean, sample_tables());
    let past = Op::Advance {
        seconds: DEADLINE.as_secs(),
    };
    for op in [
        contribute(INVITED),
        contribute(0),
        contribute(2),
        past,
        contribute(1),
        Op::Reveal,
    ] {
        sealed.apply(op);
    }
    let mut aborted = Sim::new(Centering::DpMean, sample_tables());
    for op in [
        contribute(0),
        Op::Restart,
        past,
        contribute(1),
        Op::Reveal,
        Op::Fetch,
    ] {
        aborted.apply(op);
    }
}
