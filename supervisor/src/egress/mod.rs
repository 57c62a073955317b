//! Outbound connections' leaves, free of the gateway: where a name may lead ([`resolve`]:
//! the supervisor's own resolution and the rule that a name never reaches a non-public
//! address) and what a connection's first bytes say ([`hello`]: the ClientHello's server
//! name). The gateway's `Egress` call (`gateway::egress`) checks each connection with them.

pub mod hello;
pub mod resolve;
