//! `tollgate run`, `ps`, `inspect`, `stop`: the supervisor side of the CLI.

use std::io::Write as _;
use std::path::Path;

use serde_json::json;
use tokio_stream::StreamExt as _;
use tollgate_proto::v1 as pb;

use crate::args::GlobalArgs;
use crate::client::{authed, connect_supervisor};
use crate::error::CliError;
use crate::files::read_input;
use crate::show;

fn is_live(run: &pb::Run) -> bool {
    matches!(
        pb::RunState::try_from(run.state),
        Ok(pb::RunState::Starting | pb::RunState::Running)
    )
}

/// A run as JSON.
pub(crate) fn run_json(run: &pb::Run) -> serde_json::Value {
    json!({
        "run_id": run.run_id,
        "owner": run.owner,
        "subject": run.subject,
        "state": show::run_state_name(run.state),
        "created_at": run.created_at.map(|t| t.seconds),
        "ended_at": run.ended_at.map(|t| t.seconds),
        "expires_at": run.expires_at.map(|t| t.seconds),
        "parent_run_id": (!run.parent_run_id.is_empty()).then_some(&run.parent_run_id),
        "depth": run.depth,
        "model_usage": usage_json(&run.model_usage),
        "workspace_keep_seconds": run.workspace_keep_seconds,
        "report": run.report.as_ref().map(|r| json!({
            "reason": r.reason,
            "duration_ms": r.duration_ms,
            "exit_code": r.exit_code,
            "signal": r.signal,
            "peak_memory_bytes": r.peak_memory_bytes,
            "last_tool_call_id": r.last_tool_call_id,
            "routes_used": r.routes_used,
            "route_usage": usage_json(&r.route_usage),
            "output_truncated": r.output_truncated,
            "cleanup_errors": r.cleanup_errors,
            "landlock_abi": r.landlock_abi,
            "workspace": (!r.workspace.is_empty()).then_some(&r.workspace),
            "workspace_kept_until": (r.workspace_kept_until > 0).then_some(r.workspace_kept_until),
        })),
    })
}

/// Model use per route, as JSON.
fn usage_json(usage: &[pb::RouteUsage]) -> serde_json::Value {
    usage
        .iter()
        .map(|u| {
            json!({
                "route": u.route,
                "calls": u.calls,
                "prompt_tokens": u.prompt_tokens,
                "completion_tokens": u.completion_tokens,
            })
        })
        .collect()
}

/// Model use per route, for people: `local: 3 calls, 1200 + 340 tokens`.
fn usage_line(usage: &[pb::RouteUsage]) -> String {
    if usage.is_empty() {
        return "none".to_owned();
    }
    usage
        .iter()
        .map(|u| {
            format!(
                "{}: {} call{}, {} + {} tokens",
                u.route,
                u.calls,
                if u.calls == 1 { "" } else { "s" },
                u.prompt_tokens,
                u.completion_tokens
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A run for people, one entry a line (each printed escaped: see `human`).
fn run_lines(run: &pb::Run) -> Vec<String> {
    let mut lines = vec![
        format!("{:<11}{}", "run", run.run_id),
        format!("{:<11}{}", "state", show::run_state_name(run.state)),
        format!("{:<11}{} (owner {})", "subject", run.subject, run.owner),
        format!(
            "{:<11}{}",
            "parent",
            if run.parent_run_id.is_empty() {
                "none (started by an operator)".to_owned()
            } else {
                format!("{} (delegated, depth {})", run.parent_run_id, run.depth)
            }
        ),
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
        format!("{:<11}{}", "models", usage_line(&run.model_usage)),
        format!("{:<11}{}", "workspace", workspace_line(run)),
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
            lines.push(format!("{:<11}{}", "peak mem", show::size(peak)));
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
        let cleanup = if !report.cleanup_errors.is_empty() {
            report.cleanup_errors.join("; ")
        } else if report.workspace.is_empty() {
            "complete: no process, cgroup or directory left".to_owned()
        } else {
            "complete: no process or cgroup left; /work kept (see workspace)".to_owned()
        };
        lines.push(format!("{:<11}{cleanup}", "teardown"));
    }
    lines
}

/// Where a run's `/work` is, or goes, for people: its receipt's keep setting, and once the
/// run has ended, where it was kept and until when.
fn workspace_line(run: &pb::Run) -> String {
    let keep = run.workspace_keep_seconds;
    let kept = run.report.as_ref().filter(|r| !r.workspace.is_empty());
    match (&run.report, kept) {
        (_, Some(report)) => {
            let until = timestamp(report.workspace_kept_until);
            format!(
                "kept at {} until {} ({}; `tollgate cp {}:/work/...`)",
                report.workspace,
                show::time_text(Some(&until)),
                show::relative(Some(&until)),
                run.run_id
            )
        }
        (Some(_), None) => "removed at teardown".to_owned(),
        (None, None) if keep == 0 => "removed when the run ends".to_owned(),
        (None, None) => format!(
            "kept {} after the run ends",
            span_text(keep.try_into().unwrap_or(i64::MAX))
        ),
    }
}

/// A Unix time as the protocol's timestamp.
fn timestamp(seconds: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: i64::try_from(seconds).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

/// `tollgate run`.
pub(crate) async fn run(
    global: &GlobalArgs,
    receipt: &Path,
    argv: Vec<String>,
    input: RunInput,
) -> Result<(), CliError> {
    let not_started = |e: CliError| CliError::RunNotStarted(e.to_string());
    if input != RunInput::None && receipt == Path::new("-") {
        return Err(not_started(CliError::Input(
            "with -i or -t stdin is the agent's: give the receipt as a file, not \"-\"".into(),
        )));
    }
    let text = read_input(receipt).map_err(not_started)?;
    let token = global.supervisor_tokens().token().map_err(not_started)?;
    let mut client = connect_supervisor(&global.supervisor, &global.tls())
        .await
        .map_err(not_started)?;
    let started = client
        .start_run(authed(
            &token,
            pb::StartRunRequest {
                receipt: text.trim().to_owned(),
                argv,
                stdin: input != RunInput::None,
                terminal: (input == RunInput::Terminal).then(crate::terminal::size),
            },
        )?)
        .await
        .map_err(|status| not_started(status.into()))?
        .into_inner();
    match input {
        RunInput::None => follow(&mut client, &token, &started.run_id, Display::Plain).await,
        RunInput::Stdin | RunInput::Terminal => {
            let terminal = input == RunInput::Terminal;
            // The run's own input: its end is the agent's end of input.
            let attached = crate::terminal::attach(
                &mut client,
                &token,
                &started.run_id,
                terminal,
                crate::terminal::AtEndOfInput::CloseInput,
            )
            .await?;
            show_events(attached.events, &started.run_id, Display::Plain).await
        }
    }
}

/// `tollgate attach RUN`: raw mode when this is a terminal (the run's may be a pipe: keys are
/// then sent as typed, without local line editing). The end of stdin detaches this attach
/// only; `read_only` sends nothing at all (the run's output, as `watch` without the status
/// line).
pub(crate) async fn attach(
    global: &GlobalArgs,
    run_id: &str,
    read_only: bool,
) -> Result<(), CliError> {
    use std::io::IsTerminal as _;
    let token = global.supervisor_tokens().token()?;
    let mut client = connect_supervisor(&global.supervisor, &global.tls()).await?;
    if read_only {
        // WatchRun carries no input at all: nothing this process reads can reach the agent.
        return follow(&mut client, &token, run_id, Display::Plain).await;
    }
    let attached = crate::terminal::attach(
        &mut client,
        &token,
        run_id,
        std::io::stdin().is_terminal(),
        crate::terminal::AtEndOfInput::Detach,
    )
    .await?;
    let _raw = attached.raw;
    let mut detached = attached.detached;
    tokio::select! {
        shown = show_events(attached.events, run_id, Display::Plain) => shown,
        // Only this attach ends; the agent's input stays open for everyone else.
        Ok(()) = &mut detached => Ok(()),
    }
}

/// What `tollgate run` gives the agent as stdin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunInput {
    /// Nothing (/dev/null).
    None,
    /// This process's stdin (`-i`).
    Stdin,
    /// A terminal inside the sandbox, wired to this one (`-t`).
    Terminal,
}

/// How `follow` shows a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Display {
    /// The agent's bytes only.
    Plain,
    /// The agent's bytes and, on a terminal, a status line on stderr.
    Progress,
    /// JSON lines.
    Json,
}

/// `tollgate watch RUN`.
pub(crate) async fn watch(global: &GlobalArgs, run_id: &str, json: bool) -> Result<(), CliError> {
    use std::io::IsTerminal as _;
    let token = global.supervisor_tokens().token()?;
    let mut client = connect_supervisor(&global.supervisor, &global.tls()).await?;
    let display = if json {
        Display::Json
    } else if std::io::stderr().is_terminal() {
        Display::Progress
    } else {
        Display::Plain
    };
    follow(&mut client, &token, run_id, display).await
}

/// Streams a run's output until it ends; the result carries the agent's exit status.
async fn follow(
    client: &mut pb::supervisor_client::SupervisorClient<tonic::transport::Channel>,
    token: &str,
    run_id: &str,
    display: Display,
) -> Result<(), CliError> {
    let events = client
        .watch_run(authed(
            token,
            pb::WatchRunRequest {
                run_id: run_id.to_owned(),
            },
        )?)
        .await?
        .into_inner();
    show_events(events, run_id, display).await
}

/// Shows a run's events (output, then its end) as `display` asks; the result carries the
/// agent's exit status.
async fn show_events(
    mut events: tonic::Streaming<pb::RunEvent>,
    run_id: &str,
    display: Display,
) -> Result<(), CliError> {
    let started = std::time::Instant::now();
    let mut bytes = 0usize;
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
    let clear = || {
        if display == Display::Progress {
            crate::out::stderr("\r\x1b[2K");
        }
    };
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            _ = tick.tick() => {
                if display == Display::Progress {
                    crate::out::stderr(&format!(
                        "\r\x1b[2K[tollgate] {run_id}: running {:.1} s, {} of output",
                        started.elapsed().as_secs_f64(),
                        bytesize::ByteSize(bytes as u64)
                    ));
                }
                continue;
            }
        };
        // The stream ends before the run's end only when the supervisor goes away: a stop,
        // a crash, or a restart (with --live-restore the run goes on, and a new supervisor
        // has it).
        let gone = || CliError::SupervisorGone {
            run_id: run_id.to_owned(),
        };
        let event = match event {
            Some(Ok(event)) => event,
            Some(Err(status)) if lost_connection(&status) => {
                clear();
                return Err(gone());
            }
            Some(Err(status)) => return Err(status.into()),
            None => {
                clear();
                return Err(gone());
            }
        };
        match event.event {
            Some(pb::run_event::Event::Output(chunk)) => {
                bytes += chunk.data.len();
                show_output(&chunk, display)?;
            }
            Some(pb::run_event::Event::Ended(run)) => {
                clear();
                return run_ended(run, run_id, display, started.elapsed());
            }
            None => {}
        }
    }
}

/// Whether `status` is the connection failing under a stream (made by the client's own
/// transport, or the server going away), not the daemon's answer.
fn lost_connection(status: &tonic::Status) -> bool {
    std::error::Error::source(status).is_some()
        || matches!(
            status.code(),
            tonic::Code::Unavailable | tonic::Code::Cancelled
        )
}

/// One chunk of the agent's output, as `display` shows it.
fn show_output(chunk: &pb::OutputChunk, display: Display) -> Result<(), CliError> {
    let stderr = chunk.stream == pb::OutputStream::Stderr as i32;
    if display == Display::Json {
        out!(
            "{}",
            serde_json::json!({
                "event": "output",
                "stream": if stderr { "stderr" } else { "stdout" },
                "text": String::from_utf8_lossy(&chunk.data),
            })
        )?;
        return Ok(());
    }
    if display == Display::Progress {
        // Clears the status line before the agent's bytes.
        crate::out::stderr("\r\x1b[2K");
    }
    // The agent's bytes, unchanged. Its stderr goes to ours, where a failure has nowhere
    // left to be reported; its stdout goes through `out`, so a failed write ends the command.
    if stderr {
        let _ = std::io::stderr().write_all(&chunk.data);
        Ok(())
    } else {
        crate::out::bytes(&chunk.data)
    }
}

/// The end of a followed run, shown as `display` asks; the result carries the agent's exit
/// status.
fn run_ended(
    run: pb::Run,
    run_id: &str,
    display: Display,
    elapsed: std::time::Duration,
) -> Result<(), CliError> {
    std::io::stdout().flush().map_err(crate::out::error)?;
    if display == Display::Json {
        out!(
            "{}",
            serde_json::json!({"event": "ended", "run": run_json(&run)})
        )?;
    }
    if display == Display::Progress {
        say_err!(
            "[tollgate] {run_id}: {} after {:.1} s ({})",
            show::run_state_name(run.state),
            elapsed.as_secs_f64(),
            run.report.as_ref().map_or("", |r| r.reason.as_str())
        );
    }
    let report = run.report.unwrap_or_default();
    let exited = run.state == pb::RunState::Exited as i32;
    match (report.exit_code, report.signal) {
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
                show::run_state_name(run.state),
                report.reason
            ),
        }),
    }
}

/// `tollgate ps`.
pub(crate) async fn ps(global: &GlobalArgs, all: bool, json: bool) -> Result<(), CliError> {
    let token = global.supervisor_tokens().token()?;
    let mut client = connect_supervisor(&global.supervisor, &global.tls()).await?;
    let runs = client
        .list_runs(authed(&token, pb::ListRunsRequest { live_only: !all })?)
        .await?
        .into_inner()
        .runs;
    // The supervisor sends only live runs without `-a`; filtered here too, for one that
    // predates `live_only` and sends every run.
    let shown = runs.iter().filter(|run| all || is_live(run));
    if json {
        for run in shown {
            out!("{}", run_json(run))?;
        }
    } else {
        for line in ps_lines(shown) {
            out!("{line}")?;
        }
    }
    Ok(())
}

/// `tollgate ps` for people: columns as wide as their content (escaped: print as they are).
fn ps_lines<'a>(runs: impl Iterator<Item = &'a pb::Run>) -> Vec<String> {
    let mut rows = vec![["RUN", "STATE", "SUBJECT", "STARTED", "REASON"]
        .map(String::from)
        .to_vec()];
    for run in runs {
        rows.push(vec![
            run.run_id.clone(),
            show::run_state_name(run.state).to_owned(),
            run.subject.clone(),
            show::time_text(run.created_at.as_ref()),
            run.report
                .as_ref()
                .map(|r| r.reason.clone())
                .unwrap_or_default(),
        ]);
    }
    crate::human::table(&rows)
}

/// `tollgate inspect`.
pub(crate) async fn inspect(global: &GlobalArgs, run_id: &str, json: bool) -> Result<(), CliError> {
    let token = global.supervisor_tokens().token()?;
    let mut client = connect_supervisor(&global.supervisor, &global.tls()).await?;
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
        out!("{}", run_json(&run))?;
    } else {
        for line in run_lines(&run) {
            say!("{line}")?;
        }
    }
    Ok(())
}

/// `tollgate stop`.
pub(crate) async fn stop(
    global: &GlobalArgs,
    run_id: String,
    reason: String,
) -> Result<(), CliError> {
    let token = global.supervisor_tokens().token()?;
    let mut client = connect_supervisor(&global.supervisor, &global.tls()).await?;
    let stopped = client
        .stop_run(authed(&token, pb::StopRunRequest { run_id, reason })?)
        .await?
        .into_inner();
    if let Some(run) = stopped.run {
        for line in run_lines(&run) {
            say!("{line}")?;
        }
    }
    Ok(())
}

/// A duration in seconds as `2m10s` (`45s`, `3h02m`, `2d04h`).
fn span_text(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// One line of `tollgate tree`: the run (or pending child) with its branch drawing.
struct TreeRow {
    prefix: String,
    run_id: String,
    subject: String,
    state: String,
    age: String,
    expires: String,
}

/// The branch drawing of each entry of a pre-order listing: `depths[i]` is entry i's depth
/// relative to the root (0 for the root).
fn branch_prefixes(depths: &[u32]) -> Vec<String> {
    (0..depths.len())
        .map(|i| {
            let depth = depths[i];
            if depth == 0 {
                return String::new();
            }
            // Whether a later entry is a sibling at `level` before the subtree closes.
            let continues = |level: u32| {
                depths[i + 1..]
                    .iter()
                    .take_while(|d| **d >= level)
                    .any(|d| *d == level)
            };
            let mut prefix: String = (1..depth)
                .map(|level| if continues(level) { "│   " } else { "    " })
                .collect();
            prefix.push_str(if continues(depth) {
                "├── "
            } else {
                "└── "
            });
            prefix
        })
        .collect()
}

/// `tollgate tree`.
pub(crate) async fn tree(global: &GlobalArgs, run_id: &str, json: bool) -> Result<(), CliError> {
    let token = global.supervisor_tokens().token()?;
    let mut client = connect_supervisor(&global.supervisor, &global.tls()).await?;
    let tree = client
        .get_run_tree(authed(
            &token,
            pb::GetRunTreeRequest {
                run_id: run_id.to_owned(),
            },
        )?)
        .await?
        .into_inner();
    if json {
        return print_tree_json(&tree);
    }
    let mut entries = tree_rows(&tree, tollgate_receipt::unix_now());
    let depths: Vec<u32> = entries.iter().map(|(d, _)| *d).collect();
    for ((_, row), prefix) in entries.iter_mut().zip(branch_prefixes(&depths)) {
        row.prefix = prefix;
    }
    let width = entries
        .iter()
        .map(|(_, r)| r.prefix.chars().count() + r.run_id.len())
        .max()
        .unwrap_or(3)
        + 2;
    say!(
        "{:<width$}{:<16}{:<16}{:<8}EXPIRES",
        "RUN",
        "SUBJECT",
        "STATE",
        "AGE"
    )?;
    for (_, row) in &entries {
        let name = format!("{}{}", row.prefix, row.run_id);
        let pad = width.saturating_sub(name.chars().count());
        say!(
            "{name}{:pad$}{:<16}{:<16}{:<8}{}",
            "",
            row.subject,
            row.state,
            row.age,
            row.expires
        )?;
    }
    Ok(())
}

/// `tollgate tree --json`: one object per run, then one per pending child.
fn print_tree_json(tree: &pb::RunTree) -> Result<(), CliError> {
    for run in &tree.runs {
        let mut line = run_json(run);
        line["exit_code"] = json!(run.report.as_ref().and_then(|r| r.exit_code));
        out!("{line}")?;
    }
    for child in &tree.pending {
        out!(
            "{}",
            json!({
                "run_id": child.receipt_id,
                "parent_run_id": child.parent_run_id,
                "subject": child.subject,
                "state": "minted",
                "expires_at": child.expires_at.map(|t| t.seconds),
            })
        )?;
    }
    Ok(())
}

/// The tree's rows with their depth below the root, each pending child right after its
/// parent's subtree; prefixes not drawn yet.
fn tree_rows(tree: &pb::RunTree, now: i64) -> Vec<(u32, TreeRow)> {
    let root_depth = tree.runs.first().map_or(0, |r| r.depth);
    // Pending children are drawn right after their parent's subtree entries.
    let mut entries: Vec<(u32, TreeRow)> = Vec::new();
    for run in &tree.runs {
        let depth = run.depth.saturating_sub(root_depth);
        let state = match run.report.as_ref().and_then(|r| r.exit_code) {
            Some(code) if run.state == pb::RunState::Exited as i32 => format!("exited ({code})"),
            _ => show::run_state_name(run.state).to_owned(),
        };
        let end = run.ended_at.map_or(now, |t| t.seconds);
        entries.push((
            depth,
            TreeRow {
                prefix: String::new(),
                run_id: run.run_id.clone(),
                subject: run.subject.clone(),
                state,
                age: run
                    .created_at
                    .map_or("-".into(), |t| span_text(end - t.seconds)),
                expires: match run.expires_at {
                    Some(t) if is_live(run) => format!("in {}", span_text(t.seconds - now)),
                    _ => "-".into(),
                },
            },
        ));
    }
    for child in &tree.pending {
        let Some(at) = entries
            .iter()
            .position(|(_, row)| row.run_id == child.parent_run_id)
        else {
            continue;
        };
        let parent_depth = entries[at].0;
        let end = entries[at + 1..]
            .iter()
            .position(|(d, _)| *d <= parent_depth)
            .map_or(entries.len(), |p| at + 1 + p);
        entries.insert(
            end,
            (
                parent_depth + 1,
                TreeRow {
                    prefix: String::new(),
                    run_id: child.receipt_id.clone(),
                    subject: child.subject.clone(),
                    state: "minted".into(),
                    age: "-".into(),
                    expires: child
                        .expires_at
                        .map_or("-".into(), |t| format!("in {}", span_text(t.seconds - now))),
                },
            ),
        );
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branches_are_drawn_from_preorder_depths() {
        // root, a, a1, b, b1, b2
        let got = branch_prefixes(&[0, 1, 2, 1, 2, 2]);
        assert_eq!(
            got,
            ["", "├── ", "│   └── ", "└── ", "    ├── ", "    └── "]
        );
    }

    fn ended_run(workspace: &str, until: u64) -> pb::Run {
        pb::Run {
            run_id: "r1".into(),
            state: pb::RunState::Stopped as i32,
            workspace_keep_seconds: 3600,
            report: Some(pb::TeardownReport {
                reason: "operator asked".into(),
                workspace: workspace.into(),
                workspace_kept_until: until,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_kept_workspace_is_shown_with_its_place_and_time() {
        let run = ended_run("/var/lib/tollgate/workspaces/r1/work", 4_102_444_800);
        let lines = run_lines(&run).join("\n");
        assert!(
            lines.contains("workspace  kept at /var/lib/tollgate/workspaces/r1/work until 2100-01-01T00:00:00Z"),
            "{lines}"
        );
        assert!(!lines.contains("directory left"), "{lines}");
        let json = run_json(&run);
        assert_eq!(json["workspace_keep_seconds"], 3600);
        assert_eq!(
            json["report"]["workspace"],
            "/var/lib/tollgate/workspaces/r1/work"
        );
        assert_eq!(json["report"]["workspace_kept_until"], 4_102_444_800_u64);
        // Removed at teardown: said so, and nothing is left.
        let lines = run_lines(&ended_run("", 0)).join("\n");
        assert!(lines.contains("workspace  removed at teardown"), "{lines}");
        assert!(
            lines.contains("no process, cgroup or directory left"),
            "{lines}"
        );
        // A live run: its keep setting.
        let live = pb::Run {
            report: None,
            ..ended_run("", 0)
        };
        let lines = run_lines(&live).join("\n");
        assert!(
            lines.contains("workspace  kept 1h00m after the run ends"),
            "{lines}"
        );
    }

    #[test]
    fn ps_columns_line_up_whatever_their_content() {
        let run = |id: &str, subject: &str, state: pb::RunState| pb::Run {
            run_id: id.into(),
            subject: subject.into(),
            state: state as i32,
            created_at: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 0,
            }),
            ..Default::default()
        };
        let runs = [
            run(
                "a",
                "an-agent-with-a-rather-long-subject",
                pb::RunState::SupervisorShutdown,
            ),
            run("0193-long-run-id", "s", pb::RunState::Running),
        ];
        let lines = ps_lines(runs.iter());
        let column = |name: &str| lines[0].find(name).unwrap();
        for (line, started) in lines.iter().zip(["STARTED", "2023", "2023"]) {
            assert_eq!(line.find(started), Some(column("STARTED")), "{lines:#?}");
        }
        assert_eq!(
            lines[2].find("running"),
            Some(column("STATE")),
            "{lines:#?}"
        );
    }

    #[test]
    fn peak_memory_is_shown_as_a_size() {
        let run = pb::Run {
            report: Some(pb::TeardownReport {
                peak_memory_bytes: Some(268_435_456),
                ..Default::default()
            }),
            ..Default::default()
        };
        let lines = run_lines(&run);
        assert!(
            lines.iter().any(|l| l == "peak mem   256 MiB"),
            "{lines:#?}"
        );
    }

    #[test]
    fn spans_read_like_a_clock() {
        assert_eq!(span_text(41), "41s");
        assert_eq!(span_text(130), "2m10s");
        assert_eq!(span_text(3 * 3600 + 120), "3h02m");
        assert_eq!(span_text(-5), "0s");
    }
}
