//! Wire types and gRPC client/server stubs generated from `proto/dpca.proto`.
//!
//! This crate holds wire types only: the role crates convert them into validated
//! domain types at the edge, and nothing deeper sees prost structs.
#![allow(missing_docs, clippy::all)]

/// Version 1 of the protocol.
pub mod v1 {
    tonic::include_proto!("dpca.v1");
}
