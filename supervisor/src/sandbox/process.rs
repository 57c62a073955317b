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
    connect_unix, open_pidfd, pin_recorded_pid_one, recv_byte_with_fds, send_line,
    send_line_with_fds,
};
use super::error::SandboxError;
use super::spawn::{spawn_in_cgroup, Spawner};
use crate::cgroup::{CgroupJoin, RunCgroup};

/// A `tollgate-shim` that has not been given its plan yet. It was started without copying
/// the supervisor, in its sandbox's cgroup in every hierarchy (it joined before it ran
/// anything; a start's own sandbox on a hybrid host starts in the run's v2 directory and its
/// shard's v1 cgroups, and its pid 1 joins the run's v1 cgroups with the plan), leading a
/// process group of its own, and waited for its first message before anything else; since
/// then it has compiled the seccomp programs, unshared the sandbox's namespaces, forked pid 1
/// as this process's child (which prepares what needs no plan and then waits for it on the
/// control socket), said pid 1's pid (`PidOne`) and exited. A shim serves exactly one
/// sandbox. When the supervisor goes away the socket closes and pid 1 exits.
#[derive(Debug)]
pub struct IdleShim {
    process: IdleProcess,
    control: UnixStream,
    stdout: PipeReader,
    stderr: PipeReader,
}

/// Which of an idle sandbox's processes this process holds to reap.
#[derive(Debug)]
enum IdleProcess {
    /// The shim as started, whose `PidOne` is not read yet: it exits once it has forked
    /// pid 1 (and said so).
    Shim(ShimChild),
    /// pid 1, the shim reaped ([`IdleShim::settle`]).
    PidOne(ShimChild),
}

impl IdleShim {
    /// Starts the spawner's shim inside `cgroup`, with the control socket on fd 3 and fresh
    /// stdout and stderr pipes, and sends it `base` to prepare.
    pub fn spawn(
        spawner: &Spawner,
        cgroup: &RunCgroup,
        base: &SandboxBase,
    ) -> Result<Self, SandboxError> {
        Self::spawn_joining(spawner, &cgroup.join(), base)
    }

    /// [`IdleShim::spawn`], the shim joining the cgroups `join` names as it starts (a run's
    /// cgroup made in two steps: see `RunCgroup::first_join`).
    pub fn spawn_joining(
        spawner: &Spawner,
        join: &CgroupJoin,
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
        let child = spawn_in_cgroup(spawner, spawner.shim(), &[], join, fds)?;
        // Only the shim holds the pipes' write ends now, so the relays see EOF once the
        // sandbox's last process has exited.
        drop((theirs, out_write, err_write));
        let mut idle = Self {
            process: IdleProcess::Shim(child),
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

    /// Reads which pid 1 the shim forked and reaps the shim (it has exited, or is exiting),
    /// so a sandbox kept ready holds nothing to reap but its pid 1. A start does this
    /// itself when it was not done, reaping the shim after it has sent the plan. An error
    /// has ended and reaped both.
    pub fn settle(self) -> Result<Self, SandboxError> {
        let Self {
            process,
            control,
            stdout,
            stderr,
        } = self;
        let process = match process {
            IdleProcess::Shim(shim) => {
                let (pid_one, mut shim) = forked_pid_one(shim, &control)?;
                let _ = shim.wait();
                IdleProcess::PidOne(pid_one)
            }
            settled => settled,
        };
        Ok(Self {
            process,
            control,
            stdout,
            stderr,
        })
    }

    /// Ends and reaps the shim and its pid 1 (it was never given a plan): pid 1 exits once
    /// the socket is shut. Before the shim's `PidOne` is read, both are reaped through the
    /// shim's process group, so pid 1's pid need not be known. The cgroup's owner kills
    /// whatever else is left.
    pub fn discard(self) {
        match self.process {
            IdleProcess::Shim(shim) => end_unstarted(shim, &self.control),
            IdleProcess::PidOne(mut pid_one) => {
                let _ = self.control.shutdown(std::net::Shutdown::Both);
                let _ = pid_one.kill();
                let _ = pid_one.wait();
            }
        }
    }
}

/// Ends the shim `child` (as started) and the pid 1 it may have forked, and reaps both: shuts
/// the control socket (the shim and a pid 1 waiting for their messages exit), then waits
/// for every child of this process in the shim's process group. A pid 1 forked by a shim
/// killed before it said `PidOne` is reaped so too. A shim's group is pinned while any
/// member is left, and pids are handed out in turn, so no other process can join it here.
fn end_unstarted(child: ShimChild, control: &UnixStream) {
    let _ = control.shutdown(std::net::Shutdown::Both);
    child.wait_with_process_group();
}

/// pid 1, as the shim `shim` said it forked it, and the shim (exited or exiting, not yet
/// reaped); when it forked none (or its word cannot be read), both are ended and reaped and
/// the error says why.
fn forked_pid_one(
    shim: ShimChild,
    control: &UnixStream,
) -> Result<(ShimChild, ShimChild), SandboxError> {
    match read_forked(control) {
        Ok(Forked::PidOne(pid)) => Ok((ShimChild::started(pid), shim)),
        Ok(Forked::Failed(reason)) => {
            end_unstarted(shim, control);
            Err(SandboxError::Setup(reason))
        }
        Err(e) => {
            end_unstarted(shim, control);
            Err(e)
        }
    }
}

/// What the shim said first, before the plan: pid 1's host pid, or why it forked none.
enum Forked {
    /// pid 1, this process's child.
    PidOne(u32),
    /// The shim's reason; no pid 1 was forked.
    Failed(String),
}

/// Reads the shim's first line, [`FromShim::PidOne`] (or `Failed`). Nothing else can be on
/// the socket yet: pid 1 writes nothing before it has the plan, which is sent only after
/// this, so the line is read whole and nothing behind it (no descriptor) is read with it.
fn read_forked(control: &UnixStream) -> Result<Forked, SandboxError> {
    let mut reader = BufReader::new(control);
    let mut line = String::new();
    reader.read_line(&mut line).map_err(SandboxError::Control)?;
    if !reader.buffer().is_empty() {
        return Err(SandboxError::Setup(
            "the shim wrote more than one line before its plan".into(),
        ));
    }
    match serde_json::from_str(&line) {
        Ok(FromShim::PidOne { host_pid }) => Ok(Forked::PidOne(host_pid)),
        Ok(FromShim::Failed { reason }) => Ok(Forked::Failed(reason)),
        Ok(other) => Err(SandboxError::Setup(format!(
            "the shim said {other:?} before its plan"
        ))),
        Err(_) if line.is_empty() => Err(SandboxError::Setup(
            "the shim ended before it forked the sandbox's pid 1".into(),
        )),
        Err(e) => Err(SandboxError::Control(std::io::Error::other(e))),
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

/// A running sandbox's pid 1 (`tollgate-shim`) and its control socket.
#[derive(Debug)]
pub struct SandboxProcess {
    /// pid 1, when this supervisor started it (a re-adopted one is not its child).
    child: Option<ShimChild>,
    events: BufReader<UnixStream>,
    // Kept open: closing it tells pid 1 the supervisor is gone.
    control: UnixStream,
    /// Set (under the write lock) before pid 1 is reaped: from then on its pid may be
    /// anyone's, so nothing pins it through its pid (see [`PidOne`]).
    reaped: Arc<RwLock<bool>>,
    /// pid 1 keeps each gateway connection it hands over until told it arrived (see
    /// [`ShimWatch::keeps_connections`]).
    keeps_connections: bool,
}

/// The sandbox's pid 1, as `exec` joins its namespaces: through a pidfd, never a pid looked
/// up again (a recycled pid could be anyone's).
#[derive(Debug)]
pub enum PidOne {
    /// A pidfd taken once: a re-adopted sandbox, whose pid 1 is not this process's child.
    Pinned(OwnedFd),
    /// Pinned for each command by its pid: pid 1 is this process's child, and while it is
    /// not reaped its pid is its own. No descriptor is held between commands.
    Child {
        /// pid 1's host pid.
        pid: u32,
        /// Whether pid 1 has been (or is being) reaped.
        reaped: Arc<RwLock<bool>>,
    },
}

impl PidOne {
    /// A pidfd of the sandbox's pid 1, for one command.
    pub fn pidfd(&self) -> std::io::Result<OwnedFd> {
        match self {
            Self::Pinned(fd) => fd.try_clone(),
            Self::Child { pid, reaped } => {
                // Held across the pin: pid 1 is not reaped meanwhile.
                let reaped = reaped.read().unwrap_or_else(|p| p.into_inner());
                if *reaped {
                    return Err(std::io::Error::other("the sandbox has ended"));
                }
                open_pidfd(*pid)
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
    /// Sends the idle `shim` its plan, with `mounts` (first the run's cgroup v1 `tasks` files
    /// pid 1 is to join, as many as the plan's `cgroup_joins`; then detached mounts of the
    /// plan's binds, in order, then its root file system's when it has one, then the run's
    /// gateway listening socket when the plan has one, which pid 1 keeps), the run's own
    /// detached mounts (its workspace, certificate authority and gateway socket, made here)
    /// after the cgroup files: see [`SandboxPlan::descriptors`]. Waits for `Started`. The
    /// caller has applied the run's limits to the shim's cgroup (or to those pid 1 joins)
    /// first.
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
        let mut mounts = mounts;
        let rest = mounts.split_off(plan.cgroup_joins.min(mounts.len()));
        let mounts: Vec<OwnedFd> = mounts.into_iter().chain(own).chain(rest).collect();
        let expected = plan.descriptors();
        if mounts.len() != expected {
            shim.discard();
            return Err(SandboxError::Setup(format!(
                "{} descriptors for {expected} (the run's mounts, binds, root file system and gateway socket)",
                mounts.len(),
            )));
        }
        let IdleShim {
            process,
            control,
            stdout,
            stderr,
        } = shim;
        // pid 1 first: the plan goes to it, and it is this process's to reap from now on.
        let (mut child, shim) = match process {
            IdleProcess::PidOne(pid_one) => (pid_one, None),
            IdleProcess::Shim(shim) => {
                let (pid_one, shim) = forked_pid_one(shim, &control)?;
                (pid_one, Some(shim))
            }
        };
        let mut control = control;
        let sent = send_line_with_fds(
            &mut control,
            &ToShim::Start(Box::new(plan.clone())),
            &mounts,
        )
        .and_then(|()| control.try_clone());
        // pid 1 holds its own copies now (or never will).
        drop(mounts);
        // The shim as started exited once it had said `PidOne`: reaped while pid 1 takes the
        // plan, when it was not already.
        if let Some(mut shim) = shim {
            let _ = shim.wait();
        }
        let events = match sent {
            Ok(clone) => BufReader::new(clone),
            Err(e) => {
                // A pid 1 that failed as its plan came may have said why before it closed the
                // socket (it says nothing before the plan).
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
                // Never leave a zombie (or a live pid 1) behind an error.
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

    /// pid 1's host pid, when it is this process's child.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(ShimChild::id)
    }

    /// The sandbox's pid 1, checked pinnable now. It is this process's child and not yet
    /// reaped, so its pid is its own.
    pub fn pid_one(&self) -> std::io::Result<PidOne> {
        let pid = self
            .pid()
            .ok_or_else(|| std::io::Error::other("pid 1 is not this process's child"))?;
        drop(open_pidfd(pid)?);
        Ok(PidOne::Child {
            pid,
            reaped: self.reaped.clone(),
        })
    }

    /// Takes over a sandbox left running detached: connects to its detach socket, asks pid 1
    /// to `Reattach`, and receives the agent's output pipes (pid 1 kept the gateway socket,
    /// and hands its connections over when asked, as before the detach). `shim` is the
    /// host pid recorded at the detach: pid 1's (or, recorded by an older supervisor, its
    /// parent shim's); it must still be in `cgroup` (a pid reused by anything else is
    /// refused).
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
        let pid_one = pin_recorded_pid_one(shim).map_err(|e| lost(e.to_string()))?;
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

    /// Kills and reaps pid 1, when it is this process's child.
    fn kill(&mut self) {
        *self.reaped.write().unwrap_or_else(|p| p.into_inner()) = true;
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits for pid 1 to exit, when it is this process's child (a re-adopted pid 1's
    /// parent reaps it).
    pub fn wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        *self.reaped.write().unwrap_or_else(|p| p.into_inner()) = true;
        self.child.as_mut().map(ShimChild::wait).transpose()
    }
}

/// A started shim taken apart for watching it without a thread: what reads its events and
/// what reaps it (see [`SandboxProcess::into_watch`]).
#[derive(Debug)]
pub struct ShimWatch {
    /// pid 1, when this supervisor started it (reaped once its socket has closed).
    pub child: Option<ShimChild>,
    /// The control socket: the only descriptor left on it (closing it tells pid 1 the
    /// supervisor is gone).
    pub control: UnixStream,
    /// Bytes of events already read from the socket and not yet parsed.
    pub buffered: Vec<u8>,
    /// Set before pid 1 is reaped (see [`PidOne`]).
    pub reaped: Arc<RwLock<bool>>,
    /// pid 1 keeps each gateway connection it hands over until told it arrived, and sends
    /// it again when asked: so a `Connection` whose descriptor did not arrive is asked for
    /// again. `false` for a pid 1 of an older shim re-adopted after an upgrade, which keeps
    /// none: such a connection is lost, and the gateway asks afresh.
    pub keeps_connections: bool,
}

impl ShimWatch {
    /// Reaps pid 1 (its socket has closed: it is ending, if it has not already), once
    /// nothing can pin it through its pid any more.
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
