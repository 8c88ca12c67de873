//! The mask holder's calls ([`crate::holder`] decides; this stores and
//! answers). Every change is on disk before it is answered, under one lock for
//! all held studies: a holder takes one small call per owner and user.

use std::collections::HashMap;
use std::sync::Arc;

use dpca_common::secagg::held_mask_sum;
use dpca_common::study::{check_no_terminal_controls, StudyLayout, MAX_ID_BYTES};
use dpca_proto::v1;
use prost::Message;
use tonic::{Request, Response, Status};

use super::{blocking, ProxyService};
use crate::access::Action;
use crate::holder::{Deposit, HolderRefusal, MaskStudy};
use crate::refusal::Refusal;
use crate::store::{Store, StoreError};

/// A held study, with its mask sum once computed (kept, so a repeated fetch
/// costs nothing).
pub(crate) struct Holding {
    study: MaskStudy,
    /// Filled once, by the first fetch of the summed set; concurrent fetches
    /// wait for that one computation. A study held anew gets a cell of its own.
    sum: Arc<tokio::sync::OnceCell<Arc<Vec<Vec<u8>>>>>,
}

impl Holding {
    fn new(study: MaskStudy) -> Self {
        Self {
            study,
            sum: Arc::default(),
        }
    }
}

/// Every held study, by id.
pub(crate) type HeldTable = Arc<tokio::sync::Mutex<HashMap<String, Holding>>>;

/// Values per chunk of a mask sum: as many as a result chunk's ciphertexts
/// (each of those is twice as long).
const SUMS_PER_CHUNK: usize = 2 * dpca_proto::convert::CIPHERTEXTS_PER_CHUNK;

/// The stream a mask sum is answered with.
pub(crate) type MaskSumStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<v1::MaskSumChunk, Status>> + Send + 'static>,
>;

/// The held studies of `store`'s file; a record this build cannot read stops
/// the proxy at startup, naming it.
pub(crate) fn load_held(store: &Store) -> Result<HeldTable, StoreError> {
    let mut table = HashMap::new();
    for (id, bytes) in store.load_held()? {
        let study = MaskStudy::from_record(&id, &bytes).map_err(|e| store.record_error(&id, e))?;
        table.insert(id, Holding::new(study));
    }
    Ok(Arc::new(tokio::sync::Mutex::new(table)))
}

impl From<HolderRefusal> for Refusal {
    fn from(e: HolderRefusal) -> Self {
        match e {
            HolderRefusal::OpenedOtherwise(_)
            | HolderRefusal::NotInvited(_)
            | HolderRefusal::SecondSeed { .. }
            | HolderRefusal::OtherSet { .. } => Refusal::Denied(e.to_string()),
            HolderRefusal::NoMasks | HolderRefusal::OtherSpec { .. } | HolderRefusal::BadSet(_) => {
                Refusal::Invalid(e.to_string())
            }
            HolderRefusal::Summed(_) | HolderRefusal::Journaled(_) => {
                Refusal::WrongPhase(e.to_string())
            }
        }
    }
}

/// What the release journal records a study's mask sum under, beside the
/// studies this proxy released itself.
const JOURNAL_PREFIX: &str = "masks:";

/// Refuses an id too long to store or with terminal controls; a study's id
/// must be one the aggregating proxy gives (letters, digits, `-`, `_`, 128 at
/// most), which the release journal also takes after [`JOURNAL_PREFIX`].
fn check_id(what: &'static str, id: &str) -> Result<(), Refusal> {
    if what == "study_id" {
        return dpca_shell::invitation::check_study_id(id).map_err(Refusal::Invalid);
    }
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return Err(Refusal::Invalid(format!(
            "{what} must be 1 to {MAX_ID_BYTES} bytes, got {}",
            id.len()
        )));
    }
    check_no_terminal_controls(what, id).map_err(Refusal::Invalid)
}

/// Refuses a spec digest that is no SHA-256 in hex (it is echoed in refusals).
fn check_digest(digest: &str) -> Result<(), Refusal> {
    if digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(());
    }
    Err(Refusal::Invalid(
        "spec_digest must be a SHA-256 in 64 hex digits".into(),
    ))
}

impl ProxyService {
    /// Writes `study`'s record (no state file: nothing to write).
    async fn store_held(&self, study: &MaskStudy) -> Result<(), Refusal> {
        let Some(store) = self.store.clone() else {
            return Ok(());
        };
        let (id, record) = (study.id.clone(), study.to_record().encode_to_vec());
        blocking(move || {
            store
                .save_held(&id, record)
                .map_err(|e| Refusal::Unavailable(format!("held study {id} not stored: {e}")))
        })
        .await
    }

    /// HoldMasks: checks the spec as `OpenStudy` does, within the opener's
    /// limits, dropping its oldest ended held studies past those it may keep.
    pub(crate) async fn hold_masks_call(
        &self,
        req: Request<v1::HoldMasksRequest>,
    ) -> Result<Response<v1::HoldMasksResponse>, Status> {
        let peer = self.caller(&req)?;
        Self::authorize(peer.as_ref(), Action::OpenStudy)?;
        let req = req.into_inner();
        check_id("study_id", &req.study_id)?;
        let (spec, _) = self.checked_spec(req.spec)?;
        let (limits, now) = (&self.config.limits, self.config.clock.now_ms());
        if self.store.is_none() {
            return Err(Refusal::Denied(
                "this proxy keeps no state file: a restart would forget which sum it gave, so \
                 it holds no masks"
                    .into(),
            )
            .into());
        }
        if self.table()?.contains_key(&req.study_id) {
            return Err(Refusal::Denied(format!(
                "this proxy aggregates study {}: it does not hold its masks too",
                req.study_id
            ))
            .into());
        }
        let digest = dpca_shell::invitation::spec_digest(&spec);
        let user = peer.map(|p| p.name);
        let mut table = self.held.lock().await;
        if let Some(h) = table.get(&req.study_id) {
            h.study
                .reopened(&digest, user.as_deref())
                .map_err(Refusal::from)?;
            return Ok(Response::new(v1::HoldMasksResponse {}));
        }
        let journaled = self.journal.is_some();
        let held: Vec<_> = table
            .values()
            .map(|h| h.study.as_held(now, journaled))
            .collect();
        limits
            .check_open(&held, user.as_deref())
            .map_err(|e| Refusal::OverLimit(e.to_string()))?;
        let dropped = limits.ended_to_drop(&held, user.as_deref());
        let study =
            MaskStudy::open(req.study_id.clone(), spec, digest, user).map_err(Refusal::from)?;
        self.store_held(&study).await?;
        if let (Some(store), false) = (&self.store, dropped.is_empty()) {
            store
                .drop_held(dropped.clone())
                .map_err(|e| Refusal::Unavailable(e.to_string()))?;
        }
        for id in &dropped {
            table.remove(id);
        }
        tracing::info!(study = %req.study_id, "masks held");
        table.insert(req.study_id, Holding::new(study));
        Ok(Response::new(v1::HoldMasksResponse {}))
    }

    /// DepositSeed: an invited owner's seed, under the held spec's digest.
    pub(crate) async fn deposit_seed_call(
        &self,
        req: Request<v1::DepositSeedRequest>,
    ) -> Result<Response<v1::DepositSeedResponse>, Status> {
        let peer = self.caller(&req)?;
        let req = req.into_inner();
        Self::authorize(
            peer.as_ref(),
            Action::Contribute {
                owner_id: &req.owner_id,
            },
        )?;
        check_id("owner_id", &req.owner_id)?;
        check_id("contribution_id", &req.contribution_id)?;
        check_digest(&req.spec_digest)?;
        let seed = <[u8; 32]>::try_from(req.seed.as_slice())
            .map_err(|_| Refusal::Invalid(format!("a seed is 32 bytes, got {}", req.seed.len())))?;
        let mut table = self.held.lock().await;
        let holding = table
            .get_mut(&req.study_id)
            .ok_or_else(|| Refusal::UnknownStudy(req.study_id.clone()))?;
        let deposit = Deposit {
            contribution_id: req.contribution_id,
            seed,
        };
        // A repeat is answered from memory, with nothing copied or written.
        let newly_held = holding
            .study
            .check_deposit(&req.owner_id, &req.spec_digest, &deposit)
            .map_err(Refusal::from)?;
        if newly_held {
            let mut next = holding.study.clone();
            next.seeds.insert(req.owner_id, deposit);
            self.store_held(&next).await?;
            holding.study = next;
        }
        Ok(Response::new(v1::DepositSeedResponse { newly_held }))
    }

    /// FetchMaskSum: the sum of the named owners' masks, for the study's user,
    /// once per study (the set on disk before the sum is sent).
    pub(crate) async fn fetch_mask_sum_call(
        &self,
        req: Request<v1::FetchMaskSumRequest>,
    ) -> Result<Response<MaskSumStream>, Status> {
        let peer = self.caller(&req)?;
        let req = req.into_inner();
        // On a task of its own: a caller that goes away cannot cut the journal,
        // the record and the memory apart, nor leave the sum uncomputed.
        let svc = self.clone();
        let sum = tokio::spawn(async move { svc.summed(peer, req).await })
            .await
            .map_err(|e| Refusal::Internal(format!("the mask sum's task failed: {e}")))??;
        Ok(Response::new(stream_of(sum)))
    }

    /// The sum of `req`'s owners' masks, recording the set on the first call.
    async fn summed(
        &self,
        peer: Option<dpca_shell::tls::Peer>,
        req: v1::FetchMaskSumRequest,
    ) -> Result<Arc<Vec<Vec<u8>>>, Refusal> {
        let mut table = self.held.lock().await;
        let holding = table
            .get_mut(&req.study_id)
            .ok_or_else(|| Refusal::UnknownStudy(req.study_id.clone()))?;
        Self::authorize(
            peer.as_ref(),
            Action::UseStudy {
                opened_by: holding.study.opened_by.as_deref(),
            },
        )?;
        let mut next = holding.study.clone();
        let seeds = next.release(&req.owners).map_err(Refusal::from)?;
        if holding.study.released.is_none() {
            self.journal_mask_sum(&req.study_id).await?;
            // Journaled, the set is the only one ever summed: kept in memory
            // even if the record's write fails, so a retry of it is answered.
            let stored = self.store_held(&next).await;
            holding.study = next.clone();
            stored?;
            tracing::info!(study = %req.study_id, owners = seeds.len(), "mask sum given");
        }
        let cell = Arc::clone(&holding.sum);
        // Computed with no lock held: the other held studies' calls go on.
        drop(table);
        let sum = cell
            .get_or_try_init(|| async { sum_of(&next, seeds).await.map(Arc::new) })
            .await?;
        Ok(Arc::clone(sum))
    }

    /// Journals study `id`'s mask sum, synced, before its set is stored: a
    /// state file put back from before it then gives no sum at all
    /// ([`HolderRefusal::Journaled`]).
    async fn journal_mask_sum(&self, id: &str) -> Result<(), Refusal> {
        let Some(journal) = self.journal.clone() else {
            return Ok(());
        };
        let key = format!("{JOURNAL_PREFIX}{id}");
        if journal.holds(&key) {
            return Err(Refusal::from(HolderRefusal::Journaled(id.to_string())));
        }
        self.journal_release(&key).await
    }
}

/// The masks of `seeds` summed over the study's owner plaintexts, each value
/// big-endian.
async fn sum_of(
    study: &MaskStudy,
    seeds: Vec<(String, [u8; 32])>,
) -> Result<Vec<Vec<u8>>, Refusal> {
    let layout = StudyLayout::new(&study.spec).map_err(|e| Refusal::Internal(e.to_string()))?;
    let n = study.spec.public_key.n().clone();
    let id = study.id.clone();
    blocking(move || {
        let owners: Vec<(&str, [u8; 32])> = seeds.iter().map(|(o, s)| (o.as_str(), *s)).collect();
        let sum = held_mask_sum(&owners, &id, layout.owner_ciphertexts(), &n);
        Ok(sum.iter().map(|v| v.to_bytes_be()).collect())
    })
    .await
}

/// `sum` in chunks, each encoded as its caller reads it.
fn stream_of(sum: Arc<Vec<Vec<u8>>>) -> MaskSumStream {
    let total = sum.len();
    let starts = (0..total).step_by(SUMS_PER_CHUNK);
    Box::pin(tokio_stream::StreamExt::map(
        tokio_stream::iter(starts),
        move |start| {
            let end = total.min(start + SUMS_PER_CHUNK);
            Ok(v1::MaskSumChunk {
                sums: sum.get(start..end).unwrap_or_default().to_vec(),
                total: if start == 0 { total as u32 } else { 0 },
            })
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A held study's id is one the journal can read back at a restart: a
    /// study id as the aggregating proxy gives them, nothing else.
    #[test]
    fn a_held_study_id_is_a_study_id_the_journal_reads_back() {
        assert!(check_id("study_id", "0123abcd-ef_9").is_ok());
        for bad in ["a b", "é", "", &"a".repeat(129)] {
            assert!(check_id("study_id", bad).is_err(), "{bad:?}");
        }
        assert!(
            check_id("owner_id", "hospital a").is_ok(),
            "owner ids as the proxy takes them"
        );
    }

    #[test]
    fn a_spec_digest_is_64_hex_digits() {
        assert!(check_digest(&"ab".repeat(32)).is_ok());
        for bad in ["", "ab", &"zz".repeat(32), &"ab".repeat(33)] {
            assert!(check_digest(bad).is_err(), "{bad:?}");
        }
    }
}
