//! Starting `tollgate-shim` in a sandbox's cgroup without copying the supervisor.
//!
//! A `fork` copies what the parent holds: its mappings and page tables (every thread's stack
//! is a mapping) and its descriptor table, and the child's `execve` tears the copy down again.
//! That cost grows with the supervisor, so with every live run. Even `posix_spawn` (glibc:
//! `clone(CLONE_VM | CLONE_VFORK)`), which shares the parent's memory, copies the descriptor
//! table (about three descriptors per live run, all close-on-exec, each closed again at the
//! `execve`). So the supervisor starts its children through a [`Spawner`]: a small process
//! (`tollgate-shim spawner`) started once, when the run manager is built and the table is
//! still small, that starts each child with `clone3(CLONE_PARENT)`: the child is the
//! supervisor's child as if the supervisor had started it, with a copy of the spawner's few
//! descriptors.
//!
//! The child joins its run's cgroup before it runs anything ([`CgroupJoin`]): it is created
//! in the v2 directory and moves itself into each v1 hierarchy, so nothing of a sandbox ever
//! runs outside its cgroup. (Moving it in by pid from here, after the exec, took the kernel's
//! threadgroup lock for writing on every hierarchy: an RCU grace period, 11–15 ms, on some
//! starts.) The shim and `tollgate-shim enter` then run in place, in the child's copy of the
//! spawner (the binary is not executed again: see the spawner's docs). They still do nothing
//! before their first message on the control socket, which their caller sends once
//! [`spawn_in_cgroup`] has returned.

use std::fs::OpenOptions;
use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd as _, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use nix::errno::Errno;
use nix::sys::socket::{
    recv, sendmsg, socketpair, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType,
};
use tollgate_shim_protocol::plan::SandboxBase;
use tollgate_shim_protocol::spawner::{
    SpawnReply, SpawnRequest, BASE_READY, MAX_JOIN_TASKS, MAX_REQUEST, NO_BASE, REPLY_LEN,
};

use super::child::{posix_spawn, ChildFds, ShimChild, SpawnError};
use crate::cgroup::CgroupJoin;

/// Starts every shim and `exec` helper of a run manager through one spawner process
/// (`tollgate-shim spawner`), started with the spawner and restarted when it is found gone.
/// Starts are serialized on its socket: each is one request and one reply, and the spawner
/// answers once the child has executed its program.
#[derive(Debug)]
pub struct Spawner {
    shim: PathBuf,
    /// What every sandbox shares: the spawner makes the sandboxes' base mount namespace
    /// from it, and starts every shim there.
    base: SandboxBase,
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
    /// descriptor table is small: a child gets a copy of its starter's table. The spawner
    /// makes the base mount namespace of `base`'s sandboxes, where every shim starts (its
    /// `root_dir` must exist). If it cannot start, each start tries again and fails with
    /// [`SpawnError::StartSpawner`] or [`SpawnError::SpawnerBase`].
    pub fn start(shim: PathBuf, base: SandboxBase) -> Self {
        let link = match Link::start(&shim, &base) {
            Ok(link) => Some(link),
            Err(error) => {
                tracing::warn!(shim = %shim.display(), %error, "the spawner did not start; each sandbox start tries again");
                None
            }
        };
        Self {
            shim,
            base,
            link: Mutex::new(link),
        }
    }

    /// The `tollgate-shim` binary.
    pub fn shim(&self) -> &Path {
        &self.shim
    }

    /// Starts `program` with `args`, an empty environment and `fds`, in the cgroup `join`
    /// names; its pid once it is ready (it has executed the program, or, for the shim's own
    /// entry points, started in place). It is this process's child.
    fn spawn(
        &self,
        program: &Path,
        args: &[&str],
        fds: ChildFds<'_>,
        join: &CgroupJoin,
    ) -> Result<u32, SpawnError> {
        // Opened first: a cgroup that cannot be joined is found before anything starts.
        let opened = OpenedJoin::open(join)?;
        let request = SpawnRequest {
            program: program.as_os_str().as_bytes().to_vec(),
            args: args.iter().map(|arg| arg.as_bytes().to_vec()).collect(),
            stdin: fds.stdin.is_some(),
            pid_one: fds.pid_one.is_some(),
            join_tasks: opened.tasks.len() as u8,
            join_dir: opened.dir.is_some(),
            // The spawner is this very binary, loaded and relocated once: its children run
            // the shim's entry points (the shim, `enter`) without executing it again.
            in_place: program == self.shim && matches!(args, [] | ["enter"]),
        };
        // In the order of `SpawnRequest::fd_targets`, then the cgroup's.
        let attached: Vec<RawFd> = [Some(fds.stdout), Some(fds.stderr), Some(fds.control)]
            .into_iter()
            .chain([fds.stdin, fds.pid_one])
            .flatten()
            .chain(opened.tasks.iter().map(AsFd::as_fd))
            .chain(opened.dir.as_ref().map(AsFd::as_fd))
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
                None => Link::start(&self.shim, &self.base)?,
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
        drop((link, opened));
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
            // A child that failed before its exec has exited; it is this process's to reap.
            if pid != 0 {
                let _ = ShimChild::started(pid).wait();
            }
            let source = std::io::Error::from_raw_os_error(reply.errno);
            if reply.failed_join == NO_BASE {
                return Err(SpawnError::EnterBase {
                    program: program.to_owned(),
                    source,
                });
            }
            if let Some(file) = usize::try_from(reply.failed_join)
                .ok()
                .and_then(|index| join.v1_tasks.iter().chain(&join.v2_dir).nth(index))
            {
                tracing::warn!(pid, file = %file.display(), error = %source, "a new child could not join its cgroup");
                return Err(SpawnError::JoinCgroup {
                    program: program.to_owned(),
                    pid: (pid != 0).then_some(pid),
                    file: file.clone(),
                    source,
                });
            }
            return Err(spawn_error(source));
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
    /// stdout, and this process's stderr (it says there why it ends, if not at end of file),
    /// and waits for it to make the sandboxes' base mount namespace of `base`.
    fn start(shim: &Path, base: &SandboxBase) -> Result<Self, SpawnError> {
        let start_error = |source| SpawnError::StartSpawner {
            shim: shim.to_owned(),
            source,
        };
        let link = Self::spawn(shim).map_err(start_error)?;
        let answer = serde_json::to_vec(base)
            .map_err(std::io::Error::other)
            .and_then(|message| link.send(&message, &[]))
            .and_then(|()| link.receive_message(MAX_REQUEST));
        match answer {
            Ok(answer) if answer == BASE_READY => Ok(link),
            Ok(answer) => {
                link.retire();
                Err(SpawnError::SpawnerBase {
                    shim: shim.to_owned(),
                    source: std::io::Error::other(String::from_utf8_lossy(&answer).into_owned()),
                })
            }
            Err(source) => {
                link.retire();
                Err(start_error(source))
            }
        }
    }

    /// Starts the process (see [`Link::start`]).
    fn spawn(shim: &Path) -> std::io::Result<Self> {
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
        let reply = self.receive_message(REPLY_LEN + 1)?;
        SpawnReply::decode(&reply).map_err(std::io::Error::other)
    }

    /// Waits for the spawner's next message (at most `limit` bytes are kept).
    fn receive_message(&self, limit: usize) -> std::io::Result<Vec<u8>> {
        let mut message = vec![0; limit];
        let length = loop {
            match recv(self.socket.as_raw_fd(), &mut message, MsgFlags::empty()) {
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
        message.truncate(length);
        Ok(message)
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

/// A run's cgroup opened for a child to join: each v1 `tasks` file for writing, the v2
/// directory for `CLONE_INTO_CGROUP`.
struct OpenedJoin {
    tasks: Vec<OwnedFd>,
    dir: Option<OwnedFd>,
}

impl OpenedJoin {
    fn open(join: &CgroupJoin) -> Result<Self, SpawnError> {
        let failed = |file: &Path| {
            let file = file.to_owned();
            move |source| SpawnError::OpenCgroup { file, source }
        };
        if join.v1_tasks.len() > MAX_JOIN_TASKS {
            return Err(failed(&join.v1_tasks[MAX_JOIN_TASKS])(
                std::io::Error::other(format!(
                    "more than {MAX_JOIN_TASKS} cgroup v1 hierarchies to join"
                )),
            ));
        }
        let tasks = join
            .v1_tasks
            .iter()
            .map(|file| {
                OpenOptions::new()
                    .write(true)
                    .open(file)
                    .map(OwnedFd::from)
                    .map_err(failed(file))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let dir = join
            .v2_dir
            .as_ref()
            .map(|dir| {
                OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_DIRECTORY)
                    .open(dir)
                    .map(OwnedFd::from)
                    .map_err(failed(dir))
            })
            .transpose()?;
        Ok(Self { tasks, dir })
    }
}

/// Starts `program` with `args`, an empty environment and `fds` through `spawner`, in the
/// cgroup `join` names in every hierarchy. On success the child is in its cgroup and has
/// executed the program; on a failed join it never ran (and is reaped).
pub(crate) fn spawn_in_cgroup(
    spawner: &Spawner,
    program: &Path,
    args: &[&str],
    join: &CgroupJoin,
    fds: ChildFds<'_>,
) -> Result<ShimChild, SpawnError> {
    spawner
        .spawn(program, args, fds, join)
        .map(ShimChild::started)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::{sweep, RunCgroup};
    use nix::sys::signal::Signal;
    use std::io::{PipeReader, Read as _, Write as _};
    use std::os::fd::FromRawFd as _;
    use std::os::unix::net::UnixStream;

    /// A spawner of the `tollgate-shim` built beside this test binary
    /// (`target/<profile>/deps/<test>` -> `target/<profile>/tollgate-shim`), with an empty
    /// directory of its own for the base's mount point (the base covers whatever is beneath
    /// it, inside the spawner's namespace), removed when dropped.
    fn spawner() -> TestSpawner {
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
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let mount_point = std::env::temp_dir().join(format!(
            "tollgate-spawn-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        std::fs::create_dir(&mount_point).unwrap();
        let spawner = Spawner::start(shim.clone(), test_base(&shim, &mount_point));
        TestSpawner {
            spawner: Some(spawner),
            mount_point,
        }
    }

    /// A test's spawner and its base's mount point.
    struct TestSpawner {
        spawner: Option<Spawner>,
        mount_point: PathBuf,
    }

    impl std::ops::Deref for TestSpawner {
        type Target = Spawner;

        fn deref(&self) -> &Spawner {
            self.spawner.as_ref().expect("until dropped")
        }
    }

    impl Drop for TestSpawner {
        fn drop(&mut self) {
            drop(self.spawner.take());
            if let Err(e) = std::fs::remove_dir(&self.mount_point) {
                eprintln!("removing {}: {e}", self.mount_point.display());
            }
        }
    }

    /// A base for the tests' spawners, on the empty directory `mount_point`.
    fn test_base(shim: &Path, mount_point: &Path) -> SandboxBase {
        let mut base = crate::sandbox::sandbox_base(&std::env::temp_dir(), shim);
        base.root_dir = mount_point.to_owned();
        base
    }

    /// A child's ends: its control socket and one pipe for its stdout and stderr; the test
    /// keeps `ours` and `output`.
    struct Ends {
        ours: UnixStream,
        theirs: UnixStream,
        output: PipeReader,
        write: OwnedFd,
    }

    impl Ends {
        fn new() -> Self {
            let (ours, theirs) = UnixStream::pair().unwrap();
            let (output, write) = std::io::pipe().unwrap();
            Self {
                ours,
                theirs,
                output,
                write: write.into(),
            }
        }

        fn fds(&self) -> ChildFds<'_> {
            ChildFds {
                control: self.theirs.as_fd(),
                pid_one: None,
                stdin: None,
                stdout: self.write.as_fd(),
                stderr: self.write.as_fd(),
            }
        }

        /// Only the child holds its ends now: the output ends when it does.
        fn handed_over(self) -> (UnixStream, PipeReader) {
            (self.ours, self.output)
        }
    }

    /// No cgroup to join.
    fn nowhere() -> CgroupJoin {
        CgroupJoin::default()
    }

    /// Starts `/bin/true` through `spawner` and waits for its success; its pid.
    fn run_true(spawner: &Spawner) -> u32 {
        let mut child = start_true(spawner, &nowhere()).expect("spawns");
        assert!(child.wait().unwrap().success());
        child.id()
    }

    /// Starts `/bin/true` through `spawner` in `join`'s cgroup.
    fn start_true(spawner: &Spawner, join: &CgroupJoin) -> Result<ShimChild, SpawnError> {
        let ends = Ends::new();
        spawn_in_cgroup(spawner, Path::new("/bin/true"), &[], join, ends.fds())
    }

    /// A real run cgroup for one test (root; every hierarchy the host has), removed with
    /// whatever is in it when dropped, even when the test fails.
    struct TestCgroup {
        parent: String,
        cgroup: RunCgroup,
    }

    impl TestCgroup {
        fn new(test: &str) -> Self {
            let parent = format!("tollgate-test-{}-{test}", std::process::id());
            let cgroup = RunCgroup::create_unlimited(&format!("{parent}/run")).unwrap();
            Self { parent, cgroup }
        }
    }

    impl Drop for TestCgroup {
        fn drop(&mut self) {
            if let Err(e) = sweep(&self.parent, true) {
                eprintln!("cleanup of {} failed: {e}", self.parent);
            }
        }
    }

    #[test]
    fn the_child_runs_in_its_cgroup_from_its_first_instruction() {
        let test = TestCgroup::new("spawn-join");
        let join = test.cgroup.join();
        let ends = Ends::new();
        // Its first act is to say where it is; then what it holds, then its go-ahead.
        // (`ls` of the shell's descriptors alone, outside a pipeline: a pipeline's own pipe
        // would be listed.)
        let script = "cat /proc/self/cgroup; ls /proc/$$/fd; \
                      ls -l /proc/self/fd/0 | sed 's/.*-> //'; read go <&3; echo \"$go\"";
        let mut child = spawn_in_cgroup(
            &spawner(),
            Path::new("/bin/sh"),
            &["-c", script],
            &join,
            ends.fds(),
        )
        .expect("spawns");
        let (mut ours, mut output) = ends.handed_over();
        ours.write_all(b"go\n").unwrap();
        let mut text = String::new();
        output.read_to_string(&mut text).unwrap();
        assert!(child.wait().unwrap().success(), "{text}");
        // One line per hierarchy (co-mounted v1 controllers share one).
        let mut v1_dirs: Vec<&Path> = join.v1_tasks.iter().filter_map(|t| t.parent()).collect();
        v1_dirs.sort();
        v1_dirs.dedup();
        let hierarchies = v1_dirs.len() + usize::from(join.v2_dir.is_some());
        let inside = format!(":/{}", test.cgroup.relative());
        let joined = text.lines().filter(|line| line.ends_with(&inside)).count();
        assert!(hierarchies > 0);
        assert_eq!(
            joined, hierarchies,
            "not in its cgroup in every hierarchy when it first ran:\n{text}"
        );
        // Nothing of the cgroup's descriptors (or the spawner's) reached it.
        let rest: Vec<&str> = text.lines().filter(|line| !line.contains(":/")).collect();
        assert_eq!(rest, ["0", "1", "2", "3", "/dev/null", "go"], "{text}");
    }

    #[test]
    fn the_shim_starts_in_place_with_what_an_exec_would_have_given_it() {
        let test = TestCgroup::new("spawn-in-place");
        let join = test.cgroup.join();
        let spawner = spawner();
        let ends = Ends::new();
        // The shim itself: it waits for its go-ahead on fd 3, as it would after an exec.
        let mut child =
            spawn_in_cgroup(&spawner, spawner.shim(), &[], &join, ends.fds()).expect("spawns");
        let (ours, _output) = ends.handed_over();
        let proc = PathBuf::from(format!("/proc/{}", child.id()));
        let cgroups = std::fs::read_to_string(proc.join("cgroup")).unwrap();
        let cmdline = std::fs::read(proc.join("cmdline")).unwrap();
        let environ = std::fs::read(proc.join("environ")).unwrap();
        let mut fds: Vec<String> = std::fs::read_dir(proc.join("fd"))
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        fds.sort();
        let masks = signal_masks(child.id());
        // Without its go-ahead the shim ends (its socket closed) having built nothing.
        drop(ours);
        assert!(!child.wait().unwrap().success());
        let inside = format!(":/{}", test.cgroup.relative());
        assert!(
            cgroups.lines().any(|line| line.ends_with(&inside)),
            "{cgroups}"
        );
        // Its own command line, not the spawner's (`ps` shows NULs as spaces).
        let shown = cmdline.split(|&b| b == 0).next().unwrap();
        assert_eq!(shown, spawner.shim().as_os_str().as_bytes());
        assert!(
            cmdline[shown.len()..].iter().all(|&b| b == 0),
            "{}",
            String::from_utf8_lossy(&cmdline)
        );
        assert!(environ.is_empty());
        // 4, once it has made it, is its own second handle on the control socket, for writing.
        assert!(
            fds == ["0", "1", "2", "3"] || fds == ["0", "1", "2", "3", "4"],
            "{fds:?}"
        );
        // Blocks nothing; ignores SIGPIPE only, as every Rust program starts.
        assert_eq!(
            masks,
            ("0000000000000000".to_owned(), "0000000000001000".to_owned())
        );
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
        let ends = Ends::new();
        // It waits for its go-ahead, as a shim does, and ends with it.
        let mut child = spawn_in_cgroup(
            &spawner,
            Path::new("/bin/sh"),
            &["-c", "read go <&3"],
            &nowhere(),
            ends.fds(),
        )
        .expect("spawns");
        let (mut ours, _output) = ends.handed_over();
        let size = fd_table_size(child.id());
        drop(held);
        ours.write_all(b"go\n").unwrap();
        assert!(child.wait().unwrap().success());
        assert!(
            size <= 64,
            "the child inherited a table of {size} descriptors from its starter"
        );
    }

    /// Whether `pid` is gone as this process's child: reaped (no zombie left).
    fn reaped(pid: u32) -> bool {
        #[allow(unsafe_code)]
        // SAFETY: waitpid with WNOHANG and a null status pointer touches no memory of ours.
        let waited =
            unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG) };
        waited == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD)
    }

    #[test]
    fn a_failed_v1_join_never_runs_the_program_and_leaves_no_child() {
        let ends = Ends::new();
        let marker =
            std::env::temp_dir().join(format!("tollgate-spawn-ran-{}", std::process::id()));
        // Every write to /dev/full fails (ENOSPC), as a write to a removed cgroup would.
        let join = CgroupJoin {
            v1_tasks: vec![PathBuf::from("/dev/null"), PathBuf::from("/dev/full")],
            v2_dir: None,
        };
        let error = spawn_in_cgroup(
            &spawner(),
            Path::new("/bin/touch"),
            &[marker.to_str().unwrap()],
            &join,
            ends.fds(),
        )
        .expect_err("the join fails");
        let SpawnError::JoinCgroup {
            pid: Some(pid),
            file,
            source,
            ..
        } = error
        else {
            panic!("not a failed join of a started child: {error}");
        };
        assert_eq!(file, Path::new("/dev/full"));
        assert_eq!(source.raw_os_error(), Some(libc::ENOSPC));
        assert!(reaped(pid));
        assert!(!marker.exists(), "the program ran outside its cgroup");
    }

    #[test]
    fn a_v2_directory_that_cannot_be_joined_starts_nothing() {
        // A directory, but not a cgroup v2 one: the kernel refuses to create the child in it.
        let dir = std::env::temp_dir();
        let join = CgroupJoin {
            v1_tasks: Vec::new(),
            v2_dir: Some(dir.clone()),
        };
        let error = start_true(&spawner(), &join).expect_err("nothing starts");
        let SpawnError::JoinCgroup {
            pid: None, file, ..
        } = &error
        else {
            panic!("not a failed v2 join: {error}");
        };
        assert_eq!(file, &dir);
    }

    #[test]
    fn an_unopenable_cgroup_starts_nothing() {
        let join = CgroupJoin {
            v1_tasks: vec![PathBuf::from("/nonexistent/tollgate/tasks")],
            v2_dir: None,
        };
        let error = start_true(&spawner(), &join).expect_err("nothing starts");
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
        let ends = Ends::new();
        // sleep sets no signal disposition of its own: what it shows is what it inherited.
        let mut child = spawn_in_cgroup(
            &spawner(),
            Path::new("/bin/sleep"),
            &["1000"],
            &nowhere(),
            ends.fds(),
        )
        .expect("spawns");
        let masks = signal_masks(child.id());
        child.kill().unwrap();
        child.wait().unwrap();
        let nothing = "0000000000000000".to_owned();
        assert_eq!(masks, (nothing.clone(), nothing));
    }

    #[test]
    fn a_program_that_cannot_run_is_a_spawn_error_and_leaves_no_child() {
        let spawner = spawner();
        let ends = Ends::new();
        let error = spawn_in_cgroup(
            &spawner,
            Path::new("/nonexistent/program"),
            &[],
            &nowhere(),
            ends.fds(),
        )
        .expect_err("nothing runs");
        let SpawnError::Spawn { source, .. } = &error else {
            panic!("not a spawn failure: {error}");
        };
        assert_eq!(source.raw_os_error(), Some(libc::ENOENT), "{error}");
        // The spawner still serves.
        run_true(&spawner);
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
        // The next start restarts the spawner.
        run_true(&spawner);
        let second = spawner.link.lock().unwrap().as_ref().unwrap().process.id();
        assert_ne!(first, second);
    }

    #[test]
    fn a_missing_shim_is_a_start_spawner_error() {
        let shim = PathBuf::from("/nonexistent/tollgate-shim");
        let spawner = Spawner::start(shim.clone(), test_base(&shim, Path::new("/nonexistent")));
        let error = start_true(&spawner, &nowhere()).expect_err("no spawner");
        assert!(matches!(error, SpawnError::StartSpawner { .. }), "{error}");
    }

    /// A spawner that cannot make the sandboxes' base says why, starts nothing, and is gone:
    /// each start tries again and fails the same way, naming the step.
    #[test]
    fn a_base_that_cannot_be_made_is_a_spawner_base_error_and_starts_nothing() {
        let shim = spawner().shim().to_owned();
        let mut base = test_base(&shim, Path::new("/nonexistent"));
        base.root_dir = PathBuf::from("/nonexistent/tollgate-root");
        let spawner = Spawner::start(shim, base);
        assert!(spawner.link.lock().unwrap().is_none(), "no spawner is kept");
        for _ in 0..2 {
            let error = start_true(&spawner, &nowhere()).expect_err("no base");
            assert!(matches!(error, SpawnError::SpawnerBase { .. }), "{error}");
            let text = error.to_string();
            assert!(
                text.contains("base mount namespace")
                    && text.contains("/nonexistent/tollgate-root"),
                "{text}"
            );
        }
    }

    #[test]
    fn concurrent_starts_each_get_their_own_child() {
        let spawner = spawner();
        let pids = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..8)
                .map(|_| scope.spawn(|| (0..4).map(|_| run_true(&spawner)).collect::<Vec<_>>()))
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
