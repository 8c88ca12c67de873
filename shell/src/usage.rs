//! CPU time and peak memory of a process, read from Linux's `/proc`, so every role
//! can report what it cost and benchmarks can compare roles with their primitive
//! bounds. Elsewhere the readings are simply absent.

use serde::{Deserialize, Serialize};

/// Resources a process has used so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// User plus system CPU seconds, over all threads.
    pub cpu_seconds: f64,
    /// Peak resident set size in bytes (`VmHWM`).
    pub peak_rss_bytes: u64,
}

impl Usage {
    /// This process's usage, if `/proc` is there.
    pub fn of_self() -> Option<Self> {
        Self::read("self")
    }

    /// Another process's usage (a child that is still running), if `/proc` is there.
    pub fn of_pid(pid: u32) -> Option<Self> {
        Self::read(&pid.to_string())
    }

    fn read(which: &str) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{which}/stat")).ok()?;
        let status = std::fs::read_to_string(format!("/proc/{which}/status")).ok()?;
        Some(Self {
            cpu_seconds: parse_cpu_ticks(&stat)? as f64 / CLOCK_TICKS_PER_SECOND,
            peak_rss_bytes: parse_peak_rss_kib(&status)? * 1024,
        })
    }
}

/// `sysconf(_SC_CLK_TCK)`: 100 on every Linux ABI in use (reading it would need
/// `libc` and `unsafe`, which this workspace forbids).
const CLOCK_TICKS_PER_SECOND: f64 = 100.0;

/// utime + stime from `/proc/PID/stat`. The command name (field 2) may hold spaces
/// and parentheses, so fields are counted from the last `)`.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3 of the man page, utime 14 and stime 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn parse_peak_rss_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_awkward_command_names() {
        let stat = "4242 (a) b (c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0";
        assert_eq!(parse_cpu_ticks(stat), Some(300));
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }

    #[test]
    fn parses_peak_rss() {
        let status = "Name:\towner\nVmPeak:\t  9000 kB\nVmHWM:\t  1234 kB\n";
        assert_eq!(parse_peak_rss_kib(status), Some(1234));
        assert_eq!(parse_peak_rss_kib("Name: x\n"), None);
    }

    #[test]
    fn own_usage_grows_with_work_and_memory() {
        let Some(before) = Usage::of_self() else {
            return; // not Linux
        };
        let block = vec![1u8; 64 << 20];
        let mut x = 0u64;
        // Work until the CPU time read grows by 0.2 s, on a machine as busy as
        // it may be: a clock of wall time would fail on a loaded one. A minute
        // of wall time bounds it, should the count never grow.
        let start = std::time::Instant::now();
        let mut after = Usage::of_self().expect("proc was readable a moment ago");
        while after.cpu_seconds < before.cpu_seconds + 0.2 && start.elapsed().as_secs() < 60 {
            for _ in 0..1_000_000 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(block[x as usize % block.len()] as u64);
            }
            after = Usage::of_self().expect("proc was readable a moment ago");
        }
        assert!(x != 1);
        assert!(after.peak_rss_bytes >= 64 << 20, "{after:?}");
        assert!(
            after.cpu_seconds >= before.cpu_seconds + 0.2,
            "{before:?} {after:?}"
        );
    }
}
