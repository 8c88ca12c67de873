//! Conversions between zCDP and (epsilon, delta)-DP (Canonne, Kamath and Steinke,
//! "The Discrete Gaussian for Differential Privacy", Corollary 13), and the
//! classic Analyze-Gauss factor.
//!
//! Each search below is a deterministic map on its bracket, iterated at most 200
//! times; once an iteration leaves the bracket as it was, every later one would too,
//! so the searches stop there with the same bits the 200 iterations give. That is
//! about 60 iterations of bisection and 80 of golden section instead of 200 each:
//! a conversion runs the golden section once per bisection step, and every party
//! converts its budget several times per study.

/// Iterates `step` on `state` at most `max` times, stopping at a fixed point: the
/// result is exactly that of `max` iterations, since a fixed point stays one.
fn iterate<S: Copy + PartialEq>(mut state: S, max: usize, step: impl Fn(S) -> S) -> S {
    for _ in 0..max {
        let next = step(state);
        if next == state {
            break;
        }
        state = next;
    }
    state
}

/// The smallest epsilon at which a rho-zCDP mechanism is (epsilon, delta)-DP.
pub fn epsilon_for(rho: f64, delta: f64) -> f64 {
    let start = (
        0.0f64,
        2.0 * rho + 4.0 * (rho * (1.0 / delta).ln()).sqrt() + 1.0,
    );
    let (_, hi) = iterate(start, 200, |(lo, hi)| {
        let mid = 0.5 * (lo + hi);
        if zcdp_delta(rho, mid) <= delta {
            (lo, mid)
        } else {
            (mid, hi)
        }
    });
    hi
}

/// sqrt(2 ln(1.25 / delta)) / epsilon: the Analyze-Gauss factor (epsilon < 1).
pub fn classic_factor(epsilon: f64, delta: f64) -> f64 {
    (2.0 * (1.25 / delta).ln()).sqrt() / epsilon
}

/// delta of a rho-zCDP mechanism at epsilon (CKS20 Corollary 13):
/// inf over alpha > 1 of exp((alpha - 1)(alpha rho - eps)) / alpha * (1 - 1/alpha)^(alpha - 1).
pub fn zcdp_delta(rho: f64, epsilon: f64) -> f64 {
    let log_delta = |alpha: f64| {
        (alpha - 1.0) * (alpha * rho - epsilon) - alpha.ln()
            + (alpha - 1.0) * (1.0 - 1.0 / alpha).ln()
    };
    // The objective is unimodal in alpha; golden-section search on log(alpha - 1).
    let phi = 0.5 * (5f64.sqrt() - 1.0);
    let f = |t: f64| log_delta(1.0 + t.exp());
    let start = ((1e-9f64).ln(), (1e6f64).ln());
    let (lo, hi) = iterate(start, 200, |(lo, hi)| {
        let a = hi - phi * (hi - lo);
        let b = lo + phi * (hi - lo);
        if f(a) < f(b) {
            (lo, b)
        } else {
            (a, hi)
        }
    });
    f(0.5 * (lo + hi)).exp().min(1.0)
}

/// The largest rho whose zCDP guarantee implies (epsilon, delta)-DP.
pub fn rho_for(epsilon: f64, delta: f64) -> f64 {
    let start = (0.0f64, epsilon.max(1.0) * 4.0);
    let (lo, _) = iterate(start, 200, |(lo, hi)| {
        let mid = 0.5 * (lo + hi);
        if zcdp_delta(mid, epsilon) <= delta {
            (mid, hi)
        } else {
            (lo, mid)
        }
    });
    lo
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The searches as they ran before they stopped at a fixed point: 200 full
    /// iterations each.
    mod full {
        pub fn zcdp_delta(rho: f64, epsilon: f64) -> f64 {
            let log_delta = |alpha: f64| {
                (alpha - 1.0) * (alpha * rho - epsilon) - alpha.ln()
                    + (alpha - 1.0) * (1.0 - 1.0 / alpha).ln()
            };
            let (mut lo, mut hi) = ((1e-9f64).ln(), (1e6f64).ln());
            let phi = 0.5 * (5f64.sqrt() - 1.0);
            let f = |t: f64| log_delta(1.0 + t.exp());
            for _ in 0..200 {
                let a = hi - phi * (hi - lo);
                let b = lo + phi * (hi - lo);
                if f(a) < f(b) {
                    hi = b;
                } else {
                    lo = a;
                }
            }
            f(0.5 * (lo + hi)).exp().min(1.0)
        }

        pub fn rho_for(epsilon: f64, delta: f64) -> f64 {
            let (mut lo, mut hi) = (0.0f64, epsilon.max(1.0) * 4.0);
            for _ in 0..200 {
                let mid = 0.5 * (lo + hi);
                if zcdp_delta(mid, epsilon) <= delta {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            lo
        }

        pub fn epsilon_for(rho: f64, delta: f64) -> f64 {
            let (mut lo, mut hi) = (
                0.0f64,
                2.0 * rho + 4.0 * (rho * (1.0 / delta).ln()).sqrt() + 1.0,
            );
            for _ in 0..200 {
                let mid = 0.5 * (lo + hi);
                if zcdp_delta(rho, mid) <= delta {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            hi
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Stopping at a fixed point changes no bit of any conversion, so budgets
        /// and noise scales are those of the full searches.
        #[test]
        fn searches_stopped_at_a_fixed_point_give_the_same_bits(
            eps in 0.01f64..20.0,
            log_delta in -15.0f64..-1.0,
        ) {
            let delta = 10f64.powf(log_delta);
            let rho = rho_for(eps, delta);
            prop_assert_eq!(rho.to_bits(), full::rho_for(eps, delta).to_bits());
            prop_assert_eq!(
                epsilon_for(rho, delta).to_bits(),
                full::epsilon_for(rho, delta).to_bits()
            );
            prop_assert_eq!(
                zcdp_delta(rho, eps).to_bits(),
                full::zcdp_delta(rho, eps).to_bits()
            );
        }
    }
}
