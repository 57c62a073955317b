//! A plaintext listener for orchestrators' health probes. Kubernetes' gRPC probes (and most
//! load balancers' checks) cannot speak TLS, let alone present a client certificate, so a
//! daemon serving mutual TLS answers them on a port of their own that serves the standard
//! `grpc.health.v1.Health` service and nothing else: it says whether the daemon is ready, and
//! carries no token, receipt or run.

use tokio::net::TcpListener;

use crate::serve::ServeLimits;

/// Serves `grpc.health.v1.Health` on `listener`, `SERVING` for the empty name and for
/// `service` (e.g. `tollgate.v1.Authority`), for as long as the process runs.
pub async fn serve(listener: TcpListener, service: &'static str) {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    reporter
        .set_service_status(service, tonic_health::ServingStatus::Serving)
        .await;
    let bounds = ServeLimits::DAEMON;
    tokio::spawn(async move {
        // The reporter lives as long as the server: dropping it would end the watchers.
        let _reporter = reporter;
        let served = bounds
            .server()
            .add_service(health)
            .serve_with_incoming(crate::incoming(listener, bounds.connections))
            .await;
        if let Err(e) = served {
            tracing::warn!(error = %e, "health listener ended");
        }
    });
}
