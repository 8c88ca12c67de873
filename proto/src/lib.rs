//! Wire types and gRPC client/server stubs generated from `proto/dpca.proto`, and the
//! validating conversions to the domain types of `dpca-common` (in [`convert`]), so
//! nothing beyond this crate's edge handles unvalidated prost structs. It also holds
//! the small pieces every role's shell shares: [`client::connect`] and
//! [`logging::init`], [`usage::Usage`], and mutual TLS ([`tls`]).

/// Version 1 of the protocol (generated code).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("dpca.v1");
}

pub mod client;
pub mod config;
pub mod convert;
pub mod fuzzing;
pub mod invitation;
pub mod logging;
pub mod owner_report;
pub mod signed_count;
pub mod tls;
pub mod usage;
