//! The trusted-curator reference: the same mechanism on the pooled plaintext share.

use num_bigint::BigInt;
use num_traits::Zero;

use super::open::from_grid;
use super::{Opened, ReleaseSecrets, Share};
use crate::dp::Centering;
use crate::encoding::TriangleLayout;
use crate::study::{BlockShape, Projection};

/// The same mechanism run centrally on the pooled plaintext share, with the same
/// secrets: what a trusted curator holding every row would release. The distributed
/// protocol opens to exactly this (a test checks equality), so it loses nothing.
/// In `mask` mode the mask cancels, so only the noise of `secrets` matters.
pub fn central_release(
    pooled: &Share,
    layout: &BlockShape,
    centering: Centering,
    projection: Option<&Projection>,
    secrets: &ReleaseSecrets,
    frac_bits: u32,
) -> Opened {
    let dim = layout.matrix_dim;
    let tri = dim * (dim + 1) / 2;
    let n = BigInt::from(pooled.n);
    let blocks = (0..layout.matrix_blocks)
        .map(|block| {
            let mut t = vec![vec![BigInt::zero(); dim]; dim];
            for i in 0..dim {
                for j in i..dim {
                    let idx = block * tri + TriangleLayout::upper_index(dim, i, j);
                    let r = BigInt::from(pooled.r_upper[idx]);
                    let e = &secrets.matrix_noise[idx];
                    let val = match centering {
                        // What the user is left with after T - v' v'^T.
                        Centering::Mask => {
                            &n * r - BigInt::from(pooled.v[i]) * BigInt::from(pooled.v[j]) + e
                        }
                        Centering::DpMean => r + e,
                    };
                    t[i][j] = val.clone();
                    t[j][i] = val;
                }
            }
            t
        })
        .collect();
    let vec: Vec<BigInt> = match centering {
        Centering::Mask => pooled.v.iter().map(|&x| BigInt::from(x)).collect(),
        Centering::DpMean => pooled
            .v
            .iter()
            .zip(&secrets.vector_noise)
            .map(|(&x, e)| BigInt::from(x) + e)
            .collect(),
    };
    from_grid(
        layout, centering, projection, blocks, vec, pooled.n, frac_bits,
    )
}
