//! `WatchApprovals` and `DecideApproval`: the operator's side of the approval board. An
//! operator sees and decides only the calls of runs whose receipt it owns (admins: every
//! run's); who decided is the caller the request layer resolved.

use std::collections::HashSet;
use std::pin::Pin;

use tokio::sync::broadcast::error::RecvError;
use tokio_stream::Stream;
use tollgate_proto::v1 as pb;
use tonic::Status;

use crate::approvals::{clip_reason, ApprovalBoard, DecideError, Verdict, MAX_WAITING};
use crate::callers::Caller;

/// The stream `WatchApprovals` answers with.
pub type ApprovalStream = Pin<Box<dyn Stream<Item = Result<pb::ApprovalEvent, Status>> + Send>>;

/// What `caller` sees of the board (only `run_id`'s calls, unless empty): the calls waiting
/// now, `caught_up`, then each change. A watcher that falls too far behind gets
/// `RESOURCE_EXHAUSTED` and watches again.
pub fn watch(board: &ApprovalBoard, caller: Caller, run_id: String) -> ApprovalStream {
    let visible = move |call: &pb::PendingCall| {
        (run_id.is_empty() || call.run_id == run_id) && caller.may_touch(&call.owner)
    };
    let (waiting, mut changes) = board.watch(&visible);
    let (sender, receiver) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        // The calls this watcher was shown waiting: their ends are its to see (an end
        // carries no owner). Bounded by the board's own bound.
        let mut shown: HashSet<(String, String)> = HashSet::new();
        for call in waiting {
            shown.insert((call.run_id.clone(), call.call_id.clone()));
            let event = pb::approval_event::Event::Pending(call);
            if sender.send(Ok(event_of(event))).await.is_err() {
                return;
            }
        }
        let caught_up = pb::approval_event::Event::CaughtUp(true);
        if sender.send(Ok(event_of(caught_up))).await.is_err() {
            return;
        }
        loop {
            let event = match changes.recv().await {
                Ok(event) => event,
                Err(RecvError::Closed) => return,
                Err(RecvError::Lagged(_)) => {
                    let _ = sender
                        .send(Err(Status::resource_exhausted(
                            "this watcher fell behind the approval board; watch again",
                        )))
                        .await;
                    return;
                }
            };
            let forward = match &event.event {
                Some(pb::approval_event::Event::Pending(call)) if visible(call) => {
                    if shown.len() < MAX_WAITING {
                        shown.insert((call.run_id.clone(), call.call_id.clone()));
                    }
                    true
                }
                Some(pb::approval_event::Event::Decided(decided)) => {
                    shown.remove(&(decided.run_id.clone(), decided.call_id.clone()))
                }
                _ => false,
            };
            if forward && sender.send(Ok(event)).await.is_err() {
                return;
            }
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(receiver))
}

fn event_of(event: pb::approval_event::Event) -> pb::ApprovalEvent {
    pb::ApprovalEvent { event: Some(event) }
}

/// The name a decision is recorded under.
pub fn decider(caller: &Caller) -> String {
    match caller.operator() {
        Some(operator) => operator.name.clone(),
        None => "admin".into(),
    }
}

/// Applies `request` as `caller` (whose right to the run was checked already).
pub fn decide(
    board: &ApprovalBoard,
    caller: &Caller,
    request: pb::DecideApprovalRequest,
) -> Result<pb::DecidedCall, Status> {
    let by = decider(caller);
    let reason = clip_reason(&request.reason);
    let verdict = if request.approve {
        Verdict::Approved {
            by,
            remember: request.remember,
            reason,
        }
    } else {
        if request.remember {
            return Err(Status::invalid_argument(
                "remember goes with approve: a denial is never remembered",
            ));
        }
        Verdict::Denied { by, reason }
    };
    board
        .decide(&request.run_id, &request.call_id, verdict)
        .map_err(|e| match e {
            DecideError::NotWaiting { .. } => Status::not_found(e.to_string()),
        })
}
