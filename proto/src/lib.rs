//! Wire types and gRPC client/server stubs generated from `proto/dpca.proto`, and the
//! validating conversions to the domain types of `dpca-common` (in [`convert`]), so
//! nothing beyond this crate's edge handles unvalidated prost structs. What every
//! role's shell shares (TLS, settings, the client, logging) is `dpca-shell`'s.

/// Version 1 of the protocol (generated code).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("dpca.v1");
}

pub mod convert;
pub mod upload_slot;
