//! The `tollgate.v1.Supervisor` gRPC service over the run manager.

use std::sync::Arc;
use std::time::Duration;

use tollgate_proto::v1 as pb;
use tollgate_proto::v1::supervisor_server::Supervisor;
use tollgate_receipt::from_text;
use tonic::{Request, Response, Status};

use tollgate_shim_protocol::plan::AgentInput;

use crate::error::StartError;
use crate::runs::RunManager;
use crate::status::start_status;
use crate::wire::{event_stream, run_proto, RunEventStream};

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
        self.check_metadata(request.metadata())
    }

    /// Ok when `metadata` carries the token (checked on the headers, before any body).
    #[allow(clippy::result_large_err)]
    pub fn check_metadata(&self, metadata: &tonic::metadata::MetadataMap) -> Result<(), Status> {
        use tollgate_daemon::token::{bearer, matches};
        let token = bearer(metadata).map_err(crate::status::no_token)?;
        if matches(token, &self.hash) {
            Ok(())
        } else {
            Err(crate::status::wrong_token())
        }
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

/// A terminal size from the wire: both 1 to 65535.
#[allow(clippy::result_large_err)]
fn terminal_size(size: &pb::TerminalSize) -> Result<(u16, u16), Status> {
    match (u16::try_from(size.rows), u16::try_from(size.cols)) {
        (Ok(rows @ 1..), Ok(cols @ 1..)) => Ok((rows, cols)),
        _ => Err(Status::invalid_argument(
            "terminal: rows and cols must be 1 to 65535",
        )),
    }
}

/// One Attach message applied to the run: its input, its resize, its end of input.
fn apply_input(
    manager: &RunManager,
    run_id: &str,
    message: pb::AttachRequest,
) -> Result<(), crate::error::InputError> {
    if let Some((rows, cols)) = message.resize.as_ref().and_then(|s| terminal_size(s).ok()) {
        manager.resize_terminal(run_id, rows, cols)?;
    }
    if !message.input.is_empty() {
        manager.write_input(run_id, &message.input)?;
    }
    if message.close_input {
        manager.close_input(run_id)?;
    }
    Ok(())
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| crate::status::internal("a worker", &e))
}

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
        let input = match (request.terminal, request.stdin) {
            (Some(size), _) => {
                let (rows, cols) = terminal_size(&size)?;
                AgentInput::Terminal { rows, cols }
            }
            (None, true) => AgentInput::Pipe,
            (None, false) => AgentInput::Null,
        };
        let manager = self.manager.clone();
        let run_id = blocking(move || manager.start_published(&signed, argv, input, None))
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
            .map_err(|e| crate::status::internal("the run store", &e))?
            .ok_or_else(|| crate::status::no_run(&run_id))?;
        Ok(Response::new(self.manager.run_view(&record)))
    }

    async fn list_runs(
        &self,
        request: Request<pb::ListRunsRequest>,
    ) -> Result<Response<pb::ListRunsResponse>, Status> {
        self.tokens.check(&request)?;
        let manager = self.manager.clone();
        let runs = blocking(move || manager.list())
            .await?
            .map_err(|e| crate::status::internal("the run store", &e))?;
        Ok(Response::new(pb::ListRunsResponse {
            runs: runs.iter().map(|run| self.manager.run_view(run)).collect(),
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
        .ok_or_else(|| crate::status::no_run(&run_id))?;
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
            .map_err(|e| crate::status::internal("the run store", &e))?;
        if tree.runs.is_empty() {
            return Err(crate::status::no_run(&run_id));
        }
        Ok(Response::new(tree))
    }

    type CopyOutStream = crate::copy_out::CopyStream;

    async fn copy_out(
        &self,
        request: Request<pb::CopyOutRequest>,
    ) -> Result<Response<Self::CopyOutStream>, Status> {
        self.tokens.check(&request)?;
        let request = request.into_inner();
        let manager = self.manager.clone();
        blocking(move || crate::copy_out::copy_out(manager, request.run_id, request.path))
            .await?
            .map(Response::new)
    }

    async fn copy_in(
        &self,
        request: Request<tonic::Streaming<pb::CopyInRequest>>,
    ) -> Result<Response<pb::CopyInResponse>, Status> {
        self.tokens.check(&request)?;
        crate::copy_in::copy_in(self.manager.clone(), request.into_inner())
            .await
            .map(Response::new)
    }

    async fn remove_workspace(
        &self,
        request: Request<pb::RemoveWorkspaceRequest>,
    ) -> Result<Response<pb::RemoveWorkspaceResponse>, Status> {
        self.tokens.check(&request)?;
        let run_id = request.into_inner().run_id;
        let manager = self.manager.clone();
        blocking(move || {
            let removed = manager.remove_workspace(&run_id);
            let outcome = removed.as_ref().map(|_| 0).map_err(ToString::to_string);
            manager.audit_workspace(&run_id, "remove", "/work", outcome);
            removed
        })
        .await?
        .map(|path| {
            Response::new(pb::RemoveWorkspaceResponse {
                path: path.display().to_string(),
            })
        })
        .map_err(|e| crate::status::workspace_status(&e))
    }

    type AttachStream = RunEventStream;

    async fn attach(
        &self,
        request: Request<tonic::Streaming<pb::AttachRequest>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        self.tokens.check(&request)?;
        let mut requests = request.into_inner();
        let first = requests
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the first message must name the run"))?;
        let run_id = first.run_id.clone();
        self.manager
            .takes_input(&run_id)
            .map_err(|e| crate::status::input_status(&e))?;
        let (history, live) = self
            .manager
            .hub()
            .subscribe(&run_id)
            .ok_or_else(|| crate::status::no_run(&run_id))?;
        // Input goes in on its own task, in order; the output streams back meanwhile. A
        // failed write (the agent ended, or closed its input) ends the input side only.
        let manager = self.manager.clone();
        tokio::spawn(async move {
            let mut next = Some(first);
            while let Some(message) = next.take() {
                let (manager, id) = (manager.clone(), run_id.clone());
                let applied =
                    tokio::task::spawn_blocking(move || apply_input(&manager, &id, message)).await;
                if !matches!(applied, Ok(Ok(()))) {
                    return;
                }
                next = match requests.message().await {
                    Ok(Some(message)) => Some(message),
                    _ => None,
                };
            }
        });
        Ok(Response::new(event_stream(history, live)))
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
                    .map_err(|e| crate::status::internal("the run store", &e))?
                    .ok_or_else(|| crate::status::no_run(&run_id))?;
                let ended = pb::RunEvent {
                    event: Some(pb::run_event::Event::Ended(run_proto(&record))),
                };
                (vec![ended], None)
            }
        };
        Ok(Response::new(event_stream(history, live)))
    }
}
