//! A run's gateway connections as its sandbox's pid 1 hands them over. pid 1 holds the run's
//! listening socket (so the supervisor does not: one descriptor a run fewer, and none to
//! duplicate for a live restore) and accepts on it only when asked: each `Accept` the gateway
//! sends on the shim's control socket is answered by one `Connection` with the accepted socket
//! attached (SCM_RIGHTS), which the run's watch reads and puts here.
//!
//! The gateway asks only when [`tollgate_daemon::incoming`] asks this listener for a
//! connection — after it has a free slot — and never has more than one request outstanding;
//! the channel between the watch and the gateway holds one. Past the connection limit
//! nothing is asked, pid 1 accepts nothing, and new connections wait in the kernel's backlog
//! of the sandbox's socket: nothing queues in the supervisor or in pid 1.
//!
//! No connection is lost on the way. pid 1 keeps a copy of the one it handed over until the
//! gateway says it has it (`Received`, sent before the connection is served, so the caller
//! sees the connection end when the gateway ends it). One whose descriptor did not arrive
//! (the kernel closes a descriptor that finds no free number in this process's table, which
//! the reservation before each ask makes rare but another thread can still race it) is asked
//! for again (`Resend`) after the accept loop's back-off, with a descriptor reserved for it as
//! for an `Accept`.

use std::io;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tollgate_daemon::serve::Listener;
use tollgate_shim_protocol::protocol::ToShim;

use crate::sandbox::ControlLink;

/// What a run's watch delivers to its gateway for one ask.
#[derive(Debug)]
pub enum Handed {
    /// The connection pid 1 handed over, as received (pid 1 keeps its copy until told).
    Connection(OwnedFd),
    /// pid 1 handed a connection over and its descriptor did not arrive: pid 1 still holds
    /// it, to be asked for again.
    Lost,
    /// pid 1 had none to hand over (see `FromShim::NotAccepted`): the connection waits in
    /// pid 1 or in the socket's backlog.
    NotAccepted,
}

/// Where a run's watch puts what pid 1 answered to the gateway's ask.
pub type HandedSender = mpsc::Sender<Handed>;

/// The gateway connections pid 1 accepts for one run, as a listener for
/// [`tollgate_daemon::incoming`].
#[derive(Debug)]
pub struct HandedConnections {
    link: Arc<ControlLink>,
    /// Held by the one caller asking and waiting: asks are never sent twice for one wait.
    waiting: tokio::sync::Mutex<Waiting>,
}

/// The receiving end, and where the hand-over stands.
#[derive(Debug)]
struct Waiting {
    connections: mpsc::Receiver<Handed>,
    /// An `Accept` or a `Resend` is outstanding (sent, its answer not yet taken).
    asked: bool,
    /// pid 1 said a connection waits, and it has not been asked for yet (it says so once).
    announced: bool,
    /// The last connection handed over did not arrive: the next ask is `Resend`.
    lost: bool,
    /// A connection was taken and pid 1 not yet told (`Received`): a caller cancelled while
    /// telling it. Told first thing on the next `accept`, so pid 1's copy does not outlive it.
    unconfirmed: bool,
}

/// A run's handed-over connections, asked for on `link`, and the sender its watch delivers
/// them with. Room for one: only one is ever asked for at a time.
pub fn handed(link: Arc<ControlLink>) -> (HandedConnections, HandedSender) {
    let (sender, receiver) = mpsc::channel(1);
    let connections = HandedConnections {
        link,
        waiting: tokio::sync::Mutex::new(Waiting {
            connections: receiver,
            asked: false,
            announced: false,
            lost: false,
            unconfirmed: false,
        }),
    };
    (connections, sender)
}

impl HandedConnections {
    /// Sends `message` to pid 1; `false` when pid 1 is gone (the run's watch sees the
    /// socket's end and tears the run down, which stops this gateway).
    async fn tell(&self, message: &ToShim) -> bool {
        match self.link.send(message).await {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %e, ?message, "writing to pid 1 failed");
                false
            }
        }
    }
}

impl Listener for HandedConnections {
    type Io = UnixStream;

    async fn accept(&self) -> io::Result<(UnixStream, Option<IpAddr>)> {
        // One caller at a time asks and waits. A request cancelled before it was sent is
        // sent again; one that was sent is answered once, whoever waits for it then.
        let mut waiting = self.waiting.lock().await;
        if waiting.unconfirmed {
            if !self.tell(&ToShim::Received).await {
                return std::future::pending().await;
            }
            waiting.unconfirmed = false;
        }
        if !waiting.asked {
            let ask = if waiting.lost {
                ToShim::Resend
            } else {
                // Nothing is asked (and no descriptor held) until a connection waits.
                if !waiting.announced {
                    self.link.connection_waits().await;
                    waiting.announced = true;
                }
                ToShim::Accept
            };
            // Out of descriptors: asked for nothing, so the connection stays in the socket's
            // backlog (or in pid 1, when it is to be sent again) and the caller's accept loop
            // backs off (`EMFILE`) and tries again.
            self.link.reserve_descriptor()?;
            if !self.tell(&ask).await {
                return std::future::pending().await;
            }
            waiting.asked = true;
            match ask {
                ToShim::Resend => waiting.lost = false,
                _ => waiting.announced = false,
            }
        }
        let next = waiting.connections.recv().await;
        waiting.asked = false;
        match next {
            Some(Handed::Connection(fd)) => {
                // pid 1 drops its copy now: the gateway holds the connection from here on.
                waiting.unconfirmed = true;
                if !self.tell(&ToShim::Received).await {
                    return std::future::pending().await;
                }
                waiting.unconfirmed = false;
                let stream = connection_of(fd).inspect_err(|e| {
                    tracing::warn!(error = %e, "a gateway connection from pid 1 was refused");
                })?;
                Ok((stream, None))
            }
            Some(Handed::Lost) => {
                waiting.lost = true;
                Err(io::Error::other(
                    "a gateway connection from pid 1 arrived without its descriptor; asking for it again",
                ))
            }
            Some(Handed::NotAccepted) => Err(io::Error::other(
                "pid 1 could not accept a gateway connection; it waits in the run's socket",
            )),
            // The watch has ended (the shim ended or the run was detached): nothing more
            // will come.
            None => std::future::pending().await,
        }
    }
}

/// The connection pid 1 handed over as `fd`: a connected Unix stream socket (anything else
/// is refused and closed), non-blocking, registered with the runtime.
pub fn connection_of(fd: OwnedFd) -> io::Result<UnixStream> {
    use nix::sys::socket::{getsockname, getsockopt, sockopt, SockType, UnixAddr};
    use std::os::fd::AsRawFd as _;
    if getsockopt(&fd, sockopt::SockType)? != SockType::Stream {
        return Err(io::Error::other("not a stream socket"));
    }
    // A Unix socket's own address parses as one; any other family's does not.
    getsockname::<UnixAddr>(fd.as_raw_fd()).map_err(|_| io::Error::other("not a Unix socket"))?;
    let stream = std::os::unix::net::UnixStream::from(fd);
    stream.set_nonblocking(true)?;
    UnixStream::from_std(stream)
}

/// Delivers a `Connection` from pid 1 to the gateway: `fd`, the descriptor that came with it
/// (`None` when it did not arrive: the gateway backs off and asks pid 1 to send it again). A
/// connection nobody asked for is closed.
pub fn deliver(sender: &HandedSender, fd: Option<OwnedFd>) {
    let handed = match fd {
        Some(fd) => Handed::Connection(fd),
        None => {
            tracing::warn!("a gateway connection from pid 1 arrived without its descriptor");
            Handed::Lost
        }
    };
    if sender.try_send(handed).is_err() {
        tracing::debug!("a gateway connection nobody asked for was closed");
    }
}

/// Delivers pid 1's `NotAccepted` to the gateway, which backs off and asks again once pid 1
/// says a connection waits.
pub fn deliver_not_accepted(sender: &HandedSender) {
    if sender.try_send(Handed::NotAccepted).is_err() {
        tracing::debug!("pid 1 answered an ask nobody made");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a connected Unix stream socket is taken.
    #[tokio::test]
    async fn only_unix_stream_sockets_are_taken() {
        let (ours, _theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(connection_of(OwnedFd::from(ours)).is_ok());
        let (pipe, _writer) = io::pipe().unwrap();
        assert!(connection_of(OwnedFd::from(pipe)).is_err());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        assert!(connection_of(OwnedFd::from(tcp)).is_err());
        let (datagram, _other) = std::os::unix::net::UnixDatagram::pair().unwrap();
        assert!(connection_of(OwnedFd::from(datagram)).is_err());
    }

    /// One `Accept` is sent per connection taken, never a second while one is outstanding,
    /// and what the watch delivers is what `accept` returns.
    #[tokio::test]
    async fn one_request_is_outstanding_at_a_time() {
        use std::io::Read as _;
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let link = Arc::new(ControlLink::register(Arc::new(OwnedFd::from(ours))).unwrap());
        let link_of_test = link.clone();
        let (connections, sender) = handed(link);
        let connections = Arc::new(connections);
        let waiting = tokio::spawn({
            let connections = connections.clone();
            async move { connections.accept().await }
        });
        // A second accept, cancelled while the first waits: no second request.
        // Nothing is asked before pid 1 says a connection waits.
        tokio::task::yield_now().await;
        theirs.set_nonblocking(true).unwrap();
        let mut asked = [0u8; 64];
        let early = (&theirs).read(&mut asked).unwrap_err();
        assert_eq!(early.kind(), io::ErrorKind::WouldBlock, "asked too early");
        link_of_test.note_connection_waiting();
        let second =
            tokio::time::timeout(std::time::Duration::from_millis(50), connections.accept()).await;
        assert!(second.is_err(), "nothing was delivered yet");
        let (client, _server) = std::os::unix::net::UnixStream::pair().unwrap();
        deliver(&sender, Some(OwnedFd::from(client)));
        let accepted = waiting.await.unwrap();
        assert!(accepted.is_ok(), "{accepted:?}");
        // The ask, and pid 1 told the connection arrived (one line per send).
        let mut said = Vec::new();
        while said.len() < b"\"accept\"\n\"received\"\n".len() {
            let read = (&theirs).read(&mut asked).unwrap();
            said.extend_from_slice(&asked[..read]);
        }
        assert_eq!(said, b"\"accept\"\n\"received\"\n");
        let again = (&theirs).read(&mut asked).unwrap_err();
        assert_eq!(
            again.kind(),
            io::ErrorKind::WouldBlock,
            "exactly one request"
        );
        // Delivered without a request: closed, not queued past the channel's one slot.
        deliver_not_accepted(&sender);
        let (extra, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        deliver(&sender, Some(OwnedFd::from(extra)));
        assert_eq!(sender.capacity(), 0);
    }
}
