//! The data user's side of one study over gRPC: open it, ask for the release (with a
//! proof of N where the noise depends on it), fetch the released aggregate and open
//! it.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use dpca_common::dp::{NoisePlan, NoiseScale};
use dpca_common::paillier::{Ciphertext, Opening, PublicKey, SecretKey};
use dpca_common::protocol::{check_release, open_release_unmasked, Opened};
use dpca_common::study::{MarginalCounts, StudyLayout, StudySpec, LAYOUT_VERSION};
use dpca_proto::convert::spec_to_wire;
use dpca_proto::v1;
use dpca_proto::v1::proxy_client::ProxyClient;
use dpca_shell::client::{transient, with_retries, CALL_TIMEOUT};
use dpca_shell::clock::{now_unix_ms, until_past};
use dpca_shell::signed_count::{signing_identity, verify_count, CountClaim};
use dpca_shell::tls::{LoadedTls, Transport};
use num_bigint::BigUint;
use tonic::transport::Channel;

/// What the user obtains from a finished study.
#[derive(Debug)]
pub struct Collected {
    /// Pooled row count N, decrypted by the user (and proven to the proxy under
    /// `mask`, whose noise is calibrated to it; kept by the user under `dp-mean`).
    pub n_rows: u64,
    /// Owners whose contributions were counted.
    pub owners_in: Vec<String>,
    /// Owners the study expected but did not count.
    pub owners_missing: Vec<String>,
    /// Noise standard deviation per entry of S, in normalized units: the spec's
    /// plan for this release, as the user computes it.
    pub noise_scale: f64,
    /// Noise scale on the released integer grid: the plan's, which the proxy
    /// reported too.
    pub noise_scale_grid: String,
    /// The decrypted release.
    pub opened: Opened,
    /// Seconds the user waited for the study to seal: for the owners.
    pub seconds_seal: f64,
    /// Seconds the proxy spent computing the release (mask, noise, re-randomization),
    /// as seen from the user.
    pub seconds_proxy: f64,
    /// Seconds the user spent decrypting.
    pub seconds_decrypt: f64,
}

fn status(what: &str) -> impl Fn(tonic::Status) -> anyhow::Error + '_ {
    move |s| {
        anyhow::anyhow!(
            "{what}: {} ({:?})",
            dpca_shell::client::status_message(&s),
            s.code()
        )
    }
}

/// The result stream's next chunk (`None` at its end), which must come within
/// `patience`.
async fn next_chunk(
    stream: &mut tonic::Streaming<v1::ResultChunk>,
    patience: Duration,
) -> anyhow::Result<Option<v1::ResultChunk>> {
    tokio::time::timeout(patience, stream.message())
        .await
        .map_err(|_| silent("the result stream", patience))?
        .map_err(status("result stream"))
}

/// The error of a proxy that left `what` unanswered for `waited`.
fn silent(what: &str, waited: Duration) -> anyhow::Error {
    anyhow::anyhow!(
        "the proxy sent nothing of {what} for {} s",
        waited.as_secs_f64()
    )
}

/// Opens a study at the proxy; returns its id. The proxy must answer within
/// [`CALL_TIMEOUT`]; the call is not repeated, since a proxy that opened the
/// study and then failed to answer would open a second one.
///
/// Where the spec names a mask holder, the study is then held there under the
/// same id (`transport` connects to it), before any owner can be invited.
pub async fn open_study(
    client: &mut ProxyClient<Channel>,
    spec: &StudySpec,
    noise_free_for_testing: bool,
    transport: &Transport,
) -> anyhow::Result<String> {
    let id = open_study_within(client, spec, noise_free_for_testing, CALL_TIMEOUT).await?;
    crate::masks::hold_masks(spec, &id, transport)
        .await
        .with_context(|| format!("study {id} is open at the proxy, and not at its mask holder"))?;
    Ok(id)
}

async fn open_study_within(
    client: &mut ProxyClient<Channel>,
    spec: &StudySpec,
    noise_free_for_testing: bool,
    within: Duration,
) -> anyhow::Result<String> {
    let call = client.open_study(v1::OpenStudyRequest {
        spec: Some(spec_to_wire(spec)),
        noise_free_for_testing,
    });
    let resp = tokio::time::timeout(within, call)
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "the proxy did not answer the opening of the study within {} s; it may have \
                 opened it all the same (`proxy status` lists the studies)",
                within.as_secs_f64()
            )
        })?
        .map_err(status("proxy refused to open the study"))?;
    let study_id = resp.into_inner().study_id;
    dpca_shell::invitation::check_study_id(&study_id)
        .map_err(|e| anyhow::anyhow!("the proxy named the new study so: {e}"))?;
    claim_study_id(&spec.public_key.fingerprint(), &study_id)?;
    // A proxy of a build before layout versions drops the field it does not know
    // and would noise the release at its own layout's offsets: read it back.
    let read_back = client.get_study(v1::GetStudyRequest {
        study_id: study_id.clone(),
    });
    let info = dpca_shell::client::answered("the opened study", read_back)
        .await
        .map_err(status("reading the opened study back"))?
        .into_inner();
    let layout = info.spec.map_or(0, |s| s.layout);
    if layout != LAYOUT_VERSION {
        anyhow::bail!(
            "the proxy keeps study {study_id} with ciphertext layout {} and this build packs with layout {LAYOUT_VERSION}: the proxy needs a build of the same layout",
            layout.max(1)
        );
    }
    Ok(study_id)
}

/// The study ids this process was given, by key fingerprint.
static OPENED: std::sync::OnceLock<Mutex<HashSet<(String, String)>>> = std::sync::OnceLock::new();

/// Takes `study_id`, which the proxy gave a study this process opened under the
/// key `fingerprint`, refusing an id it was given before: the proxy chooses ids,
/// and the owners' signed counts and this user's one decision on each study's
/// count (`count_once`) are bound to the id, so two studies under one id would
/// let what was signed or decided for the first serve the second.
pub fn claim_study_id(fingerprint: &str, study_id: &str) -> anyhow::Result<()> {
    let table = OPENED.get_or_init(|| Mutex::new(HashSet::new()));
    let mut opened = table
        .lock()
        .map_err(|_| anyhow::anyhow!("study id guard poisoned"))?;
    if !opened.insert((fingerprint.to_string(), study_id.to_string())) {
        bail!(
            "the proxy gave the new study the id {study_id}, which a study this user opened \
             under the same key already has: refusing it"
        );
    }
    Ok(())
}

/// What this process decided about each study's E[N], by key fingerprint and study
/// id: the ciphertext decided on, and its opening or why it refused to decrypt.
type Decided = HashMap<(String, String), (Vec<u8>, Result<Opening, String>)>;

static DECRYPTED_COUNTS: std::sync::OnceLock<Mutex<Decided>> = std::sync::OnceLock::new();

/// The opening of a study's E\[N\] (`ciphertext`), computed by `open` the first time
/// only. The same ciphertext gets the first answer again, a refusal (an
/// implausible value) included, so that retrying never buys the proxy one more
/// bit. Another ciphertext for a study already decided is refused undecrypted:
/// the first answer handed over for it would be the opening of a value the proxy
/// chose (a study id given out twice under one key: the row-norm histogram's
/// E\[N\], forged and decrypted after its release, then the study that follows
/// under the same id, whose opening is sent to the proxy).
pub fn count_once(
    fingerprint: &str,
    study_id: &str,
    ciphertext: &[u8],
    open: impl FnOnce() -> anyhow::Result<Opening>,
) -> anyhow::Result<Opening> {
    let key = (fingerprint.to_string(), study_id.to_string());
    let table = DECRYPTED_COUNTS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = table
        .lock()
        .map_err(|_| anyhow::anyhow!("decryption guard poisoned"))?;
    let decided = match map.get(&key) {
        Some((decided_on, _)) if decided_on.as_slice() != ciphertext => bail!(
            "the proxy sent another E[N] for study {study_id} than the one this user decided \
             on before: not decrypted"
        ),
        Some((_, decided)) => decided.clone(),
        None => {
            let decided = open().map_err(|e| format!("{e:#}"));
            map.insert(key, (ciphertext.to_vec(), decided.clone()));
            decided
        }
    };
    decided.map_err(|why| anyhow::anyhow!("{why} (decided once for study {study_id})"))
}

/// Decrypts E[N] with its proof, once per study, and checks it is plausible: one
/// row per counted owner at least, the spec's max_rows at most. `mask`: the
/// counted owners' mask sum on N, taken off the plaintext first (the opening
/// proves the masked value, and is sent nowhere: masks are `dp-mean`'s only).
fn open_count(
    sk: &SecretKey,
    spec: &StudySpec,
    study_id: &str,
    sealed: &v1::SealedStudy,
    mask: Option<&BigUint>,
) -> anyhow::Result<(u64, Opening)> {
    let count_ct = sk
        .public()
        .ciphertext_from_bytes(&sealed.encrypted_count, 0)
        .context("proxy sent an invalid encrypted count")?;
    let min = (sealed.owners_in.len() as u64).max(1);
    let fingerprint = sk.public().fingerprint();
    let n_of = |o: &Opening| u64::try_from(&unmasked(&o.plaintext, mask, sk.public().n()));
    let opening = count_once(&fingerprint, study_id, &sealed.encrypted_count, || {
        let opening = sk.open(&count_ct)?;
        match n_of(&opening) {
            Ok(n) if n >= min && n <= spec.max_rows => Ok(opening),
            _ => bail!(
                "decrypted row count is not in [{min}, {}]: refusing to use it",
                spec.max_rows
            ),
        }
    })?;
    let n = n_of(&opening).context("row count")?;
    Ok((n, opening))
}

/// `p` less `mask` mod `n` (`p` itself without one).
fn unmasked(p: &BigUint, mask: Option<&BigUint>, n: &BigUint) -> BigUint {
    match mask {
        Some(m) => (p + (n - m % n)) % n,
        None => p.clone(),
    }
}

/// Checks that the proxy's E\[N\] is the product of the counted owners' E\[N_i\], each
/// signed for this study and key by a certificate of the user's CA (`tls`)
/// naming that owner and not on the CA's revocation list, if the user was given
/// one, one per owner counted, and that the owners counted are enough
/// (`min_owners`) and invited (`expected_owners`, where the spec names them).
/// Anything else (one owner's count, a class count, a histogram bin) is refused
/// before it is decrypted: the user is no oracle.
pub fn check_signed_counts(
    sealed: &v1::SealedStudy,
    sk: &SecretKey,
    spec: &StudySpec,
    tls: &LoadedTls,
    study_id: &str,
) -> anyhow::Result<()> {
    let pk = sk.public();
    check_counted_owners(sealed, spec)?;
    let fingerprint = pk.fingerprint();
    let mut product: Option<Ciphertext> = None;
    for c in &sealed.counts {
        let claim = CountClaim {
            owner: &c.owner_id,
            study_id,
            key_fingerprint: &fingerprint,
            ciphertext: &c.encrypted_count,
        };
        verify_count(tls.ca_pem(), &c.certificate, claim, &c.signature)
            .with_context(|| format!("E[N] not decrypted: the count of `{}`", c.owner_id))?;
        // A leaked key signs as well as its owner: a revoked certificate vouches
        // for nothing, whoever holds it.
        if tls.revokes(&c.certificate)? {
            bail!(
                "E[N] not decrypted: the count of `{}` is signed under a certificate \
                 the CA's revocation list (--tls-crl) names",
                c.owner_id
            );
        }
        let ct = pk
            .ciphertext_from_bytes(&c.encrypted_count, 0)
            .with_context(|| format!("the count of `{}`", c.owner_id))?;
        product = Some(match product {
            Some(p) => pk.add(&p, &ct),
            None => ct,
        });
    }
    let sent = pk
        .ciphertext_from_bytes(&sealed.encrypted_count, 0)
        .context("proxy sent an invalid encrypted count")?;
    if product.as_ref() != Some(&sent) {
        bail!("the proxy's E[N] is not the product of the owners' signed counts: not decrypted");
    }
    Ok(())
}

/// The names sorted, refused if one comes twice.
fn distinct<'a>(names: impl Iterator<Item = &'a str>, what: &str) -> anyhow::Result<Vec<&'a str>> {
    let mut sorted: Vec<&str> = names.collect();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0] == w[1]) {
        bail!("the proxy names an owner twice among the {what}");
    }
    Ok(sorted)
}

/// The owners the proxy says it counted: each once, as many as the study needs at
/// least, invited where the spec names who is, and exactly the signers of counts.
fn check_counted_owners(sealed: &v1::SealedStudy, spec: &StudySpec) -> anyhow::Result<()> {
    let counted = distinct(
        sealed.owners_in.iter().map(String::as_str),
        "owners counted",
    )
    .map_err(not_decrypted)?;
    let signers = distinct(
        sealed.counts.iter().map(|c| c.owner_id.as_str()),
        "signed counts",
    )
    .map_err(not_decrypted)?;
    if signers != counted {
        bail!(
            "the proxy's signed counts are of owners {signers:?}, the owners counted are \
             {counted:?}: E[N] not decrypted"
        );
    }
    check_owners_in(sealed, spec).map_err(not_decrypted)
}

/// A refusal of the counted owners, as the one message that says E[N] was not
/// decrypted (a caller printing only the outermost message still reads why).
fn not_decrypted(e: anyhow::Error) -> anyhow::Error {
    anyhow::anyhow!("{e}: E[N] not decrypted")
}

/// The owners the proxy says it counted are distinct, invited where the spec
/// names the owners, and at least `min_owners` and at most `quorum` of them (the
/// proxy seals at its quorum). Their number sizes the noise the user reads off
/// a study whose owners add it, so it is checked before anything is read.
fn check_owners_in(sealed: &v1::SealedStudy, spec: &StudySpec) -> anyhow::Result<()> {
    let counted = distinct(
        sealed.owners_in.iter().map(String::as_str),
        "owners counted",
    )?;
    let claimed = dpca_shell::text::count(counted.len() as u64, "owner");
    if counted.len() < spec.min_owners as usize {
        bail!(
            "the proxy counted {claimed}, fewer than the study's minimum of {}",
            spec.min_owners
        );
    }
    if counted.len() > spec.quorum as usize {
        bail!(
            "the proxy counted {claimed}, more than the study's quorum of {}, at which it seals",
            spec.quorum
        );
    }
    if let Some(stranger) = counted
        .iter()
        .find(|o| !spec.expected_owners.is_empty() && !spec.expected_owners.iter().any(|e| e == *o))
    {
        bail!("the proxy counted `{stranger}`, who was not invited");
    }
    Ok(())
}

/// How long the user keeps calling again while the proxy cannot be reached while
/// it waits for the seal (a proxy restart keeps the study: see the proxy's store).
const RECONNECT_FOR: Duration = Duration::from_secs(300);

/// How long past the study's deadline the user waits for the seal. The proxy
/// seals or aborts a study within a second of its deadline on its own clock; the
/// rest is for a restart around the deadline (the user calls again for
/// [`RECONNECT_FOR`] from its first failed call) and for a difference between the
/// two clocks.
const SEAL_GRACE: Duration = RECONNECT_FOR.saturating_add(CALL_TIMEOUT);

/// Waits for the study to seal, calling again (the channel reconnects) while the
/// proxy is unreachable, for up to [`RECONNECT_FOR`] from the first failed call,
/// and in all for at most `within`: a proxy that takes the call and never answers
/// does not hold the user forever.
async fn await_seal(
    client: &ProxyClient<Channel>,
    study_id: &str,
    within: Duration,
) -> anyhow::Result<v1::SealedStudy> {
    let wait = with_retries(RECONNECT_FOR, transient, || {
        let mut client = client.clone();
        let req = v1::AwaitSealRequest {
            study_id: study_id.to_string(),
        };
        async move { client.await_seal(req).await }
    });
    tokio::time::timeout(within, wait)
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "study {study_id} did not seal: the proxy gave no answer within {} s, past \
                 the study's deadline",
                within.as_secs_f64()
            )
        })?
        .map(tonic::Response::into_inner)
        .map_err(status("study did not seal"))
}

/// A study as this user opened it, which its release is checked against.
#[derive(Clone, Copy, Debug)]
pub struct OpenedStudy<'a> {
    /// The id the proxy gave it.
    pub id: &'a str,
    /// The spec it was opened with.
    pub spec: &'a StudySpec,
    /// Whether it was opened noise-free (tests only): the noise its release must
    /// carry follows.
    pub noise_free_for_testing: bool,
}

impl<'a> OpenedStudy<'a> {
    /// Study `id`, opened with `spec` and its noise.
    pub fn new(id: &'a str, spec: &'a StudySpec) -> Self {
        Self {
            id,
            spec,
            noise_free_for_testing: false,
        }
    }
}

/// Waits for the study to seal, decrypts N (checking it against the spec), asks for
/// the release (proving N to the proxy only where the noise is calibrated to it),
/// fetches the release and decrypts it.
pub async fn collect(
    client: &mut ProxyClient<Channel>,
    transport: &Transport,
    sk: &SecretKey,
    study: OpenedStudy<'_>,
) -> anyhow::Result<Collected> {
    let got = fetch_sealed(client, transport, sk, study).await?;
    let n_rows = match &got.proven {
        Some((n, _)) => *n,
        None => {
            let mask = got.masks.as_ref().and_then(|m| m.last());
            open_count(sk, study.spec, study.id, &got.sealed, mask)?.0
        }
    };
    open_collected(sk, study.spec, got, n_rows)
}

/// The release of a preparatory histogram study (of the row norms, or of each
/// feature's values), opened as [`collect`] opens a study but for its E\[N\],
/// which is not decrypted, and with the noise plan it was checked to carry: the
/// counts are read off the release's grids, and a histogram is `dp-mean`, whose
/// noise reads no N. A proxy that sent a value of its choice as E\[N\] would
/// otherwise learn whether it lies in [owners, max_rows] from whether this user
/// goes on to open the study that follows (and under the histogram's study id,
/// had the proxy given the next study the same one, have it sent back opened).
async fn collect_histogram(
    client: &mut ProxyClient<Channel>,
    transport: &Transport,
    sk: &SecretKey,
    study: OpenedStudy<'_>,
) -> anyhow::Result<(Opened, NoisePlan)> {
    let spec = study.spec;
    if spec.privacy.centering != dpca_common::dp::Centering::DpMean {
        bail!("a histogram study is dp-mean");
    }
    let got = fetch_sealed(client, transport, sk, study).await?;
    // N enters a dp-mean release only in S' = R' - v' v'^T / N, which no bin is
    // read off, and its noise plan reads none: 1 stands in for it.
    const STAND_IN_ROWS: u64 = 1;
    let plan = got.plan.clone();
    let opened = open_collected(sk, spec, got, STAND_IN_ROWS)?.opened;
    Ok((opened, plan))
}

/// The noisy counts of a row-norm histogram study's bins ([`collect_histogram`]).
pub async fn collect_bins(
    client: &mut ProxyClient<Channel>,
    transport: &Transport,
    sk: &SecretKey,
    study: OpenedStudy<'_>,
) -> anyhow::Result<Vec<f64>> {
    let spec = study.spec;
    let bins = spec
        .norm_bins
        .as_ref()
        .context("a row-norm histogram study has bins")?;
    let (opened, plan) = collect_histogram(client, transport, sk, study).await?;
    Ok(opened.bin_counts(bins, &plan, &spec.fixed))
}

/// The noisy counts of a marginal histogram study ([`collect_histogram`]), with
/// the noise each count carries, on the integer grid.
pub async fn collect_marginals(
    client: &mut ProxyClient<Channel>,
    transport: &Transport,
    sk: &SecretKey,
    study: OpenedStudy<'_>,
) -> anyhow::Result<(MarginalCounts, NoiseScale)> {
    let spec = study.spec;
    let grid = spec
        .marginals
        .as_ref()
        .context("a marginal histogram study has its grid")?;
    let (opened, plan) = collect_histogram(client, transport, sk, study).await?;
    let counts = grid.counts(&opened.vector_grid, spec.dim(), &spec.fixed);
    Ok((counts, plan.vector.unwrap_or(plan.matrix)))
}

/// A sealed study's release as fetched, with N where it was proven to the proxy,
/// and the layout it was fetched in.
struct Released {
    layout: StudyLayout,
    sealed: v1::SealedStudy,
    proven: Option<(u64, Opening)>,
    /// The noise the release must carry, computed from the spec (and N where
    /// proven), and found reported as such.
    plan: NoisePlan,
    ciphertexts: Vec<Ciphertext>,
    /// The counted owners' mask sum, where the spec names a mask holder: one
    /// value per released ciphertext, then N's.
    masks: Option<Vec<BigUint>>,
    seconds_seal: f64,
    seconds_proxy: f64,
}

/// N, where it was proven to the proxy.
fn proven_rows(proven: Option<&(u64, Opening)>) -> Option<u64> {
    proven.map(|(n, _)| *n)
}

/// Waits for the study to seal, asks for the release (proving N where the noise
/// is calibrated to it) and fetches it.
async fn fetch_sealed(
    client: &mut ProxyClient<Channel>,
    transport: &Transport,
    sk: &SecretKey,
    study: OpenedStudy<'_>,
) -> anyhow::Result<Released> {
    let OpenedStudy {
        id: study_id,
        spec,
        noise_free_for_testing,
    } = study;
    // The proxy opens no study whose deadline has passed, and closes every study at
    // its deadline.
    let within = until_past(spec.deadline_unix_ms, now_unix_ms()?, SEAL_GRACE);
    let t = Instant::now();
    let sealed = await_seal(client, study_id, within).await?;
    check_owners_in(&sealed, spec).context("the sealed study is refused")?;
    let seconds_seal = t.elapsed().as_secs_f64();
    let masks = crate::masks::fetch_mask_sum(spec, study_id, &sealed.owners_in, transport).await?;
    let proven = count_to_prove(&sealed, transport, sk, spec, study_id)?;
    let layout = StudyLayout::new(spec)?;
    let t = Instant::now();
    let wait = ReleaseWait::for_study(&layout, sk.public().bits());
    request_release(client, study_id, proven.as_ref(), &wait).await?;
    let seconds_proxy = t.elapsed().as_secs_f64();
    let announced = proven_rows(proven.as_ref());
    let plan = spec.release_plan(announced, noise_free_for_testing, sealed.owners_in.len());
    let expected = Expected {
        layout: &layout,
        n_rows: announced.unwrap_or(0),
        noise_grid: spec
            .proxy_plan(announced, noise_free_for_testing)
            .matrix
            .grid_parameter(),
    };
    let ciphertexts = fetch_release(client, sk.public(), study_id, &expected, CALL_TIMEOUT).await?;
    Ok(Released {
        layout,
        sealed,
        proven,
        plan,
        ciphertexts,
        masks,
        seconds_seal,
        seconds_proxy,
    })
}

/// Decrypts a fetched release with the row count `n_rows`.
fn open_collected(
    sk: &SecretKey,
    spec: &StudySpec,
    got: Released,
    n_rows: u64,
) -> anyhow::Result<Collected> {
    let t = Instant::now();
    let opened = open_release_unmasked(
        sk,
        &got.layout,
        spec.privacy.centering,
        spec.projection.as_ref(),
        (&got.ciphertexts, got.masks.as_deref()),
        n_rows,
        spec.fixed.frac_bits,
    )?;
    // A study's release must be one honest rows could give before anything is
    // read off it (a histogram's counts are read as they come).
    if spec.norm_bins.is_none() && spec.marginals.is_none() {
        let shape = (&got.layout.shape(), spec.privacy.centering);
        check_release(&opened, shape, &got.plan, n_rows, spec.fixed.frac_bits)
            .context("the release is refused, and nothing is analysed from it")?;
    }
    Ok(Collected {
        n_rows,
        owners_in: got.sealed.owners_in,
        owners_missing: got.sealed.owners_missing,
        noise_scale: spec.noise_sd_per_entry(&got.plan, proven_rows(got.proven.as_ref())),
        noise_scale_grid: got.plan.matrix.grid_parameter().to_string(),
        opened,
        seconds_seal: got.seconds_seal,
        seconds_proxy: got.seconds_proxy,
        seconds_decrypt: t.elapsed().as_secs_f64(),
    })
}

/// How the user waits for the proxy to compute and store a release: the release
/// is computed while the user's request waits (minutes at M = 1000), so the user
/// asks every `poll` whether the proxy is still there, and gives up on a proxy
/// that does not answer that call within `answer`, or has not released within
/// `cap`.
struct ReleaseWait {
    poll: Duration,
    answer: Duration,
    cap: Duration,
}

impl ReleaseWait {
    /// For a study of this layout under a key of `key_bits`: asked every 30 s,
    /// answered within [`CALL_TIMEOUT`], and a cap of [`CALL_TIMEOUT`] plus 0.5 s
    /// per released ciphertext at 2048 bits, growing with the cube of the key's
    /// size (an exponentiation's cost). The proxy took 11 ms of CPU per released
    /// ciphertext at 3072 bits (`study` bench, scenario 4, `mask`: 132 s for
    /// 11,894), so the cap leaves it 150x that (5.6 hours at M = 1000): room for the
    /// slower num-bigint build, the one-thread baseline, a slow machine and many
    /// releases computed at once. A slow proxy that answers is waited for; a
    /// silent one is left within a minute.
    fn for_study(layout: &StudyLayout, key_bits: u64) -> Self {
        let per_ciphertext = 0.5 * (key_bits as f64 / 2048.0).powi(3);
        let computing = per_ciphertext * layout.release_ciphertexts() as f64;
        ReleaseWait {
            poll: Duration::from_secs(30),
            answer: CALL_TIMEOUT,
            cap: CALL_TIMEOUT
                .saturating_add(Duration::try_from_secs_f64(computing).unwrap_or(Duration::MAX)),
        }
    }
}

/// Asks for the release (with the proof of N, where the noise depends on it) and
/// waits, as `wait` says, for the proxy to have computed and stored it.
async fn request_release(
    client: &mut ProxyClient<Channel>,
    study_id: &str,
    proven: Option<&(u64, Opening)>,
    wait: &ReleaseWait,
) -> anyhow::Result<()> {
    let request = v1::ReleaseRequest {
        study_id: study_id.to_string(),
        count: proven.map(|(n_rows, opening)| v1::CountOpening {
            n_rows: *n_rows,
            root: opening.root.to_bytes_be(),
        }),
    };
    let mut poller = client.clone();
    let started = Instant::now();
    let release = client.release(request);
    tokio::pin!(release);
    loop {
        let left = wait.cap.saturating_sub(started.elapsed());
        if left.is_zero() {
            bail!(
                "the proxy did not release study {study_id} within {:.0} s (it may still be \
                 computing it)",
                wait.cap.as_secs_f64()
            );
        }
        tokio::select! {
            answer = &mut release => {
                answer.map_err(status("proxy refused to release"))?;
                return Ok(());
            }
            () = tokio::time::sleep(wait.poll.min(left)) => {
                still_there(&mut poller, study_id, wait.answer).await?;
            }
        }
    }
}

/// Whether the proxy computing the release of `study_id` still answers a call for
/// the study within `within`.
async fn still_there(
    client: &mut ProxyClient<Channel>,
    study_id: &str,
    within: Duration,
) -> anyhow::Result<()> {
    let call = client.get_study(v1::GetStudyRequest {
        study_id: study_id.to_string(),
    });
    match tokio::time::timeout(within, call).await {
        Ok(answer) => answer
            .map(drop)
            .map_err(status("the proxy failed while computing the release")),
        Err(_) => bail!(
            "the proxy stopped answering while computing the release of study {study_id}: \
             no answer to a call for the study within {:.0} s",
            within.as_secs_f64()
        ),
    }
}

/// N and its opening where the study's noise depends on it (`mask`), else `None`.
///
/// The user decrypts exactly one value: the row count, once per study, and uses it
/// only if it is plausible; anything else could be the proxy using the user as an
/// oracle. Its proof leaves the user only where the noise depends on N. Under
/// `dp-mean` it is decrypted only after the release is fetched, so that whether the
/// user goes on tells the proxy nothing about what E[N] holds.
fn count_to_prove(
    sealed: &v1::SealedStudy,
    transport: &Transport,
    sk: &SecretKey,
    spec: &StudySpec,
    study_id: &str,
) -> anyhow::Result<Option<(u64, Opening)>> {
    let mask = spec.privacy.centering == dpca_common::dp::Centering::Mask;
    if sealed.needs_count != mask {
        bail!(
            "proxy asks for N {} for a {} study: refusing",
            if sealed.needs_count {
                "to be revealed"
            } else {
                "to be kept"
            },
            spec.privacy.centering.name()
        );
    }
    if !mask {
        return Ok(None);
    }
    match signing_identity(spec.privacy.centering, transport) {
        Some(tls) => check_signed_counts(sealed, sk, spec, tls, study_id)?,
        // No certificates, no signatures: plaintext is insecure by name.
        None => tracing::warn!("plaintext: E[N] is decrypted without the owners' signatures"),
    }
    Ok(Some(open_count(sk, spec, study_id, sealed, None)?))
}

/// Checks the noise scale the proxy reports against the plan's, both on the
/// integer grid: one unit apart at most, the slack for a last-bit difference
/// between two platforms' `ln` and `exp`, which the calibration rounds up to an
/// integer.
fn check_noise_grid(reported: &str, planned: &BigUint) -> anyhow::Result<()> {
    let value = BigUint::parse_bytes(reported.as_bytes(), 10)
        .with_context(|| format!("proxy reported an unreadable noise scale `{reported}`"))?;
    let one = BigUint::from(1u32);
    // No slack where no noise is planned: the proxy draws none, exactly.
    let slack = if planned.bits() == 0 {
        BigUint::default()
    } else {
        one
    };
    if &value + &slack < *planned || value > planned + &slack {
        bail!(
            "proxy released with noise {value} on the integer grid; the spec's plan for this \
             release is {planned}"
        );
    }
    Ok(())
}

/// What the user knows a study's release must be before it reads it.
struct Expected<'a> {
    layout: &'a StudyLayout,
    /// The N proven to the proxy (0 under `dp-mean`).
    n_rows: u64,
    /// The plan's noise scale on the integer grid, exact.
    noise_grid: BigUint,
}

/// Fetches the release: it must be for the N the user proved, carry the noise
/// the user computed from the spec (as the proxy reports it: a proxy that drew
/// another would otherwise have the user publish the spec's noise scale and noise
/// floor, or a scale of its choosing, beside it) and hold exactly the layout's
/// ciphertexts, each in the group. The release is computed and stored before it
/// is served, so the stream's first answer and each chunk after it must come
/// within `patience`.
async fn fetch_release(
    client: &mut ProxyClient<Channel>,
    pk: &PublicKey,
    study_id: &str,
    want: &Expected<'_>,
    patience: Duration,
) -> anyhow::Result<Vec<Ciphertext>> {
    let request = v1::FetchResultRequest {
        study_id: study_id.to_string(),
    };
    let mut stream = tokio::time::timeout(patience, client.fetch_result(request))
        .await
        .map_err(|_| silent("the result", patience))?
        .map_err(status("cannot fetch the result"))?
        .into_inner();
    let first = next_chunk(&mut stream, patience)
        .await?
        .context("empty result stream")?;
    if first.n_rows != want.n_rows {
        bail!(
            "proxy released for {} rows, not the {} proven",
            first.n_rows,
            want.n_rows
        );
    }
    check_noise_grid(&first.noise_scale_grid, &want.noise_grid)?;
    let expected = want.layout.release_ciphertexts();
    if first.total_ciphertexts as usize != expected {
        bail!(
            "proxy announced {} result ciphertexts, the layout has {expected}",
            first.total_ciphertexts
        );
    }
    let mut cts: Vec<Ciphertext> = Vec::with_capacity(expected);
    let mut chunk = Some(first);
    while let Some(c) = chunk {
        if cts.len() + c.ciphertexts.len() > expected {
            bail!("proxy sent more than {expected} result ciphertexts");
        }
        let parsed = pk
            .ciphertexts_from_bytes(&c.ciphertexts, cts.len())
            .context("invalid result ciphertext")?;
        cts.extend(parsed);
        chunk = next_chunk(&mut stream, patience).await?;
    }
    if cts.len() != expected {
        bail!(
            "result stream ended after {} of {expected} ciphertexts",
            cts.len()
        );
    }
    Ok(cts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpca_shell::testing::{gives_up, silent_proxy};

    #[tokio::test]
    async fn a_user_does_not_wait_forever_on_a_proxy_that_never_answers() {
        let mut client = silent_proxy(true).await;
        let patience = Duration::from_millis(300);
        let sk = dpca_common::testing::test_key();
        let spec = dpca_common::testing::test_spec(sk.public(), 3);
        let opened = gives_up(open_study_within(&mut client, &spec, false, patience)).await;
        assert!(
            opened.to_string().contains("may have opened it"),
            "{opened}"
        );
        let sealed = gives_up(await_seal(&client, "a-study", patience)).await;
        assert!(sealed.to_string().contains("did not seal"), "{sealed}");
        // Before the proxy was asked whether it is still there, a user waited for the
        // release for ever.
        let wait = ReleaseWait {
            poll: patience,
            answer: patience,
            cap: Duration::from_secs(3600),
        };
        let released = gives_up(request_release(&mut client, "a-study", None, &wait)).await;
        assert!(
            released.to_string().contains("stopped answering"),
            "{released}"
        );
        // One that answers the call for the study and never releases: the cap.
        let wait = ReleaseWait {
            cap: Duration::from_secs(1),
            ..wait
        };
        let mut stalled = dpca_shell::testing::stalled_proxy().await;
        let released = gives_up(request_release(&mut stalled, "a-study", None, &wait)).await;
        assert!(
            released.to_string().contains("did not release"),
            "{released}"
        );
        let layout = StudyLayout::new(&spec).expect("layout");
        // A result stream that opens and stalls, and one that never opens.
        for (opens, says) in [(true, "of the result stream"), (false, "of the result for")] {
            let mut client = silent_proxy(opens).await;
            let want = Expected {
                layout: &layout,
                n_rows: 0,
                noise_grid: BigUint::from(1u32),
            };
            let fetch = fetch_release(&mut client, sk.public(), "a-study", &want, patience);
            let err = gives_up(fetch).await;
            assert!(err.to_string().contains(says), "{err}");
        }
    }

    #[test]
    fn the_release_is_waited_for_in_proportion_to_its_work() {
        let sk = dpca_common::testing::test_key();
        let layout =
            StudyLayout::new(&dpca_common::testing::test_spec(sk.public(), 3)).expect("layout");
        let n = layout.release_ciphertexts() as f64;
        let at = |bits| ReleaseWait::for_study(&layout, bits).cap;
        assert_eq!(at(2048), CALL_TIMEOUT + Duration::from_secs_f64(0.5 * n));
        assert_eq!(at(4096), CALL_TIMEOUT + Duration::from_secs_f64(4.0 * n));
        // No key makes the cap overflow.
        assert_eq!(at(u64::MAX), Duration::MAX);
    }

    fn opening(n: u32) -> Opening {
        Opening {
            plaintext: n.into(),
            root: 1u32.into(),
        }
    }

    /// A seal whose E[N] is `count` and a release of zeros for `spec` (its noise
    /// reported as the spec plans it), as a scripted proxy serves them.
    fn forged_seal(spec: &StudySpec, count: u64) -> (v1::SealedStudy, v1::ResultChunk) {
        let pk = dpca_common::testing::test_key().public();
        let encrypted = |m: u64| {
            pk.encrypt(&num_bigint::BigUint::from(m), &mut rand::rngs::OsRng)
                .map(|c| pk.ciphertext_to_bytes(&c))
                .expect("encrypt")
        };
        let layout = StudyLayout::new(spec).expect("layout");
        let sealed = v1::SealedStudy {
            encrypted_count: encrypted(count),
            owners_in: vec!["owner-1".into()],
            ..Default::default()
        };
        let plan = spec.proxy_plan(None, false);
        let result = v1::ResultChunk {
            noise_scale: spec.noise_sd_per_entry(&plan, None),
            noise_scale_grid: plan.matrix.grid_parameter().to_string(),
            n_owners: 1,
            ciphertexts: (0..layout.release_ciphertexts())
                .map(|_| encrypted(0))
                .collect(),
            total_ciphertexts: layout.release_ciphertexts() as u32,
            ..Default::default()
        };
        (sealed, result)
    }

    /// A row-norm histogram's E[N] is not decrypted: a value the proxy chose,
    /// out of the plausible range, is answered with the bins all the same, so
    /// whether the user goes on to the study that follows says nothing of it.
    #[tokio::test]
    async fn a_histograms_row_count_is_not_decrypted() {
        let sk = dpca_common::testing::test_key();
        let request = dpca_common::dp::PrivacyRequest {
            epsilon: 0.5,
            ..dpca_common::testing::test_spec(sk.public(), 3).privacy
        };
        let spec = dpca_common::testing::test_spec(sk.public(), 3)
            .norm_histogram(request)
            .expect("histogram spec");
        let bins = spec.norm_bins.clone().expect("bins");
        let (sealed, result) = forged_seal(&spec, spec.max_rows + 1);
        let mut client = dpca_shell::testing::scripted_proxy(sealed, result).await;
        let plain = Transport::InsecurePlaintext;
        let counts = collect_bins(
            &mut client,
            &plain,
            sk,
            OpenedStudy::new("histogram-1", &spec),
        )
        .await
        .expect("the bins, whatever E[N] holds");
        assert_eq!(counts.len(), bins.edges.len());
        // The same seal where the count is read: refused, undecided for the proxy.
        let err = collect(
            &mut client,
            &plain,
            sk,
            OpenedStudy::new("histogram-2", &spec),
        )
        .await
        .expect_err("an implausible count decrypted and used");
        assert!(format!("{err:#}").contains("not in ["), "{err:#}");
    }

    /// The noise scale the user reports (sigma, the noise floor) is the spec's
    /// plan, which it computes itself: a release reported with other noise, or
    /// with none on a study not opened noise-free, is refused before anything of
    /// it is decrypted. The study is one whose noise the proxy draws (Laplace);
    /// where the owners draw it, the proxy must report none (the next test).
    #[tokio::test]
    async fn a_release_reported_with_other_noise_than_the_spec_plans_is_refused() {
        let sk = dpca_common::testing::test_key();
        let spec = proxy_noised_spec(sk.public());
        let plain = Transport::InsecurePlaintext;
        let (sealed, honest) = forged_seal(&spec, 2);
        let planned = honest.noise_scale_grid.clone();
        assert_ne!(planned, "0", "the test spec plans noise");
        let grid: BigUint = planned.parse().expect("a grid scale");
        let two_below = (&grid - 2u32).to_string();
        let two_above = (&grid + 2u32).to_string();
        let lies = [
            ("1", false),
            ("0", false),
            (planned.as_str(), true),
            (two_below.as_str(), false),
            (two_above.as_str(), false),
            ("a lot", false),
        ];
        for (i, (grid, noise_free)) in lies.into_iter().enumerate() {
            let result = v1::ResultChunk {
                noise_scale_grid: grid.to_string(),
                ..honest.clone()
            };
            let mut client = dpca_shell::testing::scripted_proxy(sealed.clone(), result).await;
            let id = format!("noisy-{i}");
            let study = OpenedStudy {
                noise_free_for_testing: noise_free,
                ..OpenedStudy::new(&id, &spec)
            };
            let err = collect(&mut client, &plain, sk, study)
                .await
                .expect_err("a release with noise the spec does not plan");
            let says = ["the spec's plan", "unreadable"];
            let err = format!("{err:#}");
            assert!(says.iter().any(|s| err.contains(s)), "{err}");
        }
        // One unit off (rounding on another platform) passes; the user reports its
        // own figures either way, whatever f64 the proxy sends beside them.
        let plan = spec.proxy_plan(None, false);
        for (i, near) in [&grid - 1u32, grid.clone(), &grid + 1u32]
            .iter()
            .enumerate()
        {
            let result = v1::ResultChunk {
                noise_scale_grid: near.to_string(),
                noise_scale: 1e9,
                ..honest.clone()
            };
            let mut client = dpca_shell::testing::scripted_proxy(sealed.clone(), result).await;
            let id = format!("noisy-near-{i}");
            let got = collect(&mut client, &plain, sk, OpenedStudy::new(&id, &spec))
                .await
                .expect("the planned noise, within a unit");
            assert_eq!(got.noise_scale, spec.noise_sd_per_entry(&plan, None));
            assert_eq!(got.noise_scale_grid, planned);
        }
    }

    /// The owners the proxy says it counted size the noise the user reads off a
    /// study whose owners add it: more than the quorum, a name twice, or fewer
    /// than the minimum is refused before anything is decrypted.
    #[tokio::test]
    async fn a_proxy_claiming_owners_it_cannot_have_counted_is_refused() {
        let sk = dpca_common::testing::test_key();
        let spec = dpca_common::testing::test_spec(sk.public(), 3);
        assert_eq!((spec.min_owners, spec.quorum), (1, 3));
        let plain = Transport::InsecurePlaintext;
        let (sealed, result) = forged_seal(&spec, 2);
        let claims: [&[&str]; 3] = [&["a", "b", "c", "d"], &["a", "a"], &[]];
        for (i, names) in claims.into_iter().enumerate() {
            let sealed = v1::SealedStudy {
                owners_in: names.iter().map(|s| s.to_string()).collect(),
                ..sealed.clone()
            };
            let mut client = dpca_shell::testing::scripted_proxy(sealed, result.clone()).await;
            let id = format!("claims-{i}");
            let err = collect(&mut client, &plain, sk, OpenedStudy::new(&id, &spec))
                .await
                .expect_err("an impossible list of owners counted");
            let err = format!("{err:#}");
            assert!(
                err.contains("the sealed study is refused"),
                "{names:?}: {err}"
            );
        }
    }

    /// A spec whose noise the proxy draws: `dp-mean` under the Laplace mechanism.
    fn proxy_noised_spec(pk: &PublicKey) -> StudySpec {
        let privacy = dpca_common::dp::PrivacyRequest::new(
            dpca_common::dp::Mechanism::LAPLACE,
            dpca_common::dp::Centering::DpMean,
            1.0,
            1e-6,
        )
        .expect("request");
        dpca_common::study::SpecDraft {
            privacy,
            ..dpca_common::testing::test_draft(pk, 3)
        }
        .validate()
        .expect("spec")
    }

    /// Where the owners add the noise the proxy draws none: a release reported
    /// with the noise the proxy would have drawn is refused, one reported with
    /// none is read, and the user reports the owners' shares' sum.
    #[tokio::test]
    async fn where_the_owners_add_the_noise_the_proxy_must_report_none() {
        let sk = dpca_common::testing::test_key();
        let spec = dpca_common::testing::test_spec(sk.public(), 3);
        assert!(spec.owners_add_noise());
        let plain = Transport::InsecurePlaintext;
        let (sealed, honest) = forged_seal(&spec, 2);
        assert_eq!(honest.noise_scale_grid, "0", "the proxy plans none");
        let own = spec.noise_plan(0).matrix.grid_parameter().to_string();
        let result = v1::ResultChunk {
            noise_scale_grid: own,
            ..honest.clone()
        };
        let mut client = dpca_shell::testing::scripted_proxy(sealed.clone(), result).await;
        let err = collect(
            &mut client,
            &plain,
            sk,
            OpenedStudy::new("own-noise", &spec),
        )
        .await
        .expect_err("a proxy reporting noise of its own");
        assert!(format!("{err:#}").contains("the spec's plan"), "{err:#}");
        let mut client = dpca_shell::testing::scripted_proxy(sealed, honest).await;
        let got = collect(&mut client, &plain, sk, OpenedStudy::new("owners", &spec))
            .await
            .expect("no noise of the proxy's own");
        let shares = spec.release_plan(None, false, 1);
        assert_eq!(got.noise_scale, spec.noise_sd_per_entry(&shares, None));
    }

    /// A proxy that gives a second study the id of the first is refused when it
    /// answers the opening, before anything is signed or decided for it.
    #[tokio::test]
    async fn a_proxy_that_gives_two_studies_one_id_is_refused() {
        let sk = dpca_common::testing::test_key();
        let spec = dpca_common::testing::test_spec(sk.public(), 3);
        let (sealed, result) = forged_seal(&spec, 1);
        let mut client = dpca_shell::testing::scripted_proxy(sealed, result).await;
        let id = open_study(&mut client, &spec, false, &Transport::InsecurePlaintext)
            .await
            .expect("the first study");
        assert_eq!(id, dpca_shell::testing::SCRIPTED_STUDY);
        let err = open_study(&mut client, &spec, false, &Transport::InsecurePlaintext)
            .await
            .expect_err("a second study under the first one's id");
        assert!(err.to_string().contains("already has"), "{err}");
    }

    #[test]
    fn a_study_id_is_taken_once_per_key() {
        claim_study_id("fp-ids", "study-a").expect("a new id");
        let err = claim_study_id("fp-ids", "study-a").expect_err("the same id again");
        assert!(err.to_string().contains("already has"), "{err}");
        claim_study_id("fp-ids", "study-b").expect("another id");
        claim_study_id("fp-ids-2", "study-a").expect("the id under another key");
    }

    #[test]
    fn the_row_count_of_a_study_is_decrypted_once() {
        let mut calls = 0;
        let n = count_once("fp", "study-a", b"E[N]", || {
            calls += 1;
            Ok(opening(40))
        })
        .expect("first");
        assert_eq!(n, opening(40));
        // The same E[N] again: the same answer, not decrypted again.
        let again =
            count_once("fp", "study-a", b"E[N]", || panic!("decrypted twice")).expect("again");
        assert_eq!((again, calls), (opening(40), 1));
        // A refused (implausible) count stays refused: a retry is not decrypted, so
        // it cannot buy the proxy another bit.
        assert!(count_once("fp", "study-b", b"E[x]", || bail!("implausible")).is_err());
        let err = count_once("fp", "study-b", b"E[x]", || {
            panic!("decrypted after a refusal")
        })
        .expect_err("refused again");
        assert!(err.to_string().contains("implausible"), "{err}");
        // Another study, or another key, is its own.
        assert_eq!(
            count_once("fp2", "study-a", b"E[N']", || Ok(opening(7))).expect("other key"),
            opening(7)
        );
    }

    /// The proxy hands out one study id twice under one key (the row-norm
    /// histogram, then the study that follows it): the opening decided for the
    /// first E[N], a value the proxy forged and the user decrypted only after its
    /// release, must not be handed over as the opening of the second, whose
    /// opening the user sends to the proxy.
    #[test]
    fn another_count_for_a_study_already_decided_is_not_answered_with_the_first() {
        let forged = count_once("fp", "study-x", b"E[x] the proxy chose", || Ok(opening(29)))
            .expect("decrypted after the histogram's release");
        assert_eq!(forged, opening(29));
        let err = count_once("fp", "study-x", b"E[N] the owners signed", || {
            panic!("decrypted again")
        })
        .expect_err("the first opening handed over for another E[N]");
        assert!(err.to_string().contains("another E[N]"), "{err}");
        // ... and that refusal leaves the first decision as it was.
        let first = count_once("fp", "study-x", b"E[x] the proxy chose", || {
            panic!("decrypted again")
        })
        .expect("the first E[N] again");
        assert_eq!(first, opening(29));
    }
}
