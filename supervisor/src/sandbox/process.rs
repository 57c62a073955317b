//! A shim as a process: idle and waiting for its plan (prepared ahead of need), started with
//! one, or re-adopted after a live restore.

use std::io::{BufRead as _, BufReader, PipeReader};
use std::os::fd::{AsFd as _, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tollgate_shim_protocol::plan::{AgentInput, SandboxBase, SandboxPlan, INPUT_MARKER};
use tollgate_shim_protocol::protocol::{FromShim, ToShim, REATTACH_FDS};

use super::child::{ChildFds, ShimChild};
use super::control::{
    connect_unix, pin_pid_one, recv_byte_with_fds, send_line, send_line_with_fds,
};
use super::error::SandboxError;
use super::spawn::{spawn_in_cgroup, Spawner};
use crate::cgroup::RunCgroup;

/// A `tollgate-shim` that has not been given its plan yet. It was started without copying
/// the supervisor, in its sandbox's cgroup in every hierarchy (it joined before it ran
/// anything), and waited for its first message before anything else; since then it has
/// compiled the seccomp programs, unshared the sandbox's namespaces and forked pid 1, which
/// is blocked reading the plan on the control socket. A shim serves exactly one sandbox.
/// When the supervisor goes away the socket closes and the shim exits.
#[derive(Debug)]
pub struct IdleShim {
    child: ShimChild,
    control: UnixStream,
    stdout: PipeReader,
    stderr: PipeReader,
}

impl IdleShim {
    /// Starts the spawner's shim inside `cgroup`, with the control socket on fd 3 and fresh
    /// stdout and stderr pipes, and sends it `base` to prepare.
    pub fn spawn(
        spawner: &Spawner,
        cgroup: &RunCgroup,
        base: &SandboxBase,
    ) -> Result<Self, SandboxError> {
        let (ours, theirs) = UnixStream::pair().map_err(SandboxError::Control)?;
        let (stdout, out_write) = std::io::pipe().map_err(SandboxError::Control)?;
        let (stderr, err_write) = std::io::pipe().map_err(SandboxError::Control)?;
        let fds = ChildFds {
            control: theirs.as_fd(),
            pid_one: None,
            stdin: None,
            stdout: out_write.as_fd(),
            stderr: err_write.as_fd(),
        };
        let child = spawn_in_cgroup(spawner, spawner.shim(), &[], &cgroup.join(), fds)?;
        // Only the shim holds the pipes' write ends now, so the relays see EOF once the
        // sandbox's last process has exited.
        drop((theirs, out_write, err_write));
        let mut idle = Self {
            child,
            control: ours,
            stdout,
            stderr,
        };
        // The shim's go-ahead: it is in its cgroup in every hierarchy now, and has done
        // nothing before this message.
        if let Err(e) = send_line(&mut idle.control, &ToShim::Prepare(Box::new(base.clone()))) {
            idle.discard();
            return Err(SandboxError::Control(e));
        }
        Ok(idle)
    }

    /// The shim's host pid (its only child becomes the sandbox's pid 1).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills and reaps the shim (it was never given a plan; its pid 1 exits with the
    /// socket, and the cgroup's owner kills what is left).
    pub fn discard(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a started sandbox writes: the read ends of its stdout and stderr pipes (with a
/// terminal, stdout reads the terminal's master: everything the agent writes), and the
/// supervisor's end of the agent's input when its plan asked for one.
#[derive(Debug)]
pub struct SandboxOutput {
    /// The agent's standard output.
    pub stdout: PipeReader,
    /// The agent's standard error.
    pub stderr: PipeReader,
    /// The write end of the agent's stdin pipe, or the terminal's master.
    pub input: Option<OwnedFd>,
}

/// A running `tollgate-shim` and its control socket.
#[derive(Debug)]
pub struct SandboxProcess {
    /// The shim, when this supervisor started it (a re-adopted one is not its child).
    child: Option<ShimChild>,
    events: BufReader<UnixStream>,
    // Kept open: closing it tells pid 1 the supervisor is gone.
    control: UnixStream,
    /// Set (under the write lock) before the shim is reaped: from then on its pid may be
    /// anyone's, so nothing pins pid 1 through it (see [`PidOne`]).
    reaped: Arc<RwLock<bool>>,
    /// pid 1 keeps each gateway connection it hands over until told it arrived (see
    /// [`ShimWatch::keeps_connections`]).
    keeps_connections: bool,
}

/// The sandbox's pid 1, as `exec` joins its namespaces: through a pidfd, never a pid looked
/// up again (a recycled pid could be anyone's).
#[derive(Debug)]
pub enum PidOne {
    /// A pidfd taken once: a re-adopted sandbox, whose shim is not this process's child.
    Pinned(OwnedFd),
    /// Pinned for each command through the shim, this process's child: while the shim is
    /// not reaped its pid is its own, so its only child is the sandbox's pid 1. No
    /// descriptor is held between commands.
    Shim {
        /// The shim's host pid.
        pid: u32,
        /// Whether the shim has been (or is being) reaped.
        reaped: Arc<RwLock<bool>>,
    },
}

impl PidOne {
    /// A pidfd of the sandbox's pid 1, for one command.
    pub fn pidfd(&self) -> std::io::Result<OwnedFd> {
        match self {
            Self::Pinned(fd) => fd.try_clone(),
            Self::Shim { pid, reaped } => {
                // Held across the pin: the shim is not reaped meanwhile.
                let reaped = reaped.read().unwrap_or_else(|p| p.into_inner());
                if *reaped {
                    return Err(std::io::Error::other("the sandbox has ended"));
                }
                pin_pid_one(*pid)
            }
        }
    }
}

/// A sandbox a previous supervisor left running detached, taken over through its detach
/// socket ([`SandboxProcess::reattach`]).
#[derive(Debug)]
pub struct ReattachedSandbox {
    /// Its shim and new control socket.
    pub process: SandboxProcess,
    /// The read ends of the agent's stdout and stderr, as pid 1 held them.
    pub output: SandboxOutput,
    /// The executables Landlock allows, as resolved when the sandbox started.
    pub execute: Vec<PathBuf>,
    /// A pidfd of the sandbox's pid 1.
    pub pid_one: OwnedFd,
}

/// A detached mount of one of the run's own files (its workspace, certificate authority
/// directory or gateway socket, which the supervisor made in the run's root-owned directory):
/// the shim attaches it, and looks nothing up on the host (its mount namespace is a copy of
/// the sandboxes' base, which has none of the host's data).
fn run_mount(path: &Path) -> Result<OwnedFd, SandboxError> {
    let failed =
        |e: nix::Error| SandboxError::Setup(format!("a detached mount of {}: {e}", path.display()));
    let entry = nix::fcntl::open(
        path,
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(failed)?;
    crate::beneath::detached_copy(entry.as_fd()).map_err(failed)
}

impl SandboxProcess {
    /// Sends the idle `shim` its plan, with `mounts` (detached mounts of the plan's binds, in
    /// order, then its root file system's when it has one, then the run's gateway listening
    /// socket when the plan has one, which pid 1 keeps) attached after the run's own detached
    /// mounts (its workspace, certificate authority and gateway socket, made here: see
    /// [`SandboxPlan::descriptors`]), and waits for `Started`. The caller has applied the
    /// run's limits to the shim's cgroup first.
    pub fn start(
        shim: IdleShim,
        plan: &SandboxPlan,
        mounts: Vec<OwnedFd>,
    ) -> Result<(Self, FromShim, SandboxOutput), SandboxError> {
        let own = [
            Some(&plan.workspace),
            plan.egress_ca.as_ref(),
            plan.gateway_socket.as_ref(),
        ];
        let own = match own
            .into_iter()
            .flatten()
            .map(|path| run_mount(path))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(own) => own,
            Err(e) => {
                shim.discard();
                return Err(e);
            }
        };
        let mounts: Vec<OwnedFd> = own.into_iter().chain(mounts).collect();
        let expected = plan.descriptors();
        if mounts.len() != expected {
            shim.discard();
            return Err(SandboxError::Setup(format!(
                "{} descriptors for {expected} (the run's mounts, binds, root file system and gateway socket)",
                mounts.len(),
            )));
        }
        let IdleShim {
            child,
            control,
            stdout,
            stderr,
        } = shim;
        let mut child = child;
        let mut control = control;
        let sent = send_line_with_fds(
            &mut control,
            &ToShim::Start(Box::new(plan.clone())),
            &mounts,
        )
        .and_then(|()| control.try_clone());
        // The shim holds its own copies now (or never will).
        drop(mounts);
        let events = match sent {
            Ok(clone) => BufReader::new(clone),
            Err(e) => {
                // A shim that failed while idle has said why before closing the socket.
                let reason = control.try_clone().ok().and_then(|clone| {
                    // Bounded: the shim may be alive and simply not reading.
                    clone
                        .set_read_timeout(Some(std::time::Duration::from_secs(1)))
                        .ok()?;
                    let mut line = String::new();
                    BufReader::new(clone).read_line(&mut line).ok()?;
                    match serde_json::from_str(&line).ok()? {
                        FromShim::Failed { reason } => Some(reason),
                        _ => None,
                    }
                });
                // Never leave a zombie (or a live shim) behind an error.
                let _ = child.kill();
                let _ = child.wait();
                return Err(match reason {
                    Some(reason) => SandboxError::Setup(reason),
                    None => SandboxError::Control(e),
                });
            }
        };
        let mut process = Self {
            child: Some(child),
            events,
            control,
            reaped: Arc::default(),
            // This supervisor's own shim.
            keeps_connections: true,
        };
        // The agent's input comes first, alone with its descriptor (SCM_RIGHTS), when the
        // plan asks for one; anything else there is the start of the shim's failure line.
        let mut input = None;
        let mut stdout = stdout;
        if plan.input != AgentInput::Null {
            match recv_byte_with_fds(&process.control) {
                Ok((INPUT_MARKER, mut fds)) if fds.len() == 1 => {
                    let end = fds.remove(0);
                    if matches!(plan.input, AgentInput::Terminal { .. }) {
                        // Everything the agent writes comes through the terminal.
                        match end.try_clone() {
                            Ok(reader) => stdout = PipeReader::from(reader),
                            Err(e) => {
                                process.kill();
                                return Err(SandboxError::Control(e));
                            }
                        }
                    }
                    input = Some(end);
                }
                Ok((byte, _)) => {
                    let mut line = vec![byte];
                    let _ = process.events.read_until(b'\n', &mut line);
                    let reason = match serde_json::from_slice(&line) {
                        Ok(FromShim::Failed { reason }) => reason,
                        _ => "the shim did not hand over the agent's input".into(),
                    };
                    let _ = process.wait();
                    return Err(SandboxError::Setup(reason));
                }
                Err(e) => {
                    process.kill();
                    return Err(SandboxError::Control(e));
                }
            }
        }
        let first = match process.next_event() {
            Ok(event) => event,
            Err(e) => {
                process.kill();
                return Err(e);
            }
        };
        match first {
            Some(started @ FromShim::Started { .. }) => Ok((
                process,
                started,
                SandboxOutput {
                    stdout,
                    stderr,
                    input,
                },
            )),
            Some(FromShim::Failed { reason }) => {
                let _ = process.wait();
                Err(SandboxError::Setup(reason))
            }
            other => {
                let status = process.wait().ok().flatten();
                Err(SandboxError::Setup(format!(
                    "the shim ended without starting the agent ({other:?}, status {status:?})"
                )))
            }
        }
    }

    /// The shim's host pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(ShimChild::id)
    }

    /// The sandbox's pid 1 (the shim's only child), checked pinnable now. The shim is this
    /// process's child and not yet reaped, so its pid is its own; a pid 1 that already
    /// ended, with its number taken by another process, is recognised by that process's
    /// parent.
    pub fn pid_one(&self) -> std::io::Result<PidOne> {
        let shim = self
            .pid()
            .ok_or_else(|| std::io::Error::other("the shim is not this process's child"))?;
        drop(pin_pid_one(shim)?);
        Ok(PidOne::Shim {
            pid: shim,
            reaped: self.reaped.clone(),
        })
    }

    /// Takes over a sandbox left running detached: connects to its detach socket, asks pid 1
    /// to `Reattach`, and receives the agent's output pipes (pid 1 kept the gateway socket,
    /// and hands its connections over when asked, as before the detach). `shim` is
    /// the shim's host pid as recorded at the detach; it must still be in `cgroup` (a pid
    /// reused by anything else is refused).
    pub fn reattach(
        socket: &Path,
        shim: u32,
        cgroup: &RunCgroup,
    ) -> Result<ReattachedSandbox, SandboxError> {
        let lost = |detail: String| SandboxError::Setup(format!("re-adopting: {detail}"));
        if !cgroup
            .pids()
            .map_err(|e| lost(e.to_string()))?
            .contains(&shim)
        {
            return Err(lost(format!(
                "the shim (pid {shim}) is no longer in {}",
                cgroup.relative()
            )));
        }
        let pid_one = pin_pid_one(shim).map_err(|e| lost(e.to_string()))?;
        let mut control =
            connect_unix(socket).map_err(|e| lost(format!("{}: {e}", socket.display())))?;
        control
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .map_err(SandboxError::Control)?;
        send_line(&mut control, &ToShim::Reattach).map_err(SandboxError::Control)?;
        // The descriptors ride on the answer's first byte; the rest of the line (and an
        // `Exited` that may follow at once) is read through the events reader kept below.
        let (first, fds) = recv_byte_with_fds(&control).map_err(SandboxError::Control)?;
        let mut events = BufReader::new(control.try_clone().map_err(SandboxError::Control)?);
        let mut line = vec![first];
        events
            .read_until(b'\n', &mut line)
            .map_err(SandboxError::Control)?;
        control
            .set_read_timeout(None)
            .map_err(SandboxError::Control)?;
        let (execute, keeps_connections) = match serde_json::from_slice(&line) {
            Ok(FromShim::Reattached {
                execute,
                keeps_connections,
                ..
            }) => (execute, keeps_connections),
            Ok(other) => return Err(lost(format!("pid 1 answered {other:?}"))),
            Err(e) => return Err(lost(format!("pid 1's answer: {e}"))),
        };
        let mut fds = fds.into_iter();
        let (Some(stdout), Some(stderr), None) = (fds.next(), fds.next(), fds.next()) else {
            return Err(lost(format!(
                "pid 1 handed back the wrong number of descriptors (expected {REATTACH_FDS})"
            )));
        };
        Ok(ReattachedSandbox {
            process: Self {
                child: None,
                events,
                control,
                reaped: Arc::default(),
                keeps_connections,
            },
            // A run with input is never left detached: nothing of it to hand back.
            output: SandboxOutput {
                stdout: PipeReader::from(stdout),
                stderr: PipeReader::from(stderr),
                input: None,
            },
            execute,
            pid_one,
        })
    }
}

impl SandboxProcess {
    /// The next event from the shim; `None` when it has closed the socket.
    pub fn next_event(&mut self) -> Result<Option<FromShim>, SandboxError> {
        let mut line = String::new();
        let read = self
            .events
            .read_line(&mut line)
            .map_err(SandboxError::Control)?;
        if read == 0 {
            return Ok(None);
        }
        serde_json::from_str(&line)
            .map(Some)
            .map_err(|e| SandboxError::Control(std::io::Error::other(e)))
    }

    /// Kills and reaps the shim, when it is this process's child.
    fn kill(&mut self) {
        *self.reaped.write().unwrap_or_else(|p| p.into_inner()) = true;
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits for the shim process to exit, when it is this process's child (a re-adopted
    /// shim's parent reaps it).
    pub fn wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        *self.reaped.write().unwrap_or_else(|p| p.into_inner()) = true;
        self.child.as_mut().map(ShimChild::wait).transpose()
    }
}

/// A started shim taken apart for watching it without a thread: what reads its events and
/// what reaps it (see [`SandboxProcess::into_watch`]).
#[derive(Debug)]
pub struct ShimWatch {
    /// The shim, when this supervisor started it (reaped once its socket has closed).
    pub child: Option<ShimChild>,
    /// The control socket: the only descriptor left on it (closing it tells pid 1 the
    /// supervisor is gone).
    pub control: UnixStream,
    /// Bytes of events already read from the socket and not yet parsed.
    pub buffered: Vec<u8>,
    /// Set before the shim is reaped (see [`PidOne`]).
    pub reaped: Arc<RwLock<bool>>,
    /// pid 1 keeps each gateway connection it hands over until told it arrived, and sends
    /// it again when asked: so a `Connection` whose descriptor did not arrive is asked for
    /// again. `false` for a pid 1 of an older shim re-adopted after an upgrade, which keeps
    /// none: such a connection is lost, and the gateway asks afresh.
    pub keeps_connections: bool,
}

impl ShimWatch {
    /// Reaps the shim (its socket has closed: it is ending, if it has not already), once
    /// nothing can pin pid 1 through its pid any more.
    pub fn reap(child: Option<ShimChild>, reaped: &RwLock<bool>) {
        *reaped.write().unwrap_or_else(|p| p.into_inner()) = true;
        if let Some(mut child) = child {
            let _ = child.wait();
        }
    }
}

impl SandboxProcess {
    /// Gives up the second handle on the control socket (one descriptor a run fewer) and
    /// returns what watching the shim takes: the socket, the bytes read ahead, the child.
    pub fn into_watch(self) -> ShimWatch {
        let Self {
            child,
            events,
            control,
            reaped,
            keeps_connections,
        } = self;
        // The events reader's socket is the same one: closing this handle leaves it open.
        drop(control);
        let buffered = events.buffer().to_vec();
        ShimWatch {
            child,
            control: events.into_inner(),
            buffered,
            reaped,
            keeps_connections,
        }
    }
}
