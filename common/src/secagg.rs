//! Masks that cancel in the aggregate, over Paillier plaintexts in Z_n, so that
//! no contribution alone decrypts to anything of its owner's data.
//!
//! **Held masks** (what studies use, [`held_masks`]): each owner draws a 32-byte
//! seed, deposits it with the study's mask holder (a second proxy, run by an
//! operator other than the aggregating proxy's), adds the masks the seed
//! expands to, mod n, to its plaintexts and encrypts them for the aggregating
//! proxy. The holder gives the user, once, the sum of the masks of the owners
//! the proxy counted ([`held_mask_sum`]); the user takes it off the decrypted
//! aggregate ([`remove_mask_sum`]). The two-server split is that of Prio
//! (Corrigan-Gibbs and Boneh, NSDI 2017) and DAP, with the helper's share sent
//! as a seed. The argument and its limits: docs/PRIVACY.md, "Masked
//! contributions".
//!
//! **Pair masks** ([`pair_masks`]): two owners a < b (by id) that agreed on a
//! 32-byte secret expand it, bound to the study and to both ids, into one mask
//! per plaintext; a adds it, b subtracts it (Bonawitz et al., CCS 2017, section
//! 4; Bell et al., CCS 2020, for masks with a few neighbours each). Their key
//! round and dropout recovery are not built; no study uses them.
//!
//! The expansion: a key HMAC-SHA256(secret, domain | fields), each part
//! prefixed by its length in 8 bytes, seeds ChaCha20, and each mask is drawn
//! below n by rejection from that stream ([`crate::arith::random_below`]): a
//! different study, owner, pair or modulus gives unrelated masks. Frozen by
//! `secagg::tests::masks_are_frozen` and `held_masks_are_frozen`.
//!
//! The pair secrets are agreed by X25519 (RFC 7748, [`AgreementKey`]).

use hmac::{Hmac, Mac};
use num_bigint::BigUint;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use sha2::Sha256;

use rand::{CryptoRng, RngCore};

use crate::arith::random_below;
use crate::encoding::length_prefixed_into;

/// Domain separation of the pair masks' expansion key: a new expansion gets a
/// new one.
pub const DOMAIN: &[u8] = b"dpca secagg pair masks v1";

/// Domain separation of the held masks' expansion key.
pub const HELD_DOMAIN: &[u8] = b"dpca secagg held masks v1";

/// What a masking is refused for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaskError {
    /// An owner paired with itself.
    #[error("owner {0:?} is listed as its own peer")]
    OwnPeer(String),
    /// A peer listed twice.
    #[error("peer {0:?} is listed twice")]
    PeerTwice(String),
    /// A peer's public key of small order: the agreed secret would be one
    /// an eavesdropper knows (all zeros).
    #[error("peer {0:?} sent a public key of small order")]
    LowOrderPeer(String),
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

/// An owner's X25519 key for one study's agreements: made fresh per study, so
/// a secret agreed in one study says nothing of another.
pub struct AgreementKey(x25519_dalek::StaticSecret);

impl AgreementKey {
    /// A fresh key from `rng`.
    pub fn generate<R: RngCore + CryptoRng>(rng: &mut R) -> Self {
        Self(x25519_dalek::StaticSecret::random_from_rng(rng))
    }

    /// The key of the 32 bytes `secret` (RFC 7748's scalar; for tests and
    /// known answers).
    pub fn from_bytes(secret: [u8; 32]) -> Self {
        Self(x25519_dalek::StaticSecret::from(secret))
    }

    /// The public half, to publish.
    pub fn public(&self) -> [u8; 32] {
        x25519_dalek::PublicKey::from(&self.0).to_bytes()
    }

    /// The secret agreed with peer `id`, whose public half is `peer`; refused
    /// for a public key of small order, whose agreed secret is all zeros
    /// whatever this key is.
    pub fn agree(&self, id: &str, peer: &[u8; 32]) -> Result<[u8; 32], MaskError> {
        let shared = self.0.diffie_hellman(&x25519_dalek::PublicKey::from(*peer));
        if !shared.was_contributory() {
            return Err(MaskError::LowOrderPeer(id.to_owned()));
        }
        Ok(shared.to_bytes())
    }
}

impl std::fmt::Debug for AgreementKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret half is never printed.
        write!(f, "AgreementKey({})", hex::encode(self.public()))
    }
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
    let fields: [&[u8]; 4] = [DOMAIN, study.as_bytes(), lo.as_bytes(), hi.as_bytes()];
    expand(secret, &fields, count, n)
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

    /// The first held masks of a fixed seed, study and owner, computed apart
    /// from this code as [`FROZEN`] is (domain `HELD_DOMAIN`, fields study and
    /// owner): owner and holder of two builds must expand a seed alike.
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

    /// RFC 7748, section 6.1: Alice's and Bob's keys and their shared secret
    /// (checked against OpenSSL's X25519 too).
    #[test]
    fn agreement_gives_rfc_7748s_known_answer() {
        let unhex =
            |s: &str| -> [u8; 32] { hex::decode(s).expect("hex").try_into().expect("32 bytes") };
        let alice = AgreementKey::from_bytes(unhex(
            "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a",
        ));
        let bob = AgreementKey::from_bytes(unhex(
            "5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb",
        ));
        assert_eq!(
            hex::encode(alice.public()),
            "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
        );
        assert_eq!(
            hex::encode(bob.public()),
            "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f"
        );
        let k = "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742";
        assert_eq!(
            hex::encode(alice.agree("bob", &bob.public()).expect("agree")),
            k
        );
        assert_eq!(
            hex::encode(bob.agree("alice", &alice.public()).expect("agree")),
            k
        );
    }

    /// A peer sending a point of small order (here the identity, all zeros)
    /// would make the secret one anyone knows: refused, naming the peer.
    #[test]
    fn a_small_order_public_key_is_refused() {
        let key = AgreementKey::generate(&mut rand_chacha::ChaCha20Rng::seed_from_u64(1));
        let mut one = [0u8; 32];
        one[0] = 1;
        for point in [[0u8; 32], one] {
            assert_eq!(
                key.agree("mallory", &point),
                Err(MaskError::LowOrderPeer("mallory".into()))
            );
        }
        assert!(!format!("{key:?}").contains(&hex::encode(key.0.to_bytes())));
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
            // Each owner agrees its own side of every pair from the peer's
            // public half: the two sides must meet for the masks to cancel.
            let keys: Vec<AgreementKey> = (0..owners).map(|_| AgreementKey::generate(&mut rng)).collect();
            let plain: Vec<Vec<BigUint>> = (0..owners)
                .map(|_| (0..count).map(|_| random_below(&n, &mut rng)).collect())
                .collect();
            let mut total_plain = vec![BigUint::default(); count];
            let mut total_masked = vec![BigUint::default(); count];
            for (i, p) in plain.iter().enumerate() {
                let peers: Vec<(&str, [u8; 32])> = pairs
                    .iter()
                    .filter_map(|&(a, b)| match (a == i, b == i) {
                        (true, _) => Some(b),
                        (_, true) => Some(a),
                        _ => None,
                    })
                    .map(|j| {
                        let secret = keys[i].agree(&ids[j], &keys[j].public()).expect("agree");
                        (ids[j].as_str(), secret)
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
