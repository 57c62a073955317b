//! `tollgate run`, `ps`, `inspect`, `stop`: the supervisor side of the CLI.

use std::io::Write as _;
use std::path::Path;

use serde_json::json;
use tokio_stream::StreamExt as _;
use tollgate_proto::v1 as pb;

use crate::client::{authed, connect_supervisor};
use crate::error::CliError;
use crate::{read_input, show, GlobalArgs};

fn state_name(state: i32) -> &'static str {
    match pb::RunState::try_from(state) {
        Ok(pb::RunState::Starting) => "starting",
        Ok(pb::RunState::Running) => "running",
        Ok(pb::RunState::Exited) => "exited",
        Ok(pb::RunState::Failed) => "failed",
        Ok(pb::RunState::Stopped) => "stopped",
        Ok(pb::RunState::Expired) => "expired",
        Ok(pb::RunState::Revoked) => "revoked",
        Ok(pb::RunState::LimitExceeded) => "limit_exceeded",
        Ok(pb::RunState::ShimDied) => "shim_died",
        Ok(pb::RunState::SupervisorShutdown) => "supervisor_shutdown",
        Ok(pb::RunState::Lost) => "lost",
        _ => "unknown",
    }
}

fn is_live(run: &pb::Run) -> bool {
    matches!(
        pb::RunState::try_from(run.state),
        Ok(pb::RunState::Starting | pb::RunState::Running)
    )
}

/// A run as JSON.
pub fn run_json(run: &pb::Run) -> serde_json::Value {
    json!({
        "run_id": run.run_id,
        "owner": run.owner,
        "subject": run.subject,
        "state": state_name(run.state),
        "created_at": run.created_at.map(|t| t.seconds),
        "ended_at": run.ended_at.map(|t| t.seconds),
        "expires_at": run.expires_at.map(|t| t.seconds),
        "report": run.report.as_ref().map(|r| json!({
            "reason": r.reason,
            "duration_ms": r.duration_ms,
            "exit_code": r.exit_code,
            "signal": r.signal,
            "peak_memory_bytes": r.peak_memory_bytes,
            "last_tool_call_id": r.last_tool_call_id,
            "routes_used": r.routes_used,
            "output_truncated": r.output_truncated,
            "cleanup_errors": r.cleanup_errors,
            "landlock_abi": r.landlock_abi,
        })),
    })
}

fn run_text(run: &pb::Run) -> String {
    let mut lines = vec![
        format!("{:<11}{}", "run", run.run_id),
        format!("{:<11}{}", "state", state_name(run.state)),
        format!("{:<11}{} (owner {})", "subject", run.subject, run.owner),
        format!(
            "{:<11}{}",
            "started",
            show::time_text(run.created_at.as_ref())
        ),
        format!(
            "{:<11}{}",
            "expires",
            show::time_text(run.expires_at.as_ref())
        ),
    ];
    if let Some(report) = &run.report {
        lines.push(format!(
            "{:<11}{}",
            "ended",
            show::time_text(run.ended_at.as_ref())
        ));
        lines.push(format!("{:<11}{}", "reason", report.reason));
        if let Some(code) = report.exit_code {
            lines.push(format!("{:<11}{code}", "exit code"));
        }
        if let Some(signal) = report.signal {
            lines.push(format!("{:<11}{signal}", "signal"));
        }
        lines.push(format!("{:<11}{} ms", "duration", report.duration_ms));
        if let Some(peak) = report.peak_memory_bytes {
            lines.push(format!("{:<11}{peak} bytes", "peak mem"));
        }
        if report.landlock_abi > 0 {
            lines.push(format!("{:<11}ABI v{}", "landlock", report.landlock_abi));
        }
        if report.output_truncated {
            lines.push(format!(
                "{:<11}output beyond the receipt's limit was dropped",
                "output"
            ));
        }
        let cleanup = if report.cleanup_errors.is_empty() {
            "complete: no process, cgroup or directory left".to_owned()
        } else {
            report.cleanup_errors.join("; ")
        };
        lines.push(format!("{:<11}{cleanup}", "teardown"));
    }
    lines.join("\n")
}

/// `tollgate run`.
pub async fn run(global: &GlobalArgs, receipt: &Path, argv: Vec<String>) -> Result<(), CliError> {
    let not_started = |e: CliError| CliError::RunNotStarted(e.to_string());
    let text = read_input(receipt).map_err(not_started)?;
    let token = global.tokens().token().map_err(not_started)?;
    let mut client = connect_supervisor(&global.supervisor)
        .await
        .map_err(not_started)?;
    let started = client
        .start_run(authed(
            &token,
            pb::StartRunRequest {
                receipt: text.trim().to_owned(),
                argv,
            },
        )?)
        .await
        .map_err(|status| not_started(status.into()))?
        .into_inner();
    let mut events = client
        .watch_run(authed(
            &token,
            pb::WatchRunRequest {
                run_id: started.run_id.clone(),
            },
        )?)
        .await?
        .into_inner();
    while let Some(event) = events.next().await {
        match event?.event {
            Some(pb::run_event::Event::Output(chunk)) => {
                // The agent's bytes, unchanged; a closed stdout is not our error to report.
                let _ = if chunk.stream == pb::OutputStream::Stderr as i32 {
                    std::io::stderr().write_all(&chunk.data)
                } else {
                    std::io::stdout().write_all(&chunk.data)
                };
            }
            Some(pb::run_event::Event::Ended(run)) => {
                let _ = std::io::stdout().flush();
                let report = run.report.unwrap_or_default();
                let exited = run.state == pb::RunState::Exited as i32;
                return match (report.exit_code, report.signal) {
                    (Some(0), _) if exited => Ok(()),
                    (Some(code), _) if exited => Err(CliError::RunEnded {
                        code: u8::try_from(code).unwrap_or(1),
                        reason: String::new(),
                    }),
                    (_, Some(signal)) if exited => Err(CliError::RunEnded {
                        code: 128u8.saturating_add(u8::try_from(signal).unwrap_or(0)),
                        reason: String::new(),
                    }),
                    _ => Err(CliError::RunEnded {
                        code: 137,
                        reason: format!(
                            "run {} ended: {} ({})",
                            run.run_id,
                            state_name(run.state),
                            report.reason
                        ),
                    }),
                };
            }
            None => {}
        }
    }
    Err(CliError::Other(
        "the supervisor closed the run's stream early".into(),
    ))
}

/// `tollgate ps`.
pub async fn ps(global: &GlobalArgs, all: bool, json: bool) -> Result<(), CliError> {
    let token = global.tokens().token()?;
    let mut client = connect_supervisor(&global.supervisor).await?;
    let runs = client
        .list_runs(authed(&token, pb::ListRunsRequest {})?)
        .await?
        .into_inner()
        .runs;
    if !json {
        println!(
            "{:<38}{:<18}{:<20}{:<22}REASON",
            "RUN", "STATE", "SUBJECT", "STARTED"
        );
    }
    for run in runs.iter().filter(|run| all || is_live(run)) {
        if json {
            println!("{}", run_json(run));
        } else {
            println!(
                "{:<38}{:<18}{:<20}{:<22}{}",
                run.run_id,
                state_name(run.state),
                run.subject,
                show::time_text(run.created_at.as_ref()),
                run.report.as_ref().map(|r| r.reason.as_str()).unwrap_or("")
            );
        }
    }
    Ok(())
}

/// `tollgate inspect`.
pub async fn inspect(global: &GlobalArgs, run_id: &str, json: bool) -> Result<(), CliError> {
    let token = global.tokens().token()?;
    let mut client = connect_supervisor(&global.supervisor).await?;
    let run = client
        .get_run(authed(
            &token,
            pb::GetRunRequest {
                run_id: run_id.to_owned(),
            },
        )?)
        .await?
        .into_inner();
    if json {
        println!("{}", run_json(&run));
    } else {
        println!("{}", run_text(&run));
    }
    Ok(())
}

/// `tollgate stop`.
pub async fn stop(global: &GlobalArgs, run_id: String, reason: String) -> Result<(), CliError> {
    let token = global.tokens().token()?;
    let mut client = connect_supervisor(&global.supervisor).await?;
    let stopped = client
        .stop_run(authed(&token, pb::StopRunRequest { run_id, reason })?)
        .await?
        .into_inner();
    if let Some(run) = stopped.run {
        println!("{}", run_text(&run));
    }
    Ok(())
}
