//! Generated types and gRPC services of the `tollgate.v1` protocol.
//!
//! The `.proto` files under `proto/tollgate/v1/` at the repository root are the source of
//! truth and the API documentation for clients in other languages; this crate only compiles
//! them (with protox, so no system `protoc` is needed).
#![forbid(unsafe_code)]

/// The `tollgate.v1` package: messages, enums, clients and servers.
#[allow(missing_docs, clippy::all, unused_qualifications)]
pub mod v1 {
    tonic::include_proto!("tollgate.v1");
}

/// Encoded `FileDescriptorSet` of every tollgate proto file, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/tollgate_descriptor.bin"));

pub use prost;
pub use prost_types;
