//! The proxy and owner programs a local run starts: found next to this program
//! (built first when running from the source tree, so a fresh clone works with
//! one `cargo run`), or given by a host (the Python package runs them as
//! `python -m dpca._role ROLE`), started as child processes that die with the run.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use dpca_shell::tls::{DevPki, TlsFiles, Transport};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The workspace this program was built from.
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// How one program is started: the program, and the arguments that come before
/// its own flags.
#[derive(Clone, Debug)]
pub struct Launcher {
    /// The program.
    pub program: PathBuf,
    /// Arguments before the program's own flags.
    pub args: Vec<OsString>,
}

impl Launcher {
    /// A binary run as is.
    pub fn binary(program: PathBuf) -> Self {
        Self {
            program,
            args: Vec::new(),
        }
    }

    /// The command that starts it, before its own flags.
    pub(crate) fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        cmd
    }
}

/// The proxy and owner programs a local run starts.
#[derive(Clone, Debug)]
pub struct Programs {
    /// The proxy.
    pub proxy: Launcher,
    /// An owner.
    pub owner: Launcher,
}

impl Programs {
    /// Both roles through one host command (`prefix`, the program first), which
    /// takes the role's name and then its flags.
    pub fn launched_by(prefix: &[String]) -> anyhow::Result<Self> {
        let (program, args) = prefix
            .split_first()
            .context("the command that starts the roles is empty")?;
        let role = |name: &str| Launcher {
            program: PathBuf::from(program),
            args: args
                .iter()
                .map(OsString::from)
                .chain([name.into()])
                .collect(),
        };
        Ok(Self {
            proxy: role("proxy"),
            owner: role("owner"),
        })
    }
}

/// Kills a child process when dropped, so no proxy or owner outlives a failed run.
pub(crate) struct Guard(pub(crate) Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.start_kill();
    }
}

/// The test-only modes a run's proxy is started in.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TestModes {
    /// Honors a study opened noise-free.
    pub(crate) noise_free: bool,
    /// Draws none of its own noise (a proxy that skips it).
    pub(crate) skips_noise: bool,
}

/// Starts one of the run's proxies (`name`: the aggregating `proxy`, or the
/// mask `holder`) on a free loopback port; returns it and its URL.
pub(crate) async fn start_proxy(
    proxy_bin: &Launcher,
    pki: Option<&DevPki>,
    (state_dir, name): (&Path, &str),
    modes: TestModes,
    transport: &Transport,
) -> anyhow::Result<(Guard, String)> {
    let mut proxy_cmd = proxy_bin.command();
    // The run sets every flag itself; a config file meant for `user` is not theirs.
    proxy_cmd.env_remove("DPCA_CONFIG");
    proxy_cmd.args(["--listen", "127.0.0.1:0"]);
    // The run's studies live as long as the run.
    proxy_cmd
        .arg("--state")
        .arg(state_dir.join(format!("{name}.redb")));
    transport_flags(&mut proxy_cmd, pki.map(|p| &p.proxy));
    if modes.noise_free {
        proxy_cmd.arg("--allow-noise-free-for-testing");
    }
    if modes.skips_noise {
        proxy_cmd.arg("--test-skips-noise");
    }
    let mut proxy = Guard(
        proxy_cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", proxy_bin.program.display()))?,
    );
    let addr = read_listen_line(&mut proxy.0).await?;
    let url = format!("{}://{addr}", transport.scheme());
    eprintln!("{name} listening on {addr}");
    Ok((proxy, url))
}

/// Points a program at its certificate, or runs it on plaintext.
pub(crate) fn transport_flags(cmd: &mut Command, files: Option<&TlsFiles>) {
    match files {
        Some(f) => {
            cmd.args(f.args());
        }
        None => {
            cmd.arg("--insecure-plaintext");
        }
    }
}

/// The address the proxy prints once it listens.
async fn read_listen_line(child: &mut Child) -> anyhow::Result<String> {
    let stdout = child.stdout.take().context("proxy stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .context("proxy did not start within 30 s")??
        .context("proxy exited before listening")?;
    line.strip_prefix("listening on ")
        .map(str::to_string)
        .with_context(|| format!("unexpected proxy output `{line}`"))
}

/// Builds the named workspace packages' binaries into `dir` (a `target/<profile>`
/// folder) with that folder's profile.
pub fn build_programs(dir: &Path, packages: &[&str]) -> anyhow::Result<()> {
    build_programs_with(dir, packages, &[])
}

/// The packages [`sibling_binaries`] builds together.
const SIBLINGS: [&str; 2] = ["proxy", "owner"];

/// Builds all three programs into `dir` the way a run from the source tree does:
/// the user alone (as `cargo run -p user` builds it), then the proxy and the owner
/// together (as `sibling_binaries` does). cargo unifies features per build, so
/// one build of the three would compile each differently from those two, and a
/// `user local` run after it would build the proxy and the owner again, over the
/// ones just built.
pub fn build_all_programs(dir: &Path) -> anyhow::Result<()> {
    build_programs(dir, &["user"])?;
    build_programs(dir, &SIBLINGS)
}

/// [`build_programs`] with further cargo arguments (a bench builds the programs
/// without GMP into their own target folder this way).
pub fn build_programs_with(dir: &Path, packages: &[&str], extra: &[&str]) -> anyhow::Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    // Variables cargo sets for the running crate (under `cargo test` or `cargo run`)
    // must not reach the nested build: build scripts that watch them (ring's watches
    // CARGO_MANIFEST_DIR) would rebuild, and the next ordinary build would again.
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if key.starts_with("CARGO_PKG_")
            || matches!(
                key,
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_MANIFEST_LINKS"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
            )
        {
            cmd.env_remove(key);
        }
    }
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(workspace_root().join("Cargo.toml"))
        .arg("--bins");
    for p in packages {
        cmd.args(["-p", p]);
    }
    cmd.args(extra);
    match dir.file_name().and_then(|s| s.to_str()) {
        Some("release") => {
            cmd.arg("--release");
        }
        Some("debug") | None => {}
        Some(profile) => {
            cmd.args(["--profile", profile]);
        }
    }
    let status = cmd
        .status()
        .with_context(|| format!("cannot run cargo to build {}", packages.join(", ")))?;
    if !status.success() {
        bail!("building {} failed ({status})", packages.join(", "));
    }
    Ok(())
}

/// Finds the `proxy` and `owner` programs next to this one, building them first when
/// running from the source tree (so a fresh clone works with one `cargo run`).
pub(crate) fn sibling_binaries(no_build: bool) -> anyhow::Result<Programs> {
    let exe = std::env::current_exe().context("cannot locate the running program")?;
    let dir = exe
        .parent()
        .context("program has no parent directory")?
        .to_path_buf();
    if !no_build && workspace_root().join("Cargo.toml").exists() {
        build_programs(&dir, &SIBLINGS)?;
    }
    let proxy = dir.join(format!("proxy{}", std::env::consts::EXE_SUFFIX));
    let owner = dir.join(format!("owner{}", std::env::consts::EXE_SUFFIX));
    for p in [&proxy, &owner] {
        if !p.exists() {
            bail!(
                "{} not found; build it with `cargo build --release`",
                p.display()
            );
        }
    }
    Ok(Programs {
        proxy: Launcher::binary(proxy),
        owner: Launcher::binary(owner),
    })
}
