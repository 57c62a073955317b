//! The supervisor's metrics, for Prometheus (`--metrics-listen`, off by default): one set
//! per process, counted where things happen and served as OpenMetrics text on `/metrics`.
//! Labels name tools, decisions, states and routes, never run ids or paths, so the number of
//! series stays bounded whatever agents do.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// A start's outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StartLabels {
    /// `started`, or the refusal's stable code (`already_used`, `expired`, `internal`…).
    pub result: String,
}

/// A run's final state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// `exited`, `stopped`, `expired`, `revoked`…
    pub state: String,
}

/// One gateway call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// `fs.read`, `exec`, `model.complete`, `child.start`…
    pub tool: String,
    /// `allow` or `deny`.
    pub decision: String,
}

/// Tokens charged on one route.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    /// The route's name.
    pub route: String,
    /// `prompt` or `completion`.
    pub kind: String,
}

/// Where a started run's sandbox came from.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SandboxSourceLabels {
    /// `prepared_ahead` (taken from the warm pool) or `prepared_at_start` (the pool was
    /// empty, so the start made its own): [`SandboxSource::label`].
    pub source: &'static str,
}

impl From<SandboxSource> for SandboxSourceLabels {
    fn from(source: SandboxSource) -> Self {
        Self {
            source: source.label(),
        }
    }
}

/// Where a started run's sandbox came from (the `source` label of `sandboxes_taken`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SandboxSource {
    /// Taken from the warm pool.
    PreparedAhead,
    /// The pool was empty, so the start made its own.
    PreparedAtStart,
}

impl SandboxSource {
    /// Both, in the order their series are made.
    const ALL: [Self; 2] = [Self::PreparedAhead, Self::PreparedAtStart];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Self::PreparedAhead => "prepared_ahead",
            Self::PreparedAtStart => "prepared_at_start",
        }
    }
}

/// Every metric the supervisor keeps.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Starts by outcome.
    pub run_starts: Family<StartLabels, Counter>,
    /// Seconds from a receipt's admission to its agent running.
    pub run_start_seconds: Histogram,
    /// Teardowns by the state the run ended in.
    pub run_teardowns: Family<StateLabels, Counter>,
    /// Seconds a teardown took (kill, cgroup and directory removal, report).
    pub run_teardown_seconds: Histogram,
    /// Runs live now.
    pub live_runs: Gauge,
    /// Sandboxes prepared ahead and not taken yet.
    pub warm_sandboxes: Gauge,
    /// Sandboxes taken by starts, by where each came from: many `prepared_at_start` under a
    /// steady load say the warm pool is too small (`--warm-sandboxes`) or the host too busy
    /// to refill it between starts.
    pub sandboxes_taken: Family<SandboxSourceLabels, Counter>,
    /// Gateway calls by tool and decision.
    pub gateway_calls: Family<CallLabels, Counter>,
    /// Model tokens charged, by route and kind.
    pub model_tokens: Family<TokenLabels, Counter>,
    /// 1 while the authority's revocation stream is caught up, 0 otherwise.
    pub revocation_stream_up: Gauge,
    /// When the trusted key set was last replaced (Unix seconds; its age is now minus this).
    pub key_set_updated: Gauge<f64, AtomicU64>,
    /// Seconds from handing an audit entry over to it being on disk (durable appends).
    pub audit_append_seconds: Histogram,
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("tollgate_supervisor");
        let run_starts = Family::<StartLabels, Counter>::default();
        registry.register("run_starts", "Run starts by outcome", run_starts.clone());
        // 1 ms to ~8 s.
        let run_start_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        registry.register(
            "run_start_seconds",
            "Seconds from admission to the agent running",
            run_start_seconds.clone(),
        );
        let run_teardowns = Family::<StateLabels, Counter>::default();
        registry.register(
            "run_teardowns",
            "Teardowns by final state",
            run_teardowns.clone(),
        );
        let run_teardown_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        registry.register(
            "run_teardown_seconds",
            "Seconds a teardown took",
            run_teardown_seconds.clone(),
        );
        let live_runs = Gauge::default();
        registry.register("live_runs", "Runs live now", live_runs.clone());
        let warm_sandboxes = Gauge::default();
        registry.register(
            "warm_sandboxes",
            "Sandboxes prepared ahead and not taken yet",
            warm_sandboxes.clone(),
        );
        let sandboxes_taken = Family::<SandboxSourceLabels, Counter>::default();
        // Both series from the start, at 0: a dashboard's ratio of the two has no gap.
        for source in SandboxSource::ALL {
            drop(sandboxes_taken.get_or_create(&source.into()));
        }
        registry.register(
            "sandboxes_taken",
            "Sandboxes taken by starts, by where each came from",
            sandboxes_taken.clone(),
        );
        let gateway_calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "gateway_calls",
            "Gateway calls by tool and decision",
            gateway_calls.clone(),
        );
        let model_tokens = Family::<TokenLabels, Counter>::default();
        registry.register(
            "model_tokens",
            "Model tokens charged, by route and kind",
            model_tokens.clone(),
        );
        let revocation_stream_up = Gauge::default();
        registry.register(
            "revocation_stream_up",
            "1 while the authority's revocation stream is caught up",
            revocation_stream_up.clone(),
        );
        let key_set_updated = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "key_set_updated_timestamp_seconds",
            "When the trusted key set was last replaced",
            key_set_updated.clone(),
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
            run_starts,
            run_start_seconds,
            run_teardowns,
            run_teardown_seconds,
            live_runs,
            warm_sandboxes,
            sandboxes_taken,
            gateway_calls,
            model_tokens,
            revocation_stream_up,
            key_set_updated,
            audit_append_seconds,
        }
    }

    /// Counts a start.
    pub fn start(&self, result: &str, took: Duration) {
        self.run_starts
            .get_or_create(&StartLabels {
                result: result.to_owned(),
            })
            .inc();
        if result == "started" {
            self.run_start_seconds.observe(took.as_secs_f64());
        }
    }

    /// Counts a sandbox taken by a start from `source`.
    pub fn sandbox_taken(&self, source: SandboxSource) {
        self.sandboxes_taken.get_or_create(&source.into()).inc();
    }

    /// How many sandboxes starts have taken from `source` so far.
    pub fn sandboxes_taken_from(&self, source: SandboxSource) -> u64 {
        self.sandboxes_taken.get_or_create(&source.into()).get()
    }

    /// Counts a teardown.
    pub fn teardown(&self, state: &str, took: Duration) {
        self.run_teardowns
            .get_or_create(&StateLabels {
                state: state.to_owned(),
            })
            .inc();
        self.run_teardown_seconds.observe(took.as_secs_f64());
    }

    /// Counts a gateway call.
    pub fn call(&self, tool: &str, decision: &str) {
        self.gateway_calls
            .get_or_create(&CallLabels {
                tool: tool.to_owned(),
                decision: decision.to_owned(),
            })
            .inc();
    }

    /// Counts a model call's tokens.
    pub fn tokens(&self, route: &str, prompt: u64, completion: u64) {
        for (kind, tokens) in [("prompt", prompt), ("completion", completion)] {
            self.model_tokens
                .get_or_create(&TokenLabels {
                    route: route.to_owned(),
                    kind: kind.to_owned(),
                })
                .inc_by(tokens);
        }
    }

    /// Notes that the trusted key set was replaced now.
    pub fn key_set_replaced(&self) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.key_set_updated.set(now);
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        tollgate_daemon::metrics::encode(&self.registry)
    }
}

/// The process's metrics (one supervisor a process).
pub fn get() -> &'static Arc<Metrics> {
    static METRICS: OnceLock<Arc<Metrics>> = OnceLock::new();
    METRICS.get_or_init(|| Arc::new(Metrics::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_metrics_appear_in_the_text() {
        let metrics = Metrics::new();
        metrics.start("started", Duration::from_millis(3));
        metrics.call("fs.read", "allow");
        metrics.tokens("local", 12, 5);
        metrics.sandbox_taken(SandboxSource::PreparedAhead);
        let text = metrics.encode();
        assert!(
            text.contains("tollgate_supervisor_run_starts_total{result=\"started\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "tollgate_supervisor_gateway_calls_total{tool=\"fs.read\",decision=\"allow\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "tollgate_supervisor_model_tokens_total{route=\"local\",kind=\"prompt\"} 12"
            ),
            "{text}"
        );
        assert!(
            text.contains("tollgate_supervisor_sandboxes_taken_total{source=\"prepared_ahead\"} 1"),
            "{text}"
        );
        assert_eq!(
            metrics.sandboxes_taken_from(SandboxSource::PreparedAhead),
            1
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
