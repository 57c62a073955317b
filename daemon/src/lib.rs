//! What both Tollgate daemons (the authority and the supervisor) do the same way, in one
//! place: bounded gRPC serving ([`serve`]), a supervisor's claim on its host's cgroup parent
//! and host ids ([`host`]), daemon addresses as clients give them
//! ([`address`]), the log format ([`logging`]), the `/metrics` endpoint ([`metrics`]), the data directory's lock and atomic private
//! files ([`files`]), bearer tokens ([`token`]), secrets that never print ([`Secret`]), the
//! shutdown signal ([`shutdown`]), systemd's readiness protocol ([`systemd`]) and blocking work off the async threads ([`blocking`]).
#![forbid(unsafe_code)]

pub mod address;
pub mod files;
pub mod health;
pub mod host;
pub mod logging;
pub mod metrics;
pub mod reflection;
pub mod secret;
pub mod serve;
pub mod shutdown;
pub mod systemd;
pub mod tls;
pub mod token;

pub use secret::Secret;
pub use serve::{incoming, raise_open_files_limit, ConnectionLimits, RequestLimits, ServeLimits};

/// Runs blocking work (storage, file system) on tokio's blocking threads; `Err` only when the
/// work panicked.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    tokio::task::spawn_blocking(work).await
}

/// An error with every cause under it, `: `-separated (a TLS failure is several layers down,
/// and the top one alone says only "transport error").
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}
