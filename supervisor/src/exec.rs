//! The gateway's `exec` tool: one command run inside a live sandbox.
//!
//! The supervisor starts `tollgate-shim enter` as it starts the sandbox's own shim (without
//! copying itself, then moving it into the run's cgroup in every hierarchy: see
//! `sandbox::spawn`), hands it the request on fd 3 (the helper reads nothing before it),
//! feeds the command's stdin and collects its stdout and stderr up to the output cap.
//! The helper joins the sandbox's namespaces and starts the command exactly as the agent was
//! started (see `tollgate_agent_shim`'s `enter`); it enforces the time limit and reports how
//! the command ended. A helper that does not report within the limit plus a grace period is
//! killed here.

use std::os::fd::{AsFd as _, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::unix::pipe;
use tollgate_shim_protocol::plan::{AgentCommand, SandboxPlan};
use tollgate_shim_protocol::protocol::{AgentExit, EnterOutcome, EnterRequest};

use crate::cgroup::CgroupJoin;
use crate::sandbox::{spawn_in_cgroup, ChildFds, ShimChild, SpawnError, Spawner};

/// The default (and largest) time a command may run, wall clock and CPU.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// The default cap on a command's stdout and stderr together.
pub const DEFAULT_OUTPUT_CAP: usize = 5 << 20;
/// The default number of commands one run may have running at once.
pub const DEFAULT_CONCURRENT: usize = 4;
/// How long past its time limit a helper may take to report before it is killed here.
const GRACE: Duration = Duration::from_secs(5);

/// Limits on a run's `exec` calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecLimits {
    /// The longest (and default) wall-clock and CPU time of one command.
    pub max_timeout: Duration,
    /// Most bytes of stdout and stderr together returned; the rest is dropped and reported.
    pub output_cap: usize,
    /// Most commands running at once.
    pub concurrent: usize,
}

impl Default for ExecLimits {
    fn default() -> Self {
        Self {
            max_timeout: DEFAULT_TIMEOUT,
            output_cap: DEFAULT_OUTPUT_CAP,
            concurrent: DEFAULT_CONCURRENT,
        }
    }
}

/// What the gateway needs to run commands in one run's sandbox.
#[derive(Debug)]
pub struct ExecSandbox {
    /// Starts the helper (`tollgate-shim enter`).
    pub spawner: Arc<Spawner>,
    /// The sandbox's plan (its Landlock rules, ids and the agent's environment and cwd).
    pub plan: SandboxPlan,
    /// What the started sandbox pinned; set once its agent runs.
    pub started: StartedPin,
    /// How a helper joins the run's cgroup.
    pub cgroup: CgroupJoin,
    /// The limits.
    pub limits: ExecLimits,
    /// Commands running now.
    pub running: AtomicUsize,
}

/// How long a command waits for its sandbox's pin. The agent runs a moment before the
/// supervisor reads the shim's `Started` and pins pid 1, so an agent's first call can arrive
/// first; the pin follows within milliseconds unless the run is failing.
const PIN_WAIT: Duration = Duration::from_secs(5);

/// The pin of a started sandbox, set once (by the start or by live restore) and waited for
/// by `exec`: an agent that calls `exec` at once must not be refused for having been quick.
#[derive(Debug, Default)]
pub struct StartedPin {
    /// The pin, or why the sandbox could not be pinned (then `exec` is refused with it).
    pinned: OnceLock<Result<PinnedSandbox, String>>,
    /// Wakes the commands waiting for the pin.
    set: tokio::sync::Notify,
}

impl StartedPin {
    /// Records the pin (or why there is none) and wakes every waiting command; only the
    /// first call counts.
    pub fn set(&self, pinned: Result<PinnedSandbox, String>) {
        let _ = self.pinned.set(pinned);
        self.set.notify_waiters();
    }

    /// The pin, waiting at most `bound` for it to be set.
    async fn wait(&self, bound: Duration) -> Result<&PinnedSandbox, String> {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            // Registered before the check, so a `set` between the check and the wait
            // still wakes this one.
            let woken = self.set.notified();
            if let Some(pinned) = self.pinned.get() {
                return pinned.as_ref().map_err(Clone::clone);
            }
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                return Err("the sandbox has not started".into());
            }
        }
    }
}

/// What `exec` holds of a started sandbox, taken when it started.
#[derive(Debug)]
pub struct PinnedSandbox {
    /// The sandbox's pid 1: the helper joins its namespaces through a pidfd of it, taken for
    /// each command (no descriptor held per run between commands).
    pub pid_one: crate::sandbox::PidOne,
    /// The executables Landlock allows, interpreters included, as resolved when the sandbox
    /// started (what the agent changed since must not add to them).
    pub execute: Vec<PathBuf>,
}

/// How one command went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecResult {
    /// How it ended.
    pub exit: AgentExit,
    /// Whether it was killed at the time limit.
    pub timed_out: bool,
    /// Its stdout, up to the cap.
    pub stdout: Vec<u8>,
    /// Its stderr, up to what the cap left.
    pub stderr: Vec<u8>,
    /// Whether output was dropped at the cap.
    pub truncated: bool,
    /// How long it ran.
    pub duration: Duration,
}

/// Why a command could not be run.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The helper could not be started.
    #[error("starting tollgate-shim enter: {0}")]
    Spawn(std::io::Error),
    /// The helper could not be started in the run's cgroup (which step is in the error).
    #[error(transparent)]
    Start(#[from] SpawnError),
    /// The helper could not join the sandbox or start the command.
    #[error("the command could not start in the sandbox: {0}")]
    NotStarted(String),
    /// The helper neither reported nor ended in time (killed).
    #[error("the command's helper did not report within its time limit and was killed")]
    Unresponsive,
    /// Talking to the helper failed.
    #[error("talking to tollgate-shim enter: {0}")]
    Helper(std::io::Error),
}

/// A slot among a run's concurrent commands, given back when dropped.
#[derive(Debug)]
pub struct ExecSlot(Arc<ExecSandbox>);

impl ExecSandbox {
    /// Takes a slot, or `None` when `limits.concurrent` commands are already running.
    pub fn slot(self: &Arc<Self>) -> Option<ExecSlot> {
        self.running
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.limits.concurrent).then_some(n + 1)
            })
            .ok()
            .map(|_| ExecSlot(self.clone()))
    }

    /// The time limit for a request asking for `timeout_ms` (0: the maximum).
    pub fn timeout_for(&self, timeout_ms: u64) -> Duration {
        let asked = Duration::from_millis(timeout_ms);
        if timeout_ms == 0 || asked > self.limits.max_timeout {
            self.limits.max_timeout
        } else {
            asked
        }
    }
}

impl Drop for ExecSlot {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What has been read from one of a command's pipes.
#[derive(Debug, Default)]
struct Captured {
    kept: Vec<u8>,
    dropped: bool,
}

/// Reads `pipe` to its end into `sink`, keeping what the shared `room` allows.
async fn capture(
    mut pipe: impl AsyncRead + Unpin,
    room: Arc<AtomicUsize>,
    sink: Arc<Mutex<Captured>>,
) {
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        let read = match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let take = room
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                Some(left - left.min(read))
            })
            .map_or(0, |left| left.min(read));
        let mut sink = sink.lock().unwrap_or_else(|p| p.into_inner());
        sink.kept.extend_from_slice(&buffer[..take]);
        // Drained past the cap so the command never blocks on a full pipe.
        sink.dropped |= take < read;
    }
}

/// How long, once the command has ended, its pipes may stay open before what was read is
/// returned (a process it left in a session of its own may hold them open).
const DRAIN: Duration = Duration::from_millis(200);

/// Reads a command's stdout and stderr while it runs.
struct Output {
    sinks: [Arc<Mutex<Captured>>; 2],
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Output {
    fn start(child: &mut Helper, cap: usize) -> Self {
        let room = Arc::new(AtomicUsize::new(cap));
        let sinks: [Arc<Mutex<Captured>>; 2] = [Arc::default(), Arc::default()];
        let mut tasks = Vec::new();
        if let Some(pipe) = child.stdout.take() {
            tasks.push(tokio::spawn(capture(pipe, room.clone(), sinks[0].clone())));
        }
        if let Some(pipe) = child.stderr.take() {
            tasks.push(tokio::spawn(capture(pipe, room.clone(), sinks[1].clone())));
        }
        Self { sinks, tasks }
    }

    /// What was read, after the pipes closed or `DRAIN` passed (then marked truncated).
    async fn finish(self) -> (Vec<u8>, Vec<u8>, bool) {
        let mut cut = false;
        for task in self.tasks {
            let abort = task.abort_handle();
            if tokio::time::timeout(DRAIN, task).await.is_err() {
                abort.abort();
                cut = true;
            }
        }
        let [out, err] = self
            .sinks
            .map(|sink| std::mem::take(&mut *sink.lock().unwrap_or_else(|p| p.into_inner())));
        (out.kept, err.kept, cut || out.dropped || err.dropped)
    }
}

/// One command to run in a sandbox.
#[derive(Debug)]
pub struct Command {
    /// The command line, program first.
    pub argv: Vec<String>,
    /// What it reads on stdin.
    pub stdin: Vec<u8>,
    /// Where it runs (a sandbox path).
    pub cwd: PathBuf,
    /// Its wall-clock (and CPU-time) limit.
    pub timeout: Duration,
    /// A gateway-only program this command (and only this command) may execute beside the
    /// sandbox's own executables: its program, when the receipt grants it only through the
    /// gateway.
    pub also_execute: Option<PathBuf>,
}

/// Runs `command` in the sandbox: its argv with its stdin, in its cwd, for at most its
/// timeout.
pub async fn run(sandbox: &ExecSandbox, command: Command) -> Result<ExecResult, ExecError> {
    let Command {
        argv,
        stdin,
        cwd,
        timeout,
        also_execute,
    } = command;
    let started = Instant::now();
    let pinned = sandbox
        .started
        .wait(PIN_WAIT)
        .await
        .map_err(ExecError::NotStarted)?;
    let mut plan = sandbox.plan.clone();
    plan.landlock.execute.clone_from(&pinned.execute);
    plan.landlock.execute_resolved = true;
    plan.agent = AgentCommand {
        argv,
        // The agent's environment, filtered as the agent's was.
        env: plan.agent.env.clone(),
        cwd,
    };
    let request = EnterRequest {
        plan,
        timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        unmount: None,
        also_execute,
        hide: None,
    };
    let (mut child, mut control, line) = spawn_helper(sandbox, pinned, &request)?;
    let output = Output::start(&mut child, sandbox.limits.output_cap);
    if let Some(mut pipe) = child.stdin.take() {
        tokio::spawn(async move {
            // A command that does not read its stdin closes the pipe: not an error.
            let _ = pipe.write_all(&stdin).await;
        });
    }
    let reply = async {
        control.write_all(&line).await?;
        let mut reply = String::new();
        tokio::io::BufReader::new(&mut control)
            .read_line(&mut reply)
            .await?;
        Ok::<_, std::io::Error>(reply)
    };
    let reply = match tokio::time::timeout(timeout + GRACE, reply).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(e)) => {
            // The helper's own status says more than a broken socket.
            let status = bounded_wait(&mut child).await;
            drop(output.finish().await);
            return Err(ExecError::NotStarted(format!("{e} (the helper {status})")));
        }
        Err(_) => {
            let _ = child.start_kill();
            let _ = bounded_wait(&mut child).await;
            drop(output.finish().await);
            return Err(ExecError::Unresponsive);
        }
    };
    let (stdout, stderr, truncated) = output.finish().await;
    let status = bounded_wait(&mut child).await;
    match serde_json::from_str::<EnterOutcome>(&reply) {
        Ok(EnterOutcome::Ended { exit, timed_out }) => Ok(ExecResult {
            exit,
            timed_out,
            stdout,
            stderr,
            truncated,
            duration: started.elapsed(),
        }),
        Ok(EnterOutcome::Failed { reason }) => Err(ExecError::NotStarted(reason)),
        Ok(EnterOutcome::Unmounted | EnterOutcome::Hidden) => Err(ExecError::Helper(
            std::io::Error::other("the helper changed mounts instead of running the command"),
        )),
        Err(_) if reply.is_empty() => Err(ExecError::NotStarted(format!(
            "the helper ended without a report ({status}; the sandbox may be ending)"
        ))),
        Err(e) => Err(ExecError::Helper(std::io::Error::other(e))),
    }
}

/// A running `tollgate-shim enter`, its end of the pipes and a pidfd to wait on: killed (and
/// reaped off the runtime's threads) when dropped before it was reaped, as when the gateway
/// call is cancelled.
struct Helper {
    /// `None` once handed to the reaper in `drop`.
    child: Option<ShimChild>,
    /// Readable once the helper has exited.
    exited: AsyncFd<OwnedFd>,
    stdin: Option<pipe::Sender>,
    stdout: Option<pipe::Receiver>,
    stderr: Option<pipe::Receiver>,
}

impl Helper {
    /// Sends it `SIGKILL` (nothing once reaped).
    fn start_kill(&mut self) -> std::io::Result<()> {
        self.child.as_mut().map_or(Ok(()), ShimChild::kill)
    }

    /// Waits for it to exit, then reaps it (at once: it has exited).
    async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        // An exit is final: the readiness is never cleared.
        drop(self.exited.readable().await?);
        match self.child.as_mut() {
            Some(child) => child.wait(),
            None => Err(std::io::Error::other(
                "the helper was already handed to its reaper",
            )),
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = child.kill();
        // Reaping waits for the exit (at once, unless the helper is in an uninterruptible
        // sleep): not on the runtime's threads.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(move || child.wait())),
            Err(_) => drop(child.wait()),
        }
    }
}

/// Starts `tollgate-shim enter` in the run's cgroup with its control socket and pid 1's pidfd;
/// the helper, our end of the socket and the request line to send on it (the helper's
/// go-ahead: it reads nothing before it).
fn spawn_helper(
    sandbox: &ExecSandbox,
    pinned: &PinnedSandbox,
    request: &EnterRequest,
) -> Result<(Helper, tokio::net::UnixStream, Vec<u8>), ExecError> {
    let pid_one = pinned.pid_one.pidfd().map_err(ExecError::Spawn)?;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(ExecError::Spawn)?;
    let (stdin_read, stdin_write) = std::io::pipe().map_err(ExecError::Spawn)?;
    let (stdout_read, stdout_write) = std::io::pipe().map_err(ExecError::Spawn)?;
    let (stderr_read, stderr_write) = std::io::pipe().map_err(ExecError::Spawn)?;
    let fds = ChildFds {
        control: theirs.as_fd(),
        pid_one: Some(pid_one.as_fd()),
        stdin: Some(stdin_read.as_fd()),
        stdout: stdout_write.as_fd(),
        stderr: stderr_write.as_fd(),
    };
    let mut child = spawn_in_cgroup(
        &sandbox.spawner,
        sandbox.spawner.shim(),
        &["enter"],
        &sandbox.cgroup,
        fds,
    )?;
    // Only the helper holds its ends now: its output pipes end when it (and its command) do.
    drop((theirs, pid_one, stdin_read, stdout_write, stderr_write));
    let parts = (|| {
        let pidfd = child.pidfd()?;
        // SAFETY: the `AsyncFd` owns the pidfd (an `OwnedFd`) and nothing replaces or closes
        // it while registered.
        #[allow(unsafe_code)]
        let exited =
            unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }
                .map_err(std::io::Error::from)?;
        Ok::<_, std::io::Error>((
            exited,
            pipe::Sender::from_owned_fd(stdin_write.into())?,
            pipe::Receiver::from_owned_fd(stdout_read.into())?,
            pipe::Receiver::from_owned_fd(stderr_read.into())?,
        ))
    })();
    let (exited, stdin, stdout, stderr) = match parts {
        Ok(parts) => parts,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(ExecError::Helper(e));
        }
    };
    let helper = Helper {
        child: Some(child),
        exited,
        stdin: Some(stdin),
        stdout: Some(stdout),
        stderr: Some(stderr),
    };
    let mut line = serde_json::to_vec(request).map_err(|e| ExecError::Helper(e.into()))?;
    line.push(b'\n');
    ours.set_nonblocking(true).map_err(ExecError::Helper)?;
    let control = tokio::net::UnixStream::from_std(ours).map_err(ExecError::Helper)?;
    Ok((helper, control, line))
}

/// Detaches the mount at sandbox path `target` inside the live sandbox (a mounted grant
/// narrowed away): `tollgate-shim enter` joins its mount namespace and unmounts it.
pub async fn unmount(sandbox: &ExecSandbox, target: &str) -> Result<(), ExecError> {
    change_mounts(sandbox, MountChange::Unmount(target.to_owned())).await
}

/// Hides gateway-only `program` from the live sandbox's agent (an amendment added it), as the
/// shim hides a receipt's at start: `tollgate-shim enter` joins its mount namespace and covers
/// it.
pub async fn hide(sandbox: &ExecSandbox, program: &str) -> Result<(), ExecError> {
    change_mounts(sandbox, MountChange::Hide(PathBuf::from(program))).await
}

/// A change to a live sandbox's mounts.
enum MountChange {
    /// Detach the mount at this sandbox path.
    Unmount(String),
    /// Cover this program.
    Hide(PathBuf),
}

async fn change_mounts(sandbox: &ExecSandbox, change: MountChange) -> Result<(), ExecError> {
    let pinned = sandbox
        .started
        .wait(PIN_WAIT)
        .await
        .map_err(ExecError::NotStarted)?;
    let mut plan = sandbox.plan.clone();
    // The agent's executables as pid 1 resolved them: what a hidden program must not be.
    plan.landlock.execute.clone_from(&pinned.execute);
    plan.landlock.execute_resolved = true;
    let (unmount, hide) = match change {
        MountChange::Unmount(target) => (Some(target), None),
        MountChange::Hide(program) => (None, Some(program)),
    };
    let request = EnterRequest {
        plan,
        timeout_ms: 0,
        unmount,
        also_execute: None,
        hide,
    };
    let (mut child, mut control, line) = spawn_helper(sandbox, pinned, &request)?;
    let reply = async {
        control.write_all(&line).await?;
        let mut reply = String::new();
        tokio::io::BufReader::new(&mut control)
            .read_line(&mut reply)
            .await?;
        Ok::<_, std::io::Error>(reply)
    };
    let reply = match tokio::time::timeout(GRACE, reply).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(e)) => return Err(ExecError::Helper(e)),
        Err(_) => {
            let _ = child.start_kill();
            let _ = bounded_wait(&mut child).await;
            return Err(ExecError::Unresponsive);
        }
    };
    let status = bounded_wait(&mut child).await;
    match serde_json::from_str::<EnterOutcome>(&reply) {
        Ok(EnterOutcome::Unmounted | EnterOutcome::Hidden) => Ok(()),
        Ok(EnterOutcome::Failed { reason }) => Err(ExecError::NotStarted(reason)),
        Ok(other) => Err(ExecError::Helper(std::io::Error::other(format!(
            "unexpected reply {other:?}"
        )))),
        Err(_) if reply.is_empty() => Err(ExecError::NotStarted(format!(
            "the helper ended without a report ({status}; the sandbox may be ending)"
        ))),
        Err(e) => Err(ExecError::Helper(std::io::Error::other(e))),
    }
}

/// The helper's exit status, waiting at most a second (then it is killed).
async fn bounded_wait(child: &mut Helper) -> String {
    match tokio::time::timeout(Duration::from_secs(1), child.wait()).await {
        Ok(Ok(status)) => status.to_string(),
        Ok(Err(e)) => e.to_string(),
        Err(_) => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            "did not exit and was killed".into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_past_the_cap_is_drained_and_reported() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let room = Arc::new(AtomicUsize::new(10));
        let (out, err) = (
            Arc::<Mutex<Captured>>::default(),
            Arc::<Mutex<Captured>>::default(),
        );
        runtime.block_on(capture(&b"0123456"[..], room.clone(), out.clone()));
        runtime.block_on(capture(&[b'e'; 200_000][..], room.clone(), err.clone()));
        let (out, err) = (out.lock().unwrap(), err.lock().unwrap());
        assert_eq!((out.kept.as_slice(), out.dropped), (&b"0123456"[..], false));
        assert_eq!((err.kept.as_slice(), err.dropped), (&b"eee"[..], true));
        assert_eq!(room.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn timeouts_default_to_and_stop_at_the_maximum() {
        let sandbox = ExecSandbox {
            spawner: Arc::new(Spawner::start(
                PathBuf::new(),
                crate::sandbox::sandbox_base(
                    std::path::Path::new("/nonexistent"),
                    std::path::Path::new(""),
                ),
            )),
            started: StartedPin::default(),
            plan: serde_json::from_value(serde_json::json!({
                "run_id": "r", "workspace": "/w", "tmpfs_bytes": 0, "binds": [],
                "landlock": {"read": [], "write": [], "execute": []},
                "agent": {"argv": ["/bin/true"], "env": [], "cwd": "/work"},
                "inner_id": 1000, "host_id": 1
            }))
            .unwrap(),
            cgroup: CgroupJoin::default(),
            limits: ExecLimits::default(),
            running: AtomicUsize::new(0),
        };
        assert_eq!(sandbox.timeout_for(0), DEFAULT_TIMEOUT);
        assert_eq!(sandbox.timeout_for(1500), Duration::from_millis(1500));
        assert_eq!(sandbox.timeout_for(10_000_000), DEFAULT_TIMEOUT);
        let sandbox = Arc::new(sandbox);
        let slots: Vec<_> = (0..DEFAULT_CONCURRENT)
            .map(|_| sandbox.slot().unwrap())
            .collect();
        assert!(sandbox.slot().is_none(), "a fifth is refused");
        drop(slots);
        assert!(sandbox.slot().is_some());
    }

    #[test]
    fn a_command_waits_for_the_pin_and_a_missing_one_is_refused_at_the_bound() {
        // The agent's first exec can reach the gateway before the supervisor has read the
        // shim's `Started`: it waits for the pin instead of being refused.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let pin = Arc::new(StartedPin::default());
        let (ours, _theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let later = pin.clone();
        let setter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            later.set(Ok(PinnedSandbox {
                pid_one: crate::sandbox::PidOne::Pinned(OwnedFd::from(ours)),
                execute: vec!["/bin/sh".into()],
            }));
        });
        let waited = runtime.block_on(pin.wait(Duration::from_secs(10)));
        assert_eq!(waited.unwrap().execute, vec![PathBuf::from("/bin/sh")]);
        setter.join().unwrap();

        let never = StartedPin::default();
        let refused = runtime.block_on(never.wait(Duration::from_millis(20)));
        assert_eq!(refused.unwrap_err(), "the sandbox has not started");

        let failed = StartedPin::default();
        failed.set(Err("no pidfd".into()));
        let refused = runtime.block_on(failed.wait(Duration::from_secs(10)));
        assert_eq!(refused.unwrap_err(), "no pidfd");
    }
}
