//! Starting a recorded run: a prepared sandbox, the gateway served before the agent
//! exists, the plan sent, and the run's lifecycle tasks started (see `lifecycle`).

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

use tollgate_receipt::SignedReceipt;
use tollgate_shim_protocol::plan::{AgentInput, SandboxPlan};
use tollgate_shim_protocol::protocol::FromShim;

use crate::cgroup::{CgroupLimits, RunCgroup};
use crate::egress::ca::{needs_ca, RunCa};
use crate::error::StartError;
use crate::exec::{ExecLimits, ExecSandbox, PinnedSandbox, StartedPin};
use crate::gateway::egress::EgressSetup;
use crate::gateway::inspection::Classify;
use crate::gateway::{
    self, ChildControl, ChildOf, ChildRuns, ChildState, FsGrant, GatewayHandle, HandedConnections,
    RunGateway, RunGatewayConfig, RunModels,
};
use crate::records::RunState;
use crate::sandbox::{plan_for, IdleShim, RunDirs, SandboxError, SandboxOutput, SandboxProcess};
use crate::snapshot::SnapshotStore;
use crate::warm::PreparedSandbox;
use crate::COMPONENT;
use tollgate_audit::{AuditError, Decision, EntryDraft, EntryKind, PendingEntry};

use super::lifecycle::RunTasks;
use super::teardown::Ended;
use super::teardowns::Endings;
use super::{now_ms, LiveRun, OutputSink, OutputStream, RunManager};

/// The run directory's entry holding its egress certificate authority (shown in the sandbox).
const EGRESS_CA_DIR: &str = "egress";

/// A run admitted and recorded, on its way to a sandbox.
struct Recorded<'a> {
    receipt: &'a tollgate_proto::v1::Receipt,
    signed: &'a SignedReceipt,
    run_id: String,
    host_id: u32,
    argv: Option<Vec<String>>,
    /// The agent's stdin, as the start asked.
    input: AgentInput,
    output: OutputSink,
    /// The `run_admitted` entry, handed to the writer.
    admitted: Result<PendingEntry, AuditError>,
    admitted_at: Instant,
    started_ms: u64,
    /// The parent run of a delegated child.
    parent: Option<String>,
    /// The run's fs grants: a root run's pinned at admission, a child's beneath its parent's.
    grants: Vec<FsGrant>,
}

/// What building a recorded run's sandbox takes.
pub(super) struct Spawn<'a> {
    receipt: &'a tollgate_proto::v1::Receipt,
    signed: &'a SignedReceipt,
    host_id: u32,
    argv: Option<Vec<String>>,
    input: AgentInput,
    grants: Vec<FsGrant>,
    /// The `run_admitted` entry: the plan is not sent before it is on disk.
    admitted: PendingEntry,
    /// The run's cgroup v1 `tasks` files, when pid 1 is to join them (see
    /// `PreparedSandbox::pid_one_joins`); sent first with the plan.
    cgroup_joins: Vec<OwnedFd>,
}

/// A run whose agent has started.
struct Started<'a> {
    run_id: String,
    receipt: &'a tollgate_proto::v1::Receipt,
    /// The argv given at the start (a live restore re-plans the run with it).
    argv: Option<Vec<String>>,
    host_id: u32,
    live: Arc<LiveRun>,
    dirs: RunDirs,
    admitted_at: Instant,
    started_ms: u64,
}

impl RunManager {
    /// Admits `signed`, records it, builds its sandbox and starts the agent. Returns the run
    /// id once the agent runs; teardown follows the run's end (see `lifecycle`).
    pub fn start(
        self: &Arc<Self>,
        signed: &SignedReceipt,
        argv: Option<Vec<String>>,
        output: OutputSink,
    ) -> Result<String, StartError> {
        self.start_in_tree(signed, argv, AgentInput::Null, output, None)
    }

    /// Starts a run whose output and end go to the hub (WatchRun, WatchChild): a root run
    /// (`child` none) or a delegated child of a live run.
    pub(crate) fn start_published(
        self: &Arc<Self>,
        signed: &SignedReceipt,
        argv: Option<Vec<String>>,
        input: AgentInput,
        child: Option<ChildOf>,
    ) -> Result<String, StartError> {
        let run_id = self.start_in_tree(signed, argv, input, self.hub_sink(), child)?;
        self.hub.open(&run_id);
        self.publish_end(&run_id);
        Ok(run_id)
    }

    /// An output sink that publishes to the run's watchers (WatchRun, WatchChild).
    pub(super) fn hub_sink(&self) -> OutputSink {
        let hub = self.hub.clone();
        Arc::new(move |run_id: &str, stream: OutputStream, bytes: &[u8]| {
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
        })
    }

    /// [`Self::start`] for a run that is the root of its tree (`parent` none: an operator's
    /// start) or a child of the live run `parent` (a delegated receipt, started through that
    /// run's gateway).
    pub(crate) fn start_in_tree(
        self: &Arc<Self>,
        signed: &SignedReceipt,
        argv: Option<Vec<String>>,
        input: AgentInput,
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
                crate::metrics::get().start(error.code(), admitted_at.elapsed());
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
        let (parent, grants) = match child {
            Some(child) => (Some(child.parent), child.grants),
            None => (None, pinned.unwrap_or_default()),
        };
        let result = self.start_recorded(Recorded {
            receipt: &receipt,
            signed,
            run_id,
            host_id,
            argv,
            input,
            output,
            admitted,
            admitted_at,
            started_ms,
            parent,
            grants,
        });
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let outcome = result.as_ref().map_or_else(|e| e.code(), |_| "started");
        crate::metrics::get().start(outcome, admitted_at.elapsed());
        result
    }

    /// The part of a start after the run is recorded: every failure ends in a final record.
    fn start_recorded(self: &Arc<Self>, run: Recorded<'_>) -> Result<String, StartError> {
        let run_id = run.run_id.clone();
        // Recorded: from here on every failure ends in a `failed` record, never a silent drop.
        let dirs = RunDirs::new(&self.settings.data_dir.join("runs"), &run_id);
        let admitted = match run.admitted {
            Ok(admitted) => admitted,
            Err(e) => {
                self.fail(&run_id, &dirs, &format!("audit log: {e}"), run.started_ms);
                return Err(e.into());
            }
        };
        let limits = run.receipt.limits.unwrap_or_default();
        let prepared = self.sandboxes.take(CgroupLimits {
            memory_bytes: limits.memory_bytes,
            pids: limits.pids,
            cpu_millicores: limits.cpu_millicores,
        });
        let prepared = prepared
            .map_err(StartError::host_limited)
            .and_then(|prepared| {
                // A start's own sandbox on a hybrid host: its pid 1 joins the run's v1 cgroups
                // when the plan comes, through their `tasks` files opened here.
                let joins = if prepared.pid_one_joins {
                    prepared.cgroup.open_v1_tasks()
                } else {
                    Ok(Vec::new())
                };
                match joins {
                    Ok(joins) => Ok((prepared, joins)),
                    Err(e) => {
                        prepared.discard();
                        Err(StartError::host_limited(e.into()))
                    }
                }
            });
        let (PreparedSandbox { cgroup, shim, .. }, cgroup_joins) = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                self.sandboxes.refill();
                self.fail(&run_id, &dirs, &e.to_string(), run.started_ms);
                return Err(e);
            }
        };
        tracing::debug!(run_id = %run_id, cgroup = cgroup.relative(), "sandbox taken");
        let live = self.go_live(&run_id, cgroup, limits.output_bytes, run.parent.as_deref());
        let argv = run.argv.clone();
        let spawn = Spawn {
            receipt: run.receipt,
            signed: run.signed,
            host_id: run.host_id,
            argv: run.argv,
            input: run.input,
            grants: run.grants,
            admitted,
            cgroup_joins,
        };
        let spawned = self
            .spawn_sandbox(spawn, &dirs, &live, shim)
            .map_err(StartError::host_limited);
        // Prepare the next sandbox only now, off this start's path and CPU time.
        self.sandboxes.refill();
        match spawned {
            Ok((process, output)) => {
                let started = Started {
                    run_id: run_id.clone(),
                    receipt: run.receipt,
                    argv,
                    host_id: run.host_id,
                    live,
                    dirs,
                    admitted_at: run.admitted_at,
                    started_ms: run.started_ms,
                };
                self.run_started(started, process, output, run.output);
                Ok(run_id)
            }
            Err(e) => {
                // Its end recorded before the error is returned: a group of its own.
                self.teardown(
                    &Endings::default(),
                    &run_id,
                    &live,
                    &dirs,
                    Ended::NotStarted(e.to_string()),
                    run.started_ms,
                );
                Err(e)
            }
        }
    }

    /// Makes a run live: from here on a stop, revocation or expiry that arrives while the
    /// sandbox is being built is noted, and acted on as soon as there is something to kill.
    pub(super) fn go_live(
        &self,
        run_id: &str,
        cgroup: RunCgroup,
        output_bytes: u64,
        parent: Option<&str>,
    ) -> Arc<LiveRun> {
        let live = Arc::new(LiveRun {
            cgroup,
            output_left: Arc::new(AtomicU64::new(output_bytes)),
            output_limit: Arc::new(AtomicU64::new(output_bytes)),
            parent: parent.map(str::to_owned),
            landlock_abi: OnceLock::new(),
            closing: Arc::default(),
            gateway: Mutex::new(None),
            trigger: Mutex::new(None),
            ended: Mutex::new(false),
            ended_signal: Condvar::new(),
            changes: tokio::sync::watch::Sender::new(()),
            amended_expiry: std::sync::atomic::AtomicI64::new(0),
            restore: Mutex::new(None),
            detached: Mutex::new(false),
            detached_signal: Condvar::new(),
            input: Mutex::new(None),
        });
        let mut runs = self.live.lock().unwrap_or_else(|p| p.into_inner());
        runs.insert(run_id.to_owned(), live.clone());
        crate::metrics::get().live_runs.inc();
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
        live
    }

    /// A run whose agent is running: what a live restore would hand over, its record set
    /// running, its creation audited, and its tasks (see [`Self::spawn_run_tasks_after`]).
    fn run_started(
        self: &Arc<Self>,
        run: Started<'_>,
        process: SandboxProcess,
        output: SandboxOutput,
        sink: OutputSink,
    ) {
        let Started {
            run_id,
            receipt,
            argv,
            host_id,
            live,
            dirs,
            admitted_at,
            started_ms,
        } = run;
        let restore = if live.parent.is_none() && self.settings.live_restore.is_some() {
            let kept = process.pid().map(|shim_pid| (shim_pid, argv, started_ms));
            if kept.is_none() {
                tracing::warn!(run_id = %run_id, "the sandbox's pid 1 is not this supervisor's child; this run ends at the next stop");
            }
            kept
        } else {
            None
        };
        if let Err(e) = self.records.set_running(&run_id) {
            live.trigger(RunState::Failed, format!("recording the start failed: {e}"));
        }
        let revoked = {
            let admission = self.admission.read().unwrap_or_else(|p| p.into_inner());
            admission
                .is_revoked(&run_id)
                .then(|| admission.revoked_reason(&run_id))
        };
        if let Some(reason) = revoked {
            live.trigger(RunState::Revoked, reason);
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
        // In the log before anything of the run's end; durable by the time the run's watch
        // has checked (off the start path).
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
        let tasks = RunTasks {
            run_id,
            expires_at: receipt.expires_at.as_ref().map_or(0, |t| t.seconds),
            live,
            dirs,
            started_ms,
            restore,
        };
        self.spawn_run_tasks_after(tasks, process, output, sink, Some(created));
    }

    /// Binds the run's gateway socket (before the agent exists) and makes its gateway, with
    /// the run's egress certificate authority when it inspects a host; returns the socket's
    /// host path, the CA's directory for the plan, and the listening socket for the sandbox's
    /// pid 1 (the gateway serves once the run's watch can ask pid 1 for connections).
    pub(super) fn serve_gateway(
        self: &Arc<Self>,
        receipt: &tollgate_proto::v1::Receipt,
        dirs: &RunDirs,
        plan: &SandboxPlan,
        live: &LiveRun,
        pinned: (&SignedReceipt, Vec<FsGrant>),
    ) -> Result<(PathBuf, Option<PathBuf>, OwnedFd), StartError> {
        let ca_dir = dirs.base.join(EGRESS_CA_DIR);
        let ca = if needs_ca(receipt) {
            Some(Arc::new(
                RunCa::create(receipt, &dirs.base, &ca_dir)
                    .map_err(|e| SandboxError::Setup(e.to_string()))?,
            ))
        } else {
            None
        };
        let ca_dir = ca.is_some().then_some(ca_dir);
        let run = self.gateway_for(receipt, plan, live, pinned, ca);
        let (socket, listener) = gateway::bind(&dirs.base, plan.host_id).map_err(gateway_error)?;
        self.keep_gateway(live, run, socket.clone());
        Ok((socket, ca_dir, OwnedFd::from(listener)))
    }

    /// Keeps a run's gateway (served from its watch: see [`Self::serve_handed`]) on the
    /// socket at `socket`: a fresh one, or the one a re-adopted sandbox's pid 1 kept.
    pub(super) fn keep_gateway(&self, live: &LiveRun, run: Arc<RunGateway>, socket: PathBuf) {
        *live.gateway.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((run, GatewayHandle::bound(socket)));
    }

    /// Serves a live run's gateway on the connections its pid 1 hands over; nothing when the
    /// run is already being torn down (its gateway taken).
    pub(super) fn serve_handed(
        &self,
        run_id: &str,
        live: &LiveRun,
        connections: HandedConnections,
    ) {
        let mut gateway = live.gateway.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((run, handle)) = gateway.as_mut() {
            if let Err(e) = handle.serve_handed(&self.tasks, run.clone(), connections) {
                tracing::error!(run_id = %run_id, error = %e, "the run's gateway cannot serve; its calls wait until it ends");
            }
        }
    }

    /// The run's gateway: its receipt, pinned grants, budgets, exec sandbox and models.
    pub(super) fn gateway_for(
        self: &Arc<Self>,
        receipt: &tollgate_proto::v1::Receipt,
        plan: &SandboxPlan,
        live: &LiveRun,
        (signed, grants): (&SignedReceipt, Vec<FsGrant>),
        ca: Option<Arc<RunCa>>,
    ) -> Arc<RunGateway> {
        let host_id = plan.host_id;
        let manager = Arc::downgrade(self);
        let runs: std::sync::Weak<dyn ChildRuns> = manager.clone();
        let children = ChildState::new(
            signed.clone(),
            ChildControl {
                runs,
                delegator: self.delegator.get().cloned(),
            },
            live.output_left.clone(),
        );
        Arc::new(RunGateway::new(RunGatewayConfig {
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
            snapshots: SnapshotStore::new(&self.settings.data_dir),
            egress: EgressSetup {
                config: self.settings.egress.clone(),
                ca,
                // The routes file's classifier judges what leaves, as it judges model calls.
                classify: self.model_routes().map(|routes| {
                    Arc::new(move |text: &str| routes.classifier.classify(text)) as Classify
                }),
            },
            approvals: self.approvals.clone(),
            output_limit: live.output_limit.clone(),
            exec: Some(Arc::new(ExecSandbox {
                spawner: self.sandboxes.spawner().clone(),
                plan: plan.clone(),
                cgroup: live.cgroup.join(),
                limits: ExecLimits::default(),
                running: AtomicUsize::new(0),
                started: StartedPin::default(),
            })),
            models: self.model_routes().map(|shared| {
                Arc::new(RunModels::new(
                    shared.clone(),
                    receipt.limits.unwrap_or_default().tokens,
                ))
            }),
        }))
    }

    /// Prepares the run directories and plan and sends the plan to the sandbox's shim, once
    /// the run's admission is on disk in the audit log.
    pub(super) fn spawn_sandbox(
        self: &Arc<Self>,
        spawn: Spawn<'_>,
        dirs: &RunDirs,
        live: &LiveRun,
        shim: IdleShim,
    ) -> Result<(SandboxProcess, SandboxOutput), StartError> {
        let Spawn {
            receipt,
            signed,
            host_id,
            argv,
            input,
            grants,
            admitted,
            cgroup_joins,
        } = spawn;
        // Pinned again here (it was at admission, where a bad one is refused before the
        // receipt is spent): the mount is cloned from this descriptor.
        let rootfs = match super::admit::pin_rootfs(receipt, &self.settings.rootfs_dir) {
            Ok(rootfs) => rootfs,
            Err(e) => {
                shim.discard();
                return Err(e);
            }
        };
        let planned = dirs.create(host_id).and_then(|()| {
            plan_for(
                receipt,
                dirs,
                host_id,
                argv,
                rootfs.as_ref().map(|r| r.path.as_path()),
            )
        });
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
        let mounts = match detached_mounts(receipt, &grants, host_id).and_then(|mut mounts| {
            // The userland comes last (the shim takes it from the end); never id-mapped.
            if let Some(rootfs) = &rootfs {
                mounts.push(crate::beneath::detached_mount(&rootfs.root).map_err(|e| {
                    StartError::from(SandboxError::Setup(format!(
                        "mounting the root file system {}: {e}",
                        rootfs.path.display()
                    )))
                })?);
            }
            Ok(mounts)
        }) {
            Ok(mounts) => mounts,
            Err(e) => {
                shim.discard();
                return Err(e);
            }
        };
        let mut plan = plan;
        plan.input = input;
        plan.cgroup_joins = cgroup_joins.len();
        let mut mounts: Vec<OwnedFd> = cgroup_joins.into_iter().chain(mounts).collect();
        match self.serve_gateway(receipt, dirs, &plan, live, (signed, grants)) {
            Ok((socket, ca_dir, listener)) => {
                plan.gateway_socket = Some(socket);
                plan.egress_ca = ca_dir;
                // The last descriptor the plan carries: pid 1 keeps it.
                mounts.push(listener);
            }
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
                .and_then(|(run, _)| run.exec.sandbox.clone());
            match (exec, process.pid_one()) {
                (Some(exec), Ok(pid_one)) => {
                    exec.started.set(Ok(PinnedSandbox { pid_one, execute }));
                }
                (exec, Err(e)) => {
                    tracing::warn!(run_id = %plan.run_id, error = %e, "could not pin the sandbox's pid 1; exec is unavailable");
                    if let Some(exec) = exec {
                        exec.started
                            .set(Err(format!("the sandbox's pid 1 could not be pinned: {e}")));
                    }
                }
                (None, Ok(_)) => {}
            }
        }
        Ok((process, output))
    }
}

/// Why serving a run's gateway failed: a host limit when the socket hit one.
fn gateway_error(e: gateway::GatewayError) -> StartError {
    match crate::error::HostLimit::of(&e.source, false) {
        Some(limit) => limit.into(),
        None => SandboxError::Setup(e.to_string()).into(),
    }
}

/// Detached copies of the mounted grants' trees (in the order of the receipt's mounted
/// grants, as the plan's binds), taken from the pinned descriptors. A grant owned by a user
/// other than root is id-mapped to the sandbox's `host_id` (one user namespace per owner):
/// the agent reads it as its own, and what it creates there lands as the owner's. Root's
/// files are never made the agent's own.
pub(super) fn detached_mounts(
    receipt: &tollgate_proto::v1::Receipt,
    grants: &[FsGrant],
    host_id: u32,
) -> Result<Vec<OwnedFd>, StartError> {
    use std::collections::HashMap;
    use tollgate_files::idmap::{filesystem_name, IdmapError, IdmapNamespace};
    let mut namespaces: HashMap<(u32, u32), IdmapNamespace> = HashMap::new();
    receipt
        .fs
        .iter()
        .zip(grants)
        .enumerate()
        .filter(|(_, (grant, _))| !grant.mount.is_empty())
        .map(|(i, (grant, pinned))| {
            let setup = |e: &dyn std::fmt::Display| -> StartError {
                SandboxError::Setup(format!("mounting the grant {}: {e}", grant.path)).into()
            };
            let root = pinned.root.as_ref().map_err(|errno| setup(errno))?;
            let mount = crate::beneath::detached_mount(root).map_err(|e| setup(&e))?;
            let entry = root.file.as_ref().unwrap_or(&root.dir);
            let owner = nix::sys::stat::fstat(entry).map_err(|e| setup(&e))?;
            if owner.st_uid == 0 {
                return Ok(mount);
            }
            let key = (owner.st_uid, owner.st_gid);
            let namespace = match namespaces.entry(key) {
                std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
                std::collections::hash_map::Entry::Vacant(entry) => entry.insert(
                    IdmapNamespace::new(key.0, key.1, host_id).map_err(|e| setup(&e))?,
                ),
            };
            match namespace.apply(&mount) {
                Ok(()) => Ok(mount),
                Err(IdmapError::Mount(errno)) => Err(StartError::Grant {
                    code: "grant_idmap",
                    reason: format!(
                        "fs[{i}] = {}: its file system ({}) cannot id-map mounts ({errno}), which a grant owned by uid {} needs (the agent reads it as its own and its new files are the owner's); move it to ext4, xfs, btrfs or tmpfs, or make it root's and readable by others",
                        grant.path,
                        filesystem_name(&mount),
                        key.0
                    ),
                }),
                Err(e) => Err(setup(&e)),
            }
        })
        .collect()
}
