//! Starting `tollgate-shim` in a sandbox's cgroup without copying the supervisor.
//!
//! A `fork` copies what the parent holds: its mappings and page tables (every thread's stack
//! is a mapping) and its descriptor table, and the child's `execve` tears the copy down again.
//! That cost grows with the supervisor, so with every live run. Even `posix_spawn` (glibc:
//! `clone(CLONE_VM | CLONE_VFORK)`), which shares the parent's memory, copies the descriptor
//! table (about three descriptors per live run, all close-on-exec, each closed again at the
//! `execve`). So the supervisor starts its children through a [`Spawner`]: a small process
//! (`tollgate-shim spawner`) started once, when the run manager is built and the table is
//! still small, that starts each child with `clone(CLONE_PARENT)`: the child is the
//! supervisor's child as if the supervisor had started it, with a copy of the spawner's few
//! descriptors.
//!
//! No code of ours runs in the child, so it cannot join its cgroup between fork and exec: the
//! supervisor moves it in after the exec, writing its pid into every hierarchy's
//! `cgroup.procs`. The programs started this way (`tollgate-shim`, `tollgate-shim enter`) do
//! nothing before their first message on the control socket, which their caller sends only
//! once [`spawn_in_cgroup`] has returned, so nothing of a sandbox ever runs outside its cgroup.

use std::fs::OpenOptions;
use std::io::{IoSlice, Write as _};
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use nix::errno::Errno;
use nix::sys::socket::{
    recv, sendmsg, socketpair, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType,
};
use tollgate_shim_protocol::spawner::{SpawnReply, SpawnRequest, REPLY_LEN};

use super::child::{posix_spawn, ChildFds, ShimChild, SpawnError};

/// Starts every shim and `exec` helper of a run manager through one spawner process
/// (`tollgate-shim spawner`), started with the spawner and restarted when it is found gone.
/// Starts are serialized on its socket: each is one request and one reply, and the spawner
/// answers once the child has executed its program.
#[derive(Debug)]
pub struct Spawner {
    shim: PathBuf,
    /// `None` until started, and after it was found gone.
    link: Mutex<Option<Link>>,
}

/// A running spawner and the supervisor's end of its socket.
#[derive(Debug)]
struct Link {
    process: ShimChild,
    socket: OwnedFd,
}

impl Spawner {
    /// Starts the spawner of `shim` (the `tollgate-shim` binary) now, while this process's
    /// descriptor table is small: a child gets a copy of its starter's table. If it cannot
    /// start, each start tries again and fails with [`SpawnError::StartSpawner`].
    pub fn start(shim: PathBuf) -> Self {
        let link = match Link::start(&shim) {
            Ok(link) => Some(link),
            Err(error) => {
                tracing::warn!(shim = %shim.display(), %error, "the spawner did not start; each sandbox start tries again");
                None
            }
        };
        Self {
            shim,
            link: Mutex::new(link),
        }
    }

    /// The `tollgate-shim` binary.
    pub fn shim(&self) -> &Path {
        &self.shim
    }

    /// Starts `program` with `args`, an empty environment and `fds`; its pid once it has
    /// executed the program. It is this process's child.
    fn spawn(&self, program: &Path, args: &[&str], fds: ChildFds<'_>) -> Result<u32, SpawnError> {
        let request = SpawnRequest {
            program: program.as_os_str().as_bytes().to_vec(),
            args: args.iter().map(|arg| arg.as_bytes().to_vec()).collect(),
            stdin: fds.stdin.is_some(),
            pid_one: fds.pid_one.is_some(),
        };
        // In the order of `SpawnRequest::fd_targets`.
        let attached: Vec<RawFd> = [Some(fds.stdout), Some(fds.stderr), Some(fds.control)]
            .into_iter()
            .chain([fds.stdin, fds.pid_one])
            .flatten()
            .map(|fd| fd.as_raw_fd())
            .collect();
        let message = request.encode();
        let lost = |source| SpawnError::SpawnerLost {
            program: program.to_owned(),
            source,
        };
        let mut link = self.link.lock().unwrap_or_else(PoisonError::into_inner);
        // A spawner found gone when the request is sent started nothing of it: one restart.
        for attempt in 0.. {
            let current = match link.take() {
                Some(current) => current,
                None => Link::start(&self.shim).map_err(|source| SpawnError::StartSpawner {
                    shim: self.shim.clone(),
                    source,
                })?,
            };
            match current.send(&message, &attached) {
                Ok(()) => {
                    *link = Some(current);
                    break;
                }
                Err(error) if attempt == 0 && is_gone(&error) => {
                    tracing::warn!(pid = current.process.id(), %error, "the spawner was gone; restarting it");
                    current.retire();
                }
                Err(error) => {
                    current.retire();
                    return Err(lost(error));
                }
            }
        }
        let reply = match link.as_ref().map(Link::receive) {
            Some(Ok(reply)) => reply,
            Some(Err(error)) => {
                if let Some(current) = link.take() {
                    tracing::warn!(pid = current.process.id(), %error, "the spawner went away during a start");
                    current.retire();
                }
                return Err(lost(error));
            }
            None => return Err(lost(std::io::ErrorKind::NotConnected.into())),
        };
        drop(link);
        let spawn_error = |source| SpawnError::Spawn {
            program: program.to_owned(),
            source,
        };
        let pid = u32::try_from(reply.pid).map_err(|_| {
            spawn_error(std::io::Error::other(format!(
                "the spawner answered pid {}",
                reply.pid
            )))
        })?;
        if reply.errno != 0 {
            // A child whose exec failed has exited; it is this process's to reap.
            if pid != 0 {
                let _ = ShimChild::started(pid).wait();
            }
            return Err(spawn_error(std::io::Error::from_raw_os_error(reply.errno)));
        }
        if pid == 0 {
            return Err(spawn_error(std::io::Error::other(
                "the spawner answered pid 0",
            )));
        }
        Ok(pid)
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        let link = self.link.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(link) = link.take() {
            link.retire();
        }
    }
}

/// Whether a failure to send means the spawner has gone away (its end of the socket closed).
fn is_gone(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EPIPE | libc::ECONNRESET | libc::ENOTCONN)
    )
}

impl Link {
    /// Starts `shim spawner` with its end of a new socket on fd 3, `/dev/null` on stdin and
    /// stdout, and this process's stderr (it says there why it ends, if not at end of file).
    fn start(shim: &Path) -> std::io::Result<Self> {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        let null = OpenOptions::new().write(true).open("/dev/null")?;
        let stderr = std::io::stderr();
        let fds = ChildFds {
            control: theirs.as_fd(),
            pid_one: None,
            stdin: None,
            stdout: null.as_fd(),
            stderr: stderr.as_fd(),
        };
        let pid = posix_spawn(shim, &["spawner"], fds)?;
        tracing::debug!(pid, "spawner started");
        Ok(Self {
            process: ShimChild::started(pid),
            socket: ours,
        })
    }

    /// Sends one request with its descriptors.
    fn send(&self, message: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
        let iov = [IoSlice::new(message)];
        let rights = [ControlMessage::ScmRights(fds)];
        loop {
            match sendmsg::<()>(
                self.socket.as_raw_fd(),
                &iov,
                &rights,
                MsgFlags::MSG_NOSIGNAL,
                None,
            ) {
                Ok(_) => return Ok(()),
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Waits for the reply to the request sent.
    fn receive(&self) -> std::io::Result<SpawnReply> {
        let mut reply = [0; REPLY_LEN + 1];
        let length = loop {
            match recv(self.socket.as_raw_fd(), &mut reply, MsgFlags::empty()) {
                Ok(length) => break length,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        };
        if length == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "its socket closed",
            ));
        }
        SpawnReply::decode(&reply[..length]).map_err(std::io::Error::other)
    }

    /// Ends the spawner (closing its socket first) and reaps it. The children it started
    /// are this process's and live on.
    fn retire(self) {
        let Self {
            mut process,
            socket,
        } = self;
        drop(socket);
        let _ = process.kill();
        let _ = process.wait();
    }
}

/// Starts `program` with `args`, an empty environment and `fds` through `spawner`, then moves
/// it into the cgroup whose `cgroup.procs` files are `procs` (every hierarchy). On success the
/// child is in its cgroup and waiting for its first message; on a failed move it has been
/// killed and reaped.
pub(crate) fn spawn_in_cgroup(
    spawner: &Spawner,
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
    let pid = spawner.spawn(program, args, fds)?;
    let mut child = ShimChild::started(pid);
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

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::Signal;
    use std::os::fd::FromRawFd as _;
    use std::os::unix::net::UnixStream;

    /// A spawner of the `tollgate-shim` built beside this test binary
    /// (`target/<profile>/deps/<test>` -> `target/<profile>/tollgate-shim`).
    fn spawner() -> Spawner {
        let exe = std::env::current_exe().unwrap();
        let mut dir = exe.parent().unwrap().to_path_buf();
        if dir.ends_with("deps") {
            dir.pop();
        }
        let shim = dir.join("tollgate-shim");
        assert!(
            shim.is_file(),
            "{} is missing: build it first (cargo build -p tollgate-agent-shim)",
            shim.display()
        );
        Spawner::start(shim)
    }

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
            &spawner(),
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

    /// The size of `pid`'s descriptor table (`FDSize:` in its status).
    fn fd_table_size(pid: u32) -> usize {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("FDSize:")).unwrap();
        line["FDSize:".len()..].trim().parse().unwrap()
    }

    #[test]
    fn a_child_gets_a_small_descriptor_table_however_many_the_supervisor_holds() {
        // Started with the run manager, before the table grows.
        let spawner = spawner();
        // What a supervisor with hundreds of live runs holds: descriptors, all close-on-exec.
        let null = std::fs::File::open("/dev/null").unwrap();
        let held: Vec<OwnedFd> = (0..1100)
            .map(|_| {
                let raw = nix::fcntl::fcntl(&null, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(0))
                    .expect("the test needs RLIMIT_NOFILE above 1,200");
                #[allow(unsafe_code)]
                // SAFETY: fcntl just returned this new descriptor; nothing else owns it.
                unsafe {
                    OwnedFd::from_raw_fd(raw)
                }
            })
            .collect();
        let dir = std::env::temp_dir().join(format!("tollgate-spawn-fds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let procs = [dir.join("procs")];
        std::fs::write(&procs[0], b"").unwrap();
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (_read, write) = std::io::pipe().unwrap();
        let write = OwnedFd::from(write);
        // It waits for its go-ahead, as a shim does, and ends with it.
        let mut child = spawn_in_cgroup(
            &spawner,
            Path::new("/bin/sh"),
            &["-c", "read go <&3"],
            &procs,
            fds(&theirs, &write),
        )
        .expect("spawns");
        drop((theirs, write));
        let size = fd_table_size(child.id());
        drop(held);
        (&ours).write_all(b"go\n").unwrap();
        assert!(child.wait().unwrap().success());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            size <= 64,
            "the child inherited a table of {size} descriptors from its starter"
        );
    }

    #[test]
    fn a_failed_cgroup_join_kills_and_reaps_the_child() {
        let (_ours, theirs) = UnixStream::pair().unwrap();
        let (_read, write) = std::io::pipe().unwrap();
        let write = OwnedFd::from(write);
        // Every write to /dev/full fails (ENOSPC), as a write to a removed cgroup would.
        let procs = [PathBuf::from("/dev/full")];
        let error = spawn_in_cgroup(
            &spawner(),
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
        let error = spawn_in_cgroup(
            &spawner(),
            Path::new("/bin/true"),
            &[],
            &procs,
            fds(&theirs, &write),
        )
        .expect_err("nothing starts");
        assert!(matches!(error, SpawnError::OpenCgroup { .. }), "{error}");
    }

    /// The signals `pid` blocks and ignores (`SigBlk:`, `SigIgn:` in its status).
    fn signal_masks(pid: u32) -> (String, String) {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let field = |name: &str| {
            let line = status.lines().find(|l| l.starts_with(name)).unwrap();
            line[name.len()..].trim().to_owned()
        };
        (field("SigBlk:"), field("SigIgn:"))
    }

    #[test]
    fn a_child_blocks_and_ignores_no_signal() {
        let spawner = spawner();
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (_read, write) = std::io::pipe().unwrap();
        let write = OwnedFd::from(write);
        // sleep sets no signal disposition of its own: what it shows is what it inherited.
        let mut child = spawner
            .spawn(Path::new("/bin/sleep"), &["1000"], fds(&theirs, &write))
            .map(ShimChild::started)
            .expect("spawns");
        let masks = signal_masks(child.id());
        child.kill().unwrap();
        child.wait().unwrap();
        drop(ours);
        let nothing = "0000000000000000".to_owned();
        assert_eq!(masks, (nothing.clone(), nothing));
    }

    #[test]
    fn a_program_that_cannot_run_is_a_spawn_error_and_leaves_no_child() {
        let spawner = spawner();
        let (_ours, theirs) = UnixStream::pair().unwrap();
        let (_read, write) = std::io::pipe().unwrap();
        let write = OwnedFd::from(write);
        let error = spawner
            .spawn(Path::new("/nonexistent/program"), &[], fds(&theirs, &write))
            .expect_err("nothing runs");
        let SpawnError::Spawn { source, .. } = &error else {
            panic!("not a spawn failure: {error}");
        };
        assert_eq!(source.raw_os_error(), Some(libc::ENOENT), "{error}");
        // The spawner still serves.
        let mut child = spawner
            .spawn(Path::new("/bin/true"), &[], fds(&theirs, &write))
            .map(ShimChild::started)
            .expect("spawns");
        assert!(child.wait().unwrap().success());
    }

    #[test]
    fn a_spawner_that_died_is_restarted_by_the_next_start() {
        let spawner = spawner();
        let first = {
            let link = spawner.link.lock().unwrap();
            link.as_ref().expect("started").process.id()
        };
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(first as i32), Signal::SIGKILL).unwrap();
        // Until it has exited (its socket closed), left unreaped for the spawner to reap.
        #[allow(unsafe_code)]
        // SAFETY: waitid writes into `info`, a live local; WNOWAIT leaves the child unreaped.
        let waited = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(libc::P_PID, first, &mut info, libc::WEXITED | libc::WNOWAIT)
        };
        assert_eq!(waited, 0);
        let (_ours, theirs) = UnixStream::pair().unwrap();
        let (_read, write) = std::io::pipe().unwrap();
        let write = OwnedFd::from(write);
        let mut child = spawner
            .spawn(Path::new("/bin/true"), &[], fds(&theirs, &write))
            .map(ShimChild::started)
            .expect("the next start restarts the spawner");
        assert!(child.wait().unwrap().success());
        let second = spawner.link.lock().unwrap().as_ref().unwrap().process.id();
        assert_ne!(first, second);
    }

    #[test]
    fn a_missing_shim_is_a_start_spawner_error() {
        let spawner = Spawner::start(PathBuf::from("/nonexistent/tollgate-shim"));
        let (_ours, theirs) = UnixStream::pair().unwrap();
        let (_read, write) = std::io::pipe().unwrap();
        let write = OwnedFd::from(write);
        let error = spawner
            .spawn(Path::new("/bin/true"), &[], fds(&theirs, &write))
            .expect_err("no spawner");
        assert!(matches!(error, SpawnError::StartSpawner { .. }), "{error}");
    }

    #[test]
    fn concurrent_starts_each_get_their_own_child() {
        let spawner = spawner();
        let pids = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..8)
                .map(|_| {
                    scope.spawn(|| {
                        (0..4)
                            .map(|_| {
                                let (_ours, theirs) = UnixStream::pair().unwrap();
                                let (_read, write) = std::io::pipe().unwrap();
                                let write = OwnedFd::from(write);
                                let mut child = spawner
                                    .spawn(Path::new("/bin/true"), &[], fds(&theirs, &write))
                                    .map(ShimChild::started)
                                    .expect("spawns");
                                assert!(child.wait().unwrap().success());
                                child.id()
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|worker| worker.join().unwrap())
                .collect::<Vec<_>>()
        });
        assert_eq!(pids.len(), 32);
    }

    #[test]
    fn the_spawner_ends_when_the_supervisor_closes_its_socket() {
        let spawner = spawner();
        let Link {
            mut process,
            socket,
        } = spawner.link.lock().unwrap().take().expect("started");
        // What the kernel does to every descriptor of a supervisor that dies.
        drop(socket);
        let status = process.wait().unwrap();
        assert_eq!(status.code(), Some(0), "{status:?}");
    }
}
