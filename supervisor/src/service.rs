//! The `tollgate.v1.Supervisor` gRPC service over the run manager.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::supervisor_server::Supervisor;
use tollgate_receipt::{from_text, timestamp_from_unix, VerifyFailure};
use tonic::{Request, Response, Status};

use crate::records::{RunRecord, RunState};
use crate::runs::{RunManager, StartError};
use crate::sandbox::SandboxError;

/// Checks the `authorization: Bearer` header against the admin token's hash.
#[derive(Debug, Clone)]
pub struct TokenCheck {
    hash: [u8; 32],
}

impl TokenCheck {
    /// Accepts the token whose SHA-256 is `hash`.
    pub fn new(hash: [u8; 32]) -> Self {
        Self { hash }
    }

    /// Ok when the request carries the token.
    #[allow(clippy::result_large_err)]
    pub fn check<T>(&self, request: &Request<T>) -> Result<(), Status> {
        use sha2::Digest as _;
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                Status::unauthenticated(
                    "missing \"authorization: Bearer <token>\"; the supervisor's token is <data-dir>/admin.token",
                )
            })?;
        let token = header
            .split_once(' ')
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .ok_or_else(|| Status::unauthenticated("authorization must be \"Bearer <token>\""))?;
        let hash: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        // Compare every byte so timing does not reveal how much of a guess was right.
        let differs = hash
            .iter()
            .zip(self.hash.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if differs == 0 {
            Ok(())
        } else {
            Err(Status::unauthenticated("unknown token"))
        }
    }
}

/// Maps a run-start failure to its gRPC status (the one place this mapping lives).
pub fn start_status(error: &StartError) -> Status {
    let message = error.to_string();
    match error {
        StartError::Receipt(e) if e.failure() == VerifyFailure::Malformed => {
            Status::invalid_argument(message)
        }
        StartError::Receipt(e) => Status::permission_denied(format!(
            "receipt refused ({}): {message}",
            e.failure().code()
        )),
        StartError::AlreadyUsed(_) => Status::already_exists(message),
        StartError::ArgvNotAllowed(_) => Status::invalid_argument(format!("argv: {message}")),
        StartError::Sandbox(SandboxError::NoAgent | SandboxError::NotExecutable(_)) => {
            Status::invalid_argument(format!("argv: {message}"))
        }
        StartError::Sandbox(SandboxError::BadGrant { .. }) => {
            Status::invalid_argument(format!("receipt: {message}"))
        }
        StartError::NoHostId(_) => Status::resource_exhausted(message),
        StartError::ShuttingDown => Status::unavailable(message),
        StartError::ChildrenLimits(_) => {
            Status::resource_exhausted(format!("receipt refused (children_limits): {message}"))
        }
        StartError::Grant { code, .. } => {
            Status::failed_precondition(format!("receipt refused ({code}): {message}"))
        }
        StartError::Delegated { code, .. } => {
            Status::permission_denied(format!("receipt refused ({code}): {message}"))
        }
        StartError::Sandbox(_)
        | StartError::Cgroup(_)
        | StartError::Records(_)
        | StartError::Audit(_) => Status::internal(message),
    }
}

fn state_proto(state: RunState) -> pb::RunState {
    match state {
        RunState::Starting => pb::RunState::Starting,
        RunState::Running => pb::RunState::Running,
        RunState::Exited => pb::RunState::Exited,
        RunState::Failed => pb::RunState::Failed,
        RunState::Stopped => pb::RunState::Stopped,
        RunState::Expired => pb::RunState::Expired,
        RunState::Revoked => pb::RunState::Revoked,
        RunState::LimitExceeded => pb::RunState::LimitExceeded,
        RunState::ShimDied => pb::RunState::ShimDied,
        RunState::SupervisorShutdown => pb::RunState::SupervisorShutdown,
        RunState::Lost => pb::RunState::Lost,
        RunState::ParentEnded => pb::RunState::ParentEnded,
    }
}

/// The protocol form of a run record.
pub fn run_proto(record: &RunRecord) -> pb::Run {
    pb::Run {
        run_id: record.run_id.clone(),
        owner: record.owner.clone(),
        subject: record.subject.clone(),
        state: state_proto(record.state) as i32,
        created_at: Some(timestamp_from_unix(record.created_at)),
        ended_at: record.ended_at.map(timestamp_from_unix),
        expires_at: Some(timestamp_from_unix(record.expires_at)),
        report: record.report.as_ref().map(|r| pb::TeardownReport {
            reason: r.reason.clone(),
            duration_ms: r.duration_ms,
            exit_code: r.exit_code,
            signal: r.signal,
            peak_memory_bytes: r.peak_memory_bytes,
            last_tool_call_id: r.last_tool_call_id.clone().unwrap_or_default(),
            routes_used: r.routes_used.clone(),
            output_truncated: r.output_truncated,
            cleanup_errors: r.cleanup_errors.clone(),
            landlock_abi: r.landlock_abi.unwrap_or(0),
        }),
        parent_run_id: record.parent_run_id.clone().unwrap_or_default(),
        depth: record.depth,
    }
}

/// The gRPC service.
#[derive(Debug)]
pub struct SupervisorService {
    manager: Arc<RunManager>,
    last_revocation_seq: Arc<std::sync::atomic::AtomicU64>,
    tokens: TokenCheck,
    info: pb::SupervisorInfo,
}

impl SupervisorService {
    /// A service over `manager`; `last_revocation_seq` is kept current by the revocation
    /// follower.
    pub fn new(
        manager: Arc<RunManager>,
        tokens: TokenCheck,
        info: pb::SupervisorInfo,
        last_revocation_seq: Arc<std::sync::atomic::AtomicU64>,
    ) -> Self {
        Self {
            manager,
            last_revocation_seq,
            tokens,
            info,
        }
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Status::internal(format!("worker failed: {e}")))
}

/// A stream of run events (WatchRun, WatchChild).
pub(crate) type RunEventStream = Pin<Box<dyn Stream<Item = Result<pb::RunEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Supervisor for SupervisorService {
    async fn get_supervisor_info(
        &self,
        _request: Request<pb::GetSupervisorInfoRequest>,
    ) -> Result<Response<pb::SupervisorInfo>, Status> {
        let mut info = self.info.clone();
        info.last_revocation_seq = self
            .last_revocation_seq
            .load(std::sync::atomic::Ordering::Relaxed);
        Ok(Response::new(info))
    }

    async fn start_run(
        &self,
        request: Request<pb::StartRunRequest>,
    ) -> Result<Response<pb::StartRunResponse>, Status> {
        self.tokens.check(&request)?;
        let request = request.into_inner();
        let signed = match from_text(&request.receipt) {
            Ok(signed) => signed,
            Err(e) => {
                let status = Status::invalid_argument(format!("receipt: {e}"));
                // Refused before it could even be read: audited like every other refusal.
                let manager = self.manager.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    manager.audit_refusal(&Default::default(), &StartError::Receipt(e));
                })
                .await;
                return Err(status);
            }
        };
        let argv = (!request.argv.is_empty()).then_some(request.argv);
        let manager = self.manager.clone();
        let run_id = blocking(move || manager.start_published(&signed, argv, None))
            .await?
            .map_err(|e| start_status(&e))?;
        Ok(Response::new(pb::StartRunResponse { run_id }))
    }

    async fn get_run(
        &self,
        request: Request<pb::GetRunRequest>,
    ) -> Result<Response<pb::Run>, Status> {
        self.tokens.check(&request)?;
        let run_id = request.into_inner().run_id;
        let manager = self.manager.clone();
        let id = run_id.clone();
        let record = blocking(move || manager.get(&id))
            .await?
            .map_err(|e| Status::internal(e.to_string()))?
            .ok_or_else(|| Status::not_found(format!("no run {run_id}")))?;
        Ok(Response::new(run_proto(&record)))
    }

    async fn list_runs(
        &self,
        request: Request<pb::ListRunsRequest>,
    ) -> Result<Response<pb::ListRunsResponse>, Status> {
        self.tokens.check(&request)?;
        let manager = self.manager.clone();
        let runs = blocking(move || manager.list())
            .await?
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(pb::ListRunsResponse {
            runs: runs.iter().map(run_proto).collect(),
        }))
    }

    async fn stop_run(
        &self,
        request: Request<pb::StopRunRequest>,
    ) -> Result<Response<pb::StopRunResponse>, Status> {
        self.tokens.check(&request)?;
        let request = request.into_inner();
        let manager = self.manager.clone();
        let reason = if request.reason.is_empty() {
            "stopped by an operator".to_owned()
        } else {
            request.reason
        };
        let run_id = request.run_id;
        let id = run_id.clone();
        let record = blocking(move || {
            manager.stop(&id, &reason);
            manager.wait(&id, Duration::from_secs(30))
        })
        .await?
        .ok_or_else(|| Status::not_found(format!("no run {run_id}")))?;
        Ok(Response::new(pb::StopRunResponse {
            run: Some(run_proto(&record)),
        }))
    }

    async fn get_run_tree(
        &self,
        request: Request<pb::GetRunTreeRequest>,
    ) -> Result<Response<pb::RunTree>, Status> {
        self.tokens.check(&request)?;
        let run_id = request.into_inner().run_id;
        let manager = self.manager.clone();
        let id = run_id.clone();
        let tree = blocking(move || manager.tree(&id))
            .await?
            .map_err(|e| Status::internal(e.to_string()))?;
        if tree.runs.is_empty() {
            return Err(Status::not_found(format!("no run {run_id}")));
        }
        Ok(Response::new(tree))
    }

    type WatchRunStream = RunEventStream;

    async fn watch_run(
        &self,
        request: Request<pb::WatchRunRequest>,
    ) -> Result<Response<Self::WatchRunStream>, Status> {
        self.tokens.check(&request)?;
        let run_id = request.into_inner().run_id;
        let (history, live) = match self.manager.hub().subscribe(&run_id) {
            Some(subscription) => subscription,
            None => {
                // Started before this supervisor did (or unknown): only the record remains.
                let manager = self.manager.clone();
                let id = run_id.clone();
                let record = blocking(move || manager.get(&id))
                    .await?
                    .map_err(|e| Status::internal(e.to_string()))?
                    .ok_or_else(|| Status::not_found(format!("no run {run_id}")))?;
                let ended = pb::RunEvent {
                    event: Some(pb::run_event::Event::Ended(run_proto(&record))),
                };
                (vec![ended], None)
            }
        };
        Ok(Response::new(event_stream(history, live)))
    }
}

/// Streams a run's history, then its live events until its end.
pub(crate) fn event_stream(
    history: Vec<pb::RunEvent>,
    live: Option<tokio::sync::broadcast::Receiver<pb::RunEvent>>,
) -> RunEventStream {
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    tokio::spawn(async move {
        for event in history {
            if tx.send(Ok(event)).await.is_err() {
                return;
            }
        }
        let Some(mut live) = live else { return };
        loop {
            match live.recv().await {
                Ok(event) => {
                    let last = matches!(event.event, Some(pb::run_event::Event::Ended(_)));
                    if tx.send(Ok(event)).await.is_err() || last {
                        return;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(skipped)) => {
                    let _ = tx
                        .send(Err(Status::data_loss(format!(
                            "watcher fell behind and missed {skipped} events"
                        ))))
                        .await;
                    return;
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    });
    Box::pin(ReceiverStream::new(rx))
}
