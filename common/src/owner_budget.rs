//! Each owner's privacy budget over all the studies its data set enters (pure).
//!
//! An owner declares a cap (epsilon, delta) for its data set with each
//! contribution. Its rows enter every study it contributes to, so the guarantees
//! of those studies compose: by basic sequential composition the epsilons add and
//! the deltas add. That bound holds whatever each study's mechanism, including the
//! Gaussian studies calibrated in zCDP, whose (epsilon, delta) guarantee is what is
//! charged (tighter zCDP composition across studies would need every study to be
//! zCDP, which Laplace studies are not). A study that would take the spent budget
//! past the cap is refused before any of the owner's data is read or counted.
//!
//! A declaration may lower the cap, never raise it: the cap is the smallest ever
//! declared, so a compromised or careless later run cannot undo an owner's limit.

/// Relative slack in comparisons, so a cap met exactly by a sum of floats is met.
const SLACK: f64 = 1e-9;

/// One owner's budget.
#[derive(Clone, Debug, PartialEq)]
pub struct OwnerBudget {
    /// Cap on the total epsilon.
    pub cap_epsilon: f64,
    /// Cap on the total delta.
    pub cap_delta: f64,
    /// Epsilon spent so far.
    pub spent_epsilon: f64,
    /// Delta spent so far.
    pub spent_delta: f64,
    /// Studies already charged.
    pub studies: Vec<String>,
}

impl OwnerBudget {
    /// `self` if each figure is one [`charge`] keeps: a cap of epsilon above 0 and
    /// delta in [0, 1), spent amounts of 0 or more, all finite; else the first that
    /// is not. A budget read back from storage is checked so: a NaN spent amount
    /// made every charge pass its cap (no comparison with NaN is true), and the
    /// record cannot be dropped instead, as that would reset what was spent.
    pub fn checked(self) -> Result<Self, String> {
        if !is_cap((self.cap_epsilon, self.cap_delta)) {
            return Err(format!(
                "a budget with the cap ({}, {})",
                self.cap_epsilon, self.cap_delta
            ));
        }
        for (what, value) in [
            ("spent epsilon", self.spent_epsilon),
            ("spent delta", self.spent_delta),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(format!("a budget with {what} {value}"));
            }
        }
        Ok(self)
    }
}

/// Whether `cap` = (epsilon, delta) is a budget: epsilon above 0 and finite,
/// delta in [0, 1).
fn is_cap((epsilon, delta): (f64, f64)) -> bool {
    epsilon > 0.0 && epsilon.is_finite() && (0.0..1.0).contains(&delta)
}

/// Why a charge was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum BudgetError {
    /// The declared cap is not a budget.
    #[error("budget cap (epsilon {epsilon}, delta {delta}) is invalid: epsilon must be > 0 and finite, delta in [0, 1)")]
    InvalidCap {
        /// Declared epsilon.
        epsilon: f64,
        /// Declared delta.
        delta: f64,
    },
    /// The study would exceed the cap.
    #[error(
        "privacy budget exhausted for owner `{owner}`: spent epsilon {spent_epsilon:.4}, \
         delta {spent_delta:.3e} of the cap ({cap_epsilon}, {cap_delta:.3e}); study {study} \
         needs epsilon {epsilon:.4}, delta {delta:.3e}"
    )]
    Exhausted {
        /// The owner.
        owner: String,
        /// The study refused.
        study: String,
        /// The study's epsilon.
        epsilon: f64,
        /// The study's delta.
        delta: f64,
        /// Spent before it.
        spent_epsilon: f64,
        /// Spent before it.
        spent_delta: f64,
        /// The cap in force.
        cap_epsilon: f64,
        /// The cap in force.
        cap_delta: f64,
    },
}

/// The budget after `owner` declares `cap` and takes part in `study`, which costs
/// `cost` = (epsilon, delta); unchanged if the study was charged before.
pub fn charge(
    owner: &str,
    current: Option<&OwnerBudget>,
    cap: (f64, f64),
    study: &str,
    cost: (f64, f64),
) -> Result<OwnerBudget, BudgetError> {
    let (cap_epsilon, cap_delta) = cap;
    if !is_cap(cap) {
        return Err(BudgetError::InvalidCap {
            epsilon: cap_epsilon,
            delta: cap_delta,
        });
    }
    let mut next = match current {
        Some(b) => OwnerBudget {
            cap_epsilon: b.cap_epsilon.min(cap_epsilon),
            cap_delta: b.cap_delta.min(cap_delta),
            ..b.clone()
        },
        None => OwnerBudget {
            cap_epsilon,
            cap_delta,
            spent_epsilon: 0.0,
            spent_delta: 0.0,
            studies: Vec::new(),
        },
    };
    if next.studies.iter().any(|s| s == study) {
        return Ok(next);
    }
    let (epsilon, delta) = cost;
    let over = |spent: f64, add: f64, cap: f64| spent + add > cap * (1.0 + SLACK);
    if over(next.spent_epsilon, epsilon, next.cap_epsilon)
        || over(next.spent_delta, delta, next.cap_delta)
    {
        return Err(BudgetError::Exhausted {
            owner: owner.to_string(),
            study: study.to_string(),
            epsilon,
            delta,
            spent_epsilon: next.spent_epsilon,
            spent_delta: next.spent_delta,
            cap_epsilon: next.cap_epsilon,
            cap_delta: next.cap_delta,
        });
    }
    next.spent_epsilon += epsilon;
    next.spent_delta += delta;
    next.studies.push(study.to_string());
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_cap_is_spent_once_per_study_and_never_raised() {
        let b = charge("h", None, (1.5, 1e-5), "s1", (1.0, 1e-6)).expect("first");
        assert_eq!((b.spent_epsilon, b.studies.len()), (1.0, 1));
        // A retry of the same study is not charged again.
        let again = charge("h", Some(&b), (1.5, 1e-5), "s1", (1.0, 1e-6)).expect("retry");
        assert_eq!(again, b);
        let err = charge("h", Some(&b), (1.5, 1e-5), "s2", (1.0, 1e-6)).expect_err("over");
        assert!(err.to_string().contains("exhausted for owner `h`"), "{err}");
        // Declaring a larger cap does not raise it.
        assert!(charge("h", Some(&b), (10.0, 1e-5), "s2", (1.0, 1e-6)).is_err());
        // Exactly the cap is allowed, up to float rounding.
        let b = charge("h", None, (0.3, 1e-5), "a", (0.1, 0.0)).expect("a");
        let b = charge("h", Some(&b), (0.3, 1e-5), "b", (0.2, 0.0)).expect("0.1 + 0.2");
        assert!(charge("h", Some(&b), (0.3, 1e-5), "c", (1e-6, 0.0)).is_err());
        for bad in [
            (0.0, 1e-5),
            (-1.0, 0.0),
            (f64::INFINITY, 0.0),
            (1.0, 1.0),
            (1.0, -0.1),
        ] {
            assert!(matches!(
                charge("h", None, bad, "s", (0.1, 0.0)),
                Err(BudgetError::InvalidCap { .. })
            ));
        }
    }

    proptest! {
        /// Whatever the order of studies, retries and declarations: every study
        /// newly charged fits within the cap in force when it is charged (the
        /// smallest declared so far), a retry charges nothing, and the spent total
        /// is the sum over the distinct studies charged.
        #[test]
        fn every_charge_fits_the_smallest_cap(
            steps in proptest::collection::vec(
                (0.05f64..2.0, 0.0f64..1e-4, 0usize..6, 0.01f64..1.0, 0.0f64..3e-5),
                1..40,
            )
        ) {
            let mut budget: Option<OwnerBudget> = None;
            let mut smallest = (f64::INFINITY, f64::INFINITY);
            let mut charged: Vec<(String, (f64, f64))> = Vec::new();
            for (cap_e, cap_d, study, e, d) in steps {
                let name = format!("s{study}");
                // A study's cost is fixed by its spec: the first one seen for a name.
                let known = charged.iter().find(|(n, _)| *n == name).map(|(_, c)| *c);
                let cost = known.unwrap_or((e, d));
                let before = budget.clone();
                // A refused contribution changes nothing, its declaration included.
                if let Ok(next) = charge("o", budget.as_ref(), (cap_e, cap_d), &name, cost) {
                    smallest = (smallest.0.min(cap_e), smallest.1.min(cap_d));
                    prop_assert!(next.cap_epsilon <= smallest.0 && next.cap_delta <= smallest.1);
                    if known.is_some() {
                        let spent = before.as_ref().map(|b| b.spent_epsilon);
                        prop_assert_eq!(Some(next.spent_epsilon), spent);
                    } else {
                        prop_assert!(next.spent_epsilon <= next.cap_epsilon * (1.0 + SLACK));
                        prop_assert!(next.spent_delta <= next.cap_delta * (1.0 + SLACK));
                        charged.push((name, cost));
                    }
                    let sum: f64 = charged.iter().map(|(_, c)| c.0).sum();
                    prop_assert!((next.spent_epsilon - sum).abs() < 1e-9);
                    prop_assert_eq!(next.studies.len(), charged.len());
                    budget = Some(next);
                }
            }
        }
    }
}
