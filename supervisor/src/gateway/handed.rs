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

use std::io;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tollgate_daemon::serve::Listener;
use tollgate_shim_protocol::protocol::ToShim;

use crate::sandbox::ControlLink;

/// Where a run's watch puts the connections pid 1 hands over (or why one did not arrive).
pub type HandedSender = mpsc::Sender<io::Result<UnixStream>>;

/// The gateway connections pid 1 accepts for one run, as a listener for
/// [`tollgate_daemon::incoming`].
#[derive(Debug)]
pub struct HandedConnections {
    link: Arc<ControlLink>,
    /// Held by the one caller asking and waiting: asks are never sent twice for one wait.
    waiting: tokio::sync::Mutex<Waiting>,
}

/// The receiving end, and whether an `Accept` is outstanding (sent, its connection not yet
/// taken).
#[derive(Debug)]
struct Waiting {
    connections: mpsc::Receiver<io::Result<UnixStream>>,
    asked: bool,
    /// pid 1 said a connection waits, and it has not been asked for yet (it says so once).
    announced: bool,
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
        }),
    };
    (connections, sender)
}

impl Listener for HandedConnections {
    type Io = UnixStream;

    async fn accept(&self) -> io::Result<(UnixStream, Option<IpAddr>)> {
        // One caller at a time asks and waits. A request cancelled before it was sent is
        // sent again; one that was sent is answered once, whoever waits for it then.
        let mut waiting = self.waiting.lock().await;
        if !waiting.asked {
            // Nothing is asked (and no descriptor held) until a connection waits.
            if !waiting.announced {
                self.link.connection_waits().await;
                waiting.announced = true;
            }
            // Out of descriptors: asked for nothing, so the connection stays in the socket's
            // backlog and the caller's accept loop backs off (`EMFILE`) and tries again.
            self.link.reserve_descriptor()?;
            if let Err(e) = self.link.send(&ToShim::Accept).await {
                // pid 1 is gone: the run's watch sees the socket's end and tears it down,
                // which stops this gateway. Nothing more will come.
                tracing::debug!(error = %e, "asking pid 1 for a gateway connection failed");
                return std::future::pending().await;
            }
            waiting.asked = true;
            waiting.announced = false;
        }
        let next = waiting.connections.recv().await;
        waiting.asked = false;
        match next {
            Some(Ok(stream)) => Ok((stream, None)),
            Some(Err(e)) => Err(e),
            // The watch has ended (the shim ended or the run was detached): as above.
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
/// (`None` when it was lost on the way, as when this process is out of descriptors: the
/// gateway backs off and asks again). A connection nobody asked for is closed.
pub fn deliver(sender: &HandedSender, fd: Option<OwnedFd>) {
    let connection = match fd {
        Some(fd) => connection_of(fd),
        None => Err(io::Error::other(
            "a gateway connection arrived without its descriptor",
        )),
    };
    if let Err(e) = &connection {
        tracing::warn!(error = %e, "a gateway connection from pid 1 was refused");
    }
    if sender.try_send(connection).is_err() {
        tracing::debug!("a gateway connection nobody asked for was closed");
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
        let read = (&theirs).read(&mut asked).unwrap();
        assert_eq!(&asked[..read], b"\"accept\"\n");
        let again = (&theirs).read(&mut asked).unwrap_err();
        assert_eq!(
            again.kind(),
            io::ErrorKind::WouldBlock,
            "exactly one request"
        );
        // Delivered without a request: closed, not queued past the channel's one slot.
        deliver(&sender, None);
        let (extra, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        deliver(&sender, Some(OwnedFd::from(extra)));
        assert_eq!(sender.capacity(), 0);
    }
}
