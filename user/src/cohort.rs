//! Where a study's owners come from, and the proxy they talk to: a local run
//! starts both as processes on this machine (`LocalCohort`); `user study` invites
//! owners that run elsewhere, through a proxy that runs elsewhere
//! (`InvitedCohort`). The rest of a study does not know which.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use dpca_common::risk::Risk;
use dpca_common::study::StudySpec;
use dpca_shell::invitation::Invitation;
use dpca_shell::owner_report::OwnerReport;
use dpca_shell::tls::{write_dev_pki, DevPki, Role, Transport};
use dpca_shell::usage::Usage;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::process::Command;

use crate::local::{LocalOptions, Remote};
use crate::plan::StudyPlan;
use crate::programs::{start_proxy, transport_flags, Guard, Launcher, Programs, TestModes};
use crate::slicing::{equal_slices, owner_name, split_rows, SliceLayout};

/// The owners of a study and the proxy they reach.
pub(crate) trait Cohort {
    /// The proxy's URL.
    fn url(&self) -> &str;

    /// How the user reaches the proxy.
    fn transport(&self) -> &Transport;

    /// Has the owners contribute to `study_id` (opened with `spec`): a local run
    /// waits for its owner processes and returns their reports; invited owners
    /// get their invitation and report nothing here.
    async fn contribute(
        &self,
        study_id: &str,
        fingerprint: &str,
        spec: &StudySpec,
    ) -> anyhow::Result<Vec<OwnerReport>>;

    /// The proxy's CPU time and memory, where it runs on this machine.
    fn proxy_usage(&self) -> Option<Usage>;

    /// The URL of the mask holder the owners deposit their seeds with, if any.
    fn mask_holder(&self) -> Option<&str>;
}

/// Owners invited to a study at a proxy that runs elsewhere.
pub(crate) struct InvitedCohort(Remote);

impl InvitedCohort {
    /// Removes an invitation left from an earlier study, which must not send the
    /// owners there.
    pub(crate) fn new(remote: Remote) -> anyhow::Result<Self> {
        if let Some(path) = &remote.invitation {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("cannot remove {}", path.display()))
                }
                _ => {}
            }
        }
        Ok(Self(remote))
    }
}

impl Cohort for InvitedCohort {
    fn url(&self) -> &str {
        &self.0.proxy
    }

    fn transport(&self) -> &Transport {
        &self.0.transport
    }

    /// Hands the owners their invitation: written to the file asked for
    /// (atomically, so an owner waiting for it never reads half), and printed.
    async fn contribute(
        &self,
        study_id: &str,
        fingerprint: &str,
        spec: &StudySpec,
    ) -> anyhow::Result<Vec<OwnerReport>> {
        let digest = dpca_shell::invitation::spec_digest(spec);
        let inv = Invitation {
            study: study_id.to_string(),
            key_fingerprint: fingerprint.to_string(),
            spec_digest: Some(digest.clone()),
        };
        if let Some(path) = &self.0.invitation {
            inv.write(path)?;
            eprintln!("invitation written to {}", path.display());
        }
        eprintln!(
            "invite the owners {} to study {study_id} (key fingerprint {fingerprint}, spec \
             digest {digest}); it seals at {}, or at its deadline with at least {}",
            self.0.owners.join(", "),
            dpca_shell::text::count(spec.quorum, "contribution"),
            dpca_shell::text::count(spec.min_owners, "owner")
        );
        Ok(Vec::new())
    }

    fn proxy_usage(&self) -> Option<Usage> {
        None
    }

    fn mask_holder(&self) -> Option<&str> {
        self.0.mask_holder.as_deref()
    }
}

/// A proxy and one owner process per slice of the table, on this machine, with a
/// throwaway CA unless plaintext was asked for.
pub(crate) struct LocalCohort {
    proxy: Guard,
    url: String,
    /// A second proxy, holding the owners' mask seeds.
    _holder: Guard,
    holder_url: String,
    transport: Transport,
    pki: Option<DevPki>,
    owner_bin: Launcher,
    owner_files: Vec<PathBuf>,
    owner_label: Option<String>,
    budget_cap: (f64, f64),
    noise_free_for_testing: bool,
    /// Test-only: the first owner adds no noise share.
    first_owner_adds_no_noise: bool,
    // Last: the CA, the owners' slices and the proxy's state live as long as the run.
    _dir: tempfile::TempDir,
}

/// The run's development PKI, in `dir`, and the user's transport on it (neither
/// on the plaintext transport).
fn local_pki(opts: &LocalOptions, dir: &Path) -> anyhow::Result<(Option<DevPki>, Transport)> {
    if opts.insecure_plaintext {
        return Ok((None, Transport::InsecurePlaintext));
    }
    let pki = write_dev_pki(
        dir,
        &["localhost".to_string(), "127.0.0.1".to_string()],
        &["user".to_string()],
        &(1..=opts.owners).map(owner_name).collect::<Vec<_>>(),
    )?;
    let user = pki
        .files("user")
        .context("no user certificate")?
        .load(Role::User)?;
    Ok((Some(pki), Transport::Tls(std::sync::Arc::new(user))))
}

impl LocalCohort {
    /// Splits the table among the owners, finds (or builds) the programs and
    /// starts the proxy: before the key, so that a missing program costs no keygen.
    /// `programs`: the proxy and owner programs ([`sibling_binaries`], built
    /// before the study's clock starts).
    pub(crate) async fn start(
        opts: &LocalOptions,
        plan: &StudyPlan,
        programs: Programs,
    ) -> anyhow::Result<Self> {
        // Mutual TLS even on loopback: the run exercises what a deployment runs.
        let dir = tempfile::Builder::new()
            .prefix("dpca-local-")
            .tempdir()
            .context("cannot create a folder for the run's certificates and slices")?;
        // The owners' slices are copies of the rows: they live as long as the run,
        // not in the output folder, which holds only what the study released.
        let sizes = match opts.slice_rows.is_empty() {
            true => equal_slices(plan.table.rows.len(), opts.owners)?,
            false => opts.slice_rows.clone(),
        };
        let owner_files = split_rows(
            &plan.table,
            &sizes,
            &dir.path().join("owners"),
            SliceLayout::default(),
        )?;
        let Programs {
            proxy: proxy_bin,
            owner: owner_bin,
        } = programs;
        let (pki, transport) = local_pki(opts, dir.path())?;
        let (proxy, url) = start_proxy(
            &proxy_bin,
            pki.as_ref(),
            (dir.path(), "proxy"),
            TestModes {
                noise_free: opts.noise_free_for_testing,
                skips_noise: opts.test_proxy_skips_noise,
            },
            &transport,
        )
        .await?;
        // A deployment's holder is another operator's; here it is one more
        // process, so that the run exercises the masks as a deployment does.
        let holder = (dir.path(), "holder");
        let (holder, holder_url) = start_proxy(
            &proxy_bin,
            pki.as_ref(),
            holder,
            TestModes::default(),
            &transport,
        )
        .await?;
        Ok(Self {
            proxy,
            url,
            _holder: holder,
            holder_url,
            transport,
            pki,
            owner_bin,
            owner_files,
            owner_label: plan.owner_label.clone(),
            budget_cap: plan.budget_cap,
            noise_free_for_testing: opts.noise_free_for_testing,
            first_owner_adds_no_noise: opts.test_owner_adds_no_noise,
            _dir: dir,
        })
    }

    /// The owner program of the `i`-th slice (from 0), ready to contribute.
    fn owner_command(
        &self,
        i: usize,
        study_id: &str,
        fingerprint: &str,
        spec: &StudySpec,
        risks: &[Risk],
    ) -> anyhow::Result<Command> {
        let mut cmd = self.owner_bin.command();
        cmd.env_remove("DPCA_CONFIG");
        let name = owner_name(i + 1);
        let files = match &self.pki {
            Some(p) => Some(
                p.files(&name)
                    .with_context(|| format!("no certificate for {name}"))?,
            ),
            None => None,
        };
        transport_flags(&mut cmd, files);
        cmd.args([
            "--proxy",
            &self.url,
            "--study",
            study_id,
            "--owner-id",
            &name,
        ])
        .arg("--data")
        .arg(&self.owner_files[i])
        .args(["--key-fingerprint", fingerprint, "--quiet"])
        .args(["--spec-digest", &dpca_shell::invitation::spec_digest(spec)])
        .arg("--budget-cap")
        .arg(format!("{},{}", self.budget_cap.0, self.budget_cap.1));
        if let Some(l) = &self.owner_label {
            cmd.args(["--label", l]);
        }
        for r in risks {
            cmd.args(["--accept-risk", r.name()]);
        }
        if i == 0 && self.first_owner_adds_no_noise {
            cmd.arg("--test-adds-no-noise");
        }
        // The user asked for the paper's way, to compare speeds.
        if spec.baseline {
            cmd.arg("--allow-baseline");
        }
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        Ok(cmd)
    }
}

impl Cohort for LocalCohort {
    fn url(&self) -> &str {
        &self.url
    }

    fn transport(&self) -> &Transport {
        &self.transport
    }

    /// Starts one owner process per slice and waits for all of them; the first
    /// failure names its owner. A local run is every party at once: its owners
    /// accept what its user chose, by name.
    async fn contribute(
        &self,
        study_id: &str,
        fingerprint: &str,
        spec: &StudySpec,
    ) -> anyhow::Result<Vec<OwnerReport>> {
        let risks = Risk::of(spec, self.noise_free_for_testing);
        let bar = ProgressBar::new(self.owner_files.len() as u64);
        if let Ok(style) =
            ProgressStyle::with_template("owners {bar:30} {pos}/{len} contributed ({elapsed})")
        {
            bar.set_style(style);
        }
        let mut tasks = Vec::new();
        for i in 0..self.owner_files.len() {
            let child = self
                .owner_command(i, study_id, fingerprint, spec, &risks)?
                .spawn()
                .with_context(|| format!("cannot start {}", self.owner_bin.program.display()))?;
            let bar = bar.clone();
            tasks.push(tokio::spawn(async move {
                let out = child.wait_with_output().await;
                bar.inc(1);
                out
            }));
        }
        let mut reports = Vec::new();
        for (i, task) in tasks.into_iter().enumerate() {
            let out = task.await.context("owner task")?.context("owner process")?;
            reports.push(owner_report(&owner_name(i + 1), &out)?);
        }
        bar.finish_and_clear();
        Ok(reports)
    }

    fn proxy_usage(&self) -> Option<Usage> {
        self.proxy.0.id().and_then(Usage::of_pid)
    }

    fn mask_holder(&self) -> Option<&str> {
        Some(&self.holder_url)
    }
}

/// The report an owner process printed, or why it failed.
fn owner_report(name: &str, out: &std::process::Output) -> anyhow::Result<OwnerReport> {
    if !out.status.success() {
        bail!(
            "{name} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let line = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(line.trim())
        .with_context(|| format!("{name} printed an unreadable report: {line}"))
}
