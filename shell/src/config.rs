//! A TOML config file for every program: `--config FILE` (or `DPCA_CONFIG`).
//!
//! Keys are the programs' long flag names (`tls-ca` or `tls_ca`); the settings of a
//! subcommand sit in a table named after it (`[status]`, `[local]`). The file only
//! supplies defaults: an environment variable of a flag overrides the file, and the
//! flag on the command line overrides both. Unknown keys, and hidden (test-only)
//! flags, are refused with the file and the key named, so a typo never silently
//! falls back to a default.

use std::ffi::OsString;
use std::path::PathBuf;

/// Why a config file could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not TOML, or a setting is not one the program has.
    #[error("config {}: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the key.
        reason: String,
    },
}

/// Parses the program's command line with its config file applied: what every
/// role's `main` calls instead of `T::parse()`.
pub fn parse<T: clap::Parser>() -> Result<T, ConfigError> {
    parse_from(std::env::args_os().collect())
}

/// [`parse`] of `args` (program name first) instead of the process's own: for a
/// program run from a host process (the Python package runs the roles this way).
pub fn parse_from<T: clap::Parser>(args: Vec<OsString>) -> Result<T, ConfigError> {
    let args = with_config(&T::command(), args, |k| std::env::var(k).ok())?;
    Ok(T::parse_from(args))
}

/// `args` (program name first) with the settings of the config file they name, or
/// that `env("DPCA_CONFIG")` names, appended as flags, except those the command
/// line or the flag's environment variable already sets. Without a config file,
/// `args` unchanged.
pub fn with_config(
    cmd: &clap::Command,
    args: Vec<OsString>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Vec<OsString>, ConfigError> {
    let strings: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let Some(path) = config_path(&strings).or_else(|| env("DPCA_CONFIG")) else {
        return Ok(args);
    };
    let file = ConfigFile::read(PathBuf::from(path))?;
    // The subcommand invoked, if any: its settings are in its own table.
    let sub = strings
        .iter()
        .skip(1)
        .find_map(|a| cmd.find_subcommand(a).map(|c| (a.as_str(), c)));
    let (target, settings, where_) = match sub {
        Some((name, c)) => {
            let settings = match file.table.get(name) {
                Some(toml::Value::Table(t)) => t.clone(),
                Some(_) => return Err(file.invalid(format!("`{name}` must be a table"))),
                None => toml::Table::new(),
            };
            file.check_root_keys(cmd, name)?;
            (c, settings, format!("`{} {name}`", cmd.get_name()))
        }
        None => (cmd, file.table.clone(), format!("`{}`", cmd.get_name())),
    };
    let mut out = args;
    for (key, value) in &settings {
        if sub.is_none() && cmd.find_subcommand(key).is_some() {
            continue; // another subcommand's table
        }
        let long = key.replace('_', "-");
        let arg = target
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()) && !a.is_hide_set() && long != "config")
            .ok_or_else(|| file.invalid(format!("{where_} has no setting `{key}`")))?;
        let flag = format!("--{long}");
        let on_command_line = strings
            .iter()
            .any(|a| *a == flag || a.starts_with(&format!("{flag}=")));
        let in_env = || {
            arg.get_env()
                .is_some_and(|var| env(&var.to_string_lossy()).is_some())
        };
        if !on_command_line && !in_env() {
            out.extend(file.as_flags(key, &flag, value)?);
        }
    }
    Ok(out)
}

/// The file `--config FILE` or `--config=FILE` names on the command line.
fn config_path(args: &[String]) -> Option<String> {
    args.iter().enumerate().find_map(|(i, a)| {
        if a == "--config" {
            args.get(i + 1).cloned()
        } else {
            a.strip_prefix("--config=").map(str::to_string)
        }
    })
}

/// A config file read and parsed, and where it came from, for the errors.
struct ConfigFile {
    path: PathBuf,
    table: toml::Table,
}

impl ConfigFile {
    fn read(path: PathBuf) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        match toml::from_str(&text) {
            Ok(table) => Ok(Self { path, table }),
            Err(e) => Err(ConfigError::Invalid {
                path,
                reason: e.to_string(),
            }),
        }
    }

    fn invalid(&self, reason: String) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.clone(),
            reason,
        }
    }

    /// With subcommand `sub` invoked, top-level keys are the root's (one file can
    /// serve both) or other subcommands' tables; a subcommand's settings sit in its
    /// table.
    fn check_root_keys(&self, cmd: &clap::Command, sub: &str) -> Result<(), ConfigError> {
        for key in self.table.keys() {
            let long = key.replace('_', "-");
            let root_arg = cmd
                .get_arguments()
                .any(|a| a.get_long() == Some(long.as_str()) && !a.is_hide_set());
            if cmd.find_subcommand(key).is_none() && !root_arg {
                return Err(self.invalid(format!(
                    "`{}` has no setting `{key}`; the settings of `{sub}` go in a \
                     [{sub}] table",
                    cmd.get_name()
                )));
            }
        }
        Ok(())
    }

    /// The flags setting `key` to `value`: a true switch is the flag alone, a
    /// false one nothing, a list its items joined by commas.
    fn as_flags(
        &self,
        key: &str,
        flag: &str,
        value: &toml::Value,
    ) -> Result<Vec<OsString>, ConfigError> {
        let text = |v: &toml::Value| match v {
            toml::Value::String(s) => Ok(s.clone()),
            toml::Value::Integer(i) => Ok(i.to_string()),
            toml::Value::Float(f) => Ok(f.to_string()),
            _ => Err(self.invalid(format!("`{key}`: expected a string or a number"))),
        };
        Ok(match value {
            toml::Value::Boolean(true) => vec![flag.into()],
            toml::Value::Boolean(false) => Vec::new(),
            toml::Value::Array(items) => {
                let parts = items.iter().map(text).collect::<Result<Vec<_>, _>>()?;
                vec![flag.into(), parts.join(",").into()]
            }
            v => vec![flag.into(), text(v)?.into()],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction, Command};
    use std::path::Path;

    /// The first problem of `path` as the config of `cmd`, if any.
    fn check(cmd: &clap::Command, path: &Path) -> Result<(), ConfigError> {
        let args = vec![
            OsString::from(cmd.get_name()),
            "--config".into(),
            path.into(),
        ];
        with_config(cmd, args, |_| None).map(|_| ())
    }

    fn cmd() -> Command {
        Command::new("prog")
            .arg(Arg::new("config").long("config"))
            .arg(Arg::new("proxy").long("proxy").env("P_PROXY"))
            .arg(Arg::new("retry-for").long("retry-for"))
            .arg(Arg::new("quiet").long("quiet").action(ArgAction::SetTrue))
            .arg(Arg::new("secret").long("secret").hide(true))
            .subcommand(
                Command::new("status")
                    .arg(Arg::new("json").long("json").action(ArgAction::SetTrue)),
            )
    }

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("c.toml");
        std::fs::write(&p, text).expect("write");
        (dir, p)
    }

    fn run(args: &[&str], env: &[(&str, &str)]) -> Result<Vec<String>, ConfigError> {
        let args = args.iter().map(OsString::from).collect();
        with_config(&cmd(), args, |k| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
        .map(|v| v.iter().map(|a| a.to_string_lossy().into_owned()).collect())
    }

    #[test]
    fn the_file_gives_defaults_that_env_and_flags_override() {
        let (_d, p) =
            file("proxy = \"https://a\"\nretry_for = 5\nquiet = true\n[status]\njson = true\n");
        let p = p.to_string_lossy().into_owned();
        let got = run(&["prog", "--config", &p], &[]).expect("ok");
        assert_eq!(
            got[3..],
            ["--proxy", "https://a", "--quiet", "--retry-for", "5"]
        );
        // The environment variable of `proxy` wins over the file.
        let got = run(&["prog", "--config", &p], &[("P_PROXY", "https://b")]).expect("ok");
        assert!(!got.contains(&"https://a".to_string()), "{got:?}");
        // A flag on the command line wins over both.
        let got = run(&["prog", "--config", &p, "--retry-for=9"], &[]).expect("ok");
        assert!(!got.contains(&"5".to_string()), "{got:?}");
        // A subcommand reads its own table, and refuses the root's keys there.
        let (_d2, sp) = file("[status]\njson = true\n");
        let sp = sp.to_string_lossy().into_owned();
        let got = run(&["prog", "status", "--config", &sp], &[]).expect("ok");
        assert_eq!(got[4..], ["--json"]);
        let got = run(&["prog", "status", "--config", &p], &[]).expect("root keys ignored");
        assert_eq!(got[4..], ["--json"]);
        let (_d3, bad) = file("json = true\n");
        let bad = bad.to_string_lossy().into_owned();
        let err = run(&["prog", "status", "--config", &bad], &[]).expect_err("misplaced");
        assert!(err.to_string().contains("[status] table"), "{err}");
        // DPCA_CONFIG names the file when no flag does.
        let got = run(&["prog"], &[("DPCA_CONFIG", &p)]).expect("ok");
        assert!(got.contains(&"--quiet".to_string()));
        assert_eq!(run(&["prog"], &[]).expect("no config"), ["prog"]);
    }

    #[test]
    fn unknown_and_hidden_keys_are_refused_by_name() {
        for (text, says) in [
            ("proxxy = \"x\"\n", "no setting `proxxy`"),
            ("secret = \"x\"\n", "no setting `secret`"),
            ("proxy = { a = 1 }\n", "`proxy`: expected"),
            ("proxy = \n", "c.toml"),
        ] {
            let (_d, p) = file(text);
            let err = check(&cmd(), &p).expect_err(text).to_string();
            assert!(err.contains(says), "{text}: {err}");
        }
    }
}
