//! The gRPC shell around the study state machine: each handler validates at the
//! edge, loads the study, applies one transition and replies.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dpca_common::dp::Centering;
use dpca_common::paillier::{Ciphertext, Opening, PublicKey};
use dpca_common::study::StudyLayout;
use dpca_proto::convert::{spec_from_wire, spec_to_wire, CIPHERTEXTS_PER_CHUNK};
use dpca_proto::v1;
use rand::rngs::OsRng;
use rand::RngCore;
use tokio::sync::Semaphore;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use dpca_proto::tls::{peer_of, Peer, Transport};

use crate::access::{permit, Action};
use crate::budget::{charge, BudgetError, OwnerBudget};
use crate::store::{Store, StoreError};
use crate::study::{ContributionOutcome, Phase, Study, StudyError};
use crate::ProxyConfig;

/// How often deadlines are checked and how often a waiting user re-checks.
const POLL: Duration = Duration::from_millis(50);

impl From<StudyError> for Status {
    fn from(e: StudyError) -> Self {
        let msg = e.to_string();
        match e {
            StudyError::Closed { .. } | StudyError::WrongPhase { .. } => {
                Status::failed_precondition(msg)
            }
            StudyError::DuplicateOwner { .. } => Status::already_exists(msg),
            StudyError::NotInvited { .. } => Status::permission_denied(msg),
            StudyError::WrongCount { .. }
            | StudyError::ImplausibleCount { .. }
            | StudyError::CountNeeded { .. }
            | StudyError::CountNotNeeded { .. } => Status::invalid_argument(msg),
            StudyError::BadOpening { .. } => Status::permission_denied(msg),
            StudyError::Release { .. } => Status::internal(msg),
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The proxy's gRPC service.
#[derive(Clone)]
pub struct ProxyService {
    config: ProxyConfig,
    studies: Arc<Mutex<HashMap<String, Study>>>,
    uploads: Arc<Semaphore>,
    store: Option<Arc<Store>>,
    /// Owner id -> privacy budget. Locked after `studies` when both are held.
    budgets: Arc<Mutex<HashMap<String, OwnerBudget>>>,
}

impl ProxyService {
    /// A service holding the studies of `config.state` (none without a state file).
    pub fn new(config: ProxyConfig) -> Result<Self, StoreError> {
        let mut studies = HashMap::new();
        let mut budgets = HashMap::new();
        let store = match &config.state {
            Some(path) => {
                let store = Store::open(path)?;
                budgets = store.load_budgets()?;
                for mut study in store.load_all()? {
                    study.tick(now_ms());
                    if study.noise_free && !config.allow_noise_free_for_testing {
                        // Opened by a proxy in test mode: never served by one that
                        // is not (its release, if any, holds no noise).
                        study.phase = Phase::Aborted(
                            "opened noise-free in test mode; this proxy is not in test mode".into(),
                        );
                    }
                    tracing::info!(
                        study = %study.id,
                        phase = study.phase.name(),
                        owners_in = study.owners_in().len(),
                        "study restored"
                    );
                    studies.insert(study.id.clone(), study);
                }
                Some(Arc::new(store))
            }
            None => None,
        };
        Ok(Self {
            uploads: Arc::new(Semaphore::new(config.max_concurrent_uploads.max(1))),
            config,
            studies: Arc::new(Mutex::new(studies)),
            store,
            budgets: Arc::new(Mutex::new(budgets)),
        })
    }

    fn lock_budgets(&self) -> Result<MutexGuard<'_, HashMap<String, OwnerBudget>>, Status> {
        self.budgets
            .lock()
            .map_err(|_| Status::internal("budget table poisoned"))
    }

    fn budget_of(&self, owner: &str) -> Result<Option<OwnerBudget>, Status> {
        Ok(self.lock_budgets()?.get(owner).cloned())
    }

    /// Counts a read and validated contribution and charges the owner's budget:
    /// both on a copy, stored in one transaction, then made current.
    fn commit_contribution(
        &self,
        study_id: &str,
        owner: &str,
        cid: &str,
        cap: (f64, f64),
        cts: &[Ciphertext],
    ) -> Result<(ContributionOutcome, usize, Option<OwnerBudget>), Status> {
        self.with_study(study_id, |study| {
            let mut budgets = self.lock_budgets()?;
            let mut next = study.clone();
            let pk = next.spec.public_key.clone();
            let outcome = next.contribute(owner, cid, cts, |a, b| pk.add(a, b))?;
            let charged = match outcome {
                ContributionOutcome::Counted => {
                    let cost = (next.spec.privacy.epsilon, next.spec.privacy.delta);
                    Some(
                        charge(owner, budgets.get(owner), cap, study_id, cost)
                            .map_err(budget_status)?,
                    )
                }
                ContributionOutcome::AlreadyCounted => None,
            };
            self.persist(&next, charged.as_ref().map(|b| (owner, b)))?;
            let owners_in = next.owners_in().len();
            *study = next;
            if let Some(b) = charged {
                budgets.insert(owner.to_string(), b);
            }
            Ok((outcome, owners_in, budgets.get(owner).cloned()))
        })
    }

    /// Writes a study's record (and an owner's budget, in the same transaction);
    /// an error means the transition did not happen.
    fn persist(&self, study: &Study, budget: Option<(&str, &OwnerBudget)>) -> Result<(), Status> {
        match &self.store {
            Some(store) => store.save_with_budget(study, budget).map_err(|e| {
                tracing::error!(study = %study.id, error = %e, "state not stored");
                Status::unavailable(format!("the proxy could not store the study: {e}"))
            }),
            None => Ok(()),
        }
    }

    /// Applies a transition to a copy of the study, stores the copy, and only then
    /// makes it the study: what the caller is told has happened is on disk.
    fn update_study<T>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Study) -> Result<T, Status>,
    ) -> Result<T, Status> {
        self.with_study(id, |study| {
            let mut next = study.clone();
            let out = f(&mut next)?;
            self.persist(&next, None)?;
            *study = next;
            Ok(out)
        })
    }

    fn lock(&self) -> Result<MutexGuard<'_, HashMap<String, Study>>, Status> {
        self.studies
            .lock()
            .map_err(|_| Status::internal("study table poisoned"))
    }

    /// Applies deadlines in the background.
    pub fn spawn_deadline_ticker(&self) {
        let studies = Arc::clone(&self.studies);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(POLL).await;
                let Ok(mut map) = studies.lock() else { return };
                let now = now_ms();
                for s in map.values_mut() {
                    s.tick(now);
                }
                crate::metrics::phases(map.values().map(|s| s.phase.name()));
            }
        });
    }

    /// The caller as its certificate names it; `None` on plaintext.
    fn caller<T>(&self, req: &Request<T>) -> Result<Option<Peer>, Status> {
        if matches!(self.config.transport, Transport::InsecurePlaintext) {
            return Ok(None);
        }
        // The handshake already required a certificate from the CA; this reads it.
        let certs = req
            .peer_certs()
            .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
        let leaf = certs
            .first()
            .ok_or_else(|| Status::unauthenticated("empty client certificate chain"))?;
        peer_of(leaf)
            .map(Some)
            .map_err(|e| Status::unauthenticated(format!("client certificate: {e}")))
    }

    /// Refuses `action` unless the caller may do it.
    fn authorize(peer: Option<&Peer>, action: Action<'_>) -> Result<(), Status> {
        permit(peer, action).map_err(Status::permission_denied)
    }

    /// Refuses unless the caller is the user who opened study `id`.
    fn authorize_user(&self, peer: Option<&Peer>, id: &str) -> Result<(), Status> {
        let opened_by = self.with_study(id, |s| Ok(s.opened_by.clone()))?;
        Self::authorize(
            peer,
            Action::UseStudy {
                opened_by: opened_by.as_deref(),
            },
        )
    }

    fn with_study<T>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Study) -> Result<T, Status>,
    ) -> Result<T, Status> {
        let mut map = self.lock()?;
        let study = map
            .get_mut(id)
            .ok_or_else(|| Status::not_found(format!("unknown study `{id}`")))?;
        study.tick(now_ms());
        f(study)
    }
}

/// The user's opening of E[N] as the domain type; a root that does not even parse
/// as a residue is refused like any opening that does not verify.
fn opening_from_wire(pk: &PublicKey, o: &v1::CountOpening) -> Result<Opening, Status> {
    if o.root.len() > pk.ciphertext_bytes() {
        return Err(Status::invalid_argument(
            "the root of the count opening is too long",
        ));
    }
    Ok(Opening {
        plaintext: num_bigint::BigUint::from(o.n_rows),
        root: num_bigint::BigUint::from_bytes_be(&o.root),
    })
}

fn budget_status(e: BudgetError) -> Status {
    match e {
        BudgetError::InvalidCap { .. } => Status::invalid_argument(e.to_string()),
        BudgetError::Exhausted { .. } => Status::failed_precondition(e.to_string()),
    }
}

fn contribute_response(
    newly_counted: bool,
    owners_in: usize,
    budget: Option<&OwnerBudget>,
) -> v1::ContributeResponse {
    let mut r = v1::ContributeResponse {
        newly_counted,
        owners_in: owners_in as u32,
        ..Default::default()
    };
    if let Some(b) = budget {
        r.spent_epsilon = b.spent_epsilon;
        r.spent_delta = b.spent_delta;
        r.cap_epsilon = b.cap_epsilon;
        r.cap_delta = b.cap_delta;
    }
    r
}

type ResultStream = Pin<Box<dyn Stream<Item = Result<v1::ResultChunk, Status>> + Send>>;

#[tonic::async_trait]
impl v1::proxy_server::Proxy for ProxyService {
    async fn open_study(
        &self,
        req: Request<v1::OpenStudyRequest>,
    ) -> Result<Response<v1::OpenStudyResponse>, Status> {
        let peer = self.caller(&req)?;
        Self::authorize(peer.as_ref(), Action::OpenStudy)?;
        let req = req.into_inner();
        let wire = req
            .spec
            .ok_or_else(|| Status::invalid_argument("missing study spec"))?;
        let spec = spec_from_wire(&wire).map_err(|e| Status::invalid_argument(e.to_string()))?;
        if req.noise_free_for_testing && !self.config.allow_noise_free_for_testing {
            return Err(Status::permission_denied(
                "noise-free releases are refused: this proxy was not started in test mode",
            ));
        }
        if spec.deadline_unix_ms <= now_ms() {
            return Err(Status::invalid_argument("study deadline is in the past"));
        }
        let layout =
            StudyLayout::new(&spec).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let mut id_bytes = [0u8; 16];
        OsRng.fill_bytes(&mut id_bytes);
        let id = hex::encode(id_bytes);
        crate::metrics::study_opened();
        tracing::info!(study = %id, features = spec.dim(), quorum = spec.quorum, "study opened");
        let mut study = Study::new(id.clone(), spec, layout, req.noise_free_for_testing);
        study.opened_by = peer.map(|p| p.name);
        let mut map = self.lock()?;
        self.persist(&study, None)?;
        map.insert(id.clone(), study);
        Ok(Response::new(v1::OpenStudyResponse { study_id: id }))
    }

    async fn get_study(
        &self,
        req: Request<v1::GetStudyRequest>,
    ) -> Result<Response<v1::StudyInfo>, Status> {
        Self::authorize(self.caller(&req)?.as_ref(), Action::ReadSpec)?;
        let id = req.into_inner().study_id;
        self.with_study(&id, |s| {
            Ok(Response::new(v1::StudyInfo {
                study_id: s.id.clone(),
                spec: Some(spec_to_wire(&s.spec)),
                state: s.phase.name().to_string(),
                owners_in: s.owners_in().len() as u32,
                noise_free: s.noise_free,
            }))
        })
    }

    async fn contribute(
        &self,
        req: Request<Streaming<v1::ContributionChunk>>,
    ) -> Result<Response<v1::ContributeResponse>, Status> {
        let peer = self.caller(&req)?;
        let mut stream = req.into_inner();
        // Held until this contribution is counted or refused: bounds the ciphertexts
        // in memory whatever the number of owners uploading.
        let _permit = self
            .uploads
            .acquire()
            .await
            .map_err(|_| Status::unavailable("proxy is shutting down"))?;
        let first = stream
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty contribution stream"))?;
        let (study_id, owner, cid) = (
            first.study_id.clone(),
            first.owner_id.clone(),
            first.contribution_id.clone(),
        );
        if owner.is_empty() || cid.is_empty() {
            return Err(Status::invalid_argument(
                "owner_id and contribution_id are required",
            ));
        }
        Self::authorize(peer.as_ref(), Action::Contribute { owner_id: &owner })?;
        let cap = (first.cap_epsilon, first.cap_delta);
        // Refuse early, before reading the stream, when the contribution cannot count
        // or the owner's budget cannot pay for the study.
        let (pk, expected): (PublicKey, usize) = {
            let pre = self.with_study(&study_id, |s| {
                let outcome = s.check_can_contribute(&owner, &cid)?;
                Ok((
                    outcome,
                    s.spec.public_key.clone(),
                    s.layout.owner_ciphertexts(),
                    s.owners_in().len(),
                    (s.spec.privacy.epsilon, s.spec.privacy.delta),
                ))
            })?;
            let current = self.budget_of(&owner)?;
            if let (Some(ContributionOutcome::AlreadyCounted), _, _, owners_in, _) = pre {
                return Ok(Response::new(contribute_response(
                    false,
                    owners_in,
                    current.as_ref(),
                )));
            }
            charge(&owner, current.as_ref(), cap, &study_id, pre.4).map_err(budget_status)?;
            (pre.1, pre.2)
        };
        if first.total_ciphertexts as usize != expected {
            return Err(Status::invalid_argument(format!(
                "contribution announces {} ciphertexts, study {study_id} expects {expected}",
                first.total_ciphertexts
            )));
        }
        let mut cts: Vec<Ciphertext> = Vec::with_capacity(expected);
        let mut chunk = Some(first);
        while let Some(c) = chunk {
            if cts.len() + c.ciphertexts.len() > expected {
                return Err(Status::invalid_argument(format!(
                    "more than {expected} ciphertexts"
                )));
            }
            let parsed = pk
                .ciphertexts_from_bytes(&c.ciphertexts, cts.len())
                .map_err(|e| Status::invalid_argument(format!("owner `{owner}`: {e}")))?;
            cts.extend(parsed);
            chunk = stream.message().await?;
        }
        if cts.len() != expected {
            return Err(Status::invalid_argument(format!(
                "stream ended after {} of {expected} ciphertexts; nothing was counted",
                cts.len()
            )));
        }
        // Acknowledged only once stored, with its charge.
        let (outcome, owners_in, budget) =
            self.commit_contribution(&study_id, &owner, &cid, cap, &cts)?;
        crate::metrics::contribution(
            outcome == ContributionOutcome::Counted,
            cts.len() * pk.ciphertext_bytes(),
        );
        tracing::info!(study = %study_id, owner = %owner, owners_in, "contribution counted");
        Ok(Response::new(contribute_response(
            outcome == ContributionOutcome::Counted,
            owners_in,
            budget.as_ref(),
        )))
    }

    async fn await_seal(
        &self,
        req: Request<v1::AwaitSealRequest>,
    ) -> Result<Response<v1::SealedStudy>, Status> {
        let peer = self.caller(&req)?;
        let id = req.into_inner().study_id;
        self.authorize_user(peer.as_ref(), &id)?;
        loop {
            let ready = self.with_study(&id, |s| match &s.phase {
                Phase::Collecting => Ok(None),
                Phase::Aborted(reason) => Err(Status::failed_precondition(format!(
                    "study {id} aborted: {reason}"
                ))),
                Phase::Sealed | Phase::Released(_) => {
                    let count = s
                        .encrypted_count()
                        .ok_or_else(|| Status::internal("empty aggregate"))?;
                    // As aggregated, not re-randomized: the user's opening is checked
                    // against this very ciphertext, and the key holder could strip
                    // any re-randomization anyway.
                    Ok(Some(v1::SealedStudy {
                        encrypted_count: s.spec.public_key.ciphertext_to_bytes(count),
                        owners_in: s.owners_in(),
                        owners_missing: s.owners_missing(),
                        needs_count: s.spec.privacy.centering == Centering::Mask,
                    }))
                }
            })?;
            if let Some(sealed) = ready {
                return Ok(Response::new(sealed));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn release(
        &self,
        req: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseResponse>, Status> {
        let peer = self.caller(&req)?;
        let req = req.into_inner();
        let id = req.study_id;
        self.authorize_user(peer.as_ref(), &id)?;
        // Checked on a copy, off the lock of all studies: the opening costs a full
        // exponentiation, and `commit_release` re-checks the phase under the lock.
        let snapshot = self.with_study(&id, |s| Ok(s.clone()))?;
        let opening = req
            .count
            .as_ref()
            .map(|o| opening_from_wire(&snapshot.spec.public_key, o))
            .transpose()?;
        let n_rows = snapshot.check_release(opening.as_ref())?;
        let started = std::time::Instant::now();
        let released = tokio::task::spawn_blocking(move || {
            let compute = || snapshot.compute_release(n_rows, &mut OsRng);
            let released = if snapshot.layout.baseline {
                // The baseline runs the paper's way, on one thread.
                rayon::ThreadPoolBuilder::new()
                    .num_threads(1)
                    .build()
                    .map_err(|e| Status::internal(format!("thread pool: {e}")))?
                    .install(compute)
            } else {
                compute()
            };
            released.map_err(Status::from)
        })
        .await
        .map_err(|e| Status::internal(format!("release task failed: {e}")))??;
        // Stored before it can be served: a restart serves this release again.
        self.update_study(&id, |s| Ok(s.commit_release(released)?))?;
        let seconds = started.elapsed().as_secs_f64();
        crate::metrics::release(seconds);
        tracing::info!(study = %id, seconds, "release computed");
        Ok(Response::new(v1::ReleaseResponse {}))
    }

    async fn status(
        &self,
        req: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::ProxyStatus>, Status> {
        let peer = self.caller(&req)?;
        Self::authorize(peer.as_ref(), Action::Status)?;
        // A user sees the studies it opened; the operator (or plaintext) sees all.
        let only = peer
            .as_ref()
            .filter(|p| p.role == dpca_proto::tls::Role::User)
            .map(|p| p.name.clone());
        let now = now_ms();
        let mut studies: Vec<v1::StudySummary> = {
            let mut map = self.lock()?;
            map.values_mut()
                .filter(|s| only.is_none() || s.opened_by == only)
                .map(|s| {
                    s.tick(now);
                    v1::StudySummary {
                        study_id: s.id.clone(),
                        state: s.phase.name().to_string(),
                        owners_in: s.owners_in(),
                        owners_missing: s.owners_missing(),
                        min_owners: s.spec.min_owners,
                        quorum: s.spec.quorum,
                        deadline_unix_ms: s.spec.deadline_unix_ms,
                        mechanism: s.spec.privacy.mechanism.name().to_string(),
                        epsilon: s.spec.privacy.epsilon,
                        delta: s.spec.privacy.delta,
                        opened_by: s.opened_by.clone().unwrap_or_default(),
                    }
                })
                .collect()
        };
        studies.sort_by_key(|s| std::cmp::Reverse(s.deadline_unix_ms));
        let mut budgets: Vec<v1::OwnerBudgetSummary> = if only.is_none() {
            self.lock_budgets()?
                .iter()
                .map(|(owner, b)| v1::OwnerBudgetSummary {
                    owner_id: owner.clone(),
                    spent_epsilon: b.spent_epsilon,
                    spent_delta: b.spent_delta,
                    cap_epsilon: b.cap_epsilon,
                    cap_delta: b.cap_delta,
                    studies: b.studies.len() as u32,
                })
                .collect()
        } else {
            Vec::new()
        };
        budgets.sort_by(|a, b| a.owner_id.cmp(&b.owner_id));
        Ok(Response::new(v1::ProxyStatus { studies, budgets }))
    }

    type FetchResultStream = ResultStream;

    async fn fetch_result(
        &self,
        req: Request<v1::FetchResultRequest>,
    ) -> Result<Response<ResultStream>, Status> {
        let peer = self.caller(&req)?;
        let id = req.into_inner().study_id;
        self.authorize_user(peer.as_ref(), &id)?;
        let chunks = self.with_study(&id, |s| {
            let Phase::Released(r) = &s.phase else {
                return Err(Status::failed_precondition(format!(
                    "study {id} is {}: no result yet",
                    s.phase.name()
                )));
            };
            let pk = &s.spec.public_key;
            let grid = f64::from(s.spec.fixed.frac_bits).exp2();
            // The mask release is N S~ (N proven at the release); dp-mean's is S~.
            let scale = r.n_rows.unwrap_or(1) as f64 * grid * grid;
            let total = r.ciphertexts.len() as u32;
            let grid_scale = r.plan.matrix.grid_parameter().to_string();
            let mut out = Vec::new();
            for (k, part) in r.ciphertexts.chunks(CIPHERTEXTS_PER_CHUNK).enumerate() {
                let mut chunk = v1::ResultChunk {
                    ciphertexts: part.iter().map(|c| pk.ciphertext_to_bytes(c)).collect(),
                    ..Default::default()
                };
                if k == 0 {
                    chunk.n_rows = r.n_rows.unwrap_or(0);
                    chunk.noise_scale_grid = grid_scale.clone();
                    chunk.noise_scale = r.plan.matrix.std_dev() / scale;
                    chunk.n_owners = r.owners.len() as u32;
                    chunk.total_ciphertexts = total;
                }
                out.push(Ok(chunk));
            }
            Ok(out)
        })?;
        Ok(Response::new(Box::pin(tokio_stream::iter(chunks))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::study::tests::study;

    fn config(state: &std::path::Path, test_mode: bool) -> ProxyConfig {
        ProxyConfig {
            transport: Transport::InsecurePlaintext,
            state: Some(state.to_path_buf()),
            allow_noise_free_for_testing: test_mode,
            max_concurrent_uploads: 1,
        }
    }

    #[test]
    fn a_noise_free_study_is_not_served_by_a_proxy_restarted_out_of_test_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.redb");
        let mut s = study(2, 1);
        s.noise_free = true;
        s.spec.deadline_unix_ms = u64::MAX;
        Store::open(&path)
            .expect("store")
            .save_with_budget(&s, None)
            .expect("save");
        let phase =
            |svc: &ProxyService| svc.with_study("s1", |s| Ok(s.phase.name())).expect("study");
        assert_eq!(
            phase(&ProxyService::new(config(&path, true)).expect("test mode")),
            "collecting"
        );
        assert_eq!(
            phase(&ProxyService::new(config(&path, false)).expect("normal")),
            "aborted"
        );
    }
}
