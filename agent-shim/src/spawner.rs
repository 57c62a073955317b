//! `tollgate-shim spawner`: the process that starts every shim and `exec` helper for the
//! supervisor (internal; the supervisor starts it once, with its socket on fd 3).
//!
//! A child gets a copy of its starter's descriptor table, sized to the highest descriptor
//! open, and closes each close-on-exec one again at `execve`. Started from the supervisor,
//! which holds about three descriptors per live run, that cost grew with every live run; the
//! spawner holds a handful. It starts each child with `clone(CLONE_PARENT)`, so the child is
//! the supervisor's child exactly as if the supervisor had started it (the supervisor reaps
//! it, watches it through a pidfd and moves it into its cgroup by pid), and with
//! `CLONE_VFORK`, so the reply is sent only once the child has executed the program (or
//! failed to: its errno comes back on a close-on-exec pipe).
//!
//! Single-threaded, so the clone is an ordinary fork: no other thread can hold a lock the
//! child might need, and the child makes only async-signal-safe calls before `execve`.
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
use tollgate_shim_protocol::protocol::PID_ONE_FD;
use tollgate_shim_protocol::spawner::{SpawnReply, SpawnRequest, MAX_FDS, MAX_REQUEST, SPAWNER_FD};

/// Serves start requests on fd 3 until the supervisor closes its end; the exit code.
pub fn main() -> i32 {
    #[allow(unsafe_code)]
    // SAFETY: fd 3 is the socket the supervisor placed for this mode; nothing else in this
    // process refers to it.
    let socket = unsafe { OwnedFd::from_raw_fd(SPAWNER_FD) };
    match serve(&socket) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("tollgate-shim spawner: {e} (it is started by tollgate-supervisor only)");
            1
        }
    }
}

fn serve(socket: &OwnedFd) -> std::io::Result<()> {
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
    let mut buffer = vec![0; MAX_REQUEST];
    loop {
        let Some((length, fds)) = receive(socket, &mut buffer)? else {
            return Ok(());
        };
        let reply = match SpawnRequest::decode(&buffer[..length]) {
            Ok(request) if request.fd_targets().len() == fds.len() => start(&request, fds, &null),
            _ => SpawnReply {
                pid: 0,
                errno: libc::EINVAL,
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
fn start(request: &SpawnRequest, fds: Vec<OwnedFd>, null: &OwnedFd) -> SpawnReply {
    match clone_and_exec(request, fds, null) {
        Ok(pid) => SpawnReply { pid, errno: 0 },
        Err((pid, errno)) => SpawnReply { pid, errno },
    }
}

/// The child's pid once it has executed the program, or the pid (0 if none was started)
/// and errno of the failure.
fn clone_and_exec(
    request: &SpawnRequest,
    fds: Vec<OwnedFd>,
    null: &OwnedFd,
) -> Result<i32, (i32, i32)> {
    let errno = |e: std::io::Error| (0, e.raw_os_error().unwrap_or(libc::EIO));
    // Everything the child needs is built here: it allocates nothing.
    let argv = std::iter::once(&request.program)
        .chain(&request.args)
        .map(|part| CString::new(part.as_slice()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| (0, libc::EINVAL))?;
    let mut argv_ptrs: Vec<*const c_char> = argv.iter().map(|arg| arg.as_ptr()).collect();
    argv_ptrs.push(ptr::null());
    let envp: [*const c_char; 1] = [ptr::null()];
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
    #[allow(unsafe_code)]
    // SAFETY: clone without CLONE_VM and with no new stack is a fork: the child runs on its
    // own copy of this (single-threaded) process's memory. CLONE_PARENT makes it the
    // supervisor's child; CLONE_VFORK suspends this process until the child has executed
    // the program or exited. The child runs `exec_child` only, which never returns.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_PARENT | libc::CLONE_VFORK | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid == 0 {
        #[allow(unsafe_code)]
        // SAFETY: this is the new child; every pointer and descriptor handed over was built
        // before the clone and is valid in its copy of the memory.
        unsafe {
            exec_child(
                &placements,
                argv_ptrs.as_ptr(),
                envp.as_ptr(),
                report_write.as_raw_fd(),
                highest_signal,
            )
        }
    }
    if pid < 0 {
        return Err(errno(std::io::Error::last_os_error()));
    }
    let pid = pid as i32;
    // The child has executed the program (its copy of the write end closed with the exec)
    // or exited: the read below sees end of file or its errno at once.
    drop(report_write);
    let mut report = [0u8; 4];
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
        return Err((pid, i32::from_ne_bytes(report)));
    }
    Ok(pid)
}

/// In the new child: every signal disposition back to its default and the mask emptied
/// (what `posix_spawn` with `POSIX_SPAWN_SETSIGDEF`/`SETSIGMASK` gave), the descriptors
/// placed, then `execve`. On a failure its errno goes to `report` and the child exits 127.
///
/// # Safety
/// Only in the child of a fork of a single-threaded process, with `argv` and `envp`
/// null-terminated arrays of NUL-terminated strings. It makes async-signal-safe calls only.
#[allow(unsafe_code)]
unsafe fn exec_child(
    placements: &[(RawFd, RawFd)],
    argv: *const *const c_char,
    envp: *const *const c_char,
    report: RawFd,
    highest_signal: i32,
) -> ! {
    // SAFETY: the caller's contract; rt_sigaction, sigprocmask, dup2, execve, write and
    // _exit are async-signal-safe, and every pointer passed points at memory live in this
    // copy.
    unsafe {
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
        let mut failed = false;
        for &(source, target) in placements {
            // dup2 clears close-on-exec on the target; a source is never its own target.
            if libc::dup2(source, target) < 0 {
                failed = true;
                break;
            }
        }
        if !failed {
            libc::execve(*argv, argv, envp);
        }
        let errno = *libc::__errno_location();
        libc::write(report, (&errno as *const i32).cast(), 4);
        libc::_exit(127)
    }
}
