//! `proxy status`: what the operator (or a user) sees of a running proxy, rendered
//! as a table. Only counts, names, deadlines and budgets: never data.

use std::fmt::Write;

use dpca_proto::v1;
use dpca_shell::client::{answered, connect, status_message};
use dpca_shell::tls::Transport;

/// Asks the proxy at `url` for its status.
pub async fn fetch(url: &str, transport: &Transport) -> anyhow::Result<v1::ProxyStatus> {
    let mut client = connect(url, transport).await?;
    Ok(answered("the status", client.status(v1::StatusRequest {}))
        .await
        .map_err(|s| anyhow::anyhow!("proxy refused the status: {}", status_message(&s)))?
        .into_inner())
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
        let left = s.deadline_unix_ms as i64 - now_ms as i64;
        let deadline = if left >= 0 {
            format!("in {}s", left / 1000)
        } else {
            format!("{}s ago", -left / 1000)
        };
        let _ = writeln!(
            out,
            "{:<32}  {:<10}  {:>9}  {:>12}  {:<20}  {:<10}  {}",
            s.study_id,
            s.state,
            format!("{}/{} (>={})", s.owners_in.len(), s.quorum, s.min_owners),
            deadline,
            format!("{} e={} d={:.1e}", s.mechanism, s.epsilon, s.delta),
            s.opened_by,
            if s.owners_missing.is_empty() {
                "-".to_string()
            } else {
                s.owners_missing.join(",")
            }
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
                b.owner_id,
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
        let status = v1::ProxyStatus {
            studies: vec![v1::StudySummary {
                study_id: "s1".into(),
                state: "sealed".into(),
                owners_in: vec!["a".into()],
                owners_missing: vec!["b".into(), "c".into()],
                min_owners: 1,
                quorum: 3,
                deadline_unix_ms: 10_000,
                mechanism: "gaussian".into(),
                epsilon: 1.0,
                delta: 1e-5,
                opened_by: "alice".into(),
            }],
            budgets: vec![v1::OwnerBudgetSummary {
                owner_id: "a".into(),
                spent_epsilon: 1.0,
                spent_delta: 1e-5,
                cap_epsilon: 2.0,
                cap_delta: 1e-4,
                studies: 1,
            }],
        };
        let text = render(&status, 70_000);
        assert!(text.contains("1/3 (>=1)"), "{text}");
        assert!(text.contains("60s ago"), "{text}");
        assert!(text.contains("b,c"), "{text}");
        assert!(text.contains("1.0000 / 2"), "{text}");
        assert!(text.contains("alice"), "{text}");
    }
}
