//! Opening the run manager: the records, recovery from a crash or a live restore (runs taken
//! back from their pid 1; every other unfinished run `lost`, its cgroup and directory swept),
//! the sandbox pool and the gateway runtime.

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use tollgate_audit::{AuditLog, EntryDraft, EntryKind};
use tollgate_receipt::{unix_now, KeySet};

use super::{restore, RunManager, RunSettings};
use crate::admission::ReceiptAdmission;
use crate::cgroup::{delegate_to, make_shards, restore_left, sweep_keeping};
use crate::error::StartError;
use crate::host_ids::HostIds;
use crate::records::{RunRecords, RunState, TeardownReport};
use crate::sandbox::{create_mount_point, sandbox_base, SandboxError, Spawner};
use crate::warm::SandboxPool;
use crate::COMPONENT;

impl RunManager {
    /// Opens the records and recovers from a crash: runs left `starting` or `running` are
    /// marked `lost`, every cgroup under the parent is killed and removed, and every run
    /// directory is deleted. Returns the manager and the ids of the recovered runs.
    pub fn open(
        settings: RunSettings,
        keys: KeySet,
        audit: AuditLog,
    ) -> Result<(Arc<Self>, Vec<String>), StartError> {
        // The mount point of every sandbox's root, which the spawner's base needs too.
        let base = sandbox_base(&settings.data_dir, &settings.shim);
        create_mount_point(&base)?;
        // First, while this process holds few descriptors: every shim inherits its table.
        let spawner = Arc::new(Spawner::start(settings.shim.clone(), base.clone()));
        let runs_dir = settings.data_dir.join("runs");
        std::fs::create_dir_all(&runs_dir).map_err(|source| SandboxError::RunDir {
            path: runs_dir.clone(),
            source,
        })?;
        let records = RunRecords::open(&settings.data_dir.join("supervisor.db"))?;
        // Runs a previous supervisor left running detached (live restore), taken back from
        // their pid 1 before anything is swept; every other unfinished run is lost.
        let (reclaimed, ended_detached) = restore::reclaim(&records, &settings.data_dir)?;
        let adopted: std::collections::BTreeSet<String> = reclaimed
            .iter()
            .map(|run| run.run_id().to_owned())
            .collect();
        let recovered: Vec<String> = records
            .list()?
            .into_iter()
            .filter(|record| {
                !record.state.is_final()
                    && !adopted.contains(&record.run_id)
                    && !ended_detached
                        .iter()
                        .any(|ended| ended.run_id == record.run_id)
            })
            .map(|record| record.run_id)
            .collect();
        let keep = reclaimed
            .iter()
            .map(restore::Reclaimed::cgroup_name)
            .collect();
        let swept = sweep_keeping(&settings.cgroup_parent, false, &keep)?;
        // A stop that did not finish may have left the parent's CPU weight raised (see
        // `cgroup::raise_for_stop`): the runs to come must not outweigh the host.
        match restore_left(&super::stop_weight_record(&settings.data_dir)) {
            Ok(0) => {}
            Ok(files) => tracing::warn!(
                files,
                "a stop that did not finish left the parent cgroup's CPU weight raised; put back"
            ),
            Err(e) => {
                tracing::error!(error = %e, "could not put back the parent cgroup's CPU weight")
            }
        }
        // A parent that cannot hold limited runs fails the start-up, not the first run.
        delegate_to(&settings.cgroup_parent)?;
        // Made now, not by the first runs that need them (see `cgroup::make_shards`).
        make_shards(&settings.cgroup_parent)?;
        if let Ok(entries) = std::fs::read_dir(&runs_dir) {
            for entry in entries.flatten() {
                if !adopted.contains(entry.file_name().to_string_lossy().as_ref()) {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        // Detach sockets of runs that were not re-adopted.
        if let Ok(entries) = std::fs::read_dir(settings.data_dir.join("live")) {
            for entry in entries.flatten() {
                let _ = std::fs::remove_file(entry.path());
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
        // Runs left detached whose sandbox ended on its own (or could not be taken back).
        for ended in &ended_detached {
            let report = TeardownReport {
                reason: ended.reason.clone(),
                ..Default::default()
            };
            audit.append(
                EntryDraft::new(COMPONENT, EntryKind::Teardown)
                    .receipt(ended.run_id.as_str())
                    .run(ended.run_id.as_str())
                    .reason(ended.reason.as_str())
                    .meta("state", ended.state.name()),
            )?;
            records.finish(&ended.run_id, ended.state, &report, unix_now())?;
        }
        if !recovered.is_empty() || swept.len() > ended_detached.len() {
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
        // What is still live now was re-adopted: its host ids stay held.
        let host_ids = HostIds::new(settings.host_ids.clone(), records.live_host_ids()?);
        let admission =
            ReceiptAdmission::new(settings.supervisor_id.clone(), keys, settings.clock_skew);
        let sandboxes = SandboxPool::new(
            spawner,
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
        crate::metrics::get().key_set_replaced();
        let manager = Arc::new(Self {
            tasks: gateway_runtime.handle().clone(),
            gateway_runtime: Some(gateway_runtime),
            teardowns: super::teardowns::Teardowns::new(super::teardowns::TEARDOWN_WORKERS),
            endings: Default::default(),
            models: RwLock::new(None),
            delegator: OnceLock::new(),
            key_refresh: OnceLock::new(),
            freshness: OnceLock::new(),
            hub: Arc::default(),
            approvals: Arc::default(),
            family: Mutex::default(),
            host_ids: Mutex::new(host_ids),
            settings,
            records,
            admission: RwLock::new(admission),
            sandboxes,
            audit,
            live: Mutex::new(HashMap::new()),
            allocation: Mutex::new(()),
            closing: std::sync::atomic::AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            removals: Default::default(),
            left_detached: std::sync::atomic::AtomicBool::new(false),
        });
        for run in reclaimed {
            manager.adopt(run);
        }
        // Kept workspaces go when their time is up: now, and every minute from then on
        // (the thread ends with the manager).
        manager.sweep_workspaces();
        let weak = Arc::downgrade(&manager);
        std::thread::spawn(move || loop {
            std::thread::sleep(std::time::Duration::from_secs(60));
            match weak.upgrade() {
                Some(manager) => manager.sweep_workspaces(),
                None => return,
            }
        });
        Ok((manager, recovered))
    }
}
