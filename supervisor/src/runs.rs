//! The run lifecycle: admit a receipt, record it (single use), build its sandbox, relay its
//! output, and tear it down through one code path whatever ends it.
//!
//! Every trigger (agent exit, expiry, stop, revocation, limit, shim death, shutdown) does the
//! same two things: note why (the first reason wins) and kill the run's cgroup. The run's own
//! thread then sees the shim end and performs the one teardown: kill whatever is left in the
//! cgroup, read peak memory, remove the cgroup (with retries) and the run directory, and
//! write the teardown report. A supervisor that was killed instead finds the non-final
//! records at its next start, marks them `lost`, and sweeps their cgroups and directories.

use std::collections::HashMap;
use std::io::Read as _;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use prost::Message as _;
use tollgate_receipt::{unix_now, KeySet, SignedReceipt, VerifyError};
use tollgate_shim_protocol::plan::SandboxPlan;
use tollgate_shim_protocol::protocol::{AgentExit, FromShim};

use crate::admission::ReceiptAdmission;
use crate::cgroup::{sweep, CgroupError, CgroupLimits, RunCgroup};
use crate::children::{ChildControl, ChildState, Delegator};
use crate::complete::{ModelRoutes, RunModels};
use crate::exec::{ExecLimits, ExecSandbox, PinnedSandbox};
use crate::gateway::{self, FsGrant, GatewayHandle, RunGateway};
use crate::hub::RunHub;
use crate::records::{NewRun, RecordsError, RunRecord, RunRecords, RunState, TeardownReport};
use crate::sandbox::{
    create_mount_point, plan_for, sandbox_base, IdleShim, RunDirs, SandboxError, SandboxOutput,
    SandboxProcess,
};
use crate::snapshot::SnapshotStore;
use crate::warm::{PreparedSandbox, SandboxPool};
use tollgate_audit::{AuditError, AuditLog, Decision, EntryDraft, EntryKind, PendingEntry};

/// This component's name in audit entries.
pub const COMPONENT: &str = "supervisor";

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
    /// Parent cgroup of every run (`<parent>/<run_id>`).
    pub cgroup_parent: String,
    /// Host uids/gids handed to sandboxes, one per live run.
    pub host_ids: std::ops::Range<u32>,
    /// Tolerated clock skew when checking validity windows.
    pub clock_skew: Duration,
    /// How many sandboxes to keep prepared ahead of need (0: prepare each on demand).
    pub warm_sandboxes: usize,
}

/// Why a run could not start. Nothing was spawned.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The receipt failed verification (the reason is typed).
    #[error(transparent)]
    Receipt(#[from] VerifyError),
    /// The receipt already started a sandbox (single use).
    #[error("receipt {0} has already been used to start a run; mint a new one")]
    AlreadyUsed(String),
    /// An argv was given but the receipt pins its agent.
    #[error("receipt {0} pins its agent command; start it without an argv")]
    ArgvNotAllowed(String),
    /// Every host id of the configured range is in use.
    #[error("no free sandbox host id in {0:?}: too many live runs")]
    NoHostId(std::ops::Range<u32>),
    /// The sandbox could not be planned or built.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// The cgroup could not be created with the receipt's limits.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// Recording the run failed.
    #[error(transparent)]
    Records(#[from] RecordsError),
    /// The audit log could not record the start: nothing runs unaudited.
    #[error("audit log: {0}")]
    Audit(#[from] AuditError),
    /// The supervisor is shutting down and starts nothing new.
    #[error("the supervisor is shutting down; start the run elsewhere or after it restarts")]
    ShuttingDown,
    /// A child would take its live siblings past their parent's memory, pids or cpu.
    #[error("{0}")]
    ChildrenLimits(String),
    /// A granted path cannot be pinned as signed (a symbolic link on it, or a mounted grant
    /// that does not exist): refused before the receipt is spent.
    #[error("{reason}")]
    Grant {
        /// Stable code: `grant_link`, `grant_missing`.
        code: &'static str,
        /// One line naming the grant and what is wrong with it.
        reason: String,
    },
    /// A delegation rule refused the start (`code` names which, for the audit entry).
    #[error("{reason}")]
    Delegated {
        /// Stable code: `delegated`, `parent_not_live`, `grant_escapes`, `children_limits`.
        code: &'static str,
        /// One line naming the rule and what broke it.
        reason: String,
    },
}

impl StartError {
    /// Stable code for audit entries.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Receipt(e) => e.failure().code(),
            Self::AlreadyUsed(_) => "already_used",
            Self::ArgvNotAllowed(_) => "argv_not_allowed",
            Self::NoHostId(_) => "no_host_id",
            Self::ShuttingDown => "shutting_down",
            Self::Delegated { code, .. } | Self::Grant { code, .. } => code,
            Self::ChildrenLimits(_) => "children_limits",
            Self::Sandbox(SandboxError::NoAgent | SandboxError::NotExecutable(_)) => "argv",
            Self::Sandbox(_) | Self::Cgroup(_) | Self::Records(_) | Self::Audit(_) => "internal",
        }
    }
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

/// A delegated run's place in its tree: started through the gateway of the live run
/// `parent`, with its grants pinned beneath the parent's (see `children.rs`).
pub(crate) struct ChildOf {
    /// The parent run.
    pub(crate) parent: String,
    /// The child's fs grants, resolved beneath the parent's pinned ones.
    pub(crate) grants: Vec<FsGrant>,
    /// The parent's limits: its live children together stay within its memory, pids and
    /// cpu.
    pub(crate) parent_limits: tollgate_proto::v1::Limits,
}

/// Pins every fs grant of a root run's receipt (see [`GrantRoot::open`]): a symbolic link
/// anywhere on a granted path refuses the start, naming the link; so does a mounted grant
/// that does not exist. A gateway-only grant that cannot be opened for another reason is kept
/// as such: its calls are refused, naming why.
fn pin_grants(receipt: &tollgate_proto::v1::Receipt) -> Result<Vec<FsGrant>, StartError> {
    receipt
        .fs
        .iter()
        .enumerate()
        .map(|(i, grant)| {
            let pinned = FsGrant::open(
                &grant.path,
                grant.access == tollgate_proto::v1::FsAccess::Write as i32,
            );
            match &pinned.root {
                Err(Errno::ELOOP) => {
                    let link = crate::beneath::first_link(&grant.path)
                        .unwrap_or_else(|| grant.path.clone());
                    Err(StartError::Grant {
                        code: "grant_link",
                        reason: format!(
                            "fs[{i}] = {}: {link} is a symbolic link, and links are never followed in a granted path; grant the real path instead",
                            grant.path
                        ),
                    })
                }
                Err(errno) if !grant.mount.is_empty() => Err(StartError::Grant {
                    code: "grant_missing",
                    reason: format!(
                        "fs[{i}] = {}: the mounted grant cannot be opened on this host ({errno})",
                        grant.path
                    ),
                }),
                _ => Ok(pinned),
            }
        })
        .collect()
}

/// Detached copies of the mounted grants' trees (in the order of the receipt's mounted
/// grants, as the plan's binds), taken from the pinned descriptors.
fn detached_mounts(
    receipt: &tollgate_proto::v1::Receipt,
    grants: &[FsGrant],
) -> Result<Vec<OwnedFd>, StartError> {
    receipt
        .fs
        .iter()
        .zip(grants)
        .filter(|(grant, _)| !grant.mount.is_empty())
        .map(|(grant, pinned)| {
            let mount = match &pinned.root {
                Ok(root) => crate::beneath::detached_mount(root),
                Err(errno) => Err(*errno),
            };
            mount.map_err(|e| {
                SandboxError::Setup(format!("mounting the grant {}: {e}", grant.path)).into()
            })
        })
        .collect()
}

/// What a live child holds of its parent's concurrent limits: memory bytes, pids, cpu
/// millicores.
type Holds = [u64; 3];

fn holds_of(limits: &tollgate_proto::v1::Limits) -> Holds {
    [
        limits.memory_bytes,
        u64::from(limits.pids),
        u64::from(limits.cpu_millicores),
    ]
}

/// A live run's shared state.
struct LiveRun {
    cgroup: RunCgroup,
    /// Bytes of output the run may still relay; children's `output_bytes` are carved from it.
    output_left: Arc<AtomicU64>,
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
}

impl LiveRun {
    /// The trigger noted so far, if any.
    fn pending(&self) -> Option<(RunState, String)> {
        self.trigger
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Kills the cgroup if a trigger is pending (one may have come before anything ran).
    fn enforce_pending(&self) {
        if self.pending().is_some() {
            if let Err(e) = self.cgroup.kill_all(KILL_DEADLINE) {
                tracing::warn!(error = %e, "killing a run's cgroup failed; teardown retries");
            }
        }
    }

    fn trigger(&self, state: RunState, reason: String) {
        self.closing.store(true, Ordering::SeqCst);
        {
            let mut trigger = self.trigger.lock().unwrap_or_else(|p| p.into_inner());
            if trigger.is_none() {
                *trigger = Some((state, reason));
            }
        }
        if let Err(e) = self.cgroup.kill_all(KILL_DEADLINE) {
            tracing::warn!(error = %e, "killing a run's cgroup failed; teardown retries");
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
    /// Serves the runs' gateway sockets (its own threads: agents' calls never wait behind the
    /// operator API). `None` only while dropping.
    /// The supervisor's model routes, when it has any (set once, before runs start).
    models: OnceLock<Arc<ModelRoutes>>,
    /// The authority link for delegation, when this supervisor has a delegation token.
    delegator: OnceLock<Arc<Delegator>>,
    /// Every run's output and end, for WatchRun and WatchChild.
    hub: Arc<RunHub>,
    /// Live children by id: their parent and what they hold of its limits (taken at
    /// admission, under `allocation`, given back at their end).
    child_holds: Mutex<HashMap<String, (String, Holds)>>,
    gateway_runtime: Option<tokio::runtime::Runtime>,
    live: Mutex<HashMap<String, Arc<LiveRun>>>,
    allocation: Mutex<()>,
    closing: std::sync::atomic::AtomicBool,
    /// Starts past the allocation step that have not returned yet.
    in_flight: AtomicUsize,
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

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl RunManager {
    /// Opens the records and recovers from a crash: runs left `starting` or `running` are
    /// marked `lost`, every cgroup under the parent is killed and removed, and every run
    /// directory is deleted. Returns the manager and the ids of the recovered runs.
    pub fn open(
        settings: RunSettings,
        keys: KeySet,
        audit: AuditLog,
    ) -> Result<(Arc<Self>, Vec<String>), StartError> {
        let runs_dir = settings.data_dir.join("runs");
        std::fs::create_dir_all(&runs_dir).map_err(|source| SandboxError::RunDir {
            path: runs_dir.clone(),
            source,
        })?;
        let records = RunRecords::open(&settings.data_dir.join("supervisor.db"))?;
        let recovered: Vec<String> = records
            .list()?
            .into_iter()
            .filter(|record| !record.state.is_final())
            .map(|record| record.run_id)
            .collect();
        let swept = sweep(&settings.cgroup_parent, false)?;
        if let Ok(entries) = std::fs::read_dir(&runs_dir) {
            for entry in entries.flatten() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        audit.append(
            EntryDraft::new(COMPONENT, EntryKind::ComponentStarted)
                .meta("version", env!("CARGO_PKG_VERSION"))
                .meta("supervisor_id", settings.supervisor_id.as_str())
                .meta("cgroup_parent", settings.cgroup_parent.as_str())
                .meta(
                    "warm_sandboxes",
                    i64::try_from(settings.warm_sandboxes).unwrap_or(i64::MAX),
                ),
        )?;
        if !recovered.is_empty() || !swept.is_empty() {
            tracing::warn!(runs = ?recovered, cgroups = ?swept, "recovered from an unclean stop");
            audit.append(
                EntryDraft::new(COMPONENT, EntryKind::ComponentRecovered)
                    .reason("the supervisor stopped without tearing its runs down")
                    .meta("lost_runs", recovered.clone())
                    .meta("swept_cgroups", swept.clone()),
            )?;
        }
        // Each lost run's entry goes in before its record becomes final: a crash in between
        // repeats the entry at the next start rather than losing it.
        let reason = "the supervisor stopped without tearing this run down; swept at restart";
        for run_id in &recovered {
            audit.append(
                EntryDraft::new(COMPONENT, EntryKind::Teardown)
                    .receipt(run_id.as_str())
                    .run(run_id.as_str())
                    .reason(reason)
                    .meta("state", RunState::Lost.name()),
            )?;
            let report = TeardownReport {
                reason: reason.into(),
                ..Default::default()
            };
            records.finish(run_id, RunState::Lost, &report, unix_now())?;
        }
        let admission =
            ReceiptAdmission::new(settings.supervisor_id.clone(), keys, settings.clock_skew);
        let base = sandbox_base(&settings.data_dir, &settings.shim);
        create_mount_point(&base)?;
        let sandboxes = SandboxPool::new(
            settings.shim.clone(),
            settings.cgroup_parent.clone(),
            base,
            settings.warm_sandboxes,
        );
        sandboxes.refill();
        let gateway_runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("gateway")
            .enable_all()
            .build()
            .map_err(|e| SandboxError::Setup(format!("starting the gateway runtime: {e}")))?;
        let manager = Arc::new(Self {
            gateway_runtime: Some(gateway_runtime),
            models: OnceLock::new(),
            delegator: OnceLock::new(),
            hub: Arc::default(),
            child_holds: Mutex::new(HashMap::new()),
            settings,
            records,
            admission: RwLock::new(admission),
            sandboxes,
            audit,
            live: Mutex::new(HashMap::new()),
            allocation: Mutex::new(()),
            closing: std::sync::atomic::AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
        });
        Ok((manager, recovered))
    }

    /// Replaces the trusted keys (after fetching the authority's key set again).
    pub fn set_keys(&self, keys: KeySet) {
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
    pub fn revoke(&self, receipt_id: &str) {
        self.admission
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .revoke(receipt_id);
        self.end_tree(receipt_id, RunState::Revoked, "the receipt was revoked");
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

    /// Marks every live descendant of `run_id` closing (breadth first, under the lock) and
    /// returns each with its parent's id.
    fn mark_descendants(&self, run_id: &str) -> Vec<(Arc<LiveRun>, String)> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let mut found: Vec<(Arc<LiveRun>, String)> = Vec::new();
        let mut frontier = vec![run_id.to_owned()];
        while !frontier.is_empty() {
            let mut next = Vec::new();
            for (id, run) in live.iter() {
                if let Some(parent) = run.parent.as_ref().filter(|p| frontier.contains(p)) {
                    run.closing.store(true, Ordering::SeqCst);
                    found.push((run.clone(), parent.clone()));
                    next.push(id.clone());
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

    /// Admits `signed`, records it, builds its sandbox and starts the agent. Returns the run
    /// id once the agent runs; teardown happens on the run's own thread.
    pub fn start(
        self: &Arc<Self>,
        signed: &SignedReceipt,
        argv: Option<Vec<String>>,
        output: OutputSink,
    ) -> Result<String, StartError> {
        self.start_in_tree(signed, argv, output, None)
    }

    /// Starts a run whose output and end go to the hub (WatchRun, WatchChild): a root run
    /// (`child` none) or a delegated child of a live run.
    pub(crate) fn start_published(
        self: &Arc<Self>,
        signed: &SignedReceipt,
        argv: Option<Vec<String>>,
        child: Option<ChildOf>,
    ) -> Result<String, StartError> {
        let hub = self.hub.clone();
        let sink: OutputSink = Arc::new(move |run_id: &str, stream: OutputStream, bytes: &[u8]| {
            let stream = match stream {
                OutputStream::Stdout => tollgate_proto::v1::OutputStream::Stdout,
                OutputStream::Stderr => tollgate_proto::v1::OutputStream::Stderr,
            };
            hub.push(
                run_id,
                tollgate_proto::v1::RunEvent {
                    event: Some(tollgate_proto::v1::run_event::Event::Output(
                        tollgate_proto::v1::OutputChunk {
                            stream: stream as i32,
                            data: bytes.to_vec(),
                        },
                    )),
                },
            );
        });
        let run_id = self.start_in_tree(signed, argv, sink, child)?;
        self.hub.open(&run_id);
        // Publish the end of the run to watchers once teardown has recorded it.
        let (manager, id) = (Arc::downgrade(self), run_id.clone());
        std::thread::spawn(move || loop {
            let Some(manager) = manager.upgrade() else {
                return;
            };
            match manager.wait(&id, Duration::from_secs(3600)) {
                // Once torn down, the record is as final as it will get (a failed write
                // leaves it non-final): publish it rather than wait on it forever.
                Some(record) if record.state.is_final() || manager.live_run(&id).is_none() => {
                    manager.hub.end(&id, crate::service::run_proto(&record));
                    return;
                }
                Some(_) => continue,
                None => return,
            }
        });
        Ok(run_id)
    }

    /// The runs' event hub.
    pub fn hub(&self) -> &RunHub {
        &self.hub
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
            .admission
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .admit(signed, unix_now())
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
                    pending.extend(gateway.children.pending_children(&record.run_id));
                }
            }
        }
        Ok(tollgate_proto::v1::RunTree {
            runs: records.iter().map(crate::service::run_proto).collect(),
            pending,
        })
    }

    /// [`Self::start`] for a run that is the root of its tree (`parent` none: an operator's
    /// start) or a child of the live run `parent` (a delegated receipt, started through that
    /// run's gateway).
    pub(crate) fn start_in_tree(
        self: &Arc<Self>,
        signed: &SignedReceipt,
        argv: Option<Vec<String>>,
        output: OutputSink,
        child: Option<ChildOf>,
    ) -> Result<String, StartError> {
        let parent = child.as_ref().map(|c| c.parent.clone());
        let parent = parent.as_deref();
        let tree = child
            .as_ref()
            .map(|c| (c.parent.as_str(), &c.parent_limits));
        let admitted_at = Instant::now();
        let started_ms = now_ms();
        let (receipt, host_id, pinned) = match self.admit_and_record(signed, argv.as_deref(), tree)
        {
            Ok(admitted) => admitted,
            Err(error) => {
                self.audit_refusal(signed, &error);
                return Err(error);
            }
        };
        let run_id = receipt.receipt_id.clone();
        // Handed to the writer now; the plan is not sent before it is on disk, so the fsync
        // overlaps the sandbox's preparation and no agent ever runs unaudited.
        let admitted = self.audit.submit(
            EntryDraft::new(COMPONENT, EntryKind::RunAdmitted)
                .receipt(run_id.as_str())
                .run(run_id.as_str())
                .decision(Decision::Allow)
                .meta("owner", receipt.owner.as_str())
                .meta("subject", receipt.subject.as_str())
                .meta("host_id", host_id)
                .meta(
                    "expires_at",
                    receipt.expires_at.as_ref().map_or(0, |t| t.seconds),
                )
                .meta("argv_from_start", argv.is_some())
                .meta("parent_run_id", parent.unwrap_or_default())
                .meta("depth", receipt.depth),
        );
        let result = self.start_recorded(
            &receipt,
            run_id,
            host_id,
            argv,
            output,
            admitted,
            (admitted_at, started_ms),
            (signed, child, pinned),
        );
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        result
    }

    /// Admission: strict verification, the argv rules, expiry by this host's clock, a host id,
    /// and the single-use record. On success the start counts as in flight. Everything that
    /// can be refused without a sandbox is checked before the record: a refused start never
    /// spends the receipt.
    fn admit_and_record(
        &self,
        signed: &SignedReceipt,
        argv: Option<&[String]>,
        tree: Option<(&str, &tollgate_proto::v1::Limits)>,
    ) -> Result<(tollgate_proto::v1::Receipt, u32, Option<Vec<FsGrant>>), StartError> {
        let parent = tree.map(|(parent, _)| parent);
        let argv_given = argv.is_some();
        let receipt = self
            .admission
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .admit(signed, unix_now())?;
        let run_id = receipt.receipt_id.clone();
        // A child receipt starts only through its parent's gateway (which checks it lies
        // within the parent and ends with it); an operator's start would escape both.
        match parent {
            None if receipt.depth > 0 => {
                return Err(StartError::Delegated {
                    code: "delegated",
                    reason: format!(
                        "receipt {run_id} is delegated (depth {}): it starts only through its parent's gateway",
                        receipt.depth
                    ),
                })
            }
            Some(parent) if receipt.depth == 0 || receipt.parent_receipt_id != parent => {
                return Err(StartError::Delegated {
                    code: "delegated",
                    reason: format!("receipt {run_id} is not a child of run {parent}"),
                })
            }
            _ => {}
        }
        if argv_given && receipt.agent.as_ref().is_some_and(|a| !a.argv.is_empty()) {
            return Err(StartError::ArgvNotAllowed(run_id));
        }
        let command = argv
            .map(<[String]>::to_vec)
            .or_else(|| receipt.agent.as_ref().map(|a| a.argv.clone()))
            .filter(|argv| !argv.is_empty());
        match command {
            None => return Err(SandboxError::NoAgent.into()),
            Some(command) if !receipt.exec.contains(&command[0]) => {
                return Err(SandboxError::NotExecutable(command[0].clone()).into())
            }
            Some(_) => {}
        }
        let expires_at = receipt.expires_at.as_ref().map_or(0, |t| t.seconds);
        // The clock skew helps admit a receipt minted on a slightly different clock; it never
        // lets a run start at or after its expiry by this host's clock.
        let now = unix_now();
        if now >= expires_at {
            return Err(VerifyError::Expired {
                receipt_id: run_id,
                expires_at,
                now,
            }
            .into());
        }
        // A root run's grants are pinned now, before the record: a grant through a link is
        // refused without spending the receipt. (A child's were pinned beneath its parent's.)
        let pinned = match parent {
            None => Some(pin_grants(&receipt)?),
            Some(_) => None,
        };
        let _guard = self.allocation.lock().unwrap_or_else(|p| p.into_inner());
        if self.closing.load(Ordering::SeqCst) {
            return Err(StartError::ShuttingDown);
        }
        // A child of a run that is ending never starts (and never spends its receipt).
        if let Some(parent) = parent {
            let parent_live = self
                .live_run(parent)
                .is_some_and(|run| !run.closing.load(Ordering::SeqCst));
            if !parent_live {
                return Err(StartError::Delegated {
                    code: "parent_not_live",
                    reason: format!("run {parent} is ending; its children start no more"),
                });
            }
        }
        // Live children together stay within their parent's memory, pids and cpu: without
        // this, a run could start many children each as large as itself.
        let holds = match tree {
            Some((parent, parent_limits)) => {
                let wanted = holds_of(&receipt.limits.unwrap_or_default());
                let ceiling = holds_of(parent_limits);
                let mut held: Holds = [0; 3];
                for (of, hold) in self
                    .child_holds
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .values()
                {
                    if of == parent {
                        for (sum, value) in held.iter_mut().zip(hold) {
                            *sum = sum.saturating_add(*value);
                        }
                    }
                }
                let names = [
                    "limits.memory_bytes",
                    "limits.pids",
                    "limits.cpu_millicores",
                ];
                for i in 0..3 {
                    if held[i].saturating_add(wanted[i]) > ceiling[i] {
                        return Err(StartError::ChildrenLimits(format!(
                            "{} = {}: live children of run {parent} already hold {} of its {}; wait for one to end",
                            names[i], wanted[i], held[i], ceiling[i]
                        )));
                    }
                }
                Some((parent.to_owned(), wanted))
            }
            None => None,
        };
        let used = self.records.live_host_ids()?;
        let host_id = self
            .settings
            .host_ids
            .clone()
            .find(|id| !used.contains(id))
            .ok_or_else(|| StartError::NoHostId(self.settings.host_ids.clone()))?;
        let recorded = self.records.insert(&NewRun {
            run_id: &run_id,
            owner: &receipt.owner,
            subject: &receipt.subject,
            receipt: &signed.encode_to_vec(),
            host_id,
            now: unix_now(),
            expires_at,
            parent_run_id: parent,
            depth: receipt.depth,
        })?;
        if !recorded {
            return Err(StartError::AlreadyUsed(run_id));
        }
        if let Some(holds) = holds {
            self.child_holds
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(run_id.clone(), holds);
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        Ok((receipt, host_id, pinned))
    }

    /// Audits a refused start. The receipt id is the one the receipt claims: for a forged or
    /// malformed receipt it is not verified (`receipt_verified` says which).
    pub fn audit_refusal(&self, signed: &SignedReceipt, error: &StartError) {
        let claimed = tollgate_proto::v1::Receipt::decode(signed.receipt.as_slice())
            .ok()
            .map(|receipt| receipt.receipt_id)
            .filter(|id| uuid::Uuid::try_parse(id).is_ok());
        let code = error.code();
        let mut draft = EntryDraft::new(COMPONENT, EntryKind::RunRefused)
            .decision(Decision::Deny)
            .reason(error.to_string())
            .meta("code", code)
            .meta("receipt_verified", !matches!(error, StartError::Receipt(_)));
        if let Some(id) = claimed {
            draft = draft.receipt(id);
        }
        if let Err(e) = self.audit.append(draft) {
            tracing::error!(error = %e, "could not audit a refused start");
        }
    }

    /// The part of a start after the run is recorded: every failure ends in a final record.
    #[allow(clippy::too_many_arguments)]
    fn start_recorded(
        self: &Arc<Self>,
        receipt: &tollgate_proto::v1::Receipt,
        run_id: String,
        host_id: u32,
        argv: Option<Vec<String>>,
        output: OutputSink,
        admitted: Result<PendingEntry, AuditError>,
        (admitted_at, started_ms): (Instant, u64),
        (signed, child, pinned): (&SignedReceipt, Option<ChildOf>, Option<Vec<FsGrant>>),
    ) -> Result<String, StartError> {
        let parent = child.as_ref().map(|c| c.parent.clone());
        let parent = parent.as_deref();
        let expires_at = receipt.expires_at.as_ref().map_or(0, |t| t.seconds);
        // Recorded: from here on every failure ends in a `failed` record, never a silent drop.
        let dirs = RunDirs::new(&self.settings.data_dir.join("runs"), &run_id);
        let admitted = match admitted {
            Ok(admitted) => admitted,
            Err(e) => {
                self.fail(&run_id, &dirs, &format!("audit log: {e}"), started_ms);
                return Err(e.into());
            }
        };
        let limits = receipt.limits.unwrap_or_default();
        let prepared = self.sandboxes.take(CgroupLimits {
            memory_bytes: limits.memory_bytes,
            pids: limits.pids,
            cpu_millicores: limits.cpu_millicores,
        });
        let PreparedSandbox { cgroup, shim } = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                self.sandboxes.refill();
                self.fail(&run_id, &dirs, &e.to_string(), started_ms);
                return Err(e);
            }
        };
        tracing::debug!(run_id = %run_id, cgroup = cgroup.relative(), "sandbox taken");
        // Live from here on: a stop, revocation or expiry that arrives while the sandbox is
        // being built is noted, and acted on as soon as there is something to kill.
        let live = Arc::new(LiveRun {
            cgroup,
            output_left: Arc::new(AtomicU64::new(limits.output_bytes)),
            parent: parent.map(str::to_owned),
            landlock_abi: OnceLock::new(),
            closing: Arc::default(),
            gateway: Mutex::new(None),
            trigger: Mutex::new(None),
            ended: Mutex::new(false),
            ended_signal: Condvar::new(),
        });
        {
            let mut runs = self.live.lock().unwrap_or_else(|p| p.into_inner());
            runs.insert(run_id.clone(), live.clone());
            // Under the same lock as `mark_descendants`: a parent that is ending either finds
            // this child, or is seen closing (or gone) here.
            if let Some(parent) = parent {
                let parent_live = runs
                    .get(parent)
                    .is_some_and(|run| !run.closing.load(Ordering::SeqCst));
                if !parent_live {
                    live.closing.store(true, Ordering::SeqCst);
                    *live.trigger.lock().unwrap_or_else(|p| p.into_inner()) = Some((
                        RunState::ParentEnded,
                        format!("its parent run {parent} ended before it started"),
                    ));
                }
            }
        }
        let spawned = self.spawn_sandbox(
            receipt,
            &dirs,
            host_id,
            argv,
            &live,
            shim,
            admitted,
            (
                signed,
                pinned
                    .or_else(|| child.map(|c| c.grants))
                    .unwrap_or_default(),
            ),
        );
        // Prepare the next sandbox only now, off this start's path and CPU time.
        self.sandboxes.refill();
        match spawned {
            Ok((process, SandboxOutput { stdout, stderr })) => {
                // Started after the agent, off the start path: an expiry that fell during the
                // start fires at once.
                let expiry = {
                    let (live, manager, id) = (live.clone(), Arc::downgrade(self), run_id.clone());
                    std::thread::spawn(move || {
                        if expire_at(&live, expires_at) {
                            match manager.upgrade() {
                                Some(manager) => {
                                    manager.end_tree(&id, RunState::Expired, EXPIRED);
                                }
                                None => live.trigger(RunState::Expired, EXPIRED.into()),
                            }
                        }
                    })
                };
                // Relay output first: the agent is already writing.
                let budget = live.output_left.clone();
                let truncated = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let relays = [
                    (stdout, OutputStream::Stdout),
                    (stderr, OutputStream::Stderr),
                ]
                .map(|(pipe, stream)| {
                    let (run_id, output, budget, truncated) = (
                        run_id.clone(),
                        output.clone(),
                        budget.clone(),
                        truncated.clone(),
                    );
                    std::thread::spawn(move || {
                        relay(pipe, stream, &run_id, &output, &budget, &truncated)
                    })
                });
                if let Err(e) = self.records.set_running(&run_id) {
                    live.trigger(RunState::Failed, format!("recording the start failed: {e}"));
                }
                if self
                    .admission
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_revoked(&run_id)
                {
                    live.trigger(RunState::Revoked, "the receipt was revoked".into());
                }
                // A trigger that came while nothing was running yet kills it now.
                live.enforce_pending();
                tracing::info!(
                    run_id = %run_id,
                    owner = %receipt.owner,
                    host_id,
                    start_us = admitted_at.elapsed().as_micros() as u64,
                    "run started"
                );
                // In the log before anything of the run's end; durable by the time the run
                // thread has checked (off the start path).
                let created = self.audit.submit(
                    EntryDraft::new(COMPONENT, EntryKind::SandboxCreated)
                        .receipt(run_id.as_str())
                        .run(run_id.as_str())
                        .meta("cgroup", live.cgroup.relative())
                        .meta("host_id", host_id)
                        .meta(
                            "landlock_abi",
                            live.landlock_abi
                                .get()
                                .map_or(tollgate_audit::MetaValue::Null, |abi| (*abi).into()),
                        )
                        .meta(
                            "start_us",
                            i64::try_from(admitted_at.elapsed().as_micros()).unwrap_or(i64::MAX),
                        ),
                );
                let manager = self.clone();
                let thread_run_id = run_id.clone();
                std::thread::spawn(move || {
                    if let Err(e) = created.and_then(PendingEntry::wait) {
                        tracing::error!(run_id = %thread_run_id, error = %e, "could not audit a sandbox's creation");
                    }
                    let exit = watch(process);
                    for relay in relays {
                        let _ = relay.join();
                    }
                    manager.teardown(
                        &thread_run_id,
                        &live,
                        &dirs,
                        Ended::Agent(exit, truncated.load(Ordering::Relaxed)),
                        started_ms,
                    );
                    let _ = expiry.join();
                });
                Ok(run_id)
            }
            Err(e) => {
                self.teardown(
                    &run_id,
                    &live,
                    &dirs,
                    Ended::NotStarted(e.to_string()),
                    started_ms,
                );
                Err(e)
            }
        }
    }

    /// Binds and serves the run's gateway socket (before the agent exists); returns its
    /// host path for the plan.
    fn serve_gateway(
        self: &Arc<Self>,
        receipt: &tollgate_proto::v1::Receipt,
        dirs: &RunDirs,
        plan: &SandboxPlan,
        live: &LiveRun,
        (signed, grants): (&SignedReceipt, Vec<FsGrant>),
    ) -> Result<PathBuf, StartError> {
        let host_id = plan.host_id;
        let Some(runtime) = &self.gateway_runtime else {
            return Err(SandboxError::Setup("the gateway runtime is gone".into()).into());
        };
        let manager = Arc::downgrade(self);
        let children = ChildState::new(
            signed.clone(),
            ChildControl {
                manager: manager.clone(),
                delegator: self.delegator.get().cloned(),
            },
            live.output_left.clone(),
        );
        let run = Arc::new(RunGateway {
            children,
            run_id: receipt.receipt_id.clone(),
            host_id,
            receipt: receipt.clone(),
            expires_at: receipt.expires_at.as_ref().map_or(0, |t| t.seconds),
            // A child's were pinned beneath its parent's; a root run's are pinned now, before
            // the agent exists.
            // Pinned before the record (a root run's) or beneath the parent's (a child's).
            grants,
            max_calls: receipt.limits.unwrap_or_default().tool_calls,
            closing: live.closing.clone(),
            is_revoked: Arc::new(move |run_id: &str| {
                manager.upgrade().is_some_and(|manager| {
                    manager
                        .admission
                        .read()
                        .unwrap_or_else(|p| p.into_inner())
                        .is_revoked(run_id)
                })
            }),
            audit: self.audit.clone(),
            calls: AtomicU64::new(0),
            last_call: Mutex::new(None),
            audit_use: gateway::AuditUse::default(),
            snapshots: SnapshotStore::new(&self.settings.data_dir),
            exec: Some(Arc::new(ExecSandbox {
                shim: self.settings.shim.clone(),
                plan: plan.clone(),
                cgroup_procs: live.cgroup.procs_files(),
                limits: ExecLimits::default(),
                running: AtomicUsize::new(0),
                started: OnceLock::new(),
            })),
            models: self.models.get().map(|shared| {
                Arc::new(RunModels::new(
                    shared.clone(),
                    receipt.limits.unwrap_or_default().tokens,
                ))
            }),
        });
        let handle = gateway::serve(runtime.handle(), &dirs.base, run.clone())
            .map_err(|e| SandboxError::Setup(e.to_string()))?;
        let socket = handle.socket.clone();
        *live.gateway.lock().unwrap_or_else(|p| p.into_inner()) = Some((run, handle));
        Ok(socket)
    }

    /// Prepares the run directories and plan and sends the plan to the sandbox's shim, once
    /// the run's admission is on disk in the audit log.
    #[allow(clippy::too_many_arguments)]
    fn spawn_sandbox(
        self: &Arc<Self>,
        receipt: &tollgate_proto::v1::Receipt,
        dirs: &RunDirs,
        host_id: u32,
        argv: Option<Vec<String>>,
        live: &LiveRun,
        shim: IdleShim,
        admitted: PendingEntry,
        (signed, grants): (&SignedReceipt, Vec<FsGrant>),
    ) -> Result<(SandboxProcess, SandboxOutput), StartError> {
        let planned = dirs
            .create(host_id)
            .and_then(|()| plan_for(receipt, dirs, host_id, argv));
        let plan = match (planned, live.pending()) {
            (Ok(plan), None) => plan,
            (Err(e), _) => {
                shim.discard();
                return Err(e.into());
            }
            (Ok(_), Some((_, reason))) => {
                shim.discard();
                return Err(
                    SandboxError::Setup(format!("cancelled before start: {reason}")).into(),
                );
            }
        };
        // Taken from the pinned descriptors before the gateway owns them: the shim attaches
        // these, never a path.
        let mounts = match detached_mounts(receipt, &grants) {
            Ok(mounts) => mounts,
            Err(e) => {
                shim.discard();
                return Err(e);
            }
        };
        let mut plan = plan;
        match self.serve_gateway(receipt, dirs, &plan, live, (signed, grants)) {
            Ok(socket) => plan.gateway_socket = Some(socket),
            Err(e) => {
                shim.discard();
                return Err(e);
            }
        }
        if let Err(e) = admitted.wait() {
            shim.discard();
            return Err(e.into());
        }
        let (process, started, output) = SandboxProcess::start(shim, &plan, mounts)?;
        if let FromShim::Started {
            landlock_abi,
            execute,
            ..
        } = started
        {
            let _ = live.landlock_abi.set(landlock_abi);
            // Pinned for the gateway's exec; without it, exec is refused (the run goes on).
            let exec = live
                .gateway
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .and_then(|(run, _)| run.exec.clone());
            match (exec, process.pin_pid_one()) {
                (Some(exec), Ok(pid_one)) => {
                    let _ = exec.started.set(PinnedSandbox { pid_one, execute });
                }
                (_, Err(e)) => {
                    tracing::warn!(run_id = %plan.run_id, error = %e, "could not pin the sandbox's pid 1; exec is unavailable");
                }
                (None, Ok(_)) => {}
            }
        }
        Ok((process, output))
    }

    /// Gives runs started from now on this supervisor's model routes (once; later calls
    /// are ignored).
    pub fn set_model_routes(&self, routes: Arc<ModelRoutes>) {
        let _ = self.models.set(routes);
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
        let live: Vec<(String, Arc<LiveRun>)> = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(id, run)| (id.clone(), run.clone()))
            .collect();
        for (_, run) in &live {
            run.trigger(
                RunState::SupervisorShutdown,
                "the supervisor shut down".into(),
            );
        }
        for (id, _) in live {
            self.wait(&id, Duration::from_secs(30));
        }
        // A clean stop ends the log with an entry and a signed checkpoint.
        let stopped = self
            .audit
            .append(EntryDraft::new(COMPONENT, EntryKind::ComponentStopped))
            .and_then(|_| self.audit.close());
        if let Err(e) = stopped {
            // Closing twice (a second shutdown) is not an error; anything else is logged.
            if !matches!(e, AuditError::Closed) {
                tracing::error!(error = %e, "could not close the audit log");
            }
        }
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

    /// All runs, newest first.
    pub fn list(&self) -> Result<Vec<RunRecord>, RecordsError> {
        self.records.list()
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

    /// Gives back what a child held of its parent's limits (nothing for a root run).
    fn release_holds(&self, run_id: &str) {
        self.child_holds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(run_id);
    }

    /// Records a start that failed before the run had a cgroup.
    fn fail(&self, run_id: &str, dirs: &RunDirs, reason: &str, started_ms: u64) {
        self.release_holds(run_id);
        let mut report = TeardownReport {
            reason: reason.to_owned(),
            ..Default::default()
        };
        if let Err(e) = dirs.remove() {
            report.cleanup_errors.push(e.to_string());
        }
        report.duration_ms = now_ms().saturating_sub(started_ms);
        self.audit_teardown(run_id, RunState::Failed, &report);
        if let Err(e) = self
            .records
            .finish(run_id, RunState::Failed, &report, unix_now())
        {
            tracing::error!(run_id, error = %e, "could not record a failed start");
        }
        tracing::warn!(run_id, reason, "run failed to start");
    }

    /// Audits the end of a run with its report (and the limit it hit, if one ended it).
    /// Teardown has happened whatever the log says, so a failure here is logged, not raised.
    fn audit_teardown(&self, run_id: &str, state: RunState, report: &TeardownReport) {
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
        for draft in drafts {
            if let Err(e) = self.audit.append(draft) {
                tracing::error!(run_id, error = %e, "could not audit a teardown");
            }
        }
    }

    /// The one teardown path.
    fn teardown(
        &self,
        run_id: &str,
        live: &LiveRun,
        dirs: &RunDirs,
        ended: Ended,
        started_ms: u64,
    ) {
        live.closing.store(true, Ordering::SeqCst);
        let gateway = live
            .gateway
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let last_tool_call_id = gateway.map(|(run, mut handle)| {
            handle.stop();
            // Refusals of a spent run still being counted get their summary entry.
            run.flush_refusals();
            run.last_call
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        });
        let trigger = live
            .trigger
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let (exit, output_truncated, failure) = match ended {
            Ended::Agent(exit, truncated) => (exit, truncated, None),
            Ended::NotStarted(reason) => (None, false, Some(reason)),
        };
        let mut report = TeardownReport {
            output_truncated,
            last_tool_call_id: last_tool_call_id.flatten(),
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
            (None, _) if failure.is_some() => (RunState::Failed, failure.unwrap_or_default()),
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
        if let Err(e) = live.cgroup.kill_all(KILL_DEADLINE) {
            report.cleanup_errors.push(e.to_string());
        }
        report.peak_memory_bytes = live.cgroup.peak_memory();
        report.cgroup = Some(live.cgroup.relative().to_owned());
        if let Err(e) = live.cgroup.remove() {
            report.cleanup_errors.push(e.to_string());
        }
        if let Err(e) = dirs.remove() {
            report.cleanup_errors.push(e.to_string());
        }
        report.duration_ms = now_ms().saturating_sub(started_ms);
        // The entry first: a crash in between repeats it at the next start, never loses it.
        self.audit_teardown(run_id, state, &report);
        if let Err(e) = self.records.finish(run_id, state, &report, unix_now()) {
            tracing::error!(run_id, error = %e, "could not record a teardown report");
        }
        tracing::info!(run_id, state = state.name(), reason = %report.reason, "run torn down");
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(run_id);
        self.release_holds(run_id);
        *live.ended.lock().unwrap_or_else(|p| p.into_inner()) = true;
        live.ended_signal.notify_all();
    }
}

/// How a run came to teardown.
enum Ended {
    /// The shim ended; the agent's exit (when reported) and whether output was truncated.
    Agent(Option<AgentExit>, bool),
    /// The sandbox never started, for this reason.
    NotStarted(String),
}

/// Reads shim events until the agent's exit (returned) or the shim's end (`None`).
fn watch(mut process: SandboxProcess) -> Option<AgentExit> {
    let mut exit = None;
    while let Ok(Some(event)) = process.next_event() {
        if let FromShim::Exited(code) = event {
            exit = Some(code);
        }
    }
    let _ = process.wait();
    exit
}

/// Forwards a pipe to the sink until EOF, within the shared output budget.
fn relay(
    mut pipe: std::io::PipeReader,
    stream: OutputStream,
    run_id: &str,
    output: &OutputSink,
    budget: &AtomicU64,
    truncated: &std::sync::atomic::AtomicBool,
) {
    let mut buffer = [0u8; 8192];
    loop {
        let n = match pipe.read(&mut buffer) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let allowed = budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                Some(left.saturating_sub(n as u64))
            })
            .unwrap_or(0)
            .min(n as u64) as usize;
        if allowed < n {
            truncated.store(true, Ordering::Relaxed);
        }
        if allowed > 0 {
            output(run_id, stream, &buffer[..allowed]);
        }
    }
}

/// The reason of a run that expired.
const EXPIRED: &str = "the receipt expired";

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

/// Waits until `expires_at` (Unix seconds); `true` when it came, `false` when the run ended
/// first.
fn expire_at(live: &LiveRun, expires_at: i64) -> bool {
    let deadline = UNIX_EPOCH + Duration::from_secs(expires_at.max(0) as u64);
    let mut ended = live.ended.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if *ended {
            return false;
        }
        let left = match deadline.duration_since(SystemTime::now()) {
            Ok(left) if !left.is_zero() => left,
            _ => break,
        };
        ended = live
            .ended_signal
            .wait_timeout(ended, left)
            .map(|(guard, _)| guard)
            .unwrap_or_else(|p| p.into_inner().0);
    }
    true
}
