//! The teardown workers: a small fixed number of threads, fed by one queue, that do every
//! run's blocking end work — its teardown, the kill of an expired run, the read that
//! publishes its end — whatever the number of runs ending at once.
//!
//! Why not tokio's blocking pool: it grows to a thread per queued task (up to 512). A stop
//! of thousands of live runs, or thousands expiring together, then ran hundreds of
//! teardowns at once; they gained nothing from it (each removes its cgroup from four
//! hierarchies under the kernel's one cgroup mutex, and its run directory under the
//! parent's inode lock) and cost hundreds of threads, each fighting the others for those
//! locks and for the CPU. A few workers keep the kernel's locks busy with less contention;
//! the queue keeps the order in which the runs ended.
//!
//! Workers are started as work arrives, up to the bound, and end after [`IDLE`] without
//! work, so an idle supervisor holds none.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tollgate_audit::{AuditError, PendingEntry};
use tollgate_receipt::unix_now;

use crate::records::{RecordsError, RunRecords, RunState, TeardownReport};

/// How many teardowns run at once. The kernel serialises the costly part of each (cgroup
/// removal under its cgroup mutex, the run directory's removal under its parent's lock);
/// a few at once overlap one run's waits (a cgroup still emptying, an unmount) with
/// another's work, more only contend.
pub(super) const TEARDOWN_WORKERS: usize = 4;

/// How long a worker waits for more work before it ends.
const IDLE: Duration = Duration::from_secs(10);

/// One piece of blocking end work.
type Job = Box<dyn FnOnce() + Send + 'static>;

/// The queue and who serves it.
#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    /// Workers started and not yet ended.
    workers: usize,
    /// Workers waiting for work.
    idle: usize,
}

/// The teardown workers (see the module doc); cloning shares them.
#[derive(Clone)]
pub(super) struct Teardowns {
    shared: Arc<(Mutex<State>, Condvar)>,
    max_workers: usize,
}

impl std::fmt::Debug for Teardowns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Teardowns")
            .field("max_workers", &self.max_workers)
            .finish_non_exhaustive()
    }
}

impl Teardowns {
    /// Workers for up to `max_workers` jobs at once (at least one).
    pub(super) fn new(max_workers: usize) -> Self {
        Self {
            shared: Arc::default(),
            max_workers: max_workers.max(1),
        }
    }

    /// Queues `job`: it runs on a worker after every job queued before it has started.
    /// Never blocks on the job; callers that need its end wait on what the job sets.
    pub(super) fn submit(&self, job: impl FnOnce() + Send + 'static) {
        let (lock, wake) = &*self.shared;
        let mut state = lock.lock().unwrap_or_else(|p| p.into_inner());
        state.queue.push_back(Box::new(job));
        if state.idle > 0 {
            wake.notify_one();
        }
        // More jobs waiting than idle workers to take them: one more worker, up to the bound
        // (past it, the first worker to finish takes the job).
        if state.queue.len() <= state.idle || state.workers >= self.max_workers {
            return;
        }
        state.workers += 1;
        drop(state);
        let shared = self.shared.clone();
        let started = std::thread::Builder::new()
            .name("teardown".into())
            .spawn(move || work(&shared));
        if let Err(e) = started {
            let mut state = lock.lock().unwrap_or_else(|p| p.into_inner());
            state.workers -= 1;
            if state.workers > 0 {
                // The workers there are will take it.
                tracing::warn!(error = %e, "could not start another teardown worker");
                return;
            }
            // No worker at all (the host is out of threads): the caller does the work, late
            // rather than never, so no run is left without its end.
            tracing::error!(error = %e, "could not start a teardown worker; tearing down on the caller's thread");
            let jobs: Vec<Job> = state.queue.drain(..).collect();
            drop(state);
            for job in jobs {
                run(job);
            }
        }
    }
}

/// Held by a supervisor's stop from its kill of every run until all their processes have
/// exited: each teardown waits here before it removes its run's cgroup.
///
/// Why: removing a memory cgroup makes the kernel walk every memory-cgroup-aware list of
/// every superblock on the host (`memcg_reparent_list_lrus`), under the one mutex that each
/// superblock's destruction also takes, and every sandbox has its own root and `/proc`.
/// Removed while the other sandboxes were still exiting, each of thousands of cgroups walked
/// thousands of superblocks about to go, and the exits spun on that mutex. Once every
/// sandbox has exited, their superblocks are gone and each walk is short.
#[derive(Debug, Default)]
pub(super) struct RemovalGate {
    held: Mutex<bool>,
    opened: Condvar,
}

/// The longest a teardown waits at a held [`RemovalGate`]: a stop opens it within its own
/// wait for the exits; this only bounds a stop that never returned to open it.
const MOST_HELD: Duration = Duration::from_secs(60);

impl RemovalGate {
    /// Teardowns wait from now until [`Self::open`].
    pub(super) fn hold(&self) {
        *self.held.lock().unwrap_or_else(|p| p.into_inner()) = true;
    }

    /// Lets every waiting teardown (and later ones) go on.
    pub(super) fn open(&self) {
        *self.held.lock().unwrap_or_else(|p| p.into_inner()) = false;
        self.opened.notify_all();
    }

    /// Returns once the gate is open (at once unless a stop holds it).
    pub(super) fn pass(&self) {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self
            .opened
            .wait_timeout_while(held, MOST_HELD, |held| *held)
            .unwrap_or_else(|p| p.into_inner());
    }
}

/// A run whose clean-up is done (sandbox killed, cgroup and run directory removed) and whose
/// end is not durable yet: its audit entries are submitted, its final record not written.
pub(super) struct Ending<R> {
    pub(super) run_id: String,
    pub(super) state: RunState,
    pub(super) report: TeardownReport,
    /// Its teardown entries, handed to the audit writer; the record follows their fsync.
    pub(super) entries: Vec<Result<PendingEntry, AuditError>>,
    /// What the caller needs to finish the run once its record is written.
    pub(super) run: R,
}

/// The ends of runs that the workers have cleaned up, made durable together: one audit fsync
/// and one records transaction for every run that ended while the previous group was being
/// written. With a few workers, each waiting on its own run's fsyncs would have made the
/// disk's latency the stop's pace (a group of at most four per fsync); the clean-ups go on
/// while one worker writes.
pub(super) struct Endings<R> {
    gathered: Mutex<Gathered<R>>,
}

/// The ends waiting to be written, and whether a worker is writing.
struct Gathered<R> {
    waiting: Vec<Ending<R>>,
    writing: bool,
}

impl<R> Default for Endings<R> {
    fn default() -> Self {
        Self {
            gathered: Mutex::new(Gathered {
                waiting: Vec::new(),
                writing: false,
            }),
        }
    }
}

impl<R> std::fmt::Debug for Endings<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endings").finish_non_exhaustive()
    }
}

impl<R> Endings<R> {
    /// Adds `ending`. Unless another worker is writing (it then writes this one too), writes
    /// every end gathered, group after group until none is left: waits for their audit
    /// entries to be on disk (the entry before the record: a crash in between repeats it at
    /// the next start, never loses it), writes their final records in one transaction, and
    /// hands each to `finished` with its record's outcome.
    pub(super) fn add(
        &self,
        records: &RunRecords,
        ending: Ending<R>,
        finished: impl Fn(Ending<R>, Result<(), RecordsError>),
    ) {
        let mut gathered = self.gathered.lock().unwrap_or_else(|p| p.into_inner());
        gathered.waiting.push(ending);
        if gathered.writing {
            return;
        }
        gathered.writing = true;
        loop {
            let group = std::mem::take(&mut gathered.waiting);
            if group.is_empty() {
                gathered.writing = false;
                return;
            }
            drop(gathered);
            // A panic here must not leave `writing` set: no end would be written again.
            let written = std::panic::catch_unwind(AssertUnwindSafe(|| {
                write_group(records, group, &finished)
            }));
            if written.is_err() {
                tracing::error!(
                    "writing a group of runs' ends panicked; later ends are still written"
                );
            }
            gathered = self.gathered.lock().unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Writes one group of ends (see [`Endings::add`]).
fn write_group<R>(
    records: &RunRecords,
    mut group: Vec<Ending<R>>,
    finished: &impl Fn(Ending<R>, Result<(), RecordsError>),
) {
    for ending in &mut group {
        for entry in ending.entries.drain(..) {
            if let Err(e) = entry.and_then(PendingEntry::wait) {
                tracing::error!(run_id = %ending.run_id, error = %e, "could not audit a teardown");
            }
        }
    }
    let ends: Vec<(&str, RunState, &TeardownReport)> = group
        .iter()
        .map(|ending| (ending.run_id.as_str(), ending.state, &ending.report))
        .collect();
    let outcomes = records.finish_all(&ends, unix_now());
    for (ending, outcome) in group.into_iter().zip(outcomes) {
        finished(ending, outcome);
    }
}

/// A worker: takes jobs in order until none has come for [`IDLE`].
fn work(shared: &(Mutex<State>, Condvar)) {
    let (lock, wake) = shared;
    let mut state = lock.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if let Some(job) = state.queue.pop_front() {
            drop(state);
            run(job);
            state = lock.lock().unwrap_or_else(|p| p.into_inner());
            continue;
        }
        state.idle += 1;
        let (next, waited) = wake
            .wait_timeout_while(state, IDLE, |state| state.queue.is_empty())
            .unwrap_or_else(|p| p.into_inner());
        state = next;
        state.idle -= 1;
        if waited.timed_out() && state.queue.is_empty() {
            state.workers -= 1;
            return;
        }
    }
}

/// Runs one job; a panic in it is logged and ends only that job, not the worker.
fn run(job: Job) {
    if std::panic::catch_unwind(AssertUnwindSafe(job)).is_err() {
        tracing::error!("a run's end work panicked; the runs queued after it still end");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// However many jobs are queued at once, no more than the bound run at once, every one
    /// runs, and a panicking job ends only itself.
    #[test]
    fn jobs_run_all_and_never_more_than_the_bound_at_once() {
        let teardowns = Teardowns::new(3);
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let done = Arc::new((Mutex::new(0usize), Condvar::new()));
        const JOBS: usize = 200;
        for i in 0..JOBS {
            let (running, most, done) = (running.clone(), most.clone(), done.clone());
            teardowns.submit(move || {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::yield_now();
                running.fetch_sub(1, Ordering::SeqCst);
                let (count, finished) = &*done;
                *count.lock().unwrap() += 1;
                finished.notify_all();
                if i == 7 {
                    panic!("a job that fails");
                }
            });
        }
        let (count, finished) = &*done;
        let count = finished
            .wait_timeout_while(count.lock().unwrap(), Duration::from_secs(60), |count| {
                *count < JOBS
            })
            .unwrap()
            .0;
        assert_eq!(*count, JOBS, "every job ran");
        assert!(most.load(Ordering::SeqCst) <= 3, "at most three at once");
        assert!(teardowns.shared.0.lock().unwrap().workers <= 3);
    }

    /// An open gate lets a teardown through at once; a held one keeps every teardown that
    /// reaches it until it is opened, and then lets them all go.
    #[test]
    fn a_held_removal_gate_keeps_teardowns_until_it_opens() {
        let gate = Arc::new(RemovalGate::default());
        gate.pass();
        gate.hold();
        let passed = Arc::new(AtomicUsize::new(0));
        let waiting: Vec<_> = (0..3)
            .map(|_| {
                let (gate, passed) = (gate.clone(), passed.clone());
                std::thread::spawn(move || {
                    gate.pass();
                    passed.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            passed.load(Ordering::SeqCst),
            0,
            "a teardown passed a held gate"
        );
        gate.open();
        for waiter in waiting {
            waiter.join().unwrap();
        }
        assert_eq!(passed.load(Ordering::SeqCst), 3);
        gate.pass();
    }
}
