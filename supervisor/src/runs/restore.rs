//! Live restore: a clean stop with `--live-restore` leaves root runs running detached, and
//! the next supervisor re-adopts them from its records.
//!
//! Detaching a run: its record notes (durably, before anything is sent) what re-adopting it
//! takes; then the shim's pid 1 is sent `Detach` with the descriptors that must outlive this
//! process — a listening socket at `<data-dir>/live/<run-id>.sock` (root's, in the 0700 data
//! directory, never mounted in a sandbox) and the read ends of the agent's output pipes. pid 1
//! holds them, beside the run's gateway socket it has held since the start, and ends the
//! sandbox itself at the receipt's expiry or the end of the window, whichever comes first.
//! Gateway calls made meanwhile wait in the gateway socket's backlog (pid 1 accepts nothing
//! while detached); output waits in the pipes (a writer blocks once a pipe is full).
//!
//! Re-adopting it: the next supervisor connects to that socket, checks the recorded pid 1 is
//! still in the run's cgroup, takes the pipes back, serves the same gateway socket again (on
//! the connections pid 1 hands over, as before) with the budgets the run had left, and
//! watches the run as if it had started it (and can
//! leave it running again at its own clean stop). A run that cannot be re-adopted is recorded
//! `expired` (its receipt ran out and its pid 1 ended it) or `lost` (its window ended, its
//! shim is gone), and swept. A crash never detaches anything: pid 1 ends the run when its
//! control socket closes.

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tollgate_audit::{EntryDraft, EntryKind};
use tollgate_receipt::{parse_envelope, SignedReceipt};
use tollgate_shim_protocol::protocol::ToShim;

use super::amend::AmendedRun;
use super::lifecycle::{RunTasks, Watched};
use super::teardowns::Endings;
use super::{now_ms, LiveRun, RunManager, RunState};
use crate::cgroup::RunCgroup;
use crate::error::StartError;
use crate::exec::PinnedSandbox;
use crate::records::RecordsError;
use crate::sandbox::{
    bind_unix, plan_for, send_blocking, ReattachedSandbox, RunDirs, SandboxError, SandboxProcess,
};
use crate::COMPONENT;

/// How long a detach waits for pid 1's `Detached`.
const DETACH_ACK: Duration = Duration::from_secs(3);

/// What the next supervisor needs to re-adopt a detached run (JSON in its record).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct DetachedRun {
    /// Unix milliseconds when pid 1 ends the sandbox unless it is re-adopted.
    pub until_ms: u64,
    /// The run's cgroup, relative to each hierarchy's root.
    pub cgroup: String,
    /// The host pid of the sandbox's pid 1 (in records of older supervisors, of its parent
    /// shim, which stayed).
    pub shim_pid: u32,
    /// The argv the run was started with, when it was not pinned in the receipt.
    pub argv: Option<Vec<String>>,
    /// Bytes of output the run may still relay.
    pub output_left: u64,
    /// Gateway calls counted so far.
    pub tool_calls: u64,
    /// Model tokens spent so far.
    pub tokens_used: u64,
    /// When the run was admitted (Unix milliseconds), for its report's duration.
    pub started_ms: u64,
    /// What amendments and narrowings made of it (absent in records of older supervisors:
    /// the receipt's envelope).
    #[serde(default)]
    pub amended: Option<AmendedRun>,
    /// Bytes the run's outbound connections carried so far, (sent, received): spent stays
    /// spent across the restart.
    #[serde(default)]
    pub egress_bytes: (u64, u64),
}

/// Where the detached run `run_id`'s pid 1 listens for the next supervisor.
fn detach_socket(data_dir: &Path, run_id: &str) -> PathBuf {
    data_dir.join("live").join(format!("{run_id}.sock"))
}

/// A detached run found at start-up and taken back from its pid 1, not yet live.
pub(super) struct Reclaimed {
    run_id: String,
    signed: SignedReceipt,
    state: DetachedRun,
    cgroup: RunCgroup,
    sandbox: ReattachedSandbox,
}

impl Reclaimed {
    /// The run's cgroup name under the parent, which the start-up sweep must leave alone.
    pub(super) fn cgroup_name(&self) -> String {
        self.state
            .cgroup
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned()
    }

    /// The run id.
    pub(super) fn run_id(&self) -> &str {
        &self.run_id
    }
}

/// A run left detached that could not be re-adopted: how it is recorded (`expired` when its
/// receipt has expired, its pid 1 having ended it, else `lost`), and why.
pub(super) struct EndedDetached {
    /// The run id.
    pub run_id: String,
    /// Its final state.
    pub state: RunState,
    /// Why it was not re-adopted.
    pub reason: String,
}

/// Takes back every run a previous supervisor left detached whose window is still open and
/// whose pid 1 answers; the others are returned to be recorded as ended (their cgroups go
/// with the start-up sweep).
pub(super) fn reclaim(
    records: &crate::records::RunRecords,
    data_dir: &Path,
) -> Result<(Vec<Reclaimed>, Vec<EndedDetached>), RecordsError> {
    let mut reclaimed = Vec::new();
    let mut ended = Vec::new();
    for (run_id, signed, state) in records.detached()? {
        let attempt = || -> Result<Reclaimed, String> {
            let state: DetachedRun =
                serde_json::from_str(&state).map_err(|e| format!("its record: {e}"))?;
            if state.until_ms <= now_ms() {
                return Err("its live-restore window ended before this supervisor started".into());
            }
            let signed = parse_envelope(&signed).map_err(|e| format!("its receipt: {e}"))?;
            let cgroup = RunCgroup::existing(&state.cgroup);
            let socket = detach_socket(data_dir, &run_id);
            let sandbox = SandboxProcess::reattach(&socket, state.shim_pid, &cgroup)
                .map_err(|e| e.to_string())?;
            let _ = std::fs::remove_file(&socket);
            Ok(Reclaimed {
                run_id: run_id.clone(),
                signed,
                state,
                cgroup,
                sandbox,
            })
        };
        match attempt() {
            Ok(run) => reclaimed.push(run),
            Err(reason) => {
                let expired = records
                    .get(&run_id)?
                    .is_some_and(|record| record.expires_at <= tollgate_receipt::unix_now());
                let (state, reason) = if expired {
                    (
                        RunState::Expired,
                        "the receipt expired while the run was left detached by a live restore; its sandbox ended itself".to_owned(),
                    )
                } else {
                    (
                        RunState::Lost,
                        format!("left detached by a live restore and not re-adopted: {reason}"),
                    )
                };
                tracing::warn!(run_id = %run_id, state = state.name(), reason = %reason, "a run left detached was not re-adopted");
                ended.push(EndedDetached {
                    run_id,
                    state,
                    reason,
                });
            }
        }
    }
    Ok((reclaimed, ended))
}

impl RunManager {
    /// Detaches every live root run whose agent runs and that has no live child (live
    /// restore, at a clean stop); returns the ids of those left running. The others are torn
    /// down as at any stop.
    pub(super) fn detach_all(&self, window: Duration) -> BTreeSet<String> {
        let live: Vec<(String, Arc<LiveRun>)> = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(id, run)| (id.clone(), run.clone()))
            .collect();
        // Runs with a live child, through the family index (not a walk over every live run
        // for each run); the lock is not held while runs detach.
        let with_children: std::collections::HashSet<&str> = {
            let live_ids: std::collections::HashSet<&str> =
                live.iter().map(|(id, _)| id.as_str()).collect();
            let family = self.family.lock().unwrap_or_else(|p| p.into_inner());
            live.iter()
                .map(|(id, _)| id.as_str())
                .filter(|id| {
                    family
                        .children_of(id)
                        .any(|child| live_ids.contains(child.as_str()))
                })
                .collect()
        };
        let mut detached = BTreeSet::new();
        for (run_id, run) in &live {
            let has_children = with_children.contains(run_id.as_str());
            // Its input (stdin pipe or terminal) cannot be handed over either.
            let has_input = run
                .input
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some();
            if run.parent.is_some()
                || has_children
                || has_input
                || run.closing.load(Ordering::SeqCst)
            {
                continue;
            }
            match self.detach(run_id, run, window) {
                Ok(()) => {
                    detached.insert(run_id.clone());
                }
                Err(reason) => {
                    tracing::warn!(run_id = %run_id, reason = %reason, "could not leave a run running for live restore; it is torn down");
                }
            }
        }
        detached
    }

    /// Hands one run over to its pid 1 (see the module's documentation).
    fn detach(&self, run_id: &str, live: &LiveRun, window: Duration) -> Result<(), String> {
        let Some(handles) = live
            .restore
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return Err("its agent is not running".into());
        };
        let (tool_calls, tokens_used, expires_at, amended, egress_bytes) = {
            let guard = live.gateway.lock().unwrap_or_else(|p| p.into_inner());
            let Some((run, _)) = guard.as_ref() else {
                return Err("its gateway is gone".into());
            };
            let tokens = run
                .models
                .models
                .as_ref()
                .map_or(0, |models| models.tokens_used());
            (
                run.gate.calls.load(Ordering::SeqCst),
                tokens,
                run.gate.expires_at(),
                AmendedRun::of(run, live),
                (
                    run.egress.usage.sent.load(Ordering::SeqCst),
                    run.egress.usage.received.load(Ordering::SeqCst),
                ),
            )
        };
        let live_dir = self.settings.data_dir.join("live");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&live_dir)
            .map_err(|e| format!("{}: {e}", live_dir.display()))?;
        let socket = detach_socket(&self.settings.data_dir, run_id);
        let listener = bind_unix(&socket).map_err(|e| format!("{}: {e}", socket.display()))?;
        let until_ms = (u64::try_from(expires_at).unwrap_or(0).saturating_mul(1000))
            .min(now_ms().saturating_add(u64::try_from(window.as_millis()).unwrap_or(u64::MAX)));
        let state = DetachedRun {
            until_ms,
            cgroup: live.cgroup.relative().to_owned(),
            shim_pid: handles.shim_pid,
            argv: handles.argv.clone(),
            output_left: live.output_left.load(Ordering::SeqCst),
            tool_calls,
            tokens_used,
            started_ms: handles.started_ms,
            amended: Some(amended),
            egress_bytes,
        };
        let json = serde_json::to_string(&state).map_err(|e| e.to_string())?;
        // On disk before pid 1 is told: a crash in between leaves a record that names a
        // sandbox whose pid 1 still ends with its control socket (fail closed).
        self.records
            .set_detached(run_id, Some(&json))
            .map_err(|e| format!("recording the detach: {e}"))?;
        let fds = [
            OwnedFd::from(listener),
            handles.stdout.try_clone().map_err(|e| e.to_string())?,
            handles.stderr.try_clone().map_err(|e| e.to_string())?,
        ];
        // On the socket the watch reads, in one message (the gateway may be asking pid 1 for
        // a connection on it at the same time).
        let sent = send_blocking(
            &handles.control,
            &ToShim::Detach { until_ms },
            &fds,
            DETACH_ACK,
        );
        drop(fds);
        let confirmed = sent.is_ok() && live.wait_detached(DETACH_ACK);
        if !confirmed {
            let _ = self.records.set_detached(run_id, None);
            let _ = std::fs::remove_file(&socket);
            return Err(match sent {
                Err(e) => format!("sending the detach: {e}"),
                Ok(()) => "pid 1 did not confirm the detach".into(),
            });
        }
        // Calls arriving from now on wait in the socket's backlog for the next supervisor.
        if let Some((_, handle)) = live
            .gateway
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            handle.stop();
        }
        let entry = EntryDraft::new(COMPONENT, EntryKind::RunDetached)
            .receipt(run_id)
            .run(run_id)
            .reason("the supervisor stopped with live restore")
            .meta("until_ms", i64::try_from(until_ms).unwrap_or(i64::MAX))
            .meta("cgroup", live.cgroup.relative());
        if let Err(e) = self.audit.append(entry) {
            tracing::error!(run_id, error = %e, "could not audit a detach");
        }
        tracing::info!(run_id, until_ms, "run left running for live restore");
        Ok(())
    }

    /// Makes a reclaimed run live in this supervisor: its gateway served again on the same
    /// socket with the budgets it had left, its output relayed, its end watched. On failure
    /// the run is ended (`lost`) through the one teardown.
    pub(super) fn adopt(self: &Arc<Self>, run: Reclaimed) {
        let Reclaimed {
            run_id,
            signed,
            state,
            cgroup,
            sandbox,
        } = run;
        let dirs = RunDirs::new(&self.settings.data_dir.join("runs"), &run_id);
        let live = self.go_live(&run_id, cgroup, state.output_left, None);
        let ReattachedSandbox {
            process,
            output,
            execute,
            pid_one,
        } = sandbox;
        match self.serve_adopted(&signed, &state, &dirs, &live, (execute, pid_one)) {
            Ok(receipt) => {
                if let Err(e) = self.records.set_detached(&run_id, None) {
                    tracing::warn!(run_id = %run_id, error = %e, "could not clear the run's detached record");
                }
                let entry = EntryDraft::new(COMPONENT, EntryKind::RunReattached)
                    .receipt(run_id.as_str())
                    .run(run_id.as_str())
                    .meta("cgroup", live.cgroup.relative());
                if let Err(e) = self.audit.append(entry) {
                    tracing::error!(run_id = %run_id, error = %e, "could not audit a re-adoption");
                }
                tracing::info!(run_id = %run_id, "run re-adopted after a live restore");
                self.hub.open(&run_id);
                self.publish_end(&run_id);
                let tasks = RunTasks {
                    run_id,
                    expires_at: receipt.expires_at.as_ref().map_or(0, |t| t.seconds),
                    live,
                    dirs,
                    started_ms: state.started_ms,
                    // A re-adopted run can be left running again at the next clean stop.
                    restore: self
                        .settings
                        .live_restore
                        .is_some()
                        .then(|| (state.shim_pid, state.argv.clone(), state.started_ms)),
                };
                self.spawn_run_tasks(tasks, process, output, self.hub_sink());
            }
            Err(e) => {
                let reason = format!("re-adopting after a live restore failed: {e}");
                tracing::warn!(run_id = %run_id, reason = %reason, "run lost");
                live.trigger(RunState::Lost, reason);
                let exit = match super::lifecycle::watch(process) {
                    Watched::Ended(exit) => exit,
                    Watched::Detached => None,
                };
                drop(output);
                // Its end recorded before re-adoption goes on: a group of its own.
                self.teardown(
                    &Endings::default(),
                    &run_id,
                    &live,
                    &dirs,
                    super::teardown::Ended::Agent(exit, false),
                    state.started_ms,
                );
            }
        }
    }

    /// Builds the gateway of a re-adopted run (served once its watch runs); its verified
    /// receipt.
    fn serve_adopted(
        self: &Arc<Self>,
        signed: &SignedReceipt,
        state: &DetachedRun,
        dirs: &RunDirs,
        live: &Arc<LiveRun>,
        (execute, pid_one): (Vec<PathBuf>, OwnedFd),
    ) -> Result<tollgate_proto::v1::Receipt, StartError> {
        // Checked again as at its start (signature, window, audience, revocation as known
        // so far); revocations arriving later end it as any live run.
        let receipt = self.verify(signed)?;
        let grants = super::admit::pin_grants(&receipt)?;
        // The plan is for the gateway's side (exec, models): the sandbox, root file system
        // included, already exists.
        let rootfs = super::admit::pin_rootfs(&receipt, &self.settings.rootfs_dir)?;
        let mut plan = plan_for(
            &receipt,
            dirs,
            state_host_id(self, &receipt)?,
            state.argv.clone(),
            rootfs.as_ref().map(|r| r.path.as_path()),
        )?;
        plan.gateway_socket = Some(dirs.base.join("gateway.sock"));
        // The run's egress CA, which its sandbox trusts: its key was kept in the run's
        // directory.
        let ca = if crate::egress::ca::needs_ca(&receipt) {
            Some(Arc::new(
                crate::egress::ca::RunCa::load(&receipt, &dirs.base)
                    .map_err(|e| SandboxError::Setup(e.to_string()))?,
            ))
        } else {
            None
        };
        let run = self.gateway_for(&receipt, &plan, live, (signed, grants), ca);
        run.gate.calls.store(state.tool_calls, Ordering::SeqCst);
        run.egress
            .usage
            .sent
            .store(state.egress_bytes.0, Ordering::SeqCst);
        run.egress
            .usage
            .received
            .store(state.egress_bytes.1, Ordering::SeqCst);
        // What is left of its output came from the record; the budget in all is the
        // receipt's, or what a narrowing made of it.
        live.output_limit.store(
            receipt.limits.unwrap_or_default().output_bytes,
            Ordering::SeqCst,
        );
        if let Some(amended) = state.amended.clone() {
            amended.restore(&run, live);
        }
        if let Some(models) = &run.models.models {
            models.charge_restored(state.tokens_used);
        }
        if let Some(exec) = &run.exec.sandbox {
            exec.started.set(Ok(PinnedSandbox {
                pid_one: crate::sandbox::PidOne::Pinned(pid_one),
                execute,
            }));
        }
        self.keep_gateway(live, run, plan.gateway_socket.clone().unwrap_or_default());
        Ok(receipt)
    }
}

/// The host id a re-adopted run's record holds.
fn state_host_id(
    manager: &RunManager,
    receipt: &tollgate_proto::v1::Receipt,
) -> Result<u32, StartError> {
    manager
        .records
        .get(&receipt.receipt_id)?
        .map(|record| record.host_id)
        .ok_or_else(|| SandboxError::Setup("its record is gone".into()).into())
}
