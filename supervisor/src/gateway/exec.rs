//! The `exec` tool: a granted command run inside the run's sandbox (through its shim), with
//! its own time limit and output caps, audited durably before the agent hears the result.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tollgate_audit::MetaValue;
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::call_tool_response::Result as ToolResult;
use tollgate_receipt::paths::is_normal_absolute;
use tollgate_shim_protocol::protocol::AgentExit;
use tonic::Status;

use super::approval::{Asked, RunApprovals};
use super::gate::{new_call_id, CallGate, CallMeta, Refusal, Step};
use super::input::MAX_STDIN;
use crate::exec::{self, ExecError, ExecSandbox, ExecSlot};

/// The `exec` tool of one run.
#[derive(Debug, Clone)]
pub struct ExecTools {
    /// The run's call gate.
    pub gate: Arc<CallGate>,
    /// How `exec` reaches the sandbox; `None`: no exec (e.g. the sandbox is not started by
    /// a shim this gateway knows).
    pub sandbox: Option<Arc<ExecSandbox>>,
    /// Where a command of a gateway-only program that asks waits for an operator.
    pub approvals: RunApprovals,
    /// The gateway-only programs in force: the receipt's, as amendments and narrowings left
    /// them.
    pub gateway_only: Arc<std::sync::RwLock<Vec<pb::GatewayExecGrant>>>,
}

/// Lowercase hex SHA-256 of `bytes`: what a remembered approval of a command matches its
/// stdin by.
fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An `exec` call that passed its checks: where it runs, the slot it holds, and the
/// gateway-only program it may execute (which the agent itself may not).
struct Admitted {
    sandbox: Arc<ExecSandbox>,
    slot: ExecSlot,
    gateway_only: Option<PathBuf>,
}

impl ExecTools {
    /// Checks an `exec` call (waiting for an operator when its program's grant asks) and
    /// takes one of the run's command slots.
    async fn admitted(
        &self,
        request: &pb::ExecRequest,
        call_id: &str,
        meta: &mut CallMeta,
    ) -> Result<Admitted, Refusal> {
        let made = self.gate.admit("exec")?;
        let Some(program) = request.argv.first() else {
            return Err(Refusal::with(
                Status::invalid_argument,
                "exec needs argv (the executable's absolute path first)".into(),
            ));
        };
        let receipt = &self.gate.receipt;
        // A program in `exec` the agent may run itself; a gateway-only one only here (its
        // own grant, and whether it asks, wins over a directory entry above it). A directory
        // entry covers only normalised paths beneath it: no `..` walks out of it.
        let gateway_only = if receipt.exec.iter().any(|granted| granted == program) {
            None
        } else if let Some(grant) = self.programs().into_iter().find(|g| g.program == *program) {
            Some(grant)
        } else if is_normal_absolute(program) && tollgate_proto::exec_allows(&receipt.exec, program)
        {
            None
        } else {
            return Err(Refusal::denied(
                &self.gate.run_id,
                format!("exec of {program} is not granted (missing grant: exec {program})"),
            ));
        };
        self.check_shape(request)?;
        if gateway_only.as_ref().is_some_and(|grant| grant.ask) {
            let mut asked = Asked::new("exec", program.clone());
            asked.argv = request.argv.clone();
            asked.cwd = self.cwd(request).display().to_string();
            asked.bytes = request.stdin.len() as u64;
            asked.stdin_sha256 = sha256_hex(&request.stdin);
            let by = self.approvals.approved_by(asked, call_id).await?;
            meta.push(("approved_by", by.into()));
            // A narrowing may have taken the program away while the call waited.
            if !self.programs().iter().any(|g| g.program == *program) {
                return Err(Refusal::denied(
                    &self.gate.run_id,
                    format!("exec of {program} was taken away while the call waited"),
                ));
            }
        }
        self.gate.charge(made)?;
        let Some(sandbox) = self.sandbox.clone() else {
            return Err(Refusal::with(
                Status::unavailable,
                "exec is not available for this run".into(),
            ));
        };
        let slot = sandbox.slot().ok_or_else(|| {
            Refusal::with(
                Status::resource_exhausted,
                format!(
                    "{} commands are already running for this run; wait for one to end",
                    sandbox.limits.concurrent
                ),
            )
        })?;
        Ok(Admitted {
            sandbox,
            slot,
            gateway_only: gateway_only.map(|grant| PathBuf::from(&grant.program)),
        })
    }

    /// The gateway-only programs in force now.
    pub fn programs(&self) -> Vec<pb::GatewayExecGrant> {
        self.gateway_only
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Where a command runs: the request's directory, or the agent's.
    fn cwd(&self, request: &pb::ExecRequest) -> PathBuf {
        if request.cwd.is_empty() {
            self.sandbox
                .as_ref()
                .map_or_else(|| PathBuf::from("/work"), |s| s.plan.agent.cwd.clone())
        } else {
            PathBuf::from(&request.cwd)
        }
    }

    /// The request's own shape: a normalised cwd, stdin within its cap.
    fn check_shape(&self, request: &pb::ExecRequest) -> Result<(), Refusal> {
        if !request.cwd.is_empty() && !is_normal_absolute(&request.cwd) {
            return Err(Refusal::with(
                Status::invalid_argument,
                format!(
                    "cwd {:?} is not a normalised absolute path in the sandbox",
                    request.cwd
                ),
            ));
        }
        if request.stdin.len() > MAX_STDIN {
            return Err(Refusal::with(
                Status::invalid_argument,
                format!("at most {MAX_STDIN} bytes of stdin per exec"),
            ));
        }
        Ok(())
    }

    /// Runs an `exec` call: checks, the command in the sandbox, the audit entry.
    pub(crate) async fn call(
        &self,
        request: pb::ExecRequest,
    ) -> Result<pb::CallToolResponse, Status> {
        // On its own task: a client that goes away cancels its request, never the command's
        // time limit or its audit entry.
        let run = self.clone();
        tokio::spawn(async move { run.to_the_end(request).await })
            .await
            .unwrap_or_else(|e| Err(crate::status::internal("exec", &e)))
    }

    /// [`ExecTools::call`]'s work.
    async fn to_the_end(&self, request: pb::ExecRequest) -> Result<pb::CallToolResponse, Status> {
        let started = Instant::now();
        let call_id = new_call_id();
        let mut meta: CallMeta = vec![
            (
                "path",
                request.argv.first().cloned().unwrap_or_default().into(),
            ),
            ("argv", request.argv.clone().into()),
            ("stdin_bytes", (request.stdin.len() as i64).into()),
        ];
        let admitted = self.admitted(&request, &call_id, &mut meta).await;
        let outcome = match admitted {
            Err(refusal) => Err(refusal),
            Ok(Admitted {
                sandbox,
                slot,
                gateway_only,
            }) => {
                let cwd = self.cwd(&request);
                let timeout = sandbox.timeout_for(request.timeout_ms);
                meta.push(("gateway_only", gateway_only.is_some().into()));
                let command = exec::Command {
                    argv: request.argv,
                    stdin: request.stdin,
                    cwd,
                    timeout,
                    also_execute: gateway_only,
                };
                let ran = exec::run(&sandbox, command).await;
                drop(slot);
                match ran {
                    Ok(result) => {
                        let (exit_code, signal) = match result.exit {
                            AgentExit::Code(code) => (Some(code), None),
                            AgentExit::Signal(signal) => (None, Some(signal)),
                        };
                        meta.push(("exit_code", exit_code.map_or(MetaValue::Null, Into::into)));
                        meta.push(("signal", signal.map_or(MetaValue::Null, Into::into)));
                        meta.push(("timed_out", result.timed_out.into()));
                        meta.push(("stdout_bytes", (result.stdout.len() as i64).into()));
                        meta.push(("stderr_bytes", (result.stderr.len() as i64).into()));
                        meta.push(("truncated", result.truncated.into()));
                        Ok(ToolResult::Exec(pb::ExecResponse {
                            exit_code,
                            signal,
                            timed_out: result.timed_out,
                            stdout: result.stdout,
                            stderr: result.stderr,
                            truncated: result.truncated,
                            duration_ms: u64::try_from(result.duration.as_millis())
                                .unwrap_or(u64::MAX),
                        }))
                    }
                    // Never started: nothing ran. Otherwise it may have run: allowed, and why
                    // it has no result.
                    Err(e @ ExecError::NotStarted(_)) => {
                        Err(Refusal::with(Status::failed_precondition, e.to_string()))
                    }
                    // Why is in the audit entry and the log; the agent gets an error id.
                    Err(e) => {
                        Err(Refusal::new(crate::status::internal("exec", &e), e.to_string()).ran())
                    }
                }
            }
        };
        let run = self.clone();
        // The entry is on disk before the agent hears the result.
        tokio::task::block_in_place(move || {
            run.gate.finish(
                "exec",
                call_id,
                started,
                meta,
                outcome.map(Step::Done),
                true,
            )
        })
    }
}
