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
//! The secrets are agreed by X25519 (RFC 7748, [`AgreementKey`]): each owner
//! makes a key for the study and publishes its public half; the signatures on
//! those halves, their relay, and the recovery of an owner that drops out are
//! the shells' (not built yet).

use hmac::{Hmac, Mac};
use num_bigint::BigUint;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use sha2::Sha256;

use rand::{CryptoRng, RngCore};

use crate::arith::random_below;
use crate::encoding::length_prefixed_into;

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
    let fields: [&[u8]; 4] = [DOMAIN, study.as_bytes(), lo.as_bytes(), hi.as_bytes()];
    length_prefixed_into(&fields, |b| mac.update(b));
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
