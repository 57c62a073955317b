//! `tollgate approvals`, `approve` and `deny`: the calls waiting for an operator on the
//! supervisor, and deciding them; `narrow` and `widen`: changing a live run's powers.

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
                    out!("{}", pending_json(&call))?;
                } else {
                    say!("{}", pending_line(&call))?;
                }
            }
            Some(pb::approval_event::Event::Decided(decided)) => {
                if json {
                    out!("{}", decided_json(&decided))?;
                } else {
                    say!("{}", decided_line(&decided))?;
                }
            }
            Some(pb::approval_event::Event::CaughtUp(_)) => {
                if !watch {
                    if waiting == 0 && !json {
                        say!("no call waits for approval")?;
                    }
                    return Ok(());
                }
                if !json {
                    say!("(waiting for new calls; Ctrl-C to stop)")?;
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
        out!("{}", decided_json(&decided))?;
    } else {
        say!("{}", decided_line(&decided))?;
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
            "fs.write {} ({}, {})",
            call.path,
            show::size(call.bytes),
            call.mode
                .strip_prefix("WRITE_MODE_")
                .unwrap_or(&call.mode)
                .to_ascii_lowercase()
        ),
        "model.complete" => format!(
            "a model call on route {} ({} of text, classified {}{})",
            call.path,
            show::size(call.bytes),
            call.sensitivity,
            if call.reasons.is_empty() {
                String::new()
            } else {
                format!(": {}", call.reasons.join(", "))
            }
        ),
        "egress" => format!("a connection to {}", call.path),
        "exec" => format!(
            "the command {} in {} ({} of stdin)",
            command_line(&call.argv),
            call.cwd,
            show::size(call.bytes)
        ),
        tool => format!("{tool} {}", call.path),
    }
}

/// A command line as an operator reads it: plain words as they are, anything else quoted
/// with its control characters escaped (the agent chose every byte of it).
fn command_line(argv: &[String]) -> String {
    argv.iter()
        .map(|arg| {
            let plain = !arg.is_empty()
                && arg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
            if plain {
                arg.clone()
            } else {
                format!("{arg:?}")
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
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
        " (remembered for this tool and path, or command line, for the rest of the run)"
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
        "sensitivity": call.sensitivity,
        "reasons": call.reasons,
        "argv": call.argv,
        "cwd": call.cwd,
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

/// A size flag's bytes (0 when not given).
fn size(field: &str, text: Option<String>) -> Result<u64, CliError> {
    text.map(|text| {
        tollgate_receipt::spec::parse_size(field, &text).map_err(|e| CliError::Input(e.to_string()))
    })
    .transpose()
    .map(Option::unwrap_or_default)
}

/// What `tollgate narrow` was asked to take away.
pub(crate) struct NarrowArgs {
    /// Granted host paths to drop.
    pub drop_fs: Vec<String>,
    /// The new tool-call budget.
    pub tool_calls: Option<u64>,
    /// The new model-token budget.
    pub tokens: Option<u64>,
    /// The new output budget, as given.
    pub output_bytes: Option<String>,
    /// The new outbound-bytes budget, as given.
    pub egress_bytes: Option<String>,
    /// Gateway-only programs to take away.
    pub drop_gateway_exec: Vec<String>,
    /// How long from now the run ends, as given.
    pub expires_in: Option<String>,
}

/// `tollgate narrow RUN [--drop PATH]... [--tool-calls N] [--tokens N] [--output-bytes SIZE]
/// [--egress-bytes SIZE] [--expires-in DURATION]`: takes powers away from a live run (no
/// signature needed; the run's owner or an admin).
pub(crate) async fn narrow(
    global: &GlobalArgs,
    run_id: String,
    asked: NarrowArgs,
    json: bool,
) -> Result<(), CliError> {
    let expires_at = asked
        .expires_in
        .map(|text| {
            tollgate_receipt::spec::parse_duration("--expires-in", &text)
                .map(|d| {
                    let seconds = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
                    tollgate_receipt::timestamp_from_unix(
                        tollgate_receipt::unix_now().saturating_add(seconds),
                    )
                })
                .map_err(|e| CliError::Input(e.to_string()))
        })
        .transpose()?;
    let narrowing = pb::Narrowing {
        output_bytes: size("--output-bytes", asked.output_bytes)?,
        egress_bytes: size("--egress-bytes", asked.egress_bytes)?,
        drop_fs: asked.drop_fs,
        tool_calls: asked.tool_calls.unwrap_or(0),
        tokens: asked.tokens.unwrap_or(0),
        drop_gateway_exec: asked.drop_gateway_exec,
        expires_at,
    };
    if narrowing == pb::Narrowing::default() {
        return Err(CliError::Input(
            "nothing to narrow: give --drop PATH, --drop-exec PROGRAM, --tool-calls N, --tokens N, --output-bytes SIZE, --egress-bytes SIZE or --expires-in DURATION".into(),
        ));
    }
    if asked.tool_calls == Some(0) || asked.tokens == Some(0) {
        return Err(CliError::Input(
            "a budget of 0 is not a narrowing: give at least 1 (or stop the run)".into(),
        ));
    }
    apply(
        global,
        run_id,
        pb::amend_run_request::Change::Narrow(narrowing),
        json,
    )
    .await
}

/// What `tollgate widen` was asked to add.
pub(crate) struct WidenArgs {
    /// Grants to add, as given (`PATH[:read|:write][:ask]`).
    pub fs: Vec<String>,
    /// The new tool-call budget.
    pub tool_calls: Option<u64>,
    /// The new model-token budget.
    pub tokens: Option<u64>,
    /// The new output budget, as given.
    pub output_bytes: Option<String>,
    /// The new outbound-bytes budget, as given.
    pub egress_bytes: Option<String>,
    /// Gateway-only programs to add, as given (`PROGRAM[:ask]`).
    pub gateway_exec: Vec<String>,
    /// How much later the run ends, as given.
    pub extend: Option<String>,
    /// Whether the run's future children may be granted it too.
    pub for_children: bool,
}

/// `tollgate widen RUN [--fs PATH[:read|:write][:ask]]... [--tool-calls N] [--extend
/// DURATION] [--for-children]`: asks the authority for a signed amendment, then has the
/// supervisor apply it.
pub(crate) async fn widen(
    global: &GlobalArgs,
    run_id: String,
    asked: WidenArgs,
    json: bool,
) -> Result<(), CliError> {
    let WidenArgs {
        fs,
        tool_calls,
        tokens,
        output_bytes,
        egress_bytes,
        gateway_exec,
        extend,
        for_children,
    } = asked;
    let add_gateway_exec = gateway_exec
        .iter()
        .map(|spec| {
            let (program, ask) = match spec.strip_suffix(":ask") {
                Some(program) => (program, true),
                None => (spec.as_str(), false),
            };
            if !program.starts_with('/') {
                return Err(CliError::Input(format!(
                    "--gateway-exec {spec:?}: give the program's absolute path in the sandbox, then :ask to have each command approved"
                )));
            }
            Ok(pb::GatewayExecGrant {
                program: program.to_owned(),
                ask,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let add_fs = fs
        .iter()
        .map(|spec| fs_grant(spec))
        .collect::<Result<Vec<_>, _>>()?;
    let extend_seconds = extend
        .map(|text| {
            tollgate_receipt::spec::parse_duration("--extend", &text)
                .map(|d| d.as_secs())
                .map_err(|e| CliError::Input(e.to_string()))
        })
        .transpose()?
        .unwrap_or(0);
    let token = global.tokens().token()?;
    let mut authority = crate::client::connect(&global.authority, &global.tls()).await?;
    let amended = authority
        .amend_receipt(authed(
            &token,
            pb::AmendReceiptRequest {
                receipt_id: run_id.clone(),
                add_fs,
                tool_calls: tool_calls.unwrap_or(0),
                extend_seconds,
                for_children,
                tokens: tokens.unwrap_or(0),
                output_bytes: size("--output-bytes", output_bytes)?,
                egress_bytes: size("--egress-bytes", egress_bytes)?,
                add_gateway_exec,
            },
        )?)
        .await?
        .into_inner();
    let signed = amended.signed.ok_or_else(|| {
        CliError::Input("the authority answered without a signed amendment".into())
    })?;
    apply(
        global,
        run_id,
        pb::amend_run_request::Change::Amendment(signed),
        json,
    )
    .await
}

/// `PATH`, `PATH:read`, `PATH:write`, with `:ask` after either, then `:ask-reads`.
fn fs_grant(spec: &str) -> Result<pb::FsGrant, CliError> {
    let (rest, ask_reads) = match spec.strip_suffix(":ask-reads") {
        Some(rest) => (rest, true),
        None => (spec, false),
    };
    let (rest, ask) = match rest.strip_suffix(":ask") {
        Some(rest) => (rest, true),
        None => (rest, false),
    };
    let (path, access) = match rest.rsplit_once(':') {
        Some((path, "write")) => (path, pb::FsAccess::Write),
        Some((path, "read")) => (path, pb::FsAccess::Read),
        _ => (rest, pb::FsAccess::Read),
    };
    if !path.starts_with('/') {
        return Err(CliError::Input(format!(
            "--fs {spec:?}: give an absolute host path, optionally :read or :write, then :ask, then :ask-reads"
        )));
    }
    Ok(pb::FsGrant {
        path: path.to_owned(),
        access: access as i32,
        ask,
        ask_reads,
        ..Default::default()
    })
}

async fn apply(
    global: &GlobalArgs,
    run_id: String,
    change: pb::amend_run_request::Change,
    json: bool,
) -> Result<(), CliError> {
    let token = global.supervisor_tokens().token()?;
    let mut client = connect_supervisor(&global.supervisor, &global.tls()).await?;
    let after = client
        .amend_run(authed(
            &token,
            pb::AmendRunRequest {
                run_id,
                change: Some(change),
            },
        )?)
        .await?
        .into_inner();
    if json {
        out!(
            "{}",
            json!({
                "fs": after.fs.iter().map(|g| json!({
                    "path": g.path,
                    "access": if g.access == pb::FsAccess::Write as i32 { "write" } else { "read" },
                    "mount": g.mount,
                    "ask": g.ask,
                })).collect::<Vec<_>>(),
                "gateway_exec": after.gateway_exec.iter().map(|g| json!({
                    "program": g.program,
                    "ask": g.ask,
                })).collect::<Vec<_>>(),
                "tool_calls": after.tool_calls,
                "tokens": after.tokens,
                "output_bytes": after.output_bytes,
                "egress_bytes": after.egress_bytes,
                "expires_at": after.expires_at.map(|t| t.seconds),
            })
        )?;
        return Ok(());
    }
    for grant in &after.fs {
        let access = if grant.access == pb::FsAccess::Write as i32 {
            "write"
        } else {
            "read"
        };
        let mount = if grant.mount.is_empty() {
            " (gateway only)".to_owned()
        } else {
            format!(" -> {}", grant.mount)
        };
        let ask = if grant.ask { ", asks" } else { "" };
        say!("fs         {access:<5} {}{mount}{ask}", grant.path)?;
    }
    for program in &after.gateway_exec {
        let ask = if program.ask { ", asks" } else { "" };
        say!("exec       {} (gateway only{ask})", program.program)?;
    }
    say!("tool_calls {}", after.tool_calls)?;
    if after.tokens != 0 {
        say!("tokens     {}", after.tokens)?;
    }
    say!("output     {}", show::size(after.output_bytes))?;
    say!("egress     {} each way", show::size(after.egress_bytes))?;
    say!("expires    {}", show::time_text(after.expires_at.as_ref()))?;
    Ok(())
}
