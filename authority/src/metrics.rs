//! The authority's metrics, for Prometheus (`--metrics-listen`, off by default): mints by
//! outcome with their latency, revocations, key rotations and the supervisors following the
//! revocation stream. Labels hold outcomes only, never operators or receipt ids.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// A call's outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok`, or the gRPC code it was refused with (`permission_denied`, …).
    pub result: String,
}

/// Every metric the authority keeps.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// `MintReceipt` calls by outcome.
    pub mints: Family<ResultLabels, Counter>,
    /// Seconds a successful mint took (its audit entry and row durable).
    pub mint_seconds: Histogram,
    /// Receipts revoked (cascades included).
    pub revocations: Counter,
    /// Signing keys rotated in.
    pub key_rotations: Counter,
    /// Revocation streams open now (supervisors following).
    pub revocation_watchers: Gauge,
    /// Seconds from handing an audit entry over to it being on disk (durable appends).
    pub audit_append_seconds: Histogram,
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("tollgate_authority");
        let mints = Family::<ResultLabels, Counter>::default();
        registry.register("mints", "MintReceipt calls by outcome", mints.clone());
        let mint_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        registry.register(
            "mint_seconds",
            "Seconds a successful mint took",
            mint_seconds.clone(),
        );
        let revocations = Counter::default();
        registry.register(
            "revocations",
            "Receipts revoked (cascades included)",
            revocations.clone(),
        );
        let key_rotations = Counter::default();
        registry.register(
            "key_rotations",
            "Signing keys rotated in",
            key_rotations.clone(),
        );
        let revocation_watchers = Gauge::default();
        registry.register(
            "revocation_watchers",
            "Revocation streams open now",
            revocation_watchers.clone(),
        );
        // 50 µs to ~0.8 s: an fsync, shared by the entries queued with it.
        let audit_append_seconds = Histogram::new(exponential_buckets(0.00005, 2.0, 14));
        registry.register(
            "audit_append_seconds",
            "Seconds from handing an audit entry over to it being on disk",
            audit_append_seconds.clone(),
        );
        Self {
            registry,
            mints,
            mint_seconds,
            revocations,
            key_rotations,
            revocation_watchers,
            audit_append_seconds,
        }
    }

    /// Counts a mint with its outcome (`ok` or the refusal's gRPC code).
    pub fn mint(&self, result: &str, took: Duration) {
        self.mints
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
        if result == "ok" {
            self.mint_seconds.observe(took.as_secs_f64());
        }
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        tollgate_daemon::metrics::encode(&self.registry)
    }
}

/// The process's metrics (one authority a process).
pub fn get() -> &'static Arc<Metrics> {
    static METRICS: OnceLock<Arc<Metrics>> = OnceLock::new();
    METRICS.get_or_init(|| Arc::new(Metrics::new()))
}

/// A gRPC code as a metric label: `permission_denied`, `invalid_argument`…
pub fn code_label(code: tonic::Code) -> String {
    let mut label = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            label.push('_');
        }
        label.push(c.to_ascii_lowercase());
    }
    label
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_become_snake_case_labels() {
        assert_eq!(
            code_label(tonic::Code::PermissionDenied),
            "permission_denied"
        );
        assert_eq!(code_label(tonic::Code::Ok), "ok");
    }
}
