//! One cgroup per run, on cgroup v2, v1, or a hybrid host (v1 controllers beside a v2 tree).
//!
//! The cgroup exists, with its limits applied and read back, before the agent does: the
//! sandbox's first process (the shim) is created in it and joins every hierarchy itself
//! before it executes the shim (through [`RunCgroup::join`]; see `sandbox::spawn`), and it
//! does nothing before its first message; the run's limits are in place
//! before the shim is given its plan. A start with no sandbox prepared ahead on a hybrid host
//! makes it in two steps instead ([`RunCgroup::create_membership_first`]): the shim starts in
//! the run's v2 directory and its shard's v1 cgroups, and pid 1 joins the run's v1 cgroups,
//! limits in place, before it forks the agent. The cgroup is the source of truth
//! for "everything the run started": teardown kills what it contains and removes it.
//!
//! `cgroups-rs` finds where the v1 controllers are mounted (read once per process: the
//! mount table does not change under a running supervisor, and `cgroups-rs` would read it
//! afresh, twice, for every run). What it does not do, or does too slowly for a run's start,
//! is written here at file level, each small:
//! * **Creation**: one directory per hierarchy, made directly.
//! * **Limits**: five control files written and read back (`RunCgroup::apply_limits`);
//!   `cgroups-rs` would re-read the mount table on every load, on every start.
//! * **Hybrid hosts**: `cgroups-rs` picks v1 there and ignores the v2 tree beside it. We also
//!   create the run's directory in the v2 tree, with no controllers, purely for membership, so
//!   that `cgroup.kill` works (systemd does the same on hybrid hosts), and then no v1 freezer
//!   directory: one hierarchy fewer to make, join and remove for every run.
//! * **Kill**: `cgroups-rs` kills only on v2 (`cgroup.kill`); on pure v1 we freeze, SIGKILL
//!   every member, thaw, and repeat until empty, so nothing forks away mid-kill.
//! * **Removal with retries**: `rmdir` of a cgroup fails with `EBUSY` while the kernel is
//!   still releasing dying tasks; we retry with backoff instead of leaking it.
//! * **Verification**: we read every limit back and fail closed if the kernel does not hold
//!   what the receipt promises.
//! * **Delegation on v2** ([`delegate_to`]): every cgroup from the hierarchy's root down to
//!   the run's parent must list `memory pids cpu` in its `cgroup.subtree_control`, and the
//!   kernel refuses that (`EBUSY`) for a cgroup that holds processes — the "no internal
//!   processes" rule. A supervisor in a container (its own cgroup namespace, whose root holds
//!   its processes) or in a systemd unit with `Delegate=yes` whose parent lies inside its own
//!   unit meets exactly this; as systemd's delegation rules and container inits do, we move the
//!   processes of the supervisor's *own* cgroup into a leaf, [`SUPERVISOR_LEAF`], and never
//!   touch anyone else's: a foreign cgroup in the way is an error naming it.
//!   `cgroups-rs` enables controllers but ignores every failure, so a run would start with no
//!   limit files at all; on v2 we create the directories ourselves.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cgroups_rs::fs::hierarchies::V1;
use cgroups_rs::fs::Controllers;
use nix::sys::signal::{kill, Signal};
use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC};
use nix::unistd::Pid;

mod tree;
mod weight;

pub use tree::{
    is_shard, make_shards, remove_shards, sandbox_cgroups, sandbox_path, sweep, sweep_keeping,
    SHARDS,
};
pub use weight::{raise_for_stop, restore_left, StopWeight};

/// Where cgroup v2 is mounted on a unified host.
const UNIFIED_ROOT: &str = "/sys/fs/cgroup";
/// Where systemd mounts the v2 tree on a hybrid host.
const HYBRID_V2_ROOT: &str = "/sys/fs/cgroup/unified";
/// v1 controllers a run uses: limits, plus the freezer for killing where no v2 directory
/// has `cgroup.kill` (pure v1; a hybrid host's run skips it, see
/// [`RunCgroup::create_unlimited`]).
const V1_CONTROLLERS: [Controllers; 4] = [
    Controllers::Mem,
    Controllers::Pids,
    Controllers::Cpu,
    Controllers::Freezer,
];
/// v2 controllers a run uses (enabled in the parent's `cgroup.subtree_control`).
const V2_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];
/// The leaf cgroup a supervisor moves its own cgroup's processes into, when that cgroup must
/// pass controllers down to the runs' parent (v2). Never a run's name (runs are uuids), and
/// skipped by [`sweep`].
pub const SUPERVISOR_LEAF: &str = "tollgate-supervisor";
/// CFS period used for the CPU quota.
const CPU_PERIOD_US: u64 = 100_000;

/// How the host mounts cgroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupMode {
    /// Pure cgroup v2 at `/sys/fs/cgroup`.
    Unified,
    /// Only v1 controller hierarchies.
    Legacy,
    /// v1 controllers, plus a v2 tree (without controllers) at `/sys/fs/cgroup/unified`.
    Hybrid,
}

impl CgroupMode {
    /// Detects the host's mode from the file-system types under `/sys/fs/cgroup`.
    pub fn detect() -> Self {
        let is_cgroup2 = |path: &str| {
            statfs(path).is_ok_and(|stat| stat.filesystem_type() == CGROUP2_SUPER_MAGIC)
        };
        if is_cgroup2(UNIFIED_ROOT) {
            Self::Unified
        } else if is_cgroup2(HYBRID_V2_ROOT) {
            Self::Hybrid
        } else {
            Self::Legacy
        }
    }
}

/// A cgroup operation failed. Each step has its own variant because each needs a different
/// fix from the operator.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A needed v1 controller is not mounted.
    #[error("cgroup v1 controller {0} is not mounted; mount it or run on a cgroup v2 host")]
    ControllerMissing(String),
    /// Creating the cgroup failed.
    #[error("cannot create cgroup {path}: {detail}")]
    Create {
        /// The cgroup (relative path).
        path: String,
        /// What failed.
        detail: String,
    },
    /// The kernel does not hold a limit we set: the run must not start unlimited.
    #[error("cgroup {file} holds {found:?}, not the requested {wanted:?}; refusing to run without the receipt's limit")]
    LimitNotApplied {
        /// The control file.
        file: PathBuf,
        /// What we wrote.
        wanted: String,
        /// What the kernel reports.
        found: String,
    },
    /// Reading or writing a control file failed.
    #[error("cgroup file {file}: {source}")]
    Io {
        /// The control file.
        file: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// A cgroup on the way down to the runs' parent does not have a controller to pass on (v2).
    #[error("cgroup {cgroup} cannot delegate the {missing} controller(s): its parent does not enable them; enable them in the parent's cgroup.subtree_control (systemd: Delegate=yes on the supervisor's unit)")]
    ControllersUnavailable {
        /// The cgroup directory.
        cgroup: PathBuf,
        /// The controllers it lacks.
        missing: String,
    },
    /// A cgroup that is not this supervisor's holds processes, so the kernel will not let it
    /// pass controllers to its children (v2's "no internal processes" rule).
    #[error("cgroup {cgroup} holds processes that are not this supervisor's ({pids}), so it cannot delegate controllers to the runs' parent; move them into a leaf cgroup or choose a --cgroup-parent outside it")]
    ProcessesInTheWay {
        /// The cgroup directory.
        cgroup: PathBuf,
        /// Some of the processes in it.
        pids: String,
    },
    /// Processes were still alive after the kill deadline.
    #[error("cgroup {path} still has {count} processes after killing for {waited:?}")]
    KillTimeout {
        /// The cgroup directory.
        path: PathBuf,
        /// How many remain.
        count: usize,
        /// How long we tried.
        waited: Duration,
    },
    /// The record of the runs' parent's CPU weight before a stop raised it cannot be read
    /// back, so the weight a crashed stop left raised cannot be put back.
    #[error("the record of the parent cgroup's CPU weight before a stop, {file}, cannot be read ({detail}); check the parent's cpu.shares or cpu.weight by hand, then remove the record")]
    WeightRecord {
        /// The record.
        file: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// A directory could not be removed.
    #[error("cannot remove cgroup {path}: {source}")]
    Remove {
        /// The cgroup directory.
        path: PathBuf,
        /// The last failure.
        source: std::io::Error,
    },
}

fn io_error(file: &Path) -> impl FnOnce(std::io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Io {
        file: file.to_owned(),
        source,
    }
}

/// How a cgroup's processes are killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillMethod {
    /// Write `1` to the v2 `cgroup.kill` (atomic, kernel 5.14+).
    CgroupKill,
    /// v1: freeze, SIGKILL each member, thaw, repeat until empty.
    Freezer,
}

/// The limits a run's cgroup enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLimits {
    /// Memory (and memory plus swap) limit in bytes; rounded up to whole pages.
    pub memory_bytes: u64,
    /// Maximum processes and threads.
    pub pids: u32,
    /// CPU quota in thousandths of a core.
    pub cpu_millicores: u32,
}

impl CgroupLimits {
    fn memory_rounded(&self) -> u64 {
        const PAGE: u64 = 4096;
        self.memory_bytes.div_ceil(PAGE).max(1) * PAGE
    }

    fn cpu_quota_us(&self) -> u64 {
        (u64::from(self.cpu_millicores) * CPU_PERIOD_US / 1000).max(1000)
    }
}

/// How a process joins a run's cgroup as it starts, in every hierarchy: it is created in the
/// v2 directory (`clone3` with `CLONE_INTO_CGROUP`) and, single-threaded and before it
/// executes anything, writes `0` to each v1 hierarchy's `tasks` file. Both are the kernel's
/// cheap moves: a move by pid (`cgroup.procs`) takes the kernel's threadgroup lock for
/// writing, which can wait a whole RCU grace period while every other cgroup move waits on
/// it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupJoin {
    /// Each v1 hierarchy's `tasks` file (none on a unified host).
    pub v1_tasks: Vec<PathBuf>,
    /// The v2 directory (none on a pure v1 host).
    pub v2_dir: Option<PathBuf>,
}

/// The cgroup of one run, in every hierarchy the host has.
#[derive(Debug)]
pub struct RunCgroup {
    relative: String,
    mode: CgroupMode,
    /// v1 controller directories (empty on a unified host).
    v1_dirs: Vec<(Controllers, PathBuf)>,
    /// The v2 directory: the whole cgroup on a unified host, membership only on a hybrid one.
    v2_dir: Option<PathBuf>,
}

/// Where `controller` is mounted (v1), from the mount table as it was first read.
fn v1_mount(controller: Controllers) -> Result<PathBuf, CgroupError> {
    static MOUNTS: OnceLock<Vec<(Controllers, Option<PathBuf>)>> = OnceLock::new();
    let mounts = MOUNTS.get_or_init(|| {
        let v1 = V1::new();
        V1_CONTROLLERS
            .into_iter()
            .map(|c| {
                let mount = v1
                    .get_mount_point(c.clone())
                    .map(|(mount_point, _root)| mount_point);
                (c, mount)
            })
            .collect()
    });
    mounts
        .iter()
        .find(|(c, _)| *c == controller)
        .and_then(|(_, mount)| mount.clone())
        .ok_or_else(|| CgroupError::ControllerMissing(controller.to_string()))
}

fn read_trimmed(file: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(file)
        .map(|text| text.trim().to_owned())
        .map_err(io_error(file))
}

fn expect_value(file: PathBuf, wanted: String) -> Result<(), CgroupError> {
    let found = read_trimmed(&file)?;
    if found == wanted {
        Ok(())
    } else {
        Err(CgroupError::LimitNotApplied {
            file,
            wanted,
            found,
        })
    }
}

fn write_file(file: &Path, value: &str) -> Result<(), CgroupError> {
    fs::write(file, value).map_err(io_error(file))
}

/// Writes `value` to `file` unless it holds it already (read first: a cgroup file reads back
/// what was written, trimmed).
fn write_if_differs(file: &Path, value: &str) -> Result<(), CgroupError> {
    if read_trimmed(file)? == value {
        return Ok(());
    }
    write_file(file, value)
}

impl RunCgroup {
    /// Creates `relative` (e.g. `tollgate/shard-0a/<sandbox-id>`, see [`sandbox_path`]) in
    /// every hierarchy, with any level above it that is missing (a shard), applies `limits`
    /// and reads them back. On any failure, whatever was created for the run is removed.
    pub fn create(relative: &str, limits: CgroupLimits) -> Result<Self, CgroupError> {
        Self::create_unlimited(relative)?.limited(limits)
    }

    /// This cgroup with `limits` applied and read back, or removed again.
    fn limited(self, limits: CgroupLimits) -> Result<Self, CgroupError> {
        match self.apply_limits(limits) {
            Ok(()) => Ok(self),
            Err(error) => {
                // Best effort: the original error is what the caller needs to see.
                let _ = self.remove();
                Err(error)
            }
        }
    }

    /// The cgroup `relative` as it already exists (a crash's leftover to sweep, or a run a
    /// live restore re-adopts); nothing is created or checked.
    pub fn existing(relative: &str) -> Self {
        let mode = CgroupMode::detect();
        Self {
            v1_dirs: match mode {
                CgroupMode::Unified => Vec::new(),
                _ => V1_CONTROLLERS
                    .into_iter()
                    .filter_map(|c| v1_mount(c.clone()).ok().map(|m| (c, m.join(relative))))
                    // A hybrid host's runs have no freezer directory (older supervisors' did).
                    .filter(|(c, dir)| {
                        mode != CgroupMode::Hybrid || *c != Controllers::Freezer || dir.exists()
                    })
                    .collect(),
            },
            v2_dir: match mode {
                CgroupMode::Unified => Some(Path::new(UNIFIED_ROOT).join(relative)),
                CgroupMode::Hybrid => Some(Path::new(HYBRID_V2_ROOT).join(relative)),
                CgroupMode::Legacy => None,
            },
            mode,
            relative: relative.to_owned(),
        }
    }

    /// Creates `relative` in every hierarchy without limits yet: for a sandbox prepared
    /// ahead of need, whose only processes are the shim's, idle until
    /// [`RunCgroup::apply_limits`] has run. On failure nothing is left behind.
    ///
    /// On a hybrid host whose v2 directory has `cgroup.kill` (kernel 5.14+), no v1 freezer
    /// directory is made: the v2 directory already tracks membership and kills, and each
    /// hierarchy is a directory made, joined by every process started in it and removed at
    /// its end, under the kernel's one cgroup mutex.
    pub fn create_unlimited(relative: &str) -> Result<Self, CgroupError> {
        Self::create_in_mode(relative, CgroupMode::detect())
    }

    /// Makes only the run's v2 directory `relative`, on a hybrid host whose v2 directory
    /// kills (`cgroup.kill`): the first step of a run's cgroup made in two, for a start with
    /// no sandbox prepared ahead. The shim starts at once, in this directory and in its
    /// shard's v1 cgroups ([`Self::first_join`]); the run's v1 directories and limits are
    /// made while it builds the sandbox's namespaces ([`Self::complete`]), and pid 1 joins
    /// them before the agent exists. A memory cgroup's creation is most of what a run's
    /// cgroup costs (0.2 to 3 ms, with the host's state), and a write of a CPU quota walks
    /// every CPU cgroup on the host: both come off the start's path. `None`, with nothing
    /// made, on any other host.
    pub fn create_membership_first(relative: &str) -> Result<Option<Self>, CgroupError> {
        if CgroupMode::detect() != CgroupMode::Hybrid {
            return Ok(None);
        }
        let dir = Path::new(HYBRID_V2_ROOT).join(relative);
        let cgroup = Self {
            relative: relative.to_owned(),
            mode: CgroupMode::Hybrid,
            v1_dirs: Vec::new(),
            v2_dir: Some(dir.clone()),
        };
        // The shard the shim starts in must be there in every v1 hierarchy (made when the
        // supervisor opened); where one is not, the cgroup is made in one step, shard and all.
        if !cgroup
            .first_join()
            .v1_tasks
            .iter()
            .all(|tasks| tasks.exists())
        {
            return Ok(None);
        }
        if let Err(e) = fs::create_dir_all(&dir) {
            let _ = cgroup.remove();
            return Err(cgroup.create_error(format!("{}: {e}", dir.display())));
        }
        if cgroup.kill_method() != KillMethod::CgroupKill {
            // Its v1 freezer would have to be joined as the shim starts: made in one step.
            let _ = cgroup.remove();
            return Ok(None);
        }
        Ok(Some(cgroup))
    }

    /// How the first process of a cgroup from [`Self::create_membership_first`] joins as it
    /// starts: the run's v2 directory (so it is the run's to kill from its first
    /// instruction), and its shard's cgroup in each v1 hierarchy, never the supervisor's own
    /// (what the shim makes before pid 1 joins the run's is charged to the shard).
    pub fn first_join(&self) -> CgroupJoin {
        let shard = Path::new(&self.relative).parent().unwrap_or(Path::new(""));
        CgroupJoin {
            v1_tasks: V1_CONTROLLERS
                .into_iter()
                .filter(|c| *c != Controllers::Freezer)
                .filter_map(|c| v1_mount(c).ok())
                .map(|mount| mount.join(shard).join("tasks"))
                .collect(),
            v2_dir: self.v2_dir.clone(),
        }
    }

    /// Makes the v1 directories of a cgroup from [`Self::create_membership_first`] (memory,
    /// pids, cpu) and applies `limits`, read back. On failure what was made stays recorded
    /// here: the caller kills the shim in the v2 directory and removes the whole cgroup.
    pub fn complete(&mut self, limits: CgroupLimits) -> Result<(), CgroupError> {
        self.create_v1_dirs(false)?;
        self.apply_limits(limits)
    }

    /// Makes the run's directory in each v1 hierarchy (the freezer's only when `freezer`),
    /// each recorded before it is made, so a failure's cleanup removes what was.
    fn create_v1_dirs(&mut self, freezer: bool) -> Result<(), CgroupError> {
        for controller in V1_CONTROLLERS {
            if controller == Controllers::Freezer && !freezer {
                continue;
            }
            let dir = v1_mount(controller.clone())?.join(&self.relative);
            self.v1_dirs.push((controller, dir.clone()));
            fs::create_dir_all(&dir)
                .map_err(|e| self.create_error(format!("{}: {e}", dir.display())))?;
        }
        Ok(())
    }

    /// Creates `relative` as on a pure cgroup v1 host, in the v1 hierarchies only (the
    /// freezer among them), whatever else this host has, and applies `limits`: how the
    /// freezer's kill is tested on hosts that also have a v2 tree, whose runs never use it.
    pub fn create_as_v1_only(relative: &str, limits: CgroupLimits) -> Result<Self, CgroupError> {
        Self::create_in_mode(relative, CgroupMode::Legacy)?.limited(limits)
    }

    fn create_in_mode(relative: &str, mode: CgroupMode) -> Result<Self, CgroupError> {
        let mut cgroup = Self {
            relative: relative.to_owned(),
            mode: mode.clone(),
            v1_dirs: Vec::new(),
            v2_dir: None,
        };
        if let Err(error) = cgroup.create_dirs() {
            let _ = cgroup.remove();
            return Err(error);
        }
        Ok(cgroup)
    }

    fn create_error(&self, detail: String) -> CgroupError {
        CgroupError::Create {
            path: self.relative.clone(),
            detail,
        }
    }

    fn create_dirs(&mut self) -> Result<(), CgroupError> {
        match self.mode {
            CgroupMode::Unified => {
                let dir = Path::new(UNIFIED_ROOT).join(&self.relative);
                let parent = Path::new(&self.relative)
                    .parent()
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default();
                delegate_to(&parent)?;
                match fs::create_dir(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                    Err(e) => {
                        return Err(self.create_error(format!("{}: {e}", dir.display())));
                    }
                }
                self.v2_dir = Some(dir);
            }
            CgroupMode::Legacy | CgroupMode::Hybrid => {
                // The v2 directory first: whether it has `cgroup.kill` decides the freezer.
                let mut freezer = true;
                if self.mode == CgroupMode::Hybrid {
                    let dir = Path::new(HYBRID_V2_ROOT).join(&self.relative);
                    // Recorded before it is made: a failure's cleanup removes what was.
                    self.v2_dir = Some(dir.clone());
                    fs::create_dir_all(&dir)
                        .map_err(|e| self.create_error(format!("{}: {e}", dir.display())))?;
                    freezer = self.kill_method() == KillMethod::Freezer;
                }
                self.create_v1_dirs(freezer)?;
            }
        }
        Ok(())
    }

    /// Applies `limits` and reads every one back: the run must never start without what the
    /// receipt promises. Written file by file rather than through `cgroups-rs`, whose
    /// `Cgroup::load` re-reads the mount table each time: this runs on every start. A file
    /// already holding its value is not written: a sandbox prepared ahead holds the limits
    /// of the run before it (see `warm`), and a write of the CPU quota makes the kernel walk
    /// every CPU cgroup on the host to check the quotas still fit (`tg_set_cfs_bandwidth`),
    /// a cost that grows with every live run.
    pub fn apply_limits(&self, limits: CgroupLimits) -> Result<(), CgroupError> {
        let memory = limits.memory_rounded().to_string();
        let pids = limits.pids.to_string();
        let quota = limits.cpu_quota_us().to_string();
        match self.mode {
            CgroupMode::Unified => {
                let dir = self.v2_dir.clone().unwrap_or_default();
                write_if_differs(&dir.join("memory.max"), &memory)?;
                // No swap beyond the memory limit, where swap accounting exists.
                if dir.join("memory.swap.max").exists() {
                    write_if_differs(&dir.join("memory.swap.max"), "0")?;
                }
                write_if_differs(&dir.join("pids.max"), &pids)?;
                write_if_differs(&dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
                self.verify_v2_limits(limits)
            }
            CgroupMode::Legacy | CgroupMode::Hybrid => {
                let memory_dir = self.v1_dir(&Controllers::Mem);
                let limit = memory_dir.join("memory.limit_in_bytes");
                let memsw = memory_dir.join("memory.memsw.limit_in_bytes");
                let memsw = memsw.exists().then_some(memsw);
                // Memory+swap may never be below the memory limit: when the limit rises, the
                // memory+swap limit rises first.
                let rising = read_trimmed(&limit)?
                    .parse::<u64>()
                    .is_ok_and(|current| current < limits.memory_rounded());
                if rising {
                    if let Some(memsw) = &memsw {
                        write_if_differs(memsw, &memory)?;
                    }
                }
                write_if_differs(&limit, &memory)?;
                if let Some(memsw) = &memsw {
                    write_if_differs(memsw, &memory)?;
                }
                write_if_differs(&self.v1_dir(&Controllers::Pids).join("pids.max"), &pids)?;
                let cpu = self.v1_dir(&Controllers::Cpu);
                // A new cgroup already has the default period.
                write_if_differs(&cpu.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
                write_if_differs(&cpu.join("cpu.cfs_quota_us"), &quota)?;
                self.verify_v1_limits(limits)
            }
        }
    }

    /// The cgroup's path relative to each hierarchy's root (e.g.
    /// `tollgate/shard-0a/<sandbox-id>`).
    pub fn relative(&self) -> &str {
        &self.relative
    }

    fn v1_dir(&self, controller: &Controllers) -> PathBuf {
        self.v1_dirs
            .iter()
            .find(|(c, _)| c == controller)
            .map(|(_, dir)| dir.clone())
            .unwrap_or_default()
    }

    fn verify_v1_limits(&self, limits: CgroupLimits) -> Result<(), CgroupError> {
        let memory = self.v1_dir(&Controllers::Mem);
        expect_value(
            memory.join("memory.limit_in_bytes"),
            limits.memory_rounded().to_string(),
        )?;
        if memory.join("memory.memsw.limit_in_bytes").exists() {
            expect_value(
                memory.join("memory.memsw.limit_in_bytes"),
                limits.memory_rounded().to_string(),
            )?;
        }
        expect_value(
            self.v1_dir(&Controllers::Pids).join("pids.max"),
            limits.pids.to_string(),
        )?;
        let cpu = self.v1_dir(&Controllers::Cpu);
        expect_value(cpu.join("cpu.cfs_period_us"), CPU_PERIOD_US.to_string())?;
        expect_value(
            cpu.join("cpu.cfs_quota_us"),
            limits.cpu_quota_us().to_string(),
        )
    }

    fn verify_v2_limits(&self, limits: CgroupLimits) -> Result<(), CgroupError> {
        let dir = self.v2_dir.clone().unwrap_or_default();
        if dir.join("memory.swap.max").exists() {
            expect_value(dir.join("memory.swap.max"), "0".into())?;
        }
        expect_value(dir.join("memory.max"), limits.memory_rounded().to_string())?;
        expect_value(dir.join("pids.max"), limits.pids.to_string())?;
        expect_value(
            dir.join("cpu.max"),
            format!("{} {CPU_PERIOD_US}", limits.cpu_quota_us()),
        )
    }

    /// The host's cgroup mode.
    pub fn mode(&self) -> &CgroupMode {
        &self.mode
    }

    /// How a new process joins the run's cgroup in every hierarchy, so that it is limited
    /// (v1 controllers or v2) and killable (freezer or v2 membership).
    pub fn join(&self) -> CgroupJoin {
        CgroupJoin {
            v1_tasks: self
                .v1_dirs
                .iter()
                .map(|(_, dir)| dir.join("tasks"))
                .collect(),
            v2_dir: self.v2_dir.clone(),
        }
    }

    /// Each v1 hierarchy's `tasks` file of this cgroup, opened for writing: sent with the plan
    /// to a pid 1 that joins them itself (see [`Self::create_membership_first`]).
    pub fn open_v1_tasks(&self) -> Result<Vec<std::os::fd::OwnedFd>, CgroupError> {
        self.join()
            .v1_tasks
            .iter()
            .map(|file| {
                fs::OpenOptions::new()
                    .write(true)
                    .open(file)
                    .map(std::os::fd::OwnedFd::from)
                    .map_err(io_error(file))
            })
            .collect()
    }

    /// Moves process `pid` into the run's cgroup in every hierarchy, by pid (for a process
    /// started elsewhere; the supervisor's own children join as they start, see
    /// [`Self::join`]).
    pub fn add_process(&self, pid: u32) -> Result<(), CgroupError> {
        let dirs = self.v1_dirs.iter().map(|(_, dir)| dir).chain(&self.v2_dir);
        for dir in dirs {
            write_file(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// The directory that tracks membership: v2 where present, else the v1 freezer.
    fn membership_dir(&self) -> PathBuf {
        self.v2_dir
            .clone()
            .unwrap_or_else(|| self.v1_dir(&Controllers::Freezer))
    }

    /// Process ids in the run's cgroup (an empty list once it is gone).
    pub fn pids(&self) -> Result<Vec<u32>, CgroupError> {
        read_pids(&self.membership_dir())
    }

    /// How [`Self::kill_all`] kills on this host: `cgroup.kill` where a v2 directory has it
    /// (kernel 5.14+), else the v1 freezer.
    pub fn kill_method(&self) -> KillMethod {
        match &self.v2_dir {
            Some(dir) if dir.join("cgroup.kill").exists() => KillMethod::CgroupKill,
            _ => KillMethod::Freezer,
        }
    }

    /// Kills every process in the cgroup and waits until it is empty.
    pub fn kill_all(&self, deadline: Duration) -> Result<(), CgroupError> {
        self.kill_with(self.kill_method(), deadline)
    }

    /// Kills every process with a given method (both are tested on hybrid hosts, which
    /// support both).
    pub fn kill_with(&self, method: KillMethod, deadline: Duration) -> Result<(), CgroupError> {
        let start = Instant::now();
        if method == KillMethod::CgroupKill {
            let dir = self.v2_dir.clone().unwrap_or_default();
            // Most runs are empty by their teardown (pid 1's exit ended its pid namespace, or
            // a stop killed every run at once): no kill then, as its write waits for the
            // kernel's cgroup mutex, which every other ending run's removal also takes.
            if read_pids(&dir)?.is_empty() || !write_kill(&dir)? {
                return Ok(());
            }
            return wait_empty(&dir, start, deadline);
        }
        let freezer = self.v1_dir(&Controllers::Freezer);
        loop {
            let pids = read_pids(&freezer)?;
            if pids.is_empty() {
                return Ok(());
            }
            if start.elapsed() > deadline {
                return Err(CgroupError::KillTimeout {
                    path: freezer,
                    count: pids.len(),
                    waited: deadline,
                });
            }
            kill_frozen(&freezer)?;
            std::thread::sleep(Duration::from_micros(500));
        }
    }

    /// Sends the kill to every process in the cgroup and returns without waiting for them
    /// to die: what [`Self::kill_all`] starts with. A caller ending many runs at once (a
    /// supervisor's shutdown) signals every cgroup first, so that the kernel tears their
    /// processes and namespaces down side by side, then waits (teardown's `kill_all` finds
    /// each empty, or finishes the kill).
    pub fn signal_kill(&self) -> Result<(), CgroupError> {
        match self.kill_method() {
            KillMethod::CgroupKill => {
                write_kill(&self.v2_dir.clone().unwrap_or_default())?;
                Ok(())
            }
            KillMethod::Freezer => {
                let freezer = self.v1_dir(&Controllers::Freezer);
                // A cgroup already gone (or empty) is nothing to do.
                if read_pids(&freezer)?.is_empty() {
                    return Ok(());
                }
                kill_frozen(&freezer)
            }
        }
    }

    /// Peak memory use in bytes, when the kernel reports it.
    pub fn peak_memory(&self) -> Option<u64> {
        let file = match self.mode {
            CgroupMode::Unified => self.v2_dir.as_ref()?.join("memory.peak"),
            _ => self
                .v1_dir(&Controllers::Mem)
                .join("memory.max_usage_in_bytes"),
        };
        read_trimmed(&file).ok()?.parse().ok()
    }

    /// Whether the kernel's OOM killer acted inside the cgroup.
    pub fn oom_killed(&self) -> bool {
        let file = match self.mode {
            CgroupMode::Unified => self
                .v2_dir
                .clone()
                .unwrap_or_default()
                .join("memory.events"),
            _ => self.v1_dir(&Controllers::Mem).join("memory.oom_control"),
        };
        read_trimmed(&file).is_ok_and(|text| {
            text.lines()
                .filter_map(|line| line.strip_prefix("oom_kill "))
                .any(|count| count.trim().parse::<u64>().unwrap_or(0) > 0)
        })
    }

    /// Removes the cgroup from every hierarchy, retrying while the kernel still holds it.
    /// Already-absent directories are fine.
    pub fn remove(&self) -> Result<(), CgroupError> {
        let dirs = self
            .v1_dirs
            .iter()
            .map(|(_, dir)| dir.clone())
            .chain(self.v2_dir.clone());
        let mut first_error = None;
        for dir in dirs {
            if let Err(e) = remove_with_retries(&dir, Duration::from_secs(2)) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Sends the kill to every process in every cgroup under `parent` with one write to its v2
/// `cgroup.kill`, which the kernel applies to the whole subtree; returns without waiting.
/// `false` (nothing sent) where the host has no `cgroup.kill`, or where the supervisor's own
/// leaf ([`SUPERVISOR_LEAF`]) is under `parent`: the caller then kills each run's cgroup.
/// A supervisor's stop sends it once instead of once a run: thousands of writes, each under
/// the kernel's cgroup mutex that the first runs' cgroup removals also take, delayed the
/// last runs' kills by seconds.
pub fn kill_subtree(parent: &str) -> Result<bool, CgroupError> {
    let cgroup = RunCgroup::existing(parent);
    let Some(dir) = cgroup.v2_dir.clone() else {
        return Ok(false);
    };
    if cgroup.kill_method() != KillMethod::CgroupKill || dir.join(SUPERVISOR_LEAF).exists() {
        return Ok(false);
    }
    write_kill(&dir)
}

/// Waits until no process is left anywhere under `parent` (its v2 `cgroup.events` says
/// `populated 0`), up to `deadline`: `false` when some were still there, or where the host has
/// no v2 directory to tell. What a stop waits for after [`kill_subtree`]: a process is out of
/// its cgroup only once its exit has released its namespaces' mounts, so an empty subtree
/// means every sandbox's root and `/proc` are gone.
pub fn wait_subtree_empty(parent: &str, deadline: Duration) -> Result<bool, CgroupError> {
    let Some(dir) = RunCgroup::existing(parent).v2_dir else {
        return Ok(false);
    };
    let file = dir.join("cgroup.events");
    let start = Instant::now();
    loop {
        let events = match fs::read_to_string(&file) {
            Ok(events) => events,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(true),
            Err(e) => return Err(CgroupError::Io { file, source: e }),
        };
        if events.lines().any(|line| line.trim() == "populated 0") {
            return Ok(true);
        }
        if start.elapsed() > deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn read_pids(dir: &Path) -> Result<Vec<u32>, CgroupError> {
    let file = dir.join("cgroup.procs");
    match fs::read_to_string(&file) {
        Ok(text) => Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(CgroupError::Io { file, source: e }),
    }
}

fn wait_empty(dir: &Path, start: Instant, deadline: Duration) -> Result<(), CgroupError> {
    loop {
        let pids = read_pids(dir)?;
        if pids.is_empty() {
            return Ok(());
        }
        if start.elapsed() > deadline {
            return Err(CgroupError::KillTimeout {
                path: dir.to_owned(),
                count: pids.len(),
                waited: deadline,
            });
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Writes `1` to `dir`'s `cgroup.kill`; `false` when the cgroup is already gone.
fn write_kill(dir: &Path) -> Result<bool, CgroupError> {
    let kill_file = dir.join("cgroup.kill");
    match fs::write(&kill_file, "1") {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(CgroupError::Io {
            file: kill_file,
            source: e,
        }),
    }
}

/// One pass of the kill without `cgroup.kill` on a cgroup its caller found not empty:
/// freeze so nothing forks between reading the list and the kills, SIGKILL every member,
/// thaw so the kills are delivered.
fn kill_frozen(freezer: &Path) -> Result<(), CgroupError> {
    freeze(freezer, true)?;
    for pid in read_pids(freezer)? {
        // ESRCH: already gone, which is what we want.
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
    }
    freeze(freezer, false)
}

fn freeze(freezer: &Path, frozen: bool) -> Result<(), CgroupError> {
    let state = freezer.join("freezer.state");
    let wanted = if frozen { "FROZEN" } else { "THAWED" };
    write_file(&state, wanted)?;
    if frozen {
        // FREEZING means some task has not stopped yet; wait briefly for FROZEN.
        let start = Instant::now();
        while read_trimmed(&state)? != "FROZEN" && start.elapsed() < Duration::from_millis(200) {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    Ok(())
}

/// `rmdir` with exponential backoff on `EBUSY` (dying tasks are still being released).
fn remove_with_retries(dir: &Path, deadline: Duration) -> Result<(), CgroupError> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(100);
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) if start.elapsed() < deadline => {
                tracing::debug!(dir = %dir.display(), error = %e, "cgroup busy; retrying removal");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(source) => {
                return Err(CgroupError::Remove {
                    path: dir.to_owned(),
                    source,
                })
            }
        }
    }
}

/// Makes `memory`, `pids` and `cpu` available to the children of `parent` (relative to the
/// v2 root, e.g. `tollgate`), creating it and every cgroup on the way: each level, the root
/// included, lists them in its `cgroup.subtree_control`. Where a level holds processes (the
/// kernel then answers `EBUSY`), they are moved into [`SUPERVISOR_LEAF`] if that level is this
/// process's own cgroup, and refused otherwise. A no-op on v1 and hybrid hosts, whose
/// controllers need no delegation. Idempotent and cheap when everything is in place (two
/// small reads per level), so it runs at start-up and before each run's cgroup.
pub fn delegate_to(parent: &str) -> Result<(), CgroupError> {
    if CgroupMode::detect() != CgroupMode::Unified {
        return Ok(());
    }
    let own = own_cgroup();
    let mut level = PathBuf::from(UNIFIED_ROOT);
    enable_controllers(&level, own.as_deref())?;
    for part in Path::new(parent).components() {
        level.push(part);
        match fs::create_dir(&level) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(CgroupError::Create {
                    path: parent.to_owned(),
                    detail: format!("{}: {e}", level.display()),
                })
            }
        }
        enable_controllers(&level, own.as_deref())?;
    }
    Ok(())
}

/// This process's cgroup on the v2 hierarchy, as a directory under [`UNIFIED_ROOT`] (in a
/// cgroup namespace, `0::/` is the namespace's root, which is what is mounted there).
fn own_cgroup() -> Option<PathBuf> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = text.lines().find_map(|line| line.strip_prefix("0::"))?;
    Some(Path::new(UNIFIED_ROOT).join(path.trim().trim_start_matches('/')))
}

/// Enables the run controllers in `dir`'s `cgroup.subtree_control` where they are not yet.
fn enable_controllers(dir: &Path, own: Option<&Path>) -> Result<(), CgroupError> {
    let control = dir.join("cgroup.subtree_control");
    let enabled = read_trimmed(&control)?;
    let missing: Vec<&str> = V2_CONTROLLERS
        .into_iter()
        .filter(|c| !enabled.split_whitespace().any(|e| e == *c))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let available = read_trimmed(&dir.join("cgroup.controllers"))?;
    let unavailable: Vec<&str> = missing
        .iter()
        .copied()
        .filter(|c| !available.split_whitespace().any(|a| a == *c))
        .collect();
    if !unavailable.is_empty() {
        return Err(CgroupError::ControllersUnavailable {
            cgroup: dir.to_owned(),
            missing: unavailable.join(", "),
        });
    }
    let request = missing
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ");
    match fs::write(&control, &request) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            if own != Some(dir) {
                let pids = read_pids(dir)?;
                return Err(CgroupError::ProcessesInTheWay {
                    cgroup: dir.to_owned(),
                    pids: describe_pids(&pids),
                });
            }
            move_into_leaf(dir)?;
            write_file(&control, &request)
        }
        Err(source) => Err(CgroupError::Io {
            file: control,
            source,
        }),
    }
}

fn describe_pids(pids: &[u32]) -> String {
    let shown: Vec<String> = pids.iter().take(5).map(u32::to_string).collect();
    match pids.len() {
        0 => "threads of a threaded cgroup".into(),
        n if n > shown.len() => format!("pids {} and {} more", shown.join(", "), n - shown.len()),
        _ => format!("pids {}", shown.join(", ")),
    }
}

/// Moves every process of `dir` (this supervisor's own cgroup, delegated to it by systemd or
/// a container runtime) into `dir/`[`SUPERVISOR_LEAF`], so that `dir` may delegate
/// controllers. Repeated while processes appear (one may fork mid-move), within a bound.
fn move_into_leaf(dir: &Path) -> Result<(), CgroupError> {
    let leaf = dir.join(SUPERVISOR_LEAF);
    match fs::create_dir(&leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(source) => return Err(CgroupError::Io { file: leaf, source }),
    }
    let procs = leaf.join("cgroup.procs");
    for _ in 0..100 {
        let pids = read_pids(dir)?;
        if pids.is_empty() {
            tracing::info!(
                cgroup = %dir.display(),
                leaf = %leaf.display(),
                "moved this supervisor's cgroup's processes into a leaf so that it can delegate controllers to runs"
            );
            return Ok(());
        }
        for pid in pids {
            match fs::write(&procs, pid.to_string()) {
                Ok(()) => {}
                // Gone meanwhile: nothing to move.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(source) => {
                    return Err(CgroupError::Io {
                        file: procs,
                        source,
                    })
                }
            }
        }
    }
    Err(CgroupError::ProcessesInTheWay {
        cgroup: dir.to_owned(),
        pids: describe_pids(&read_pids(dir)?),
    })
}
