//! Outbound connections' leaves, free of the gateway: the administrator's settings
//! ([`config`]: names resolved here, secrets injected, upstream roots), where a name may lead
//! ([`resolve`]: the supervisor's own resolution and the rule that a name never reaches a
//! non-public address), what a connection's first bytes say ([`hello`]: the ClientHello's
//! server name), a run's own certificate authority for the hosts it inspects ([`ca`]), what
//! an inspected request must be before its grant's rules apply ([`request_rules`]: one host,
//! the granted one, in origin form, and paths in one spelling), and how an opaque
//! connection's bytes pass between two sockets without a copy ([`splice`]). The
//! gateway's `Egress` call (`gateway::egress`) checks and serves each connection with them.

pub mod body;
pub mod budget;
pub mod ca;
pub mod config;
pub mod hello;
pub mod request_rules;
pub mod resolve;
pub mod splice;
