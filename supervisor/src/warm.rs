//! Sandboxes prepared ahead of need, so a run's start pays only for what depends on its
//! receipt.
//!
//! A warm sandbox is a fresh cgroup (`<parent>/shard-NN/<sandbox-id>`) holding an
//! [`IdleShim`]. Its cgroup holds the limits of the run that took the sandbox before it (none before the
//! first): most runs started together share their limits, and a start then writes none of
//! them again (a write of the CPU quota walks every CPU cgroup on the host, so its cost grows
//! with every live run; see `RunCgroup::apply_limits`). The shim has been started, has
//! compiled the seccomp programs, unshared the six namespaces, forked pid 1 (the
//! supervisor's child) and exited, reaped; pid 1 has built the part of the root no receipt
//! decides (system directories, `/proc`, `/dev`) and waits for its plan, alone in the
//! cgroup. Only the shim's own code runs there, and it does nothing until a run takes the
//! sandbox. A start then applies the
//! receipt's limits to that cgroup (read back, failing closed) **before** it sends the plan,
//! so the agent never exists outside its limits. Each warm sandbox serves exactly one run and
//! is never reused. When the pool is empty a start prepares its own sandbox the same way,
//! with the limits applied before the shim is even spawned; on a hybrid host the run's v1
//! cgroups and limits are made instead while the shim builds the namespaces, and pid 1
//! joins them before the agent exists (see [`PreparedSandbox::prepare_for_start`]).
//!
//! If the supervisor dies, idle shims see their socket close and exit; the next start's
//! sweep removes every cgroup under the parent, warm ones included.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cgroup::{CgroupLimits, RunCgroup};
use crate::error::StartError;
use crate::sandbox::{IdleShim, Spawner};
use tollgate_shim_protocol::plan::SandboxBase;

/// How long discarding a sandbox waits for its cgroup to empty.
const DISCARD_DEADLINE: Duration = Duration::from_secs(5);

/// A sandbox's cgroup and the shim waiting in it for a plan.
#[derive(Debug)]
pub struct PreparedSandbox {
    /// The sandbox's cgroup (limits applied once taken for a run).
    pub cgroup: RunCgroup,
    /// The shim, not yet given its plan.
    pub shim: IdleShim,
    /// Whether pid 1 is still to join the run's cgroup in the v1 hierarchies (its `tasks`
    /// files go with the plan): a start's own sandbox on a hybrid host, whose shim started
    /// before they were made (see [`PreparedSandbox::prepare_for_start`]).
    pub pid_one_joins: bool,
}

impl PreparedSandbox {
    /// Prepares a sandbox in a new cgroup under `parent`, with `limits` applied before the
    /// shim starts when given (a warm sandbox's guess: the last run's).
    fn prepare(
        spawner: &Spawner,
        parent: &str,
        base: &SandboxBase,
        limits: Option<CgroupLimits>,
    ) -> Result<Self, StartError> {
        let relative = crate::cgroup::sandbox_path(parent, &new_sandbox_id());
        Self::prepare_at(spawner, &relative, base, limits)
    }

    /// A start's own sandbox, none being ready, its cgroup holding `limits` before the plan
    /// is sent. On a hybrid host whose v2 directory kills, its shim starts first, in the
    /// run's v2 directory and its shard's v1 cgroups, and the run's v1 cgroups and limits
    /// are made while the shim builds the sandbox's namespaces on the other core (see
    /// `RunCgroup::create_membership_first`); pid 1 joins them before anything of the run,
    /// the agent included, exists. Elsewhere the limits come first, as for a warm one.
    fn prepare_for_start(
        spawner: &Spawner,
        parent: &str,
        base: &SandboxBase,
        limits: CgroupLimits,
    ) -> Result<Self, StartError> {
        let relative = crate::cgroup::sandbox_path(parent, &new_sandbox_id());
        let Some(mut cgroup) = RunCgroup::create_membership_first(&relative)? else {
            return Self::prepare_at(spawner, &relative, base, Some(limits));
        };
        let shim = match IdleShim::spawn_joining(spawner, &cgroup.first_join(), base) {
            Ok(shim) => shim,
            Err(e) => {
                empty_and_remove(&cgroup);
                return Err(e.into());
            }
        };
        match cgroup.complete(limits) {
            Ok(()) => Ok(Self {
                cgroup,
                shim,
                pid_one_joins: true,
            }),
            Err(e) => {
                Self {
                    cgroup,
                    shim,
                    pid_one_joins: true,
                }
                .discard();
                Err(e.into())
            }
        }
    }

    fn prepare_at(
        spawner: &Spawner,
        relative: &str,
        base: &SandboxBase,
        limits: Option<CgroupLimits>,
    ) -> Result<Self, StartError> {
        let cgroup = match limits {
            Some(limits) => RunCgroup::create(relative, limits)?,
            None => RunCgroup::create_unlimited(relative)?,
        };
        match IdleShim::spawn(spawner, &cgroup, base) {
            Ok(shim) => Ok(Self {
                cgroup,
                shim,
                pid_one_joins: false,
            }),
            Err(e) => {
                // A shim that started has been killed and reaped before the error came back
                // (it builds nothing before its go-ahead); the cgroup is emptied and removed
                // all the same, so no failure path relies on that.
                empty_and_remove(&cgroup);
                Err(e.into())
            }
        }
    }

    /// Waits until its pid 1 is forked and its shim reaped (see [`IdleShim::settle`]), so it
    /// waits in the pool as one process: off a start's path, where that wait would add to
    /// it. A failure has removed the cgroup.
    fn settle(self) -> Result<Self, StartError> {
        let Self {
            cgroup,
            shim,
            pid_one_joins,
        } = self;
        match shim.settle() {
            Ok(shim) => Ok(Self {
                cgroup,
                shim,
                pid_one_joins,
            }),
            Err(e) => {
                empty_and_remove(&cgroup);
                Err(e.into())
            }
        }
    }

    /// Kills the shim and everything in the cgroup, and removes the cgroup.
    pub fn discard(self) {
        self.shim.discard();
        if let Err(e) = self.cgroup.kill_all(DISCARD_DEADLINE) {
            tracing::warn!(cgroup = self.cgroup.relative(), error = %e, "killing an unused sandbox failed");
        }
        if let Err(e) = self.cgroup.remove() {
            tracing::warn!(cgroup = self.cgroup.relative(), error = %e, "removing an unused sandbox's cgroup failed");
        }
    }
}

/// Kills whatever is in `cgroup` and removes it, after a failed preparation: best effort,
/// the preparation's own error is what the caller reports.
fn empty_and_remove(cgroup: &RunCgroup) {
    let _ = cgroup.kill_all(DISCARD_DEADLINE);
    let _ = cgroup.remove();
}

/// A new sandbox id: unique across restarts (time-ordered UUID).
fn new_sandbox_id() -> String {
    format!("sandbox-{}", uuid::Uuid::now_v7().simple())
}

/// Keeps up to `size` warm sandboxes ready, refilled in the background after each is taken.
#[derive(Debug)]
pub struct SandboxPool {
    spawner: Arc<Spawner>,
    cgroup_parent: String,
    base: SandboxBase,
    size: usize,
    warm: Mutex<Vec<PreparedSandbox>>,
    refilling: AtomicBool,
    closed: AtomicBool,
    /// The limits of the last sandbox taken: the next ones are prepared with them.
    last_limits: Mutex<Option<CgroupLimits>>,
}

impl SandboxPool {
    /// A pool of up to `size` warm sandboxes (0 disables it: each start prepares its own).
    /// Call [`SandboxPool::refill`] to fill it.
    /// Its shims are started through `spawner`.
    pub fn new(
        spawner: Arc<Spawner>,
        cgroup_parent: String,
        base: SandboxBase,
        size: usize,
    ) -> Arc<Self> {
        Arc::new(Self {
            spawner,
            cgroup_parent,
            base,
            size,
            warm: Mutex::new(Vec::new()),
            refilling: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            last_limits: Mutex::new(None),
        })
    }

    /// What starts its shims, and the run manager's `exec` helpers.
    pub fn spawner(&self) -> &Arc<Spawner> {
        &self.spawner
    }

    /// A sandbox for one run, its cgroup holding `limits` (applied and read back): a warm
    /// one when ready, else a fresh one. The caller calls [`SandboxPool::refill`] once its
    /// start is done, so preparing the next one does not compete with it.
    pub fn take(self: &Arc<Self>, limits: CgroupLimits) -> Result<PreparedSandbox, StartError> {
        *self.last_limits.lock().unwrap_or_else(|p| p.into_inner()) = Some(limits);
        let warm = {
            let mut warm = self.warm.lock().unwrap_or_else(|p| p.into_inner());
            let taken = warm.pop();
            crate::metrics::get().warm_sandboxes.set(warm.len() as i64);
            taken
        };
        let source = if warm.is_some() {
            crate::metrics::SandboxSource::PreparedAhead
        } else {
            crate::metrics::SandboxSource::PreparedAtStart
        };
        crate::metrics::get().sandbox_taken(source);
        match warm {
            Some(sandbox) => match sandbox.cgroup.apply_limits(limits) {
                Ok(()) => Ok(sandbox),
                Err(e) => {
                    sandbox.discard();
                    Err(e.into())
                }
            },
            None => PreparedSandbox::prepare_for_start(
                &self.spawner,
                &self.cgroup_parent,
                &self.base,
                limits,
            ),
        }
    }

    /// Tops the pool up to its size on a background thread (one refill at a time).
    pub fn refill(self: &Arc<Self>) {
        if self.size == 0
            || self.closed.load(Ordering::SeqCst)
            || self.refilling.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let pool = self.clone();
        std::thread::spawn(move || {
            loop {
                let short = pool.warm.lock().unwrap_or_else(|p| p.into_inner()).len() < pool.size;
                if !short || pool.closed.load(Ordering::SeqCst) {
                    break;
                }
                let limits = *pool.last_limits.lock().unwrap_or_else(|p| p.into_inner());
                match PreparedSandbox::prepare(
                    &pool.spawner,
                    &pool.cgroup_parent,
                    &pool.base,
                    limits,
                )
                .and_then(PreparedSandbox::settle)
                {
                    Ok(sandbox) => {
                        let mut warm = pool.warm.lock().unwrap_or_else(|p| p.into_inner());
                        warm.push(sandbox);
                        crate::metrics::get().warm_sandboxes.set(warm.len() as i64);
                    }
                    Err(e) => {
                        // Starts still work (they prepare their own); say why none is warm.
                        tracing::warn!(error = %e, "preparing a warm sandbox failed");
                        break;
                    }
                }
            }
            pool.refilling.store(false, Ordering::SeqCst);
            if pool.closed.load(Ordering::SeqCst) {
                pool.drain();
            } else if pool.warm.lock().unwrap_or_else(|p| p.into_inner()).len() < pool.size {
                // A take between the last check and the flag's reset found the refill still
                // running and left it to us: start another round.
                pool.refill();
            }
        });
    }

    /// Stops refilling and discards every warm sandbox (supervisor shutdown). A refill in
    /// progress discards what it prepares once it sees the pool closed.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.drain();
        // Wait for a refill in progress, so no cgroup outlives the pool.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while self.refilling.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.drain();
    }

    fn drain(&self) {
        let warm = std::mem::take(&mut *self.warm.lock().unwrap_or_else(|p| p.into_inner()));
        for sandbox in warm {
            sandbox.discard();
        }
    }
}

impl Drop for SandboxPool {
    fn drop(&mut self) {
        self.drain();
    }
}
