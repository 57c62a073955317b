//! Bounded gRPC serving for the Tollgate daemons.
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
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tonic::body::Body;
use tonic::transport::server::Connected;
use tonic::Status;

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

/// Raises this process's soft limit on open files to its hard limit and returns it: a daemon
/// holds a descriptor per connection, run and log, and the per-listener limits above — not a
/// low default — are what bound them. (Agents get the receipt's own `files` limit.)
pub fn raise_open_files_limit() -> io::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(hard)
}

/// The errno values the accept loop backs off on (no libc dependency for four numbers; the
/// same on every Linux architecture).
mod libc_errno {
    pub const ENOMEM: i32 = 12;
    pub const ENFILE: i32 = 23;
    pub const EMFILE: i32 = 24;
    pub const ENOBUFS: i32 = 105;
}

/// A check on a request's method path and headers, before any of its body is read
/// (authentication): `Err` answers with that status at once.
pub type HeaderCheck = dyn Fn(&str, &http::HeaderMap) -> Result<(), Status> + Send + Sync;

/// What one listener's requests may make the daemon hold: a tower layer for
/// `Server::layer`.
#[derive(Clone)]
pub struct RequestLimits {
    shared: Arc<Shared>,
}

struct Shared {
    /// Method path → most request bytes (the gRPC framing included).
    caps: Vec<(&'static str, usize)>,
    default_cap: usize,
    /// Bytes of every request that do not count against `in_flight_max`: small calls are
    /// never refused for the budget (the stream and connection limits bound them instead).
    allowance: usize,
    in_flight_max: usize,
    in_flight: AtomicUsize,
    body_deadline: Duration,
    check: Option<Box<HeaderCheck>>,
}

impl std::fmt::Debug for RequestLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestLimits")
            .field("caps", &self.shared.caps)
            .field("default_cap", &self.shared.default_cap)
            .field("in_flight_max", &self.shared.in_flight_max)
            .finish_non_exhaustive()
    }
}

/// Builds [`RequestLimits`].
pub struct RequestLimitsBuilder {
    shared: Shared,
}

impl RequestLimits {
    /// Requests of at most `default_cap` bytes, at most `in_flight` bytes of them held at
    /// once beyond a 64 KiB allowance each, every body complete within `body_deadline`.
    pub fn builder(
        default_cap: usize,
        in_flight: usize,
        body_deadline: Duration,
    ) -> RequestLimitsBuilder {
        RequestLimitsBuilder {
            shared: Shared {
                caps: Vec::new(),
                default_cap,
                allowance: 64 << 10,
                in_flight_max: in_flight,
                in_flight: AtomicUsize::new(0),
                body_deadline,
                check: None,
            },
        }
    }

    /// Request bytes held now beyond the allowances (for tests and metrics).
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    fn cap_of(&self, path: &str) -> usize {
        self.shared
            .caps
            .iter()
            .find(|(method, _)| *method == path)
            .map_or(self.shared.default_cap, |(_, cap)| *cap)
    }
}

impl RequestLimitsBuilder {
    /// Requests to `path` (`/package.Service/Method`) may carry up to `bytes`.
    pub fn cap(mut self, path: &'static str, bytes: usize) -> Self {
        self.shared.caps.push((path, bytes));
        self
    }

    /// Runs `check` on every request's path and headers before its body is read.
    pub fn check(
        mut self,
        check: impl Fn(&str, &http::HeaderMap) -> Result<(), Status> + Send + Sync + 'static,
    ) -> Self {
        self.shared.check = Some(Box::new(check));
        self
    }

    /// The limits.
    pub fn build(self) -> RequestLimits {
        RequestLimits {
            shared: Arc::new(self.shared),
        }
    }
}

impl<S> tower_layer::Layer<S> for RequestLimits {
    type Service = Limited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Limited {
            inner,
            limits: self.clone(),
        }
    }
}

/// A service whose requests are held to [`RequestLimits`].
#[derive(Debug, Clone)]
pub struct Limited<S> {
    inner: S,
    limits: RequestLimits,
}

/// The bytes one request holds beyond its allowance, given back when both its body and its
/// call are done.
#[derive(Debug)]
pub struct Charge {
    limits: RequestLimits,
    counted: AtomicUsize,
}

impl Drop for Charge {
    fn drop(&mut self) {
        let counted = self.counted.load(Ordering::Relaxed);
        self.limits
            .shared
            .in_flight
            .fetch_sub(counted, Ordering::Relaxed);
    }
}

impl<S, ResBody> tower_service::Service<http::Request<Body>> for Limited<S>
where
    S: tower_service::Service<http::Request<Body>, Response = http::Response<ResBody>>,
    ResBody: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = LimitedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let path = request.uri().path().to_owned();
        if let Some(check) = &self.limits.shared.check {
            if let Err(status) = check(&path, request.headers()) {
                return LimitedFuture::Refused {
                    response: Some(status.into_http()),
                };
            }
        }
        let charge = Arc::new(Charge {
            limits: self.limits.clone(),
            counted: AtomicUsize::new(0),
        });
        let cap = self.limits.cap_of(&path);
        let deadline = tokio::time::Instant::now() + self.limits.shared.body_deadline;
        let request = request.map(|body| {
            Body::new(LimitedBody {
                inner: body,
                charge: charge.clone(),
                method: path,
                cap,
                seen: 0,
                deadline,
                timer: None,
                done: false,
            })
        });
        LimitedFuture::Called {
            future: self.inner.call(request),
            _charge: charge,
        }
    }
}

pin_project_lite::pin_project! {
    /// The response of a [`Limited`] service: refused on its headers, or the inner call,
    /// holding the request's charge until it is answered.
    #[project = LimitedFutureProj]
    #[allow(missing_docs)] // variant fields are described on their variants
    pub enum LimitedFuture<F> {
        /// Refused before the body was read: the refusal, taken when answered.
        Refused { response: Option<http::Response<Body>> },
        /// Passed on: the inner call, and the request's bytes, held until it is answered.
        Called {
            #[pin]
            future: F,
            _charge: Arc<Charge>,
        },
    }
}

impl<F, ResBody, E> Future for LimitedFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
    ResBody: Default,
{
    type Output = Result<http::Response<ResBody>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            LimitedFutureProj::Refused { response } => {
                let response = response.take().unwrap_or_default();
                // The status travels in the headers; the body is empty.
                Poll::Ready(Ok(response.map(|_| ResBody::default())))
            }
            LimitedFutureProj::Called { future, .. } => future.poll(cx),
        }
    }
}

/// A request body that counts what it hands on and ends with a status past a limit.
struct LimitedBody {
    inner: Body,
    charge: Arc<Charge>,
    method: String,
    cap: usize,
    seen: usize,
    /// When the body must have arrived.
    deadline: tokio::time::Instant,
    /// Armed only once the body makes the call wait: most bodies arrive in the first poll,
    /// and a timer per call would cost every call.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    done: bool,
}

impl LimitedBody {
    /// Counts `len` more bytes; the status that ends the request, if a limit is passed.
    fn count(&mut self, len: usize) -> Result<(), Status> {
        let before = self.seen;
        self.seen = self.seen.saturating_add(len);
        if self.seen > self.cap {
            return Err(Status::resource_exhausted(format!(
                "request to {} is larger than its limit of {} bytes",
                self.method, self.cap
            )));
        }
        let shared = &self.charge.limits.shared;
        let beyond =
            self.seen.saturating_sub(shared.allowance) - before.saturating_sub(shared.allowance);
        if beyond > 0 {
            self.charge.counted.fetch_add(beyond, Ordering::Relaxed);
            let now = shared.in_flight.fetch_add(beyond, Ordering::Relaxed) + beyond;
            if now > shared.in_flight_max {
                return Err(Status::resource_exhausted(format!(
                    "requests in flight on this connection's listener exceed {} bytes; retry once a large call has finished",
                    shared.in_flight_max
                )));
            }
        }
        Ok(())
    }
}

impl http_body::Body for LimitedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let expired = match &mut self.timer {
            Some(timer) => timer.as_mut().poll(cx).is_ready(),
            None => tokio::time::Instant::now() >= self.deadline,
        };
        if expired {
            self.done = true;
            let deadline = self.charge.limits.shared.body_deadline;
            return Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                "the request to {} did not arrive within {} s",
                self.method,
                deadline.as_secs()
            )))));
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if let Err(status) = self.count(data.len()) {
                        self.done = true;
                        return Poll::Ready(Some(Err(status)));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.done = true;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => {
                if self.timer.is_none() {
                    let mut timer = Box::pin(tokio::time::sleep_until(self.deadline));
                    // Registers the wake-up at the deadline.
                    if timer.as_mut().poll(cx).is_ready() {
                        self.done = true;
                        return Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                            "the request to {} did not arrive in time",
                            self.method
                        )))));
                    }
                    self.timer = Some(timer);
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    fn body_of(chunks: Vec<usize>) -> Body {
        let stream = tokio_stream::iter(
            chunks
                .into_iter()
                .map(|n| Ok::<_, Status>(Frame::data(Bytes::from(vec![0u8; n])))),
        );
        Body::new(http_body_util::StreamBody::new(stream))
    }

    fn limited(limits: &RequestLimits, path: &str, body: Body) -> LimitedBody {
        let charge = Arc::new(Charge {
            limits: limits.clone(),
            counted: AtomicUsize::new(0),
        });
        LimitedBody {
            inner: body,
            charge,
            method: path.into(),
            cap: limits.cap_of(path),
            seen: 0,
            deadline: tokio::time::Instant::now() + limits.shared.body_deadline,
            timer: None,
            done: false,
        }
    }

    #[tokio::test]
    async fn bodies_past_their_method_cap_or_the_budget_end_with_resource_exhausted() {
        let limits = RequestLimits::builder(1000, 200 << 10, Duration::from_secs(5))
            .cap("/big", 1 << 20)
            .build();
        // Within the default cap.
        let small = limited(&limits, "/small", body_of(vec![500, 400]));
        assert_eq!(small.collect().await.unwrap().to_bytes().len(), 900);
        // Past it.
        let err = limited(&limits, "/small", body_of(vec![500, 600]))
            .collect()
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        // A big method: 64 KiB free, then the budget (200 KiB) counts; held while alive.
        let mut first = limited(&limits, "/big", body_of(vec![64 << 10, 150 << 10]));
        while let Some(frame) = first.frame().await {
            frame.unwrap();
        }
        assert_eq!(limits.in_flight(), 150 << 10);
        let err = limited(&limits, "/big", body_of(vec![64 << 10, 100 << 10]))
            .collect()
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        // Small calls still pass while the budget is spent.
        assert!(limited(&limits, "/small", body_of(vec![900]))
            .collect()
            .await
            .is_ok());
        drop(first);
        assert_eq!(limits.in_flight(), 0, "every charge is given back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_ends_at_its_deadline() {
        let limits = RequestLimits::builder(1000, 1000, Duration::from_secs(5)).build();
        let (_sender, receiver) = mpsc::channel::<Result<Frame<Bytes>, Status>>(1);
        let stalled = Body::new(http_body_util::StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
        ));
        let err = limited(&limits, "/m", stalled).collect().await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::DeadlineExceeded);
    }

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
