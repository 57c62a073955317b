//! Delegation on the gateway: a run asks for a child receipt narrower than its own, starts
//! it, lists, watches and stops its descendants.
//!
//! The supervisor carves the child's `tool_calls` and `tokens` from what the run has left
//! (so a tree never spends more than its root), asks the authority with its own delegation
//! token (the run's envelope goes along as evidence), verifies the child and keeps it: the
//! agent never holds a child's `tgr1.` text, so a child starts only here, through its
//! parent's live gateway, and ends when the parent ends (`RunManager::end_tree`).
//!
//! Starting a child re-checks it against the parent and resolves each child grant beneath
//! the parent's pinned grant without following symbolic links: the parent's agent can plant
//! links under its writable grants, and a child grant must never reach through one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tollgate_audit::Decision;
use tollgate_proto::v1 as pb;
use tollgate_receipt::amendment::widened_for_children;
use tollgate_receipt::delegation::check_within;
use tollgate_receipt::{unix_now, SignedReceipt};
use tonic::Status;

mod authority;
mod delegate;
mod pin;

pub use authority::Delegator;
pub use pin::pin_child_grants;

use super::fs::FsGrant;
use super::gate::{new_call_id, CallGate, CallMeta, Refusal};
use super::models::RunModels;
use crate::error::StartError;
use crate::hub::Subscription;
use crate::records::{RecordsError, RunRecord};
use crate::status::start_status;
use crate::wire::run_proto;

/// Most child receipts a run may hold minted and not started.
const MAX_PENDING: usize = 64;

/// How long `StopChild` waits for the child's teardown.
const STOP_WAIT: Duration = Duration::from_secs(30);

/// A delegated run's place in its tree: started through the gateway of the live run
/// `parent`, with its grants pinned beneath the parent's.
pub struct ChildOf {
    /// The parent run.
    pub parent: String,
    /// The child's fs grants, resolved beneath the parent's pinned ones.
    pub grants: Vec<FsGrant>,
    /// The parent's limits: its live children together stay within its memory, pids and
    /// cpu.
    pub parent_limits: pb::Limits,
}

/// What delegation on a run's gateway needs of the supervisor's runs: declared here, on
/// the gateway's side, and implemented by the run manager, so the gateway never depends
/// on the code that starts it.
pub trait ChildRuns: Send + Sync {
    /// Checks a receipt the authority minted for a child of `parent` with this
    /// supervisor's keys; the receipt, or why it is not one.
    fn verify_child(&self, signed: &SignedReceipt, parent: &str) -> Result<pb::Receipt, String>;
    /// Starts the verified child receipt `signed` in `child`'s place; its run id.
    fn start_child(
        self: Arc<Self>,
        signed: &SignedReceipt,
        argv: Option<Vec<String>>,
        child: ChildOf,
    ) -> Result<String, StartError>;
    /// The record of `run_id`, if there is one.
    fn get(&self, run_id: &str) -> Result<Option<RunRecord>, RecordsError>;
    /// The records of `run_id` and its descendants.
    fn subtree(&self, run_id: &str) -> Result<Vec<RunRecord>, RecordsError>;
    /// `run_id`'s tree as `ListChildren` answers it.
    fn tree(&self, run_id: &str) -> Result<pb::RunTree, RecordsError>;
    /// The events of a live run so far and its live feed; `None` once it has ended.
    fn subscribe(&self, run_id: &str) -> Option<Subscription>;
    /// Ends `run_id` (and its descendants) for `reason`.
    fn stop(&self, run_id: &str, reason: &str) -> bool;
    /// Waits up to `timeout` for `run_id` to end; its final record.
    fn wait(&self, run_id: &str, timeout: Duration) -> Option<RunRecord>;
}

/// A gateway's reach into the supervisor for delegation.
#[derive(Clone)]
pub struct ChildControl {
    /// The supervisor's runs (weak: a gateway never keeps the supervisor alive).
    pub runs: Weak<dyn ChildRuns>,
    /// The authority link; `None`: this supervisor has no delegation token.
    pub delegator: Option<Arc<Delegator>>,
}

impl std::fmt::Debug for ChildControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildControl")
            .field("delegator", &self.delegator)
            .finish_non_exhaustive()
    }
}

/// Delegation on one run's gateway: its call gate, the grants children are pinned beneath,
/// the model budget children's tokens are carved from, and what it keeps of its children.
#[derive(Debug)]
pub struct Children {
    /// The run's call gate.
    pub gate: Arc<CallGate>,
    /// The run's fs grants (children are pinned beneath the ones its receipt signed).
    pub grants: Arc<crate::gateway::fs::LiveGrants>,
    /// The run's gateway-only programs in force (a child gets only these, or its exec list's).
    pub programs: Arc<std::sync::RwLock<Vec<pb::GatewayExecGrant>>>,
    /// The run's models (its token budget); `None`: the supervisor has no routes.
    pub models: Option<Arc<RunModels>>,
    /// Receipts, envelope and the supervisor link.
    pub state: ChildState,
    /// Where a delegation under a grant that asks waits for an operator.
    pub approvals: crate::gateway::approval::RunApprovals,
}

/// What a run's gateway keeps for delegation.
#[derive(Debug, Default)]
pub struct ChildState {
    /// The envelope the run was admitted with: the evidence the authority asks for.
    pub signed: SignedReceipt,
    /// How to reach the supervisor; `None`: this gateway cannot delegate.
    pub control: Option<ChildControl>,
    /// Child receipts minted and not started yet, by id.
    pub pending: Mutex<HashMap<String, (SignedReceipt, pb::Receipt)>>,
    /// Delegations asking the authority right now: they hold a place in `pending`.
    minting: AtomicUsize,
    /// The output the run may still relay (shared with its relays): children's
    /// `output_bytes` are carved from it. `None`: not carved (a gateway without a run).
    output_left: Option<Arc<AtomicU64>>,
    /// The signed amendments applied to the run that are for its children too: handed to the
    /// authority with each delegation, and what children are checked against here.
    amendments: Mutex<Vec<(pb::SignedAmendment, pb::Amendment)>>,
}

/// A place held in a run's pending children while its delegation asks the authority.
struct MintingSlot<'a>(&'a AtomicUsize);

impl Drop for MintingSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl ChildState {
    /// The delegation state of a run admitted with `signed`, reaching the supervisor through
    /// `control`.
    pub fn new(signed: SignedReceipt, control: ChildControl, output_left: Arc<AtomicU64>) -> Self {
        Self {
            signed,
            control: Some(control),
            output_left: Some(output_left),
            ..Default::default()
        }
    }

    /// Notes an applied amendment that is for the run's children too.
    pub fn for_children(&self, signed: pb::SignedAmendment, amendment: pb::Amendment) {
        self.amendments
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((signed, amendment));
    }

    /// The applied amendments for children, as signed.
    pub fn signed_for_children(&self) -> Vec<pb::SignedAmendment> {
        self.amendments().0
    }

    /// How many applied amendments are for children.
    pub fn for_children_count(&self) -> usize {
        self.amendments
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// The applied amendments for children: as signed, and decoded.
    fn amendments(&self) -> (Vec<pb::SignedAmendment>, Vec<pb::Amendment>) {
        self.amendments
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .unzip()
    }

    /// Holds a place for one more child: expired children are dropped first; `None` when
    /// [`MAX_PENDING`] are minted or being minted.
    fn hold_slot(&self) -> Option<MintingSlot<'_>> {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let now = unix_now();
        pending
            .retain(|_, (_, receipt)| receipt.expires_at.as_ref().map_or(0, |t| t.seconds) > now);
        if pending.len() + self.minting.load(Ordering::SeqCst) >= MAX_PENDING {
            return None;
        }
        self.minting.fetch_add(1, Ordering::SeqCst);
        Some(MintingSlot(&self.minting))
    }

    /// Child receipts minted for this run and not started yet.
    pub fn pending_children(&self, parent_run_id: &str) -> Vec<pb::PendingChild> {
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let mut children: Vec<pb::PendingChild> = pending
            .values()
            .map(|(_, receipt)| pb::PendingChild {
                receipt_id: receipt.receipt_id.clone(),
                parent_run_id: parent_run_id.to_owned(),
                subject: receipt.subject.clone(),
                expires_at: receipt.expires_at,
            })
            .collect();
        children.sort_by(|a, b| a.receipt_id.cmp(&b.receipt_id));
        children
    }
}

fn unavailable(reason: &str) -> Refusal {
    Refusal::with(Status::unavailable, reason.to_owned())
}

/// The longest agent-given text (subject, stop reason) kept in audit entries and records.
const MAX_TEXT: usize = 256;

fn clip(text: &str) -> String {
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

impl Children {
    fn manager(&self) -> Result<Arc<dyn ChildRuns>, Refusal> {
        self.state
            .control
            .as_ref()
            .and_then(|control| control.runs.upgrade())
            .ok_or_else(|| unavailable("the supervisor is shutting down"))
    }

    /// Whether `run_id` is a descendant of this run (its subtree, not itself).
    fn descendant(&self, manager: &dyn ChildRuns, run_id: &str) -> Result<(), Refusal> {
        let tree = manager.subtree(&self.gate.run_id).map_err(|e| {
            Refusal::new(
                crate::status::internal("the run store", &e),
                "the run store failed".into(),
            )
        })?;
        if run_id != self.gate.run_id && tree.iter().any(|run| run.run_id == run_id) {
            Ok(())
        } else {
            Err(Refusal::with(
                Status::not_found,
                format!("run {run_id} is not a descendant of this run"),
            ))
        }
    }

    /// `Gateway.StartChild` (blocking: run it on a blocking thread, where a client that hangs
    /// up cannot cancel it). The call's entry is on disk before the child starts; a start
    /// that then fails gets a second entry saying so.
    pub(crate) fn start_child(
        &self,
        request: pb::StartChildRequest,
    ) -> Result<pb::StartChildResponse, Status> {
        let started = Instant::now();
        let call_id = new_call_id();
        let mut meta: CallMeta = vec![("child_run_id", clip(&request.receipt_id).into())];
        let record = |meta: &CallMeta, decision: Decision, reason: Option<&str>| {
            self.gate.record_call(
                "child.start",
                &call_id,
                started,
                meta,
                (decision, reason),
                true,
            )
        };
        let (manager, signed, child, grants) = match self.start_child_checks(&request) {
            Ok(checked) => checked,
            Err(refusal) => {
                if let Some(code) = refusal.code {
                    meta.push(("code", code.into()));
                }
                record(&meta, refusal.decision(), Some(&refusal.reason))?;
                return Err(refusal.into_status(&call_id));
            }
        };
        record(&meta, Decision::Allow, None)?;
        let argv = (!request.argv.is_empty()).then_some(request.argv);
        let started_child = manager.clone().start_child(
            &signed,
            argv,
            ChildOf {
                parent: self.gate.run_id.clone(),
                grants,
                parent_limits: self.gate.receipt.limits.unwrap_or_default(),
            },
        );
        match started_child {
            Ok(run_id) => Ok(pb::StartChildResponse { call_id, run_id }),
            Err(error) => {
                // Refused before it was recorded for a reason that is not the receipt's (an
                // argv, the parent's shared limits): it can be started again.
                let retry = !matches!(error, StartError::Receipt(_))
                    && matches!(manager.get(&child.receipt_id), Ok(None));
                if retry {
                    self.state
                        .pending
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(child.receipt_id.clone(), (signed, child));
                }
                meta.push(("code", error.code().into()));
                let reason = format!("not done: {error}");
                self.gate.record_follow_up(
                    "child.start",
                    &call_id,
                    started,
                    &meta,
                    (Decision::Deny, Some(&reason)),
                    true,
                )?;
                Err(Refusal::new(start_status(&error), error.to_string()).into_status(&call_id))
            }
        }
    }

    /// Everything `StartChild` checks before anything is done.
    fn start_child_checks(&self, request: &pb::StartChildRequest) -> Result<CheckedStart, Refusal> {
        let made = self.gate.admit("child.start")?;
        self.gate.charge(made)?;
        let manager = self.manager()?;
        let taken = self
            .state
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&request.receipt_id);
        let Some((signed, child)) = taken else {
            if self.descendant(&*manager, &request.receipt_id).is_ok() {
                return Err(Refusal::with(
                    Status::already_exists,
                    format!(
                        "child {} has already started (a receipt starts one run)",
                        request.receipt_id
                    ),
                ));
            }
            return Err(Refusal::with(
                Status::not_found,
                format!(
                    "no child receipt {} of this run is waiting to start (ask Delegate first)",
                    clip(&request.receipt_id)
                ),
            ));
        };
        // The authority checked it; checked again here, against the receipt this run has (as
        // its amendments for children widen it).
        let (_, amendments) = self.state.amendments();
        let parent = widened_for_children(&self.gate.receipt, &amendments);
        if let Err(wider) = check_within(&parent, &child) {
            return Err(Refusal::denied(&self.gate.run_id, wider.to_string()).coded("delegated"));
        }
        self.programs_in_force(&child.gateway_exec)?;
        let grants =
            pin_child_grants(&self.grants.for_children(), &child).map_err(|(code, reason)| {
                Refusal::new(
                    Status::permission_denied(format!(
                        "receipt {} refused ({code}): {reason}",
                        child.receipt_id
                    )),
                    reason,
                )
                .coded(code)
            })?;
        Ok((manager, signed, child, grants))
    }

    /// A refusal when one of a child's gateway-only `programs` is neither in this run's exec
    /// list nor among its gateway-only programs in force (a narrowing took it away).
    pub(super) fn programs_in_force(
        &self,
        programs: &[pb::GatewayExecGrant],
    ) -> Result<(), Refusal> {
        let in_force = self.programs.read().unwrap_or_else(|p| p.into_inner());
        match programs.iter().find(|g| {
            !self.gate.receipt.exec.contains(&g.program)
                && !in_force.iter().any(|p| p.program == g.program)
        }) {
            None => Ok(()),
            Some(gone) => Err(Refusal::denied(
                &self.gate.run_id,
                format!(
                    "gateway_exec {} is not this run's to hand on (not granted, or taken away by a narrowing)",
                    gone.program
                ),
            )
            .coded("grant_escapes")),
        }
    }

    /// `Gateway.ListChildren`.
    pub(crate) async fn list_children(self: &Arc<Self>) -> Result<pb::RunTree, Status> {
        let run = self.clone();
        self.read_only_call("child.list", vec![], move || {
            let manager = run.manager()?;
            manager.tree(&run.gate.run_id).map_err(|e| {
                Refusal::new(
                    crate::status::internal("the run store", &e),
                    "the run store failed".into(),
                )
            })
        })
        .await
    }

    /// `Gateway.WatchChild`: checks the call; the caller streams the returned subscription.
    pub(crate) async fn watch_child(
        self: &Arc<Self>,
        run_id: String,
    ) -> Result<
        (
            Vec<pb::RunEvent>,
            Option<tokio::sync::broadcast::Receiver<pb::RunEvent>>,
        ),
        Status,
    > {
        let run = self.clone();
        let meta = vec![("child_run_id", clip(&run_id).into())];
        self.read_only_call("child.watch", meta, move || {
            let manager = run.manager()?;
            run.descendant(&*manager, &run_id)?;
            match manager.subscribe(&run_id) {
                Some(subscription) => Ok(subscription),
                None => {
                    let record = manager
                        .get(&run_id)
                        .map_err(|e| {
                            Refusal::new(
                                crate::status::internal("the run store", &e),
                                "the run store failed".into(),
                            )
                        })?
                        .ok_or_else(|| {
                            Refusal::with(Status::not_found, format!("no run {run_id}"))
                        })?;
                    let ended = pb::RunEvent {
                        event: Some(pb::run_event::Event::Ended(run_proto(&record))),
                    };
                    Ok((vec![ended], None))
                }
            }
        })
        .await
    }

    /// `Gateway.StopChild` (blocking, like `start_child`). Not held to the tool-call budget:
    /// a run that has spent it must still be able to stop what it started. Its entry is on
    /// disk before the stop.
    pub(crate) fn stop_child(
        &self,
        request: pb::StopChildRequest,
    ) -> Result<pb::StopChildResponse, Status> {
        let started = Instant::now();
        let call_id = new_call_id();
        let meta: CallMeta = vec![("child_run_id", clip(&request.run_id).into())];
        let record = |decision: Decision, reason: Option<&str>| {
            self.gate.record_call(
                "child.stop",
                &call_id,
                started,
                &meta,
                (decision, reason),
                true,
            )
        };
        let checked = self.gate.admit("child.stop").and_then(|_| {
            let manager = self.manager()?;
            self.descendant(&*manager, &request.run_id)?;
            Ok(manager)
        });
        let manager = match checked {
            Ok(manager) => manager,
            Err(refusal) => {
                record(refusal.decision(), Some(&refusal.reason))?;
                return Err(refusal.into_status(&call_id));
            }
        };
        record(Decision::Allow, None)?;
        let reason = if request.reason.is_empty() {
            format!("stopped by its ancestor run {}", self.gate.run_id)
        } else {
            format!(
                "stopped by its ancestor run {}: {}",
                self.gate.run_id,
                clip(&request.reason)
            )
        };
        manager.stop(&request.run_id, &reason);
        match manager.wait(&request.run_id, STOP_WAIT) {
            Some(record) => Ok(pb::StopChildResponse {
                call_id,
                run: Some(run_proto(&record)),
            }),
            None => {
                let refusal = Refusal::with(Status::not_found, "the run is gone".into());
                Err(refusal.into_status(&call_id))
            }
        }
    }

    /// A call that changes nothing: checked, counted, recorded (not waited for).
    async fn read_only_call<T: Send + 'static>(
        self: &Arc<Self>,
        tool: &'static str,
        meta: CallMeta,
        work: impl FnOnce() -> Result<T, Refusal> + Send + 'static,
    ) -> Result<T, Status> {
        let started = Instant::now();
        let call_id = new_call_id();
        let run = self.clone();
        let outcome = tokio::task::spawn_blocking(move || {
            let made = run.gate.admit(tool)?;
            run.gate.charge(made)?;
            work()
        })
        .await
        .unwrap_or_else(|e| {
            Err(Refusal::new(
                crate::status::internal("a worker", &e),
                "a worker failed".into(),
            ))
        });
        let (decision, reason) = match &outcome {
            Ok(_) => (Decision::Allow, None),
            Err(refusal) => (refusal.decision(), Some(refusal.reason.as_str())),
        };
        self.gate
            .record_call(tool, &call_id, started, &meta, (decision, reason), false)?;
        outcome.map_err(|refusal| refusal.into_status(&call_id))
    }
}

/// What `StartChild`'s checks found: the runs to start it in, the child's envelope and
/// receipt, and its grants pinned beneath the parent's.
type CheckedStart = (Arc<dyn ChildRuns>, SignedReceipt, pb::Receipt, Vec<FsGrant>);

#[cfg(test)]
mod tests {
    use super::delegate::carve_left;
    use super::*;

    #[test]
    fn output_handed_on_comes_out_of_what_is_left() {
        let left = AtomicU64::new(1000);
        assert_eq!(carve_left(&left, 0), Ok(500), "zero asks for half");
        assert_eq!(carve_left(&left, 501), Err((501, 500)));
        assert_eq!(carve_left(&left, 500), Ok(500));
        assert_eq!(left.load(Ordering::SeqCst), 0);
        assert_eq!(carve_left(&left, 0), Err((0, 0)), "nothing left to halve");
    }
}
