//! The user's side of masked contributions ([`dpca_common::secagg`]): the
//! study held at its mask holder, and the sum of the counted owners' masks
//! fetched from it and checked, to take off the decrypted aggregate.

use std::time::Duration;

use anyhow::{bail, Context};
use dpca_common::paillier::PublicKey;
use dpca_common::study::{StudyLayout, StudySpec};
use dpca_proto::convert::spec_to_wire;
use dpca_proto::v1;
use dpca_shell::client::{answered, connect, CALL_TIMEOUT};
use dpca_shell::tls::Transport;
use num_bigint::BigUint;

/// Opens `study_id` (the aggregating proxy's id) at the spec's mask holder, if
/// it names one, before any owner is invited: an owner deposits its seed there
/// first, and only for this spec. A retry of the same opening is answered as
/// the first.
pub async fn hold_masks(
    spec: &StudySpec,
    study_id: &str,
    transport: &Transport,
) -> anyhow::Result<()> {
    let Some(holder) = &spec.mask_holder else {
        return Ok(());
    };
    let mut client = connect(holder, transport)
        .await
        .with_context(|| format!("the mask holder {holder}"))?;
    let call = client.hold_masks(v1::HoldMasksRequest {
        study_id: study_id.to_string(),
        spec: Some(spec_to_wire(spec)),
    });
    answered("the mask holder's answer", call)
        .await
        .map_err(|s| {
            anyhow::anyhow!(
                "the mask holder {holder} refused the study: {}",
                s.message()
            )
        })?;
    Ok(())
}

/// The sum of the masks of `owners` (those the proxy counted) from the spec's
/// mask holder, one value below n per plaintext an owner sends; `None` where
/// the spec names no holder. The holder gives one sum per study: asked again
/// (a retry), it answers the same owners alike.
pub async fn fetch_mask_sum(
    spec: &StudySpec,
    study_id: &str,
    owners: &[String],
    transport: &Transport,
) -> anyhow::Result<Option<Vec<BigUint>>> {
    let Some(holder) = &spec.mask_holder else {
        return Ok(None);
    };
    let layout = StudyLayout::new(spec)?;
    let mut client = connect(holder, transport)
        .await
        .with_context(|| format!("the mask holder {holder}"))?;
    let call = client.fetch_mask_sum(v1::FetchMaskSumRequest {
        study_id: study_id.to_string(),
        owners: owners.to_vec(),
    });
    let mut stream = answered("the mask holder's answer", call)
        .await
        .map_err(|s| anyhow::anyhow!("the mask holder {holder} gave no mask sum: {}", s.message()))?
        .into_inner();
    let mut chunks = Vec::new();
    while let Some(chunk) = next(&mut stream, CALL_TIMEOUT).await? {
        chunks.push(chunk);
    }
    let sum = read_sum(&chunks, layout.owner_ciphertexts(), &spec.public_key)
        .with_context(|| format!("the mask holder {holder}'s sum"))?;
    Ok(Some(sum))
}

/// The stream's next chunk, which must come within `patience`.
async fn next(
    stream: &mut tonic::Streaming<v1::MaskSumChunk>,
    patience: Duration,
) -> anyhow::Result<Option<v1::MaskSumChunk>> {
    tokio::time::timeout(patience, stream.message())
        .await
        .map_err(|_| anyhow::anyhow!("nothing came for {} s", patience.as_secs()))?
        .map_err(|s| anyhow::anyhow!("the stream failed: {}", s.message()))
}

/// `want` values, each below n, announced as that many by the first chunk;
/// anything else is refused before a value is used.
fn read_sum(
    chunks: &[v1::MaskSumChunk],
    want: usize,
    pk: &PublicKey,
) -> anyhow::Result<Vec<BigUint>> {
    let announced = chunks.first().map_or(0, |c| c.total as usize);
    if announced != want {
        bail!("it announced {announced} values, and the layout has {want}");
    }
    let mut out = Vec::with_capacity(want);
    for bytes in chunks.iter().flat_map(|c| &c.sums) {
        if out.len() == want {
            bail!("it sent more than {want} values");
        }
        let v = BigUint::from_bytes_be(bytes);
        if &v >= pk.n() {
            bail!("value {} is not below n", out.len());
        }
        out.push(v);
    }
    if out.len() != want {
        bail!("it sent {} of {want} values", out.len());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(total: u32, sums: &[u64]) -> v1::MaskSumChunk {
        v1::MaskSumChunk {
            sums: sums
                .iter()
                .map(|v| BigUint::from(*v).to_bytes_be())
                .collect(),
            total,
        }
    }

    /// A sum is taken only whole, of the layout's length, each value below n.
    #[test]
    fn a_sum_of_the_wrong_length_or_beyond_n_is_refused() {
        let pk = dpca_common::testing::test_key().public().clone();
        let ok = read_sum(&[chunk(3, &[1, 2]), chunk(0, &[3])], 3, &pk).expect("whole");
        assert_eq!(
            ok,
            vec![BigUint::from(1u8), BigUint::from(2u8), BigUint::from(3u8)]
        );
        for (chunks, what) in [
            (vec![chunk(2, &[1, 2])], "announced 2"),
            (vec![chunk(3, &[1, 2])], "sent 2 of 3"),
            (vec![chunk(3, &[1, 2, 3, 4])], "more than 3"),
        ] {
            let err = read_sum(&chunks, 3, &pk).expect_err(what);
            assert!(err.to_string().contains(what), "{err}");
        }
        let big = v1::MaskSumChunk {
            sums: vec![pk.n().to_bytes_be()],
            total: 1,
        };
        assert!(read_sum(&[big], 1, &pk).is_err());
    }
}
