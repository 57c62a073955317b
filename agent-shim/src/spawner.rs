//! `tollgate-shim spawner`: the process that starts every shim and `exec` helper for the
//! supervisor (internal; the supervisor starts it once, with its socket on fd 3).
//!
//! A child gets a copy of its starter's descriptor table, sized to the highest descriptor
//! open, and closes each close-on-exec one again at `execve`. Started from the supervisor,
//! which holds about three descriptors per live run, that cost grew with every live run; the
//! spawner holds a handful. It starts each child with `clone3(CLONE_PARENT)`, so the child is
//! the supervisor's child exactly as if the supervisor had started it (the supervisor reaps
//! it and watches it through a pidfd). The reply is sent once the child is ready, or with the
//! errno of the step that failed (it comes back on a close-on-exec pipe): a child that
//! executes a program is started with `CLONE_VFORK`, so this process waits for its exec.
//!
//! The child joins its run's cgroup before it executes anything: it is created in the cgroup
//! v2 directory (`CLONE_INTO_CGROUP`), and it writes `0` to each cgroup v1 hierarchy's `tasks`
//! file. Both are the kernel's cheap paths: moving a process by pid (`cgroup.procs`) takes
//! the kernel's threadgroup lock for writing, which can wait for a whole RCU grace period
//! (11–15 ms measured) while holding the lock every other cgroup move needs; a
//! single-threaded task moving itself through `tasks` does not take it.
//!
//! A child that is to run `tollgate-shim` itself (the shim, or `tollgate-shim enter`) is
//! started in place ([`SpawnRequest::in_place`]): it runs the entry point in its copy of this
//! process, which loaded and relocated the binary once, instead of executing it again (about
//! a millisecond of every sandbox's start). It gets what an exec would have given it: its
//! cgroup, its descriptors and nothing else of ours, every signal at its default (SIGPIPE
//! ignored, as every Rust program starts), an empty environment, and its own command line in
//! `ps`. What it shares with the spawner and every other shim is the binary's address layout:
//! the shims take no input from inside a sandbox but their control socket's messages and the
//! gateway connections they pass on unread, and every program they start is executed afresh.
//!
//! Single-threaded, so the clone is an ordinary fork: no other thread can hold a lock the
//! child might need, and the child makes only async-signal-safe calls before `execve` or
//! its entry point. A child started in place then runs ordinary Rust code, as after `fork`,
//! with one difference: the clone is the raw system call, so the C library's record of the
//! thread's id is still the spawner's. The shim uses nothing that reads it (no threads of
//! its own; Rust's locks are futexes; the C library's `raise` and `fork` ask the kernel).
//!
//! Before its first request it makes the sandboxes' base mount namespace, from the
//! [`SandboxBase`] the supervisor sends first (see `setup::make_base`), and answers that it
//! is ready or why it could not be; it then returns to the host's namespace. A shim (started
//! in place without arguments) enters the base before anything else, so its sandbox's mount
//! namespace is a copy of the base, not of the host's: nothing of the host's tree needs
//! cutting away with `pivot_root` on each start. `enter` helpers and programs executed start
//! in the host's namespace.
//!
//! It ends when the supervisor closes its end of the socket, which the kernel does when the
//! supervisor dies however it dies. No `PR_SET_PDEATHSIG`: it fires when the *thread* that
//! started this process exits, and the supervisor may start (or restart) its spawner from a
//! pooled thread that retires long before the supervisor does.

use std::ffi::{c_char, CString};
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::ptr;

use nix::errno::Errno;
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::sys::socket::{recvmsg, send, ControlMessageOwned, MsgFlags};
use tollgate_shim_protocol::plan::SandboxBase;
use tollgate_shim_protocol::protocol::PID_ONE_FD;
use tollgate_shim_protocol::spawner::{
    SpawnReply, SpawnRequest, BASE_READY, MAX_FDS, MAX_REQUEST, NO_BASE, NO_JOIN, SPAWNER_FD,
};

/// `clone3`'s flag to create the child in the cgroup v2 directory given in its arguments
/// (Linux 5.7); 64 bits wide, so not in every C library's headers.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// The entry points of `tollgate-shim` a child started in place runs (see
/// [`SpawnRequest::in_place`]).
#[derive(Debug, Clone, Copy)]
pub struct Entries {
    /// `tollgate-shim` without arguments: a sandbox's shim.
    pub shim: fn() -> !,
    /// `tollgate-shim enter`: one command inside a live sandbox.
    pub enter: fn() -> !,
}

/// Serves start requests on fd 3 until the supervisor closes its end; the exit code.
pub fn main(entries: Entries) -> i32 {
    #[allow(unsafe_code)]
    // SAFETY: fd 3 is the socket the supervisor placed for this mode; nothing else in this
    // process refers to it.
    let socket = unsafe { OwnedFd::from_raw_fd(SPAWNER_FD) };
    match serve(&socket, entries) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("tollgate-shim spawner: {e} (it is started by tollgate-supervisor only)");
            1
        }
    }
}

fn serve(socket: &OwnedFd, entries: Entries) -> std::io::Result<()> {
    // Whatever else it inherited (descriptors the supervisor's own starter left open) its
    // children would inherit too, and each child's table is sized to the highest one open.
    #[allow(unsafe_code)]
    // SAFETY: close_range takes numbers and flags only; nothing in this process uses a
    // descriptor above the socket yet.
    let closed = unsafe { libc::syscall(libc::SYS_close_range, SPAWNER_FD + 1, u32::MAX, 0) };
    if closed < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // The children must not hold the socket: it would keep the supervisor's end open.
    nix::fcntl::fcntl(
        socket,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )?;
    // A child without a stdin gets this; above the numbers placed, so placing never
    // overwrites it.
    let null = std::fs::File::open("/dev/null")?;
    let null = above_placed(null.into())?;
    // Keystrokes at the supervisor's terminal signal its whole process group: a supervisor
    // shutting down on Ctrl-C may still need its spawner. (Its children get every
    // disposition back to the default.)
    let ignore = SigAction::new(SigHandler::SigIgn, SaFlags::empty(), SigSet::empty());
    for signal in [Signal::SIGINT, Signal::SIGQUIT, Signal::SIGHUP] {
        #[allow(unsafe_code)]
        // SAFETY: SIG_IGN installs no handler of ours.
        unsafe { nix::sys::signal::sigaction(signal, &ignore) }?;
    }
    let own_cmdline = own_cmdline();
    let mut buffer = vec![0; MAX_REQUEST];
    // First the sandboxes' base mount namespace, which every shim starts in.
    let Some((length, _)) = receive(socket, &mut buffer)? else {
        return Ok(());
    };
    let made = serde_json::from_slice::<SandboxBase>(&buffer[..length])
        .map_err(|e| format!("the sandboxes' base could not be read: {e}"))
        .and_then(|base| crate::setup::make_base(&base).map_err(|e| e.to_string()));
    let answer = match &made {
        Ok(_) => BASE_READY.to_vec(),
        Err(reason) => reason.as_bytes().to_vec(),
    };
    send(socket.as_raw_fd(), &answer, MsgFlags::MSG_NOSIGNAL)?;
    let base = made.map_err(|reason| {
        std::io::Error::other(format!(
            "making the sandboxes' base mount namespace: {reason}"
        ))
    })?;
    let base = above_placed(base)?;
    loop {
        let Some((length, fds)) = receive(socket, &mut buffer)? else {
            return Ok(());
        };
        let reply = match SpawnRequest::decode(&buffer[..length]) {
            Ok(request) if request.attached() == fds.len() => {
                start(&request, fds, &null, &base, entries, own_cmdline)
            }
            _ => SpawnReply {
                pid: 0,
                errno: libc::EINVAL,
                failed_join: NO_JOIN,
            },
        };
        match send(socket.as_raw_fd(), &reply.encode(), MsgFlags::MSG_NOSIGNAL) {
            Ok(_) => {}
            // The supervisor is gone.
            Err(Errno::EPIPE | Errno::ECONNRESET) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Where this process's command line lies in its memory and how long it is (the kernel's
/// `arg_start` and `arg_end`, fields 48 and 49 of `/proc/self/stat`), if it can be read.
fn own_cmdline() -> Option<(usize, usize)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name, which is in parentheses and may hold anything.
    let after_name = &stat[stat.rfind(')')? + 2..];
    let mut fields = after_name.split(' ').skip(45);
    let start: usize = fields.next()?.parse().ok()?;
    let end: usize = fields.next()?.parse().ok()?;
    (end > start).then_some((start, end - start))
}

/// One request: its length in `buffer` and the descriptors attached (close-on-exec), or
/// `None` at end of file. A truncated message reads as an empty (malformed) one.
fn receive(socket: &OwnedFd, buffer: &mut [u8]) -> std::io::Result<Option<(usize, Vec<OwnedFd>)>> {
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    loop {
        let mut iov = [IoSliceMut::new(buffer)];
        let message = match recvmsg::<()>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(message) => message,
        };
        let mut fds = Vec::new();
        for control in message.cmsgs()? {
            if let ControlMessageOwned::ScmRights(raw) = control {
                for fd in raw {
                    #[allow(unsafe_code)]
                    // SAFETY: the kernel just installed these descriptors in this process.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        if message.bytes == 0 && fds.is_empty() {
            return Ok(None);
        }
        let truncated = message
            .flags
            .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
        return Ok(Some((if truncated { 0 } else { message.bytes }, fds)));
    }
}

/// `fd`, or a close-on-exec copy of it above the numbers a child gets placed on, so that
/// placing one never overwrites another still to be placed.
fn above_placed(fd: OwnedFd) -> std::io::Result<OwnedFd> {
    if fd.as_raw_fd() > PID_ONE_FD {
        return Ok(fd);
    }
    let copy = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(PID_ONE_FD + 1))?;
    #[allow(unsafe_code)]
    // SAFETY: fcntl just returned this new descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}

/// Starts the requested child and answers with its pid, or why not.
fn start(
    request: &SpawnRequest,
    fds: Vec<OwnedFd>,
    null: &OwnedFd,
    base: &OwnedFd,
    entries: Entries,
    own_cmdline: Option<(usize, usize)>,
) -> SpawnReply {
    match clone_child(request, fds, null, base, entries, own_cmdline) {
        Ok(pid) => SpawnReply {
            pid,
            errno: 0,
            failed_join: NO_JOIN,
        },
        Err(failure) => failure,
    }
}

/// What the new child does once it is in its cgroup with its descriptors placed.
enum Then<'a> {
    /// `execve` the program (`argv` and `envp`: null-terminated arrays of pointers to
    /// NUL-terminated strings, built before the clone).
    Exec {
        argv: &'a [*const c_char],
        envp: &'a [*const c_char],
    },
    /// Run this binary's entry point in place, with every descriptor above `highest_placed`
    /// closed (what close-on-exec would have done), showing `cmdline` (NUL-separated, padded
    /// with NULs to the spawner's own command line's length) as its command line, written
    /// over the spawner's at `cmdline_area`; in the mount namespace `base` first, if given
    /// (the shim's), and then leading a process group of its own.
    InPlace {
        entry: fn() -> !,
        base: Option<RawFd>,
        cmdline: &'a [u8],
        cmdline_area: Option<usize>,
        highest_placed: RawFd,
    },
}

/// The child's pid once it has executed the program (or, in place, joined its cgroup and
/// placed its descriptors), or the failure: the pid (0 if none was started), the errno and
/// which cgroup join failed, if one did.
fn clone_child(
    request: &SpawnRequest,
    mut fds: Vec<OwnedFd>,
    null: &OwnedFd,
    base: &OwnedFd,
    entries: Entries,
    own_cmdline: Option<(usize, usize)>,
) -> Result<i32, SpawnReply> {
    let errno = |e: std::io::Error| SpawnReply {
        pid: 0,
        errno: e.raw_os_error().unwrap_or(libc::EIO),
        failed_join: NO_JOIN,
    };
    let invalid = || errno(std::io::Error::from_raw_os_error(libc::EINVAL));
    // The cgroup's descriptors come after the placed ones: the v2 directory last.
    let cgroup_dir = if request.join_dir { fds.pop() } else { None };
    let tasks = fds.split_off(request.fd_targets().len());
    let tasks_raw: Vec<RawFd> = tasks.iter().map(|fd| fd.as_raw_fd()).collect();
    // Everything the child needs is built here: it allocates nothing before its entry point
    // (an exec'd program allocates nothing of ours at all).
    let argv = std::iter::once(&request.program)
        .chain(&request.args)
        .map(|part| CString::new(part.as_slice()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| invalid())?;
    let mut argv_ptrs: Vec<*const c_char> = argv.iter().map(|arg| arg.as_ptr()).collect();
    argv_ptrs.push(ptr::null());
    let envp: [*const c_char; 1] = [ptr::null()];
    // What `ps` shows for a child started in place, built only for one.
    let mut cmdline: Vec<u8>;
    let then = if request.in_place {
        // A shim starts in the sandboxes' base; `enter` joins a sandbox's namespaces itself.
        let (entry, base) = match request.args.as_slice() {
            [] => (entries.shim, Some(base.as_raw_fd())),
            [verb] if verb == b"enter" => (entries.enter, None),
            _ => return Err(invalid()),
        };
        cmdline = argv
            .iter()
            .flat_map(|arg| arg.as_bytes_with_nul())
            .copied()
            .collect();
        let cmdline_area = own_cmdline.map(|(start, length)| {
            // Never past the spawner's own: the program is the same path, its argument shorter.
            cmdline.resize(length, 0);
            if let Some(last) = cmdline.last_mut() {
                *last = 0;
            }
            start
        });
        Then::InPlace {
            entry,
            base,
            cmdline: &cmdline,
            cmdline_area,
            // The targets always include stdout, stderr and the control socket.
            highest_placed: request.fd_targets().into_iter().max().unwrap_or(PID_ONE_FD),
        }
    } else {
        Then::Exec {
            argv: &argv_ptrs,
            envp: &envp,
        }
    };
    let sources = fds
        .into_iter()
        .map(above_placed)
        .collect::<Result<Vec<_>, _>>()
        .map_err(errno)?;
    let mut placements: Vec<(RawFd, RawFd)> = sources
        .iter()
        .map(|fd| fd.as_raw_fd())
        .zip(request.fd_targets())
        .collect();
    if !request.stdin {
        placements.push((null.as_raw_fd(), 0));
    }
    let (report_read, report_write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| errno(e.into()))?;
    let highest_signal = libc::SIGRTMAX();
    // CLONE_VFORK only for an exec: a child started in place never executes anything, and
    // this process waits for its report pipe instead.
    let vfork = if request.in_place {
        0
    } else {
        libc::CLONE_VFORK as u64
    };
    #[allow(unsafe_code)]
    // SAFETY: this process is single-threaded; CLONE_VFORK suspends it until the child has
    // executed the program or exited. The child runs `start_child` only, which never
    // returns.
    let forked = unsafe { fork_for_parent(vfork, cgroup_dir.as_ref().map(|dir| dir.as_raw_fd())) };
    let pid = match forked {
        Ok(pid) => pid as i32,
        Err(error) => {
            let mut failure = errno(error);
            // Out of pids or memory is the host's limit, whatever the flags; anything else
            // with a cgroup directory is that directory's (removed, not cgroup v2, not
            // joinable).
            if cgroup_dir.is_some() && !matches!(failure.errno, libc::EAGAIN | libc::ENOMEM) {
                failure.failed_join = tasks_raw.len() as i32;
            }
            return Err(failure);
        }
    };
    if pid == 0 {
        #[allow(unsafe_code)]
        // SAFETY: this is the new child of a single-threaded process; every pointer and
        // descriptor handed over was built before the clone and is valid in its copy of the
        // memory.
        unsafe {
            start_child(
                &tasks_raw,
                &placements,
                report_write.as_raw_fd(),
                highest_signal,
                then,
            )
        }
    }
    // Only the child needed these.
    drop((tasks, cgroup_dir));
    // The child has executed the program (its copy of the write end closed with the exec),
    // or, in place, closed the write end itself once it was ready, or exited: the read below
    // sees end of file or its failure.
    drop(report_write);
    let mut report = [0u8; 8];
    let mut filled = 0;
    while filled < report.len() {
        match nix::unistd::read(&report_read, &mut report[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(Errno::EINTR) => continue,
            Err(_) => break,
        }
    }
    if filled == report.len() {
        let [a, b, c, d, e, f, g, h] = report;
        return Err(SpawnReply {
            pid,
            failed_join: i32::from_ne_bytes([a, b, c, d]),
            errno: i32::from_ne_bytes([e, f, g, h]),
        });
    }
    Ok(pid)
}

/// Forks this process with `CLONE_PARENT` and the `extra` flags, in the cgroup v2 directory
/// `cgroup` when given (`CLONE_INTO_CGROUP`): the child is this process's parent's child
/// (the supervisor's), exactly as if the supervisor had started it. 0 in the child; its pid
/// here. No exit signal is given: with `CLONE_PARENT` the child gets this process's
/// (SIGCHLD, as every shim and the spawner have), and clone3 refuses one given.
///
/// # Safety
/// This process must be single-threaded (the child runs on its own copy of its memory and
/// of this stack, and no other thread can hold a lock it needs), `extra` must not share
/// memory (`CLONE_VM`, `CLONE_THREAD`), and with `CLONE_VFORK` the child must execute a
/// program or exit.
#[allow(unsafe_code)]
pub(crate) unsafe fn fork_for_parent(extra: u64, cgroup: Option<RawFd>) -> std::io::Result<u32> {
    // SAFETY: all-zero is a valid `clone_args` (every field a plain number).
    let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
    args.flags = libc::CLONE_PARENT as u64 | extra;
    if let Some(dir) = cgroup {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = dir as u64;
    }
    // SAFETY: the caller's contract; without CLONE_VM and with no stack this is a fork.
    // `args` is a live `clone_args` of the size passed.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut libc::clone_args,
            size_of::<libc::clone_args>(),
        )
    };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    u32::try_from(pid).map_err(std::io::Error::other)
}

/// In the new child: into each cgroup v1 hierarchy through its `tasks` file, every signal
/// disposition back to its default and the mask emptied (what `posix_spawn` with
/// `POSIX_SPAWN_SETSIGDEF`/`SETSIGMASK` gave), the descriptors placed, then what `then`
/// says. On a failure the failed join's index ([`NO_JOIN`] for any other step) and the errno
/// go to `report`, and the child exits 127.
///
/// # Safety
/// Only in the child of a clone (without `CLONE_VM`) of a single-threaded process, with the
/// pointers in `then` valid. Up to its entry point it makes async-signal-safe calls only.
#[allow(unsafe_code)]
unsafe fn start_child(
    tasks: &[RawFd],
    placements: &[(RawFd, RawFd)],
    report: RawFd,
    highest_signal: i32,
    then: Then<'_>,
) -> ! {
    // SAFETY: the caller's contract; write, rt_sigaction, sigprocmask, dup2, setns, setpgid,
    // close_range, execve and _exit are async-signal-safe, and every pointer passed points at memory live
    // in this copy. The command line is written within the bytes the kernel names as this
    // process's (arg_start, and exactly arg_end - arg_start of them: `cmdline` was sized so),
    // the argument strings at the top of the stack, present and writable in this copy.
    unsafe {
        let fail = |join: i32| -> ! {
            let report_words = [join, *libc::__errno_location()];
            libc::write(report, report_words.as_ptr().cast(), 8);
            libc::_exit(127)
        };
        // First, before anything of the program can run: this (single) thread moves itself,
        // which the kernel does without its threadgroup lock. A short write is a failure: the
        // kernel reads a cgroup file's value from one write.
        for (index, &file) in tasks.iter().enumerate() {
            if libc::write(file, b"0".as_ptr().cast(), 1) != 1 {
                if *libc::__errno_location() == 0 {
                    *libc::__errno_location() = libc::EIO;
                }
                fail(index as i32);
            }
        }
        // The kernel's `struct sigaction`, all zero: SIG_DFL, no flags, an empty mask,
        // whatever its layout on this architecture (at most four words). The system call
        // rather than the C library's wrapper, which refuses the library's own signals (32
        // and 33), which `posix_spawn` left ignored in this process.
        let default = [0u64; 4];
        // SIGKILL and SIGSTOP refuse; nothing to do for them.
        for signal in 1..=highest_signal {
            libc::syscall(
                libc::SYS_rt_sigaction,
                signal,
                default.as_ptr(),
                ptr::null_mut::<u64>(),
                size_of::<u64>(),
            );
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, ptr::null_mut());
        for &(source, target) in placements {
            // dup2 clears close-on-exec on the target; a source is never its own target.
            if libc::dup2(source, target) < 0 {
                fail(NO_JOIN);
            }
        }
        match then {
            Then::Exec { argv, envp } => {
                libc::execve(argv[0], argv.as_ptr(), envp.as_ptr());
                fail(NO_JOIN)
            }
            Then::InPlace {
                entry,
                base,
                cmdline,
                cmdline_area,
                highest_placed,
            } => {
                // Its mount namespace's copy is taken from the base (see `setup::make_base`).
                if let Some(base) = base {
                    if libc::setns(base, libc::CLONE_NEWNS) < 0 {
                        fail(NO_BASE);
                    }
                    // A shim leads a process group of its own, before the supervisor hears
                    // of it: the pid 1 it forks is in it too, so the supervisor can reap a
                    // pid 1 whose pid it was never told (the shim killed in between), and
                    // keystrokes at the supervisor's terminal signal neither.
                    if libc::setpgid(0, 0) < 0 {
                        fail(NO_JOIN);
                    }
                }
                // As every Rust program starts: SIGPIPE ignored (a write to a closed pipe
                // or socket is an error, not death).
                libc::signal(libc::SIGPIPE, libc::SIG_IGN);
                // What `ps` shows: the program and its arguments, not the spawner's, written
                // over the spawner's own (this copy's), where the kernel reads them from.
                if let Some(area) = cmdline_area {
                    ptr::copy_nonoverlapping(cmdline.as_ptr(), area as *mut u8, cmdline.len());
                }
                // What close-on-exec does at an exec: the spawner's descriptors (its socket,
                // the sources placed, the cgroup's) are gone, and so is `report`, which tells
                // the spawner this child is ready.
                if libc::syscall(
                    libc::SYS_close_range,
                    highest_placed + 1,
                    libc::c_uint::MAX,
                    0,
                ) < 0
                {
                    fail(NO_JOIN);
                }
                entry()
            }
        }
    }
}
