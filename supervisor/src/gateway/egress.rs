//! Outbound connections (egress): one `Egress` stream per connection the sandbox's proxy
//! opens. The connection is checked when it is made — the run alive, its receipt neither
//! expired nor revoked, an egress grant for the host and port, a free connection slot, bytes
//! left — then the supervisor resolves the name itself, keeps only addresses the grant may
//! reach, connects to one of exactly those, and relays bytes both ways. The sandbox's first
//! bytes, when they are a TLS ClientHello, must name the host the connection was opened to.
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
use tokio::sync::mpsc;
use tollgate_audit::{Decision, EntryDraft, EntryKind};
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::egress_frame::Frame;
use tollgate_receipt::egress::{grant_for, Host};
use tonic::{Status, Streaming};

use super::gate::{new_call_id, CallGate, Refusal};
use super::inspection::{Classify, Inspection};
use crate::egress::ca::RunCa;
use crate::egress::config::EgressConfig;
use crate::egress::hello::{first_flight, ClientHello, FirstFlight, MAX_HELLO};
use crate::egress::resolve::reachable;
use crate::COMPONENT;

/// Most bytes one `data` frame from the sandbox may carry.
pub const MAX_FRAME: usize = 256 << 10;
/// How long a new stream may take to name its host and port.
const OPEN_DEADLINE: Duration = Duration::from_secs(10);
/// How long one connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most addresses of one name tried.
const MAX_ATTEMPTS: usize = 4;
/// How long a ClientHello may take to arrive whole once it has begun.
const HELLO_DEADLINE: Duration = Duration::from_secs(5);
/// Bytes read from the upstream at once (one frame).
const READ_CHUNK: usize = 64 << 10;
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

/// One run's outbound connections.
#[derive(Debug)]
pub struct EgressCalls {
    gate: Arc<CallGate>,
    setup: EgressSetup,
    /// What the run's connections have used.
    pub usage: EgressUsage,
    max_open: u32,
    max_bytes: u64,
    idle: Duration,
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
}

/// What the sandbox asked to connect to, as the audit entry shows it.
struct Target {
    host: String,
    port: u32,
}

impl EgressCalls {
    /// The outbound connections of the run `gate` guards, bounded by its receipt's limits.
    pub fn new(gate: Arc<CallGate>, setup: EgressSetup) -> Self {
        let (max_open, max_bytes, idle) =
            tollgate_proto::effective_egress(&gate.receipt.limits.unwrap_or_default());
        Self {
            gate,
            setup,
            usage: EgressUsage::default(),
            max_open,
            max_bytes,
            idle: Duration::from_secs(idle.into()),
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
        let connected = match self.connect(&open).await {
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
        let recorded = self.record(&call_id, &target, Decision::Allow, |entry| {
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
        let (tx, rx) = mpsc::channel(8);
        let opened = pb::EgressFrame {
            frame: Some(Frame::Opened(pb::EgressOpened {
                address: connected.address.to_string(),
                inspected,
            })),
        };
        // The channel is new and empty: the first frame always fits.
        let _ = tx.try_send(Ok(opened));
        let calls = self.clone();
        tokio::spawn(async move {
            calls.relay(connected, frames, tx, call_id, target).await;
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

    /// Every check of a new connection, then the connection itself.
    async fn connect(&self, open: &pb::EgressOpen) -> Result<Connected, Refusal> {
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
        // A slot is held across the resolution and connect, so the bound holds while many
        // connections are being made at once.
        let slot = self.take_slot()?;
        for (counter, way) in [
            (&self.usage.sent, "sent"),
            (&self.usage.received, "received"),
        ] {
            if counter.load(Ordering::SeqCst) >= self.max_bytes {
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

    fn bytes_spent(&self, way: &str) -> Refusal {
        Refusal::with(
            Status::resource_exhausted,
            format!(
                "the run's outbound connections have {way} their {} bytes (limits.egress_bytes)",
                self.max_bytes
            ),
        )
        .coded("egress_bytes")
    }

    /// Takes `bytes` from the run's budget one way; past it, the connection is cut.
    fn charge(&self, counter: &AtomicU64, bytes: usize, way: &str) -> Result<(), Refusal> {
        let bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
        let before = counter.fetch_add(bytes, Ordering::SeqCst);
        if before.saturating_add(bytes) > self.max_bytes {
            return Err(self.bytes_spent(way));
        }
        Ok(())
    }

    /// Relays one connection until it ends, then records how it ended.
    async fn relay(
        self: Arc<Self>,
        connected: Connected,
        frames: Streaming<pb::EgressFrame>,
        tx: mpsc::Sender<Result<pb::EgressFrame, Status>>,
        call_id: String,
        target: Target,
    ) {
        let started = Instant::now();
        let activity = Arc::new(AtomicU64::new(0));
        let counted = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let progress = || Progress {
            activity: activity.clone(),
            counted: counted.clone(),
            started,
        };
        let (address, port, host) = (connected.address, connected.port, connected.host.clone());
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
                call_id: call_id.clone(),
                plain: connected.http,
            };
            (
                tokio::spawn(
                    self.clone()
                        .outbound(frames, pipe_write, host.clone(), progress()),
                ),
                tokio::spawn(self.clone().inbound(pipe_read, tx.clone(), progress())),
                Some(tokio::spawn(inspection.serve(client, connected.upstream))),
            )
        } else {
            let (read_half, write_half) = connected.upstream.into_split();
            (
                tokio::spawn(
                    self.clone()
                        .outbound(frames, write_half, host.clone(), progress()),
                ),
                tokio::spawn(self.clone().inbound(read_half, tx.clone(), progress())),
                None,
            )
        };
        let mut ending = self.gate.streams_end.subscribe();
        let expires = std::time::UNIX_EPOCH
            + Duration::from_secs(u64::try_from(self.gate.expires_at).unwrap_or(0));
        let until_expiry = expires
            .duration_since(std::time::SystemTime::now())
            .unwrap_or_default();
        let expiry = tokio::time::sleep(until_expiry);
        tokio::pin!(expiry);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut inbound_done = false;
        let mut reader_done = false;
        let end: Result<&'static str, Refusal> = loop {
            tokio::select! {
                done = async { reader.as_mut().expect("guarded").await }, if reader.is_some() && !reader_done => match done {
                    // The supervisor's side is done: what it wrote last still has to reach the
                    // sandbox (the pipe ends, and `inbound` half-closes).
                    Ok(Ok(())) if inbound_done => break Ok("closed"),
                    Ok(Ok(())) => reader_done = true,
                    Ok(Err(refusal)) => break Err(refusal),
                    Err(e) => break Err(Refusal::with(Status::internal, format!("relay: {e}")).ran()),
                },
                done = &mut outbound => break match done {
                    Ok(Ok(())) => Ok("closed by the sandbox"),
                    Ok(Err(refusal)) => Err(refusal),
                    Err(e) => Err(Refusal::with(Status::internal, format!("relay: {e}")).ran()),
                },
                done = &mut inbound, if !inbound_done => match done {
                    // The upstream finished sending; the sandbox ends the stream when it has
                    // passed that on.
                    Ok(Ok(())) if reader_done => break Ok("closed"),
                    Ok(Ok(())) => inbound_done = true,
                    Ok(Err(refusal)) => break Err(refusal),
                    Err(e) => break Err(Refusal::with(Status::internal, format!("relay: {e}")).ran()),
                },
                _ = ending.wait_for(|ended| *ended) => break Err(Refusal::denied(
                    &self.gate.run_id,
                    "the run ended".into(),
                ).ran().coded("egress_run_ended")),
                () = &mut expiry => break Err(Refusal::denied(
                    &self.gate.run_id,
                    format!("the receipt expired at unix {}", self.gate.expires_at),
                ).ran().coded("egress_expired")),
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
                        break Err(Refusal::denied(&self.gate.run_id, "the run ended".into())
                            .ran()
                            .coded("egress_run_ended"));
                    }
                }
            }
        };
        outbound.abort();
        inbound.abort();
        if let Some(reader) = reader {
            reader.abort();
        }
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

    /// Sandbox to upstream: checks the first bytes (a ClientHello must name the host),
    /// counts every byte, passes half-closes on. Ends when the sandbox ends the stream.
    async fn outbound<W: AsyncWrite + Unpin + Send + 'static>(
        self: Arc<Self>,
        mut frames: Streaming<pb::EgressFrame>,
        mut upstream: W,
        host: Host,
        progress: Progress,
    ) -> Result<(), Refusal> {
        // The first bytes, held until they are known not to be TLS or to be a ClientHello
        // naming the host.
        let mut first: Option<Vec<u8>> = Some(Vec::new());
        let mut hello_deadline = None;
        loop {
            let next = frames.message();
            let message = match hello_deadline {
                Some(deadline) => match tokio::time::timeout_at(deadline, next).await {
                    Ok(message) => message,
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
            let frame = match message {
                Ok(Some(pb::EgressFrame { frame: Some(frame) })) => frame,
                Ok(Some(pb::EgressFrame { frame: None })) => {
                    return Err(Refusal::with(
                        Status::invalid_argument,
                        "an egress frame with nothing in it".into(),
                    ))
                }
                // The sandbox is done with the connection (or went away).
                Ok(None) | Err(_) => return Ok(()),
            };
            match frame {
                Frame::Data(bytes) => {
                    if bytes.len() > MAX_FRAME {
                        return Err(Refusal::with(
                            Status::invalid_argument,
                            format!("an egress frame carries at most {MAX_FRAME} bytes"),
                        ));
                    }
                    progress.touch();
                    self.charge(&self.usage.sent, bytes.len(), "sent")?;
                    progress.counted[0].fetch_add(bytes.len() as u64, Ordering::SeqCst);
                    let data: bytes::Bytes = match first.take() {
                        None => bytes,
                        Some(mut held) => {
                            held.extend_from_slice(&bytes);
                            match first_flight(&held) {
                                FirstFlight::NeedMore if held.len() < MAX_HELLO => {
                                    hello_deadline.get_or_insert_with(|| {
                                        tokio::time::Instant::now() + HELLO_DEADLINE
                                    });
                                    first = Some(held);
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
                                    return Err(Refusal::denied(&self.gate.run_id, why.into())
                                        .coded("egress_sni"))
                                }
                                FirstFlight::Hello(hello) => {
                                    self.check_hello(&host, &hello)?;
                                    held.into()
                                }
                                FirstFlight::NotTls => held.into(),
                            }
                        }
                    };
                    hello_deadline = None;
                    if let Err(e) = upstream.write_all(&data).await {
                        return Err(Refusal::with(
                            Status::unavailable,
                            format!("the upstream stopped taking bytes: {}", e.kind()),
                        )
                        .ran());
                    }
                }
                Frame::CloseWrite(_) => {
                    if first.as_ref().is_some_and(|held| !held.is_empty()) {
                        return Err(Refusal::denied(
                            &self.gate.run_id,
                            "the sandbox stopped sending in the middle of a TLS ClientHello".into(),
                        )
                        .coded("egress_sni"));
                    }
                    first = None;
                    let _ = upstream.shutdown().await;
                }
                Frame::Open(_) | Frame::Opened(_) => {
                    return Err(Refusal::with(
                        Status::invalid_argument,
                        "`open` comes once, first".into(),
                    ))
                }
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
    async fn inbound<R: AsyncRead + Unpin + Send + 'static>(
        self: Arc<Self>,
        mut upstream: R,
        tx: mpsc::Sender<Result<pb::EgressFrame, Status>>,
        progress: Progress,
    ) -> Result<(), Refusal> {
        let mut buffer = bytes::BytesMut::new();
        loop {
            buffer.reserve(READ_CHUNK);
            let read = match upstream.read_buf(&mut buffer).await {
                Ok(read) => read,
                Err(e) => {
                    return Err(Refusal::with(
                        Status::unavailable,
                        format!("the upstream connection failed: {}", e.kind()),
                    )
                    .ran())
                }
            };
            let frame = if read == 0 {
                Frame::CloseWrite(true)
            } else {
                progress.touch();
                self.charge(&self.usage.received, read, "received")?;
                progress.counted[1].fetch_add(read as u64, Ordering::SeqCst);
                Frame::Data(buffer.split().freeze())
            };
            if tx
                .send(Ok(pb::EgressFrame { frame: Some(frame) }))
                .await
                .is_err()
            {
                // The sandbox's side of the stream is gone: the outbound half ends too.
                return Ok(());
            }
            if read == 0 {
                return Ok(());
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
