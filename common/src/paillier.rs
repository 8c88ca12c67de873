//! Paillier encryption with g = n + 1, CRT decryption and the checks the proxy
//! applies to every ciphertext it receives.
//!
//! With g = n + 1, g^m = 1 + m n (mod n^2), so encrypting costs one exponentiation
//! r^n and no exponentiation of g. Decryption works modulo p^2 and q^2 separately and
//! recombines by CRT (about 4x cheaper than working modulo n^2); the CRT constants are
//! computed once, when the secret key is built.
//!
//! Plaintexts are residues modulo n. Signed values are mapped to residues by
//! [`PublicKey::encode_signed`]: a negative value v becomes n + v.

use num_bigint::{BigInt, BigUint, Sign};
use num_integer::Integer;
use num_traits::{One, Zero};
use rand::{CryptoRng, RngCore};
use sha2::{Digest, Sha256};

pub use crate::arith::random_below;
use crate::arith::{Elem, ModRing};
use crate::primes::random_prime;

/// Smallest modulus size accepted (bits). Below it factoring is within reach.
pub const MIN_KEY_BITS: u64 = 2048;
/// Default modulus size: about 128-bit security.
pub const DEFAULT_KEY_BITS: u64 = 3072;
/// Largest modulus [`SecretKey::generate`] makes: twice what a proxy accepts by
/// default. A key generator asked for far more would search for hours (a
/// Miller-Rabin round costs about the cube of the size, and the candidates grow
/// with it) before any proxy refused the key.
pub const MAX_GENERATED_KEY_BITS: u64 = 8192;

/// Errors of key handling and ciphertext validation.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PaillierError {
    /// A key below [`MIN_KEY_BITS`] was requested or received.
    #[error("Paillier modulus of {0} bits is below the minimum of {MIN_KEY_BITS} bits")]
    KeyTooSmall(u64),
    /// A key above [`MAX_GENERATED_KEY_BITS`] was asked to be generated.
    #[error(
        "a Paillier modulus of {0} bits is above the {MAX_GENERATED_KEY_BITS} bits this program generates"
    )]
    KeyTooLarge(u64),
    /// The public modulus is not an odd composite of the declared size.
    #[error("malformed Paillier public key: {0}")]
    MalformedKey(&'static str),
    /// A ciphertext is not in Z*_(n^2).
    #[error("ciphertext {index} is not in Z*_(n^2): {reason}")]
    BadCiphertext {
        /// Position of the ciphertext in its stream.
        index: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A plaintext is not below n.
    #[error("plaintext does not fit below the modulus")]
    PlaintextTooLarge,
    /// n is not invertible mod p - 1 or q - 1, so n-th roots cannot be taken by
    /// exponentiation: a key [`SecretKey::generate`] makes with negligible chance.
    #[error("this key cannot open ciphertexts: n is not invertible mod p - 1 or q - 1")]
    NoRoots,
}

/// A proof that a ciphertext c decrypts to `plaintext`: the randomness root r with
/// c = (1 + n)^m r^n mod n^2. Only the secret key can compute r; anyone can check
/// it ([`PublicKey::verify_opening`]). Since x -> x^n is a bijection of Z*_n onto the
/// n-th residues mod n^2, r is the one root of c (1 + n)^(-m): the opening says
/// nothing about c that m and c do not already determine, and nothing about any
/// other ciphertext whose randomness was drawn independently (docs/PRIVACY.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Opening {
    /// The plaintext residue m in [0, n).
    pub plaintext: BigUint,
    /// The root r in Z*_n.
    pub root: BigUint,
}

/// A Paillier public key: the modulus n, and the arithmetic mod n^2 (which holds
/// n^2) and mod n (where received ciphertexts are checked to be units).
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    n: BigUint,
    ring: ModRing,
    n_ring: ModRing,
}

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PublicKey {{ bits: {}, fingerprint: {} }}",
            self.bits(),
            self.fingerprint()
        )
    }
}

/// A Paillier ciphertext, an element of Z*_(n^2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ciphertext(pub BigUint);

/// Small powers c^d mod n^2 (d < 2^window) of one ciphertext, for windowed
/// simultaneous exponentiation ([`PublicKey::multi_scale_tables`]).
#[derive(Clone, Debug)]
pub struct PowerTable {
    window: usize,
    /// Held in the ring's engine: a table is read by many products, and the
    /// multi-exponentiation's accumulator stays there too (no conversion per
    /// multiplication, about a tenth of one at 3072 bits).
    powers: Vec<Elem>,
}

impl PowerTable {
    /// Widest window a table may have (2^8 powers).
    pub const MAX_WINDOW: usize = 8;

    /// The window minimizing the multiplications of `uses` exponentiations of
    /// `bits`-bit exponents sharing one table: 2^w to build, bits / w per use.
    pub fn window_for(bits: u64, uses: usize) -> usize {
        (1..=Self::MAX_WINDOW)
            .min_by_key(|&w| (1u64 << w) + uses.max(1) as u64 * bits.div_ceil(w as u64))
            .unwrap_or(4)
    }
}

/// A Paillier secret key with precomputed CRT constants.
#[derive(Clone)]
pub struct SecretKey {
    public: PublicKey,
    p: BigUint,
    q: BigUint,
    /// Arithmetic mod p^2 and q^2, where decryption exponentiates.
    p2: ModRing,
    q2: ModRing,
    p_minus_1: BigUint,
    q_minus_1: BigUint,
    /// (L_p(g^(p-1) mod p^2))^-1 mod p
    hp: BigUint,
    /// (L_q(g^(q-1) mod q^2))^-1 mod q
    hq: BigUint,
    /// q^-1 mod p, for the CRT recombination
    q_inv_p: BigUint,
    /// lambda = lcm(p - 1, q - 1), for textbook decryption
    lambda: BigUint,
    /// mu = L(g^lambda mod n^2)^-1 mod n, for textbook decryption
    mu: BigUint,
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the factors.
        write!(f, "SecretKey {{ public: {:?} }}", self.public)
    }
}

/// [`PublicKey::fingerprint`] of the key whose modulus is `n_bytes` as the wire
/// and [`PublicKey::to_bytes`] carry it (big-endian, no leading zero): a key can
/// be checked against a pinned fingerprint before it is parsed.
pub fn fingerprint_of_modulus(n_bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(n_bytes))
}

impl PublicKey {
    /// Builds a public key from the modulus, refusing moduli below [`MIN_KEY_BITS`].
    pub fn from_modulus(n: BigUint) -> Result<Self, PaillierError> {
        let bits = n.bits();
        if bits < MIN_KEY_BITS {
            return Err(PaillierError::KeyTooSmall(bits));
        }
        if n.is_even() {
            return Err(PaillierError::MalformedKey("modulus is even"));
        }
        Ok(Self::of_modulus(n))
    }

    fn of_modulus(n: BigUint) -> Self {
        Self {
            ring: ModRing::new(&n * &n),
            n_ring: ModRing::new(n.clone()),
            n,
        }
    }

    /// Arithmetic mod n^2: what every operation on ciphertexts runs on.
    pub fn ring(&self) -> &ModRing {
        &self.ring
    }

    /// This key with its arithmetic on num-bigint whatever the build, so that a
    /// bench measures both engines in one run.
    pub fn on_num_bigint(&self) -> Self {
        Self {
            ring: ModRing::num_bigint(self.n_squared().clone()),
            n_ring: ModRing::num_bigint(self.n.clone()),
            ..self.clone()
        }
    }

    /// Parses a big-endian modulus, as sent on the wire.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, PaillierError> {
        Self::from_modulus(BigUint::from_bytes_be(bytes))
    }

    /// The modulus as big-endian bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.n.to_bytes_be()
    }

    /// The modulus n.
    pub fn n(&self) -> &BigUint {
        &self.n
    }

    /// n^2, the ciphertext modulus.
    pub fn n_squared(&self) -> &BigUint {
        self.ring.modulus()
    }

    /// Size of n in bits.
    pub fn bits(&self) -> u64 {
        self.n.bits()
    }

    /// Bytes of one serialized ciphertext (fixed width, big-endian).
    pub fn ciphertext_bytes(&self) -> usize {
        self.n_squared().bits().div_ceil(8) as usize
    }

    /// SHA-256 of the big-endian modulus, hex. Owners pin the user's key by this value,
    /// received out of band, so a proxy cannot substitute a key of its own.
    pub fn fingerprint(&self) -> String {
        fingerprint_of_modulus(&self.to_bytes())
    }

    /// Maps a signed integer to its residue modulo n. Fails if |v| >= n / 2, where
    /// the residue would be ambiguous.
    pub fn encode_signed(&self, v: &BigInt) -> Result<BigUint, PaillierError> {
        let mag = v.magnitude();
        if mag.bits() + 1 >= self.n.bits() {
            return Err(PaillierError::PlaintextTooLarge);
        }
        Ok(match v.sign() {
            Sign::Minus => &self.n - mag,
            _ => mag.clone(),
        })
    }

    /// The deterministic "encryption" 1 + m n of a plaintext residue m, with no
    /// randomness. Multiplying a ciphertext by it adds m; it is never sent alone.
    pub fn plaintext_term(&self, m: &BigUint) -> BigUint {
        (BigUint::one() + (m % &self.n) * &self.n) % self.n_squared()
    }

    /// r^n mod n^2 for a fresh uniform r in Z*_n: the randomizer of one encryption.
    pub fn random_mask<R: RngCore + CryptoRng>(&self, rng: &mut R) -> BigUint {
        let r = random_unit(&self.n, rng);
        self.ring.pow(&r, &self.n)
    }

    /// Encrypts residue m with the given randomizer (r^n mod n^2).
    pub fn encrypt_with_mask(
        &self,
        m: &BigUint,
        mask: &BigUint,
    ) -> Result<Ciphertext, PaillierError> {
        if m >= &self.n {
            return Err(PaillierError::PlaintextTooLarge);
        }
        Ok(Ciphertext(self.ring.mul(&self.plaintext_term(m), mask)))
    }

    /// Encrypts residue m with fresh randomness.
    pub fn encrypt<R: RngCore + CryptoRng>(
        &self,
        m: &BigUint,
        rng: &mut R,
    ) -> Result<Ciphertext, PaillierError> {
        let mask = self.random_mask(rng);
        self.encrypt_with_mask(m, &mask)
    }

    /// E\[a\] * E\[b\] = E\[a + b\].
    pub fn add(&self, a: &Ciphertext, b: &Ciphertext) -> Ciphertext {
        Ciphertext(self.ring.mul(&a.0, &b.0))
    }

    /// E\[a\]^k = E\[k a\].
    pub fn scale(&self, a: &Ciphertext, k: &BigUint) -> Ciphertext {
        Ciphertext(self.ring.pow(&a.0, k))
    }

    /// prod_t E\[a_t\]^(k_t) = E\[sum_t k_t a_t\] by simultaneous exponentiation
    /// (Straus with fixed windows): the squarings are shared by all terms, so t
    /// exponents of B bits cost about B squarings plus t (B / w + 2^w) multiplications
    /// instead of t (3B / 2). The window w is chosen for the call.
    pub fn multi_scale(&self, terms: &[(&Ciphertext, &BigUint)]) -> Ciphertext {
        let bits = terms.iter().map(|(_, k)| k.bits()).max().unwrap_or(0);
        let window = PowerTable::window_for(bits, 1);
        let tables: Vec<PowerTable> = terms
            .iter()
            .map(|(c, _)| self.power_table(c, window))
            .collect();
        let pairs: Vec<(&PowerTable, &BigUint)> = tables
            .iter()
            .zip(terms)
            .map(|(t, (_, k))| (t, *k))
            .collect();
        self.multi_scale_tables(&pairs)
    }

    /// The small powers E\[a\]^d, d < 2^window, for [`PublicKey::multi_scale_tables`].
    /// A base used in several multi-exponentiations pays for its table once.
    pub fn power_table(&self, a: &Ciphertext, window: usize) -> PowerTable {
        let window = window.clamp(1, PowerTable::MAX_WINDOW);
        let mut powers = Vec::with_capacity(1 << window);
        powers.push(self.ring.elem(&BigUint::one()));
        powers.push(self.ring.elem(&(&a.0 % self.n_squared())));
        for d in 2..(1usize << window) {
            let next = self.ring.mul_elem(&powers[d - 1], &powers[1]);
            powers.push(next);
        }
        PowerTable { window, powers }
    }

    /// prod_t T_t^(k_t) over precomputed power tables (all of one window width;
    /// tables of other widths are rebuilt). Straus: one squaring chain, one
    /// multiplication per nonzero window digit of each exponent.
    pub fn multi_scale_tables(&self, terms: &[(&PowerTable, &BigUint)]) -> Ciphertext {
        let Some(w) = terms.first().map(|(t, _)| t.window) else {
            return Ciphertext(BigUint::one());
        };
        let rebuilt: Vec<Option<PowerTable>> = terms
            .iter()
            .map(|(t, _)| {
                (t.window != w).then(|| self.power_table(&Ciphertext(t.powers[1].to_big()), w))
            })
            .collect();
        let tables: Vec<&PowerTable> = terms
            .iter()
            .zip(&rebuilt)
            .map(|((t, _), r)| r.as_ref().unwrap_or(t))
            .collect();
        let bits = terms.iter().map(|(_, k)| k.bits()).max().unwrap_or(0);
        let windows = bits.div_ceil(w as u64);
        let mut acc: Option<Elem> = None;
        for win in (0..windows).rev() {
            if let Some(a) = acc.as_mut() {
                for _ in 0..w {
                    *a = self.ring.mul_elem(a, a);
                }
            }
            for (table, (_, k)) in tables.iter().zip(terms) {
                let mut d = 0usize;
                for b in 0..w as u64 {
                    if k.bit(win * w as u64 + b) {
                        d |= 1 << b;
                    }
                }
                if d != 0 {
                    acc = Some(match acc {
                        None => table.powers[d].clone(),
                        Some(a) => self.ring.mul_elem(&a, &table.powers[d]),
                    });
                }
            }
        }
        Ciphertext(acc.map_or_else(BigUint::one, |a| a.to_big()))
    }

    /// E\[a\] * (1 + m n) = E\[a + m\].
    pub fn add_plain(&self, a: &Ciphertext, m: &BigUint) -> Ciphertext {
        Ciphertext(self.ring.mul(&a.0, &self.plaintext_term(m)))
    }

    /// Multiplies by a fresh encryption of zero, so the result cannot be linked to
    /// the randomness of the ciphertexts it was computed from.
    pub fn rerandomize<R: RngCore + CryptoRng>(&self, a: &Ciphertext, rng: &mut R) -> Ciphertext {
        Ciphertext(self.ring.mul(&a.0, &self.random_mask(rng)))
    }

    /// Whether `opening` proves that `c` decrypts to its plaintext: m < n, r in
    /// [1, n) and (1 + m n) r^n = c mod n^2. A party that accepts a decrypted value
    /// on this check does not rely on the decryptor's word.
    pub fn verify_opening(&self, c: &Ciphertext, opening: &Opening) -> bool {
        let Opening { plaintext, root } = opening;
        if plaintext >= &self.n || root.is_zero() || root >= &self.n {
            return false;
        }
        let rn = self.ring.pow(root, &self.n);
        self.ring.mul(&self.plaintext_term(plaintext), &rn) == c.0
    }

    /// Parses and validates a ciphertext received from an untrusted party: it must
    /// lie in [1, n^2) and not be a multiple of n, which makes it a unit of
    /// Z_(n^2) for anyone who cannot factor n (a non-unit that is not a multiple
    /// of n shares exactly one prime with n: whoever can make one has factored
    /// n). A multiple of n, which anyone can make, would zero the aggregate of
    /// every honest owner mod n; one outside the range would not be a residue.
    pub fn ciphertext_from_bytes(
        &self,
        bytes: &[u8],
        index: usize,
    ) -> Result<Ciphertext, PaillierError> {
        let c = self.elems_from_bytes(&[bytes], index)?;
        Ok(Ciphertext(c.first().map(Elem::to_big).unwrap_or_default()))
    }

    /// Parses and validates a batch of ciphertexts (indices from `first_index`), as
    /// [`PublicKey::ciphertext_from_bytes`] does one; the first bad one is named.
    pub fn ciphertexts_from_bytes<B: AsRef<[u8]>>(
        &self,
        batch: &[B],
        first_index: usize,
    ) -> Result<Vec<Ciphertext>, PaillierError> {
        Ok(self
            .elems_from_bytes(batch, first_index)?
            .iter()
            .map(|c| Ciphertext(c.to_big()))
            .collect())
    }

    /// [`PublicKey::ciphertexts_from_bytes`], the ciphertexts held in the key's
    /// ring ([`PublicKey::ring`]) for a caller that multiplies them there (the
    /// proxy's fold): read in one pass, no conversion. The check per ciphertext
    /// is a divisibility test, a sixth of a multiplication mod n^2: an exact
    /// test of the gcd with n (even batched, as a product mod n) costs more than
    /// half of one, and guards against nothing more (see
    /// [`PublicKey::ciphertext_from_bytes`]).
    pub fn elems_from_bytes<B: AsRef<[u8]>>(
        &self,
        batch: &[B],
        first_index: usize,
    ) -> Result<Vec<Elem>, PaillierError> {
        let bad = |index, reason| PaillierError::BadCiphertext { index, reason };
        let mut out = Vec::with_capacity(batch.len());
        for (k, bytes) in batch.iter().enumerate() {
            let (bytes, index) = (bytes.as_ref(), first_index + k);
            if bytes.len() > self.ciphertext_bytes() {
                return Err(bad(index, "longer than n^2"));
            }
            let c = self.ring.elem_from_be_bytes(bytes);
            if !self.ring.is_residue(&c) {
                let zero = bytes.iter().all(|&b| b == 0);
                return Err(bad(index, if zero { "zero" } else { "not below n^2" }));
            }
            if self.n_ring.divides(&c) {
                return Err(bad(index, "a multiple of n"));
            }
            out.push(c);
        }
        Ok(out)
    }

    /// Fixed-width big-endian serialization of a ciphertext held in the key's ring.
    pub fn elem_to_bytes(&self, c: &Elem) -> Vec<u8> {
        self.ring.to_be_bytes(c, self.ciphertext_bytes())
    }

    /// Fixed-width big-endian serialization of a ciphertext.
    pub fn ciphertext_to_bytes(&self, c: &Ciphertext) -> Vec<u8> {
        let width = self.ciphertext_bytes();
        let raw = c.0.to_bytes_be();
        let mut out = vec![0u8; width.saturating_sub(raw.len())];
        out.extend_from_slice(&raw);
        out
    }
}

impl SecretKey {
    /// Generates a key pair with an n of exactly `bits` bits, from
    /// [`MIN_KEY_BITS`] to [`MAX_GENERATED_KEY_BITS`].
    pub fn generate<R: RngCore + CryptoRng>(bits: u64, rng: &mut R) -> Result<Self, PaillierError> {
        if bits < MIN_KEY_BITS {
            return Err(PaillierError::KeyTooSmall(bits));
        }
        if bits > MAX_GENERATED_KEY_BITS {
            return Err(PaillierError::KeyTooLarge(bits));
        }
        loop {
            let p = random_prime(bits / 2, rng);
            let q = random_prime(bits - bits / 2, rng);
            if p == q {
                continue;
            }
            let n = &p * &q;
            if n.bits() != bits {
                continue;
            }
            return Self::from_primes(p, q);
        }
    }

    /// Builds a key from its two primes (known-answer tests use fixed primes).
    pub fn from_primes(p: BigUint, q: BigUint) -> Result<Self, PaillierError> {
        let n = &p * &q;
        let public = PublicKey::of_modulus(n.clone());
        let one = BigUint::one();
        let p2 = ModRing::new(&p * &p);
        let q2 = ModRing::new(&q * &q);
        let p_minus_1 = &p - &one;
        let q_minus_1 = &q - &one;
        let g = &n + &one;
        let lp = (p2.pow_secret(&g, &p_minus_1) - &one) / &p;
        let lq = (q2.pow_secret(&g, &q_minus_1) - &one) / &q;
        let hp = lp
            .modinv(&p)
            .ok_or(PaillierError::MalformedKey("L_p(g^(p-1)) not invertible"))?;
        let hq = lq
            .modinv(&q)
            .ok_or(PaillierError::MalformedKey("L_q(g^(q-1)) not invertible"))?;
        let lambda = p_minus_1.lcm(&q_minus_1);
        let mu = ((public.ring.pow_secret(&g, &lambda) - &one) / &n)
            .modinv(&n)
            .ok_or(PaillierError::MalformedKey("L(g^lambda) not invertible"))?;
        let q_inv_p = (&q % &p)
            .modinv(&p)
            .ok_or(PaillierError::MalformedKey("p and q not coprime"))?;
        Ok(Self {
            public,
            p,
            q,
            p2,
            q2,
            p_minus_1,
            q_minus_1,
            hp,
            hq,
            q_inv_p,
            lambda,
            mu,
        })
    }

    /// This key with its arithmetic on num-bigint ([`PublicKey::on_num_bigint`]).
    pub fn on_num_bigint(&self) -> Self {
        Self {
            public: self.public.on_num_bigint(),
            p2: ModRing::num_bigint(self.p2.modulus().clone()),
            q2: ModRing::num_bigint(self.q2.modulus().clone()),
            ..self.clone()
        }
    }

    /// The two primes, for storing the key; handle with the care the key deserves.
    pub fn primes(&self) -> (&BigUint, &BigUint) {
        (&self.p, &self.q)
    }

    /// The matching public key.
    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    /// CRT decryption to the residue m in [0, n).
    pub fn decrypt(&self, c: &Ciphertext) -> BigUint {
        let one = BigUint::one();
        let cp = self.p2.pow_secret(&c.0, &self.p_minus_1);
        let mp = (((cp - &one) / &self.p) * &self.hp) % &self.p;
        let cq = self.q2.pow_secret(&c.0, &self.q_minus_1);
        let mq = (((cq - &one) / &self.q) * &self.hq) % &self.q;
        // m = mq + q * ((mp - mq) * q^-1 mod p)
        let diff = (&mp + &self.p - (&mq % &self.p)) % &self.p;
        let h = (diff * &self.q_inv_p) % &self.p;
        mq + &self.q * h
    }

    /// Decrypts `c` and recovers its randomness root, so that a verifier holding only
    /// the public key can check the plaintext ([`PublicKey::verify_opening`]).
    /// With c (1 + n)^(-m) = r^n mod n^2, r^n mod p = c' mod p, and r is the
    /// (n^-1 mod (p - 1))-th power of it mod p (likewise mod q), joined by CRT.
    pub fn open(&self, c: &Ciphertext) -> Result<Opening, PaillierError> {
        let n = self.public.n();
        let plaintext = self.decrypt(c);
        let unmasked = (&c.0 * self.public.plaintext_term(&(n - &plaintext))) % n;
        let root_mod = |prime: &BigUint, order: &BigUint| -> Result<BigUint, PaillierError> {
            let e = (n % order).modinv(order).ok_or(PaillierError::NoRoots)?;
            Ok(ModRing::new(prime.clone()).pow_secret(&(&unmasked % prime), &e))
        };
        let rp = root_mod(&self.p, &self.p_minus_1)?;
        let rq = root_mod(&self.q, &self.q_minus_1)?;
        let diff = (&rp + &self.p - (&rq % &self.p)) % &self.p;
        let root = rq + &self.q * ((diff * &self.q_inv_p) % &self.p);
        Ok(Opening { plaintext, root })
    }

    /// Textbook decryption L(c^lambda mod n^2) mu mod n, without CRT: the baseline
    /// the CRT path is measured against. Same result as [`Self::decrypt`].
    pub fn decrypt_textbook(&self, c: &Ciphertext) -> BigUint {
        let n = self.public.n();
        let x = self.public.ring.pow_secret(&c.0, &self.lambda);
        (((x - BigUint::one()) / n) * &self.mu) % n
    }

    /// Decrypts and maps the residue back to a signed integer in (-n/2, n/2).
    pub fn decrypt_signed(&self, c: &Ciphertext) -> BigInt {
        self.to_signed(self.decrypt(c))
    }

    /// Maps a residue to a signed integer in (-n/2, n/2).
    pub fn to_signed(&self, m: BigUint) -> BigInt {
        let n = self.public.n();
        if m > (n >> 1) {
            -BigInt::from_biguint(Sign::Plus, n - m)
        } else {
            BigInt::from_biguint(Sign::Plus, m)
        }
    }
}

/// Uniform unit of Z*_n.
pub fn random_unit<R: RngCore + CryptoRng>(n: &BigUint, rng: &mut R) -> BigUint {
    loop {
        let r = random_below(n, rng);
        if !r.is_zero() && r.gcd(n).is_one() {
            return r;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;
    use std::sync::OnceLock;

    fn test_key() -> &'static SecretKey {
        static KEY: OnceLock<SecretKey> = OnceLock::new();
        KEY.get_or_init(|| {
            let mut rng = ChaCha20Rng::seed_from_u64(7);
            SecretKey::generate(2048, &mut rng).expect("keygen")
        })
    }

    #[derive(serde::Deserialize)]
    struct Vector {
        p: String,
        q: String,
        m: String,
        r: String,
        c: String,
    }

    /// Known answers computed independently (Python big integers, textbook
    /// c = (1 + m n) r^n mod n^2) for fixed primes and randomness.
    #[test]
    fn known_answer_vectors() {
        let vectors: Vec<Vector> =
            serde_json::from_str(include_str!("../testdata/paillier_vectors.json")).expect("json");
        assert!(!vectors.is_empty());
        for v in vectors {
            let p = BigUint::parse_bytes(v.p.as_bytes(), 16).expect("p");
            let q = BigUint::parse_bytes(v.q.as_bytes(), 16).expect("q");
            let m = BigUint::parse_bytes(v.m.as_bytes(), 16).expect("m");
            let r = BigUint::parse_bytes(v.r.as_bytes(), 16).expect("r");
            let c = BigUint::parse_bytes(v.c.as_bytes(), 16).expect("c");
            let sk = SecretKey::from_primes(p, q).expect("key");
            let pk = sk.public();
            let mask = r.modpow(pk.n(), pk.n_squared());
            let ct = pk.encrypt_with_mask(&m, &mask).expect("encrypt");
            assert_eq!(ct.0, c, "ciphertext differs from the known answer");
            assert_eq!(sk.decrypt(&Ciphertext(c)), m, "decryption differs");
        }
    }

    #[test]
    fn refuses_small_keys_and_huge_generations() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        assert_eq!(
            SecretKey::generate(1024, &mut rng).err(),
            Some(PaillierError::KeyTooSmall(1024))
        );
        assert_eq!(
            SecretKey::generate(MAX_GENERATED_KEY_BITS + 1, &mut rng).err(),
            Some(PaillierError::KeyTooLarge(MAX_GENERATED_KEY_BITS + 1))
        );
        let small = BigUint::from(3u32) << 1000usize | BigUint::one();
        assert_eq!(
            PublicKey::from_modulus(small).err(),
            Some(PaillierError::KeyTooSmall(1002))
        );
    }

    #[test]
    fn generated_key_has_exact_size() {
        let sk = test_key();
        assert_eq!(sk.public().bits(), 2048);
    }

    #[test]
    fn rejects_bad_ciphertexts() {
        let pk = test_key().public();
        assert!(pk.ciphertext_from_bytes(&[0u8; 4], 0).is_err());
        let n2 = pk.n_squared().to_bytes_be();
        assert!(pk.ciphertext_from_bytes(&n2, 1).is_err());
        // A multiple of n, the one non-unit anyone can make, is refused.
        let bad = (pk.n() * 7u32).to_bytes_be();
        assert_eq!(
            pk.ciphertext_from_bytes(&bad, 2).err(),
            Some(PaillierError::BadCiphertext {
                index: 2,
                reason: "a multiple of n"
            })
        );
        let too_long = vec![1u8; pk.ciphertext_bytes() + 1];
        assert!(pk.ciphertext_from_bytes(&too_long, 3).is_err());
        // Batches: the one bad ciphertext among good ones is named by its index.
        let mut rng = ChaCha20Rng::seed_from_u64(9);
        let good: Vec<Vec<u8>> = (0..5u64)
            .map(|m| {
                let c = pk.encrypt(&BigUint::from(m), &mut rng).expect("enc");
                pk.ciphertext_to_bytes(&c)
            })
            .collect();
        let parsed = pk.ciphertexts_from_bytes(&good, 10).expect("all valid");
        assert_eq!(parsed.len(), 5);
        for (c, b) in parsed.iter().zip(&good) {
            assert_eq!(&pk.ciphertext_to_bytes(c), b);
        }
        let cases = [
            (3usize, bad.clone(), "a multiple of n"),
            (0, vec![0u8; 1], "zero"),
            (4, n2.clone(), "not below n^2"),
            (1, too_long, "longer than n^2"),
        ];
        // Both engines read and check alike.
        for key in [pk.clone(), pk.on_num_bigint()] {
            assert_eq!(
                key.ciphertexts_from_bytes(&good, 10).expect("valid"),
                parsed
            );
            for (at, bad_bytes, why) in &cases {
                let mut batch = good.clone();
                batch[*at] = bad_bytes.clone();
                assert_eq!(
                    key.elems_from_bytes(&batch, 10).err(),
                    Some(PaillierError::BadCiphertext {
                        index: 10 + at,
                        reason: why
                    }),
                    "{}",
                    key.ring().engine()
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(12))]
        /// The opening recovers the very root the encryptor used (for a product of
        /// ciphertexts, the product of their roots), it verifies, and no other
        /// plaintext or root verifies against the same ciphertext.
        #[test]
        fn openings_recover_the_root_and_bind_the_plaintext(ms in proptest::collection::vec(0u64..1_000_000, 1..4), lie in 1u64..1_000, seed in any::<u64>()) {
            let sk = test_key();
            let (pk, n) = (sk.public(), sk.public().n());
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let (mut product, mut roots, mut sum) = (Ciphertext(BigUint::one()), BigUint::one(), 0u64);
            for &m in &ms {
                let r = random_unit(n, &mut rng);
                let c = pk.encrypt_with_mask(&BigUint::from(m), &r.modpow(n, pk.n_squared())).expect("enc");
                product = pk.add(&product, &c);
                roots = (roots * &r) % n;
                sum += m;
            }
            let opening = sk.open(&product).expect("open");
            prop_assert_eq!(&opening, &Opening { plaintext: BigUint::from(sum), root: roots.clone() });
            prop_assert!(pk.verify_opening(&product, &opening));
            for wrong in [
                Opening { plaintext: BigUint::from(sum + lie), root: roots.clone() },
                Opening { plaintext: BigUint::from(sum), root: (&roots + lie) % n },
                Opening { plaintext: BigUint::from(sum), root: BigUint::zero() },
                Opening { plaintext: n + BigUint::from(sum), root: roots.clone() },
            ] {
                prop_assert!(!pk.verify_opening(&product, &wrong));
            }
            // The opening of one ciphertext does not verify for a re-randomized copy.
            prop_assert!(!pk.verify_opening(&pk.rerandomize(&product, &mut rng), &opening));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        #[test]
        fn round_trip_and_homomorphism(a in any::<i64>(), b in any::<i64>(), k in 0u64..1_000_000, seed in any::<u64>()) {
            let sk = test_key();
            let pk = sk.public();
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let ea = pk.encrypt(&pk.encode_signed(&BigInt::from(a)).expect("fits"), &mut rng).expect("enc");
            let eb = pk.encrypt(&pk.encode_signed(&BigInt::from(b)).expect("fits"), &mut rng).expect("enc");
            prop_assert_eq!(sk.decrypt_signed(&ea), BigInt::from(a));
            let sum = pk.add(&ea, &eb);
            prop_assert_eq!(sk.decrypt_signed(&sum), BigInt::from(a) + BigInt::from(b));
            let scaled = pk.scale(&ea, &BigUint::from(k));
            prop_assert_eq!(sk.decrypt_signed(&scaled), BigInt::from(a) * BigInt::from(k));
            let ms = pk.multi_scale(&[(&ea, &BigUint::from(k)), (&eb, &BigUint::from(k / 3 + 1))]);
            prop_assert_eq!(
                sk.decrypt_signed(&ms),
                BigInt::from(a) * BigInt::from(k) + BigInt::from(b) * BigInt::from(k / 3 + 1)
            );
            prop_assert_eq!(ms, pk.add(&pk.scale(&ea, &BigUint::from(k)), &pk.scale(&eb, &BigUint::from(k / 3 + 1))));
            // Windowed tables, each width and mixed widths, agree with plain powers.
            let big_k = BigUint::from(k) << 70u32 | BigUint::from(a as u64);
            for w in [1usize, 3, 5] {
                let ta = pk.power_table(&ea, w);
                let tb = pk.power_table(&eb, (w % 4) + 2);
                let got = pk.multi_scale_tables(&[(&ta, &big_k), (&tb, &BigUint::from(k))]);
                prop_assert_eq!(got, pk.add(&pk.scale(&ea, &big_k), &pk.scale(&eb, &BigUint::from(k))));
            }
            prop_assert_eq!(pk.multi_scale_tables(&[]), Ciphertext(BigUint::one()));
            prop_assert_eq!(sk.decrypt_textbook(&ea), sk.decrypt(&ea));
            let rr = pk.rerandomize(&ea, &mut rng);
            prop_assert_ne!(&rr.0, &ea.0);
            prop_assert_eq!(sk.decrypt_signed(&rr), BigInt::from(a));
            let bytes = pk.ciphertext_to_bytes(&rr);
            prop_assert_eq!(bytes.len(), pk.ciphertext_bytes());
            prop_assert_eq!(pk.ciphertext_from_bytes(&bytes, 0).expect("valid"), rr);
        }
    }
}
