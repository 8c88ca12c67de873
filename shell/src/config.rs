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
    let from_args = strings.iter().enumerate().find_map(|(i, a)| {
        if a == "--config" {
            strings.get(i + 1).cloned()
        } else {
            a.strip_prefix("--config=").map(str::to_string)
        }
    });
    let Some(path) = from_args.or_else(|| env("DPCA_CONFIG")).map(PathBuf::from) else {
        return Ok(args);
    };
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
        path: path.clone(),
        source,
    })?;
    let invalid = |reason: String| ConfigError::Invalid {
        path: path.clone(),
        reason,
    };
    let table: toml::Table = toml::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    // The subcommand invoked, if any: its settings are in its own table.
    let sub = strings
        .iter()
        .skip(1)
        .find_map(|a| cmd.find_subcommand(a).map(|c| (a.clone(), c)));
    let (target, settings, where_) = match &sub {
        Some((name, c)) => {
            let t = match table.get(name.as_str()) {
                Some(toml::Value::Table(t)) => t.clone(),
                Some(_) => return Err(invalid(format!("`{name}` must be a table"))),
                None => toml::Table::new(),
            };
            (*c, t, format!("`{} {name}`", cmd.get_name()))
        }
        None => (cmd, table.clone(), format!("`{}`", cmd.get_name())),
    };
    if let Some((name, _)) = &sub {
        // Top-level keys are the root's (one file can serve both); a subcommand's
        // settings sit in its table.
        for key in table.keys() {
            let long = key.replace('_', "-");
            let root_arg = cmd
                .get_arguments()
                .any(|a| a.get_long() == Some(long.as_str()) && !a.is_hide_set());
            if cmd.find_subcommand(key).is_none() && !root_arg {
                return Err(invalid(format!(
                    "`{}` has no setting `{key}`; the settings of `{name}` go in a \
                     [{name}] table",
                    cmd.get_name()
                )));
            }
        }
    }
    let mut out = args;
    for (key, value) in &settings {
        if sub.is_none() && cmd.find_subcommand(key).is_some() {
            continue; // another subcommand's table
        }
        let long = key.replace('_', "-");
        let arg = target
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()) && !a.is_hide_set() && long != "config")
            .ok_or_else(|| invalid(format!("{where_} has no setting `{key}`")))?;
        let flag = format!("--{long}");
        if strings
            .iter()
            .any(|a| *a == flag || a.starts_with(&format!("{flag}=")))
        {
            continue;
        }
        if let Some(var) = arg.get_env() {
            if env(&var.to_string_lossy()).is_some() {
                continue;
            }
        }
        let text = |v: &toml::Value| -> Result<String, ConfigError> {
            match v {
                toml::Value::String(s) => Ok(s.clone()),
                toml::Value::Integer(i) => Ok(i.to_string()),
                toml::Value::Float(f) => Ok(f.to_string()),
                _ => Err(invalid(format!("`{key}`: expected a string or a number"))),
            }
        };
        match value {
            toml::Value::Boolean(true) => out.push(flag.into()),
            toml::Value::Boolean(false) => {}
            toml::Value::Array(items) => {
                let parts = items.iter().map(text).collect::<Result<Vec<_>, _>>()?;
                out.push(flag.into());
                out.push(parts.join(",").into());
            }
            v => {
                out.push(flag.into());
                out.push(text(v)?.into());
            }
        }
    }
    Ok(out)
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
