//! The wall clock as the protocol reads it: study deadlines are milliseconds since
//! the Unix epoch, and a party bounds a wait that a deadline ends by that deadline
//! on its own clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// This machine's clock reads before the Unix epoch, so no deadline can be
/// compared with it.
#[derive(Debug, thiserror::Error)]
#[error("the clock reads before 1970")]
pub struct ClockBeforeEpoch;

/// Milliseconds since the Unix epoch on this machine's clock, as study deadlines
/// are written; an error if the clock reads before 1970.
pub fn now_unix_ms() -> Result<u64, ClockBeforeEpoch> {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|_| ClockBeforeEpoch)?;
    // u64 milliseconds last 584 million years.
    Ok(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

/// How long a wait that the deadline `deadline_unix_ms` ends may last, from
/// `now_unix_ms`: until the deadline, then `grace` (none of the deadline is left
/// once it has passed).
pub fn until_past(deadline_unix_ms: u64, now_unix_ms: u64, grace: Duration) -> Duration {
    Duration::from_millis(deadline_unix_ms.saturating_sub(now_unix_ms)).saturating_add(grace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_lasts_until_the_deadline_then_the_grace() {
        let grace = Duration::from_secs(7);
        assert_eq!(until_past(10_000, 4_000, grace), Duration::from_secs(13));
        assert_eq!(until_past(4_000, 10_000, grace), grace);
        assert_eq!(until_past(u64::MAX, 0, Duration::MAX), Duration::MAX);
    }
}
