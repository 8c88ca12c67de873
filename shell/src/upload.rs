//! An owner's upload, sent in its turn. An upload that finds every upload slot of
//! the proxy taken is refused after a moment (the proxy does not leave an upload
//! waiting long with its stream open: its `service::upload_slot`); the owner
//! then waits for a slot in `ReserveUpload`, whose request holds nothing else,
//! and sends again.

use std::sync::Arc;

use dpca_proto::upload_slot::asks_to_reserve;
use dpca_proto::v1;
use dpca_proto::v1::proxy_client::ProxyClient;
use tonic::transport::Channel;

/// How many times one upload reserves a slot. Once is the rule: the proxy keeps
/// the slot for the owner's next upload for a lease (10 s); a second refusal
/// means the upload came after the lease ran out, or the proxy restarted (kept
/// slots live in its memory only).
pub const MAX_RESERVATIONS: usize = 3;

/// Which call of an upload the proxy refused, and its status.
#[derive(Debug)]
pub enum UploadRefusal {
    /// The upload itself (`Contribute`).
    Contribute(tonic::Status),
    /// The wait for a slot (`ReserveUpload`).
    Reserve(tonic::Status),
}

impl UploadRefusal {
    /// The proxy's status.
    pub fn status(&self) -> &tonic::Status {
        match self {
            UploadRefusal::Contribute(s) | UploadRefusal::Reserve(s) => s,
        }
    }
}

/// Sends `chunks` as one contribution, reserving a slot for it (the study, owner
/// and contribution its first chunk names) and sending again each time the
/// proxy answers that every slot is taken, at most [`MAX_RESERVATIONS`] times.
/// Each chunk is copied as it is sent, so the chunks are held once however often
/// they are sent.
pub async fn contribute_in_turn(
    client: &mut ProxyClient<Channel>,
    chunks: Arc<Vec<v1::ContributionChunk>>,
) -> Result<v1::ContributeResponse, UploadRefusal> {
    let slot = chunks
        .first()
        .map_or_else(Default::default, |c| v1::ReserveUploadRequest {
            study_id: c.study_id.clone(),
            owner_id: c.owner_id.clone(),
            contribution_id: c.contribution_id.clone(),
        });
    let mut reserved = 0;
    loop {
        let stream = {
            let chunks = Arc::clone(&chunks);
            tokio_stream::iter((0..chunks.len()).map(move |i| chunks[i].clone()))
        };
        match client.contribute(stream).await {
            Ok(answer) => return Ok(answer.into_inner()),
            Err(status) if asks_to_reserve(&status) && reserved < MAX_RESERVATIONS => {
                tracing::info!(reason = %status.message(), "waiting for an upload slot");
            }
            Err(status) => return Err(UploadRefusal::Contribute(status)),
        }
        client
            .reserve_upload(slot.clone())
            .await
            .map_err(UploadRefusal::Reserve)?;
        reserved += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A proxy that refuses every upload for want of a slot, however often the
    /// owner reserves one, does not keep it going round: the upload ends with
    /// the refusal after the last reservation.
    #[tokio::test]
    async fn an_owner_reserves_a_bounded_number_of_times() {
        let (mut client, reserved) = crate::testing::busy_proxy().await;
        let chunks = Arc::new(vec![v1::ContributionChunk::default()]);
        let send = contribute_in_turn(&mut client, chunks);
        let refused = crate::testing::gives_up(send).await;
        let UploadRefusal::Contribute(status) = refused else {
            panic!("a reservation was refused: {refused:?}");
        };
        assert!(
            dpca_proto::upload_slot::asks_to_reserve(&status),
            "{status:?}"
        );
        assert_eq!(
            reserved.load(std::sync::atomic::Ordering::Relaxed),
            MAX_RESERVATIONS
        );
    }
}
