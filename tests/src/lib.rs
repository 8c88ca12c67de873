//! Helpers of the integration tests: the real `proxy`, `owner` and `user` programs,
//! built once per test run with the test's own profile, started as processes on
//! loopback, and the plaintext reference computations the results are checked
//! against.

pub mod sim;

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, OnceLock};

use dpca_common::data::{normalize_row, read_csv, Table};
use dpca_common::dp::{Centering, Mechanism, PrivacyRequest};
use dpca_common::encoding::FixedPoint;
use dpca_common::paillier::{PublicKey, SecretKey};
use dpca_common::study::{SpecDraft, StudySpec, DEFAULT_FRAC_BITS};
use dpca_shell::tls::{write_dev_pki, DevPki, Role, TlsFiles, Transport};
use nalgebra::DMatrix;

/// The folder holding this test run's binaries (`target/<profile>`).
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test>
    exe.parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps")
        .to_path_buf()
}

/// A free loopback port (bound, then released for a proxy to take).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// The Prometheus page a proxy started with `--metrics-listen 127.0.0.1:PORT`
/// serves.
pub fn scrape(port: u16) -> String {
    let at = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    rt().block_on(dpca_proxy::metrics_page::fetch(at))
        .expect("metrics page")
}

/// The value of the sample `name` (with its labels, if any) on a scraped page.
pub fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Path of one of the three programs, built on first use. `cargo test` builds only
/// test harnesses of other packages, so the real binaries are built here, with the
/// same profile as the running test.
pub fn bin(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        dpca_user::programs::build_all_programs(&bin_dir()).expect("build proxy, owner and user");
    });
    let p = bin_dir().join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(p.exists(), "{} missing after build", p.display());
    p
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The bundled optdigits table (label column `label`).
pub fn optdigits() -> Table {
    let path = workspace_root().join("data/optdigits.csv");
    let f = std::fs::File::open(&path).expect("bundled optdigits");
    read_csv(f, "optdigits.csv", Some("label")).expect("bundled optdigits parses")
}

/// Writes the first `n` rows of `table` (features and label) to `path`.
pub fn write_rows(table: &Table, n: usize, path: &Path) {
    let mut w = csv::Writer::from_path(path).expect("create csv");
    let mut header = table.features.clone();
    header.push("label".into());
    w.write_record(&header).expect("write header");
    for (i, r) in table.rows.iter().take(n).enumerate() {
        let mut rec: Vec<String> = r.iter().map(|x| x.to_string()).collect();
        rec.push(
            table
                .label
                .as_ref()
                .map(|(_, c)| c[i].clone())
                .unwrap_or_default(),
        );
        w.write_record(&rec).expect("write row");
    }
    w.flush().expect("flush csv");
}

/// Writes rows `skip..skip + n` of `table` (features and label) to `path`.
pub fn write_slice(table: &Table, skip: usize, n: usize, path: &Path) {
    let mut t = table.clone();
    t.rows.drain(..skip);
    if let Some((_, cells)) = &mut t.label {
        cells.drain(..skip);
    }
    write_rows(&t, n, path);
}

/// [`optdigits_draft`], validated.
pub fn optdigits_spec(pk: &PublicKey) -> StudySpec {
    optdigits_draft(pk).validate().expect("the optdigits spec")
}

/// A `dp-mean` study (the default) of the optdigits features under `pk`: bounds 0..16, C = 1,
/// Gaussian at epsilon 1 and delta 1e-5, quorum and minimum 2, 1024 rows at most,
/// a deadline ten minutes away, open to any owner.
pub fn optdigits_draft(pk: &PublicKey) -> SpecDraft {
    let features = optdigits().features;
    let now = dpca_shell::clock::now_unix_ms().expect("a clock after 1970");
    SpecDraft {
        bounds: vec![(0.0, 16.0); features.len()],
        features,
        fixed: FixedPoint {
            frac_bits: DEFAULT_FRAC_BITS,
            row_norm_bound: 1.0,
        },
        max_rows: 1024,
        privacy: PrivacyRequest::new(Mechanism::GAUSSIAN, Centering::DpMean, 1.0, 1e-5)
            .expect("privacy"),
        min_owners: 2,
        quorum: 2,
        deadline_unix_ms: now + 600_000,
        ..dpca_common::testing::test_draft(pk, 0)
    }
}

/// A child process killed when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Users with certificates in a test proxy's development PKI.
pub const TEST_USERS: &[&str] = &["user", "eve", "carol", "dave"];

/// Owners with certificates in a test proxy's development PKI.
/// Nine: more than fill the main listener's connections (8 each), so a test can
/// hold every slot owners may take.
pub const TEST_OWNERS: &[&str] = &[
    "a",
    "b",
    "hospital-a",
    "hospital-b",
    "mallory",
    "late",
    "c",
    "d",
    "e",
];

/// A proxy process on mutual TLS, with the development PKI its parties use.
pub struct TestProxy {
    /// The process (killed on drop).
    pub proc: Proc,
    /// Its `https://127.0.0.1:PORT` URL.
    pub url: String,
    /// Certificates of the proxy, [`TEST_USERS`] and [`TEST_OWNERS`].
    pub pki: DevPki,
    /// Its state database.
    pub state: PathBuf,
    _dir: tempfile::TempDir,
}

impl TestProxy {
    /// The transport of the user or owner `name` (its certificate from this PKI).
    pub fn transport(&self, name: &str) -> Transport {
        let files = self
            .pki
            .files(name)
            .unwrap_or_else(|| panic!("no test certificate for `{name}`"));
        let role = if TEST_USERS.contains(&name) {
            Role::User
        } else {
            Role::Owner
        };
        Transport::Tls(Arc::new(files.load(role).expect("test certificate loads")))
    }

    /// The operator's transport (its `dpca-proxy` client certificate), as
    /// `proxy status` connects.
    pub fn operator_transport(&self) -> Transport {
        let files = &self.pki.operator;
        Transport::Tls(Arc::new(
            files.load(Role::Proxy).expect("operator certificate"),
        ))
    }

    /// The command-line flags pointing a program at `name`'s certificate.
    pub fn tls_args(&self, name: &str) -> Vec<OsString> {
        tls_args(
            self.pki
                .files(name)
                .unwrap_or_else(|| panic!("no test certificate for `{name}`")),
        )
    }
}

/// `--tls-ca`, `--tls-cert`, `--tls-key` for these files.
pub fn tls_args(files: &TlsFiles) -> Vec<OsString> {
    files.args()
}

/// `pki`'s CA's revocation list naming the parties `revoked`, written to `path`
/// (for `--tls-crl`), which it returns as text.
pub fn write_revocation_list(pki: &DevPki, revoked: &[&str], path: &Path) -> String {
    let list = pki.revocation_list(revoked).expect("a revocation list");
    std::fs::write(path, list).expect("write the list");
    path.to_str().expect("a UTF-8 path").to_string()
}

/// A fresh development PKI in a temporary folder (kept while the folder lives).
pub fn dev_pki() -> (DevPki, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let pki = write_dev_pki(
        dir.path(),
        &strings(&["localhost", "127.0.0.1"]),
        &strings(TEST_USERS),
        &strings(TEST_OWNERS),
    )
    .expect("development PKI");
    (pki, dir)
}

/// Starts a proxy on mutual TLS on a free loopback port.
pub fn start_proxy(test_mode: bool) -> TestProxy {
    start_proxy_with(test_mode, &[])
}

/// As [`start_proxy`], with further flags for the proxy (its limits, say).
pub fn start_proxy_with(test_mode: bool, flags: &[&str]) -> TestProxy {
    let (pki, dir) = dev_pki();
    let state = dir.path().join("proxy.redb");
    let (proc, addr) = try_spawn_proxy_with(&pki, &state, "127.0.0.1:0", test_mode, flags)
        .unwrap_or_else(|| panic!("the proxy did not start with {flags:?}"));
    TestProxy {
        proc,
        url: format!("https://{addr}"),
        pki,
        state,
        _dir: dir,
    }
}

/// Starts the proxy program on `listen` with `state` and the PKI's proxy
/// certificate; returns it with the address it printed.
pub fn spawn_proxy(pki: &DevPki, state: &Path, listen: &str, test_mode: bool) -> (Proc, String) {
    try_spawn_proxy(pki, state, listen, test_mode)
        .unwrap_or_else(|| panic!("the proxy did not start on {listen}"))
}

/// As [`spawn_proxy`], `None` if the proxy exits before listening (say, the port is
/// still taken).
pub fn try_spawn_proxy(
    pki: &DevPki,
    state: &Path,
    listen: &str,
    test_mode: bool,
) -> Option<(Proc, String)> {
    try_spawn_proxy_with(pki, state, listen, test_mode, &[])
}

/// As [`try_spawn_proxy`], with further flags for the proxy.
pub fn try_spawn_proxy_with(
    pki: &DevPki,
    state: &Path,
    listen: &str,
    test_mode: bool,
    flags: &[&str],
) -> Option<(Proc, String)> {
    let mut cmd = Command::new(bin("proxy"));
    cmd.args(["--listen", listen]).args(flags);
    cmd.arg("--state").arg(state);
    cmd.args(tls_args(&pki.proxy));
    if test_mode {
        cmd.arg("--allow-noise-free-for-testing");
    }
    // Held as a Proc at once: killed and reaped on every path.
    let mut proc = Proc(
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start proxy"),
    );
    let stdout = proc.0.stdout.take().expect("proxy stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("proxy prints its address");
    let addr = line.trim().strip_prefix("listening on ")?.to_string();
    Some((proc, addr))
}

/// Runs a command to completion and returns its output.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run command")
}

/// The outcome of a run, as text, for assertion messages.
pub fn describe(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Rows after the study's public preprocessing (bounds, [-1, 1], norm clip), both
/// as floats and as the exact fixed-point values the owners encrypt.
pub fn preprocess(
    rows: &[Vec<f64>],
    bounds: &[(f64, f64)],
    fixed: &FixedPoint,
) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let scale = fixed.scale();
    rows.iter()
        .map(|r| {
            let (x, _) = normalize_row(r, bounds, fixed.row_norm_bound);
            let q = fixed
                .encode_row(&x)
                .iter()
                .map(|&v| v as f64 / scale)
                .collect();
            (x, q)
        })
        .unzip()
}

/// Reads a numeric CSV matrix with a header row and, if `first_is_name`, a leading
/// name column.
pub fn read_matrix(path: &Path, first_is_name: bool) -> DMatrix<f64> {
    let mut r = csv::Reader::from_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let rows: Vec<Vec<f64>> = r
        .records()
        .map(|rec| {
            let rec = rec.expect("csv record");
            rec.iter()
                .skip(usize::from(first_is_name))
                .map(|c| c.parse::<f64>().expect("numeric cell"))
                .collect()
        })
        .collect();
    let cols = rows.first().map_or(0, Vec::len);
    DMatrix::from_fn(rows.len(), cols, |i, j| rows[i][j])
}

/// A single-threaded runtime for tests that call the proxy as a client.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A proxy (its real program, on mutual TLS) with one open study, the user's key and
/// a temp folder: tests drive it as each party would.
pub struct StudyFixture {
    /// The running proxy.
    pub proxy: TestProxy,
    /// Its URL.
    pub url: String,
    /// The open study's id.
    pub study: String,
    /// The user's key fingerprint, which owners pin.
    pub fingerprint: String,
    /// The study's spec.
    pub spec: StudySpec,
    /// The user's secret key.
    pub sk: SecretKey,
    /// Scratch folder for owners' files.
    pub dir: tempfile::TempDir,
    /// The mask holder's process and URL, where the study has one.
    pub holder: Option<(Proc, String)>,
}

/// A proxy with one open study of [`optdigits_spec`] (quorum 2), opened by `user`.
pub fn fixture() -> StudyFixture {
    fixture_with(|_| {})
}

/// As [`fixture`], with the spec changed by `edit` before the study is opened.
pub fn fixture_with(edit: impl FnOnce(&mut SpecDraft)) -> StudyFixture {
    fixture_on(&[], edit)
}

/// As [`fixture_with`], on a proxy started with further `flags`.
pub fn fixture_on(flags: &[&str], edit: impl FnOnce(&mut SpecDraft)) -> StudyFixture {
    let proxy = start_proxy_with(false, flags);
    fixture_at(proxy, None, edit)
}

/// As [`fixture_with`], with a second proxy holding the owners' mask seeds
/// (`StudySpec::mask_holder`), on the same PKI.
pub fn masked_fixture_with(edit: impl FnOnce(&mut SpecDraft)) -> StudyFixture {
    let proxy = start_proxy(false);
    let state = proxy._dir.path().join("holder.redb");
    let (proc, addr) = try_spawn_proxy_with(&proxy.pki, &state, "127.0.0.1:0", false, &[])
        .expect("the mask holder starts");
    let holder = (proc, format!("https://{addr}"));
    fixture_at(proxy, Some(holder), edit)
}

/// The fixture's study opened at `proxy`, held at `holder` (its process and
/// URL) if given.
fn fixture_at(
    proxy: TestProxy,
    holder: Option<(Proc, String)>,
    edit: impl FnOnce(&mut SpecDraft),
) -> StudyFixture {
    let url = proxy.url.clone();
    let sk = SecretKey::generate(2048, &mut rand::rngs::OsRng).expect("keygen");
    let mut draft = optdigits_draft(sk.public());
    draft.mask_holder = holder.as_ref().map(|(_, url)| url.clone());
    edit(&mut draft);
    let spec = draft.validate().expect("the fixture's spec");
    let study = rt().block_on(async {
        let transport = proxy.transport("user");
        let mut c = dpca_shell::client::connect(&url, &transport)
            .await
            .expect("connect");
        dpca_user::session::open_study(&mut c, &spec, false, &transport)
            .await
            .expect("open study")
    });
    StudyFixture {
        proxy,
        url,
        study,
        fingerprint: sk.public().fingerprint(),
        spec,
        sk,
        dir: tempfile::tempdir().expect("tempdir"),
        holder,
    }
}

impl StudyFixture {
    /// A client with `name`'s certificate.
    pub async fn client(
        &self,
        name: &str,
    ) -> dpca_proto::v1::proxy_client::ProxyClient<tonic::transport::Channel> {
        dpca_shell::client::connect(&self.url, &self.proxy.transport(name))
            .await
            .expect("connect")
    }

    /// The owner program with `id`'s certificate and a budget cap of epsilon 1.5.
    pub fn owner_cmd(&self, id: &str) -> Command {
        let mut cmd = Command::new(bin("owner"));
        cmd.args(self.proxy.tls_args(id));
        cmd.args(["--budget-cap", "1.5,1e-4"]);
        cmd
    }

    /// The refusal `client` gets when it asks for the study's result; panics if a
    /// result is served.
    pub async fn fetch_refused(
        &self,
        client: &mut dpca_proto::v1::proxy_client::ProxyClient<tonic::transport::Channel>,
    ) -> tonic::Status {
        let req = dpca_proto::v1::FetchResultRequest {
            study_id: self.study.clone(),
        };
        match client.fetch_result(req).await {
            Ok(_) => panic!("a result of study {} was served", self.study),
            Err(status) => status,
        }
    }

    /// Starts owner `id` on `data` for the study without waiting for it.
    pub fn spawn_owner(&self, id: &str, data: &Path) -> Proc {
        let mut cmd = self.owner_cmd(id);
        cmd.args(["--owner-id", id]);
        submit_args(&mut cmd, &self.url, &self.study, &self.fingerprint, data);
        Proc(
            cmd.stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start owner"),
        )
    }

    /// Runs the honest owner `hospital-a` on 20 rows and returns whether it was
    /// through, successfully, within `limit` (`Err` says how it was not).
    pub fn honest_owner_within(&self, limit: std::time::Duration) -> Result<(), String> {
        let data = self.good_file("honest.csv", 20, 0);
        let owner = self.spawn_owner("hospital-a", &data);
        match finish_within(owner, limit) {
            Some(out) if out.status.success() => Ok(()),
            Some(out) => Err(describe(&out)),
            None => Err(format!("the owner was not through in {limit:?}")),
        }
    }

    /// `ciphertexts` framed as owner `owner` would send them for the study: chunks
    /// of the protocol's size, the header (id `cid`, cap epsilon 1.5) on the first.
    pub fn contribution(
        &self,
        owner: &str,
        cid: &str,
        ciphertexts: &[Vec<u8>],
    ) -> Vec<dpca_proto::v1::ContributionChunk> {
        let mut chunks: Vec<_> = ciphertexts
            .chunks(dpca_proto::convert::CIPHERTEXTS_PER_CHUNK)
            .map(|c| dpca_proto::v1::ContributionChunk {
                ciphertexts: c.to_vec(),
                ..Default::default()
            })
            .collect();
        if let Some(first) = chunks.first_mut() {
            first.study_id = self.study.clone();
            first.owner_id = owner.into();
            first.contribution_id = cid.into();
            first.total_ciphertexts = ciphertexts.len() as u32;
            first.layout = dpca_common::study::LAYOUT_VERSION;
            first.cap_epsilon = 1.5;
            first.cap_delta = 1e-4;
        }
        chunks
    }

    /// Runs owner `id` on `data` for the study.
    pub fn owner(&self, id: &str, data: &Path) -> Output {
        self.owner_accepting(id, data, &[])
    }

    /// Runs owner `id` on `data` for the study, accepting the named risks
    /// (`--accept-risk`).
    pub fn owner_accepting(&self, id: &str, data: &Path, risks: &[&str]) -> Output {
        let flags: Vec<&str> = risks.iter().flat_map(|r| ["--accept-risk", r]).collect();
        self.owner_with(id, data, &flags)
    }

    /// Runs owner `id` on `data` for the study with further `flags`.
    pub fn owner_with(&self, id: &str, data: &Path, flags: &[&str]) -> Output {
        let mut cmd = self.owner_cmd(id);
        cmd.args(["--owner-id", id]).args(flags);
        submit(cmd, &self.url, &self.study, &self.fingerprint, data)
    }

    /// Owners the proxy has counted.
    pub fn owners_in(&self) -> u32 {
        rt().block_on(async {
            let mut c = self.client("user").await;
            c.get_study(dpca_proto::v1::GetStudyRequest {
                study_id: self.study.clone(),
            })
            .await
            .expect("get study")
            .into_inner()
            .owners_in
        })
    }

    /// `rows` optdigits rows from `skip` on, written to `name` in the scratch folder.
    pub fn good_file(&self, name: &str, rows: usize, skip: usize) -> PathBuf {
        let p = self.dir.path().join(name);
        write_slice(&optdigits(), skip, rows, &p);
        p
    }
}

/// Runs the owner program `cmd` (certificate and cap already given) on `data`
/// (label column `label`) for `study` at `url`, pinning `fingerprint`.
pub fn submit(mut cmd: Command, url: &str, study: &str, fingerprint: &str, data: &Path) -> Output {
    submit_args(&mut cmd, url, study, fingerprint, data);
    run(&mut cmd)
}

fn submit_args(cmd: &mut Command, url: &str, study: &str, fingerprint: &str, data: &Path) {
    cmd.args(["--proxy", url, "--study", study])
        .arg("--data")
        .arg(data)
        .args([
            "--key-fingerprint",
            fingerprint,
            "--label",
            "label",
            "--quiet",
        ]);
}

/// Waits up to `limit` for a started program to end and returns its output;
/// `None` (the program killed) if it had not ended by then.
pub fn finish_within(mut proc: Proc, limit: std::time::Duration) -> Option<Output> {
    let until = std::time::Instant::now() + limit;
    while std::time::Instant::now() < until {
        if let Ok(Some(status)) = proc.0.try_wait() {
            let read = |pipe: Option<&mut dyn Read>| {
                let mut bytes = Vec::new();
                if let Some(p) = pipe {
                    let _ = p.read_to_end(&mut bytes);
                }
                bytes
            };
            let stdout = read(proc.0.stdout.as_mut().map(|p| p as &mut dyn Read));
            let stderr = read(proc.0.stderr.as_mut().map(|p| p as &mut dyn Read));
            return Some(Output {
                status,
                stdout,
                stderr,
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    None
}
