//! Gateway calls under a grant that asks: put on the supervisor's approval board with what an
//! operator needs to decide, audited when they begin to wait (`approval_pending`, durable) and
//! when the wait ends (`approval_decided`: who decided and why, or that no one did), and
//! awaited without holding a thread. The call itself then runs, or is refused, as any other
//! call (its `tool_call` entry names who approved it).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tollgate_audit::{Decision, EntryDraft, EntryKind};
use tollgate_proto::v1 as pb;
use tonic::Status;

use super::gate::{CallGate, Refusal};
use crate::approvals::{ApprovalBoard, Verdict, WaitOutcome};
use crate::COMPONENT;

/// A call that must wait for an operator: what the operator is shown (never data).
#[derive(Debug, Clone)]
pub(crate) struct Asked {
    /// `fs.write`, `fs.delete`, `exec`, `egress`, `model.complete` or `delegate`.
    pub(crate) tool: &'static str,
    /// What it reaches: the host path it changes, the program, `host:port`, the route, the
    /// child's subject.
    pub(crate) path: String,
    /// `fs.write`: the bytes it writes; `exec`: the bytes of stdin; `model.complete`: the
    /// bytes of text that would leave.
    pub(crate) bytes: u64,
    /// `exec`: the command line (what a remembered approval lets through again).
    pub(crate) argv: Vec<String>,
    /// `exec`: where it runs in the sandbox.
    pub(crate) cwd: String,
    /// `exec`: the SHA-256 of its stdin (hex): a remembered approval lets through only the
    /// same command line, in the same directory, with the same input.
    pub(crate) stdin_sha256: String,
    /// `fs.write`: its mode.
    pub(crate) mode: String,
    /// `model.complete`: the classifier's judgement of what would leave, and why.
    pub(crate) sensitivity: String,
    /// See `sensitivity`.
    pub(crate) reasons: Vec<String>,
}

impl Asked {
    /// A call of `tool` reaching `path`, with nothing else to show.
    pub(crate) fn new(tool: &'static str, path: String) -> Self {
        Self {
            tool,
            path,
            bytes: 0,
            argv: Vec::new(),
            cwd: String::new(),
            stdin_sha256: String::new(),
            mode: String::new(),
            sensitivity: String::new(),
            reasons: Vec::new(),
        }
    }
}

/// Whether a call waited for approval, and how that ended.
#[derive(Debug)]
pub(crate) enum Approval {
    /// Its grant does not ask (the call was not put to anyone).
    NotAsked,
    /// Approved (an operator, or a remembered approval): it runs.
    Approved {
        /// Who approved.
        by: String,
    },
    /// Denied, timed out, or its run ended: refused with why.
    Refused(Refusal),
}

/// What a remembered approval is recorded as having been approved by.
pub const REMEMBERED: &str = "(remembered)";

/// One run's side of the approval board.
#[derive(Debug, Clone)]
pub struct RunApprovals {
    /// The run's call gate (its audit quota counts the approval entries).
    pub gate: Arc<CallGate>,
    /// The supervisor's board.
    pub board: Arc<ApprovalBoard>,
    /// How long a call waits before it is denied (never past the receipt's expiry).
    pub timeout: Duration,
}

impl RunApprovals {
    /// Waits for an operator's verdict on call `call_id`, which would make the change
    /// `asked`. A call an operator approved with `remember` passes at once. A run that cannot
    /// take the call (ending, expired, revoked) refuses it without asking anyone.
    pub(crate) async fn approve(&self, asked: Asked, call_id: &str) -> Result<Approval, Status> {
        let gate = &self.gate;
        let target = crate::approvals::remembered_as(
            &asked.path,
            &asked.argv,
            &asked.cwd,
            &asked.stdin_sha256,
        );
        if self.board.remembered(&gate.run_id, asked.tool, &target) {
            return Ok(Approval::Approved {
                by: REMEMBERED.into(),
            });
        }
        // A run that cannot take the call (ending, expired, revoked) refuses it; nothing
        // that asks ever goes on unasked.
        if let Err(refusal) = gate.check_alive() {
            return Ok(Approval::Refused(refusal));
        }
        let now = SystemTime::now();
        let expiry =
            UNIX_EPOCH + Duration::from_secs(u64::try_from(gate.expires_at()).unwrap_or(0));
        let deadline = (now + self.timeout).min(expiry);
        let call = pb::PendingCall {
            run_id: gate.run_id.clone(),
            call_id: call_id.to_owned(),
            owner: gate.receipt.owner.clone(),
            subject: gate.receipt.subject.clone(),
            tool: asked.tool.into(),
            path: asked.path.clone(),
            bytes: asked.bytes,
            mode: asked.mode.clone(),
            asked_at: Some(timestamp(now)),
            deadline: Some(timestamp(deadline)),
            sensitivity: asked.sensitivity.clone(),
            reasons: asked.reasons.clone(),
            argv: asked.argv.clone(),
            cwd: asked.cwd.clone(),
            stdin_sha256: asked.stdin_sha256.clone(),
        };
        let ticket = match self.board.ask(call) {
            Ok(ticket) => ticket,
            Err(full) => {
                return Ok(Approval::Refused(Refusal::with(
                    Status::resource_exhausted,
                    full.to_string(),
                )))
            }
        };
        let pending = EntryDraft::new(COMPONENT, EntryKind::ApprovalPending)
            .receipt(gate.run_id.as_str())
            .run(gate.run_id.as_str())
            .call(call_id)
            .meta("tool", asked.tool)
            .meta("path", asked.path.as_str())
            .meta("bytes", i64::try_from(asked.bytes).unwrap_or(i64::MAX))
            .meta("sensitivity", asked.sensitivity.as_str())
            .meta("reasons", asked.reasons.clone())
            .meta("argv", asked.argv.clone())
            .meta("cwd", asked.cwd.as_str())
            .meta(
                "deadline",
                i64::try_from(
                    deadline
                        .duration_since(UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_secs(),
                )
                .unwrap_or(i64::MAX),
            );
        // On disk before anyone can decide: a decision never precedes its question.
        gate.audited(pending, true)?;
        // If the agent gives the call up now, this records it.
        let mut cancelled = CancelledWait {
            gate,
            call_id,
            armed: true,
        };
        let outcome = ticket.wait(deadline, gate.streams_end.subscribe()).await;
        cancelled.armed = false;
        let (decided, approval) = match outcome {
            WaitOutcome::Decided(Verdict::Approved {
                by,
                remember,
                reason,
            }) => (
                decided_entry(gate, call_id, Decision::Allow, "approved")
                    .meta("decided_by", by.as_str())
                    .meta("remember", remember)
                    .meta("reason", reason.as_str()),
                Approval::Approved { by },
            ),
            WaitOutcome::Decided(Verdict::Denied { by, reason }) => {
                let said = if reason.is_empty() {
                    String::new()
                } else {
                    format!(": {reason}")
                };
                (
                    decided_entry(gate, call_id, Decision::Deny, "denied")
                        .meta("decided_by", by.as_str())
                        .reason(reason.as_str()),
                    Approval::Refused(Refusal::denied(
                        &gate.run_id,
                        format!(
                            "operator {by:?} denied {} of {}{said}",
                            asked.tool, asked.path
                        ),
                    )),
                )
            }
            WaitOutcome::TimedOut => {
                let why = format!(
                    "no operator approved {} of {} within {} s, so it is denied",
                    asked.tool,
                    asked.path,
                    deadline.duration_since(now).unwrap_or_default().as_secs()
                );
                (
                    decided_entry(gate, call_id, Decision::Deny, "timed_out").reason(why.as_str()),
                    Approval::Refused(Refusal::denied(&gate.run_id, why)),
                )
            }
            WaitOutcome::RunEnded => {
                let why = "the run ended while the call waited for approval".to_owned();
                (
                    decided_entry(gate, call_id, Decision::Deny, "run_ended").reason(why.as_str()),
                    Approval::Refused(Refusal::denied(&gate.run_id, why)),
                )
            }
        };
        gate.audited(decided, true)?;
        Ok(approval)
    }

    /// [`Self::approve`] for a call that goes on by itself once approved: who approved it,
    /// or why it is refused.
    pub(crate) async fn approved_by(&self, asked: Asked, call_id: &str) -> Result<String, Refusal> {
        match self.approve(asked, call_id).await {
            Ok(Approval::Approved { by }) => Ok(by),
            Ok(Approval::Refused(refusal)) => Err(refusal),
            // `approve` asks whenever it does not refuse.
            Ok(Approval::NotAsked) => Err(Refusal::with(
                Status::internal,
                "the call was neither approved nor refused".into(),
            )),
            Err(status) => {
                let reason = status.message().to_owned();
                Err(Refusal::new(status, reason))
            }
        }
    }

    /// This run's calls waiting now, oldest first.
    pub fn waiting(&self) -> Vec<pb::PendingCall> {
        self.board.waiting_of(&self.gate.run_id)
    }
}

fn decided_entry(gate: &CallGate, call_id: &str, decision: Decision, outcome: &str) -> EntryDraft {
    EntryDraft::new(COMPONENT, EntryKind::ApprovalDecided)
        .receipt(gate.run_id.as_str())
        .run(gate.run_id.as_str())
        .call(call_id)
        .decision(decision)
        .meta("outcome", outcome)
}

fn timestamp(at: SystemTime) -> prost_types::Timestamp {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp {
        seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(since.subsec_nanos()).unwrap_or(0),
    }
}

/// Records a wait the agent gave up (its call dropped while waiting).
struct CancelledWait<'a> {
    gate: &'a CallGate,
    call_id: &'a str,
    armed: bool,
}

impl Drop for CancelledWait<'_> {
    fn drop(&mut self) {
        if self.armed {
            let entry = decided_entry(self.gate, self.call_id, Decision::Deny, "cancelled")
                .reason("the agent gave the call up while it waited");
            // Not durable: a drop must not block on an fsync (written at once, synced soon).
            let _ = self.gate.audited(entry, false);
        }
    }
}
