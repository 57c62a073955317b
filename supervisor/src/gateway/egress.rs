//! Outbound connections (egress): one `Egress` stream per connection the sandbox's proxy
//! opens. The connection is checked when it is made — the run alive, its receipt neither
//! expired nor revoked, an egress grant for the host and port, a free connection slot, bytes
//! left — then the supervisor resolves the name itself, keeps only addresses the grant may
//! reach, connects to one of exactly those, and relays bytes both ways. The stream is the
//! connection's control: its bytes never travel on it (a gRPC stream's framing cost more than
//! half the throughput of a download) but between the sandbox client's own socket, which the
//! proxy hands over with the token `opened` gave it (see `tunnel`), and the upstream's —
//! spliced socket to socket when the connection is opaque. The sandbox's first bytes, when
//! they are a TLS ClientHello, must name the host the connection was opened to.
//! Byte budgets (each way, over the run), the idle time, the receipt's expiry and the run's end
//! cut a connection. Each connection gets two `egress` audit entries with one call id: when it
//! is decided (`phase` `open`: host, port, address; or the refusal and why) and when it ends
//! (`phase` `closed`: bytes each way, duration, why it ended).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tollgate_audit::{Decision, EntryDraft, EntryKind};
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::egress_frame::Frame;
use tollgate_proto::EGRESS_TUNNEL_TOKEN_LEN;
use tollgate_receipt::egress::{grant_for, Host};
use tonic::{Status, Streaming};

use super::approval::Asked;
use super::gate::{new_call_id, CallGate, Refusal};
use super::inspection::{Classify, Inspection};
use crate::egress::ca::RunCa;
use crate::egress::config::EgressConfig;
use crate::egress::hello::{first_flight, ClientHello, FirstFlight, MAX_HELLO};
use crate::egress::resolve::reachable;
use crate::egress::splice::{AsSocket, Socket, SplicePipe};
use crate::COMPONENT;

/// Most outbound connections one run holds open at once, whatever its receipt allows: each
/// holds two descriptors and a gateway connection of the supervisor's.
pub const MAX_EGRESS_CONNECTIONS: u32 = 1024;
/// How long a new stream may take to name its host and port.
const OPEN_DEADLINE: Duration = Duration::from_secs(10);
/// How long one connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most addresses of one name tried.
const MAX_ATTEMPTS: usize = 4;
/// How long a ClientHello may take to arrive whole once it has begun.
const HELLO_DEADLINE: Duration = Duration::from_secs(5);
/// How long the sandbox's proxy may take to hand a connection's client over after `opened`.
const ATTACH_DEADLINE: Duration = Duration::from_secs(10);
/// Bytes read from either side at once.
const READ_CHUNK: usize = 256 << 10;
/// Bytes buffered between the sandbox's stream and the supervisor's reading of it.
const INSPECTED_BUFFER: usize = 256 << 10;

/// What a run's outbound connections are served with besides its receipt.
#[derive(Clone, Default)]
pub struct EgressSetup {
    /// The administrator's settings (names, secrets, upstream roots).
    pub config: Arc<EgressConfig>,
    /// The run's certificate authority, when it has inspected grants.
    pub ca: Option<Arc<RunCa>>,
    /// The classifier requests are judged with; none: the built-in defaults.
    pub classify: Option<Classify>,
}

impl std::fmt::Debug for EgressSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressSetup")
            .field("ca", &self.ca.is_some())
            .finish_non_exhaustive()
    }
}

/// The classifier with its built-in defaults, built once.
fn default_classify() -> Classify {
    static CLASSIFIER: std::sync::OnceLock<Option<Arc<tollgate_router::Classifier>>> =
        std::sync::OnceLock::new();
    let classifier = CLASSIFIER
        .get_or_init(|| {
            tollgate_router::Classifier::new(&tollgate_router::ClassifierConfig::default())
                .ok()
                .map(Arc::new)
        })
        .clone();
    Arc::new(move |text: &str| match &classifier {
        Some(classifier) => classifier.classify(text),
        // The built-in configuration always compiles; were it not to, nothing passes.
        None => tollgate_router::Classification {
            sensitivity: tollgate_router::Sensitivity::High,
            reasons: Vec::new(),
        },
    })
}

/// The stream of frames the supervisor sends back.
pub type EgressStream = tokio_stream::wrappers::ReceiverStream<Result<pb::EgressFrame, Status>>;

/// What a run's outbound connections have used.
#[derive(Debug, Default)]
pub struct EgressUsage {
    /// Connections open now.
    pub open: AtomicU32,
    /// Connections made over the run.
    pub made: AtomicU64,
    /// Bytes sent upstream over the run.
    pub sent: AtomicU64,
    /// Bytes received from upstreams over the run.
    pub received: AtomicU64,
}

/// What the sandbox's proxy handed over for a connection: its client's own TCP connection,
/// and the bytes it already read from it that go upstream first.
#[derive(Debug)]
pub struct Tunnel {
    /// The client's connection (inside the sandbox), checked to be a connected TCP socket.
    pub client: TcpStream,
    /// Bytes to send upstream before anything read from `client`.
    pub first: Vec<u8>,
}

/// One tunnel token, as `opened` gave it.
pub type TunnelToken = [u8; EGRESS_TUNNEL_TOKEN_LEN];

/// One run's outbound connections.
#[derive(Debug)]
pub struct EgressCalls {
    gate: Arc<CallGate>,
    setup: EgressSetup,
    /// What the run's connections have used.
    pub usage: EgressUsage,
    max_open: u32,
    /// Bytes each way over the whole run (lowered by a narrowing, never raised).
    max_bytes: AtomicU64,
    idle: Duration,
    /// Connections opened and waiting for their tunnel, by token (at most `max_open`: each
    /// holds a slot).
    waiting: std::sync::Mutex<std::collections::HashMap<TunnelToken, oneshot::Sender<Tunnel>>>,
    /// Where a connection under a grant that asks waits for an operator.
    approvals: super::approval::RunApprovals,
}

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
struct Connected {
    host: Host,
    port: u16,
    address: SocketAddr,
    upstream: TcpStream,
    /// The grant that allowed it.
    grant: pb::EgressGrant,
    /// The supervisor reads its requests (an inspected grant, or the proxy's plain HTTP).
    inspected: bool,
    /// The sandbox's proxy forwards plain HTTP on it (never TLS).
    http: bool,
    /// Who approved it, when its grant asks.
    approved_by: Option<String>,
}

/// What the sandbox asked to connect to, as the audit entry shows it.
struct Target {
    host: String,
    port: u32,
}

impl EgressCalls {
    /// The outbound connections of the run `gate` guards, bounded by its receipt's limits.
    pub fn new(
        gate: Arc<CallGate>,
        setup: EgressSetup,
        approvals: super::approval::RunApprovals,
    ) -> Self {
        let (max_open, max_bytes, idle) =
            tollgate_proto::effective_egress(&gate.receipt.limits.unwrap_or_default());
        Self {
            gate,
            setup,
            usage: EgressUsage::default(),
            max_open: max_open.min(MAX_EGRESS_CONNECTIONS),
            max_bytes: AtomicU64::new(max_bytes),
            idle: Duration::from_secs(idle.into()),
            waiting: Default::default(),
            approvals,
        }
    }

    /// Most outbound connections the run may hold open at once (each also begins with a
    /// hand-off connection to its gateway socket).
    pub fn max_open(&self) -> u32 {
        self.max_open
    }

    /// Gives a handed-over client to the connection `token` names; `false` (and the client
    /// dropped) when no connection waits for that token.
    pub fn attach(&self, token: &TunnelToken, tunnel: Tunnel) -> bool {
        let waiting = self
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(token);
        waiting.is_some_and(|waiting| waiting.send(tunnel).is_ok())
    }

    /// Registers a connection waiting for its tunnel: its token and where the tunnel goes.
    fn wait_for_tunnel(&self) -> (TunnelToken, oneshot::Receiver<Tunnel>) {
        let (tx, rx) = oneshot::channel();
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        // Dropped receivers (connections that ended unattached) are swept here.
        waiting.retain(|_, sender| !sender.is_closed());
        loop {
            // 128 bits from the system's random source: never guessed.
            let mut token = TunnelToken::default();
            rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut token);
            if let std::collections::hash_map::Entry::Vacant(entry) = waiting.entry(token) {
                entry.insert(tx);
                return (token, rx);
            }
        }
    }

    /// Serves one `Egress` stream: reads its `open`, decides, connects, and relays on a task
    /// of its own; the returned stream starts with `opened`.
    pub async fn open(
        self: &Arc<Self>,
        mut frames: Streaming<pb::EgressFrame>,
    ) -> Result<EgressStream, Status> {
        let started = Instant::now();
        let call_id = new_call_id();
        let open = match tokio::time::timeout(OPEN_DEADLINE, frames.message()).await {
            Ok(Ok(Some(pb::EgressFrame {
                frame: Some(Frame::Open(open)),
            }))) => open,
            _ => {
                return Err(Status::invalid_argument(
                    "an egress stream starts with `open` (host and port), within 10 s",
                ))
            }
        };
        let target = Target {
            host: clip(&open.host),
            port: open.port,
        };
        let connected = match self.connect(&open, &call_id).await {
            Ok(connected) => connected,
            Err(refusal) => {
                // A run past its budget or audit quota has its refusals summarised, not
                // written one by one: a loop of refused connections cannot fill the disk.
                if refusal.decision() == Decision::Deny
                    && self.gate.summarised("egress", &call_id, &refusal.reason)?
                {
                    crate::metrics::get().call("egress", Decision::Deny.as_str());
                    return Err(refusal.into_status(&call_id));
                }
                self.record(&call_id, &target, refusal.decision(), |entry| {
                    entry
                        .reason(refusal.reason.as_str())
                        .meta("phase", "open")
                        .meta("code", refusal.code.unwrap_or("egress_refused"))
                        .meta(
                            "duration_us",
                            i64::try_from(started.elapsed().as_micros()).unwrap_or(i64::MAX),
                        )
                })?;
                return Err(refusal.into_status(&call_id));
            }
        };
        let inspected = connected.inspected;
        let approved_by = connected.approved_by.clone();
        let recorded = self.record(&call_id, &target, Decision::Allow, |entry| {
            let entry = match approved_by {
                Some(by) => entry.meta("approved_by", by),
                None => entry,
            };
            entry
                .meta("phase", "open")
                .meta("address", connected.address.to_string())
                .meta("inspected", inspected)
                .meta(
                    "duration_us",
                    i64::try_from(started.elapsed().as_micros()).unwrap_or(i64::MAX),
                )
        });
        if let Err(status) = recorded {
            // Nothing unaudited leaves: the connection is dropped and its slot given back.
            self.usage.open.fetch_sub(1, Ordering::SeqCst);
            return Err(status);
        }
        self.usage.made.fetch_add(1, Ordering::SeqCst);
        let (token, tunnel) = self.wait_for_tunnel();
        let (tx, rx) = mpsc::channel(2);
        let opened = pb::EgressFrame {
            frame: Some(Frame::Opened(pb::EgressOpened {
                address: connected.address.to_string(),
                inspected,
                tunnel_token: token.to_vec(),
            })),
        };
        // The channel is new and empty: the first frame always fits.
        let _ = tx.try_send(Ok(opened));
        let calls = self.clone();
        tokio::spawn(async move {
            calls
                .relay(connected, frames, tunnel, tx, call_id, target)
                .await;
        });
        Ok(EgressStream::new(rx))
    }

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
    async fn connect(&self, open: &pb::EgressOpen, call_id: &str) -> Result<Connected, Refusal> {
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

    /// The bytes the run's connections may carry each way, in all, now.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes.load(Ordering::SeqCst)
    }

    /// Lowers that budget to `bytes` (a narrowing; never raises it). Connections past it are
    /// cut at their next chunk.
    pub fn lower_bytes(&self, bytes: u64) {
        self.max_bytes.fetch_min(bytes, Ordering::SeqCst);
    }

    /// Raises that budget to `bytes` (a signed amendment; never lowers it).
    pub fn raise_bytes(&self, bytes: u64) {
        self.max_bytes.fetch_max(bytes, Ordering::SeqCst);
    }

    /// Sets that budget to `bytes` (what a re-adopted run's amendments made of it).
    pub fn set_bytes(&self, bytes: u64) {
        self.max_bytes.store(bytes, Ordering::SeqCst);
    }

    fn bytes_spent(&self, way: &str) -> Refusal {
        Refusal::with(
            Status::resource_exhausted,
            format!(
                "the run's outbound connections have {way} their {} bytes (limits.egress_bytes)",
                self.max_bytes()
            ),
        )
        .coded("egress_bytes")
    }

    /// Takes `bytes` from the run's budget one way; past it, the connection is cut.
    fn charge(&self, counter: &AtomicU64, bytes: usize, way: &str) -> Result<(), Refusal> {
        let bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
        let before = counter.fetch_add(bytes, Ordering::SeqCst);
        if before.saturating_add(bytes) > self.max_bytes() {
            return Err(self.bytes_spent(way));
        }
        Ok(())
    }

    /// Waits for the connection's tunnel, relays until the connection ends, then records how
    /// it ended.
    async fn relay(
        self: Arc<Self>,
        connected: Connected,
        frames: Streaming<pb::EgressFrame>,
        tunnel: oneshot::Receiver<Tunnel>,
        tx: mpsc::Sender<Result<pb::EgressFrame, Status>>,
        call_id: String,
        target: Target,
    ) {
        let started = Instant::now();
        let counted = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let (address, port) = (connected.address, connected.port);
        let end = self
            .relay_until_end(connected, frames, tunnel, &tx, &call_id, &counted, started)
            .await;
        if let Err(refusal) = &end {
            // The sandbox hears why (bounded: a sandbox that stopped reading does not hold
            // this task).
            let status = refusal.status.clone();
            let _ = tokio::time::timeout(Duration::from_secs(1), tx.send(Err(status))).await;
        }
        drop(tx);
        self.usage.open.fetch_sub(1, Ordering::SeqCst);
        let (decision, reason, code) = match &end {
            Ok(reason) => (Decision::Allow, (*reason).to_owned(), None),
            Err(refusal) => (refusal.decision(), refusal.reason.clone(), refusal.code),
        };
        let sent = counted[0].load(Ordering::SeqCst);
        let received = counted[1].load(Ordering::SeqCst);
        let written = tokio::task::block_in_place(|| {
            self.record(&call_id, &target, decision, |entry| {
                let entry = entry
                    .reason(reason.as_str())
                    .meta("phase", "closed")
                    .meta("address", address.to_string())
                    .meta("port", i64::from(port))
                    .meta("bytes_sent", i64::try_from(sent).unwrap_or(i64::MAX))
                    .meta(
                        "bytes_received",
                        i64::try_from(received).unwrap_or(i64::MAX),
                    )
                    .meta(
                        "duration_ms",
                        i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
                    );
                match code {
                    Some(code) => entry.meta("code", code),
                    None => entry,
                }
            })
        });
        if let Err(e) = written {
            tracing::error!(run_id = %self.gate.run_id, error = %e.message(), "could not audit an outbound connection's end");
        }
    }

    /// The relay itself: `Ok` with how a normal end came, or the refusal that cut it. Both
    /// sockets are closed when this returns.
    #[allow(clippy::too_many_arguments)]
    async fn relay_until_end(
        self: &Arc<Self>,
        connected: Connected,
        frames: Streaming<pb::EgressFrame>,
        tunnel: oneshot::Receiver<Tunnel>,
        tx: &mpsc::Sender<Result<pb::EgressFrame, Status>>,
        call_id: &str,
        counted: &Arc<[AtomicU64; 2]>,
        started: Instant,
    ) -> Result<&'static str, Refusal> {
        let outside = self.ended_from_outside(tx, frames);
        tokio::pin!(outside);
        let tunnel = tokio::select! {
            attached = tokio::time::timeout(ATTACH_DEADLINE, tunnel) => match attached {
                Ok(Ok(tunnel)) => tunnel,
                Ok(Err(_)) => {
                    return Err(Refusal::with(Status::internal, "the hand-off was lost".into()).ran())
                }
                Err(_) => {
                    return Err(Refusal::with(
                        Status::deadline_exceeded,
                        format!(
                            "the sandbox's proxy did not hand the connection's client over within {} s",
                            ATTACH_DEADLINE.as_secs()
                        ),
                    )
                    .ran()
                    .coded("egress_tunnel"))
                }
            },
            end = &mut outside => return end,
        };
        let activity = Arc::new(AtomicU64::new(elapsed_ms(started)));
        let progress = || Progress {
            activity: activity.clone(),
            counted: counted.clone(),
            started,
        };
        let host = connected.host.clone();
        // The proxy keeps its own descriptor of the client's socket until the stream ends:
        // the connection is ended on the socket itself (a shutdown), not by closing ours.
        let client = match std::os::fd::AsFd::as_fd(&tunnel.client).try_clone_to_owned() {
            Ok(client) => client,
            Err(e) => {
                return Err(Refusal::with(
                    Status::unavailable,
                    format!("keeping the client's connection: {}", e.kind()),
                )
                .ran())
            }
        };
        let first = tunnel.first;
        let (sandbox_read, sandbox_write) = tunnel.client.into_split();
        let sandbox_write = ClientWrite(Some(sandbox_write));
        // Opaque: the sandbox's bytes go straight to the upstream socket. Read: they go to
        // the supervisor's own HTTP (and TLS) side of an in-memory pipe, which makes the
        // upstream connection itself.
        let (mut outbound, mut inbound, mut reader) = if connected.inspected {
            let (client, pipe) = tokio::io::duplex(INSPECTED_BUFFER);
            let (pipe_read, pipe_write) = tokio::io::split(pipe);
            let inspection = Inspection {
                gate: self.gate.clone(),
                host: connected.host.clone(),
                port: connected.port,
                grant: connected.grant,
                config: self.setup.config.clone(),
                ca: self.setup.ca.clone(),
                classify: self.setup.classify.clone().unwrap_or_else(default_classify),
                call_id: call_id.to_owned(),
                plain: connected.http,
            };
            (
                tokio::spawn(self.clone().outbound(
                    sandbox_read,
                    first,
                    pipe_write,
                    host,
                    progress(),
                )),
                tokio::spawn(self.clone().inbound(pipe_read, sandbox_write, progress())),
                Some(tokio::spawn(inspection.serve(client, connected.upstream))),
            )
        } else {
            let (upstream_read, upstream_write) = connected.upstream.into_split();
            (
                tokio::spawn(self.clone().outbound(
                    sandbox_read,
                    first,
                    upstream_write,
                    host,
                    progress(),
                )),
                tokio::spawn(
                    self.clone()
                        .inbound(upstream_read, sandbox_write, progress()),
                ),
                None,
            )
        };
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let (mut outbound_done, mut inbound_done, mut reader_done) = (false, false, false);
        let relay_failed = |e: tokio::task::JoinError| {
            Refusal::with(Status::internal, format!("relay: {e}")).ran()
        };
        let end: Result<&'static str, Refusal> = loop {
            tokio::select! {
                done = async { reader.as_mut().expect("guarded").await }, if reader.is_some() && !reader_done => match done {
                    // The supervisor's side is done: what it wrote last still has to reach the
                    // sandbox (the pipe ends, and `inbound` half-closes).
                    Ok(Ok(())) if inbound_done => break Ok("closed"),
                    Ok(Ok(())) => reader_done = true,
                    Ok(Err(refusal)) => break Err(refusal),
                    Err(e) => break Err(relay_failed(e)),
                },
                done = &mut outbound, if !outbound_done => match done {
                    Ok(Ok(Side::Finished)) if inbound_done => break Ok("closed"),
                    // The sandbox finished sending; the other way may still carry an answer.
                    Ok(Ok(Side::Finished)) => outbound_done = true,
                    Ok(Ok(Side::SandboxGone)) => break Ok("closed by the sandbox"),
                    Ok(Err(refusal)) => break Err(refusal),
                    Err(e) => break Err(relay_failed(e)),
                },
                done = &mut inbound, if !inbound_done => match done {
                    // The upstream finished sending, and the sandbox has been told.
                    Ok(Ok(Side::Finished)) if outbound_done || reader_done => break Ok("closed"),
                    Ok(Ok(Side::Finished)) => inbound_done = true,
                    Ok(Ok(Side::SandboxGone)) => break Ok("closed by the sandbox"),
                    Ok(Err(refusal)) => break Err(refusal),
                    Err(e) => break Err(relay_failed(e)),
                },
                end = &mut outside => break end,
                _ = tick.tick() => {
                    let quiet = elapsed_ms(started).saturating_sub(activity.load(Ordering::SeqCst));
                    if Duration::from_millis(quiet) >= self.idle {
                        break Err(Refusal::with(
                            Status::deadline_exceeded,
                            format!(
                                "nothing was sent either way for {} s (limits.egress_idle_seconds)",
                                self.idle.as_secs()
                            ),
                        ).ran().coded("egress_idle"));
                    }
                    if self.gate.check_alive().is_err() {
                        break Err(self.run_ended());
                    }
                }
            }
        };
        // The halves are dropped with their tasks: the upstream closes.
        outbound.abort();
        inbound.abort();
        if let Some(reader) = reader {
            reader.abort();
        }
        // A plain request refused before any answer is left to the proxy, which answers
        // with the refusal; every other end closes the client's connection here and now.
        let unanswered = connected.http && counted[1].load(Ordering::SeqCst) == 0;
        match end {
            Err(mut refusal) if unanswered => {
                refusal.status.metadata_mut().insert(
                    tollgate_proto::EGRESS_UNANSWERED,
                    tonic::metadata::MetadataValue::from_static("true"),
                );
                Err(refusal)
            }
            end => {
                let _ = nix::sys::socket::shutdown(
                    std::os::fd::AsRawFd::as_raw_fd(&client),
                    nix::sys::socket::Shutdown::Both,
                );
                end
            }
        }
    }

    /// Resolves when something outside the relay ends the connection: the sandbox ending or
    /// misusing its control stream (bytes never go on it), the run's end, the receipt's
    /// expiry.
    async fn ended_from_outside(
        &self,
        tx: &mpsc::Sender<Result<pb::EgressFrame, Status>>,
        mut frames: Streaming<pb::EgressFrame>,
    ) -> Result<&'static str, Refusal> {
        let mut ending = self.gate.streams_end.subscribe();
        let expires = std::time::UNIX_EPOCH
            + Duration::from_secs(u64::try_from(self.gate.expires_at()).unwrap_or(0));
        let until_expiry = expires
            .duration_since(std::time::SystemTime::now())
            .unwrap_or_default();
        let expiry = tokio::time::sleep(until_expiry);
        tokio::pin!(expiry);
        // A sandbox that half-closes its side of the stream keeps the connection.
        let mut control_open = true;
        loop {
            tokio::select! {
                () = tx.closed() => return Ok("closed by the sandbox"),
                message = frames.message(), if control_open => match message {
                    Ok(None) => control_open = false,
                    Ok(Some(_)) => return Err(Refusal::with(
                        Status::invalid_argument,
                        "after `open`, a connection's bytes go on its client's own socket, not its stream".into(),
                    )),
                    Err(_) => return Ok("closed by the sandbox"),
                },
                _ = ending.wait_for(|ended| *ended) => return Err(self.run_ended()),
                () = &mut expiry => return Err(Refusal::denied(
                    &self.gate.run_id,
                    format!("the receipt expired at {}", tollgate_receipt::rfc3339(self.gate.expires_at())),
                )
                .ran()
                .coded("egress_expired")),
            }
        }
    }

    fn run_ended(&self) -> Refusal {
        Refusal::denied(&self.gate.run_id, "the run ended".into())
            .ran()
            .coded("egress_run_ended")
    }

    /// Sandbox to upstream: checks the first bytes (a ClientHello must name the host),
    /// counts every byte, passes the sandbox's end of sending on as a half-close.
    async fn outbound<R, W>(
        self: Arc<Self>,
        mut sandbox: R,
        mut preread: Vec<u8>,
        mut upstream: W,
        host: Host,
        progress: Progress,
    ) -> Result<Side, Refusal>
    where
        R: AsyncRead + AsSocket + Unpin + Send + 'static,
        W: AsyncWrite + AsSocket + Unpin + Send + 'static,
    {
        // The first bytes, held until they are known not to be TLS or to be a ClientHello
        // naming the host.
        let mut first: Option<Vec<u8>> = Some(Vec::new());
        let mut hello_deadline = None;
        let mut buffer = vec![0u8; READ_CHUNK.max(preread.len())];
        loop {
            if first.is_none() && preread.is_empty() {
                // Checked: from here on an opaque connection's bytes are only counted.
                if let (Some(from), Some(to)) = (sandbox.socket(), upstream.socket()) {
                    if let Ok(pipe) = SplicePipe::new() {
                        let side = self.splice(&pipe, from, to, 0, &progress).await;
                        if matches!(side, Ok(Side::Finished)) {
                            let _ = upstream.shutdown().await;
                        }
                        return side;
                    }
                }
            }
            // What the proxy read before the hand-off comes first.
            let read = if preread.is_empty() {
                let next = sandbox.read(&mut buffer);
                let read = match hello_deadline {
                    Some(deadline) => match tokio::time::timeout_at(deadline, next).await {
                        Ok(read) => read,
                        Err(_) => {
                            return Err(Refusal::denied(
                                &self.gate.run_id,
                                format!(
                                    "the TLS ClientHello did not arrive whole within {} s",
                                    HELLO_DEADLINE.as_secs()
                                ),
                            )
                            .coded("egress_sni"))
                        }
                    },
                    None => next.await,
                };
                let Ok(read) = read else {
                    return Ok(Side::SandboxGone);
                };
                read
            } else {
                let read = preread.len();
                buffer[..read].copy_from_slice(&preread);
                preread.clear();
                read
            };
            if read == 0 {
                if first.as_ref().is_some_and(|held| !held.is_empty()) {
                    return Err(Refusal::denied(
                        &self.gate.run_id,
                        "the sandbox stopped sending in the middle of a TLS ClientHello".into(),
                    )
                    .coded("egress_sni"));
                }
                let _ = upstream.shutdown().await;
                return Ok(Side::Finished);
            }
            progress.touch();
            self.charge(&self.usage.sent, read, "sent")?;
            progress.counted[0].fetch_add(read as u64, Ordering::SeqCst);
            let held;
            let data: &[u8] = match first.take() {
                None => &buffer[..read],
                Some(mut start) => {
                    start.extend_from_slice(&buffer[..read]);
                    match first_flight(&start) {
                        FirstFlight::NeedMore if start.len() < MAX_HELLO => {
                            hello_deadline.get_or_insert_with(|| {
                                tokio::time::Instant::now() + HELLO_DEADLINE
                            });
                            first = Some(start);
                            continue;
                        }
                        FirstFlight::NeedMore => {
                            return Err(Refusal::denied(
                                &self.gate.run_id,
                                "a TLS ClientHello longer than 16 KiB".into(),
                            )
                            .coded("egress_sni"))
                        }
                        FirstFlight::Malformed(why) => {
                            return Err(
                                Refusal::denied(&self.gate.run_id, why.into()).coded("egress_sni")
                            )
                        }
                        FirstFlight::Hello(hello) => self.check_hello(&host, &hello)?,
                        FirstFlight::NotTls => {}
                    }
                    held = start;
                    &held
                }
            };
            hello_deadline = None;
            if let Err(e) = upstream.write_all(data).await {
                return Err(Refusal::with(
                    Status::unavailable,
                    format!("the upstream stopped taking bytes: {}", e.kind()),
                )
                .ran());
            }
        }
    }

    /// A ClientHello on a connection opened to a name must name exactly that server, in
    /// the clear.
    fn check_hello(&self, host: &Host, hello: &ClientHello) -> Result<(), Refusal> {
        let refuse = |why: String| Err(Refusal::denied(&self.gate.run_id, why).coded("egress_sni"));
        if hello.encrypted_client_hello {
            return refuse(format!(
                "the TLS ClientHello to {host} hides its server name (encrypted_client_hello)"
            ));
        }
        let Host::Name(name) = host else {
            // The address itself was granted: whatever name the handshake asks that server for.
            return Ok(());
        };
        match hello.server_name.as_deref() {
            None => refuse(format!(
                "the TLS ClientHello names no server; a connection to {name} must name {name}"
            )),
            Some(sni) => match Host::parse(sni) {
                Ok(Host::Name(sni)) if sni == *name => Ok(()),
                _ => refuse(format!(
                    "the TLS ClientHello names {:?}, not {name}, the host this connection was granted for",
                    clip(sni)
                )),
            },
        }
    }

    /// Upstream to sandbox: counts every byte; at the upstream's end of data, a half-close.
    async fn inbound<R, W>(
        self: Arc<Self>,
        mut upstream: R,
        mut sandbox: W,
        progress: Progress,
    ) -> Result<Side, Refusal>
    where
        R: AsyncRead + AsSocket + Unpin + Send + 'static,
        W: AsyncWrite + AsSocket + Unpin + Send + 'static,
    {
        if let (Some(from), Some(to)) = (upstream.socket(), sandbox.socket()) {
            if let Ok(pipe) = SplicePipe::new() {
                let side = self.splice(&pipe, from, to, 1, &progress).await;
                if matches!(side, Ok(Side::Finished)) {
                    let _ = sandbox.shutdown().await;
                }
                return side;
            }
        }
        let mut buffer = vec![0u8; READ_CHUNK];
        loop {
            let read = match upstream.read(&mut buffer).await {
                Ok(read) => read,
                Err(e) => {
                    return Err(Refusal::with(
                        Status::unavailable,
                        format!("the upstream connection failed: {}", e.kind()),
                    )
                    .ran())
                }
            };
            if read == 0 {
                let _ = sandbox.shutdown().await;
                return Ok(Side::Finished);
            }
            progress.touch();
            self.charge(&self.usage.received, read, "received")?;
            progress.counted[1].fetch_add(read as u64, Ordering::SeqCst);
            if sandbox.write_all(&buffer[..read]).await.is_err() {
                return Ok(Side::SandboxGone);
            }
        }
    }

    /// One direction of an opaque connection, socket to socket through `pipe`: `way` 0 is
    /// the sandbox sending (`from` is its client's socket), 1 the upstream. Each pipe-full is charged
    /// to the run's budget before it goes on, as copied bytes are. Returns at `from`'s end of
    /// data (the caller passes the half-close on).
    async fn splice(
        &self,
        pipe: &SplicePipe,
        from: Socket<'_>,
        to: Socket<'_>,
        way: usize,
        progress: &Progress,
    ) -> Result<Side, Refusal> {
        let (usage, name) = if way == 0 {
            (&self.usage.sent, "sent")
        } else {
            (&self.usage.received, "received")
        };
        loop {
            let moved = match pipe.fill(from).await {
                Ok(0) => return Ok(Side::Finished),
                Ok(moved) => moved,
                Err(_) if way == 0 => return Ok(Side::SandboxGone),
                Err(e) => {
                    return Err(Refusal::with(
                        Status::unavailable,
                        format!("the upstream connection failed: {}", e.kind()),
                    )
                    .ran())
                }
            };
            progress.touch();
            self.charge(usage, moved, name)?;
            progress.counted[way].fetch_add(moved as u64, Ordering::SeqCst);
            match pipe.drain(to, moved).await {
                Ok(()) => {}
                Err(_) if way == 1 => return Ok(Side::SandboxGone),
                Err(e) => {
                    return Err(Refusal::with(
                        Status::unavailable,
                        format!("the upstream stopped taking bytes: {}", e.kind()),
                    )
                    .ran())
                }
            }
        }
    }

    /// Writes one `egress` entry of this run (counted against its audit quota).
    fn record(
        &self,
        call_id: &str,
        target: &Target,
        decision: Decision,
        fill: impl FnOnce(EntryDraft) -> EntryDraft,
    ) -> Result<(), Status> {
        crate::metrics::get().call("egress", decision.as_str());
        let entry = EntryDraft::new(COMPONENT, EntryKind::Egress)
            .receipt(self.gate.run_id.as_str())
            .run(self.gate.run_id.as_str())
            .call(call_id)
            .decision(decision)
            .meta("host", target.host.as_str())
            .meta("port", i64::from(target.port));
        self.gate.audited(fill(entry), false)
    }
}

/// The write half of a client's connection. Dropping tokio's half-closes the connection;
/// dropping this one does not: a plain request refused before any answer stays open for the
/// proxy to answer, and every other end shuts the socket down on purpose.
struct ClientWrite(Option<tokio::net::tcp::OwnedWriteHalf>);

impl ClientWrite {
    fn half(self: std::pin::Pin<&mut Self>) -> std::pin::Pin<&mut tokio::net::tcp::OwnedWriteHalf> {
        std::pin::Pin::new(
            self.get_mut()
                .0
                .as_mut()
                .expect("the half is taken only when dropped"),
        )
    }
}

impl Drop for ClientWrite {
    fn drop(&mut self) {
        if let Some(half) = self.0.take() {
            half.forget();
        }
    }
}

impl AsyncWrite for ClientWrite {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.half().poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.half().poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.half().poll_shutdown(cx)
    }
}

impl AsSocket for ClientWrite {
    fn socket(&self) -> Option<Socket<'_>> {
        self.0.as_ref().and_then(|half| half.socket())
    }
}

/// How one direction of a relay ended without a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// Its sender finished, and the receiver was told (a half-close).
    Finished,
    /// The sandbox's side (its client's socket) failed or went away: the connection is over.
    SandboxGone,
}

/// What both halves of a relay report: when a byte last moved, and the bytes each way.
struct Progress {
    activity: Arc<AtomicU64>,
    counted: Arc<[AtomicU64; 2]>,
    started: Instant,
}

impl Progress {
    fn touch(&self) {
        self.activity
            .store(elapsed_ms(self.started), Ordering::SeqCst);
    }
}

fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The agent's text as an entry or message shows it: at most 255 characters, no controls.
fn clip(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).take(255).collect()
}
