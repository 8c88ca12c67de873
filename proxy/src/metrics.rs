//! What the proxy counts, for a Prometheus scrape (`proxy --metrics-listen ADDR`,
//! text format at `/metrics`, served by [`crate::metrics_page`]). Counts, sizes and durations only: no study content,
//! and no owner names as labels (the operator sees those in `proxy status`).
//!
//! - `dpca_rpc_total{rpc, code}`: calls by method and gRPC status code (`0` is OK;
//!   7 permission denied, 8 budget exhausted, ... ), counted by a layer around the
//!   service, so every refusal is seen whichever handler made it;
//! - `dpca_studies_opened_total`, `dpca_releases_total`;
//! - `dpca_contributions_total{outcome="counted"|"repeated"}` and
//!   `dpca_contribution_bytes_total` (ciphertext bytes counted);
//! - `dpca_release_seconds` (summary): mask, noise and re-randomization time;
//! - `dpca_fold_microseconds_total`: wall time spent multiplying contributions into
//!   aggregates (summed over the studies, which fold in parallel);
//! - `dpca_store_microseconds_total`, `dpca_store_commits_total`,
//!   `dpca_store_writes_total`: wall time spent writing and committing the state
//!   file, the commits, and the writes they held (writes queued behind a commit
//!   share the next);
//! - `dpca_studies{phase}`: studies per phase, refreshed every second, and as
//!   `unreadable` those whose stored record this build cannot read (kept as
//!   stored, not served);
//! - `dpca_connections_refused_total{listener, reason}`: connections a listener
//!   (`main`, `operator`, `status_lane`) let go before serving them, by
//!   [`ConnectionRefusal`]:
//!   during a burst of owners, how many were turned away to come back later;
//! - `dpca_uploads_without_slot_total`: uploads refused because every upload
//!   slot stayed held for `upload_slots::PATIENCE`, their owners asked to reserve
//!   one (`dpca_rpc_total` counts them under code 8 with the requests past their
//!   caps).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use metrics::{counter, gauge, histogram};

use crate::access::Method;

/// Installs the process's recorder and describes its series; the page is
/// served from the handle returned ([`crate::metrics_page`]).
pub fn install() -> anyhow::Result<metrics_exporter_prometheus::PrometheusHandle> {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| anyhow::anyhow!("cannot install the metrics recorder: {e}"))?;
    metrics::describe_counter!("dpca_rpc_total", "gRPC calls by method and status code");
    metrics::describe_counter!("dpca_studies_opened_total", "studies opened");
    metrics::describe_counter!("dpca_releases_total", "releases computed");
    metrics::describe_counter!(
        "dpca_contributions_total",
        "contributions stored (counted) or recognized as a retry (repeated)"
    );
    metrics::describe_counter!(
        "dpca_contribution_bytes_total",
        "ciphertext bytes of counted contributions"
    );
    metrics::describe_histogram!("dpca_release_seconds", "seconds to compute a release");
    metrics::describe_counter!("dpca_store_commits_total", "commits of the state file");
    metrics::describe_counter!(
        "dpca_store_writes_total",
        "writes held by those commits (queued writes share a commit)"
    );
    metrics::describe_counter!(
        "dpca_fold_microseconds_total",
        "microseconds spent multiplying contributions into aggregates"
    );
    metrics::describe_counter!(
        "dpca_store_microseconds_total",
        "microseconds spent storing contributions durably"
    );
    metrics::describe_gauge!("dpca_studies", "studies by phase");
    metrics::describe_counter!(
        "dpca_connections_refused_total",
        "connections let go before they were served, by listener and reason"
    );
    metrics::describe_counter!(
        "dpca_uploads_without_slot_total",
        "uploads refused for want of an upload slot, their owners asked to reserve one"
    );
    Ok(handle)
}

/// An upload found every upload slot held for its patience and was refused.
pub fn upload_without_slot() {
    counter!("dpca_uploads_without_slot_total").increment(1);
}

/// A study was opened.
pub fn study_opened() {
    counter!("dpca_studies_opened_total").increment(1);
}

/// A contribution was stored (`counted`) or recognized as a retry.
pub fn contribution(counted: bool, bytes: usize) {
    let outcome = if counted { "counted" } else { "repeated" };
    counter!("dpca_contributions_total", "outcome" => outcome).increment(1);
    if counted {
        counter!("dpca_contribution_bytes_total").increment(bytes as u64);
    }
}

/// A contribution was multiplied in, taking `fold`.
pub fn fold(fold: std::time::Duration) {
    counter!("dpca_fold_microseconds_total").increment(micros(fold));
}

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A commit of the state file held `writes` writes and took `took`, writing
/// included.
pub fn store_commit(writes: usize, took: std::time::Duration) {
    counter!("dpca_store_microseconds_total").increment(micros(took));
    counter!("dpca_store_commits_total").increment(1);
    counter!("dpca_store_writes_total").increment(writes as u64);
}

/// Why a listener let a connection go before serving it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectionRefusal {
    /// Its source had its share of the door's places or of the handshakes
    /// (`sources`).
    SourceCap,
    /// Its TLS handshake failed (a certificate refused, or no TLS at all: it
    /// closed before its ClientHello was whole, at the door).
    Handshake,
    /// Its client closed while it waited for a handshake place
    /// (`handshake_queue`): many of them are clients that send a ClientHello
    /// and leave, to hold door places without sockets.
    ClosedWhileQueued,
    /// Its TLS handshake did not finish within the handshake timeout (nor, at the
    /// door, its ClientHello).
    HandshakeTimeout,
    /// Its party may not hold a connection on this listener, or its certificate
    /// names no party.
    NotAdmitted,
    /// Its party held its share of connections already.
    PartyCap,
    /// No connection slot freed for it in time, or no waiting place was free.
    NoSlot,
}

impl ConnectionRefusal {
    /// The value of the `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            ConnectionRefusal::SourceCap => "source_cap",
            ConnectionRefusal::Handshake => "handshake",
            ConnectionRefusal::ClosedWhileQueued => "closed_while_queued",
            ConnectionRefusal::HandshakeTimeout => "handshake_timeout",
            ConnectionRefusal::NotAdmitted => "not_admitted",
            ConnectionRefusal::PartyCap => "party_cap",
            ConnectionRefusal::NoSlot => "no_slot",
        }
    }
}

/// The listener named `listener` let a connection go for `why`.
pub fn connection_refused(listener: &'static str, why: ConnectionRefusal) {
    counter!("dpca_connections_refused_total", "listener" => listener, "reason" => why.label())
        .increment(1);
}

/// A release was computed in `seconds`.
pub fn release(seconds: f64) {
    counter!("dpca_releases_total").increment(1);
    histogram!("dpca_release_seconds").record(seconds);
}

/// The number of studies in each phase.
pub fn phases<'a>(names: impl Iterator<Item = &'a str>) {
    let mut counts = [0u32; 5];
    const PHASES: [&str; 5] = ["collecting", "sealed", "released", "aborted", "unreadable"];
    for n in names {
        if let Some(i) = PHASES.iter().position(|p| *p == n) {
            counts[i] += 1;
        }
    }
    for (p, c) in PHASES.iter().zip(counts) {
        gauge!("dpca_studies", "phase" => *p).set(f64::from(c));
    }
}

/// The method name of a gRPC path (`/dpca.v1.Proxy/Contribute` -> `Contribute`),
/// `other` for a path that is none of the proxy's methods: the only values the
/// `rpc` label takes, so that a client calling made-up paths cannot grow the
/// metrics without bound. A test keeps [`Method::ALL`] equal to the service in
/// `dpca.proto`.
pub(crate) fn rpc_name(path: &str) -> &'static str {
    Method::from_path(path).map_or("other", Method::name)
}

/// Counts every call by method and status code. A handler's error comes back as a
/// trailers-only response, its code in the headers; an answer without one is OK
/// so far (a streamed answer's final code is in its trailers and counted as OK).
#[derive(Clone, Debug)]
pub struct CountCalls<S>(pub S);

impl<S, B, R> tower::Service<http::Request<B>> for CountCalls<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let rpc = rpc_name(req.uri().path());
        let fut = self.0.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            let code = resp
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("0")
                .to_string();
            counter!("dpca_rpc_total", "rpc" => rpc, "code" => code).increment(1);
            Ok(resp)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_names_are_the_method_and_anything_else_is_other() {
        assert_eq!(rpc_name("/dpca.v1.Proxy/Contribute"), "Contribute");
        for made_up in ["x", "/dpca.v1.Proxy/Xyz123", "/other.Service/Status", "/"] {
            assert_eq!(rpc_name(made_up), "other", "{made_up}");
        }
    }

    /// Every method of the service is a label value, and nothing else is.
    #[test]
    fn the_method_labels_are_the_services_methods() {
        let proto = include_str!("../../proto/proto/dpca.proto");
        let mut declared: Vec<&str> = proto
            .lines()
            .filter_map(|l| l.trim().strip_prefix("rpc "))
            .filter_map(|l| l.split('(').next())
            .collect();
        let mut labels: Vec<&str> = Method::ALL.iter().map(|m| m.name()).collect();
        declared.sort_unstable();
        labels.sort_unstable();
        assert_eq!(declared, labels);
    }
}
