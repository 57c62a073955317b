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
}

impl ExecTools {
    /// Checks an `exec` call and takes one of the run's command slots.
    fn admitted(
        &self,
        made: u64,
        request: &pb::ExecRequest,
    ) -> Result<(Arc<ExecSandbox>, ExecSlot), Refusal> {
        let Some(program) = request.argv.first() else {
            return Err(Refusal::with(
                Status::invalid_argument,
                "exec needs argv (the executable's absolute path first)".into(),
            ));
        };
        if !self
            .gate
            .receipt
            .exec
            .iter()
            .any(|granted| granted == program)
        {
            return Err(Refusal::denied(
                &self.gate.run_id,
                format!("exec of {program} is not granted (missing grant: exec {program})"),
            ));
        }
        self.gate.charge(made)?;
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
        Ok((sandbox, slot))
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
        let admitted = self
            .gate
            .admit("exec")
            .and_then(|made| self.admitted(made, &request));
        let outcome = match admitted {
            Err(refusal) => Err(refusal),
            Ok((sandbox, slot)) => {
                let cwd = if request.cwd.is_empty() {
                    sandbox.plan.agent.cwd.clone()
                } else {
                    PathBuf::from(&request.cwd)
                };
                let timeout = sandbox.timeout_for(request.timeout_ms);
                let ran = exec::run(&sandbox, request.argv, request.stdin, cwd, timeout).await;
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
