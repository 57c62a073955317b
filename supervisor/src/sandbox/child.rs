//! What starting a child takes and gives: the descriptors it gets ([`ChildFds`]), the
//! handle of a started one ([`ShimChild`]), the failures ([`SpawnError`]), and the one
//! `posix_spawn` the supervisor still makes itself, for its spawner (see [`super::spawn`]).

use std::ffi::CString;
use std::os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use nix::fcntl::OFlag;
use nix::spawn::{PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::stat::Mode;
use tollgate_shim_protocol::protocol::{CONTROL_FD, PID_ONE_FD};

/// Starting a shim in its cgroup failed; each step has its own variant.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// A cgroup's `tasks` file or v2 directory could not be opened (before anything was
    /// started).
    #[error("opening {file} for the shim to join its cgroup: {source}; check that the cgroup still exists")]
    OpenCgroup {
        /// The `tasks` file or v2 directory.
        file: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// The program could not be started (or its descriptors could not be arranged).
    #[error("starting {program}: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// The spawner (`tollgate-shim spawner`, which starts every shim; see
    /// [`super::spawn::Spawner`]) could not be started: nothing was.
    #[error("starting the spawner ({shim} spawner): {source}; check that the shim binary exists and is executable")]
    StartSpawner {
        /// The shim binary.
        shim: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// The spawner started but could not make the sandboxes' base mount namespace (every
    /// shim starts in it): it exited, and nothing was started.
    #[error("the spawner could not make the sandboxes' base mount namespace: {source}; each start tries again")]
    SpawnerBase {
        /// The shim binary.
        shim: PathBuf,
        /// Why, as the spawner said it.
        source: std::io::Error,
    },
    /// The new shim could not enter the sandboxes' base mount namespace: it never ran (it
    /// exited, and was reaped).
    #[error("starting {program} in the sandboxes' base mount namespace: {source} (it never ran)")]
    EnterBase {
        /// The program.
        program: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// The spawner went away (it exited or was killed) while starting `program`: whether it
    /// was started is unknown. Its own variant because it is neither the program's failure
    /// nor a host limit, and because the next start starts a new spawner.
    #[error("the spawner exited while starting {program}: {source}; the next start restarts it")]
    SpawnerLost {
        /// The program.
        program: PathBuf,
        /// The failure on the spawner's socket.
        source: std::io::Error,
    },
    /// The new child could not join its cgroup: it never executed the program (it exited,
    /// and was reaped), or, for the v2 directory, it was never created.
    #[error("starting {program} in its cgroup through {file}: {source} (it never ran); check that the cgroup still exists")]
    JoinCgroup {
        /// The program.
        program: PathBuf,
        /// Its pid, now reaped; `None` when the v2 join failed, which is part of creating it.
        pid: Option<u32>,
        /// The `tasks` file whose write failed, or the v2 directory.
        file: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
}

impl SpawnError {
    /// The operating-system error behind this one, and whether it came from starting a
    /// process (where `EAGAIN` means no pid was left).
    pub fn source_io(&self) -> (&std::io::Error, bool) {
        match self {
            Self::Spawn { source, .. } | Self::StartSpawner { source, .. } => (source, true),
            Self::OpenCgroup { source, .. }
            | Self::JoinCgroup { source, .. }
            | Self::SpawnerBase { source, .. }
            | Self::EnterBase { source, .. }
            | Self::SpawnerLost { source, .. } => (source, false),
        }
    }
}

/// The descriptors a spawned shim gets: fd 0 is `/dev/null` unless `stdin` is given.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChildFds<'a> {
    /// Its end of the control socket, placed on fd 3 ([`CONTROL_FD`]).
    pub control: BorrowedFd<'a>,
    /// A pidfd of the sandbox's pid 1, placed on fd 4 ([`PID_ONE_FD`]).
    pub pid_one: Option<BorrowedFd<'a>>,
    /// Its stdin; `/dev/null` when `None`.
    pub stdin: Option<BorrowedFd<'a>>,
    /// Its stdout.
    pub stdout: BorrowedFd<'a>,
    /// Its stderr.
    pub stderr: BorrowedFd<'a>,
}

/// The highest descriptor number a child gets placed (the spawner's rule is the same).
const HIGHEST_PLACED: RawFd = PID_ONE_FD;

/// `posix_spawn` with the descriptors placed and the signal state reset as `std::process`
/// does (empty mask, `SIGPIPE` back to its default: the supervisor ignores it); the child's
/// pid. The child gets a copy of this process's whole descriptor table: only the spawner is
/// started this way, once, while the table is small.
pub(super) fn posix_spawn(
    program: &Path,
    args: &[&str],
    fds: ChildFds<'_>,
) -> std::io::Result<u32> {
    let to_c = |bytes: &[u8]| CString::new(bytes).map_err(std::io::Error::other);
    let mut argv = vec![to_c(program.as_os_str().as_bytes())?];
    for arg in args {
        argv.push(to_c(arg.as_bytes())?);
    }
    let env: [&std::ffi::CStr; 0] = [];
    // Every source above the numbers placed, so placing one never overwrites another that
    // is still to be placed (the copies made for that are close-on-exec and dropped below).
    let mut moved = Vec::new();
    let mut source = |fd: BorrowedFd<'_>| -> std::io::Result<RawFd> {
        if fd.as_raw_fd() > HIGHEST_PLACED {
            return Ok(fd.as_raw_fd());
        }
        let copy = nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(HIGHEST_PLACED + 1),
        )?;
        #[allow(unsafe_code)]
        // SAFETY: fcntl just returned this new descriptor; nothing else owns it.
        let copy = unsafe { OwnedFd::from_raw_fd(copy) };
        let raw = copy.as_raw_fd();
        moved.push(copy);
        Ok(raw)
    };
    let mut actions = PosixSpawnFileActions::init()?;
    match fds.stdin {
        Some(stdin) => actions.add_dup2(source(stdin)?, 0)?,
        None => actions.add_open(0, "/dev/null", OFlag::O_RDONLY, Mode::empty())?,
    }
    let placed = [
        (Some(fds.stdout), 1),
        (Some(fds.stderr), 2),
        (Some(fds.control), CONTROL_FD),
        (fds.pid_one, PID_ONE_FD),
    ];
    let mut sources = Vec::new();
    for (fd, target) in placed {
        if let Some(fd) = fd {
            sources.push((source(fd)?, target));
        }
    }
    // dup2 clears close-on-exec on the new number; a source is never its own target here.
    for (fd, target) in sources {
        actions.add_dup2(fd, target)?;
    }
    let mut attr = PosixSpawnAttr::init()?;
    attr.set_sigmask(&SigSet::empty())?;
    let mut defaults = SigSet::empty();
    defaults.add(Signal::SIGPIPE);
    attr.set_sigdefault(&defaults)?;
    attr.set_flags(
        PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK | PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF,
    )?;
    let pid = nix::spawn::posix_spawn(program, &actions, &attr, &argv, &env)?;
    drop(moved);
    u32::try_from(pid.as_raw()).map_err(std::io::Error::other)
}

/// A shim this process started and owns: killed and reaped by pid, which stays its own until
/// [`ShimChild::wait`] reaps it (a child's pid is never reused before its parent reaps it).
/// Dropping it neither kills nor reaps (a shim left running detached outlives its handle).
#[derive(Debug)]
pub struct ShimChild {
    pid: u32,
    /// Set once reaped: from then on the pid may be anyone's.
    status: Option<ExitStatus>,
}

impl ShimChild {
    /// The handle of `pid`, a child of this process not reaped yet.
    pub(super) fn started(pid: u32) -> Self {
        Self { pid, status: None }
    }

    /// Its host pid.
    pub fn id(&self) -> u32 {
        self.pid
    }

    /// Sends it `SIGKILL`; nothing once it has been reaped.
    pub fn kill(&mut self) -> std::io::Result<()> {
        if self.status.is_some() {
            return Ok(());
        }
        let pid = nix::unistd::Pid::from_raw(self.pid as i32);
        nix::sys::signal::kill(pid, Signal::SIGKILL).map_err(std::io::Error::from)
    }

    /// A pidfd of it (readable once it has exited), for waiting without a thread.
    pub fn pidfd(&self) -> std::io::Result<OwnedFd> {
        if self.status.is_some() {
            return Err(std::io::Error::other("the process has been reaped"));
        }
        #[allow(unsafe_code)]
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; no
        // memory of this process is involved. The pid is this process's unreaped child, so
        // it names that child.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, self.pid, libc::PIDFD_NONBLOCK) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        #[allow(unsafe_code)]
        // SAFETY: the kernel just returned this descriptor; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(raw as RawFd) })
    }

    /// Waits for it and for every other child of this process in its process group, and
    /// reaps them all: a shim leads a group of its own (the spawner makes it), and the pid 1
    /// it forks is in it too, so a pid 1 whose pid was never said is reaped as well. The
    /// group's number stays taken while a member is left, and once none is, no new process
    /// gets it in the moment before the last wait (pids are handed out in turn).
    pub fn wait_with_process_group(self) {
        if self.status.is_some() {
            return;
        }
        let group = -(self.pid as libc::pid_t);
        loop {
            #[allow(unsafe_code)]
            // SAFETY: waitpid with a null status pointer writes nothing; the group is the
            // shim's own, pinned by its unreaped leader or by a member.
            let reaped = unsafe { libc::waitpid(group, std::ptr::null_mut(), 0) };
            if reaped > 0 {
                continue;
            }
            // ECHILD: none of them is left.
            if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                break;
            }
        }
    }

    /// Waits for it to exit and reaps it; its status again once reaped.
    pub fn wait(&mut self) -> std::io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let mut raw = 0;
        loop {
            #[allow(unsafe_code)]
            // SAFETY: waitpid writes the status into `raw`, a live local; the pid is this
            // process's unreaped child.
            let reaped = unsafe { libc::waitpid(self.pid as libc::pid_t, &mut raw, 0) };
            if reaped == self.pid as libc::pid_t {
                break;
            }
            let error = std::io::Error::last_os_error();
            if error.kind() != std::io::ErrorKind::Interrupted {
                return Err(error);
            }
        }
        let status = ExitStatus::from_raw(raw);
        self.status = Some(status);
        Ok(status)
    }
}

#[cfg(test)]
mod tests {
    use super::ShimChild;

    /// A shim killed after forking pid 1 and before saying its pid: pid 1 is this
    /// process's child all the same, and must not be left a zombie.
    #[test]
    fn a_pid_one_never_said_is_reaped_with_the_shims_process_group() {
        #[allow(unsafe_code)]
        // SAFETY: the child makes raw system calls only (setpgid, clone3, nanosleep, kill,
        // _exit), all async-signal-safe, on memory that is its own copy.
        let shim = unsafe { libc::fork() };
        if shim == 0 {
            #[allow(unsafe_code)]
            // SAFETY: as above.
            unsafe {
                libc::setpgid(0, 0);
                let mut args: libc::clone_args = std::mem::zeroed();
                args.flags = libc::CLONE_PARENT as u64;
                let pid_one = libc::syscall(
                    libc::SYS_clone3,
                    &mut args as *mut libc::clone_args,
                    size_of::<libc::clone_args>(),
                );
                if pid_one == 0 {
                    // pid 1 outlives its shim by a moment.
                    let pause = libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 200_000_000,
                    };
                    libc::nanosleep(&pause, std::ptr::null_mut());
                    libc::_exit(0);
                }
                libc::kill(libc::getpid(), libc::SIGKILL);
                libc::_exit(1);
            }
        }
        assert!(shim > 0, "fork: {}", std::io::Error::last_os_error());
        // As the spawner makes it: a group of its own before the supervisor hears of it.
        #[allow(unsafe_code)]
        // SAFETY: setpgid takes numbers only; the child has not executed anything.
        unsafe {
            libc::setpgid(shim, shim)
        };
        ShimChild::started(shim as u32).wait_with_process_group();
        // Nothing of this process's is left to reap, exited or running.
        #[allow(unsafe_code)]
        // SAFETY: all-zero is a valid `siginfo_t`, which waitid fills.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        #[allow(unsafe_code)]
        // SAFETY: waitid writes only into `info`, a live local.
        let left = unsafe {
            libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        let error = std::io::Error::last_os_error();
        assert_eq!(
            (left, error.raw_os_error()),
            (-1, Some(libc::ECHILD)),
            "a child is left"
        );
    }
}
