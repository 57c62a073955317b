//! Gateway connections pid 1 has accepted and not yet handed over.
//!
//! The supervisor closes a gateway connection that has not spoken within a deadline (so that
//! a silent socket cannot hold one of its slots or descriptors). A client stalled between its
//! `connect` and its first write (thousands of processes starting at once on a loaded host)
//! would meet that deadline through no fault of its own if the connection were handed over
//! as soon as it was accepted. So pid 1 accepts connections itself, holds each until its
//! client has written something (or hung up), and offers only those: the supervisor never
//! holds a silent connection, and a silent one costs the run (pid 1's descriptors, at most
//! [`MAX_HELD`]), never the daemon. One silent for [`SILENT_DEADLINE`] is closed, so sockets
//! that never speak cannot keep the run's own calls out for long.

use std::collections::VecDeque;
use std::os::fd::{AsFd as _, AsRawFd as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags};
use nix::sys::socket::{recv, MsgFlags};

/// The most connections pid 1 holds at once (silent and spoken together); more wait in the
/// gateway socket's backlog. The supervisor serves at most this many of a run's at a time.
pub(crate) const MAX_HELD: usize = 32;

/// How long a connection may stay silent in pid 1 before it is closed: far longer than the
/// gateway's own deadline (10 s, counted once it holds the connection), for clients stalled
/// by a loaded host, and short enough that silent sockets cannot hold the run's gateway.
const SILENT_DEADLINE: Duration = Duration::from_secs(60);

/// How long pid 1 leaves the gateway socket alone after an accept failed for want of
/// descriptors or memory: the connection waits in the backlog meanwhile.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The accepted connections: silent ones, whose client has not written yet, and spoken
/// ones, oldest first, waiting for the supervisor to ask.
#[derive(Debug, Default)]
pub(crate) struct HeldConnections {
    /// Each with when it was accepted.
    silent: Vec<(UnixStream, Instant)>,
    spoken: VecDeque<UnixStream>,
    /// An accept failed (out of descriptors or memory): not retried before this.
    backoff_until: Option<Instant>,
}

impl HeldConnections {
    /// Whether the gateway socket should be watched now: there is room for another, and no
    /// failed accept is being waited out.
    pub(crate) fn accepting(&self) -> bool {
        self.silent.len() + self.spoken.len() < MAX_HELD
            && self
                .backoff_until
                .is_none_or(|until| Instant::now() >= until)
    }

    /// How long until something is due without any descriptor becoming ready (a failed
    /// accept's back-off ends, a silent connection's deadline passes): the poll's timeout.
    pub(crate) fn wake_in(&self) -> Option<Duration> {
        let deadlines = self
            .silent
            .iter()
            .map(|(_, accepted)| *accepted + SILENT_DEADLINE);
        self.backoff_until
            .into_iter()
            .chain(deadlines)
            .min()
            .map(|due| due.saturating_duration_since(Instant::now()))
    }

    /// Accepts what waits on `gateway`, up to the bound; each new connection is silent until
    /// it is seen to have spoken.
    pub(crate) fn accept_from(&mut self, gateway: &UnixListener) {
        self.backoff_until = None;
        while self.silent.len() + self.spoken.len() < MAX_HELD {
            match gateway.accept() {
                Ok((connection, _)) => {
                    if connection.set_nonblocking(true).is_ok() {
                        self.silent.push((connection, Instant::now()));
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                // A client that gave up while queued, or a signal: the next one.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::Interrupted
                    ) => {}
                // Out of descriptors or memory: the connection stays queued; try again later.
                Err(_) => {
                    self.backoff_until = Some(Instant::now() + ACCEPT_BACKOFF);
                    return;
                }
            }
        }
    }

    /// What to poll for the silent connections (their first bytes, or their end).
    pub(crate) fn silent_polls(&self) -> impl Iterator<Item = PollFd<'_>> {
        self.silent
            .iter()
            .map(|(connection, _)| PollFd::new(connection.as_fd(), PollFlags::POLLIN))
    }

    /// Moves every silent connection whose client has written to the spoken ones, and drops
    /// those whose client hung up (or failed) without a word, or stayed silent past the
    /// deadline.
    pub(crate) fn sort_silent(&mut self) {
        let now = Instant::now();
        let mut still = Vec::with_capacity(self.silent.len());
        for (connection, accepted) in self.silent.drain(..) {
            let mut byte = [0u8; 1];
            match recv(
                connection.as_raw_fd(),
                &mut byte,
                MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
            ) {
                Ok(0) => {}
                Ok(_) => self.spoken.push_back(connection),
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR)
                    if now < accepted + SILENT_DEADLINE =>
                {
                    still.push((connection, accepted));
                }
                Err(_) => {}
            }
        }
        self.silent = still;
    }

    /// Whether a connection has spoken and waits to be handed over.
    pub(crate) fn has_spoken(&self) -> bool {
        !self.spoken.is_empty()
    }

    /// The oldest connection that has spoken.
    pub(crate) fn next_spoken(&mut self) -> Option<UnixStream> {
        self.spoken.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::os::linux::net::SocketAddrExt as _;

    use super::*;

    fn gateway(name: &str) -> (UnixListener, std::os::unix::net::SocketAddr) {
        let address = std::os::unix::net::SocketAddr::from_abstract_name(format!(
            "tollgate-held-test-{name}-{}",
            std::process::id()
        ))
        .unwrap();
        let listener = UnixListener::bind_addr(&address).unwrap();
        listener.set_nonblocking(true).unwrap();
        (listener, address)
    }

    #[test]
    fn a_connection_is_offered_once_it_has_spoken_and_dropped_if_it_hangs_up_silent() {
        let (listener, address) = gateway("spoken");
        let mut quiet = UnixStream::connect_addr(&address).unwrap();
        let gone = UnixStream::connect_addr(&address).unwrap();
        let mut held = HeldConnections::default();
        held.accept_from(&listener);
        assert_eq!(held.silent_polls().count(), 2);
        held.sort_silent();
        assert!(!held.has_spoken(), "nothing written yet");

        drop(gone);
        held.sort_silent();
        assert_eq!(
            held.silent_polls().count(),
            1,
            "the one that hung up is dropped"
        );

        quiet.write_all(b"x").unwrap();
        held.sort_silent();
        assert!(held.has_spoken());
        assert!(held.next_spoken().is_some());
        assert!(held.next_spoken().is_none());
    }

    #[test]
    fn at_most_the_bound_is_held_and_the_rest_wait_in_the_backlog() {
        let (listener, address) = gateway("bound");
        let clients: Vec<_> = (0..MAX_HELD + 3)
            .map(|_| UnixStream::connect_addr(&address).unwrap())
            .collect();
        let mut held = HeldConnections::default();
        held.accept_from(&listener);
        assert_eq!(held.silent_polls().count(), MAX_HELD);
        assert!(!held.accepting());
        drop(clients);
    }
}
