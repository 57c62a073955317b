//! The model routes' backends: everything about a supervisor's routes that is not tied to
//! one run.
//!
//! [`backends`] is the HTTP transport to each route's server (loopback or HTTPS through one
//! pooled rustls client, or a Unix socket), what it knows of the presets (ollama, vllm,
//! llamacpp, lmstudio): the start-up probe of local routes and the tokenizer endpoints that
//! count tokens honestly. [`routes`] loads the routes file, its keys and the classifier and
//! probes the local routes, once at start: the [`ModelRoutes`] every run shares.
//!
//! The decisions and formats are `tollgate_router`'s (no I/O there); this crate does the
//! I/O, so it brings hyper, rustls and tokio, which the router and the shim do not link. The
//! per-run call (budget, audit, relay to the agent) is the supervisor's
//! (`tollgate_supervisor::gateway::models`).
#![forbid(unsafe_code)]

pub mod backends;
pub mod routes;

pub use backends::{
    has_tokenizer, BackendError, Backends, KeyError, ProbeError, TokenizerError, ANTHROPIC_VERSION,
    CALL_TIMEOUT, PROBE_TIMEOUT, TOKENIZER_TIMEOUT,
};
pub use routes::{LoadError, ModelRoutes};
