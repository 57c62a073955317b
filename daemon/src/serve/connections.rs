//! Connections: how many one listener holds, how many one peer may open, how long one may
//! stay silent, and an accept loop that backs off on errors.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::Connected;

/// How many connections one listener keeps open.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Open connections at most; past it the listener stops accepting until one closes.
    pub max: usize,
    /// Open connections from one IP address at most; past it a new one is closed at once.
    /// (Unix sockets have one peer: [`Self::max`] bounds them.)
    pub per_peer: usize,
}

/// Everything one listener bounds.
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    /// Connections.
    pub connections: ConnectionLimits,
    /// Concurrent HTTP/2 streams (calls) per connection.
    pub streams_per_connection: u32,
    /// Largest header list a request may carry.
    pub header_list_bytes: u32,
    /// Bytes a peer may send on one stream before the daemon reads them.
    pub stream_window: u32,
    /// Bytes a peer may send on one connection before the daemon reads them.
    pub connection_window: u32,
}

impl ServeLimits {
    /// A daemon's gRPC port (the authority, the supervisor's API): operators, supervisors and
    /// programs, most of them on this host (one peer address: loopback).
    pub const DAEMON: ServeLimits = ServeLimits {
        connections: ConnectionLimits {
            max: 1024,
            per_peer: 256,
        },
        streams_per_connection: 64,
        header_list_bytes: 16 << 10,
        stream_window: 256 << 10,
        connection_window: 1 << 20,
    };

    /// One run's gateway socket: one agent, which may be hostile.
    pub const GATEWAY: ServeLimits = ServeLimits {
        connections: ConnectionLimits {
            max: 32,
            per_peer: 32,
        },
        streams_per_connection: 16,
        header_list_bytes: 16 << 10,
        stream_window: 256 << 10,
        connection_window: 1 << 20,
    };

    /// A tonic server builder with these HTTP/2 limits. (Connections are bounded by
    /// [`incoming`], requests by [`RequestLimits`] as a layer.)
    pub fn server(&self) -> tonic::transport::Server {
        tonic::transport::Server::builder()
            .max_concurrent_streams(self.streams_per_connection)
            .http2_max_header_list_size(self.header_list_bytes)
            .initial_stream_window_size(self.stream_window)
            .initial_connection_window_size(self.connection_window)
            // A client that opens and resets streams in a loop is cut off (CVE-2023-44487).
            .http2_max_pending_accept_reset_streams(Some(64))
    }
}

/// How long a new connection may stay silent: one that has not sent its first bytes by then
/// is closed, so a slot cannot be held by a socket that never speaks.
const FIRST_BYTES_DEADLINE: Duration = Duration::from_secs(10);

/// An accepted connection, counted against its listener's limits until it is dropped.
#[derive(Debug)]
pub struct Counted<IO> {
    io: IO,
    /// Until the peer's first bytes arrive: when the connection is closed if they do not.
    silent_until: Option<Pin<Box<tokio::time::Sleep>>>,
    _slot: OwnedSemaphorePermit,
    _peer: Option<PeerSlot>,
}

impl<IO> Counted<IO> {
    /// The connection itself: to peek at its first bytes, or read its peer's credentials.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// The connection without its wrapper, and the place it holds in its listener's limits
    /// (held until the returned slot is dropped): for a connection served outside the gRPC
    /// server that counted it.
    pub fn into_parts(self) -> (IO, ConnectionSlot) {
        (
            self.io,
            ConnectionSlot {
                _slot: self._slot,
                _peer: self._peer,
            },
        )
    }
}

/// A connection's place in its listener's limits, given back when dropped.
#[derive(Debug)]
pub struct ConnectionSlot {
    _slot: OwnedSemaphorePermit,
    _peer: Option<PeerSlot>,
}

/// One connection's place in its peer address's count.
#[derive(Debug)]
struct PeerSlot {
    peer: IpAddr,
    counts: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl PeerSlot {
    /// A slot for one more connection from `peer`, unless it already has `limit`.
    fn take(
        counts: &Arc<Mutex<HashMap<IpAddr, usize>>>,
        peer: IpAddr,
        limit: usize,
    ) -> Option<PeerSlot> {
        let mut held = counts.lock().unwrap_or_else(|p| p.into_inner());
        let count = held.entry(peer).or_insert(0);
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            peer,
            counts: counts.clone(),
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = counts.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.peer);
            }
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Counted<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        if let Some(deadline) = &mut self.silent_until {
            match &read {
                Poll::Ready(Ok(())) if buf.filled().len() > before => self.silent_until = None,
                Poll::Pending if deadline.as_mut().poll(cx).is_ready() => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the peer sent nothing after connecting",
                    )));
                }
                _ => {}
            }
        }
        read
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Counted<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO: Connected> Connected for Counted<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// Something that accepts connections: a TCP or a Unix listener.
pub trait Listener: Send + 'static {
    /// The accepted connection.
    type Io: Send + 'static;
    /// Accepts one connection, with its peer's IP address where it has one.
    fn accept(&self) -> impl Future<Output = io::Result<(Self::Io, Option<IpAddr>)>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;

    async fn accept(&self) -> io::Result<(Self::Io, Option<IpAddr>)> {
        let (stream, peer) = tokio::net::TcpListener::accept(self).await?;
        // Nagle plus delayed ACK costs ~40 ms per small call.
        stream.set_nodelay(true)?;
        Ok((stream, Some(peer.ip())))
    }
}

impl Listener for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;

    async fn accept(&self) -> io::Result<(Self::Io, Option<IpAddr>)> {
        let (stream, _) = tokio::net::UnixListener::accept(self).await?;
        Ok((stream, None))
    }
}

/// How long the accept loop waits after running out of descriptors (or memory) before it
/// tries again: the connections that hold them must close first, and retrying at once would
/// spin on a listener that stays readable.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Accepts connections from `listener` within `limits`, for `serve_with_incoming`. The
/// listener is closed once the server stops taking connections.
pub fn incoming<L: Listener>(
    listener: L,
    limits: ConnectionLimits,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<Counted<L::Io>>> {
    let (sender, receiver) = mpsc::channel(1);
    tokio::spawn(accept_loop(listener, limits, sender));
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}

async fn accept_loop<L: Listener>(
    listener: L,
    limits: ConnectionLimits,
    sender: mpsc::Sender<io::Result<Counted<L::Io>>>,
) {
    let slots = Arc::new(Semaphore::new(limits.max.max(1)));
    let peers: Arc<Mutex<HashMap<IpAddr, usize>>> = Arc::default();
    loop {
        // At the limit, nothing is accepted until a connection closes.
        let slot = tokio::select! {
            () = sender.closed() => return,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            () = sender.closed() => return,
            accepted = listener.accept() => accepted,
        };
        let (io, peer) = match accepted {
            Ok(accepted) => accepted,
            // A peer that gave up while queued concerns that peer only.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
                ) =>
            {
                continue;
            }
            Err(e) => {
                if matches!(
                    e.raw_os_error(),
                    Some(
                        libc_errno::EMFILE
                            | libc_errno::ENFILE
                            | libc_errno::ENOBUFS
                            | libc_errno::ENOMEM
                    )
                ) {
                    tracing::warn!(error = %e, "accepting a connection: out of resources; backing off");
                } else {
                    tracing::warn!(error = %e, "accepting a connection failed; backing off");
                }
                // Retrying at once would spin on a listener that stays readable.
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        // Loopback peers all share one address (every local client, operators included), so
        // a per-address limit there would let one local user lock the others out: they are
        // bounded by the listener's total alone.
        let peer = match peer.filter(|peer| !peer.is_loopback()) {
            Some(peer) => match PeerSlot::take(&peers, peer, limits.per_peer) {
                Some(slot) => Some(slot),
                None => {
                    tracing::warn!(%peer, limit = limits.per_peer, "connection refused: too many from this address");
                    drop(io);
                    continue;
                }
            },
            None => None,
        };
        let counted = Counted {
            io,
            silent_until: Some(Box::pin(tokio::time::sleep(FIRST_BYTES_DEADLINE))),
            _slot: slot,
            _peer: peer,
        };
        if sender.send(Ok(counted)).await.is_err() {
            return;
        }
    }
}

/// Raises this process's limit on open files as far as the kernel allows and returns the
/// soft limit now: soft and hard to `fs.nr_open` when privileged (root), else the soft limit
/// to the hard one; never lowers either. A daemon holds a descriptor per connection, run and
/// log, and the per-listener limits above — not a low default — are what bound them. (Agents
/// get the receipt's own `files` limit.)
pub fn raise_open_files_limit() -> io::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let ceiling = nr_open.max(hard);
    if ceiling > soft
        && setrlimit(Resource::RLIMIT_NOFILE, ceiling, ceiling).is_err()
        && soft < hard
    {
        // Not privileged to raise the hard limit: as far as it goes.
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(getrlimit(Resource::RLIMIT_NOFILE)?.0)
}

/// The errno values the accept loop backs off on (no libc dependency for four numbers; the
/// same on every Linux architecture).
mod libc_errno {
    pub(super) const ENOMEM: i32 = 12;
    pub(super) const ENFILE: i32 = 23;
    pub(super) const EMFILE: i32 = 24;
    pub(super) const ENOBUFS: i32 = 105;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connections_past_the_limit_wait_until_one_closes() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut accepted = incoming(
            listener,
            ConnectionLimits {
                max: 2,
                per_peer: 1,
            },
        );
        use tokio_stream::StreamExt as _;
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        // Loopback is bounded by the total only (per_peer 1 does not apply to it).
        let first = accepted.next().await.unwrap().unwrap();
        let _second = accepted.next().await.unwrap().unwrap();
        // The third waits in the backlog until a slot frees.
        let waited = tokio::time::timeout(Duration::from_millis(200), accepted.next()).await;
        assert!(waited.is_err(), "accepted past the limit");
        drop(first);
        assert!(accepted.next().await.unwrap().is_ok());
    }

    #[test]
    fn a_peer_address_gets_at_most_its_limit_of_slots() {
        let counts: Arc<Mutex<HashMap<IpAddr, usize>>> = Arc::default();
        let peer: IpAddr = "192.0.2.7".parse().unwrap();
        let other: IpAddr = "192.0.2.8".parse().unwrap();
        let first = PeerSlot::take(&counts, peer, 2).unwrap();
        let _second = PeerSlot::take(&counts, peer, 2).unwrap();
        assert!(PeerSlot::take(&counts, peer, 2).is_none());
        assert!(PeerSlot::take(&counts, other, 2).is_some(), "per address");
        drop(first);
        assert!(
            PeerSlot::take(&counts, peer, 2).is_some(),
            "given back on drop"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_never_speaks_is_closed() {
        let (ours, _theirs) = tokio::net::UnixStream::pair().unwrap();
        let mut counted = Counted {
            io: ours,
            silent_until: Some(Box::pin(tokio::time::sleep(FIRST_BYTES_DEADLINE))),
            _slot: Arc::new(Semaphore::new(1)).acquire_owned().await.unwrap(),
            _peer: None,
        };
        let mut byte = [0u8; 1];
        let read = tokio::io::AsyncReadExt::read(&mut counted, &mut byte).await;
        assert_eq!(read.unwrap_err().kind(), io::ErrorKind::TimedOut);
    }
}
