//! Bounded gRPC serving.
//!
//! Whatever a peer sends, a daemon holds only so much of it: a hostile agent on its run's
//! gateway socket, or anyone who can reach a daemon's port, must not be able to grow the
//! daemon's memory or take its descriptors. Every bound lives here, in one place, for the
//! authority, the supervisor's API and each run's gateway:
//!
//! - **connections** ([`incoming`]): at most [`ConnectionLimits::max`] open on one listener
//!   (past it the daemon stops accepting; new connections wait in the kernel's backlog, not in
//!   the daemon), and at most [`ConnectionLimits::per_peer`] from one non-loopback IP address
//!   (past it a connection is closed at once); a connection silent for 10 s after connecting is
//!   closed; accept errors (`EMFILE`, `ENFILE`, …) make the accept loop back off instead of
//!   spinning;
//! - **HTTP/2** ([`ServeLimits::server`]): concurrent streams per connection, header list size,
//!   stream and connection flow-control windows (what a peer may send before the daemon reads);
//! - **requests** ([`RequestLimits`]): a check on the headers before any body byte is read
//!   (authentication), a byte cap per method, a budget of request bytes in flight across the
//!   whole listener (past a small allowance every request has), and a deadline by which a
//!   request's body must have arrived.

mod connections;
mod requests;

pub use connections::*;
pub use requests::*;
