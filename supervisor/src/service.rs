//! The `tollgate.v1.Supervisor` gRPC service over the run manager.

use std::sync::Arc;
use std::time::Duration;

use tollgate_proto::v1 as pb;
use tollgate_proto::v1::supervisor_server::Supervisor;
use tollgate_receipt::from_text;
use tonic::{Request, Response, Status};

use tollgate_shim_protocol::plan::AgentInput;

use crate::callers::Caller;
use crate::error::StartError;
use crate::runs::access::OperatorCall;
use crate::runs::RunManager;
use crate::status::start_status;
use crate::wire::{event_stream, run_proto, RunEventStream};

/// The gRPC service.
#[derive(Debug)]
pub struct SupervisorService {
    manager: Arc<RunManager>,
    last_revocation_seq: Arc<std::sync::atomic::AtomicU64>,
    info: pb::SupervisorInfo,
}

impl SupervisorService {
    /// A service over `manager`; `last_revocation_seq` is kept current by the revocation
    /// follower. Every call but `GetSupervisorInfo` needs its [`Caller`] in the request's
    /// extensions (the daemon's request layer resolves it from the headers).
    pub fn new(
        manager: Arc<RunManager>,
        info: pb::SupervisorInfo,
        last_revocation_seq: Arc<std::sync::atomic::AtomicU64>,
    ) -> Self {
        Self {
            manager,
            last_revocation_seq,
            info,
        }
    }

    /// Whether `caller` may make `method` about `run_id`: Ok for its own run (an admin's:
    /// any), PERMISSION_DENIED for another operator's, NOT_FOUND for none. An operator's call
    /// is audited either way; the admin token's is not (root on this host, audited by what it
    /// does).
    async fn authorize(
        &self,
        caller: &Caller,
        method: &'static str,
        run_id: &str,
    ) -> Result<(), Status> {
        let Some(operator) = caller.operator().cloned() else {
            return Ok(());
        };
        let manager = self.manager.clone();
        let run_id = run_id.to_owned();
        blocking(move || {
            let owner = manager
                .get(&run_id)
                .map_err(|e| crate::status::internal("the run store", &e))?
                .map(|record| record.owner);
            let refused = match &owner {
                None => Some(crate::status::no_run(&run_id)),
                Some(owner) if !operator.admin && *owner != operator.name => {
                    Some(not_yours(&operator.name, &run_id))
                }
                Some(_) => None,
            };
            manager.audit_operator_call(
                OperatorCall {
                    operator: &operator.name,
                    admin: operator.admin,
                    method,
                    run_id: Some(&run_id),
                },
                refused.as_ref().map(Status::message),
            );
            refused.map_or(Ok(()), Err)
        })
        .await?
    }

    /// Audits an operator's call that is about no one run (`ListRuns`).
    async fn audit_call(&self, caller: &Caller, method: &'static str) -> Result<(), Status> {
        let Some(operator) = caller.operator().cloned() else {
            return Ok(());
        };
        let manager = self.manager.clone();
        blocking(move || {
            manager.audit_operator_call(
                OperatorCall {
                    operator: &operator.name,
                    admin: operator.admin,
                    method,
                    run_id: None,
                },
                None,
            );
        })
        .await
    }
}

/// Another operator's run: refused without saying whose it is.
fn not_yours(operator: &str, run_id: &str) -> Status {
    Status::permission_denied(format!(
        "run {run_id} is not operator {operator:?}'s: an operator may touch only the runs whose receipt it owns (an admin, every run)"
    ))
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
        let caller = Caller::of(&request)?;
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
        if let Some(operator) = caller.operator().cloned() {
            // The run will be the receipt's owner's: only it (or an admin) may start it. The
            // owner is read before the signature is checked; a forged one fails that check.
            let claimed = <pb::Receipt as prost::Message>::decode(signed.receipt.as_slice())
                .map(|receipt| (receipt.owner, receipt.receipt_id))
                .unwrap_or_default();
            let refused = (!operator.admin && claimed.0 != operator.name).then(|| {
                Status::permission_denied(format!(
                    "this receipt is operator {:?}'s, not {:?}'s: an operator starts only its own receipts (an admin, any)",
                    claimed.0, operator.name
                ))
            });
            let manager = self.manager.clone();
            let audited = refused.as_ref().map(|s| s.message().to_owned());
            blocking(move || {
                manager.audit_operator_call(
                    OperatorCall {
                        operator: &operator.name,
                        admin: operator.admin,
                        method: "StartRun",
                        run_id: Some(&claimed.1),
                    },
                    audited.as_deref(),
                );
            })
            .await?;
            if let Some(refused) = refused {
                return Err(refused);
            }
        }
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
        let caller = Caller::of(&request)?;
        let run_id = request.into_inner().run_id;
        self.authorize(&caller, "GetRun", &run_id).await?;
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
        let caller = Caller::of(&request)?;
        self.audit_call(&caller, "ListRuns").await?;
        let live_only = request.get_ref().live_only;
        let manager = self.manager.clone();
        let runs = blocking(move || {
            if live_only {
                manager.list_live()
            } else {
                manager.list()
            }
        })
        .await?
        .map_err(|e| crate::status::internal("the run store", &e))?;
        Ok(Response::new(pb::ListRunsResponse {
            runs: runs
                .iter()
                .filter(|run| caller.may_touch(&run.owner))
                .map(|run| self.manager.run_view(run))
                .collect(),
        }))
    }

    async fn stop_run(
        &self,
        request: Request<pb::StopRunRequest>,
    ) -> Result<Response<pb::StopRunResponse>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        self.authorize(&caller, "StopRun", &request.run_id).await?;
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
        let caller = Caller::of(&request)?;
        let run_id = request.into_inner().run_id;
        self.authorize(&caller, "GetRunTree", &run_id).await?;
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
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        self.authorize(&caller, "CopyOut", &request.run_id).await?;
        let manager = self.manager.clone();
        blocking(move || crate::copy_out::copy_out(manager, request.run_id, request.path))
            .await?
            .map(Response::new)
    }

    async fn copy_in(
        &self,
        request: Request<tonic::Streaming<pb::CopyInRequest>>,
    ) -> Result<Response<pb::CopyInResponse>, Status> {
        let caller = Caller::of(&request)?;
        let mut requests = request.into_inner();
        let first = requests.message().await?.ok_or_else(|| {
            Status::invalid_argument("the first message must name the run and the directory")
        })?;
        self.authorize(&caller, "CopyIn", &first.run_id).await?;
        crate::copy_in::copy_in(self.manager.clone(), first, requests)
            .await
            .map(Response::new)
    }

    async fn remove_workspace(
        &self,
        request: Request<pb::RemoveWorkspaceRequest>,
    ) -> Result<Response<pb::RemoveWorkspaceResponse>, Status> {
        let caller = Caller::of(&request)?;
        let run_id = request.into_inner().run_id;
        self.authorize(&caller, "RemoveWorkspace", &run_id).await?;
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
        let caller = Caller::of(&request)?;
        let mut requests = request.into_inner();
        let first = requests
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the first message must name the run"))?;
        let run_id = first.run_id.clone();
        self.authorize(&caller, "Attach", &run_id).await?;
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

    async fn amend_run(
        &self,
        request: Request<pb::AmendRunRequest>,
    ) -> Result<Response<pb::AmendRunResponse>, Status> {
        use crate::runs::amend::RunChange;
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        self.authorize(&caller, "AmendRun", &request.run_id).await?;
        let change = match request.change {
            Some(pb::amend_run_request::Change::Narrow(narrow)) => RunChange::Narrow(narrow),
            Some(pb::amend_run_request::Change::Amendment(signed)) => RunChange::Widen(signed),
            None => return Err(Status::invalid_argument(
                "change: give narrow (no signature needed) or amendment (signed by the authority)",
            )),
        };
        let by = crate::approval_api::decider(&caller);
        let manager = self.manager.clone();
        let run_id = request.run_id;
        blocking(move || manager.amend(&run_id, change, &by))
            .await?
            .map(Response::new)
            .map_err(|e| crate::status::amend_status(&e))
    }

    type WatchApprovalsStream = crate::approval_api::ApprovalStream;

    async fn watch_approvals(
        &self,
        request: Request<pb::WatchApprovalsRequest>,
    ) -> Result<Response<Self::WatchApprovalsStream>, Status> {
        let caller = Caller::of(&request)?;
        let run_id = request.into_inner().run_id;
        if run_id.is_empty() {
            self.audit_call(&caller, "WatchApprovals").await?;
        } else {
            self.authorize(&caller, "WatchApprovals", &run_id).await?;
        }
        Ok(Response::new(crate::approval_api::watch(
            self.manager.approvals(),
            caller,
            run_id,
        )))
    }

    async fn decide_approval(
        &self,
        request: Request<pb::DecideApprovalRequest>,
    ) -> Result<Response<pb::DecideApprovalResponse>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        self.authorize(&caller, "DecideApproval", &request.run_id)
            .await?;
        let decided = crate::approval_api::decide(self.manager.approvals(), &caller, request)?;
        Ok(Response::new(pb::DecideApprovalResponse {
            decided: Some(decided),
        }))
    }

    type WatchRunStream = RunEventStream;

    async fn watch_run(
        &self,
        request: Request<pb::WatchRunRequest>,
    ) -> Result<Response<Self::WatchRunStream>, Status> {
        let caller = Caller::of(&request)?;
        let run_id = request.into_inner().run_id;
        self.authorize(&caller, "WatchRun", &run_id).await?;
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
