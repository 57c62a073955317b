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
//!
//! The module holds the connection's state and its opening (`open`); its parts:
//! `connect` (every check of a new connection, then the connection itself), `budget` (the
//! run's bytes each way), `relay` (the hand-off awaited, the relay run until an end, how it
//! ended recorded) and `sides` (each direction's bytes: the first flight checked, copied or
//! spliced, counted).

mod budget;
mod connect;
mod relay;
mod sides;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tollgate_audit::{Decision, EntryDraft, EntryKind};
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::egress_frame::Frame;
use tollgate_proto::EGRESS_TUNNEL_TOKEN_LEN;
use tonic::{Status, Streaming};

use super::gate::{new_call_id, CallGate};
use super::inspection::Classify;
use crate::egress::ca::RunCa;
use crate::egress::config::EgressConfig;
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

/// The agent's text as an entry or message shows it: at most 255 characters, no controls.
fn clip(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).take(255).collect()
}
