//! Masks that cancel in the aggregate, over Paillier plaintexts in Z_n, so that
//! no contribution alone decrypts to anything of its owner's data.
//!
//! Each owner draws a 32-byte seed, deposits it with the study's mask holder (a
//! second proxy, run by an operator other than the aggregating proxy's), adds the
//! masks the seed expands to ([`held_masks`]), mod n, to its plaintexts and
//! encrypts them for the aggregating proxy. The holder gives the user, once, the
//! sum of the masks of the owners the proxy counted ([`held_mask_sum`]); the user
//! takes it off the decrypted aggregate ([`remove_mask_sum`]). The two-server
//! split is that of Prio (Corrigan-Gibbs and Boneh, NSDI 2017) and DAP, with the
//! holder's share sent as a seed. The argument and its limits: docs/PRIVACY.md,
//! "Masked contributions".
//!
//! The expansion: a key HMAC-SHA256(seed, [`HELD_DOMAIN`] | study | owner), each
//! part prefixed by its length in 8 bytes, seeds ChaCha20, and each mask is drawn
//! below n by rejection from that stream ([`crate::arith::random_below`]): a
//! different study, owner or modulus gives unrelated masks. Frozen by
//! `secagg::tests::held_masks_are_frozen`.

use hmac::{Hmac, Mac};
use num_bigint::BigUint;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use sha2::Sha256;

use crate::arith::random_below;
use crate::encoding::length_prefixed_into;

/// Domain separation of the held masks' expansion key: a new expansion gets a
/// new one.
pub const HELD_DOMAIN: &[u8] = b"dpca secagg held masks v1";

/// What a masking is refused for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaskError {
    /// A plaintext not below the modulus.
    #[error("plaintext {index} is not below the modulus")]
    NotBelowModulus {
        /// Its index.
        index: usize,
    },
    /// A mask sum of another length than the plaintexts it is taken off.
    #[error("a mask sum of {got} values for {want} plaintexts")]
    SumLength {
        /// Values in the sum.
        got: usize,
        /// Plaintexts.
        want: usize,
    },
}

/// The masks owner `owner` adds to its `count` plaintexts of `study` under
/// modulus `n`, expanded from the `seed` it deposited with the mask holder.
pub fn held_masks(
    seed: &[u8; 32],
    study: &str,
    owner: &str,
    count: usize,
    n: &BigUint,
) -> Vec<BigUint> {
    let fields: [&[u8]; 3] = [HELD_DOMAIN, study.as_bytes(), owner.as_bytes()];
    expand(seed, &fields, count, n)
}

/// Adds owner `owner`'s held masks to its `plaintexts` (each below `n`), mod n;
/// nothing is changed if one is not below `n`.
pub fn add_held_masks(
    plaintexts: &mut [BigUint],
    seed: &[u8; 32],
    study: &str,
    owner: &str,
    n: &BigUint,
) -> Result<(), MaskError> {
    if let Some(index) = plaintexts.iter().position(|p| p >= n) {
        return Err(MaskError::NotBelowModulus { index });
    }
    let masks = held_masks(seed, study, owner, plaintexts.len(), n);
    for (p, m) in plaintexts.iter_mut().zip(masks) {
        *p = (&*p + m) % n;
    }
    Ok(())
}

/// The sum mod n of the held masks of `owners` (id and seed), `count` per
/// owner: what the mask holder gives the user.
pub fn held_mask_sum(
    owners: &[(&str, [u8; 32])],
    study: &str,
    count: usize,
    n: &BigUint,
) -> Vec<BigUint> {
    let mut sum = vec![BigUint::default(); count];
    for (owner, seed) in owners {
        for (s, m) in sum.iter_mut().zip(held_masks(seed, study, owner, count, n)) {
            *s = (&*s + m) % n;
        }
    }
    sum
}

/// Takes a mask `sum` off the decrypted `aggregate`, mod n: what is left is the
/// sum of the owners' unmasked plaintexts. Nothing is changed on an error.
pub fn remove_mask_sum(
    aggregate: &mut [BigUint],
    sum: &[BigUint],
    n: &BigUint,
) -> Result<(), MaskError> {
    if sum.len() != aggregate.len() {
        return Err(MaskError::SumLength {
            got: sum.len(),
            want: aggregate.len(),
        });
    }
    let outside = |v: &[BigUint]| v.iter().position(|p| p >= n);
    if let Some(index) = outside(aggregate).or(outside(sum)) {
        return Err(MaskError::NotBelowModulus { index });
    }
    for (a, s) in aggregate.iter_mut().zip(sum) {
        *a = (&*a + (n - s)) % n;
    }
    Ok(())
}

/// `count` values below `n` from ChaCha20 keyed by HMAC-SHA256 under `secret`
/// of `fields`, each prefixed by its length.
fn expand(secret: &[u8; 32], fields: &[&[u8]], count: usize, n: &BigUint) -> Vec<BigUint> {
    // HMAC takes keys of any length: this cannot fail.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
        unreachable!("HMAC accepts a 32-byte key")
    };
    length_prefixed_into(fields, |b| mac.update(b));
    let key: [u8; 32] = mac.finalize().into_bytes().into();
    let mut rng = ChaCha20Rng::from_seed(key);
    (0..count).map(|_| random_below(n, &mut rng)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn modulus() -> BigUint {
        // An odd 127-bit modulus (any modulus serves the masks).
        (BigUint::from(1u8) << 127usize) - 1u8
    }

    /// The first held masks of a fixed seed, study and owner, against values
    /// computed apart from this code: Python's `hmac` with SHA-256 over the
    /// length-prefixed fields, the RFC 8439 ChaCha20 keystream of that key with
    /// a zero nonce and counter (what `ChaCha20Rng::from_seed` streams), read
    /// 16 bytes at a time, big-endian, top bit cleared, kept below 2^127 - 1.
    /// Owner and holder of two builds must expand a seed alike.
    #[test]
    fn held_masks_are_frozen() {
        let masks = held_masks(&[7u8; 32], "study-1", "hospital-a", 3, &modulus());
        let hex: Vec<String> = masks.iter().map(|m| format!("{m:x}")).collect();
        assert_eq!(
            hex,
            [
                "738458cb0e16d0b437efeebd0b777213",
                "18a9ae2dc07dd1d66f8ec7ca218c7f0c",
                "204c3223a9d4e80f1ce5ff7a527529cd",
            ],
            "the held mask expansion changed"
        );
    }

    /// Held masks depend on the seed, the study and the owner.
    #[test]
    fn held_masks_are_bound_to_the_study_and_the_owner() {
        let n = modulus();
        let base = held_masks(&[1u8; 32], "s", "a", 4, &n);
        for other in [
            held_masks(&[2u8; 32], "s", "a", 4, &n),
            held_masks(&[1u8; 32], "t", "a", 4, &n),
            held_masks(&[1u8; 32], "s", "b", 4, &n),
        ] {
            assert!(base.iter().zip(&other).all(|(x, y)| x != y));
        }
    }

    /// A sum of the wrong length, or a value not below n, changes nothing.
    #[test]
    fn a_mask_sum_that_does_not_fit_is_refused_whole() {
        let n = modulus();
        let mut agg = vec![BigUint::from(5u8), BigUint::from(6u8)];
        let short = remove_mask_sum(&mut agg, &[BigUint::from(1u8)], &n);
        assert_eq!(short, Err(MaskError::SumLength { got: 1, want: 2 }));
        let big = remove_mask_sum(&mut agg, &[BigUint::from(1u8), n.clone()], &n);
        assert_eq!(big, Err(MaskError::NotBelowModulus { index: 1 }));
        assert_eq!(agg, vec![BigUint::from(5u8), BigUint::from(6u8)]);
        let mut over = vec![n.clone()];
        let err = add_held_masks(&mut over, &[0; 32], "s", "a", &n);
        assert_eq!(err, Err(MaskError::NotBelowModulus { index: 0 }));
        assert_eq!(over, vec![n.clone()], "nothing half-masked");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Owners add their held masks; the aggregate less the holder's sum of
        /// the same owners' masks is the plain sum mod n, to the bit; each masked
        /// contribution differs from its plaintexts; and the sum of a set less
        /// one owner leaves that owner's masks on.
        #[test]
        fn held_masks_come_off_the_aggregate_of_the_same_owners(owners in 1usize..6, count in 1usize..5, seed: u64) {
            let n = modulus();
            let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(seed);
            let ids: Vec<String> = (0..owners).map(|i| format!("owner-{i}")).collect();
            let seeds: Vec<[u8; 32]> = (0..owners).map(|_| { let mut s = [0u8; 32]; rand::RngCore::fill_bytes(&mut rng, &mut s); s }).collect();
            let mut plain_sum = vec![BigUint::default(); count];
            let mut masked_sum = vec![BigUint::default(); count];
            for (i, id) in ids.iter().enumerate() {
                let p: Vec<BigUint> = (0..count).map(|_| random_below(&n, &mut rng)).collect();
                let mut masked = p.clone();
                add_held_masks(&mut masked, &seeds[i], "study", id, &n).expect("masks");
                prop_assert!(masked.iter().zip(&p).all(|(m, x)| m != x && m < &n));
                for k in 0..count {
                    plain_sum[k] = (&plain_sum[k] + &p[k]) % &n;
                    masked_sum[k] = (&masked_sum[k] + &masked[k]) % &n;
                }
            }
            let held: Vec<(&str, [u8; 32])> = ids.iter().map(String::as_str).zip(seeds.iter().copied()).collect();
            let mut short = masked_sum.clone();
            remove_mask_sum(&mut short, &held_mask_sum(&held[1..], "study", count, &n), &n).expect("fits");
            prop_assert!(short.iter().zip(&plain_sum).all(|(a, b)| a != b));
            remove_mask_sum(&mut masked_sum, &held_mask_sum(&held, "study", count, &n), &n).expect("fits");
            prop_assert_eq!(masked_sum, plain_sum);
        }
    }
}
