//! `proxy status`: what the operator (or a user) sees of a running proxy, rendered
//! as a table. Only counts, names, deadlines and budgets: never data.

use std::fmt::Write;

use dpca_proto::v1;
use dpca_shell::client::{answered, connect_for_status, status_message};
use dpca_shell::text::printable;
use dpca_shell::tls::Transport;

/// Asks the proxy at `url` for its status.
pub async fn fetch(url: &str, transport: &Transport) -> anyhow::Result<v1::ProxyStatus> {
    let mut client = connect_for_status(url, transport).await?;
    Ok(answered("the status", client.status(v1::StatusRequest {}))
        .await
        .map_err(|s| anyhow::anyhow!("proxy refused the status: {}", status_message(&s)))?
        .into_inner())
}

/// The state of a study whose stored record this build cannot read: set aside at
/// startup, not served, listed for the operator with its id alone.
pub const UNREADABLE: &str = "unreadable";

/// The owners a summary counts in: its count, or, from a proxy that sends none
/// (a build before the lists were cut short), its names.
fn owners_in(s: &v1::StudySummary) -> usize {
    (s.owners_in_count as usize).max(s.owners_in.len())
}

/// The missing owners a summary names, and how many more it does not.
fn missing(s: &v1::StudySummary) -> String {
    if s.owners_missing.is_empty() {
        return "-".into();
    }
    let names = printable(&s.owners_missing.join(",")).into_owned();
    match (s.owners_missing_count as usize).saturating_sub(s.owners_missing.len()) {
        0 => names,
        more => format!("{names} and {more} more"),
    }
}

/// The status as text: one line per study (state, owners in of the quorum, who is
/// missing, deadline relative to `now_ms`, budget), then each owner's budget.
pub fn render(status: &v1::ProxyStatus, now_ms: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<32}  {:<10}  {:>9}  {:>12}  {:<20}  {:<10}  missing",
        "study", "state", "owners", "deadline", "budget", "user"
    );
    for s in &status.studies {
        if s.state == UNREADABLE {
            let why = "its record cannot be read by this build (the proxy's log says why)";
            let id = printable(&s.study_id);
            let _ = writeln!(out, "{id:<32}  {UNREADABLE:<10}  {why}");
            continue;
        }
        let left = s.deadline_unix_ms as i64 - now_ms as i64;
        let deadline = if left >= 0 {
            format!("in {}s", left / 1000)
        } else {
            format!("{}s ago", -left / 1000)
        };
        let _ = writeln!(
            out,
            "{:<32}  {:<10}  {:>9}  {:>12}  {:<20}  {:<10}  {}",
            printable(&s.study_id),
            printable(&s.state),
            format!("{}/{} (>={})", owners_in(s), s.quorum, s.min_owners),
            deadline,
            format!(
                "{} e={} d={:.1e}",
                printable(&s.mechanism),
                s.epsilon,
                s.delta
            ),
            printable(&s.opened_by),
            missing(s)
        );
    }
    if !status.budgets.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<20}  {:>22}  {:>22}  {:>7}",
            "owner", "spent epsilon / cap", "spent delta / cap", "studies"
        );
        for b in &status.budgets {
            let _ = writeln!(
                out,
                "{:<20}  {:>22}  {:>22}  {:>7}",
                printable(&b.owner_id),
                format!("{:.4} / {}", b.spent_epsilon, b.cap_epsilon),
                format!("{:.2e} / {:.2e}", b.spent_delta, b.cap_delta),
                b.studies
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_shows_owners_missing_deadlines_and_budgets() {
        let text = render(&status_of("s1", "b", "a"), 70_000);
        assert!(text.contains("1/3 (>=1)"), "{text}");
        assert!(text.contains("60s ago"), "{text}");
        assert!(text.contains("b,c"), "{text}");
        assert!(text.contains("1.0000 / 2"), "{text}");
        assert!(text.contains("alice"), "{text}");
    }

    /// A summary names the first missing owners and says how many more there are;
    /// the owners column counts them all.
    #[test]
    fn the_table_says_how_many_owners_its_names_leave_out() {
        let mut status = status_of("s1", "b", "a");
        let s = &mut status.studies[0];
        s.owners_in_count = 40;
        s.quorum = 5000;
        s.owners_missing_count = 4960;
        let text = render(&status, 70_000);
        assert!(text.contains("40/5000 (>=1)"), "{text}");
        assert!(text.contains("b,c and 4958 more"), "{text}");
        // A proxy that sends no counts has its names counted.
        let s = &mut status.studies[0];
        (s.owners_in, s.owners_in_count, s.owners_missing_count) = (vec!["a".into(); 2], 0, 0);
        let text = render(&status, 70_000);
        assert!(text.contains("2/5000 (>=1)"), "{text}");
        assert!(text.contains("b,c\n") && !text.contains("more"), "{text}");
    }

    /// A study set aside at startup shows its id and why it is not served, not
    /// the zeros of a summary it has none of.
    #[test]
    fn an_unreadable_study_shows_its_id_and_why() {
        let mut status = status_of("s1", "b", "a");
        status.studies.push(v1::StudySummary {
            study_id: "s2".into(),
            state: UNREADABLE.into(),
            ..Default::default()
        });
        let text = render(&status, 70_000);
        let line = text.lines().find(|l| l.starts_with("s2")).expect("listed");
        assert!(
            line.contains("unreadable") && line.contains("log"),
            "{line}"
        );
        assert!(!line.contains("0/0"), "{line}");
    }

    /// A status from a proxy the reader does not run (or ids a lax proxy took in)
    /// can write escape sequences; the table shows them escaped.
    #[test]
    fn the_table_escapes_terminal_controls_in_what_it_shows() {
        let clear = "\x1b[2J";
        let text = render(&status_of(clear, "b\x1b]0;t\x07", "a\u{202e}"), 0);
        assert!(
            !text
                .chars()
                .any(|c| c != '\n' && dpca_common::study::is_terminal_control(c)),
            "{text:?}"
        );
        assert!(text.contains("\\u{1b}[2J"), "{text}");
        assert!(text.contains("a\\u{202e}"), "{text}");
    }

    fn status_of(study: &str, missing: &str, owner: &str) -> v1::ProxyStatus {
        v1::ProxyStatus {
            studies: vec![v1::StudySummary {
                study_id: study.into(),
                state: "sealed".into(),
                owners_in: vec!["a".into()],
                owners_in_count: 1,
                owners_missing: vec![missing.into(), "c".into()],
                owners_missing_count: 2,
                min_owners: 1,
                quorum: 3,
                deadline_unix_ms: 10_000,
                mechanism: "gaussian".into(),
                epsilon: 1.0,
                delta: 1e-5,
                opened_by: "alice".into(),
            }],
            budgets: vec![v1::OwnerBudgetSummary {
                owner_id: owner.into(),
                spent_epsilon: 1.0,
                spent_delta: 1e-5,
                cap_epsilon: 2.0,
                cap_delta: 1e-4,
                studies: 1,
            }],
        }
    }
}
