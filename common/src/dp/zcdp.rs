//! Conversions between zCDP and (epsilon, delta)-DP (Canonne, Kamath and Steinke,
//! "The Discrete Gaussian for Differential Privacy", Corollary 13), and the
//! classic Analyze-Gauss factor.

/// The smallest epsilon at which a rho-zCDP mechanism is (epsilon, delta)-DP.
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

/// The largest rho whose zCDP guarantee implies (epsilon, delta)-DP.
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
