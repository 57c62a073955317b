//! gRPC server reflection for a daemon, as tools (grpcurl, Postman, IDEs) ask for it: both
//! protocol versions (`grpc.reflection.v1` and the older `v1alpha` many tools still speak),
//! advertising exactly what the daemon serves — its own service, health and reflection —
//! though every Tollgate `.proto` is there to describe the messages.

use tonic_reflection::server::{v1, v1alpha, Builder, Error};

/// The two reflection services for a daemon serving `service` (e.g. `tollgate.v1.Authority`).
#[allow(clippy::type_complexity)]
pub fn services(
    service: &str,
) -> Result<
    (
        v1::ServerReflectionServer<impl v1::ServerReflection>,
        v1alpha::ServerReflectionServer<impl v1alpha::ServerReflection>,
    ),
    Error,
> {
    let builder = || {
        Builder::configure()
            .register_encoded_file_descriptor_set(tollgate_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .with_service_name(service)
            .with_service_name("grpc.health.v1.Health")
            .with_service_name("grpc.reflection.v1.ServerReflection")
            .with_service_name("grpc.reflection.v1alpha.ServerReflection")
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}
