//! Every check of a new connection (with an operator's approval when its grant asks), then
//! the connection itself to an address the supervisor resolved and checked.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::net::TcpStream;
use tollgate_proto::v1 as pb;
use tollgate_receipt::egress::{grant_for, Host};
use tonic::Status;

use super::{EgressCalls, CONNECT_TIMEOUT, MAX_ATTEMPTS};
use crate::egress::resolve::reachable;
use crate::gateway::approval::Asked;
use crate::gateway::gate::Refusal;

/// A connection slot being taken: given back if the connection is not made.
struct Slot<'a>(&'a AtomicU32);

impl Slot<'_> {
    /// The connection is made: the slot stays taken until its relay ends.
    fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A connection that passed its checks.
pub(super) struct Connected {
    pub(super) host: Host,
    pub(super) port: u16,
    pub(super) address: SocketAddr,
    pub(super) upstream: TcpStream,
    /// The grant that allowed it.
    pub(super) grant: pb::EgressGrant,
    /// The supervisor reads its requests (an inspected grant, or the proxy's plain HTTP).
    pub(super) inspected: bool,
    /// The sandbox's proxy forwards plain HTTP on it (never TLS).
    pub(super) http: bool,
    /// Who approved it, when its grant asks.
    pub(super) approved_by: Option<String>,
}

impl EgressCalls {
    /// Reserves one of the run's connection slots.
    fn take_slot(&self) -> Result<Slot<'_>, Refusal> {
        let open = self.usage.open.fetch_add(1, Ordering::SeqCst);
        let slot = Slot(&self.usage.open);
        if open >= self.max_open {
            return Err(Refusal::with(
                Status::resource_exhausted,
                format!(
                    "the run already has {} outbound connections open (limits.egress_connections = {})",
                    open, self.max_open
                ),
            )
            .coded("egress_connections"));
        }
        Ok(slot)
    }

    /// Every check of a new connection (with an operator's approval when its grant asks),
    /// then the connection itself.
    pub(super) async fn connect(
        &self,
        open: &pb::EgressOpen,
        call_id: &str,
    ) -> Result<Connected, Refusal> {
        let gate = &self.gate;
        gate.check_audit_quota()?;
        gate.check_alive()?;
        let host = Host::parse(&open.host)
            .map_err(|why| Refusal::with(Status::invalid_argument, why).coded("egress_host"))?;
        let port = u16::try_from(open.port)
            .ok()
            .filter(|port| *port != 0)
            .ok_or_else(|| {
                Refusal::with(
                    Status::invalid_argument,
                    format!("{} is not a port (1 to 65535)", open.port),
                )
                .coded("egress_host")
            })?;
        let Some(grant) = grant_for(&gate.receipt.egress, &host, port) else {
            return Err(Refusal::denied(
                &gate.run_id,
                format!(
                    "egress to {host}:{port} is not granted (missing grant: [[egress]] host = \"{host}\", ports = [{port}])"
                ),
            )
            .coded("egress_not_granted"));
        };
        let inspected = grant.is_inspected() || open.http;
        if grant.is_inspected() && self.setup.ca.is_none() {
            return Err(Refusal::denied(
                &gate.run_id,
                format!("egress to {host} is inspected and this run has no certificate authority"),
            )
            .coded("egress_inspection"));
        }
        let grant = grant.clone();
        // Asked before anything is resolved or connected: nothing reaches the host unapproved.
        let approved_by = if grant.ask {
            let asked = Asked::new("egress", format!("{host}:{port}"));
            Some(
                self.approvals
                    .approved_by(asked, call_id)
                    .await
                    .map_err(|refusal| refusal.coded("egress_denied"))?,
            )
        } else {
            None
        };
        gate.check_alive()?;
        // A slot is held across the resolution and connect, so the bound holds while many
        // connections are being made at once.
        let slot = self.take_slot()?;
        for (counter, way) in [
            (&self.usage.sent, "sent"),
            (&self.usage.received, "received"),
        ] {
            if counter.load(Ordering::SeqCst) >= self.max_bytes() {
                return Err(self.bytes_spent(way));
            }
        }
        let resolved = self
            .setup
            .config
            .hosts
            .resolve(&host, port)
            .await
            .map_err(|why| Refusal::with(Status::unavailable, why).coded("egress_resolve"))?;
        let addresses = reachable(&host, resolved)
            .map_err(|why| Refusal::denied(&gate.run_id, why).coded("egress_address"))?;
        let mut failures = Vec::new();
        for address in addresses.into_iter().take(MAX_ATTEMPTS) {
            // The run may have ended while the name resolved or an address did not answer.
            gate.check_alive()?;
            match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await {
                Ok(Ok(upstream)) => {
                    let _ = upstream.set_nodelay(true);
                    slot.keep();
                    return Ok(Connected {
                        host,
                        port,
                        address,
                        upstream,
                        grant,
                        inspected,
                        http: open.http,
                        approved_by,
                    });
                }
                Ok(Err(e)) => failures.push(format!("{address}: {}", e.kind())),
                Err(_) => failures.push(format!(
                    "{address}: no answer within {} s",
                    CONNECT_TIMEOUT.as_secs()
                )),
            }
        }
        Err(Refusal::with(
            Status::unavailable,
            format!(
                "could not connect to {host}:{port} ({})",
                failures.join("; ")
            ),
        )
        .ran()
        .coded("egress_connect"))
    }
}
