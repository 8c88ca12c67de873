//! Small pieces of the programs' wording, and the one way text from another party
//! reaches a terminal.
//!
//! A proxy's refusal, a study's feature names and the ids in a status table are
//! written by parties the reader does not trust. Printed raw, an escape sequence in
//! them can retitle the terminal, clear it, move the cursor over earlier lines or
//! reorder a line with bidirectional controls, so that a refusal reads as a
//! success. The names and ids a spec carries are refused with such characters
//! (`dpca_common::study::check_no_terminal_controls`), and so is a study id that
//! is not one (`invitation::check_study_id`); free text (a refusal) is printed
//! through [`printable`], errors, whose chains carry it, through [`error_report`],
//! and log lines, whose fields carry it, through the log writer (`logging`).

use dpca_common::study::is_terminal_control;
use std::borrow::Cow;
use std::fmt::Write as _;

/// `n` and the noun, singular for one: "1 owner", "5 owners".
pub fn count(n: impl Into<u64>, noun: &str) -> String {
    match n.into() {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    }
}

/// `s` with every character that changes how a terminal shows what follows it
/// ([`is_terminal_control`]) written as `\u{..}`; `s` itself when it has none.
pub fn printable(s: &str) -> Cow<'_, str> {
    escaped(s, |out, c| write!(out, "\\u{{{:x}}}", u32::from(c)))
}

/// As [`printable`], in JSON's form (`\u009b`): for text that stands inside a
/// JSON string, as every such character of a JSON log line does.
pub fn json_printable(s: &str) -> Cow<'_, str> {
    escaped(s, |out, c| write!(out, "\\u{:04x}", u32::from(c)))
}

fn escaped(s: &str, escape: fn(&mut String, char) -> std::fmt::Result) -> Cow<'_, str> {
    if !s.chars().any(is_terminal_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if is_terminal_control(c) {
            let _ = escape(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// An error and its causes as a program prints them on exiting ("Error: ..." and
/// a numbered "Caused by" list, as `anyhow` does), each message [`printable`].
pub fn error_report(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = format!("Error: {}", printable(&error.to_string()));
    let causes: Vec<String> = std::iter::successors(error.source(), |e| e.source())
        .map(|e| printable(&e.to_string()).into_owned())
        .collect();
    if !causes.is_empty() {
        out.push_str("\n\nCaused by:");
        for (i, cause) in causes.iter().enumerate() {
            let _ = write!(out, "\n    {i}: {cause}");
        }
    }
    out
}

/// The exit of a program whose `main` ended with `result`: success, or the
/// [`error_report`] on stderr and failure.
pub fn exit<E>(result: Result<(), E>) -> std::process::ExitCode
where
    E: AsRef<dyn std::error::Error + Send + Sync + 'static>,
{
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", error_report(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_is_singular_and_every_other_count_plural() {
        assert_eq!(count(1u32, "owner"), "1 owner");
        assert_eq!(count(0u32, "owner"), "0 owners");
        assert_eq!(count(5usize as u64, "contribution"), "5 contributions");
    }

    #[test]
    fn terminal_controls_are_escaped_and_other_text_kept() {
        assert!(matches!(
            printable("Zürich, naïve, 東京 f1"),
            Cow::Borrowed(_)
        ));
        let hostile = "ok\x1b]0;owned\x07\x1b[2J\r\ncounted\u{9b}31m\u{202e}txt.exe\x7f";
        let shown = printable(hostile);
        assert!(!shown.chars().any(is_terminal_control), "{shown:?}");
        assert_eq!(
            shown,
            "ok\\u{1b}]0;owned\\u{7}\\u{1b}[2J\\u{d}\\u{a}counted\\u{9b}31m\\u{202e}txt.exe\\u{7f}"
        );
        let json = format!("{{\"m\":{}}}", serde_json::json!(hostile));
        let shown = json_printable(&json);
        assert!(!shown.chars().any(is_terminal_control), "{shown:?}");
        let back: serde_json::Value = serde_json::from_str(&shown).expect("still JSON");
        assert_eq!(back["m"], hostile, "the escapes are JSON's own");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("refused: {0}")]
    struct Outer(String, #[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("the proxy says {0}")]
    struct Inner(String);

    #[test]
    fn an_error_report_escapes_every_message_of_the_chain() {
        let e = Outer("\x1b[2J".into(), Inner("fine\u{202e}".into()));
        assert_eq!(
            error_report(&e),
            "Error: refused: \\u{1b}[2J\n\nCaused by:\n    0: the proxy says fine\\u{202e}"
        );
        assert_eq!(error_report(&Inner("x".into())), "Error: the proxy says x");
    }
}
