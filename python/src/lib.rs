//! `dpca._native`: the Python package's extension. It runs the `user` command
//! line's `local` and `study` in the calling process and the `proxy` and `owner`
//! programs in processes of their own (this interpreter loading this extension:
//! `dpca._study.role_launcher`, then `role_main`), so a study
//! started from Python is the same study as the command line's: the same option
//! parsing and checks, the same parties over gRPC with mutual TLS, the same files.

use std::ffi::OsString;
use std::future::Future;
use std::sync::mpsc;
use std::time::Duration;

use clap::Parser;
use dpca_owner::cli::Invocation;
use dpca_user::cli::{Cli, Cmd};
use dpca_user::programs::Programs;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;

create_exception!(
    _native,
    StudyError,
    PyException,
    "A study refused or failed; the message is the command line's, its causes included."
);

/// How often a running study lets Python look for Ctrl-C.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// Runs `user ARGS` (`local` or `study`); the proxy and owners it starts are
/// `launcher + [role, ...]`. Returns study.json's text.
#[pyfunction]
fn run_user(py: Python<'_>, args: Vec<String>, launcher: Vec<String>) -> PyResult<String> {
    // No config file: the caller passes every setting (`DPCA_CONFIG` is for the
    // command line, and would silently override what a call leaves at its default).
    let cli = Cli::try_parse_from(command_line("user", args))
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    dpca_shell::logging::init(&cli.log);
    let mut opts = match cli.command {
        Cmd::Local(a) => {
            let (opts, sweep) = a.options().map_err(value_error)?;
            if !sweep.is_empty() {
                return Err(PyValueError::new_err(
                    "--sweep is the command line's: run one local_study per epsilon",
                ));
            }
            opts
        }
        Cmd::Study(a) => a.options().map_err(value_error)?,
        _ => {
            return Err(PyValueError::new_err(
                "only `local` and `study` run from Python",
            ))
        }
    };
    opts.programs = Some(Programs::launched_by(&launcher).map_err(value_error)?);
    // Python raises the study's warnings as its own, worded for its arguments,
    // from study.json: printed here too they would arrive twice.
    opts.print_warnings = false;
    let report = block_interruptibly(py, async move { dpca_user::local::run(&opts).await })?;
    serde_json::to_string(&report).map_err(|e| StudyError::new_err(e.to_string()))
}

/// Runs `owner ARGS` on `rows`, the table's CSV bytes held in memory (`--data`
/// only names it); returns the owner's report as JSON and its warnings.
#[pyfunction]
fn contribute(py: Python<'_>, args: Vec<String>, rows: &[u8]) -> PyResult<(String, Vec<String>)> {
    let owner = Invocation::parse(command_line("owner", args))
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let rows = rows.to_vec();
    let done = block_interruptibly(py, async move { owner.contribute(Some(rows)).await })?;
    let report =
        serde_json::to_string(&done.report).map_err(|e| StudyError::new_err(e.to_string()))?;
    Ok((report, done.warnings))
}

/// Writes a development CA and certificates (`user dev-certs`, flat layout) for
/// the proxy (its host names), the users and the owners into `out`.
#[pyfunction]
fn dev_certs(
    out: std::path::PathBuf,
    proxy_hosts: Vec<String>,
    users: Vec<String>,
    owners: Vec<String>,
) -> PyResult<()> {
    let layout = dpca_shell::tls::DevPkiLayout::default();
    dpca_shell::tls::write_dev_pki_with(&out, &proxy_hosts, &users, &owners, layout)
        .map(drop)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// A program's command line: its name, then `args`.
fn command_line(program: &str, args: Vec<String>) -> Vec<OsString> {
    std::iter::once(program.to_string())
        .chain(args)
        .map(OsString::from)
        .collect()
}

/// Runs the `proxy` or `owner` program with `args`; returns its exit code (the
/// error, if any, printed to standard error as the program prints it).
#[pyfunction]
fn role_main(py: Python<'_>, role: &str, args: Vec<String>) -> PyResult<i32> {
    let argv = command_line(role, args);
    let result = match role {
        "proxy" => py.allow_threads(|| dpca_proxy::cli::main(argv)),
        "owner" => py.allow_threads(|| dpca_owner::cli::main(argv)),
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown role {other:?}: proxy or owner"
            )))
        }
    };
    match result {
        Ok(()) => Ok(0),
        Err(e) => {
            eprintln!("{}", dpca_shell::text::error_report(e.as_ref()));
            Ok(1)
        }
    }
}

/// What the study's thread sends back: its result, or `None` once cancelled.
type Outcome<T> = Option<anyhow::Result<T>>;

/// Starts a thread that runs `work` on `runtime` until it ends or `cancelled`
/// fires, and sends its outcome on the returned channel.
fn spawn_worker<T: Send + 'static>(
    runtime: tokio::runtime::Runtime,
    work: impl Future<Output = anyhow::Result<T>> + Send + 'static,
    cancelled: tokio::sync::oneshot::Receiver<()>,
) -> (std::thread::JoinHandle<()>, mpsc::Receiver<Outcome<T>>) {
    let (done, finished) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let run = std::panic::AssertUnwindSafe(|| {
            runtime.block_on(async {
                tokio::select! {
                    r = work => Some(r),
                    _ = cancelled => None,
                }
            })
        });
        // A panic is a bug; its message still reaches the caller as the error.
        let out = std::panic::catch_unwind(run).unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Some(Err(anyhow::anyhow!("the study panicked: {what}")))
        });
        // Dropping the runtime would wait for a key generation still running on a
        // blocking thread; the tasks left (owner processes' waits) are dropped,
        // which kills their processes.
        runtime.shutdown_timeout(Duration::from_secs(1));
        let _ = done.send(out);
    });
    (worker, finished)
}

/// Runs `work` on a runtime of its own, off the interpreter's lock, and returns its
/// result. Every `SIGNAL_POLL` the interpreter checks for signals: on Ctrl-C the
/// work is dropped (which kills the processes it started), the runtime is shut
/// down, and the KeyboardInterrupt is raised.
fn block_interruptibly<T: Send + 'static>(
    py: Python<'_>,
    work: impl Future<Output = anyhow::Result<T>> + Send + 'static,
) -> PyResult<T> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| StudyError::new_err(format!("cannot start a runtime: {e}")))?;
    let (cancel, cancelled) = tokio::sync::oneshot::channel::<()>();
    let (worker, mut finished) = spawn_worker(runtime, work, cancelled);
    let out = loop {
        // The receiver goes to the thread without the interpreter's lock and back
        // (a receiver is Send, not Sync).
        let (got, back) = py.allow_threads(move || (finished.recv_timeout(SIGNAL_POLL), finished));
        finished = back;
        match got {
            Ok(out) => break out,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                break Some(Err(anyhow::anyhow!(
                    "the study's thread ended without a result"
                )))
            }
        }
        if let Err(interrupt) = py.check_signals() {
            let _ = cancel.send(());
            let _ = py.allow_threads(|| worker.join());
            return Err(interrupt);
        }
    };
    let _ = py.allow_threads(|| worker.join());
    // A Ctrl-C that came as the study finished is not swallowed: Python might
    // otherwise end without ever raising it.
    py.check_signals()?;
    match out {
        Some(Ok(value)) => Ok(value),
        Some(Err(e)) => Err(StudyError::new_err(shown(&e))),
        None => Err(StudyError::new_err("the study was cancelled")),
    }
}

/// An error's messages, each escaped (`text::printable`), as an exception's text:
/// a traceback prints it to a terminal, and it carries the proxy's words.
fn shown(e: &anyhow::Error) -> String {
    dpca_shell::text::printable(&format!("{e:#}")).into_owned()
}

fn value_error(e: anyhow::Error) -> PyErr {
    PyValueError::new_err(shown(&e))
}

/// The extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("StudyError", m.py().get_type::<StudyError>())?;
    m.add("OUTPUT_FILES", dpca_user::report::OUTPUT_FILES.to_vec())?;
    m.add_function(wrap_pyfunction!(run_user, m)?)?;
    m.add_function(wrap_pyfunction!(role_main, m)?)?;
    m.add_function(wrap_pyfunction!(contribute, m)?)?;
    m.add_function(wrap_pyfunction!(dev_certs, m)?)?;
    Ok(())
}
