//! `tollgate approvals`, `approve` and `deny`: the calls waiting for an operator on the
//! supervisor, and deciding them.

use serde_json::json;
use tokio_stream::StreamExt as _;
use tollgate_proto::v1 as pb;

use crate::args::GlobalArgs;
use crate::client::{authed, connect_supervisor};
use crate::error::CliError;
use crate::show;

/// `tollgate approvals [--run RUN] [--watch] [--json]`: the calls waiting now (then, with
/// `--watch`, each new one and each end of a wait, until interrupted).
pub(crate) async fn approvals(
    global: &GlobalArgs,
    run_id: Option<String>,
    watch: bool,
    json: bool,
) -> Result<(), CliError> {
    let token = global.supervisor_tokens().token()?;
    let mut client = connect_supervisor(&global.supervisor, &global.tls()).await?;
    let mut events = client
        .watch_approvals(authed(
            &token,
            pb::WatchApprovalsRequest {
                run_id: run_id.unwrap_or_default(),
            },
        )?)
        .await?
        .into_inner();
    let mut waiting = 0usize;
    while let Some(event) = events.next().await {
        match event?.event {
            Some(pb::approval_event::Event::Pending(call)) => {
                waiting += 1;
                if json {
                    println!("{}", pending_json(&call));
                } else {
                    say!("{}", pending_line(&call));
                }
            }
            Some(pb::approval_event::Event::Decided(decided)) => {
                if json {
                    println!("{}", decided_json(&decided));
                } else {
                    say!("{}", decided_line(&decided));
                }
            }
            Some(pb::approval_event::Event::CaughtUp(_)) => {
                if !watch {
                    if waiting == 0 && !json {
                        say!("no call waits for approval");
                    }
                    return Ok(());
                }
                if !json {
                    say!("(waiting for new calls; Ctrl-C to stop)");
                }
            }
            None => {}
        }
    }
    Ok(())
}

/// `tollgate approve RUN CALL [--remember] [--reason TEXT]` and `tollgate deny RUN CALL
/// [--reason TEXT]`.
pub(crate) async fn decide(
    global: &GlobalArgs,
    request: pb::DecideApprovalRequest,
    json: bool,
) -> Result<(), CliError> {
    let token = global.supervisor_tokens().token()?;
    let mut client = connect_supervisor(&global.supervisor, &global.tls()).await?;
    let decided = client
        .decide_approval(authed(&token, request)?)
        .await?
        .into_inner()
        .decided
        .unwrap_or_default();
    if json {
        println!("{}", decided_json(&decided));
    } else {
        say!("{}", decided_line(&decided));
    }
    Ok(())
}

fn outcome_name(outcome: i32) -> &'static str {
    match pb::ApprovalOutcome::try_from(outcome) {
        Ok(pb::ApprovalOutcome::Approved) => "approved",
        Ok(pb::ApprovalOutcome::Denied) => "denied",
        Ok(pb::ApprovalOutcome::TimedOut) => "timed out",
        Ok(pb::ApprovalOutcome::Cancelled) => "cancelled",
        Ok(pb::ApprovalOutcome::RunEnded) => "run ended",
        _ => "unknown",
    }
}

fn what(call: &pb::PendingCall) -> String {
    match call.tool.as_str() {
        "fs.write" => format!(
            "fs.write {} ({} bytes, {})",
            call.path,
            call.bytes,
            call.mode
                .strip_prefix("WRITE_MODE_")
                .unwrap_or(&call.mode)
                .to_ascii_lowercase()
        ),
        tool => format!("{tool} {}", call.path),
    }
}

fn pending_line(call: &pb::PendingCall) -> String {
    format!(
        "waiting  run {} call {}  {} ({}): {}  denied at {} unless decided; `tollgate approve {} {}` or `tollgate deny {} {}`",
        call.run_id,
        call.call_id,
        call.subject,
        call.owner,
        what(call),
        show::time_text(call.deadline.as_ref()),
        call.run_id,
        call.call_id,
        call.run_id,
        call.call_id,
    )
}

fn decided_line(decided: &pb::DecidedCall) -> String {
    let by = if decided.decided_by.is_empty() {
        String::new()
    } else {
        format!(" by {}", decided.decided_by)
    };
    let remember = if decided.remember {
        " (remembered for this tool and path for the rest of the run)"
    } else {
        ""
    };
    let reason = if decided.reason.is_empty() {
        String::new()
    } else {
        format!(": {}", decided.reason)
    };
    format!(
        "{}  run {} call {}{by}{remember}{reason}",
        outcome_name(decided.outcome),
        decided.run_id,
        decided.call_id,
    )
}

fn pending_json(call: &pb::PendingCall) -> serde_json::Value {
    json!({
        "event": "pending",
        "run_id": call.run_id,
        "call_id": call.call_id,
        "owner": call.owner,
        "subject": call.subject,
        "tool": call.tool,
        "path": call.path,
        "bytes": call.bytes,
        "mode": call.mode,
        "asked_at": call.asked_at.map(|t| t.seconds),
        "deadline": call.deadline.map(|t| t.seconds),
    })
}

fn decided_json(decided: &pb::DecidedCall) -> serde_json::Value {
    json!({
        "event": "decided",
        "run_id": decided.run_id,
        "call_id": decided.call_id,
        "outcome": outcome_name(decided.outcome),
        "decided_by": decided.decided_by,
        "reason": decided.reason,
        "remember": decided.remember,
    })
}
