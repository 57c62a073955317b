//! Starting `tollgate-shim` in a sandbox's cgroup without copying the supervisor.
//!
//! A `fork` copies what the parent holds: its mappings and page tables (every thread's stack
//! is a mapping) and its descriptor table, and the child's `execve` tears the copy down again.
//! That cost grows with the supervisor, so with every live run. `posix_spawn` (glibc:
//! `clone(CLONE_VM | CLONE_VFORK)`) shares the parent's memory until the child has executed
//! the program, and copies nothing. It runs no code of ours in the child, so the child cannot
//! join its cgroup between fork and exec as a `pre_exec` hook did: the supervisor moves it in
//! after the exec, writing its pid into every hierarchy's `cgroup.procs`. The programs
//! started this way (`tollgate-shim`, `tollgate-shim enter`) do nothing before their first
//! message on the control socket, which their caller sends only once [`spawn_in_cgroup`] has
//! returned, so nothing of a sandbox ever runs outside its cgroup.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io::Write as _;
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
    /// A `cgroup.procs` file could not be opened (before anything was started).
    #[error("opening {file} to move the shim into its cgroup: {source}")]
    OpenCgroup {
        /// The `cgroup.procs` file.
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
    /// The started program could not be moved into its cgroup: it was killed and reaped
    /// before it built anything.
    #[error("moving {program} (pid {pid}) into its cgroup through {file}: {source} (it was killed before building anything); check that the cgroup still exists")]
    JoinCgroup {
        /// The program.
        program: PathBuf,
        /// Its pid, now reaped.
        pid: u32,
        /// The `cgroup.procs` file whose write failed.
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
            Self::Spawn { source, .. } => (source, true),
            Self::OpenCgroup { source, .. } | Self::JoinCgroup { source, .. } => (source, false),
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

/// The highest descriptor number a child gets placed.
const HIGHEST_PLACED: RawFd = PID_ONE_FD;

/// Starts `program` with `args`, an empty environment and `fds`, then moves it into the
/// cgroup whose `cgroup.procs` files are `procs` (every hierarchy). On success the child is
/// in its cgroup and waiting for its first message; on a failed move it has been killed and
/// reaped.
pub(crate) fn spawn_in_cgroup(
    program: &Path,
    args: &[&str],
    procs: &[PathBuf],
    fds: ChildFds<'_>,
) -> Result<ShimChild, SpawnError> {
    // Opened first: a cgroup that cannot be joined is found before anything starts.
    let procs_files = procs
        .iter()
        .map(|file| {
            OpenOptions::new()
                .write(true)
                .open(file)
                .map_err(|source| SpawnError::OpenCgroup {
                    file: file.clone(),
                    source,
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let spawn_error = |source: std::io::Error| SpawnError::Spawn {
        program: program.to_owned(),
        source,
    };
    let pid = spawn(program, args, fds).map_err(spawn_error)?;
    let mut child = ShimChild { pid, status: None };
    let digits = pid.to_string();
    for (file, path) in procs_files.iter().zip(procs) {
        // One write: the kernel reads a cgroup file's value from a single write.
        let written = (&*file).write(digits.as_bytes());
        let failure = match written {
            Ok(n) if n == digits.len() => continue,
            Ok(_) => std::io::Error::other("short write"),
            Err(e) => e,
        };
        // It has done nothing yet (it waits for its first message): end it here.
        let _ = child.kill();
        let _ = child.wait();
        tracing::warn!(pid, file = %path.display(), error = %failure, "a new shim could not join its cgroup; killed");
        return Err(SpawnError::JoinCgroup {
            program: program.to_owned(),
            pid,
            file: path.clone(),
            source: failure,
        });
    }
    Ok(child)
}

/// `posix_spawn` with the descriptors placed and the signal state reset as `std::process`
/// does (empty mask, `SIGPIPE` back to its default: the supervisor ignores it).
fn spawn(program: &Path, args: &[&str], fds: ChildFds<'_>) -> std::io::Result<u32> {
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
    use super::*;
    use std::os::fd::AsFd as _;
    use std::os::unix::net::UnixStream;

    fn fds<'a>(control: &'a UnixStream, out: &'a OwnedFd) -> ChildFds<'a> {
        ChildFds {
            control: control.as_fd(),
            pid_one: None,
            stdin: None,
            stdout: out.as_fd(),
            stderr: out.as_fd(),
        }
    }

    #[test]
    fn the_child_is_in_its_cgroup_before_spawn_returns_and_has_its_descriptors() {
        let dir = std::env::temp_dir().join(format!("tollgate-spawn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Stand-ins for two hierarchies' cgroup.procs files: what is written, and when.
        let procs = [dir.join("v1.procs"), dir.join("v2.procs")];
        for file in &procs {
            std::fs::write(file, b"").unwrap();
        }
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (mut read, write) = std::io::pipe().unwrap();
        let write = OwnedFd::from(write);
        // The child reports what it finds on fd 3 and its stdin only after its go-ahead.
        let script = "read go <&3; ls -l /proc/self/fd/0 | sed 's/.*-> //'; \
                      [ -S /proc/self/fd/3 ] || readlink /proc/self/fd/3; echo \"$go\"";
        let mut child = spawn_in_cgroup(
            Path::new("/bin/sh"),
            &["-c", script],
            &procs,
            fds(&theirs, &write),
        )
        .expect("spawns");
        drop((theirs, write));
        for file in &procs {
            assert_eq!(
                std::fs::read_to_string(file).unwrap(),
                child.id().to_string(),
                "the pid is written before the go-ahead can be sent"
            );
        }
        (&ours).write_all(b"go\n").unwrap();
        let mut output = String::new();
        std::io::Read::read_to_string(&mut read, &mut output).unwrap();
        assert!(child.wait().unwrap().success());
        assert_eq!(output, "/dev/null\ngo\n");
        // Reaped once: waiting again gives the same status, and a kill is a no-op.
        assert!(child.wait().unwrap().success());
        child.kill().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_cgroup_join_kills_and_reaps_the_child() {
        let (_ours, theirs) = UnixStream::pair().unwrap();
        let (_read, write) = std::io::pipe().unwrap();
        let write = OwnedFd::from(write);
        // Every write to /dev/full fails (ENOSPC), as a write to a removed cgroup would.
        let procs = [PathBuf::from("/dev/full")];
        let error = spawn_in_cgroup(
            Path::new("/bin/sleep"),
            &["1000"],
            &procs,
            fds(&theirs, &write),
        )
        .expect_err("the join fails");
        let SpawnError::JoinCgroup { pid, .. } = error else {
            panic!("not a join failure: {error}");
        };
        // Reaped: no longer this process's child (no zombie), and gone.
        #[allow(unsafe_code)]
        // SAFETY: waitpid with WNOHANG and a null status pointer touches no memory of ours.
        let waited =
            unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG) };
        assert_eq!(waited, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ECHILD)
        );
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists() || {
                // The pid was reused by another process: not the child's zombie.
                let status =
                    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                !status.contains(&format!("PPid:\t{}\n", std::process::id()))
            }
        );
    }

    #[test]
    fn an_unopenable_cgroup_starts_nothing() {
        let (_ours, theirs) = UnixStream::pair().unwrap();
        let (_read, write) = std::io::pipe().unwrap();
        let write = OwnedFd::from(write);
        let procs = [PathBuf::from("/nonexistent/tollgate/cgroup.procs")];
        let error = spawn_in_cgroup(Path::new("/bin/true"), &[], &procs, fds(&theirs, &write))
            .expect_err("nothing starts");
        assert!(matches!(error, SpawnError::OpenCgroup { .. }), "{error}");
    }
}
