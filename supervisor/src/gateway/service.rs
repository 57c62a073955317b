//! A run's gateway on its socket: the tonic service (the peer must be the run's host id;
//! every request's fields bounded before any handler sees them) and the bounded server, on
//! the connections the run's pid 1 hands over (or, without a sandbox, accepted here).

use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use tollgate_daemon::serve::Listener;
use tollgate_daemon::{RequestLimits, ServeLimits};
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::call_tool_request::Tool;
use tollgate_proto::v1::gateway_server::Gateway;
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status};

use super::handed::HandedConnections;
use super::input::{tool_name, AgentInput, MAX_WRITE};
use super::models::{CompleteStream, MAX_TEXT};
use super::run::RunGateway;
use crate::wire::{event_stream, RunEventStream};

/// The gRPC service of one run.
#[derive(Debug, Clone)]
pub struct GatewayService {
    run: Arc<RunGateway>,
}

impl GatewayService {
    /// The service for `run`.
    pub fn new(run: Arc<RunGateway>) -> Self {
        Self { run }
    }

    /// The one place every request's agent-given fields are bounded, before any handler
    /// checks, uses or audits them: a request over a bound is refused (and audited small).
    fn bounded<T: AgentInput>(&self, tool: &str, request: &T) -> Result<(), Status> {
        request.bound().map_err(|problem| {
            tokio::task::block_in_place(|| self.run.gate.refuse_input(tool, problem))
        })
    }

    /// The request of the run's own sandbox, its fields within their bounds: every call with
    /// a body passes here first.
    fn admitted<T: AgentInput>(&self, tool: &str, request: Request<T>) -> Result<T, Status> {
        self.check_peer(&request)?;
        self.bounded(tool, request.get_ref())?;
        Ok(request.into_inner())
    }

    /// Runs `work` on a blocking thread, where a client that hangs up cannot cancel it.
    async fn on_blocking_thread<R: Send + 'static>(
        tool: &str,
        work: impl FnOnce() -> Result<R, Status> + Send + 'static,
    ) -> Result<Response<R>, Status> {
        tokio::task::spawn_blocking(work)
            .await
            .map_err(|e| crate::status::internal(tool, &e))?
            .map(Response::new)
    }

    fn check_peer<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let uid = request
            .extensions()
            .get::<UdsConnectInfo>()
            .and_then(|info| info.peer_cred)
            .map(|cred| cred.uid());
        if uid == Some(self.run.host_id) {
            Ok(())
        } else {
            Err(Status::permission_denied(format!(
                "receipt {}: the caller is not this run's sandbox",
                self.run.gate.run_id
            )))
        }
    }
}

#[tonic::async_trait]
impl Gateway for GatewayService {
    async fn get_run_receipt(
        &self,
        request: Request<pb::GetRunReceiptRequest>,
    ) -> Result<Response<pb::GetRunReceiptResponse>, Status> {
        self.check_peer(&request)?;
        // The powers in force, not the receipt as started: every narrowing and amendment
        // shows at once.
        let receipt = self.run.receipt_in_force();
        let models = self.run.models.models.as_ref();
        Ok(Response::new(pb::GetRunReceiptResponse {
            tool_calls_left: self.run.gate.calls_left(),
            tokens_left: models.map_or(0, |models| {
                models
                    .ledger
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remaining()
            }),
            routes_served: models.map_or_else(Vec::new, |models| {
                receipt
                    .routes
                    .iter()
                    .filter(|grant| models.shared.routes.get(&grant.name).is_some())
                    .map(|grant| grant.name.clone())
                    .collect()
            }),
            receipt: Some(receipt),
        }))
    }

    type CompleteStream = CompleteStream;

    async fn complete(
        &self,
        request: Request<pb::CompleteRequest>,
    ) -> Result<Response<Self::CompleteStream>, Status> {
        let request = self.admitted("model.complete", request)?;
        self.run.models.complete(request).await.map(Response::new)
    }

    async fn count_tokens(
        &self,
        request: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CountTokensResponse>, Status> {
        let request = self.admitted("model.count_tokens", request)?;
        self.run
            .models
            .count_tokens(request)
            .await
            .map(Response::new)
    }

    async fn list_models(
        &self,
        request: Request<pb::ListModelsRequest>,
    ) -> Result<Response<pb::ListModelsResponse>, Status> {
        self.check_peer(&request)?;
        Ok(Response::new(self.run.models.list_models()))
    }

    async fn record_refused_call(
        &self,
        request: Request<pb::RecordRefusedCallRequest>,
    ) -> Result<Response<pb::RecordRefusedCallResponse>, Status> {
        self.check_peer(&request)?;
        // Over a bound: the sandbox's own report is refused, and recorded as such.
        let request = self.admitted("model.endpoint", request)?;
        let run = self.run.clone();
        let call_id = tokio::task::block_in_place(|| run.models.record_refused(&request));
        Ok(Response::new(pb::RecordRefusedCallResponse { call_id }))
    }

    async fn call_tool(
        &self,
        request: Request<pb::CallToolRequest>,
    ) -> Result<Response<pb::CallToolResponse>, Status> {
        let name = tool_name(request.get_ref().tool.as_ref());
        let tool = self.admitted(name, request)?.tool;
        if let Some(Tool::Exec(request)) = tool {
            return self.run.exec.call(request).await.map(Response::new);
        }
        if let Some(asked) = self.run.fs.approval_needed(&tool) {
            // Waits (without a thread) for an operator; cancelling this call gives it up.
            let call_id = super::gate::new_call_id();
            let approval = self.run.approvals.approve(asked, &call_id).await?;
            return tokio::task::block_in_place(|| self.run.fs.call_as(tool, call_id, approval))
                .map(Response::new);
        }
        // File system work blocks: let the runtime move its other work off this thread.
        tokio::task::block_in_place(|| self.run.fs.call(tool)).map(Response::new)
    }

    async fn delegate(
        &self,
        request: Request<pb::DelegateRequest>,
    ) -> Result<Response<pb::DelegateResponse>, Status> {
        let request = self.admitted("delegate", request)?;
        // Its own task: a client that hangs up does not cut the call short.
        let run = self.run.children.clone();
        tokio::spawn(async move { run.delegate(request).await })
            .await
            .map_err(|e| crate::status::internal("delegate", &e))?
            .map(Response::new)
    }

    async fn start_child(
        &self,
        request: Request<pb::StartChildRequest>,
    ) -> Result<Response<pb::StartChildResponse>, Status> {
        let request = self.admitted("child.start", request)?;
        let run = self.run.children.clone();
        Self::on_blocking_thread("child.start", move || run.start_child(request)).await
    }

    async fn list_children(
        &self,
        request: Request<pb::ListChildrenRequest>,
    ) -> Result<Response<pb::RunTree>, Status> {
        self.check_peer(&request)?;
        self.run.children.list_children().await.map(Response::new)
    }

    async fn list_pending_calls(
        &self,
        request: Request<pb::ListPendingCallsRequest>,
    ) -> Result<Response<pb::ListPendingCallsResponse>, Status> {
        self.check_peer(&request)?;
        Ok(Response::new(pb::ListPendingCallsResponse {
            calls: self.run.approvals.waiting(),
        }))
    }

    type EgressStream = super::egress::EgressStream;

    async fn egress(
        &self,
        request: Request<tonic::Streaming<pb::EgressFrame>>,
    ) -> Result<Response<Self::EgressStream>, Status> {
        self.check_peer(&request)?;
        self.run
            .egress
            .open(request.into_inner())
            .await
            .map(Response::new)
    }

    type WatchChildStream = RunEventStream;

    async fn watch_child(
        &self,
        request: Request<pb::WatchChildRequest>,
    ) -> Result<Response<Self::WatchChildStream>, Status> {
        let request = self.admitted("child.watch", request)?;
        let (history, live) = self.run.children.watch_child(request.run_id).await?;
        Ok(Response::new(event_stream(history, live)))
    }

    async fn stop_child(
        &self,
        request: Request<pb::StopChildRequest>,
    ) -> Result<Response<pb::StopChildResponse>, Status> {
        let request = self.admitted("child.stop", request)?;
        let run = self.run.children.clone();
        Self::on_blocking_thread("child.stop", move || run.stop_child(request)).await
    }
}

/// A run's gateway socket and its server: stops serving when dropped or stopped. A run's
/// handle is made when the socket is bound, before its sandbox has the plan, and serves once
/// the run's watch can ask pid 1 for connections ([`GatewayHandle::serve_handed`]).
#[derive(Debug)]
pub struct GatewayHandle {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// Set by [`GatewayHandle::stop`]: a gateway stopped before it served never serves.
    stopped: bool,
    /// The socket's host path.
    pub socket: PathBuf,
}

impl GatewayHandle {
    /// The handle of the socket at `socket`, not serving yet.
    pub fn bound(socket: PathBuf) -> Self {
        Self {
            stop: None,
            stopped: false,
            socket,
        }
    }

    /// Serves `run` on the connections its sandbox's pid 1 hands over (see [`super::handed`]),
    /// on `runtime`; nothing when the gateway is already serving or was stopped.
    pub fn serve_handed(
        &mut self,
        runtime: &tokio::runtime::Handle,
        run: Arc<RunGateway>,
        connections: HandedConnections,
    ) -> Result<(), GatewayError> {
        if self.stopped || self.stop.is_some() {
            return Ok(());
        }
        let stop =
            spawn_server(runtime, run, move || Ok(connections)).map_err(|source| GatewayError {
                path: self.socket.clone(),
                source,
            })?;
        self.stop = Some(stop);
        Ok(())
    }

    /// Stops accepting and ends open connections.
    pub fn stop(&mut self) {
        self.stopped = true;
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for GatewayHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Why a gateway socket could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("gateway socket {path}: {source}")]
pub struct GatewayError {
    /// The socket's path.
    pub path: PathBuf,
    /// The failure.
    pub source: std::io::Error,
}

/// Request bytes one run's gateway holds at once beyond each call's first 64 KiB: one full
/// `fs.write` fits, a second concurrent one waits for the agent to retry.
pub const GATEWAY_IN_FLIGHT: usize = 24 << 20;

/// How long a gateway request's body may take to arrive: a local socket carries 16 MiB in
/// milliseconds, so only a stalled (hostile) client comes near it.
pub const GATEWAY_BODY_DEADLINE: Duration = Duration::from_secs(30);

/// The per-method request caps of a run's gateway: tool calls carry up to one full write,
/// model calls their text, everything else (receipt, delegation, children) is small.
fn gateway_request_limits() -> RequestLimits {
    RequestLimits::builder(256 << 10, GATEWAY_IN_FLIGHT, GATEWAY_BODY_DEADLINE)
        .cap("/tollgate.v1.Gateway/CallTool", MAX_WRITE + (64 << 10))
        .cap("/tollgate.v1.Gateway/Complete", 2 * MAX_TEXT + (64 << 10))
        .cap(
            "/tollgate.v1.Gateway/CountTokens",
            2 * MAX_TEXT + (64 << 10),
        )
        // A connection's control, open as long as the connection: `open` is small, and
        // anything after it ends the connection.
        .stream("/tollgate.v1.Gateway/Egress")
        .build()
}

/// Binds `<dir>/gateway.sock` for the run whose sandboxes run as `host_id` (owned by that
/// id, 0600): the socket's host path and its listening socket, which accepts (into its
/// backlog) as soon as this returns. A run's sandbox is handed the listener with its plan.
pub fn bind(
    dir: &Path,
    host_id: u32,
) -> Result<(PathBuf, std::os::unix::net::UnixListener), GatewayError> {
    let socket = dir.join("gateway.sock");
    let error = |source: std::io::Error| GatewayError {
        path: socket.clone(),
        source,
    };
    // Bound through /proc/self/fd: a long data directory must not hit sun_path's 108 bytes.
    let dir_fd = nix::fcntl::open(
        dir,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| error(e.into()))?;
    let short = format!("/proc/self/fd/{}/gateway.sock", dir_fd.as_raw_fd());
    let listener = std::os::unix::net::UnixListener::bind(&short).map_err(error)?;
    nix::unistd::fchownat(
        &dir_fd,
        "gateway.sock",
        Some(nix::unistd::Uid::from_raw(host_id)),
        Some(nix::unistd::Gid::from_raw(host_id)),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(|e| error(e.into()))?;
    nix::sys::stat::fchmodat(
        &dir_fd,
        "gateway.sock",
        Mode::from_bits_truncate(0o600),
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )
    .map_err(|e| error(e.into()))?;
    Ok((socket, listener))
}

/// Binds `<dir>/gateway.sock` for `run` and serves it on `runtime`, accepting in this
/// process: a gateway without a sandbox (tests, benchmarks). A run's gateway is served on the
/// connections its pid 1 accepts instead ([`GatewayHandle::serve_handed`]).
pub fn serve(
    runtime: &tokio::runtime::Handle,
    dir: &Path,
    run: Arc<RunGateway>,
) -> Result<GatewayHandle, GatewayError> {
    let (socket, listener) = bind(dir, run.host_id)?;
    let error = |source: std::io::Error| GatewayError {
        path: socket.clone(),
        source,
    };
    listener.set_nonblocking(true).map_err(error)?;
    let stop = spawn_server(runtime, run, move || {
        tokio::net::UnixListener::from_std(listener)
    })
    .map_err(error)?;
    Ok(GatewayHandle {
        stop: Some(stop),
        stopped: false,
        socket,
    })
}

/// Spawns the server of `run` on `runtime`, on the connections of the listener `listen`
/// makes there; the sender stops it.
fn spawn_server<L, F>(
    runtime: &tokio::runtime::Handle,
    run: Arc<RunGateway>,
    listen: F,
) -> std::io::Result<tokio::sync::oneshot::Sender<()>>
where
    L: Listener<Io = tokio::net::UnixStream>,
    F: FnOnce() -> std::io::Result<L> + Send + 'static,
{
    // Calls run their file system work with `block_in_place`, which needs worker threads.
    if runtime.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
        return Err(std::io::Error::other(
            "the gateway needs a multi-threaded tokio runtime",
        ));
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let egress = run.egress.clone();
    let host_id = run.host_id;
    // Each outbound connection begins with a hand-off connection: a receipt that grants
    // egress gets room for as many as it may open, one that does not gets none.
    let hand_offs = if run.gate.receipt.egress.is_empty() {
        0
    } else {
        egress.max_open() as usize
    };
    let prewalk = super::prewalk::Prewalk::new(run.clone());
    let service = GatewayService::new(run);
    let run_id = service.run.gate.run_id.clone();
    let limits = gateway_request_limits();
    runtime.spawn(async move {
        let listener = match listen() {
            Ok(listener) => listener,
            Err(e) => {
                tracing::error!(run_id = %run_id, error = %e, "gateway socket unusable");
                return;
            }
        };
        // What the run's agent can make the supervisor hold is bounded here: connections,
        // streams, request bytes and time (see `tollgate_daemon`).
        let bounds = ServeLimits::GATEWAY;
        let connections = tollgate_daemon::ConnectionLimits {
            max: bounds.connections.max + hand_offs,
            ..bounds.connections
        };
        // `limits` is outermost: the walk collects a body only as far as its caps allow.
        let served = bounds
            .server()
            .layer(limits)
            .layer(prewalk)
            .add_service(
                pb::gateway_server::GatewayServer::new(service)
                    // The largest request any method takes (each method's own cap is
                    // the layer's above): a full fs.write, or a model call's text and
                    // images, and its framing.
                    .max_decoding_message_size(MAX_WRITE.max(2 * MAX_TEXT) + (64 << 10)),
            )
            .serve_with_incoming_shutdown(
                super::tunnel::sort(
                    tollgate_daemon::incoming(listener, connections),
                    egress,
                    host_id,
                ),
                async {
                    let _ = stopped.await;
                },
            )
            .await;
        if let Err(e) = served {
            tracing::warn!(run_id = %run_id, error = %e, "gateway server ended with an error");
        }
    });
    Ok(stop)
}
