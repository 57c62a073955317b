//! The gateway: the only way out of a sandbox, checked against the receipt on every call.
//!
//! Each run gets its own Unix socket (`<runs>/<run_id>/gateway.sock`, owned by the run's host
//! id, mode 0600), bound before the sandbox is sent its plan and shown only inside that
//! sandbox at `/run/tollgate/gateway.sock`. The listening socket goes to the sandbox's pid 1
//! with the plan: pid 1 accepts on it each time the gateway asks and hands the connection
//! over on the shim's control socket (`handed`), so the supervisor holds no listener per run.
//! The server on that socket serves exactly that run: the run is known from the socket that
//! accepted the connection, never from anything the agent sends (the peer's uid must also be
//! the run's host id).
//!
//! Every call is checked in this order: the run is still alive, the receipt has not expired
//! (by this host's clock) and is not revoked, the tool is granted, the target is in scope,
//! the tool-call budget is not spent. A refusal is `PERMISSION_DENIED` naming the receipt and
//! the missing grant. Every call, allowed or not, gets a call id (in the response, or in the
//! `tollgate-call-id` metadata of a refusal) and a `tool_call` audit entry with metadata only.
//!
//! Paths are host paths beneath one of the receipt's fs grants. They are resolved with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` from the grant's
//! directory, so no `..`, absolute path or symbolic link (planted or swapped in between calls)
//! leads out of it, and the file that was checked is the file that is read (the `O_PATH`
//! descriptor is reopened through `/proc/self/fd`). Devices, FIFOs, sockets and symbolic links
//! are never opened.
//!
//! Inside, dependencies run one way: `input` (bounds) and `gate` (the checks, the budget
//! and the audit entry every call passes) are leaves, and so is `shape` (the bounds on a
//! request's raw bytes, checked by `prewalk` before tonic decodes it); `approval` (calls under a grant that
//! asks, waiting on the supervisor's approval board) uses only the gate, and the tool families
//! ask through it; the tool families `fs`, `exec`,
//! `models` and `children` each depend on the gate only (delegation also on the grants
//! and model budget it carves from; `egress`, outbound connections, also on the `egress`
//! leaves); `run` assembles one run's gateway from them; `tunnel` sorts the connections
//! that carry outbound connections' bytes from the gRPC ones and hands them to `egress`;
//! `service` serves it on the run's socket, on the connections the run's pid 1 accepts and
//! `handed` takes from the run's watch. Delegation reaches the run manager through the
//! [`ChildRuns`] trait declared here, never the manager's type.

pub mod approval;
pub mod children;
pub mod egress;
pub mod exec;
pub mod fs;
pub mod gate;
pub mod handed;
pub mod input;
pub mod inspection;
pub mod models;
mod prewalk;
pub mod run;
pub mod service;
pub mod shape;
#[cfg(test)]
mod tests;
mod tunnel;

pub use children::{ChildControl, ChildOf, ChildRuns, ChildState, Delegator};
pub use fs::FsGrant;
pub use gate::{audit_quota, CallGate, MAX_AUDIT_QUOTA, MIN_AUDIT_QUOTA, SUMMARY_WINDOW};
pub use handed::{handed, HandedConnections, HandedSender};
pub use input::{MAX_LIST, MAX_PATH, MAX_READ, MAX_STDIN, MAX_WRITE};
pub use models::RunModels;
pub use run::{RunGateway, RunGatewayConfig};
pub use service::{
    bind, serve, GatewayError, GatewayHandle, GatewayService, GATEWAY_BODY_DEADLINE,
    GATEWAY_IN_FLIGHT,
};
