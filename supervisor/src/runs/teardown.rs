//! The one teardown every run ends with, whatever ended it: kill what is left, read peak
//! memory, remove the cgroup and the run directory, write the final record and the report.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tollgate_receipt::unix_now;
use tollgate_shim_protocol::protocol::AgentExit;

use crate::records::{RunState, TeardownReport};
use crate::sandbox::RunDirs;
use crate::COMPONENT;
use tollgate_audit::{AuditError, EntryDraft, EntryKind, PendingEntry};

use super::teardowns::{Ending, Endings};
use super::{now_ms, LiveRun, RunManager, KILL_DEADLINE};

/// How a run came to teardown.
pub(super) enum Ended {
    /// The shim ended; the agent's exit (when reported) and whether output was truncated.
    Agent(Option<AgentExit>, bool),
    /// The sandbox never started, for this reason.
    NotStarted(String),
}

/// Whether an ended run's `/work` is kept: whenever its receipt asks for it, its sandbox
/// started (before that there is nothing to keep), and no process of it is left to write
/// there (its cgroup was emptied). What ended it — the agent's exit, a stop, expiry,
/// revocation, a limit, a shutdown, a parent's end — does not matter: the one rule for all.
fn keeps_workspace(keep_seconds: u64, started: bool, emptied: bool) -> bool {
    keep_seconds > 0 && started && emptied
}

impl RunManager {
    /// Gives back what a child held of its parent's limits (nothing for a root run).
    pub(super) fn release_holds(&self, run_id: &str) {
        self.family
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(run_id);
    }

    /// Gives back the host id `run_id` holds: once its final record is written (a record
    /// that could not be written keeps its id held, as the database still counts it live),
    /// or when its start was refused before it was recorded.
    pub(super) fn give_back_host_id(&self, run_id: &str) {
        self.host_ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .give_back(run_id);
    }

    /// Records a start that failed before the run had a cgroup.
    pub(super) fn fail(&self, run_id: &str, dirs: &RunDirs, reason: &str, started_ms: u64) {
        self.release_holds(run_id);
        let mut report = TeardownReport {
            reason: reason.to_owned(),
            ..Default::default()
        };
        if let Err(e) = dirs.remove() {
            report.cleanup_errors.push(e.to_string());
        }
        report.duration_ms = now_ms().saturating_sub(started_ms);
        self.audit_teardown(run_id, RunState::FailedBeforeStart, &report);
        match self
            .records
            .finish(run_id, RunState::FailedBeforeStart, &report, unix_now())
        {
            Ok(()) => self.give_back_host_id(run_id),
            Err(e) => tracing::error!(run_id, error = %e, "could not record a failed start"),
        }
        tracing::warn!(run_id, reason, "run failed to start");
    }

    /// Audits the end of a run with its report (and the limit it hit, if one ended it), and
    /// waits until that is on disk. Teardown has happened whatever the log says, so a failure
    /// here is logged, not raised.
    pub(super) fn audit_teardown(&self, run_id: &str, state: RunState, report: &TeardownReport) {
        for entry in self.submit_teardown_entries(run_id, state, report) {
            if let Err(e) = entry.and_then(PendingEntry::wait) {
                tracing::error!(run_id, error = %e, "could not audit a teardown");
            }
        }
    }

    /// Hands the entries that audit the end of a run to the audit writer, without waiting
    /// for them to be on disk.
    fn submit_teardown_entries(
        &self,
        run_id: &str,
        state: RunState,
        report: &TeardownReport,
    ) -> Vec<Result<PendingEntry, AuditError>> {
        let opt = |value: Option<i32>| value.map_or(tollgate_audit::MetaValue::Null, Into::into);
        let to_i64 = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
        let mut drafts = Vec::new();
        if state == RunState::LimitExceeded {
            drafts.push(
                EntryDraft::new(COMPONENT, EntryKind::LimitHit)
                    .receipt(run_id)
                    .run(run_id)
                    .reason(report.reason.as_str())
                    .meta("limit", "memory"),
            );
        }
        drafts.push(
            EntryDraft::new(COMPONENT, EntryKind::Teardown)
                .receipt(run_id)
                .run(run_id)
                .reason(report.reason.as_str())
                .meta("state", state.name())
                .meta("duration_ms", to_i64(report.duration_ms))
                .meta("exit_code", opt(report.exit_code))
                .meta("signal", opt(report.signal))
                .meta(
                    "peak_memory_bytes",
                    report
                        .peak_memory_bytes
                        .map_or(tollgate_audit::MetaValue::Null, |b| to_i64(b).into()),
                )
                .meta("output_truncated", report.output_truncated)
                .meta("cgroup", report.cgroup.clone().unwrap_or_default())
                .meta(
                    "last_tool_call_id",
                    report.last_tool_call_id.clone().unwrap_or_default(),
                )
                .meta("routes_used", report.routes_used.clone())
                .meta("cleanup_errors", report.cleanup_errors.clone()),
        );
        drafts
            .into_iter()
            .map(|draft| self.audit.submit(draft))
            .collect()
    }

    /// The one teardown path: the run is cleaned up here, and its end recorded with
    /// `endings`, the group it joins: the manager's on a teardown worker (written with every
    /// end gathered meanwhile, one durable write per group), or a group of its own
    /// (`&Endings::default()`) where the caller needs the end recorded before this returns
    /// (a start that failed, a run lost at re-adoption). `set_ended` follows the record.
    pub(super) fn teardown(
        &self,
        endings: &Endings<(Arc<LiveRun>, Instant)>,
        run_id: &str,
        live: &Arc<LiveRun>,
        dirs: &RunDirs,
        ended: Ended,
        started_ms: u64,
    ) {
        let ending = self.clean_up(run_id, live, dirs, ended, started_ms);
        endings.add(&self.records, ending, |ending, recorded| {
            self.finish_run(ending, recorded)
        });
    }

    /// The teardown's clean-up: kill what is left, read peak memory, remove the cgroup and
    /// the run directory, and hand the audit its entries; the final record is left to
    /// [`Endings`].
    fn clean_up(
        &self,
        run_id: &str,
        live: &Arc<LiveRun>,
        dirs: &RunDirs,
        ended: Ended,
        started_ms: u64,
    ) -> Ending<(Arc<LiveRun>, Instant)> {
        let tearing_down = Instant::now();
        live.closing.store(true, Ordering::SeqCst);
        let gateway = live
            .gateway
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let ended_gateway = gateway.map(|(run, mut handle)| {
            handle.stop();
            // Outbound connections end now, not when their peers next send; so does every
            // call waiting for approval (then what its operators remembered goes).
            run.gate.end_streams();
            self.approvals.forget_run(run_id);
            // Refusals of a spent run still being counted get their summary entry.
            run.gate.flush_refusals();
            run.models.flush_refused();
            let last_call = run
                .gate
                .last_call
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            let usage = run
                .models
                .models
                .as_ref()
                .map(|models| models.usage())
                .unwrap_or_default();
            (last_call, usage, run.gate.receipt.workspace_keep_seconds)
        });
        let (last_tool_call_id, route_usage, keep) = match ended_gateway {
            Some((last_call, usage, keep)) => (Some(last_call), usage, keep),
            None => (None, Vec::new(), 0),
        };
        let trigger = live
            .trigger
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let (exit, output_truncated, failure) = match ended {
            Ended::Agent(exit, truncated) => (exit, truncated, None),
            Ended::NotStarted(reason) => (None, false, Some(reason)),
        };
        let started = failure.is_none();
        let mut report = TeardownReport {
            output_truncated,
            last_tool_call_id: last_tool_call_id.flatten(),
            routes_used: route_usage.iter().map(|u| u.route.clone()).collect(),
            route_usage,
            landlock_abi: live.landlock_abi.get().copied(),
            ..Default::default()
        };
        match exit {
            Some(AgentExit::Code(code)) => report.exit_code = Some(code),
            Some(AgentExit::Signal(signal)) => report.signal = Some(signal),
            None => {}
        }
        let oom = live.cgroup.oom_killed();
        let (state, reason) = match (trigger, exit) {
            (Some(trigger), _) => trigger,
            // Never started, for a reason of this host's: the receipt may start again.
            (None, _) if failure.is_some() => {
                (RunState::FailedBeforeStart, failure.unwrap_or_default())
            }
            (None, _) if oom => (
                RunState::LimitExceeded,
                "the memory limit was reached (OOM kill)".into(),
            ),
            (None, Some(AgentExit::Code(code))) => (
                RunState::Exited,
                format!("the agent exited with code {code}"),
            ),
            (None, Some(AgentExit::Signal(signal))) => (
                RunState::Exited,
                format!("the agent was killed by signal {signal}"),
            ),
            (None, None) => (RunState::ShimDied, "the sandbox's shim died".into()),
        };
        // Whatever ended this run ends its descendants, before its own cleanup.
        self.cascade(run_id, state, &reason);
        report.reason = reason;
        self.removals.pass();
        let emptied = match live.cgroup.kill_all(KILL_DEADLINE) {
            Ok(()) => true,
            Err(e) => {
                report.cleanup_errors.push(e.to_string());
                false
            }
        };
        report.peak_memory_bytes = live.cgroup.peak_memory();
        report.cgroup = Some(live.cgroup.relative().to_owned());
        if let Err(e) = live.cgroup.remove() {
            report.cleanup_errors.push(e.to_string());
        }
        // A receipt that keeps the workspace: moved aside (for `tollgate cp`) before the
        // run's directory goes, whatever ended the run (see `keeps_workspace`).
        report.workspace_keep_seconds = keep;
        if keeps_workspace(keep, started, emptied) {
            match self.keep_workspace(run_id, dirs, keep) {
                Ok((path, until)) => {
                    report.workspace = Some(path.display().to_string());
                    report.workspace_kept_until = Some(until);
                }
                Err(e) => report
                    .cleanup_errors
                    .push(format!("keeping the workspace: {e}")),
            }
        }
        if let Err(e) = dirs.remove() {
            report.cleanup_errors.push(e.to_string());
        }
        report.duration_ms = now_ms().saturating_sub(started_ms);
        // The entry first: a crash between it and the record repeats it at the next start,
        // never loses it (`Endings` writes the record once the entry is on disk).
        Ending {
            run_id: run_id.to_owned(),
            entries: self.submit_teardown_entries(run_id, state, &report),
            state,
            report,
            run: (live.clone(), tearing_down),
        }
    }

    /// What follows a run's final record (written or not): its host id back, its end logged
    /// and counted, and the run ended for whoever waits on it.
    fn finish_run(
        &self,
        Ending {
            run_id,
            state,
            report,
            run: (live, tearing_down),
            ..
        }: Ending<(Arc<LiveRun>, Instant)>,
        recorded: Result<(), crate::records::RecordsError>,
    ) {
        let run_id = run_id.as_str();
        match recorded {
            Ok(()) => self.give_back_host_id(run_id),
            Err(e) => tracing::error!(run_id, error = %e, "could not record a teardown report"),
        }
        tracing::info!(run_id, state = state.name(), reason = %report.reason, "run torn down");
        let removed = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(run_id);
        let metrics = crate::metrics::get();
        if removed.is_some() {
            metrics.live_runs.dec();
        }
        metrics.teardown(state.name(), tearing_down.elapsed());
        self.release_holds(run_id);
        live.set_ended();
    }
}
