//! The run lifecycle: admit a receipt, record it (single use), build its sandbox, relay its
//! output, and tear it down through one code path whatever ends it.
//!
//! Every trigger (agent exit, expiry, stop, revocation, limit, shim death, shutdown) does the
//! same two things: note why (the first reason wins) and kill the run's cgroup. The watch on the
//! run's shim (a task, see `lifecycle`) then sees the shim end and, on one of a few teardown
//! workers (`teardowns`), performs the one teardown: kill whatever is left in the cgroup,
//! read peak memory, remove the cgroup (with retries) and the run directory, and write the
//! teardown report. A supervisor that was killed instead finds the non-final
//! records at its next start, marks them `lost`, and sweeps their cgroups and directories.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tollgate_receipt::{unix_now, KeySet, SignedReceipt, VerifyError, VerifyFailure};
use tollgate_router_backends::ModelRoutes;
use tollgate_shim_protocol::plan::AgentInput;

use crate::admission::ReceiptAdmission;
use crate::cgroup::RunCgroup;
use crate::error::StartError;
use crate::gateway::{ChildOf, ChildRuns, Delegator, GatewayHandle, RunGateway};
use crate::host_ids::HostIds;
use crate::hub::RunHub;
use crate::records::{RecordsError, RunRecord, RunRecords, RunState};
use crate::warm::SandboxPool;
use crate::COMPONENT;
use family::{Family, Holds};
use teardowns::{Endings, RemovalGate, Teardowns};
use tollgate_audit::{AuditError, AuditLog, EntryDraft, EntryKind};

pub mod access;
mod admit;
pub mod amend;
mod family;
pub mod input;
mod lifecycle;
mod open;
mod restore;
mod start;
mod teardown;
mod teardowns;
pub mod workspace;

/// The longest live-restore window a supervisor accepts.
pub const MAX_LIVE_RESTORE_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// What detaching a live run for a live restore hands over, kept from the moment its agent
/// runs (root runs only): the very descriptors the run's tasks read, shared, not duplicates
/// (a run holds no more descriptors for being kept).
#[derive(Debug)]
struct RestoreHandles {
    /// The shim's control socket (the watch reads it; a detach writes to it).
    control: Arc<std::os::fd::OwnedFd>,
    /// The read ends of the agent's stdout and stderr (the relays read them).
    stdout: Arc<std::os::fd::OwnedFd>,
    stderr: Arc<std::os::fd::OwnedFd>,
    /// The host pid of the sandbox's pid 1 (recorded as `shim_pid`).
    shim_pid: u32,
    /// The argv given at the start, if any.
    argv: Option<Vec<String>>,
    /// When the run was admitted (Unix milliseconds).
    started_ms: u64,
}

/// What keeping a run for a live restore records besides its descriptors: its pid 1's host
/// pid, the argv given at the start, and when the run was admitted (Unix milliseconds).
type RestoreMeta = (u32, Option<Vec<String>>, u64);

/// Fetches the authority's key set now, or `None` (not fetched: too soon after the last
/// fetch, or the authority did not answer). Blocking.
pub type KeyRefresh = Arc<dyn Fn() -> Option<KeySet> + Send + Sync>;

/// How long teardown waits for a cgroup to empty after killing it.
const KILL_DEADLINE: Duration = Duration::from_secs(5);

/// Static settings of a supervisor's run manager.
#[derive(Debug, Clone)]
pub struct RunSettings {
    /// Data directory (`supervisor.db`, `runs/`).
    pub data_dir: PathBuf,
    /// This supervisor's id: receipts must name it in their audience.
    pub supervisor_id: String,
    /// The `tollgate-shim` binary.
    pub shim: PathBuf,
    /// Parent cgroup of every run (`<parent>/shard-NN/sandbox-<uuid>`; see
    /// [`crate::cgroup::sandbox_path`]).
    pub cgroup_parent: String,
    /// Host uids/gids handed to sandboxes, one per live run.
    pub host_ids: std::ops::Range<u32>,
    /// Tolerated clock skew when checking validity windows.
    pub clock_skew: Duration,
    /// How many sandboxes to keep prepared ahead of need (0: prepare each on demand).
    pub warm_sandboxes: usize,
    /// Live restore: at a clean stop, root runs keep running detached for at most this long
    /// (and never past their receipt's expiry) for the next supervisor to re-adopt. `None`:
    /// a stop ends every run.
    pub live_restore: Option<Duration>,
    /// Where root file systems registered by name live (`<dir>/<name>`).
    pub rootfs_dir: PathBuf,
    /// Runs' outbound connections: names resolved here first (`--egress-hosts`), secrets
    /// injected (`--egress-secrets`), upstream roots.
    pub egress: Arc<crate::egress::config::EgressConfig>,
}

/// Which stream a chunk of output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    /// The agent's stdout.
    Stdout,
    /// The agent's stderr.
    Stderr,
}

/// Receives a run's output as it arrives: `(run_id, stream, bytes)`.
pub type OutputSink = Arc<dyn Fn(&str, OutputStream, &[u8]) + Send + Sync>;

/// A live run's shared state.
struct LiveRun {
    cgroup: RunCgroup,
    /// Bytes of output the run may still relay; children's `output_bytes` are carved from it.
    output_left: Arc<AtomicU64>,
    /// The run's output budget in all (the receipt's, or lower after a narrowing): what a
    /// narrowing's new budget is measured against.
    output_limit: Arc<AtomicU64>,
    /// The run that delegated this one, if any: its end ends this run too.
    parent: Option<String>,
    /// The Landlock ABI the shim reported.
    landlock_abi: OnceLock<u32>,
    /// Set as soon as the run is ending (a trigger, or teardown): the gateway serves no call
    /// from then on.
    closing: Arc<std::sync::atomic::AtomicBool>,
    /// The run's gateway (its calls, for the report) and the served socket.
    gateway: Mutex<Option<(Arc<RunGateway>, GatewayHandle)>>,
    /// The first trigger's state and reason.
    trigger: Mutex<Option<(RunState, String)>>,
    /// Set (with a notify) when teardown has finished.
    ended: Mutex<bool>,
    ended_signal: Condvar,
    /// Sent on every change the run's tasks wait for: its end, a new expiry, a detach (the
    /// tasks' side of `ended_signal` and `detached_signal`).
    changes: tokio::sync::watch::Sender<()>,
    /// The expiry an amendment set (Unix seconds; 0: the receipt's). Changed with a notify on
    /// `changes`, so the expiry task waits for the new one.
    amended_expiry: std::sync::atomic::AtomicI64,
    /// What a live restore hands the shim; set once the agent runs (root runs only).
    restore: Mutex<Option<RestoreHandles>>,
    /// Set (with a notify) once pid 1 has confirmed a detach: this process leaves the run
    /// to the next supervisor and never tears it down.
    detached: Mutex<bool>,
    detached_signal: Condvar,
    /// The supervisor's end of the agent's input (`tollgate run -i`/`-t`): the write end of
    /// its stdin pipe, or its terminal's master. Closed (EOF) by `CloseInput` or teardown.
    input: Mutex<Option<std::fs::File>>,
}

impl LiveRun {
    /// Raises the run's output budget in all to `limit` (a signed amendment; never lowers
    /// it): what it has left gains as much as the budget did.
    fn raise_output(&self, limit: u64) {
        let before = self.output_limit.fetch_max(limit, Ordering::SeqCst);
        self.output_left
            .fetch_add(limit.saturating_sub(before), Ordering::SeqCst);
    }

    /// Lowers the run's output budget in all to `limit` (never raises it): what it has left
    /// loses as much as the budget did.
    fn lower_output(&self, limit: u64) {
        let before = self.output_limit.fetch_min(limit, Ordering::SeqCst);
        let cut = before.saturating_sub(limit);
        let _ = self
            .output_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                Some(left.saturating_sub(cut))
            });
    }

    /// Moves the run's expiry to `expires_at` (Unix seconds) and wakes its expiry task.
    fn set_expiry(&self, expires_at: i64) {
        self.amended_expiry.store(expires_at, Ordering::SeqCst);
        self.changes.send_replace(());
    }

    /// Whether teardown has finished.
    fn is_ended(&self) -> bool {
        *self.ended.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes that teardown has finished, for blocking waiters and tasks alike.
    fn set_ended(&self) {
        *self.ended.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.ended_signal.notify_all();
        self.changes.send_replace(());
    }

    /// The trigger noted so far, if any.
    fn pending(&self) -> Option<(RunState, String)> {
        self.trigger
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Keeps what detaching this run for a live restore hands over. Without it the run is
    /// torn down at the next stop, as without live restore.
    fn keep_for_restore(&self, handles: RestoreHandles) {
        *self.restore.lock().unwrap_or_else(|p| p.into_inner()) = Some(handles);
    }

    /// Whether pid 1 has taken the run over for a live restore.
    fn is_detached(&self) -> bool {
        *self.detached.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes pid 1's `Detached`.
    fn set_detached(&self) {
        *self.detached.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.detached_signal.notify_all();
        self.changes.send_replace(());
    }

    /// Waits up to `timeout` for pid 1's `Detached`.
    fn wait_detached(&self, timeout: Duration) -> bool {
        let detached = self.detached.lock().unwrap_or_else(|p| p.into_inner());
        let (detached, _) = self
            .detached_signal
            .wait_timeout_while(detached, timeout, |detached| !*detached)
            .unwrap_or_else(|p| p.into_inner());
        *detached
    }

    /// Kills the cgroup if a trigger is pending (one may have come before anything ran).
    fn enforce_pending(&self) {
        if self.pending().is_some() {
            if let Err(e) = self.cgroup.kill_all(KILL_DEADLINE) {
                tracing::warn!(error = %e, "killing a run's cgroup failed; teardown retries");
            }
        }
    }

    /// Notes why the run ends (the first reason wins), kills its cgroup and waits until it
    /// is empty.
    fn trigger(&self, state: RunState, reason: String) {
        self.note_trigger(state, reason);
        if let Err(e) = self.cgroup.kill_all(KILL_DEADLINE) {
            tracing::warn!(error = %e, "killing a run's cgroup failed; teardown retries");
        }
    }

    /// [`Self::trigger`] without the wait: the kill is sent, and the run's teardown (which
    /// kills again and waits until the cgroup is empty) follows once its shim has died.
    fn trigger_without_waiting(&self, state: RunState, reason: String) {
        self.note_trigger(state, reason);
        if let Err(e) = self.cgroup.signal_kill() {
            tracing::warn!(error = %e, "killing a run's cgroup failed; teardown retries");
        }
    }

    /// Marks the run closing and notes the first trigger's state and reason.
    fn note_trigger(&self, state: RunState, reason: String) {
        self.closing.store(true, Ordering::SeqCst);
        let mut trigger = self.trigger.lock().unwrap_or_else(|p| p.into_inner());
        if trigger.is_none() {
            *trigger = Some((state, reason));
        }
    }
}

/// Starts, tracks and tears down runs.
pub struct RunManager {
    settings: RunSettings,
    records: RunRecords,
    admission: RwLock<ReceiptAdmission>,
    sandboxes: Arc<SandboxPool>,
    audit: AuditLog,
    /// The supervisor's model routes, when it has any (set once, before runs start).
    models: RwLock<Option<Arc<ModelRoutes>>>,
    /// The authority link for delegation, when this supervisor has a delegation token.
    delegator: OnceLock<Arc<Delegator>>,
    /// Fetches the authority's key set now (rate-limited), when this supervisor follows one:
    /// asked before refusing a receipt signed by a key it does not know yet.
    key_refresh: OnceLock<KeyRefresh>,
    /// Whether the authority's revocations are fresh enough to admit new runs, when this
    /// supervisor follows one.
    freshness: OnceLock<Arc<crate::link::RevocationFreshness>>,
    /// Every run's output and end, for WatchRun and WatchChild.
    hub: Arc<RunHub>,
    /// Gateway calls waiting for an operator's approval, across every run.
    approvals: Arc<crate::approvals::ApprovalBoard>,
    /// Live children by parent, and what they hold of its limits (taken at admission, under
    /// `allocation`, given back at their end). Locked after `live` where both are held.
    family: Mutex<Family>,
    /// The host id each live run holds (taken at admission, under `allocation`, given back
    /// once its final record is written).
    host_ids: Mutex<HostIds>,
    /// Serves the runs' gateway sockets and runs their lifecycle tasks (its own threads:
    /// agents' calls never wait behind the operator API). `None` only while dropping.
    gateway_runtime: Option<tokio::runtime::Runtime>,
    /// The gateway runtime's handle, where every live run's lifecycle tasks run (see
    /// `lifecycle`): a fixed set of threads whatever the number of runs.
    tasks: tokio::runtime::Handle,
    /// The few threads that do every run's blocking end work (teardown, an expiry's kill,
    /// publishing the end), in the order the runs ended: however many end at once, the
    /// supervisor's threads stay bounded (see `teardowns`).
    teardowns: Teardowns,
    /// Runs cleaned up by the teardown workers whose ends are being made durable together.
    endings: Endings<(Arc<LiveRun>, Instant)>,
    /// Held by a stop while every sandbox exits; teardowns remove cgroups only after.
    removals: RemovalGate,
    live: Mutex<HashMap<String, Arc<LiveRun>>>,
    allocation: Mutex<()>,
    closing: std::sync::atomic::AtomicBool,
    /// Starts past the allocation step that have not returned yet.
    in_flight: AtomicUsize,
    /// Set when a shutdown left runs running detached (live restore).
    left_detached: std::sync::atomic::AtomicBool,
}

impl Drop for RunManager {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which panics when the last handle goes inside async code.
        if let Some(runtime) = self.gateway_runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl std::fmt::Debug for RunManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunManager")
            .field("supervisor_id", &self.settings.supervisor_id)
            .finish_non_exhaustive()
    }
}

/// Where, in the supervisor's data directory `data_dir`, a stop records the parent cgroup's
/// CPU weight before raising it (see [`crate::cgroup::raise_for_stop`]); the next start puts
/// it back from there if the stop did not finish.
pub fn stop_weight_record(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("stop-cpu-weight.json")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl RunManager {
    /// Gives admission a way to fetch the key set when a receipt names an unknown key (once;
    /// later calls are ignored).
    pub fn set_key_refresh(&self, refresh: KeyRefresh) {
        let _ = self.key_refresh.set(refresh);
    }

    /// Makes admissions wait while the authority's revocations are stale (once; later calls
    /// are ignored).
    pub fn set_revocation_freshness(&self, freshness: Arc<crate::link::RevocationFreshness>) {
        let _ = self.freshness.set(freshness);
    }

    /// `Err` while new runs must wait for the authority's revocations.
    pub(crate) fn check_fresh(&self) -> Result<(), StartError> {
        match self.freshness.get() {
            Some(freshness) => freshness.check().map_err(StartError::Stale),
            None => Ok(()),
        }
    }

    /// Verifies `signed` now: signature, window, audience, revocation. A receipt signed by
    /// a key this supervisor does not know (the authority rotated since it last fetched the
    /// key set) gets one fresh look at the key set before it is refused.
    pub(crate) fn verify(
        &self,
        signed: &SignedReceipt,
    ) -> Result<tollgate_proto::v1::Receipt, VerifyError> {
        let admit = || {
            self.admission
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .admit(signed, unix_now())
        };
        match admit() {
            Err(e) if e.failure() == VerifyFailure::UnknownKey && self.refresh_keys() => admit(),
            verified => verified,
        }
    }

    /// Refreshes the key set from the authority; whether it may have changed (this call
    /// fetched it, or another did a moment ago).
    fn refresh_keys(&self) -> bool {
        let Some(refresh) = self.key_refresh.get() else {
            return false;
        };
        if let Some(keys) = refresh() {
            tracing::info!(
                keys = keys.key_ids().count(),
                "key set refreshed for a receipt signed by a key not known yet"
            );
            self.set_keys(keys);
        }
        true
    }

    /// Replaces the trusted keys (after fetching the authority's key set again; revocations
    /// are kept).
    pub fn set_keys(&self, keys: KeySet) {
        crate::metrics::get().key_set_replaced();
        let mut admission = self.admission.write().unwrap_or_else(|p| p.into_inner());
        let mut fresh = ReceiptAdmission::new(
            self.settings.supervisor_id.clone(),
            keys,
            self.settings.clock_skew,
        );
        fresh.copy_revocations_from(&admission);
        *admission = fresh;
    }

    /// Records a revocation; a live run of that receipt is torn down, with its descendants.
    /// The reason given at revocation is the run's (`the receipt was revoked: <reason>`).
    pub fn revoke(&self, receipt_id: &str, reason: &str) {
        self.admission
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .revoke(receipt_id, reason);
        self.end_tree(
            receipt_id,
            RunState::Revoked,
            &crate::admission::revoked_reason(reason),
        );
    }

    /// Ends `run_id` with `state` and, with it, every live run it delegated (transitively),
    /// as `parent_ended`. Returns `false` when `run_id` is not live.
    ///
    /// Every descendant is marked closing under the live-runs lock, before any is killed: a
    /// child being started concurrently is either seen here, or sees its parent closing
    /// when it checks (see `start_recorded`), so none escapes the cascade.
    pub fn end_tree(&self, run_id: &str, state: RunState, reason: &str) -> bool {
        let Some(root) = self.live_run(run_id) else {
            return false;
        };
        // Closing before its descendants are looked for: a child starting from now on sees it.
        root.closing.store(true, Ordering::SeqCst);
        std::thread::scope(|scope| {
            scope.spawn(|| self.cascade(run_id, state, reason));
            root.trigger(state, reason.to_owned());
        });
        true
    }

    /// Ends an expired run and every run it delegated without waiting for the run itself:
    /// its kill is sent (its teardown, once its shim has died, waits for its cgroup to
    /// empty), then its descendants end as at any run's end. Nothing when it is not live.
    fn expire_tree(&self, run_id: &str, reason: &str) {
        let Some(root) = self.live_run(run_id) else {
            return;
        };
        // Closing (in the trigger) before its descendants are looked for: a child starting
        // from now on sees it.
        root.trigger_without_waiting(RunState::Expired, reason.to_owned());
        self.cascade(run_id, RunState::Expired, reason);
    }

    /// Marks every live descendant of `run_id` closing (breadth first, under the lock) and
    /// returns each with its parent's id.
    /// Children are found through their parent (see [`family`]), never by walking every
    /// live run: this runs at every teardown.
    fn mark_descendants(&self, run_id: &str) -> Vec<(Arc<LiveRun>, String)> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let family = self.family.lock().unwrap_or_else(|p| p.into_inner());
        let mut found: Vec<(Arc<LiveRun>, String)> = Vec::new();
        let mut frontier = vec![run_id.to_owned()];
        while !frontier.is_empty() {
            let mut next = Vec::new();
            for parent in &frontier {
                for id in family.children_of(parent) {
                    // A child admitted but not started yet has no sandbox to end: it sees its
                    // parent closing when it is made live (see `start_recorded`).
                    if let Some(run) = live.get(id) {
                        run.closing.store(true, Ordering::SeqCst);
                        found.push((run.clone(), parent.clone()));
                        next.push(id.clone());
                    }
                }
            }
            frontier = next;
        }
        found
    }

    /// Triggers the live descendants of a run that is ending (the run itself is already).
    fn cascade(&self, run_id: &str, state: RunState, reason: &str) {
        let descendants = self.mark_descendants(run_id);
        if descendants.is_empty() {
            return;
        }
        let cascade = descendant_reason(run_id, state, reason);
        std::thread::scope(|scope| {
            for (child, parent) in &descendants {
                let reason = cascade(parent);
                scope.spawn(move || child.trigger(RunState::ParentEnded, reason));
            }
        });
    }

    fn live_run(&self, run_id: &str) -> Option<Arc<LiveRun>> {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(run_id)
            .cloned()
    }

    /// The runs' event hub.
    pub fn hub(&self) -> &RunHub {
        &self.hub
    }

    /// The calls waiting for an operator's approval.
    pub fn approvals(&self) -> &crate::approvals::ApprovalBoard {
        &self.approvals
    }

    /// Gives runs started from now on a way to delegate (once; later calls are ignored).
    pub fn set_delegator(&self, delegator: Arc<Delegator>) {
        let _ = self.delegator.set(delegator);
    }

    /// Verifies a child receipt the authority minted for `parent` (signature, window,
    /// audience, revocation), as it will be at its start; the decoded receipt, or why not.
    pub(crate) fn verify_child(
        &self,
        signed: &SignedReceipt,
        parent: &str,
    ) -> Result<tollgate_proto::v1::Receipt, String> {
        let receipt = self
            .verify(signed)
            .map_err(|e| format!("the authority's child receipt does not verify here: {e}"))?;
        if receipt.parent_receipt_id != parent || receipt.depth == 0 {
            return Err(format!(
                "the authority's receipt {} is not a child of run {parent}",
                receipt.receipt_id
            ));
        }
        Ok(receipt)
    }

    /// `run_id`'s tree: its record and its descendants' (pre-order), and the child receipts
    /// minted in the tree and not started yet. `NotFound`-like: empty runs.
    pub fn tree(&self, run_id: &str) -> Result<tollgate_proto::v1::RunTree, RecordsError> {
        let records = self.records.subtree(run_id)?;
        let mut pending = Vec::new();
        for record in &records {
            if let Some(run) = self.live_run(&record.run_id) {
                if let Some((gateway, _)) = &*run.gateway.lock().unwrap_or_else(|p| p.into_inner())
                {
                    pending.extend(gateway.children.state.pending_children(&record.run_id));
                }
            }
        }
        Ok(tollgate_proto::v1::RunTree {
            runs: records.iter().map(|record| self.run_view(record)).collect(),
            pending,
        })
    }

    /// Gives runs started from now on these model routes (a reload calls it again; runs
    /// already live keep theirs).
    pub fn set_model_routes(&self, routes: Arc<ModelRoutes>) {
        *self.models.write().unwrap_or_else(|p| p.into_inner()) = Some(routes);
    }

    /// The model routes runs starting now get (a reload replaces them for later runs; a
    /// live run keeps the ones it started with).
    pub(crate) fn model_routes(&self) -> Option<Arc<ModelRoutes>> {
        self.models
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Asks a live run, and every run it delegated, to stop. Returns `false` when it is not
    /// live.
    pub fn stop(&self, run_id: &str, reason: &str) -> bool {
        self.end_tree(run_id, RunState::Stopped, reason)
    }

    /// Stops admitting runs, tears down every live run (supervisor shutdown) and waits for
    /// each.
    pub fn shutdown(&self) {
        {
            let _guard = self.allocation.lock().unwrap_or_else(|p| p.into_inner());
            self.closing.store(true, Ordering::SeqCst);
        }
        self.sandboxes.close();
        // Starts already past admission finish first (they are then live, or failed).
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        // Live restore: root runs are handed to their pid 1 and left running; they leave
        // this supervisor's live runs, so nothing here (a second shutdown included) ends them.
        let detached = match self.settings.live_restore {
            Some(window) => self.detach_all(window),
            None => Default::default(),
        };
        let live: Vec<(String, Arc<LiveRun>)> = {
            let mut runs = self.live.lock().unwrap_or_else(|p| p.into_inner());
            for run_id in &detached {
                runs.remove(run_id);
            }
            runs.iter()
                .map(|(id, run)| (id.clone(), run.clone()))
                .collect()
        };
        if !detached.is_empty() {
            self.left_detached.store(true, Ordering::SeqCst);
        }
        // From the kill until the runs are removed, their sandboxes outweigh the kernel's
        // workers cleaning up after them (see `cgroup::raise_for_stop`).
        let weight = if live.is_empty() {
            None
        } else {
            let record = stop_weight_record(&self.settings.data_dir);
            match crate::cgroup::raise_for_stop(&self.settings.cgroup_parent, &record) {
                Ok(weight) => Some(weight),
                Err(e) => {
                    tracing::warn!(error = %e, "could not raise the parent cgroup's CPU weight for the stop");
                    None
                }
            }
        };
        // Every run's kill is sent before any is waited for: the kernel then ends their
        // processes and namespaces side by side, and their teardowns run side by side on
        // the blocking pool. Killed and waited for one run at a time, the stop took one
        // sandbox's exit (its processes, namespaces and mounts) per live run, in series:
        // 45 s for 4,800 live runs.
        //
        // Where the kernel kills a whole subtree at once (`cgroup.kill`), one write to the
        // runs' parent kills them all, once every run has noted why it ends (its teardown
        // reads the reason). Run by run, the writes (each under the kernel's cgroup mutex,
        // which the first runs' cgroup removals also take) delayed the last runs' kills.
        const SHUTDOWN: &str = "the supervisor shut down";
        for (_, run) in &live {
            run.note_trigger(RunState::SupervisorShutdown, SHUTDOWN.into());
        }
        // The teardowns remove no cgroup until every sandbox has exited (see `RemovalGate`).
        self.removals.hold();
        // Never where a run was left detached (live restore), by this stop or an earlier
        // one (a second shutdown finds no run live): its sandbox is under the same parent.
        let killed_all = !live.is_empty()
            && detached.is_empty()
            && !self.left_detached()
            && crate::cgroup::kill_subtree(&self.settings.cgroup_parent).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "could not kill every run at once; killing each");
                false
            });
        if killed_all {
            let parent = &self.settings.cgroup_parent;
            match crate::cgroup::wait_subtree_empty(parent, Duration::from_secs(10)) {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!("processes were left under the parent cgroup after the kill; tearing down regardless");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not tell whether every sandbox exited; tearing down regardless");
                }
            }
        }
        self.removals.open();
        if !killed_all {
            for (_, run) in &live {
                run.trigger_without_waiting(RunState::SupervisorShutdown, SHUTDOWN.into());
            }
        }
        for (id, _) in live {
            self.wait(&id, Duration::from_secs(30));
        }
        // Any cgroup a failed teardown left, and the shards the runs' cgroups were in: a
        // clean stop leaves nothing under the parent. Not where a run was left detached: its
        // cgroup is in one of them.
        if !self.left_detached() {
            let parent = &self.settings.cgroup_parent;
            let cleared = crate::cgroup::sweep(parent, false)
                .and_then(|_| crate::cgroup::remove_shards(parent));
            if let Err(e) = cleared {
                tracing::warn!(error = %e, "could not remove what was left under the parent cgroup");
            }
        }
        if let Some(Err(e)) = weight.map(crate::cgroup::StopWeight::restore) {
            tracing::error!(error = %e, "could not put back the parent cgroup's CPU weight after the stop");
        }
        // A clean stop ends the log with an entry and a signed checkpoint.
        let stopped = self
            .audit
            .append(
                EntryDraft::new(COMPONENT, EntryKind::ComponentStopped).meta(
                    "runs_left_detached",
                    detached.into_iter().collect::<Vec<_>>(),
                ),
            )
            .and_then(|_| self.audit.close());
        if let Err(e) = stopped {
            // Closing twice (a second shutdown) is not an error; anything else is logged.
            if !matches!(e, AuditError::Closed) {
                tracing::error!(error = %e, "could not close the audit log");
            }
        }
    }

    /// Whether a shutdown left runs running detached (live restore): their cgroups stay
    /// under the parent for the next supervisor.
    pub fn left_detached(&self) -> bool {
        self.left_detached.load(Ordering::SeqCst)
    }

    /// Waits until `run_id` has been torn down (or `timeout`), then returns its record.
    pub fn wait(&self, run_id: &str, timeout: Duration) -> Option<RunRecord> {
        if let Some(run) = self.live_run(run_id) {
            let ended = run.ended.lock().unwrap_or_else(|p| p.into_inner());
            let _ = run
                .ended_signal
                .wait_timeout_while(ended, timeout, |ended| !*ended);
        }
        self.records.get(run_id).ok().flatten()
    }

    /// One run's record.
    pub fn get(&self, run_id: &str) -> Result<Option<RunRecord>, RecordsError> {
        self.records.get(run_id)
    }

    /// A run as clients see it: its record, and for a live run its model use so far (an
    /// ended run's is in its report).
    pub fn run_view(&self, record: &RunRecord) -> tollgate_proto::v1::Run {
        let mut run = crate::wire::run_proto(record);
        if let Some(live) = self.live_run(&record.run_id) {
            let gateway = live.gateway.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((gateway, _)) = gateway.as_ref() {
                run.workspace_keep_seconds = gateway.gate.receipt.workspace_keep_seconds;
                if let Some(models) = gateway.models.models.as_ref() {
                    run.model_usage = models
                        .usage()
                        .iter()
                        .map(crate::wire::usage_proto)
                        .collect();
                }
            }
        }
        run
    }

    /// All runs, newest first.
    pub fn list(&self) -> Result<Vec<RunRecord>, RecordsError> {
        self.records.list()
    }

    /// Runs that are not over, newest first (through the state index).
    pub fn list_live(&self) -> Result<Vec<RunRecord>, RecordsError> {
        self.records.list_live()
    }

    /// `run_id` and its descendants in pre-order (empty when unknown).
    pub fn subtree(&self, run_id: &str) -> Result<Vec<RunRecord>, RecordsError> {
        self.records.subtree(run_id)
    }

    /// Ids of runs with a live sandbox.
    pub fn live_ids(&self) -> Vec<String> {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }
}

/// Delegation on a run's gateway reaches the supervisor's runs only through this.
impl ChildRuns for RunManager {
    fn verify_child(
        &self,
        signed: &SignedReceipt,
        parent: &str,
    ) -> Result<tollgate_proto::v1::Receipt, String> {
        RunManager::verify_child(self, signed, parent)
    }

    fn start_child(
        self: Arc<Self>,
        signed: &SignedReceipt,
        argv: Option<Vec<String>>,
        child: ChildOf,
    ) -> Result<String, StartError> {
        self.start_published(signed, argv, AgentInput::Null, Some(child))
    }

    fn get(&self, run_id: &str) -> Result<Option<RunRecord>, RecordsError> {
        RunManager::get(self, run_id)
    }

    fn subtree(&self, run_id: &str) -> Result<Vec<RunRecord>, RecordsError> {
        RunManager::subtree(self, run_id)
    }

    fn tree(&self, run_id: &str) -> Result<tollgate_proto::v1::RunTree, RecordsError> {
        RunManager::tree(self, run_id)
    }

    fn subscribe(&self, run_id: &str) -> Option<crate::hub::Subscription> {
        self.hub.subscribe(run_id)
    }

    fn stop(&self, run_id: &str, reason: &str) -> bool {
        RunManager::stop(self, run_id, reason)
    }

    fn wait(&self, run_id: &str, timeout: Duration) -> Option<RunRecord> {
        RunManager::wait(self, run_id, timeout)
    }
}

/// How a cascade explains itself to each descendant, given the descendant's parent id.
fn descendant_reason<'a>(
    root: &'a str,
    state: RunState,
    reason: &'a str,
) -> impl Fn(&str) -> String + 'a {
    move |parent: &str| {
        if parent == root {
            format!("its parent run {root} ended ({}: {reason})", state.name())
        } else {
            format!("its ancestor run {root} ended ({}: {reason})", state.name())
        }
    }
}
