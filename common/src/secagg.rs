//! Pairwise masks that cancel in the aggregate: the masking step of secure
//! aggregation (Bonawitz et al., CCS 2017, section 4; Bell et al., CCS 2020, for
//! masks with a few neighbours each), over Paillier plaintexts in Z_n.
//!
//! Two owners a < b (by id) that agreed on a 32-byte secret expand it, bound
//! to the study and to both ids, into one mask in [0, n) per plaintext of the
//! study's layout ([`pair_masks`]). Owner a adds each mask to its plaintext,
//! owner b subtracts it, both mod n ([`mask_plaintexts`]), before encrypting.
//! The proxy adds the contributions (multiplies the ciphertexts), so the masks
//! cancel and the aggregate is the sum of the shares, to the bit; each
//! contribution alone decrypts to values uniform in Z_n for whoever lacks one
//! of its owner's secrets.
//!
//! The expansion: a key HMAC-SHA256(secret, [`DOMAIN`] | study | a | b), each
//! field prefixed by its length in 8 bytes, seeds ChaCha20, and each mask is
//! drawn below n by rejection from that stream ([`crate::arith::random_below`]):
//! a different study, pair or modulus gives unrelated masks. Frozen by
//! `secagg::tests::masks_are_frozen`.
//!
//! The agreement of the secrets, their signatures, and the recovery of an
//! owner that drops out are the shells' (not in this module).

use hmac::{Hmac, Mac};
use num_bigint::BigUint;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use sha2::Sha256;

use crate::arith::random_below;

/// Domain separation of the expansion's key: a new expansion gets a new one.
pub const DOMAIN: &[u8] = b"dpca secagg pair masks v1";

/// What a masking is refused for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaskError {
    /// An owner paired with itself.
    #[error("owner {0:?} is listed as its own peer")]
    OwnPeer(String),
    /// A peer listed twice.
    #[error("peer {0:?} is listed twice")]
    PeerTwice(String),
    /// A plaintext not below the modulus.
    #[error("plaintext {index} is not below the modulus")]
    NotBelowModulus {
        /// Its index.
        index: usize,
    },
}

/// The masks of the pair `(a, b)` (ids, in either order) for `count`
/// plaintexts of `study` under modulus `n`, expanded from their `secret`.
pub fn pair_masks(
    secret: &[u8; 32],
    study: &str,
    (a, b): (&str, &str),
    count: usize,
    n: &BigUint,
) -> Vec<BigUint> {
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    let mut rng = ChaCha20Rng::from_seed(expansion_key(secret, study, lo, hi));
    (0..count).map(|_| random_below(n, &mut rng)).collect()
}

/// HMAC-SHA256 under `secret` of the domain, the study and the ordered pair,
/// each prefixed by its length.
fn expansion_key(secret: &[u8; 32], study: &str, lo: &str, hi: &str) -> [u8; 32] {
    // HMAC takes keys of any length: this cannot fail.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
        unreachable!("HMAC accepts a 32-byte key")
    };
    for field in [DOMAIN, study.as_bytes(), lo.as_bytes(), hi.as_bytes()] {
        mac.update(&(field.len() as u64).to_be_bytes());
        mac.update(field);
    }
    mac.finalize().into_bytes().into()
}

/// Masks owner `me`'s `plaintexts` (each below `n`) for `study` with each of
/// its `peers` (id and agreed secret): adds the pair's masks where `me` is the
/// lower id, subtracts them where it is the higher, mod n.
pub fn mask_plaintexts(
    plaintexts: &mut [BigUint],
    me: &str,
    peers: &[(&str, [u8; 32])],
    study: &str,
    n: &BigUint,
) -> Result<(), MaskError> {
    check_peers(me, peers)?;
    if let Some(index) = plaintexts.iter().position(|p| p >= n) {
        return Err(MaskError::NotBelowModulus { index });
    }
    for (peer, secret) in peers {
        let masks = pair_masks(secret, study, (me, peer), plaintexts.len(), n);
        let add = me < *peer;
        for (p, m) in plaintexts.iter_mut().zip(masks) {
            let sum = if add { &*p + m } else { &*p + (n - m) };
            *p = sum % n;
        }
    }
    Ok(())
}

/// Refuses `me` among its peers, and a peer listed twice (its masks would not
/// cancel).
fn check_peers(me: &str, peers: &[(&str, [u8; 32])]) -> Result<(), MaskError> {
    let mut seen = std::collections::BTreeSet::new();
    for (peer, _) in peers {
        if *peer == me {
            return Err(MaskError::OwnPeer(me.to_owned()));
        }
        if !seen.insert(*peer) {
            return Err(MaskError::PeerTwice((*peer).to_owned()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::Rng;

    fn modulus() -> BigUint {
        // An odd 127-bit modulus (any modulus serves the masks).
        (BigUint::from(1u8) << 127usize) - 1u8
    }

    /// The first masks of a fixed secret, study and pair, against values
    /// computed apart from this code; a change of the expansion would make
    /// owners of two builds masks that do not cancel.
    #[test]
    fn masks_are_frozen() {
        let masks = pair_masks(&[7u8; 32], "study-1", ("b", "a"), 3, &modulus());
        let hex: Vec<String> = masks.iter().map(|m| format!("{m:x}")).collect();
        assert_eq!(hex, FROZEN, "the mask expansion changed");
    }

    /// Computed apart from this code: Python's `hmac` with SHA-256 over the
    /// length-prefixed fields, the RFC 8439 ChaCha20 keystream of that key with
    /// a zero nonce and counter (what `ChaCha20Rng::from_seed` streams), read
    /// 16 bytes at a time, big-endian, top bit cleared, kept below 2^127 - 1.
    const FROZEN: [&str; 3] = [
        "18db360cf9f58ffbf4d4a900e510e4b6",
        "10febe4eae202897231bff8d6eec4b7c",
        "6a21240463489d1e615b707a7f9fa8c8",
    ];

    /// Masks depend on the study, the pair and the secret; not on the order
    /// the pair is named in.
    #[test]
    fn masks_are_bound_to_the_study_and_the_pair() {
        let n = modulus();
        let base = pair_masks(&[1u8; 32], "s", ("a", "b"), 4, &n);
        assert_eq!(base, pair_masks(&[1u8; 32], "s", ("b", "a"), 4, &n));
        for other in [
            pair_masks(&[1u8; 32], "t", ("a", "b"), 4, &n),
            pair_masks(&[1u8; 32], "s", ("a", "c"), 4, &n),
            pair_masks(&[2u8; 32], "s", ("a", "b"), 4, &n),
            // The length prefixes keep ("ab", "c") apart from ("a", "bc").
            pair_masks(&[1u8; 32], "s", ("ab", "c"), 4, &n),
        ] {
            assert!(base.iter().zip(&other).all(|(x, y)| x != y));
        }
        assert_ne!(
            pair_masks(&[1u8; 32], "s", ("ab", "c"), 1, &n),
            pair_masks(&[1u8; 32], "s", ("a", "bc"), 1, &n)
        );
    }

    #[test]
    fn an_owner_is_not_its_own_peer_and_no_peer_counts_twice() {
        let n = modulus();
        let mut p = vec![BigUint::from(1u8)];
        let own = mask_plaintexts(&mut p, "a", &[("a", [0; 32])], "s", &n);
        assert_eq!(own, Err(MaskError::OwnPeer("a".into())));
        let twice = mask_plaintexts(&mut p, "a", &[("b", [0; 32]), ("b", [1; 32])], "s", &n);
        assert_eq!(twice, Err(MaskError::PeerTwice("b".into())));
        let big = mask_plaintexts(&mut [n.clone()], "a", &[("b", [0; 32])], "s", &n);
        assert_eq!(big, Err(MaskError::NotBelowModulus { index: 0 }));
        assert_eq!(p, vec![BigUint::from(1u8)], "nothing half-masked");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// However many owners, whichever pairs agreed secrets (every pair, or
        /// a ring of neighbours), the masked contributions add up to the
        /// plain ones mod n, to the bit; and one masked contribution differs
        /// from its plaintexts wherever it has a peer.
        #[test]
        fn masks_cancel_in_the_aggregate(owners in 2usize..7, count in 1usize..5, ring: bool, seed: u64) {
            let n = modulus();
            let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(seed);
            let ids: Vec<String> = (0..owners).map(|i| format!("owner-{i}")).collect();
            let pairs: Vec<(usize, usize)> = (0..owners)
                .flat_map(|i| (i + 1..owners).map(move |j| (i, j)))
                .filter(|&(i, j)| !ring || j == i + 1 || (i == 0 && j == owners - 1))
                .collect();
            let secrets: Vec<[u8; 32]> = pairs.iter().map(|_| rng.gen()).collect();
            let plain: Vec<Vec<BigUint>> = (0..owners)
                .map(|_| (0..count).map(|_| random_below(&n, &mut rng)).collect())
                .collect();
            let mut total_plain = vec![BigUint::default(); count];
            let mut total_masked = vec![BigUint::default(); count];
            for (i, p) in plain.iter().enumerate() {
                let peers: Vec<(&str, [u8; 32])> = pairs
                    .iter()
                    .zip(&secrets)
                    .filter_map(|(&(a, b), s)| match (a == i, b == i) {
                        (true, _) => Some((ids[b].as_str(), *s)),
                        (_, true) => Some((ids[a].as_str(), *s)),
                        _ => None,
                    })
                    .collect();
                let mut masked = p.clone();
                mask_plaintexts(&mut masked, &ids[i], &peers, "study", &n).expect("masks");
                prop_assert!(masked.iter().all(|m| m < &n));
                prop_assert!(masked.iter().zip(p).all(|(m, x)| m != x));
                for k in 0..count {
                    total_plain[k] = (&total_plain[k] + &p[k]) % &n;
                    total_masked[k] = (&total_masked[k] + &masked[k]) % &n;
                }
            }
            prop_assert_eq!(total_plain, total_masked);
        }
    }
}
