//! The call gate every gateway call passes, whatever its family: the run is alive, its
//! receipt neither expired nor revoked, the budget and the audit quota not spent; then one
//! audit entry per call (a change only once its entry is durable), refusals of a spent run
//! summarised. The tool families (`fs`, `exec`, `models`, `children`) depend on this module
//! and on nothing of each other's but what they share explicitly.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate_audit::{AuditLog, Decision, EntryDraft, EntryKind, MetaValue};
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::call_tool_response::Result as ToolResult;
use tollgate_receipt::unix_now;
use tonic::Status;

use crate::COMPONENT;

/// Once a run is spent (budget or audit quota), its refusals are summarised: one entry for
/// the first of each window this long, one summary entry (with a count) for the rest.
pub const SUMMARY_WINDOW: Duration = Duration::from_secs(1);
/// Least and most audit bytes one run may make the supervisor write (see [`audit_quota`]).
pub const MIN_AUDIT_QUOTA: u64 = 16 << 20;
/// See [`MIN_AUDIT_QUOTA`].
pub const MAX_AUDIT_QUOTA: u64 = 1 << 30;

/// The audit bytes a run with a budget of `max_calls` may cause: 4 KiB a call, at least
/// [`MIN_AUDIT_QUOTA`] and at most [`MAX_AUDIT_QUOTA`]. Past it every call is refused.
pub fn audit_quota(max_calls: u64) -> u64 {
    max_calls
        .saturating_mul(4096)
        .clamp(MIN_AUDIT_QUOTA, MAX_AUDIT_QUOTA)
}

/// What a run has made the supervisor's audit log hold, and the refusals it is summarising.
#[derive(Debug, Default)]
pub struct AuditUse {
    /// Bytes of entries this run's calls have caused.
    pub bytes: AtomicU64,
    window: Mutex<Option<RefusalWindow>>,
}

/// Refusals of a spent run in one [`SUMMARY_WINDOW`], not yet written.
#[derive(Debug)]
struct RefusalWindow {
    opened: Instant,
    count: u64,
    first_call: String,
    last_call: String,
    tools: BTreeSet<String>,
    reason: String,
}

/// What every call of one run is checked and counted against.
pub struct CallGate {
    /// The run (= receipt) id.
    pub run_id: String,
    /// The receipt, for `GetRunReceipt` and the per-family grants.
    pub receipt: pb::Receipt,
    /// Unix seconds; no call is served at or after it (moved by an amendment).
    pub expires_at: AtomicI64,
    /// The run's tool-call budget: the receipt's, as amended.
    pub max_calls: AtomicU64,
    /// Set when the run is being torn down: no call is served from then on.
    pub closing: Arc<AtomicBool>,
    /// Whether the receipt has been revoked (asked on every call).
    pub is_revoked: Arc<dyn Fn(&str) -> bool + Send + Sync>,
    /// Where every call is recorded.
    pub audit: AuditLog,
    /// Calls made so far (allowed or not), plus the calls handed on to children: one counter,
    /// so a call and a carve can never both take the budget's last call.
    pub calls: AtomicU64,
    /// The last call's id, for the teardown report.
    pub last_call: Mutex<Option<String>>,
    /// The audit bytes this run caused (held to [`audit_quota`]) and its summarised refusals.
    pub audit_use: AuditUse,
    /// Whether the receipt has any fs grant (the `fs.*` tools need one).
    pub fs_granted: bool,
    /// Set once, when the run is torn down: every long-lived stream of the run (its
    /// outbound connections) ends then, whatever it is waiting for.
    pub streams_end: tokio::sync::watch::Sender<bool>,
}

impl std::fmt::Debug for CallGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallGate")
            .field("run_id", &self.run_id)
            .finish_non_exhaustive()
    }
}

/// Why a call was refused: what to tell the agent and what the audit entry says.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) status: Status,
    pub(crate) reason: String,
    /// The call was allowed and went wrong while it ran (recorded as allowed, with why).
    ran: bool,
    /// A stable code for the audit entry (`grant_escapes`, `children_limits`, ...), when the
    /// refusal has one.
    pub(crate) code: Option<&'static str>,
}

impl Refusal {
    /// How the call is recorded: allowed when it ran (and went wrong), else denied.
    pub(crate) fn decision(&self) -> Decision {
        if self.ran {
            Decision::Allow
        } else {
            Decision::Deny
        }
    }

    /// The status the agent gets, with the call id in its metadata.
    pub(crate) fn into_status(self, call_id: &str) -> Status {
        let mut status = self.status;
        if let Ok(value) = call_id.parse() {
            status.metadata_mut().insert("tollgate-call-id", value);
        }
        status
    }

    /// A refusal with its own status (whose message the agent sees) and audit reason.
    pub(crate) fn new(status: Status, reason: String) -> Self {
        Self {
            status,
            reason,
            ran: false,
            code: None,
        }
    }

    /// The same refusal, for a call that was allowed and went wrong while it ran.
    pub(crate) fn ran(self) -> Self {
        Self { ran: true, ..self }
    }

    /// The same refusal, carrying `code` for the audit entry.
    pub(crate) fn coded(self, code: &'static str) -> Self {
        Self {
            code: Some(code),
            ..self
        }
    }

    /// A refusal by the receipt: `PERMISSION_DENIED`, naming the receipt.
    pub(crate) fn denied(run_id: &str, reason: String) -> Self {
        Self {
            status: Status::permission_denied(format!("receipt {run_id}: {reason}")),
            reason,
            ran: false,
            code: None,
        }
    }

    /// A refusal whose status is `status` with the reason as its message.
    pub(crate) fn with(status: fn(String) -> Status, reason: String) -> Self {
        Self {
            status: status(reason.clone()),
            reason,
            ran: false,
            code: None,
        }
    }
}

/// What a tool decided: a result now, or a change to make once its audit entry is on disk.
pub(crate) enum Step<'a> {
    /// The tool is done: its result.
    Done(ToolResult),
    /// A change, made only once the call's entry is durable.
    Change(Box<dyn FnOnce() -> Result<ToolResult, Refusal> + Send + 'a>),
}

/// Metadata an audit entry of a call carries (never data).
pub(crate) type CallMeta = Vec<(&'static str, MetaValue)>;

/// A new call's id (time-ordered, so ids sort as calls were made).
pub(crate) fn new_call_id() -> String {
    uuid::Uuid::now_v7().hyphenated().to_string()
}

impl CallGate {
    /// Unix seconds at which the run's calls stop (its receipt's expiry, as amended).
    pub fn expires_at(&self) -> i64 {
        self.expires_at.load(Ordering::SeqCst)
    }

    /// The run's tool-call budget now.
    pub fn max_calls(&self) -> u64 {
        self.max_calls.load(Ordering::SeqCst)
    }

    /// The checks every call passes before its tool runs.
    pub(crate) fn admit(&self, tool: &str) -> Result<u64, Refusal> {
        // Every call counts, refused or not, whatever refuses it.
        let made = self.calls.fetch_add(1, Ordering::SeqCst);
        self.check_audit_quota()?;
        // Past the budget nothing else is looked at (`child.stop` is not held to it: a run
        // must still be able to stop what it started).
        if tool != "child.stop" {
            self.charge(made)?;
        }
        self.check_alive()?;
        if tool == "exec" && self.receipt.exec.is_empty() && self.receipt.gateway_exec.is_empty() {
            return Err(Refusal::denied(
                &self.run_id,
                "exec needs an exec grant and the receipt has none".into(),
            ));
        }
        if tool.starts_with("fs.") && !self.fs_granted {
            return Err(Refusal::denied(
                &self.run_id,
                format!("{tool} needs an fs grant and the receipt has none"),
            ));
        }
        Ok(made)
    }

    /// Refuses everything once the run has made the audit log hold its quota.
    pub(crate) fn check_audit_quota(&self) -> Result<(), Refusal> {
        let quota = audit_quota(self.max_calls());
        if self.audit_use.bytes.load(Ordering::SeqCst) >= quota {
            return Err(Refusal::denied(
                &self.run_id,
                format!("the run's audit quota ({quota} bytes) is spent"),
            ));
        }
        Ok(())
    }

    /// The run is not ending, its receipt neither expired nor revoked.
    pub(crate) fn check_alive(&self) -> Result<(), Refusal> {
        if self.closing.load(Ordering::SeqCst) {
            return Err(Refusal::denied(&self.run_id, "the run is ending".into()));
        }
        let now = unix_now();
        let expires_at = self.expires_at();
        if now >= expires_at {
            return Err(Refusal::denied(
                &self.run_id,
                format!(
                    "the receipt expired at {}",
                    tollgate_receipt::rfc3339(expires_at)
                ),
            ));
        }
        if (self.is_revoked)(&self.run_id) {
            return Err(Refusal::denied(
                &self.run_id,
                "the receipt was revoked".into(),
            ));
        }
        Ok(())
    }

    /// Ends every long-lived stream of the run now (teardown).
    pub fn end_streams(&self) {
        self.streams_end.send_replace(true);
    }

    /// Tool calls this run may still make or hand on to children.
    pub(crate) fn calls_left(&self) -> u64 {
        self.max_calls()
            .saturating_sub(self.calls.load(Ordering::SeqCst))
    }

    /// Whether the run is spent: its tool-call budget or its audit quota is used up. Its
    /// refusals are then summarised, not written one by one.
    fn spent(&self) -> bool {
        self.calls.load(Ordering::SeqCst) > self.max_calls()
            || self.audit_use.bytes.load(Ordering::SeqCst) >= audit_quota(self.max_calls())
    }

    /// A refusal of a spent run: counted into the current window (no entry) and `true`, or,
    /// for the first refusal of a window, the closed window's summary written and `false`
    /// (the caller writes this one's own entry). Not spent: `false`.
    pub(crate) fn summarised(
        &self,
        tool: &str,
        call_id: &str,
        reason: &str,
    ) -> Result<bool, Status> {
        if !self.spent() {
            return Ok(false);
        }
        *self.last_call.lock().unwrap_or_else(|p| p.into_inner()) = Some(call_id.to_owned());
        let mut window = self
            .audit_use
            .window
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(open) = window.as_mut() {
            if open.opened.elapsed() < SUMMARY_WINDOW {
                open.count += 1;
                call_id.clone_into(&mut open.last_call);
                if open.tools.len() < 16 {
                    open.tools.insert(tool.to_owned());
                }
                return Ok(true);
            }
        }
        let closed = window.replace(RefusalWindow {
            opened: Instant::now(),
            count: 0,
            first_call: String::new(),
            last_call: String::new(),
            tools: BTreeSet::new(),
            reason: reason.to_owned(),
        });
        drop(window);
        if let Some(closed) = closed {
            self.write_summary(closed)?;
        }
        Ok(false)
    }

    /// Writes the summary of the refusals still being counted (at teardown).
    pub fn flush_refusals(&self) {
        let open = self
            .audit_use
            .window
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(open) = open {
            if let Err(e) = self.write_summary(open) {
                tracing::error!(run_id = %self.run_id, error = %e.message(), "could not audit refused calls");
            }
        }
    }

    fn write_summary(&self, window: RefusalWindow) -> Result<(), Status> {
        if window.count == 0 {
            return Ok(());
        }
        let entry = EntryDraft::new(COMPONENT, EntryKind::ToolCall)
            .receipt(self.run_id.as_str())
            .run(self.run_id.as_str())
            .decision(Decision::Deny)
            .reason(format!(
                "{} more calls refused within {} ms (the run is spent: {})",
                window.count,
                window.opened.elapsed().as_millis(),
                window.reason
            ))
            .meta("tool", "(refused calls)")
            .meta(
                "refused_calls",
                i64::try_from(window.count).unwrap_or(i64::MAX),
            )
            .meta("first_call_id", window.first_call)
            .meta("last_call_id", window.last_call)
            .meta("tools", window.tools.into_iter().collect::<Vec<_>>());
        self.audited(entry, false)
    }

    /// Writes one of this run's entries, counting its bytes against the run's audit quota.
    /// An entry the log cannot take now refuses the call (`UNAVAILABLE`).
    pub(crate) fn audited(&self, entry: EntryDraft, durable: bool) -> Result<(), Status> {
        let written = if durable {
            self.audit.append(entry)
        } else {
            self.audit.record(entry)
        };
        match written {
            Ok(appended) => {
                self.audit_use
                    .bytes
                    .fetch_add(appended.bytes, Ordering::SeqCst);
                Ok(())
            }
            Err(e) => {
                tracing::error!(run_id = %self.run_id, error = %e, "could not audit a call");
                Err(Status::unavailable(
                    "the audit log is unavailable; nothing is done unaudited",
                ))
            }
        }
    }

    /// A call whose request has a field over its bound: counted, refused with a one-line
    /// reason and audited (small: no field of the request is in the entry).
    pub(crate) fn refuse_input(&self, tool: &str, problem: String) -> Status {
        let started = Instant::now();
        let call_id = uuid::Uuid::now_v7().hyphenated().to_string();
        let refusal = match self.admit(tool) {
            Err(refusal) => refusal,
            Ok(_) => Refusal::with(Status::invalid_argument, problem),
        };
        match self.record_call(
            tool,
            &call_id,
            started,
            &Vec::new(),
            (refusal.decision(), Some(&refusal.reason)),
            false,
        ) {
            Ok(()) => refusal.into_status(&call_id),
            Err(status) => status,
        }
    }

    /// The last check before a tool acts: the budget left for the call numbered `made`.
    pub(crate) fn charge(&self, made: u64) -> Result<(), Refusal> {
        // `calls` also counts the calls handed on to children (delegation).
        let max_calls = self.max_calls();
        if made >= max_calls {
            return Err(Refusal::denied(
                &self.run_id,
                format!("the tool-call budget ({max_calls} calls) is spent"),
            ));
        }
        Ok(())
    }

    /// Audits a call and answers it. A change is made only once its entry is on disk; if it
    /// then fails, a second entry says so. Other entries are on disk before the answer when
    /// `durable`, else written at once and fsynced within a bounded delay.
    pub(crate) fn finish(
        &self,
        tool: &str,
        call_id: String,
        started: Instant,
        meta: CallMeta,
        outcome: Result<Step<'_>, Refusal>,
        durable: bool,
    ) -> Result<pb::CallToolResponse, Status> {
        let record = |decision: Decision, reason: Option<&str>, wait: bool| {
            self.record_call(tool, &call_id, started, &meta, (decision, reason), wait)
        };
        let follow_up = |reason: &str| {
            self.record_follow_up(
                tool,
                &call_id,
                started,
                &meta,
                (Decision::Deny, Some(reason)),
                true,
            )
        };
        let result = match outcome {
            Ok(Step::Done(result)) => {
                record(Decision::Allow, None, durable)?;
                Ok(result)
            }
            Ok(Step::Change(apply)) => {
                record(Decision::Allow, None, true)?;
                let applied = apply();
                if let Err(refusal) = &applied {
                    follow_up(&format!("not done: {}", refusal.reason))?;
                }
                applied
            }
            Err(refusal) => {
                record(refusal.decision(), Some(&refusal.reason), durable)?;
                Err(refusal)
            }
        };
        match result {
            Ok(result) => Ok(pb::CallToolResponse {
                call_id,
                result: Some(result),
            }),
            Err(refusal) => Err(refusal.into_status(&call_id)),
        }
    }

    /// Writes a call's `tool_call` entry. Changes and commands (`durable`): on disk before
    /// anything else happens. Reads and refusals: written at once, fsynced within
    /// tollgate_audit::RECORD_MAX_DELAY (an fsync of their own would double a read's round
    /// trip).
    pub(crate) fn record_call(
        &self,
        tool: &str,
        call_id: &str,
        started: Instant,
        meta: &CallMeta,
        (decision, reason): (Decision, Option<&str>),
        durable: bool,
    ) -> Result<(), Status> {
        crate::metrics::get().call(tool, decision.as_str());
        if decision == Decision::Deny && self.summarised(tool, call_id, reason.unwrap_or(""))? {
            return Ok(());
        }
        self.record_follow_up(tool, call_id, started, meta, (decision, reason), durable)
    }

    /// Writes a call's entry whatever the run's state: for the second entry of a change
    /// that failed (`not done: …`), which must never be summarised away.
    pub(crate) fn record_follow_up(
        &self,
        tool: &str,
        call_id: &str,
        started: Instant,
        meta: &CallMeta,
        (decision, reason): (Decision, Option<&str>),
        durable: bool,
    ) -> Result<(), Status> {
        let mut entry = EntryDraft::new(COMPONENT, EntryKind::ToolCall)
            .receipt(self.run_id.as_str())
            .run(self.run_id.as_str())
            .call(call_id)
            .meta("tool", tool)
            .meta(
                "duration_us",
                i64::try_from(started.elapsed().as_micros()).unwrap_or(i64::MAX),
            )
            .decision(decision);
        for (key, value) in meta {
            entry = entry.meta(*key, value.clone());
        }
        if let Some(reason) = reason {
            entry = entry.reason(reason);
        }
        let written = self.audited(entry, durable);
        *self.last_call.lock().unwrap_or_else(|p| p.into_inner()) = Some(call_id.to_owned());
        written
    }
}
