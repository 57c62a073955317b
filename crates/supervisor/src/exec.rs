//! The gateway's `exec` tool: one command run inside a live sandbox.
//!
//! The supervisor starts `tollgate-shim enter` inside the run's cgroup (it joins every
//! hierarchy between fork and exec, like the sandbox's own shim), hands it the request on
//! fd 3, feeds the command's stdin and collects its stdout and stderr up to the output cap.
//! The helper joins the sandbox's namespaces and starts the command exactly as the agent was
//! started (see `tollgate_agent_shim`'s `enter`); it enforces the time limit and reports how
//! the command ended. A helper that does not report within the limit plus a grace period is
//! killed here.

use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tollgate_agent_shim::plan::{AgentCommand, SandboxPlan};
use tollgate_agent_shim::protocol::{AgentExit, EnterOutcome, EnterRequest};

use crate::sandbox::in_cgroup_with_control;

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
    /// The `tollgate-shim` binary.
    pub shim: PathBuf,
    /// Host pid of the sandbox's outer shim.
    pub shim_pid: u32,
    /// The sandbox's plan (its Landlock rules, ids and the agent's environment and cwd).
    pub plan: SandboxPlan,
    /// The run cgroup's `cgroup.procs` files, one per hierarchy.
    pub cgroup_procs: Vec<PathBuf>,
    /// The limits.
    pub limits: ExecLimits,
    /// Commands running now.
    pub running: AtomicUsize,
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

/// Reads `pipe` to its end, keeping what the shared `room` allows.
async fn capture(mut pipe: impl AsyncRead + Unpin, room: Arc<AtomicUsize>) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut dropped = false;
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
        kept.extend_from_slice(&buffer[..take]);
        // Drained past the cap so the command never blocks on a full pipe.
        dropped |= take < read;
    }
    (kept, dropped)
}

/// Runs `argv` in the sandbox with `stdin`, in `cwd`, for at most `timeout`.
pub async fn run(
    sandbox: &ExecSandbox,
    argv: Vec<String>,
    stdin: Vec<u8>,
    cwd: PathBuf,
    timeout: Duration,
) -> Result<ExecResult, ExecError> {
    let started = Instant::now();
    let mut plan = sandbox.plan.clone();
    plan.agent = AgentCommand {
        argv,
        // The agent's environment, filtered as the agent's was.
        env: plan.agent.env.clone(),
        cwd,
    };
    let request = EnterRequest {
        shim_pid: sandbox.shim_pid,
        plan,
        timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
    };
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(ExecError::Spawn)?;
    let procs: Vec<OwnedFd> = sandbox
        .cgroup_procs
        .iter()
        .map(|file| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(file)
                .map(OwnedFd::from)
        })
        .collect::<Result<_, _>>()
        .map_err(ExecError::Spawn)?;
    let mut command = std::process::Command::new(&sandbox.shim);
    command
        .arg("enter")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .env_clear();
    in_cgroup_with_control(
        &mut command,
        procs.iter().map(|fd| fd.as_raw_fd()).collect(),
        theirs.as_raw_fd(),
    );
    let mut command = tokio::process::Command::from(command);
    command.kill_on_drop(true);
    let mut child = command.spawn().map_err(ExecError::Spawn)?;
    drop(theirs);
    drop(procs);
    let mut line = serde_json::to_vec(&request).map_err(|e| ExecError::Helper(e.into()))?;
    line.push(b'\n');
    ours.set_nonblocking(true).map_err(ExecError::Helper)?;
    let mut control = tokio::net::UnixStream::from_std(ours).map_err(ExecError::Helper)?;
    let room = Arc::new(AtomicUsize::new(sandbox.limits.output_cap));
    let stdout = child.stdout.take().map(|p| capture(p, room.clone()));
    let stderr = child.stderr.take().map(|p| capture(p, room.clone()));
    let mut stdin_pipe = child.stdin.take();
    let work = async {
        control.write_all(&line).await.map_err(ExecError::Helper)?;
        let feed = async {
            if let Some(mut pipe) = stdin_pipe.take() {
                // A command that does not read its stdin closes the pipe: not an error.
                let _ = pipe.write_all(&stdin).await;
            }
        };
        let outcome = async {
            let mut reply = String::new();
            tokio::io::BufReader::new(&mut control)
                .read_line(&mut reply)
                .await
                .map_err(ExecError::Helper)?;
            Ok::<_, ExecError>(reply)
        };
        let empty = async { (Vec::new(), false) };
        let (reply, (), (out, out_cut), (err, err_cut)) = tokio::join!(
            outcome,
            feed,
            async {
                match stdout {
                    Some(capture) => capture.await,
                    None => empty.await,
                }
            },
            async {
                match stderr {
                    Some(capture) => capture.await,
                    None => (Vec::new(), false),
                }
            },
        );
        Ok::<_, ExecError>((reply?, out, err, out_cut || err_cut))
    };
    let (reply, stdout, stderr, truncated) = match tokio::time::timeout(timeout + GRACE, work).await
    {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => {
            // The helper's own status says more than a broken socket.
            let status = child.wait().await;
            return Err(ExecError::NotStarted(format!(
                "{e} (the helper {})",
                status.map_or_else(|e| e.to_string(), |s| s.to_string())
            )));
        }
        Err(_) => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            return Err(ExecError::Unresponsive);
        }
    };
    let status = child.wait().await;
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
        Err(_) if reply.is_empty() => Err(ExecError::NotStarted(format!(
            "the helper ended without a report ({}; the sandbox may be ending)",
            status.map_or_else(|e| e.to_string(), |s| s.to_string())
        ))),
        Err(e) => Err(ExecError::Helper(std::io::Error::other(e))),
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
        let (out, out_cut) = runtime.block_on(capture(&b"0123456"[..], room.clone()));
        let (err, err_cut) = runtime.block_on(capture(&[b'e'; 200_000][..], room.clone()));
        assert_eq!((out.as_slice(), out_cut), (&b"0123456"[..], false));
        assert_eq!((err.as_slice(), err_cut), (&b"eee"[..], true));
        assert_eq!(room.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn timeouts_default_to_and_stop_at_the_maximum() {
        let sandbox = ExecSandbox {
            shim: PathBuf::new(),
            shim_pid: 0,
            plan: serde_json::from_value(serde_json::json!({
                "run_id": "r", "workspace": "/w", "tmpfs_bytes": 0, "binds": [],
                "landlock": {"read": [], "write": [], "execute": []},
                "agent": {"argv": ["/bin/true"], "env": [], "cwd": "/work"},
                "inner_id": 1000, "host_id": 1
            }))
            .unwrap(),
            cgroup_procs: Vec::new(),
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
}
