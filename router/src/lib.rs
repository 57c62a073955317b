//! The router decides where a model call may go.
//!
//! Every route decision applies the receipt-side rule ([`decide`]): a route must be granted by
//! the receipt, and the text's sensitivity must not exceed that grant's `max_sensitivity` (an
//! unspecified grant carries nothing). The text's sensitivity comes from the [`Classifier`]
//! (crate `tollgate_classify`, re-exported here). [`config`] reads the supervisor's routes
//! file; [`decide`] picks the route for a call (a named one, one that claims the model name
//! asked for, or `auto`); [`wire`] builds requests and reads replies of OpenAI Chat
//! Completions, Anthropic Messages and the OpenAI Responses API; [`sse`] reads server-sent
//! events; [`tokens`] keeps a run's token budget. The I/O is `tollgate_router_backends`'s
//! (the backends and loading the routes) and the supervisor's (each run's calls).
#![forbid(unsafe_code)]

pub mod config;
pub mod decide;
pub mod sse;
pub mod tokens;
pub mod wire;

// Re-exported so the router's users (the supervisor, the CLI, the tests) name one crate for
// routing and the sensitivity it routes on.
pub use tollgate_classify::{
    bench, Classification, Classifier, ClassifierConfig, ConfigError, CustomPattern, DetectorId,
    Reason, SecretRedactor, Sensitivity, DEFAULT_ENTROPY_MIN_LEN, DEFAULT_ENTROPY_THRESHOLD,
    DEFAULT_INTERNAL_SUFFIXES,
};
