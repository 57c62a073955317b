//! How runs and their events look on the wire: records as `pb::Run`, and the event
//! streams of `WatchRun` and the gateway's `WatchChild`.

use std::pin::Pin;

use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tollgate_proto::v1 as pb;
use tollgate_receipt::timestamp_from_unix;
use tonic::Status;

use crate::records::{RouteUsage, RunRecord, RunState};

/// A stream of run events (WatchRun, WatchChild).
pub type RunEventStream = Pin<Box<dyn Stream<Item = Result<pb::RunEvent, Status>> + Send>>;

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
        RunState::FailedBeforeStart => pb::RunState::FailedBeforeStart,
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
            route_usage: r.route_usage.iter().map(usage_proto).collect(),
            output_truncated: r.output_truncated,
            cleanup_errors: r.cleanup_errors.clone(),
            landlock_abi: r.landlock_abi.unwrap_or(0),
            workspace: r.workspace.clone().unwrap_or_default(),
            workspace_kept_until: r.workspace_kept_until.unwrap_or(0),
        }),
        parent_run_id: record.parent_run_id.clone().unwrap_or_default(),
        depth: record.depth,
        model_usage: record
            .report
            .as_ref()
            .map(|r| r.route_usage.iter().map(usage_proto).collect())
            .unwrap_or_default(),
        workspace_keep_seconds: record
            .report
            .as_ref()
            .map_or(0, |r| r.workspace_keep_seconds),
    }
}

/// The protocol form of one route's use.
pub fn usage_proto(usage: &RouteUsage) -> pb::RouteUsage {
    pb::RouteUsage {
        route: usage.route.clone(),
        calls: usage.calls,
        prompt_tokens: usage.prompt_tokens,
        completion_tokens: usage.completion_tokens,
    }
}

/// Streams a run's history, then its live events until its end.
pub fn event_stream(
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
