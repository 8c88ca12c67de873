//! The one logging setup every role binary shares: `tracing` to stderr (stdout
//! carries the programs' machine-readable output), filtered by `RUST_LOG`, as text
//! for people or, on request, one JSON object per line for a log collector.

/// How log lines are written.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, message, fields).
    Json,
}

/// The logging flag every program takes.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct LogArgs {
    /// Log lines on stderr as `text` or `json` (one object per line); the level
    /// comes from RUST_LOG (e.g. `info`, `dpca_proxy=debug`), warnings and errors
    /// without it.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "DPCA_LOG_FORMAT",
          global = true)]
    pub log_format: LogFormat,
}

/// Installs the stderr subscriber; call once at the start of `main`, after the
/// arguments are parsed.
pub fn init(args: &LogArgs) {
    // Without RUST_LOG, warnings too: a proxy that cannot raise its descriptor
    // limit, an owner retrying an unreachable proxy, a user decrypting without the
    // owners' signatures must be seen (the filter's own default is errors only).
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing::level_filters::LevelFilter::WARN.into())
        .from_env_lossy();
    // No colours: every line is escaped as it is written (`EscapedStderr`), which
    // would show a colour's escape sequence as text.
    let json = args.log_format == LogFormat::Json;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(move || EscapedStderr { json });
    // A host process (the Python package) may run a role more than once, or have
    // set its own subscriber: the first one stays.
    let _ = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Standard error, each log line written with the characters that drive a terminal
/// escaped (`text::printable`; in JSON's form for JSON lines). A log line carries
/// other parties' text in its fields (a proxy's refusal as the error a retry logs),
/// which `tracing-subscriber` writes as they are: only its message field is
/// escaped, and of the controls only some. The subscriber writes each event whole
/// in one call, so a line is never split between two.
#[derive(Clone, Copy)]
struct EscapedStderr {
    json: bool,
}

impl std::io::Write for EscapedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let (line, end) = text.strip_suffix('\n').map_or((&*text, ""), |l| (l, "\n"));
        let line = if self.json {
            crate::text::json_printable(line)
        } else {
            crate::text::printable(line)
        };
        std::io::stderr()
            .lock()
            .write_all(format!("{line}{end}").as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}
