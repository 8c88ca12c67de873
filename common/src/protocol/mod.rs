//! The three computations of a study, as pure functions: an owner's share and its
//! plaintexts, the proxy's masked and noised release (ARCHITECTURE.md, "Data flow
//! of a study"), and the user's reconstruction of S + E.
//!
//! Release in `mask` centering, per packed segment (row i, columns j..j+len):
//!
//! ```text
//! T = N R + v b^T + b v^T + b b^T + E'        v' = v + b
//! E[T_seg] = E[R_seg]^N * E[v_seg]^(b_i) * prod_t E[v_i 2^(t w)]^(b_(j+t)) * (1 + P n) * r^n
//! ```
//!
//! with P the packed plaintext b_i b_(j+t) + E'_(i,j+t), and E[v_k 2^(t w)] the
//! shifted ciphertexts precomputed once per k by squarings. The product over t is
//! E\[v_i\]^(B_seg) with B_seg = sum_t b_(j+t) 2^(t w), computed with E\[v_seg\]^(b_i)
//! as one Yao product on radix powers off the same chains ([`crate::radix`]). The
//! user computes
//! T - v' v'^T = N R - v v^T + E' = N S~ + E', in which the masks cancel exactly:
//! nothing the user decrypts depends on b beyond v' = v + b.
//!
//! The slots are sized for N S~ + E', not for T: T's b b^T term is about twice the
//! mask's bits, far wider than a slot, so the packed plaintext of a segment is
//! P(T_seg) mod n with its slots overlapping. Packing is linear mod n, so the user
//! subtracts P(v'_i v'_seg) from the decrypted residue and unpacks the difference,
//! P(N S~_seg + E'_seg). What the user decrypts is still a function of T alone (a
//! test checks it is P(T_seg) mod n to the bit), and the slots are about half as
//! wide as T's entries, so a study needs about half the ciphertexts.
//!
//! `share` is the owner's computation, `release` the proxy's, `open` the user's
//! (and `plausible` its check that honest rows could have given what it opened),
//! and `central` the trusted-curator reference the distributed release equals.

mod central;
mod open;
mod plausible;
mod release;
mod share;

pub use central::central_release;
pub use open::{open_release, open_release_unmasked, ClassStats, Opened};
pub use plausible::{check_release, Implausible, FALSE_ALARM};
pub use release::{release, ReleaseSecrets};
pub use share::{ClassRows, Share, ShareNoise};

use num_bigint::{BigInt, Sign};
use num_traits::ToPrimitive;

use crate::encoding::EncodingError;
use crate::paillier::PaillierError;

/// Errors of the protocol computations.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// Encoding or slot overflow.
    #[error(transparent)]
    Encoding(#[from] EncodingError),
    /// Key or ciphertext problem.
    #[error(transparent)]
    Paillier(#[from] PaillierError),
    /// A mask term's product refused ([`crate::radix::RadixError`]): a mask
    /// exponent longer than the radix powers the layout has the release take
    /// ([`crate::study::StudyLayout::mask_exponent_bits`] bounds every one), or
    /// powers of two radixes: an error rather than a wrong value.
    #[error(transparent)]
    Radix(#[from] crate::radix::RadixError),
    /// A ciphertext vector of the wrong length.
    #[error("expected {expected} ciphertexts, got {got}")]
    Count {
        /// Expected.
        expected: usize,
        /// Received.
        got: usize,
    },
    /// A sampled noise value beyond the tail bound the slots were sized for.
    #[error("noise sample beyond the proven tail bound (probability below 2^-1000)")]
    NoiseTail,
    /// A mask sum that does not fit the release ([`crate::secagg::MaskError`]).
    #[error(transparent)]
    Mask(#[from] crate::secagg::MaskError),
}

/// Lossy view of a big integer as f64 (values here are far below f64's range).
pub fn to_f64(v: &BigInt) -> f64 {
    v.to_f64().unwrap_or(match v.sign() {
        Sign::Minus => f64::NEG_INFINITY,
        _ => f64::INFINITY,
    })
}

#[cfg(test)]
mod tests;
