//! Pure core of private distributed PCA (DPDP-PCA made exact and packable).
//!
//! This crate does no I/O: every function takes values and returns values, and the
//! role binaries (`owner`, `proxy`, `user`) do the networking, files and clocks.
//!
//! Layout:
//! - [`arith`]: arithmetic mod n^2 (and p^2, q^2) on GMP, or on num-bigint without
//!   the `gmp` feature.
//! - [`paillier`]: keys, encryption with g = n + 1, CRT decryption, ciphertext checks.
//! - [`primes`]: random primes for keys, sieved and tested on every core.
//! - [`radix`]: long exponents on a few bases, shared chains of squarings and Yao's
//!   method (the `mask` release's mask term).
//! - [`encoding`]: fixed-point rows, slot packing and its overflow proof.
//! - [`dp`]: mechanisms, sensitivities, zCDP calibration, exact integer samplers.
//! - [`study`]: the validated study specification and the ciphertext layout.
//! - [`protocol`]: owner shares, the proxy's masked and noised release, the user's
//!   reconstruction of S + E.
//! - [`randomizer`]: short-exponent encryption randomness on a fixed base.
//! - [`owner_budget`]: an owner's privacy budget across studies (basic
//!   composition), which the proxy keeps per owner and an owner may keep in a
//!   ledger of its own.
//! - [`risk`]: study properties an owner must accept by name (`mask`, Wishart,
//!   noise-free).
//! - [`data`]: CSV tables, bounds and row normalization.
//! - [`scaling`]: each feature's range, center and scale from a marginal
//!   histogram release.
//! - [`linalg`]: eigen-decomposition, PCA, PSD repair, captured variance.
//! - [`synth`]: PCA-Gauss synthetic data from the released scatter and DP mean.
//! - [`cleaning`]: null-space cleaning of feature vectors against a linear
//!   predictor of confidential labels (predictor privacy).
//!
//! Known limitations: the default build links the system's GMP (without the `gmp`
//! feature the arithmetic is pure Rust, about 1.3-2.2x slower); the rejection
//! samplers' running time depends on the sample (see [`dp::sampler`]).

pub mod arith;
pub mod cleaning;
pub mod data;
pub mod dp;
pub mod encoding;
pub mod linalg;
pub mod owner_budget;
pub mod paillier;
pub mod primes;
pub mod protocol;
pub mod radix;
pub mod randomizer;
pub mod risk;
pub mod scaling;
pub mod secagg;
pub mod study;
pub mod synth;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
