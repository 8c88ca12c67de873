//! The data owner: reads its CSV, checks it against the study's public schema,
//! computes its exact integer share (R, v, N), encrypts it packed under the data
//! user's key and streams it to the proxy.
//!
//! Nothing leaves the process before the whole table has been read and validated and
//! the study's key matches the fingerprint the owner was given out of band: a bad cell
//! or a swapped key stops the owner with nothing sent.

mod attempts;
pub mod cli;
pub mod ledger;
pub mod work;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use dpca_common::data::{CsvBatches, DataError, Table};
use dpca_common::encoding::length_prefixed_into;
use dpca_common::paillier::Ciphertext;
use dpca_common::protocol::{ClassRows, Share, ShareNoise};
use dpca_common::randomizer::Randomizer;
use dpca_common::risk::Risk;
use dpca_common::secagg::add_held_masks;
use dpca_common::study::{StudyLayout, StudySpec, LAYOUT_VERSION, MAX_ID_BYTES};
use dpca_proto::convert::{spec_from_wire, spec_to_wire, CIPHERTEXTS_PER_CHUNK};
use dpca_proto::v1;
use dpca_proto::v1::proxy_client::ProxyClient;
use dpca_shell::client::{connect, status_message, transient, with_retries};
use dpca_shell::clock::{now_unix_ms, until_past};
use dpca_shell::invitation::{Invitation, InvitationError};
use dpca_shell::signed_count::signing_identity;
use dpca_shell::tls::Transport;
use dpca_shell::upload::{contribute_in_turn, UploadRefusal};
use dpca_shell::usage::Usage;
use hmac::{Hmac, Mac};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use num_bigint::BigUint;
use rand::rngs::OsRng;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use rayon::prelude::*;
use sha2::{Digest, Sha256};
use tonic::transport::Channel;

use attempts::{Attempts, Encrypted};

/// What the owner needs to take part in one study.
#[derive(Clone, Debug)]
pub struct OwnerConfig {
    /// Proxy URL, e.g. `https://localhost:50051`.
    pub proxy: String,
    /// Mutual TLS (the owner's certificate) or, asked for by name, plaintext.
    pub transport: Transport,
    /// Study to join.
    pub study_id: String,
    /// The owner's table.
    pub data: OwnerData,
    /// The owner's identity at the proxy (on TLS, its certificate's name:
    /// [`owner_id`]).
    pub owner_id: String,
    /// SHA-256 fingerprint of the data user's key, obtained out of band.
    pub key_fingerprint: String,
    /// Label column to leave out of the features, if any.
    pub label: Option<String>,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// How long to keep retrying while the proxy cannot be reached.
    pub retry_for: std::time::Duration,
    /// This data set's privacy budget cap (epsilon, delta) over all studies.
    pub budget_cap: (f64, f64),
    /// Study properties below the default protection this owner accepts
    /// ([`Risk`]); a study with any other is refused before the data is read.
    pub accepted_risks: Vec<Risk>,
    /// The most encryption work it takes on for one study; a study that asks more
    /// is refused before the data is read.
    pub work: work::WorkCap,
    /// This data set's own ledger of studies charged, kept beside the proxy's
    /// ([`ledger`]); a study it refuses is not uploaded.
    pub ledger: Option<ledger::Ledger>,
    /// SHA-256 of the spec the user opened, obtained out of band with the key
    /// fingerprint (the invitation's `spec-digest`): a served spec of another
    /// digest is refused. `None`: the served spec is taken as it comes.
    pub spec_digest: Option<String>,
    /// Where this owner's noise share comes from ([`NoiseSource`]): the
    /// operating system's randomness but in a simulation that replays it.
    pub noise_source: NoiseSource,
    /// The mask holder this owner's operator trusts, if it pins one
    /// (`--mask-holder`): a spec naming another, or none, is refused. `None`:
    /// the holder the spec names is taken as the user chose it.
    pub mask_holder: Option<String>,
}

/// The randomness of an owner's noise share.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NoiseSource {
    /// ChaCha20 keyed by [`noise_seed`] (every program): the same share for the
    /// same study, spec and data, however often the owner runs.
    #[default]
    Derived,
    /// ChaCha20 keyed by this seed, so that a simulation can draw the same share
    /// again and check the release to the bit.
    Seeded([u8; 32]),
    /// None at all: the test-only switch (`--test-adds-no-noise`) of an owner
    /// that works with the proxy and the user, to show what the others' shares
    /// alone give.
    NoneForTesting,
}

/// Where an owner's table comes from.
#[derive(Clone, Debug)]
pub enum OwnerData {
    /// A CSV file, read when the study is known.
    File(PathBuf),
    /// CSV bytes held in memory (a host's data frame: its rows are never written
    /// to disk), and the name messages give it.
    Csv {
        /// What messages call the table.
        name: String,
        /// The CSV text.
        bytes: Vec<u8>,
    },
}

impl OwnerData {
    /// The table's name in messages.
    fn name(&self) -> String {
        match self {
            Self::File(path) => path.display().to_string(),
            Self::Csv { name, .. } => name.clone(),
        }
    }

    /// A reader of the table's bytes, and their length: a file is read as it is
    /// used, never held whole.
    fn open(&self) -> anyhow::Result<(Box<dyn std::io::Read + Send + '_>, u64)> {
        match self {
            Self::File(path) => {
                let file = std::fs::File::open(path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                let len = file
                    .metadata()
                    .with_context(|| format!("cannot read {}", path.display()))?
                    .len();
                Ok((
                    Box::new(std::io::BufReader::with_capacity(1 << 16, file)),
                    len,
                ))
            }
            Self::Csv { bytes, .. } => Ok((Box::new(bytes.as_slice()), bytes.len() as u64)),
        }
    }

    /// The contribution id of these bytes ([`contribution_id`]), read in one pass.
    fn contribution_id(
        &self,
        secret: &[u8; 32],
        study_id: &str,
        owner_id: &str,
    ) -> anyhow::Result<String> {
        let (mut reader, len) = self.open()?;
        let mut mac = IdMac::new(secret, study_id, owner_id, len);
        std::io::copy(&mut reader, &mut mac)
            .with_context(|| format!("cannot read {}", self.name()))?;
        mac.finish().with_context(|| self.name())
    }
}

/// The HMAC of a contribution id, fed the data as it is read: the study, the
/// owner and the data's length first (as [`length_prefixed_into`] frames them),
/// then the bytes.
struct IdMac {
    mac: Hmac<Sha256>,
    declared: u64,
    seen: u64,
}

impl IdMac {
    fn new(secret: &[u8; 32], study_id: &str, owner_id: &str, len: u64) -> Self {
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes keys of any length");
        length_prefixed_into(&[study_id.as_bytes(), owner_id.as_bytes()], |b| {
            mac.update(b)
        });
        mac.update(&len.to_be_bytes());
        Self {
            mac,
            declared: len,
            seen: 0,
        }
    }

    fn update(&mut self, bytes: &[u8]) {
        self.mac.update(bytes);
        self.seen += bytes.len() as u64;
    }

    /// The id, if exactly the declared bytes were fed.
    fn finish(self) -> anyhow::Result<String> {
        if self.seen != self.declared {
            bail!(
                "the data changed while it was read: {} bytes, then {}",
                self.declared,
                self.seen
            );
        }
        Ok(self.digest())
    }

    /// The id of what was fed, whatever its length.
    fn digest(self) -> String {
        hex::encode(self.mac.finalize().into_bytes())
    }
}

impl std::io::Write for IdMac {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A reader that feeds what it reads to an [`IdMac`]: the share's pass over the
/// data checks it is the data the id was computed from.
struct Teed<'a, R> {
    inner: R,
    mac: &'a mut IdMac,
}

impl<R: std::io::Read> std::io::Read for Teed<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        std::io::Write::write_all(self.mac, &buf[..n])?;
        Ok(n)
    }
}

/// Takes part in the study the invitation at `path` names. The owner may start
/// before the user has opened the study, or find an invitation left from an
/// earlier one: it waits, up to `cfg.retry_for`, for the file to appear, and
/// while it names a study the proxy does not know, or one that no longer
/// collects, for a newer one. (A study that no longer collects is answered as
/// before once no newer invitation came: "already counted" for an owner whose
/// earlier run was counted in it.) An owner counted in a preparatory histogram
/// study (of each feature's values, or of the row norms) waits, within the same
/// `cfg.retry_for`, for the study that follows it, at most
/// [`PREPARATORY_STUDIES`] of them in a row, all under one key.
pub async fn run_invited(cfg: &OwnerConfig, path: &std::path::Path) -> anyhow::Result<OwnerReport> {
    let until = Instant::now() + cfg.retry_for;
    let mut stale: Option<Invitation> = None;
    // After a preparatory study: the key of the study this owner follows it to,
    // and how many preparatory studies it has taken part in.
    let mut following: Option<(String, usize)> = None;
    loop {
        let inv = match await_invitation(path, until, stale.as_ref()).await? {
            Some(inv) => inv,
            None => return stale_outcome(cfg, path, stale).await,
        };
        let cfg = invited(cfg, &inv);
        if following
            .as_ref()
            .is_some_and(|(key, _)| !key.eq_ignore_ascii_case(&inv.key_fingerprint))
        {
            bail!(
                "{}: the study after the preparatory histogram uses another key ({}); \
                 refusing to follow it",
                path.display(),
                inv.key_fingerprint
            );
        }
        if let Some(state) = closed_state(&cfg).await {
            tracing::info!(study = %inv.study, state, "the invitation names a study that no longer collects; waiting for a newer one");
            stale = Some(inv);
            continue;
        }
        let followed = following.as_ref().map_or(0, |(_, n)| *n);
        match run(&cfg).await {
            Err(e) if e.downcast_ref::<UnknownStudy>().is_some() && Instant::now() < until => {
                tracing::info!(study = %inv.study, "the invitation names an unknown study; waiting for a newer one");
                stale = Some(inv);
            }
            // A preparatory histogram chooses the bounds or the row bound of the
            // study that follows it, with the same owners: this owner waits for
            // that study's invitation. Followed under the same key, and no
            // further than a chain of PREPARATORY_STUDIES.
            Ok(report)
                if report.newly_counted && report.histogram && followed < PREPARATORY_STUDIES =>
            {
                tracing::info!(study = %inv.study, "counted in a preparatory histogram; waiting for the study that follows");
                following = Some((inv.key_fingerprint.clone(), followed + 1));
                stale = Some(inv);
            }
            other => return other,
        }
    }
}

/// Most preparatory histogram studies an invited owner follows in a row: the
/// marginal histograms that choose the bounds, then the row-norm histogram.
pub const PREPARATORY_STUDIES: usize = 2;

/// `cfg` for the study `inv` names.
fn invited(cfg: &OwnerConfig, inv: &Invitation) -> OwnerConfig {
    OwnerConfig {
        study_id: inv.study.clone(),
        key_fingerprint: inv.key_fingerprint.clone(),
        spec_digest: inv.spec_digest.clone(),
        ..cfg.clone()
    }
}

/// No newer invitation came: the last one's study is answered as it stands (an
/// unknown study is an error; a closed one says whether this owner is in it).
async fn stale_outcome(
    cfg: &OwnerConfig,
    path: &std::path::Path,
    stale: Option<Invitation>,
) -> anyhow::Result<OwnerReport> {
    let Some(inv) = stale else {
        bail!("{}: no invitation came (--retry-for)", path.display());
    };
    run(&invited(cfg, &inv)).await.map_err(|e| {
        e.context(format!(
            "{}: no newer invitation came (--retry-for)",
            path.display()
        ))
    })
}

/// The proxy's account of the invited study, `None` if it cannot give one now
/// (the run that follows reports why).
async fn study_info(cfg: &OwnerConfig) -> Option<v1::StudyInfo> {
    let mut client = connect(&cfg.proxy, &cfg.transport).await.ok()?;
    let req = v1::GetStudyRequest {
        study_id: cfg.study_id.clone(),
    };
    let call = client.get_study(req);
    Some(
        dpca_shell::client::answered("the study", call)
            .await
            .ok()?
            .into_inner(),
    )
}

/// The study's phase if it no longer collects; `None` while it collects, or if
/// the proxy cannot tell now.
async fn closed_state(cfg: &OwnerConfig) -> Option<String> {
    let info = study_info(cfg).await?;
    (info.state != "collecting").then_some(info.state)
}

/// Reads the invitation at `path` once it exists and differs from `stale`, waiting
/// until `until`; `None` if only `stale` was there by then.
async fn await_invitation(
    path: &std::path::Path,
    until: Instant,
    stale: Option<&Invitation>,
) -> anyhow::Result<Option<Invitation>> {
    let mut told = false;
    loop {
        let read = Invitation::read(path);
        let waiting = match &read {
            Err(InvitationError::Io { source, .. }) => {
                source.kind() == std::io::ErrorKind::NotFound
            }
            Ok(inv) => Some(inv) == stale,
            Err(_) => false,
        };
        match read {
            _ if waiting && Instant::now() < until => {
                if !told {
                    tracing::info!(file = %path.display(), "waiting for the invitation");
                    told = true;
                }
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
            Ok(_) if waiting => return Ok(None),
            Err(e) if waiting => bail!("{e}: no invitation came (--retry-for)"),
            other => return Ok(Some(other?)),
        }
    }
}

pub use dpca_shell::owner_report::{BudgetReport, OwnerReport};

/// The owner's id at the proxy: on TLS the name in its certificate (the proxy
/// accepts no other), which `--owner-id`, if given, must repeat; on plaintext the
/// id given.
pub fn owner_id(given: Option<&str>, transport: &Transport) -> anyhow::Result<String> {
    match (transport, given) {
        (Transport::Tls(tls), None) => Ok(tls.me.name.clone()),
        (Transport::Tls(tls), Some(id)) if id == tls.me.name => Ok(id.to_string()),
        (Transport::Tls(tls), Some(id)) => bail!(
            "--owner-id `{id}` is not the name in this owner's certificate (`{}`); the \
             proxy knows an owner by its certificate",
            tls.me.name
        ),
        (Transport::InsecurePlaintext, Some(id)) if id.len() > MAX_ID_BYTES => bail!(
            "--owner-id is {} bytes; the proxy hears from owners of at most {MAX_ID_BYTES}",
            id.len()
        ),
        (Transport::InsecurePlaintext, Some(id)) if !id.is_empty() => Ok(id.to_string()),
        (Transport::InsecurePlaintext, _) => {
            bail!(
                "--owner-id is required with --insecure-plaintext (no certificate names the owner)"
            )
        }
    }
}

/// The secret an owner's contribution ids are keyed with. On TLS it is derived from
/// the owner's private key, so it survives restarts (a restarted owner's retry is
/// recognised) and nobody else can compute it. On plaintext, which has no key, it is
/// drawn fresh: retries within the process are recognised, a restart is a new
/// contribution (refused as a duplicate once one was counted).
pub fn contribution_secret(transport: &Transport) -> [u8; 32] {
    match transport {
        Transport::Tls(tls) => Sha256::new()
            .chain_update(b"dpca contribution-id key v1")
            .chain_update(tls.private_key_pem())
            .finalize()
            .into(),
        Transport::InsecurePlaintext => {
            let mut secret = [0u8; 32];
            OsRng.fill_bytes(&mut secret);
            secret
        }
    }
}

/// Idempotency key of one contribution: HMAC-SHA256 under the owner's secret of
/// the study, the owner and the data file. The same owner retrying with the same
/// file for the same study is recognised; any other data is a different
/// contribution. The proxy stores the id, so it must not be a function of the data
/// alone: an unkeyed hash would let the proxy test guesses of the rows offline.
pub fn contribution_id(secret: &[u8; 32], study_id: &str, owner_id: &str, data: &[u8]) -> String {
    let mut mac = IdMac::new(secret, study_id, owner_id, data.len() as u64);
    mac.update(data);
    mac.digest()
}

/// The seed of an owner's noise share: HMAC-SHA256 under the owner's secret of
/// the study, the spec's digest and the contribution id. An owner run again on the
/// same data for the same study (a retry, a restart, an operator who runs it
/// twice) adds the same share, so whoever gets two of its uploads cannot average
/// two draws away; nobody without the owner's secret can compute it. On the
/// plaintext transport the secret, and so the share, is new per run.
pub fn noise_seed(
    secret: &[u8; 32],
    study_id: &str,
    spec_digest: &str,
    contribution_id: &str,
) -> [u8; 32] {
    derived_seed(
        b"dpca noise share v1",
        secret,
        study_id,
        spec_digest,
        contribution_id,
    )
}

/// The seed of an owner's held masks ([`dpca_common::secagg::held_masks`]),
/// derived as [`noise_seed`] is under another label: a rerun deposits the same
/// seed and masks alike, so the holder takes it again as a retry.
pub fn mask_seed(
    secret: &[u8; 32],
    study_id: &str,
    spec_digest: &str,
    contribution_id: &str,
) -> [u8; 32] {
    derived_seed(
        b"dpca held masks v1",
        secret,
        study_id,
        spec_digest,
        contribution_id,
    )
}

/// HMAC-SHA256 under `secret` of `label`, the study, the spec's digest and the
/// contribution id, each prefixed by its length.
fn derived_seed(
    label: &[u8],
    secret: &[u8; 32],
    study_id: &str,
    spec_digest: &str,
    contribution_id: &str,
) -> [u8; 32] {
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes keys of any length");
    let parts: [&[u8]; 4] = [
        label,
        study_id.as_bytes(),
        spec_digest.as_bytes(),
        contribution_id.as_bytes(),
    ];
    length_prefixed_into(&parts, |b| mac.update(b));
    mac.finalize().into_bytes().into()
}

/// Refuses a study that carries a risk this owner has not accepted by name.
pub fn check_risks(
    study_id: &str,
    spec: &StudySpec,
    noise_free: bool,
    accepted: &[Risk],
) -> anyhow::Result<()> {
    let refused: Vec<Risk> = Risk::of(spec, noise_free)
        .into_iter()
        .filter(|r| !accepted.contains(r))
        .collect();
    if refused.is_empty() {
        return Ok(());
    }
    let what: Vec<&str> = refused.iter().map(|r| r.trust()).collect();
    let flags: Vec<String> = refused
        .iter()
        .map(|r| format!("--accept-risk {}", r.name()))
        .collect();
    bail!(
        "study `{study_id}` {}: refusing to take part unless you accept it by name ({})",
        what.join("; and "),
        flags.join(" ")
    )
}

/// A study as the proxy serves it, its spec validated under the pinned key.
#[derive(Debug)]
pub struct Served {
    /// The spec.
    pub spec: StudySpec,
    /// The proxy's noise-free (test-mode) flag.
    pub noise_free: bool,
}

/// Fetches and validates the study and checks the pinned key fingerprint.
pub async fn fetch_study(
    client: &mut ProxyClient<Channel>,
    study_id: &str,
    fingerprint: &str,
) -> anyhow::Result<Served> {
    let call = client.get_study(v1::GetStudyRequest {
        study_id: study_id.to_string(),
    });
    let info = dpca_shell::client::answered("the study's spec", call)
        .await
        .map_err(|s| match s.code() {
            tonic::Code::NotFound => UnknownStudy(study_id.to_string()).into(),
            _ => refusal(format!("proxy refused study `{study_id}`"), &s),
        })?
        .into_inner();
    let wire = info.spec.context("proxy sent a study without a spec")?;
    // The key first (an honest proxy sends the modulus's canonical bytes; others
    // are refused): a study under a key this owner did not pin is refused before
    // its spec is validated, which squares the modulus and proves the layout's
    // slot widths (its size is counted, against this owner's cap, before the
    // layout is built: `WorkCap::layout`).
    let got = dpca_common::paillier::fingerprint_of_modulus(&wire.public_key);
    if !got.eq_ignore_ascii_case(fingerprint.trim()) {
        bail!(
            "study `{study_id}` uses a key with fingerprint {got}, not the pinned {}: refusing to encrypt for it",
            fingerprint.trim()
        );
    }
    let spec =
        spec_from_wire(&wire).with_context(|| format!("study `{study_id}` has an invalid spec"))?;
    if let Some(late) = now_unix_ms()
        .ok()
        .and_then(|now| collecting_past_deadline(&info.state, spec.deadline_unix_ms, now))
    {
        tracing::warn!(
            "the proxy still collects study `{study_id}` {:.0} s past its deadline on this \
             machine's clock: the two clocks differ, and this owner waits for its upload's \
             answer only {} s past the deadline on its own",
            late.as_secs_f64(),
            UPLOAD_GRACE.as_secs()
        );
    }
    Ok(Served {
        spec,
        noise_free: info.noise_free,
    })
}

/// Refuses a study with an invitation list that does not name this owner, before
/// its data is parsed or encrypted (the proxy would refuse the upload; a ledger
/// would have charged it).
fn check_invited(study_id: &str, spec: &StudySpec, owner_id: &str) -> anyhow::Result<()> {
    if spec.invites(owner_id) {
        return Ok(());
    }
    bail!(
        "study `{study_id}` invites {}, not `{owner_id}`: refusing to take part",
        dpca_shell::text::count(spec.expected_owners.len() as u64, "other owner")
    )
}

/// How far past the deadline on the owner's clock (`now_unix_ms`) a study the
/// proxy says is in `state` still collects; `None` if it is not collecting, or
/// the deadline has not passed here.
fn collecting_past_deadline(
    state: &str,
    deadline_unix_ms: u64,
    now_unix_ms: u64,
) -> Option<Duration> {
    (state == "collecting" && now_unix_ms > deadline_unix_ms)
        .then(|| Duration::from_millis(now_unix_ms - deadline_unix_ms))
}

/// The proxy does not know the study: a typo, or an invitation older than the
/// proxy's state (the owner may wait for a newer one).
#[derive(Debug, thiserror::Error)]
#[error("unknown study `{0}` at the proxy")]
pub struct UnknownStudy(pub String);

/// Signs E[N_i], the last ciphertext of the stream, into the first chunk.
fn sign_count_into(
    chunks: &mut [v1::ContributionChunk],
    key_pem: &[u8],
    study_id: &str,
    key_fingerprint: &str,
) -> anyhow::Result<()> {
    let count = chunks
        .last()
        .and_then(|c| c.ciphertexts.last())
        .context("a contribution without E[N_i]")?;
    let signature =
        dpca_shell::signed_count::sign_count(key_pem, study_id, key_fingerprint, count)?;
    if let Some(first) = chunks.first_mut() {
        first.count_signature = signature;
    }
    Ok(())
}

/// The proxy could not be reached or the connection broke: worth retrying (a
/// contribution is idempotent by its id). A refused certificate is not this.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unreachable(String);

/// A refusal as an error: [`Unreachable`] when the call may succeed if retried.
fn refusal(what: String, status: &tonic::Status) -> anyhow::Error {
    let msg = format!("{what}: {}", status_message(status));
    if transient(status) {
        Unreachable(msg).into()
    } else {
        anyhow::anyhow!(msg)
    }
}

/// Runs one owner's part of a study end to end. While the proxy cannot be reached
/// (restarting, or the connection broke mid-stream) it tries again, for up to
/// `cfg.retry_for`: the retry carries the same contribution id, so the proxy
/// counts it once however often it arrives, and the same ciphertexts, encrypted
/// once (the module `attempts`).
pub async fn run(cfg: &OwnerConfig) -> anyhow::Result<OwnerReport> {
    let start = Instant::now();
    let unreachable = |e: &anyhow::Error| e.downcast_ref::<Unreachable>().is_some();
    // Drawn once, so every retry of this run carries the same contribution id.
    let secret = contribution_secret(&cfg.transport);
    let attempts = Attempts::default();
    with_retries(cfg.retry_for, unreachable, || {
        run_once(cfg, &secret, &attempts, start)
    })
    .await
    .map_err(|e| {
        if unreachable(&e) {
            e.context(format!(
                "gave up after {:.0} s of retries",
                start.elapsed().as_secs_f64()
            ))
        } else {
            e
        }
    })
}

/// The connection to the proxy; a failure a retry may mend is [`Unreachable`].
async fn connect_for_retry(cfg: &OwnerConfig) -> anyhow::Result<ProxyClient<Channel>> {
    connect(&cfg.proxy, &cfg.transport).await.map_err(|e| {
        if e.transient() {
            anyhow::Error::new(Unreachable(e.to_string()))
        } else {
            e.into()
        }
    })
}

/// One attempt of the run begun at `start`: the spec fetched and checked, the
/// share encrypted (or the one an earlier attempt encrypted for the same data and
/// spec taken up again), and uploaded.
async fn run_once(
    cfg: &OwnerConfig,
    secret: &[u8; 32],
    attempts: &Attempts,
    start: Instant,
) -> anyhow::Result<OwnerReport> {
    attempts.begin();
    // A data file that cannot be opened is named before the proxy is called.
    drop(cfg.data.open()?);
    let mut client = connect_for_retry(cfg).await?;
    let served = fetch_study(&mut client, &cfg.study_id, &cfg.key_fingerprint).await?;
    let spec = served.spec;
    let digest = dpca_shell::invitation::spec_digest(&spec);
    check_spec_digest(&cfg.study_id, &digest, cfg.spec_digest.as_deref())?;
    check_risks(&cfg.study_id, &spec, served.noise_free, &cfg.accepted_risks)?;
    check_invited(&cfg.study_id, &spec, &cfg.owner_id)?;
    let layout = cfg.work.layout(&cfg.study_id, &spec)?;
    let id = cfg
        .data
        .contribution_id(secret, &cfg.study_id, &cfg.owner_id)?;
    let wire = spec_to_wire(&spec);
    let seed = match cfg.noise_source {
        NoiseSource::Derived => Some(noise_seed(secret, &cfg.study_id, &digest, &id)),
        NoiseSource::Seeded(seed) => Some(seed),
        NoiseSource::NoneForTesting => None,
    };
    let masks = deposit_mask_seed(cfg, &spec, secret, (&digest, &id)).await?;
    let kept = attempts
        .kept_for(&id, (&wire, served.noise_free))
        .with_context(|| format!("study `{}`", cfg.study_id))?;
    let encrypted = match kept {
        Some(kept) => kept,
        None => {
            let (encrypted, seconds) = encrypt_share(
                cfg,
                (&spec, served.noise_free, seed, masks),
                &layout,
                secret,
                id.clone(),
            )
            .await?;
            attempts.record_encryption(id, (wire, served.noise_free), encrypted.clone(), seconds);
            encrypted
        }
    };
    let ledger = charge_ledger(cfg, &spec).await?;
    let wait = upload_wait(spec.deadline_unix_ms, now_unix_ms()?);
    let response = upload(&mut client, encrypted.chunks.clone(), wait).await?;
    let (tally, ciphertexts) = (attempts.tally(), encrypted.ciphertexts());
    Ok(OwnerReport {
        owner_id: cfg.owner_id.clone(),
        rows: encrypted.rows,
        clipped_rows: encrypted.clipped_rows,
        ciphertexts,
        bytes: ciphertexts * spec.public_key.ciphertext_bytes(),
        newly_counted: response.newly_counted,
        histogram: spec.norm_bins.is_some() || spec.marginals.is_some(),
        seconds_encrypt: tally.seconds_encrypting,
        seconds_total: start.elapsed().as_secs_f64(),
        attempts: tally.attempts,
        encryptions: tally.encryptions,
        usage: Usage::of_self(),
        budget: (response.cap_epsilon > 0.0).then_some(BudgetReport {
            spent_epsilon: response.spent_epsilon,
            spent_delta: response.spent_delta,
            cap_epsilon: response.cap_epsilon,
            cap_delta: response.cap_delta,
        }),
        ledger,
    })
}

/// Charges the study to the owner's own ledger, if it keeps one, before anything
/// is sent (off the runtime: it may wait its turn behind another run's charge).
/// Whatever state the proxy says the study is in: a proxy that said a study had
/// stopped collecting and counted the upload all the same would otherwise have
/// the rows enter it uncharged.
async fn charge_ledger(
    cfg: &OwnerConfig,
    spec: &StudySpec,
) -> anyhow::Result<Option<BudgetReport>> {
    let Some(ledger) = cfg.ledger.clone() else {
        return Ok(None);
    };
    let (owner, fingerprint, study) = (
        cfg.owner_id.clone(),
        cfg.key_fingerprint.clone(),
        cfg.study_id.clone(),
    );
    let (spec, cap) = (spec.clone(), cfg.budget_cap);
    let b = tokio::task::spawn_blocking(move || {
        ledger.charge(&owner, &fingerprint, &study, &spec, cap)
    })
    .await
    .context("the ledger's task panicked")??;
    Ok(Some(BudgetReport::from(&b)))
}

/// The owner's table read from `bytes`, checked against `spec` (of `layout`),
/// and its share encrypted off the async runtime into the chunks of its upload under
/// `contribution_id`; with the wall seconds the encryption took. Everything is
/// encrypted before the upload starts: the proxy gives each upload an allowance
/// of time for its bytes (`--min-upload-rate`), so an upload slot is held for the
/// transfer only, however slow the encryption.
async fn encrypt_share(
    cfg: &OwnerConfig,
    (spec, noise_free, seed, masks): (&StudySpec, bool, Option<[u8; 32]>, Option<[u8; 32]>),
    layout: &StudyLayout,
    secret: &[u8; 32],
    contribution_id: String,
) -> anyhow::Result<(Encrypted, f64)> {
    let noise = noise_share(spec, layout, noise_free, seed)?;
    let name = cfg.data.name();
    let (reader, len) = cfg.data.open()?;
    // The bytes the share is read from are the bytes the id was computed from.
    let mut mac = IdMac::new(secret, &cfg.study_id, &cfg.owner_id, len);
    let teed = Teed {
        inner: reader,
        mac: &mut mac,
    };
    let mut prepared = prepare_share(
        spec,
        layout,
        teed,
        &name,
        cfg.label.as_deref(),
        noise.as_ref(),
    )?;
    if mac.finish().with_context(|| name.clone())? != contribution_id {
        bail!("{name}: the data changed while it was read; run the owner again");
    }
    if let Some(seed) = masks {
        let (study, owner, n) = (&cfg.study_id, &cfg.owner_id, spec.public_key.n());
        add_held_masks(&mut prepared.plaintexts, &seed, study, owner, n)
            .context("masking the share")?;
    }
    let bar = progress_bar(cfg.progress, prepared.plaintexts.len() as u64);
    let job = EncryptJob::new(
        cfg,
        spec.clone(),
        prepared.plaintexts,
        contribution_id,
        bar.clone(),
    );
    let t = Instant::now();
    let chunks = tokio::task::spawn_blocking(move || job.run())
        .await
        .context("encryption task panicked")??;
    let seconds = t.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let encrypted = Encrypted {
        chunks: Arc::new(chunks),
        rows: prepared.rows,
        clipped_rows: prepared.clipped_rows,
    };
    Ok((encrypted, seconds))
}

/// How long past the study's deadline, on the owner's clock, the owner waits for
/// its upload's answer. The proxy counts nothing whose fold starts past the
/// deadline on its own clock: a new upload still waiting for a slot, or still
/// arriving, then can only be refused (a retry of one already counted is answered
/// before it would wait for a slot). The grace is for the fold and the write of
/// a contribution counted just before the deadline, and for a difference between
/// the two clocks.
const UPLOAD_GRACE: Duration = Duration::from_secs(300);

/// The longest the owner waits for its upload's answer, however far the study's
/// deadline: the deadline comes from the proxy's copy of the spec, which a proxy
/// that never answers could set centuries away. An honest proxy keeps an owner
/// waiting only for one of its upload slots (8 by default), each held for about
/// the 10 s a reserved slot waits for its upload and that upload's allowance
/// (`--min-upload-rate`: 210 s for a contribution at M = 1000 and 3072 bits), and
/// then the upload's fold and write, so two hours is about 260 such uploads
/// ahead, each at the slowest rate the proxy accepts.
const UPLOAD_WAIT_CAP: Duration = Duration::from_secs(2 * 3600);

/// How long an upload started at `now_unix_ms` waits for its answer: until
/// [`UPLOAD_GRACE`] past the study's deadline, and at most [`UPLOAD_WAIT_CAP`].
fn upload_wait(deadline_unix_ms: u64, now_unix_ms: u64) -> Duration {
    until_past(deadline_unix_ms, now_unix_ms, UPLOAD_GRACE).min(UPLOAD_WAIT_CAP)
}

/// Sends the contribution, in its turn for an upload slot, and waits `within` for
/// the proxy's answer: a proxy that takes the upload and never answers does not
/// hold the owner forever (nor one that keeps it waiting for a slot past the
/// study's deadline). No answer is not retried: the proxy may
/// have counted the contribution, and says so to a retry only if it answers at
/// all.
async fn upload(
    client: &mut ProxyClient<Channel>,
    chunks: Arc<Vec<v1::ContributionChunk>>,
    within: Duration,
) -> anyhow::Result<v1::ContributeResponse> {
    let send = contribute_in_turn(client, chunks);
    match tokio::time::timeout(within, send).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(UploadRefusal::Contribute(s))) => {
            Err(refusal("proxy refused the contribution".into(), &s))
        }
        Ok(Err(UploadRefusal::Reserve(s))) => Err(refusal(
            "proxy refused to reserve an upload slot".into(),
            &s,
        )),
        Err(_) => bail!(
            "the proxy gave no answer to the upload within {:.0} s: it may have counted \
             the contribution; running the owner again asks (the proxy counts a \
             contribution once)",
            within.as_secs_f64()
        ),
    }
}

/// An owner's share, ready to encrypt: its plaintexts, with what the report says
/// of the rows.
pub struct PreparedShare {
    /// The plaintexts to encrypt, in layout order.
    pub plaintexts: Vec<BigUint>,
    /// Data rows read.
    pub rows: u64,
    /// Rows the row-norm clip shortened.
    pub clipped_rows: usize,
}

/// Where the spec names a mask holder: checks it against the one this owner
/// pins, if any, and deposits the seed of this contribution's masks with it
/// before anything is encrypted; returns the seed. `None` where the spec names
/// no holder (and this owner pins none).
async fn deposit_mask_seed(
    cfg: &OwnerConfig,
    spec: &StudySpec,
    secret: &[u8; 32],
    (digest, contribution_id): (&str, &str),
) -> anyhow::Result<Option<[u8; 32]>> {
    let holder = check_mask_holder(&cfg.study_id, spec, &cfg.proxy, cfg.mask_holder.as_deref())?;
    let Some(holder) = holder else {
        return Ok(None);
    };
    let seed = mask_seed(secret, &cfg.study_id, digest, contribution_id);
    let mut client = connect(holder, &cfg.transport).await.map_err(|e| {
        if e.transient() {
            anyhow::Error::new(Unreachable(format!("the mask holder {holder}: {e}")))
        } else {
            anyhow::Error::new(e).context(format!("the mask holder {holder}"))
        }
    })?;
    let call = client.deposit_seed(v1::DepositSeedRequest {
        study_id: cfg.study_id.clone(),
        owner_id: cfg.owner_id.clone(),
        contribution_id: contribution_id.to_string(),
        spec_digest: digest.to_string(),
        seed: seed.to_vec(),
    });
    match dpca_shell::client::answered("the mask holder's answer", call).await {
        Ok(_) => Ok(Some(seed)),
        Err(status) if status.code() == tonic::Code::Unavailable => Err(anyhow::Error::new(
            Unreachable(format!("the mask holder {holder}: {}", status.message())),
        )),
        Err(status) => Err(refusal(
            format!("the mask holder {holder} refused the seed"),
            &status,
        )),
    }
}

/// The mask holder to deposit with: the spec's, which must be this owner's
/// pinned one where it pins one, and not the aggregating `proxy` itself
/// (whose operator would then hold both the masks and the masked shares).
fn check_mask_holder<'a>(
    study_id: &str,
    spec: &'a StudySpec,
    proxy: &str,
    pinned: Option<&str>,
) -> anyhow::Result<Option<&'a str>> {
    let named = spec.mask_holder.as_deref();
    if let Some(want) = pinned {
        if named != Some(want) {
            bail!(
                "study `{study_id}` names {} as its mask holder, and this owner is pinned to \
                 {want} (--mask-holder); refusing",
                named.map_or("none".to_string(), |h| format!("`{h}`"))
            );
        }
    }
    if let Some(h) = named {
        if same_origin(h, proxy) {
            bail!(
                "study `{study_id}` names the proxy itself ({h}) as its mask holder: the \
                 masks would not hide the share from the proxy; refusing"
            );
        }
    }
    Ok(named)
}

/// Whether two URLs name the same scheme, host and port (case aside).
fn same_origin(a: &str, b: &str) -> bool {
    let origin = |u: &str| {
        u.parse::<tonic::codegen::http::Uri>().ok().map(|u| {
            let host = u.host().unwrap_or_default().to_ascii_lowercase();
            (u.scheme_str().map(str::to_owned), host, u.port_u16())
        })
    };
    match (origin(a), origin(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a.eq_ignore_ascii_case(b),
    }
}

/// The served spec is the one the user opened, where the owner was given its
/// digest: a proxy serving another (a larger `min_owners`, which shrinks each
/// owner's noise share; other bounds; another epsilon) is refused before the data
/// is parsed. `got` is the served spec's digest.
fn check_spec_digest(study_id: &str, got: &str, want: Option<&str>) -> anyhow::Result<()> {
    let Some(want) = want else {
        tracing::warn!(
            study = study_id,
            "no spec digest given (--spec-digest, or the invitation's spec-digest): the spec \
             the proxy serves is taken on its word"
        );
        return Ok(());
    };
    if !got.eq_ignore_ascii_case(want.trim()) {
        bail!(
            "study `{study_id}`: the proxy served a spec of digest {got}, not the {want} the \
             user's invitation names; refusing (docs/PRIVACY.md, \"The spec an owner is served\")"
        );
    }
    Ok(())
}

/// This owner's share of the study's noise, where the owners add it
/// ([`StudySpec::owner_noise`]), drawn from `seed` ([`noise_seed`]); none on a
/// study opened noise-free for testing, which the owner has accepted by name
/// ([`check_risks`]), nor with no seed (the test-only switch).
fn noise_share(
    spec: &StudySpec,
    layout: &StudyLayout,
    noise_free: bool,
    seed: Option<[u8; 32]>,
) -> anyhow::Result<Option<ShareNoise>> {
    match (spec.owner_noise(), seed) {
        (Some(noise), Some(seed)) if !noise_free => {
            ShareNoise::draw(&noise, layout, &mut ChaCha20Rng::from_seed(seed))
                .map(Some)
                .context("a noise draw fell beyond its proven tail (probability below 2^-1000)")
        }
        _ => Ok(None),
    }
}

/// Rows read and folded into the share at a time: the table is never held whole.
pub const BATCH_ROWS: usize = 8192;

/// Reads the owner's table from `reader` a batch at a time, checks it against the
/// study (schema, labels, row count) and folds each batch into its exact share,
/// which is returned, plus `noise` where the owners add the noise, as the
/// plaintexts of `layout`, `spec`'s. Nothing is sent if this fails. Memory
/// holds one batch of rows ([`BATCH_ROWS`]) and the share, whatever the table's
/// length.
pub fn prepare_share(
    spec: &StudySpec,
    layout: &StudyLayout,
    reader: impl std::io::Read,
    name: &str,
    label: Option<&str>,
    noise: Option<&ShareNoise>,
) -> anyhow::Result<PreparedShare> {
    let mut batches = CsvBatches::new(reader, name, label)?;
    check_columns(spec, &batches.empty_table(), name)?;
    let mut total: Option<Share> = None;
    let mut clipped_rows = 0;
    while let Some(batch) = batches.next_batch(BATCH_ROWS)? {
        if batches.rows_read() > spec.max_rows {
            bail!(
                "{name}: more rows than the study's max_rows {}",
                spec.max_rows
            );
        }
        let (share, clipped) = batch_share(spec, layout, &batch, name)?;
        clipped_rows += clipped;
        match &mut total {
            Some(t) => t.merge(&share)?,
            None => total = Some(share),
        }
    }
    let Some(share) = total else {
        return Err(DataError::Empty {
            source_name: name.to_string(),
        }
        .into());
    };
    let rows = batches.rows_read();
    if clipped_rows > 0 {
        tracing::info!(clipped_rows, rows, "rows shortened to the row-norm bound");
    }
    Ok(PreparedShare {
        plaintexts: share.noised_plaintexts(layout, &spec.public_key, noise)?,
        rows,
        clipped_rows,
    })
}

/// The table's columns are the ones the study reads: its features, or the data
/// columns a row-norm histogram's bins are read from.
fn check_columns(spec: &StudySpec, columns: &Table, name: &str) -> Result<(), DataError> {
    match (&spec.marginals, &spec.norm_bins) {
        (None, Some(bins)) => columns.check_schema(&bins.features, name),
        (Some(_), _) | (None, None) => columns.check_schema(&spec.features, name),
    }
}

/// The exact share of one batch of rows, and how many of them the row-norm
/// clip shortened. A marginal histogram study reads each value's bin on its own
/// grid (nothing is clipped); a row-norm histogram's rows become the one-hot bin
/// of their norm.
fn batch_share(
    spec: &StudySpec,
    layout: &StudyLayout,
    table: &Table,
    name: &str,
) -> anyhow::Result<(Share, usize)> {
    if let Some(grid) = &spec.marginals {
        return Ok((grid.share(&table.rows, spec.dim(), &spec.fixed), 0));
    }
    let study_rows: std::borrow::Cow<'_, [Vec<f64>]> = match &spec.norm_bins {
        Some(bins) => table.rows.iter().map(|r| bins.one_hot(r)).collect(),
        None => std::borrow::Cow::Borrowed(&table.rows),
    };
    let labels = match &spec.classes {
        Some(classes) => Some(table.class_indices(&classes.labels, name)?),
        None => None,
    };
    let class_rows = labels.as_deref().map(|labels| ClassRows {
        labels,
        classes: layout.classes,
        per_class_matrix: layout.matrix_blocks > 1,
        count_scale: layout.count_scale,
    });
    Ok(Share::from_raw_rows(
        &study_rows,
        &spec.bounds,
        &spec.fixed,
        class_rows.as_ref(),
        spec.projection.as_ref(),
    ))
}

/// The encryption of one contribution into the chunks of its upload, run off the
/// async runtime.
struct EncryptJob {
    spec: StudySpec,
    plaintexts: Vec<BigUint>,
    study_id: String,
    owner_id: String,
    contribution_id: String,
    cap: (f64, f64),
    /// The owner's TLS key (PEM), where the count is signed.
    signer: Option<Vec<u8>>,
    bar: ProgressBar,
}

impl EncryptJob {
    /// The job of `cfg`'s owner for `spec`, under `contribution_id`.
    fn new(
        cfg: &OwnerConfig,
        spec: StudySpec,
        plaintexts: Vec<BigUint>,
        contribution_id: String,
        bar: ProgressBar,
    ) -> Self {
        // Under `mask` the user decrypts E[N] only as the product of counts the
        // owners signed (`signed_count`); on plaintext there is no key to sign with.
        let signer = signing_identity(spec.privacy.centering, &cfg.transport)
            .map(|tls| tls.private_key_pem().to_vec());
        Self {
            spec,
            plaintexts,
            study_id: cfg.study_id.clone(),
            owner_id: cfg.owner_id.clone(),
            contribution_id,
            cap: cfg.budget_cap,
            signer,
            bar,
        }
    }

    fn run(self) -> anyhow::Result<Vec<v1::ContributionChunk>> {
        let pk = &self.spec.public_key;
        let total = self.plaintexts.len();
        // One fixed-base table per contribution, sized for the work it will do.
        let randomizer = (!self.spec.baseline)
            .then(|| Randomizer::new(pk, Randomizer::window_for(total), &mut OsRng));
        let mut out = Vec::with_capacity(total.div_ceil(CIPHERTEXTS_PER_CHUNK));
        for (i, chunk) in self.plaintexts.chunks(CIPHERTEXTS_PER_CHUNK).enumerate() {
            let cts = match &randomizer {
                Some(r) => encrypt_chunk(r, chunk)?,
                // The paper's way: textbook r^n, one thread.
                None => chunk
                    .iter()
                    .map(|m| pk.encrypt(m, &mut OsRng).context("plaintext outside Z_n"))
                    .collect::<anyhow::Result<Vec<_>>>()?,
            };
            self.bar.inc(cts.len() as u64);
            let mut msg = v1::ContributionChunk {
                ciphertexts: cts.iter().map(|c| pk.ciphertext_to_bytes(c)).collect(),
                ..Default::default()
            };
            if i == 0 {
                // The header rides on the first chunk only.
                msg.study_id = self.study_id.clone();
                msg.owner_id = self.owner_id.clone();
                msg.total_ciphertexts = total as u32;
                msg.layout = LAYOUT_VERSION;
                msg.contribution_id = self.contribution_id.clone();
                msg.cap_epsilon = self.cap.0;
                msg.cap_delta = self.cap.1;
            }
            out.push(msg);
        }
        if let Some(key) = &self.signer {
            sign_count_into(&mut out, key, &self.study_id, &pk.fingerprint())?;
        }
        Ok(out)
    }
}

fn encrypt_chunk(randomizer: &Randomizer, chunk: &[BigUint]) -> anyhow::Result<Vec<Ciphertext>> {
    chunk
        .par_iter()
        .map(|m| {
            randomizer
                .encrypt(m, &mut OsRng)
                .context("plaintext outside Z_n")
        })
        .collect()
}

fn progress_bar(enabled: bool, total: u64) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("encrypting {bar:30} {pos}/{len} ciphertexts ({eta} left)")
    {
        bar.set_style(style);
    }
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The id read in one pass over the data is the id of its bytes; a reader
    /// that gives other bytes than the length declared is refused.
    #[test]
    fn the_streamed_id_is_the_id_of_the_bytes() {
        let key = [3u8; 32];
        let data = OwnerData::Csv {
            name: "t.csv".into(),
            bytes: b"a,b\n1,2\n".to_vec(),
        };
        let streamed = data.contribution_id(&key, "s", "o").expect("id");
        assert_eq!(streamed, contribution_id(&key, "s", "o", b"a,b\n1,2\n"));
        let mut short = IdMac::new(&key, "s", "o", 10);
        std::io::Write::write_all(&mut short, b"123456789").expect("fed");
        assert!(short.finish().is_err(), "nine bytes of a declared ten");
    }

    /// A table longer than a batch gives the share of the whole table, read
    /// at once, to the plaintext; more rows than max_rows are refused.
    #[test]
    fn a_table_read_in_batches_gives_the_share_of_the_whole() {
        let pk = dpca_common::testing::test_key().public().clone();
        let spec = dpca_common::study::SpecDraft {
            max_rows: 50_000,
            ..dpca_common::testing::test_draft(&pk, 2)
        }
        .validate()
        .expect("spec");
        let layout = StudyLayout::new(&spec).expect("layout");
        let rows = 2 * BATCH_ROWS + 17;
        let mut text = String::from("f0,f1\n");
        let mut table = Vec::new();
        for i in 0..rows {
            let row = vec![
                ((i % 37) as f64) / 20.0 - 0.9,
                ((i % 11) as f64) / 6.0 - 0.8,
            ];
            text.push_str(&format!("{},{}\n", row[0], row[1]));
            table.push(row);
        }
        let got =
            prepare_share(&spec, &layout, text.as_bytes(), "t.csv", None, None).expect("the table");
        let (whole, clipped) = Share::from_raw_rows(&table, &spec.bounds, &spec.fixed, None, None);
        assert_eq!(got.rows, rows as u64);
        assert_eq!(got.clipped_rows, clipped);
        assert_eq!(
            got.plaintexts,
            whole.plaintexts(&layout, &pk).expect("packs")
        );
        let small = dpca_common::study::SpecDraft {
            max_rows: BATCH_ROWS as u64,
            ..spec.to_draft()
        }
        .validate()
        .expect("spec");
        let layout = StudyLayout::new(&small).expect("layout");
        let err = prepare_share(&small, &layout, text.as_bytes(), "t.csv", None, None)
            .err()
            .expect("too many rows");
        assert!(err.to_string().contains("max_rows"), "{err}");
    }

    #[test]
    fn contribution_id_depends_on_every_part_and_the_secret() {
        let key = [7u8; 32];
        let base = contribution_id(&key, "s", "o", b"data");
        assert_eq!(base, contribution_id(&key, "s", "o", b"data"));
        assert_ne!(base, contribution_id(&key, "s2", "o", b"data"));
        assert_ne!(base, contribution_id(&key, "s", "o2", b"data"));
        assert_ne!(base, contribution_id(&key, "s", "o", b"datb"));
        // Length prefixes keep the parts apart.
        assert_ne!(
            contribution_id(&key, "ab", "c", b""),
            contribution_id(&key, "a", "bc", b"")
        );
        // Whoever lacks the owner's secret cannot recompute it from the data.
        assert_ne!(base, contribution_id(&[8u8; 32], "s", "o", b"data"));
        let mut unkeyed = Sha256::new();
        for part in [&b"s"[..], b"o", b"data"] {
            unkeyed.update((part.len() as u64).to_be_bytes());
            unkeyed.update(part);
        }
        assert_ne!(base, hex::encode(unkeyed.finalize()));
    }

    /// The noise seed is the same for the same inputs (a rerun adds the same
    /// share) and changes with each of them and with the secret.
    #[test]
    fn the_noise_seed_repeats_for_a_rerun_and_only_then() {
        let secret = [7u8; 32];
        let base = noise_seed(&secret, "study", "digest", "id");
        assert_eq!(base, noise_seed(&secret, "study", "digest", "id"));
        for other in [
            noise_seed(&secret, "study2", "digest", "id"),
            noise_seed(&secret, "study", "digest2", "id"),
            noise_seed(&secret, "study", "digest", "id2"),
            noise_seed(&[8u8; 32], "study", "digest", "id"),
            // The parts are length-prefixed: moving a byte across a boundary
            // is another input.
            noise_seed(&secret, "studyd", "igest", "id"),
        ] {
            assert_ne!(base, other);
        }
    }

    /// A share drawn again from the same seed is the same share (a rerun adds
    /// nothing an average could take away); another seed draws another; a study
    /// the proxy says is noise-free gets none.
    #[test]
    fn a_noise_share_is_a_function_of_its_seed() {
        let key = dpca_common::testing::test_key();
        let spec = dpca_common::testing::test_spec(key.public(), 3);
        let layout = StudyLayout::new(&spec).expect("layout");
        let draw = |seed, noise_free| {
            noise_share(&spec, &layout, noise_free, Some(seed))
                .expect("a draw")
                .map(|n| (n.matrix, n.vector))
        };
        let first = draw([1u8; 32], false).expect("the owners add the noise");
        assert_eq!(Some(first.clone()), draw([1u8; 32], false));
        assert_ne!(Some(first), draw([2u8; 32], false));
        assert_eq!(draw([1u8; 32], true), None);
    }

    #[test]
    fn plaintext_owners_draw_a_fresh_secret() {
        let t = Transport::InsecurePlaintext;
        assert_ne!(contribution_secret(&t), contribution_secret(&t));
    }

    /// A study under a key the owner did not pin is refused on the key, before
    /// its spec is validated: here a spec that would not validate (no features,
    /// no key) is refused naming the fingerprint, not the spec.
    #[tokio::test]
    async fn a_foreign_key_is_refused_before_the_spec_is_validated() {
        let mut client = dpca_shell::testing::scripted_proxy(
            v1::SealedStudy::default(),
            v1::ResultChunk::default(),
        )
        .await;
        let pinned = "0".repeat(64);
        let err = fetch_study(&mut client, "s1", &pinned)
            .await
            .expect_err("an empty spec was taken");
        let message = format!("{err:#}");
        assert!(message.contains("not the pinned"), "{message}");
        assert!(!message.contains("invalid spec"), "{message}");
    }

    /// Before the upload was bounded, an owner whose upload the proxy took and
    /// never answered waited for ever.
    #[tokio::test]
    async fn an_upload_the_proxy_never_answers_ends_in_time() {
        let mut client = dpca_shell::testing::silent_proxy(false).await;
        let chunk = v1::ContributionChunk::default();
        let upload = upload(
            &mut client,
            Arc::new(vec![chunk]),
            Duration::from_millis(300),
        );
        let err = dpca_shell::testing::gives_up(upload).await;
        assert!(err.to_string().contains("no answer to the upload"), "{err}");
        // Not retried as an outage: it may have been counted.
        assert!(err.downcast_ref::<Unreachable>().is_none(), "{err}");
    }

    #[test]
    fn an_upload_waits_until_a_grace_past_the_deadline_and_two_hours_at_most() {
        let minute = 60_000;
        assert_eq!(
            upload_wait(10 * minute, 0),
            Duration::from_secs(600) + UPLOAD_GRACE
        );
        // A deadline passed on the owner's clock: the grace alone.
        assert_eq!(upload_wait(0, 10 * minute), UPLOAD_GRACE);
        // A deadline a proxy set centuries away: the cap.
        assert_eq!(upload_wait(u64::MAX, 0), UPLOAD_WAIT_CAP);
    }

    #[test]
    fn a_proxy_collecting_past_the_owners_deadline_is_noticed() {
        assert_eq!(
            collecting_past_deadline("collecting", 1_000, 4_000),
            Some(Duration::from_secs(3))
        );
        assert_eq!(collecting_past_deadline("collecting", 4_000, 1_000), None);
        assert_eq!(collecting_past_deadline("sealed", 1_000, 4_000), None);
    }

    #[test]
    fn a_holder_that_is_the_proxy_or_not_the_pinned_one_is_refused() {
        let pk = dpca_common::testing::test_key().public().clone();
        let spec = |holder: Option<&str>| {
            dpca_common::study::SpecDraft {
                mask_holder: holder.map(str::to_owned),
                ..dpca_common::testing::test_draft(&pk, 2)
            }
            .validate()
            .expect("spec")
        };
        let proxy = "https://proxy.example:50051";
        let masked = spec(Some("https://holder.example:50051"));
        let named = check_mask_holder("s", &masked, proxy, None).expect("another host");
        assert_eq!(named, Some("https://holder.example:50051"));
        let pinned = Some("https://holder.example:50051");
        assert!(check_mask_holder("s", &masked, proxy, pinned).is_ok());
        for (holder, pin, what) in [
            (
                Some("https://PROXY.example:50051"),
                None,
                "the proxy itself",
            ),
            (
                Some("https://proxy.example:50051/"),
                None,
                "the proxy with a path",
            ),
            (
                Some("https://other.example:50051"),
                pinned,
                "not the pinned one",
            ),
            (None, pinned, "none where one is pinned"),
        ] {
            let served = spec(holder);
            let err = check_mask_holder("s", &served, proxy, pin);
            assert!(err.is_err(), "{what}");
        }
        let plain = spec(None);
        assert_eq!(
            check_mask_holder("s", &plain, proxy, None).expect("none"),
            None
        );
    }

    #[test]
    fn a_plaintext_owner_id_the_proxy_would_refuse_is_refused_here() {
        let t = Transport::InsecurePlaintext;
        let long = "a".repeat(MAX_ID_BYTES + 1);
        let err = owner_id(Some(&long), &t)
            .expect_err("a long id")
            .to_string();
        assert!(err.contains("257 bytes"), "{err}");
        assert_eq!(owner_id(Some("a"), &t).expect("a short id"), "a");
    }
}
