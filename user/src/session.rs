//! The data user's side of one study over gRPC: open it, answer the proxy's single
//! request to decrypt N, fetch the released aggregate and open it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use dpca_common::paillier::{Ciphertext, SecretKey};
use dpca_common::protocol::{open_release, Opened};
use dpca_common::study::{StudyLayout, StudySpec};
use dpca_proto::client::{transient, with_retries};
use dpca_proto::convert::spec_to_wire;
use dpca_proto::v1;
use dpca_proto::v1::proxy_client::ProxyClient;
use tonic::transport::Channel;

/// What the user obtains from a finished study.
#[derive(Debug)]
pub struct Collected {
    /// Pooled row count N (decrypted by the user, then revealed to the proxy).
    pub n_rows: u64,
    /// Owners whose contributions were counted.
    pub owners_in: Vec<String>,
    /// Owners the study expected but did not count.
    pub owners_missing: Vec<String>,
    /// Noise standard deviation per entry of S, in normalized units.
    pub noise_scale: f64,
    /// Noise scale on the released integer grid, as the proxy reported it.
    pub noise_scale_grid: String,
    /// The decrypted release.
    pub opened: Opened,
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
            dpca_proto::client::status_message(&s),
            s.code()
        )
    }
}

/// Opens a study at the proxy; returns its id.
pub async fn open_study(
    client: &mut ProxyClient<Channel>,
    spec: &StudySpec,
    noise_free_for_testing: bool,
) -> anyhow::Result<String> {
    spec.validate().context("study spec")?;
    let resp = client
        .open_study(v1::OpenStudyRequest {
            spec: Some(spec_to_wire(spec)),
            noise_free_for_testing,
        })
        .await
        .map_err(status("proxy refused to open the study"))?;
    Ok(resp.into_inner().study_id)
}

/// Row counts this process has decrypted, by key fingerprint and study id.
static DECRYPTED_COUNTS: std::sync::OnceLock<Mutex<HashMap<(String, String), u64>>> =
    std::sync::OnceLock::new();

/// The row count of a study, decrypted by `decrypt` the first time only: the proxy
/// re-randomizes E[N] on every seal, so a second decryption for the same study
/// could only serve someone probing with other ciphertexts. A refused decryption
/// (implausible value) is not remembered and is refused again.
pub fn count_once(
    fingerprint: &str,
    study_id: &str,
    decrypt: impl FnOnce() -> anyhow::Result<u64>,
) -> anyhow::Result<u64> {
    let key = (fingerprint.to_string(), study_id.to_string());
    let table = DECRYPTED_COUNTS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = table
        .lock()
        .map_err(|_| anyhow::anyhow!("decryption guard poisoned"))?;
    if let Some(&n) = map.get(&key) {
        return Ok(n);
    }
    let n = decrypt()?;
    map.insert(key, n);
    Ok(n)
}

/// How long the user keeps calling again while the proxy cannot be reached while
/// it waits for the seal (a proxy restart keeps the study: see the proxy's store).
const RECONNECT_FOR: Duration = Duration::from_secs(300);

/// Waits for the study to seal, calling again (the channel reconnects) while the
/// proxy is unreachable, for up to [`RECONNECT_FOR`].
async fn await_seal(
    client: &ProxyClient<Channel>,
    study_id: &str,
) -> anyhow::Result<v1::SealedStudy> {
    with_retries(RECONNECT_FOR, transient, || {
        let mut client = client.clone();
        let req = v1::AwaitSealRequest {
            study_id: study_id.to_string(),
        };
        async move { client.await_seal(req).await }
    })
    .await
    .map(tonic::Response::into_inner)
    .map_err(status("study did not seal"))
}

/// Waits for the study to seal, decrypts N (checking it against the spec), reveals
/// it, fetches the release and decrypts it.
pub async fn collect(
    client: &mut ProxyClient<Channel>,
    sk: &SecretKey,
    spec: &StudySpec,
    study_id: &str,
) -> anyhow::Result<Collected> {
    let pk = sk.public();
    let sealed = await_seal(client, study_id).await?;
    let count_ct = pk
        .ciphertext_from_bytes(&sealed.encrypted_count, 0)
        .context("proxy sent an invalid encrypted count")?;
    let owners = sealed.owners_in.len() as u64;
    // The user decrypts exactly one value for the proxy: the row count, once per
    // study, and only if it is plausible; anything else could be the proxy using the
    // user as an oracle. A retry reveals the count decrypted the first time.
    let n_rows = count_once(&pk.fingerprint(), study_id, || {
        match u64::try_from(&sk.decrypt(&count_ct)) {
            Ok(n) if n >= owners.max(1) && n <= spec.max_rows => Ok(n),
            _ => bail!(
                "decrypted row count is not in [{}, {}]: refusing to reveal it",
                owners.max(1),
                spec.max_rows
            ),
        }
    })?;
    let t = Instant::now();
    client
        .reveal_count(v1::RevealCountRequest {
            study_id: study_id.to_string(),
            n_rows,
        })
        .await
        .map_err(status("proxy refused the row count"))?;
    let seconds_proxy = t.elapsed().as_secs_f64();

    let mut stream = client
        .fetch_result(v1::FetchResultRequest {
            study_id: study_id.to_string(),
        })
        .await
        .map_err(status("cannot fetch the result"))?
        .into_inner();
    let first = stream
        .message()
        .await
        .map_err(status("result stream"))?
        .context("empty result stream")?;
    if first.n_rows != n_rows {
        bail!(
            "proxy released for {} rows, not the {n_rows} revealed",
            first.n_rows
        );
    }
    let layout = StudyLayout::new(spec)?;
    let expected = layout.release_ciphertexts();
    if first.total_ciphertexts as usize != expected {
        bail!(
            "proxy announced {} result ciphertexts, the layout has {expected}",
            first.total_ciphertexts
        );
    }
    let mut cts: Vec<Ciphertext> = Vec::with_capacity(expected);
    let (noise_scale, noise_scale_grid) = (first.noise_scale, first.noise_scale_grid.clone());
    let mut chunk = Some(first);
    while let Some(c) = chunk {
        if cts.len() + c.ciphertexts.len() > expected {
            bail!("proxy sent more than {expected} result ciphertexts");
        }
        let parsed = pk
            .ciphertexts_from_bytes(&c.ciphertexts, cts.len())
            .context("invalid result ciphertext")?;
        cts.extend(parsed);
        chunk = stream.message().await.map_err(status("result stream"))?;
    }
    if cts.len() != expected {
        bail!(
            "result stream ended after {} of {expected} ciphertexts",
            cts.len()
        );
    }
    let t = Instant::now();
    let opened = open_release(
        sk,
        &layout,
        spec.privacy.centering,
        spec.projection.as_ref(),
        &cts,
        n_rows,
        spec.fixed.frac_bits,
    )?;
    Ok(Collected {
        n_rows,
        owners_in: sealed.owners_in,
        owners_missing: sealed.owners_missing,
        noise_scale,
        noise_scale_grid,
        opened,
        seconds_proxy,
        seconds_decrypt: t.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_row_count_of_a_study_is_decrypted_once() {
        let mut calls = 0;
        let n = count_once("fp", "study-a", || {
            calls += 1;
            Ok(40)
        })
        .expect("first");
        assert_eq!(n, 40);
        // The proxy sends a different E[N] for the same study: not decrypted again.
        let again = count_once("fp", "study-a", || panic!("decrypted twice")).expect("again");
        assert_eq!((again, calls), (40, 1));
        // A refused (implausible) count is refused again, not remembered as valid.
        assert!(count_once("fp", "study-b", || bail!("implausible")).is_err());
        assert!(count_once("fp", "study-b", || bail!("implausible")).is_err());
        // Another study, or another key, is its own.
        assert_eq!(
            count_once("fp2", "study-a", || Ok(7)).expect("other key"),
            7
        );
    }
}
