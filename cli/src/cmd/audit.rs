//! `tollgate audit verify|query|export` and `tollgate trace`: reading the daemons' audit logs
//! (`<data-dir>/audit/` of the authority and of each supervisor) from the files themselves.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::json;
use tollgate_audit::{
    verify_dir, AuditKey, AuditReader, CheckpointTrust, Entry, EntryFilter, EntryKind, MetaValue,
    VerifyError, VerifyOptions, VerifyReport,
};

use crate::args::{AuditCommand, AuditTrustArgs};
use crate::error::CliError;

/// How to check logs: the audit key (HMAC) and the trusted checkpoint key.
#[derive(Debug, Clone, Default)]
pub struct Trust {
    /// `--key-file`, else `TOLLGATE_AUDIT_KEY`.
    pub key_file: Option<PathBuf>,
    /// `--checkpoint-key`: hex Ed25519 public key, or a file holding one.
    pub checkpoint_key: Option<String>,
}

impl Trust {
    fn options(&self) -> Result<VerifyOptions, CliError> {
        let key = AuditKey::configured(self.key_file.as_deref())
            .map_err(|e| CliError::Input(e.to_string()))?;
        let trusted_checkpoint_key = match &self.checkpoint_key {
            None => None,
            Some(given) => Some(parse_public_key(given)?),
        };
        Ok(VerifyOptions {
            key,
            trusted_checkpoint_key,
        })
    }
}

impl From<&AuditTrustArgs> for Trust {
    fn from(args: &AuditTrustArgs) -> Self {
        Self {
            key_file: args.key_file.clone(),
            checkpoint_key: args.checkpoint_key.clone(),
        }
    }
}

/// `tollgate audit verify|query|export`.
pub(crate) fn audit_command(command: AuditCommand) -> Result<(), CliError> {
    match command {
        AuditCommand::Verify { logs, trust, json } => verify(&logs, &(&trust).into(), json),
        AuditCommand::Query {
            logs,
            run,
            receipt,
            since,
            json,
        } => {
            let filter = EntryFilter {
                run_id: run,
                receipt_id: receipt,
                since: since.as_deref().map(parse_since).transpose()?,
            };
            query(&logs, &filter, json)
        }
        AuditCommand::Export { logs, since } => {
            export(&logs, since.as_deref().map(parse_since).transpose()?)
        }
    }
}

fn parse_public_key(given: &str) -> Result<ed25519_dalek::VerifyingKey, CliError> {
    let text = if Path::new(given).is_file() {
        std::fs::read_to_string(given)
            .map_err(|e| CliError::Input(format!("cannot read {given}: {e}")))?
    } else {
        given.to_owned()
    };
    // `checkpoint.pub` lines are "<hex key> <key id>": the first word is the key.
    let hex_key = text.split_whitespace().next().unwrap_or_default();
    hex::decode(hex_key)
        .ok()
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .and_then(|bytes| ed25519_dalek::VerifyingKey::from_bytes(&bytes).ok())
        .ok_or_else(|| {
            CliError::Input(format!(
                "--checkpoint-key {given:?} is not an Ed25519 public key (64 hex digits, or a file holding them)"
            ))
        })
}

/// Parses `--since`: an RFC 3339 time (`2026-11-30T10:00:00Z`) or an age (`2h`, `30m`).
pub fn parse_since(text: &str) -> Result<SystemTime, CliError> {
    if let Ok(time) = humantime::parse_rfc3339_weak(text) {
        return Ok(time);
    }
    humantime::parse_duration(text)
        .ok()
        .and_then(|age: Duration| SystemTime::now().checked_sub(age))
        .ok_or_else(|| {
            CliError::Input(format!(
                "--since {text:?} is neither an RFC 3339 time (2026-11-30T10:00:00Z) nor an age (2h, 30m)"
            ))
        })
}

/// The log directories, for a message.
fn listing(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn describe(dir: &Path, report: &VerifyReport) -> Vec<String> {
    let mut lines = vec![format!(
        "{}: intact: {} entries in {} file(s), head entry {}, {} checkpoint(s){}, {}",
        dir.display(),
        report.entries,
        report.files,
        report.head_seq,
        report.checkpoints_checked,
        report
            .last_checkpoint_count
            .map(|count| format!(" (last at entry {count})"))
            .unwrap_or_default(),
        if report.keyed {
            "HMAC-SHA-256 under the audit key"
        } else {
            "plain SHA-256 (no audit key given)"
        },
    )];
    match &report.checkpoint_trust {
        CheckpointTrust::TrustedKey => {}
        CheckpointTrust::BesideLog(path) => lines.push(format!(
            "  note: checkpoints checked against {} beside the log; pass --checkpoint-key to prove who wrote them",
            path.display()
        )),
        CheckpointTrust::NoCheckpoints => lines.push(
            "  warning: no checkpoint yet, so a truncated tail could not be detected".into(),
        ),
    }
    if let Some(count) = report.last_checkpoint_count {
        if report.head_seq > count {
            lines.push(format!(
                "  note: entries {}..{} come after the last checkpoint; truncating them would not be detected",
                count + 1,
                report.head_seq
            ));
        }
    }
    if let Some(torn) = &report.torn_tail {
        lines.push(format!(
            "  warning: {} ends with an incomplete entry of {} bytes at offset {} (a crash mid-write; the writer moves it aside when it next opens the log)",
            torn.file.display(),
            torn.bytes,
            torn.offset
        ));
    }
    for recovered in &report.recovered_tails {
        lines.push(format!(
            "  note: entry {} records {} torn bytes moved to {}",
            recovered.seq,
            recovered.torn_bytes.unwrap_or_default(),
            recovered.torn_file.as_deref().unwrap_or("(not named)")
        ));
    }
    lines
}

/// `tollgate audit verify`: exit 0 only when every log is intact; otherwise the first bad
/// entry of each broken log and why, and exit 1.
pub fn verify(dirs: &[PathBuf], trust: &Trust, json_out: bool) -> Result<(), CliError> {
    let options = trust.options()?;
    let (mut broken, mut unreadable) = (0, 0);
    for dir in dirs {
        match verify_dir(dir, &options) {
            Ok(report) if json_out => out!(
                "{}",
                json!({
                    "log": dir.display().to_string(),
                    "intact": true,
                    "entries": report.entries,
                    "files": report.files,
                    "head_seq": report.head_seq,
                    "head_hash": report.head_hash,
                    "checkpoints": report.checkpoints_checked,
                    "last_checkpoint_count": report.last_checkpoint_count,
                    "keyed": report.keyed,
                    "torn_tail_bytes": report.torn_tail.as_ref().map(|t| t.bytes),
                })
            )?,
            Ok(report) => {
                for line in describe(dir, &report) {
                    say!("{line}")?;
                }
            }
            Err(error @ VerifyError::Broken { .. }) => {
                broken += 1;
                if json_out {
                    out!(
                        "{}",
                        json!({"log": dir.display().to_string(), "intact": false, "problem": error.to_string()})
                    )?;
                } else {
                    say!("{}: BROKEN: {error}", dir.display())?;
                }
            }
            Err(error) => {
                unreadable += 1;
                if json_out {
                    out!(
                        "{}",
                        json!({"log": dir.display().to_string(), "intact": null, "error": error.to_string()})
                    )?;
                } else {
                    say!("{}: cannot verify: {error}", dir.display())?;
                }
            }
        }
    }
    if broken > 0 {
        return Err(CliError::AuditBroken(broken));
    }
    if unreadable > 0 {
        return Err(CliError::Input(format!(
            "{unreadable} audit log(s) could not be read"
        )));
    }
    Ok(())
}

/// Every entry of `dirs` that passes `filter`, with the index of its log, merged in time
/// order. Each log's own order (its seq) is kept even where its clock stepped back: the merge
/// only ever takes the next entry of some log.
fn merged(dirs: &[PathBuf], filter: &EntryFilter) -> Result<Vec<(usize, Entry)>, CliError> {
    let mut logs: Vec<std::collections::VecDeque<Entry>> = Vec::new();
    for dir in dirs {
        let reader = AuditReader::open(dir)
            .map_err(|e| CliError::Input(format!("{}: {e}", dir.display())))?
            .filtered(filter.clone());
        let entries = reader
            .collect::<Result<std::collections::VecDeque<_>, _>>()
            .map_err(|e| CliError::Input(format!("{}: {e}", dir.display())))?;
        logs.push(entries);
    }
    let mut all = Vec::new();
    // RFC 3339 UTC with fixed millisecond precision compares as text.
    while let Some(next) = (0..logs.len())
        .filter(|&i| !logs[i].is_empty())
        .min_by(|&a, &b| logs[a][0].time.cmp(&logs[b][0].time).then(a.cmp(&b)))
    {
        if let Some(entry) = logs[next].pop_front() {
            all.push((next, entry));
        }
    }
    Ok(all)
}

/// A byte count in an entry as a size for people (`256 MiB`); `-` when absent.
fn meta_size(value: Option<&MetaValue>) -> String {
    match value {
        Some(MetaValue::Int(bytes)) => crate::show::size(u64::try_from(*bytes).unwrap_or(0)),
        Some(other) => meta_text(other),
        None => "-".into(),
    }
}

fn meta_text(value: &MetaValue) -> String {
    match value {
        MetaValue::Null => "-".into(),
        MetaValue::Bool(b) => b.to_string(),
        MetaValue::Int(i) => i.to_string(),
        MetaValue::Str(s) => s.clone(),
        MetaValue::List(items) => serde_json::to_string(items).unwrap_or_default(),
    }
}

fn summary(entry: &Entry) -> String {
    let mut parts = Vec::new();
    if let Some(decision) = &entry.decision {
        parts.push(decision.as_str().to_owned());
    }
    if let Some(id) = &entry.receipt_id {
        parts.push(format!("receipt={id}"));
    }
    if let Some(id) = entry
        .run_id
        .as_ref()
        .filter(|id| Some(*id) != entry.receipt_id.as_ref())
    {
        parts.push(format!("run={id}"));
    }
    if let Some(id) = &entry.call_id {
        parts.push(format!("call={id}"));
    }
    for (key, value) in &entry.metadata {
        parts.push(format!("{key}={}", meta_text(value)));
    }
    if let Some(reason) = &entry.reason {
        parts.push(format!("reason={reason:?}"));
    }
    parts.join(" ")
}

/// `tollgate audit query`.
pub fn query(dirs: &[PathBuf], filter: &EntryFilter, json_out: bool) -> Result<(), CliError> {
    for (_, entry) in merged(dirs, filter)? {
        if json_out {
            out!("{}", entry.to_line())?;
        } else {
            say!(
                "{}  {:<10} {:<5} {:<18} {}",
                entry.time,
                entry.component,
                entry.seq,
                entry.kind.as_str(),
                summary(&entry)
            )?;
        }
    }
    Ok(())
}

/// `tollgate audit export`: every entry as stored (canonical JSON, hashes included, so each
/// line stays verifiable), one per line, in time order.
pub fn export(dirs: &[PathBuf], since: Option<SystemTime>) -> Result<(), CliError> {
    use std::io::Write as _;
    let filter = EntryFilter {
        since,
        ..Default::default()
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for (_, entry) in merged(dirs, &filter)? {
        writeln!(out, "{}", entry.to_line()).map_err(crate::out::error)?;
    }
    out.flush().map_err(crate::out::error)
}

/// ` (reason)`, or nothing for no reason.
fn parenthesised(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(" ({reason})")
    }
}

/// One step of a run's story, in words.
fn story_line(entry: &Entry) -> String {
    let meta = |key: &str| entry.metadata.get(key).map(meta_text).unwrap_or_default();
    // Unix seconds in the entry, a date for the reader.
    let expires = || match entry.metadata.get("expires_at") {
        Some(MetaValue::Int(seconds)) => crate::show::time_text(Some(&prost_types::Timestamp {
            seconds: *seconds,
            nanos: 0,
        })),
        _ => meta("expires_at"),
    };
    let reason = entry.reason.clone().unwrap_or_default();
    match entry.kind {
        EntryKind::ReceiptMinted if entry.metadata.contains_key("delegated_by") => format!(
            "child receipt minted by {} for operator {} (subject {}, audience {}, signed by key {}, expires {}), delegated by supervisor {} from parent receipt {} (depth {})",
            meta("issuer"),
            meta("owner"),
            meta("subject"),
            meta("audience"),
            meta("key_id"),
            expires(),
            meta("delegated_by"),
            meta("parent_receipt_id"),
            meta("depth")
        ),
        EntryKind::ReceiptMinted => format!(
            "receipt minted by {} for operator {} (subject {}, audience {}, signed by key {}, expires {})",
            meta("issuer"),
            meta("owner"),
            meta("subject"),
            meta("audience"),
            meta("key_id"),
            expires()
        ),
        EntryKind::ReceiptRevoked if entry.decision == Some(tollgate_audit::Decision::Deny) => {
            format!("revocation by {} refused: {reason}", meta("by"))
        }
        EntryKind::ReceiptRevoked => format!("receipt revoked by {}: {reason:?}", meta("by")),
        EntryKind::RunRefused => format!("start refused ({}): {reason}", meta("code")),
        EntryKind::RunAdmitted => format!(
            "admitted by the {} (host id {}, argv from the start request: {})",
            entry.component,
            meta("host_id"),
            meta("argv_from_start")
        ),
        EntryKind::SandboxCreated => format!(
            "sandbox running (cgroup {}, Landlock ABI {}, started in {} µs)",
            meta("cgroup"),
            meta("landlock_abi"),
            meta("start_us")
        ),
        EntryKind::LimitHit => format!("{} limit hit: {reason}", meta("limit")),
        EntryKind::RouteDecision if meta("phase") == "done" => format!(
            "model call done on route {}: {} prompt + {} completion tokens ({} / {}), {} tool calls, finish {}{}",
            meta("route"),
            meta("prompt_tokens"),
            meta("completion_tokens"),
            meta("prompt_source"),
            meta("completion_source"),
            entry
                .metadata
                .get("tool_calls")
                .map_or_else(|| "0".to_owned(), meta_text),
            meta("finish_reason"),
            parenthesised(&reason)
        ),
        EntryKind::RouteDecision
            if meta("count_only") == "true"
                && entry.decision == Some(tollgate_audit::Decision::Allow) =>
        {
            format!(
            "tokens counted for route {} ({}): {} prompt tokens ({}){}",
            meta("route"),
            meta("model"),
            meta("prompt_tokens"),
            meta("prompt_source"),
            parenthesised(&reason)
            )
        }
        EntryKind::RouteDecision if meta("refused_by") == "endpoint" => format!(
            "model request refused by the sandbox's endpoint: {} answered {}: {reason}",
            meta("request"),
            meta("status")
        ),
        EntryKind::RouteDecision if entry.decision == Some(tollgate_audit::Decision::Deny) => {
            format!("model call refused: {reason}")
        }
        EntryKind::RouteDecision => format!(
            "model call routed to {} ({}, model {}): text {}, sent {}, findings {}",
            meta("route"),
            meta("kind"),
            meta("model"),
            meta("sensitivity"),
            meta("sent_sensitivity"),
            meta("reasons")
        ),
        EntryKind::ToolCall => format!(
            "gateway call {} {}: {}{}",
            meta("tool"),
            meta("path"),
            entry.decision.map_or("-", |d| d.as_str()),
            parenthesised(&reason)
        ),
        EntryKind::ApprovalPending => format!(
            "call {} waits for an operator: {} {} ({})",
            entry.call_id.as_deref().unwrap_or("-"),
            meta("tool"),
            meta("path"),
            meta_size(entry.metadata.get("bytes")),
        ),
        EntryKind::ApprovalDecided => format!(
            "call {} {}{}{}",
            entry.call_id.as_deref().unwrap_or("-"),
            meta("outcome").replace('_', " "),
            if meta("decided_by").is_empty() {
                String::new()
            } else {
                format!(" by {}", meta("decided_by"))
            },
            if reason.is_empty() {
                String::new()
            } else {
                format!(": {reason}")
            }
        ),
        EntryKind::OperatorCall => format!(
            "operator {} called {}: {}{}",
            meta("operator"),
            meta("method"),
            entry.decision.map_or("-", |d| d.as_str()),
            parenthesised(&reason)
        ),
        EntryKind::Egress if meta("phase") == "closed" => format!(
            "outbound connection to {}:{} ended: {} (sent {}, received {}, {} ms){}",
            meta("host"),
            meta("port"),
            entry.decision.map_or("-", |d| d.as_str()),
            meta_size(entry.metadata.get("bytes_sent")),
            meta_size(entry.metadata.get("bytes_received")),
            meta("duration_ms"),
            parenthesised(&reason)
        ),
        EntryKind::Egress => format!(
            "outbound connection to {}:{}: {}{}",
            meta("host"),
            meta("port"),
            entry.decision.map_or("-", |d| d.as_str()),
            if reason.is_empty() {
                format!(" ({})", meta("address"))
            } else {
                format!(" ({reason})")
            }
        ),
        EntryKind::Teardown => format!(
            "torn down: {} — {reason} (exit code {}, signal {}, {} ms, peak memory {}, cleanup errors {})",
            meta("state"),
            meta("exit_code"),
            meta("signal"),
            meta("duration_ms"),
            meta_size(entry.metadata.get("peak_memory_bytes")),
            meta("cleanup_errors")
        ),
        _ => format!("{} {}", entry.kind.as_str(), summary(entry)),
    }
}

/// `tollgate trace RUN`: the story of one run from mint to teardown, from every log given,
/// after checking that each log is intact.
pub fn trace(run_id: &str, dirs: &[PathBuf], trust: &Trust) -> Result<(), CliError> {
    let options = trust.options()?;
    let mut broken = 0;
    for dir in dirs {
        match verify_dir(dir, &options) {
            Ok(report) => {
                for line in describe(dir, &report) {
                    say!("{line}")?;
                }
            }
            Err(error @ VerifyError::Broken { .. }) => {
                broken += 1;
                say!("{}: BROKEN: {error}", dir.display())?;
            }
            Err(error) => return Err(CliError::Input(format!("{}: {error}", dir.display()))),
        }
    }
    // The run id is the receipt id: entries name one or the other (or both).
    let story: Vec<(usize, Entry)> = merged(dirs, &EntryFilter::default())?
        .into_iter()
        .filter(|(_, entry)| {
            entry.receipt_id.as_deref() == Some(run_id) || entry.run_id.as_deref() == Some(run_id)
        })
        .collect();
    if story.is_empty() {
        if broken > 0 {
            return Err(CliError::AuditBroken(broken));
        }
        return Err(CliError::Input(format!(
            "no audit entries name {run_id} in {}",
            listing(dirs)
        )));
    }
    say!()?;
    for (step, (_, entry)) in story.iter().enumerate() {
        say!(
            "{:>2}. {}  {:<10} #{:<5} {}",
            step + 1,
            entry.time,
            entry.component,
            entry.seq,
            story_line(entry)
        )?;
    }
    let ended = story.iter().any(|(_, e)| e.kind == EntryKind::Teardown);
    say!()?;
    say!(
        "{}",
        if ended {
            "teardown recorded: the run is over and its sandbox is gone"
        } else {
            "no teardown recorded yet: the run is live, never started, or its supervisor's log was not given"
        }
    )?;
    if broken > 0 {
        return Err(CliError::AuditBroken(broken));
    }
    Ok(())
}

/// One model call of `calls`: its decision, route and sensitivity; once it went out, its
/// tokens, tool calls and how it finished (from the call's `done` entry). A request the
/// sandbox's model endpoint refused before it became a call is `model.request`, with what
/// was asked and the status answered.
fn model_call_line(entry: &Entry, done: Option<&Entry>, json_out: bool) -> Result<(), CliError> {
    let meta = |key: &str| entry.metadata.get(key).map(meta_text).unwrap_or_default();
    let done_meta = |key: &str| {
        done.and_then(|d| d.metadata.get(key))
            .map(meta_text)
            .unwrap_or_default()
    };
    let decision = entry.decision.map_or("-", |d| d.as_str());
    let at_endpoint = meta("refused_by") == "endpoint";
    let tool = if at_endpoint {
        "model.request"
    } else if meta("count_only") == "true" {
        "model.count_tokens"
    } else {
        "model.complete"
    };
    let route = if entry.decision == Some(tollgate_audit::Decision::Allow) {
        meta("route")
    } else {
        meta("requested")
    };
    if json_out {
        let done_value = |key: &str| done.and_then(|d| d.metadata.get(key)).map(meta_text);
        let mut row = json!({
            "time": entry.time,
            "call_id": entry.call_id,
            "tool": tool,
            "route": route,
            "decision": decision,
            "reason": entry.reason,
            "sensitivity": entry.metadata.get("sensitivity").map(meta_text),
            "prompt_tokens": done_value("prompt_tokens").or_else(|| entry.metadata.get("prompt_tokens").map(meta_text)),
            "completion_tokens": done_value("completion_tokens"),
            "model": done_value("model").or_else(|| entry.metadata.get("model").map(meta_text)),
            "tools": entry.metadata.get("tools").map(meta_text),
            "tool_calls": done_value("tool_calls"),
            "finish_reason": done_value("finish_reason"),
        });
        if at_endpoint {
            row["request"] = json!(meta("request"));
            row["status"] = json!(meta("status"));
            row["api"] = json!(meta("api"));
        }
        out!("{row}")?;
    } else {
        let detail = if at_endpoint {
            format!(
                "{} answered {}, model {}",
                meta("request"),
                meta("status"),
                route
            )
        } else {
            let mut detail = format!("route {} (sensitivity {})", route, meta("sensitivity"));
            if done.is_some() {
                detail.push_str(&format!(
                    "  {} + {} tokens",
                    done_meta("prompt_tokens"),
                    done_meta("completion_tokens")
                ));
                let calls = done_meta("tool_calls");
                if !calls.is_empty() && calls != "0" {
                    detail.push_str(&format!(", {calls} tool calls"));
                }
            }
            detail
        };
        say!(
            "{}  {}  {:<8} {:<5} {}{}",
            entry.time,
            entry.call_id.as_deref().unwrap_or("-"),
            tool,
            decision,
            detail,
            entry
                .reason
                .as_deref()
                .map(|r| format!("  ({r})"))
                .unwrap_or_default()
        )?;
    }
    Ok(())
}

/// One outbound connection: its decision (`open`) and, when it got that far, how it ended
/// (`closed`: bytes each way, duration, why; a connection cut by a check is denied there).
fn egress_line(entry: &Entry, closed: Option<&Entry>, json_out: bool) -> Result<(), CliError> {
    let meta = |key: &str| entry.metadata.get(key).map(meta_text).unwrap_or_default();
    let closed_meta = |key: &str| {
        closed
            .and_then(|c| c.metadata.get(key))
            .map(meta_text)
            .unwrap_or_default()
    };
    let decision = closed
        .filter(|c| c.decision == Some(tollgate_audit::Decision::Deny))
        .or(Some(entry))
        .and_then(|e| e.decision)
        .map_or("-", |d| d.as_str());
    let reason = closed
        .and_then(|c| c.reason.as_deref())
        .or(entry.reason.as_deref());
    let target = format!("{}:{}", meta("host"), meta("port"));
    if json_out {
        out!(
            "{}",
            json!({
                "time": entry.time,
                "call_id": entry.call_id,
                "tool": "egress",
                "target": target,
                "address": entry.metadata.get("address").map(meta_text),
                "decision": decision,
                "reason": reason,
                "bytes_sent": closed.and_then(|c| c.metadata.get("bytes_sent")).map(meta_text),
                "bytes_received": closed.and_then(|c| c.metadata.get("bytes_received")).map(meta_text),
                "duration_ms": closed.and_then(|c| c.metadata.get("duration_ms")).map(meta_text),
            })
        )?;
    } else {
        let traffic = if closed.is_some() {
            format!(
                "  sent {}, received {} in {} ms",
                meta_size(closed.and_then(|c| c.metadata.get("bytes_sent"))),
                meta_size(closed.and_then(|c| c.metadata.get("bytes_received"))),
                closed_meta("duration_ms")
            )
        } else {
            String::new()
        };
        let address = entry
            .metadata
            .get("address")
            .map(|a| format!(" ({})", meta_text(a)))
            .unwrap_or_default();
        say!(
            "{}  {}  {:<8} {:<5} {target}{address}{traffic}{}",
            entry.time,
            entry.call_id.as_deref().unwrap_or("-"),
            "egress",
            decision,
            reason.map(|r| format!("  ({r})")).unwrap_or_default()
        )?;
    }
    Ok(())
}

/// Whether an entry is the second of a call's two (a model call's `done`, a connection's
/// `closed`): shown with the first.
fn is_follow_up(entry: &Entry) -> bool {
    let phase = entry.metadata.get("phase").map(meta_text);
    (entry.kind == EntryKind::RouteDecision && phase.as_deref() == Some("done"))
        || (entry.kind == EntryKind::Egress && phase.as_deref() == Some("closed"))
}

/// A call's wait for approval, beside the call in `tollgate calls`: its start (what it would
/// change) or its end (how, by whom, why).
fn approval_line(entry: &Entry, json_out: bool) -> Result<(), CliError> {
    let meta = |key: &str| entry.metadata.get(key).map(meta_text).unwrap_or_default();
    let (approval, detail) = if entry.kind == EntryKind::ApprovalPending {
        (
            "waiting".to_owned(),
            format!(
                "{} {} ({})",
                meta("tool"),
                meta("path"),
                meta_size(entry.metadata.get("bytes"))
            ),
        )
    } else {
        let by = meta("decided_by");
        (
            meta("outcome"),
            format!(
                "{}{}",
                if by.is_empty() {
                    String::new()
                } else {
                    format!("by {by}")
                },
                entry
                    .reason
                    .as_deref()
                    .filter(|r| !r.is_empty())
                    .map(|r| format!("  ({r})"))
                    .unwrap_or_default()
            ),
        )
    };
    if json_out {
        out!(
            "{}",
            json!({
                "time": entry.time,
                "call_id": entry.call_id,
                "approval": approval,
                "tool": (entry.kind == EntryKind::ApprovalPending).then(|| meta("tool")),
                "path": (entry.kind == EntryKind::ApprovalPending).then(|| meta("path")),
                "decided_by": entry.metadata.get("decided_by").map(meta_text),
                "reason": entry.reason,
            })
        )?;
    } else {
        say!(
            "{}  {}  approval {:<9} {detail}",
            entry.time,
            entry.call_id.as_deref().unwrap_or("-"),
            approval
        )?;
    }
    Ok(())
}

/// `tollgate calls RUN LOG_DIR...`: a run's gateway calls (tools, model calls and outbound
/// connections) with their decisions, in order.
pub fn calls(run_id: &str, dirs: &[PathBuf], json_out: bool) -> Result<(), CliError> {
    let filter = EntryFilter {
        run_id: Some(run_id.to_owned()),
        ..Default::default()
    };
    let calls: Vec<Entry> = merged(dirs, &filter)?
        .into_iter()
        .map(|(_, entry)| entry)
        // Tool calls, model calls and connections by their decision (a call that went out
        // also has a second entry, shown with it below).
        .filter(|entry| {
            matches!(
                entry.kind,
                EntryKind::ToolCall
                    | EntryKind::RouteDecision
                    | EntryKind::Egress
                    | EntryKind::ApprovalPending
                    | EntryKind::ApprovalDecided
            ) && !is_follow_up(entry)
        })
        .collect();
    if calls.is_empty() {
        return Err(CliError::Input(format!(
            "no gateway calls of {run_id} in {}",
            listing(dirs)
        )));
    }
    let done: std::collections::HashMap<String, Entry> = merged(dirs, &filter)?
        .into_iter()
        .map(|(_, entry)| entry)
        .filter(is_follow_up)
        .filter_map(|entry| Some((entry.call_id.clone()?, entry)))
        .collect();
    for entry in calls {
        let meta = |key: &str| entry.metadata.get(key).map(meta_text).unwrap_or_default();
        let decision = entry.decision.map_or("-", |d| d.as_str());
        let ended = entry.call_id.as_ref().and_then(|id| done.get(id));
        if entry.kind == EntryKind::RouteDecision {
            model_call_line(&entry, ended, json_out)?;
            continue;
        }
        if entry.kind == EntryKind::Egress {
            egress_line(&entry, ended, json_out)?;
            continue;
        }
        if matches!(
            entry.kind,
            EntryKind::ApprovalPending | EntryKind::ApprovalDecided
        ) {
            approval_line(&entry, json_out)?;
            continue;
        }
        if json_out {
            out!(
                "{}",
                json!({
                    "time": entry.time,
                    "call_id": entry.call_id,
                    "tool": meta("tool"),
                    "path": meta("path"),
                    "decision": decision,
                    "reason": entry.reason,
                    "bytes": entry.metadata.get("bytes").map(meta_text),
                    "duration_us": entry.metadata.get("duration_us").map(meta_text),
                })
            )?;
        } else {
            say!(
                "{}  {}  {:<8} {:<5} {}{}",
                entry.time,
                entry.call_id.as_deref().unwrap_or("-"),
                meta("tool"),
                decision,
                meta("path"),
                entry
                    .reason
                    .as_deref()
                    .map(|r| format!("  ({r})"))
                    .unwrap_or_default()
            )?;
        }
    }
    Ok(())
}
