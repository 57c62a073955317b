//! `tollgate-shim enter`: runs one command inside a live sandbox, for the gateway's `exec`
//! tool. Started by the supervisor inside the run's cgroup with the request on fd 3; never by
//! an agent (it needs real root on the host to join the sandbox's namespaces).
//!
//! The helper joins the sandbox's mount, pid, network, IPC, UTS and cgroup namespaces (those
//! of its pid 1, through a pidfd the supervisor pinned when the sandbox started, on fd 4),
//! then starts the command exactly as pid 1 starts the agent: a new user
//! namespace mapping the agent's inner id to the run's host id, every capability dropped,
//! `no_new_privs`, the run's Landlock rules and seccomp filter, the agent's environment, a
//! new session. The command is pid N of the sandbox's pid namespace, so it dies with the
//! sandbox. At the time limit its whole process group is killed; the CPU-time limit is an
//! `RLIMIT_CPU` on it.

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::fd::AsFd as _;
use std::os::fd::{FromRawFd as _, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::unistd::Pid;

use nix::sched::{setns, CloneFlags};
use nix::sys::resource::{setrlimit, Resource};
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use tollgate_shim_protocol::protocol::{
    AgentExit, EnterOutcome, EnterRequest, CONTROL_FD, PID_ONE_FD,
};

/// The sandbox's namespaces the command joins (its user namespace is the host's: the command
/// gets its own, as the agent did).
const NAMESPACES: CloneFlags = CloneFlags::CLONE_NEWNS
    .union(CloneFlags::CLONE_NEWPID)
    .union(CloneFlags::CLONE_NEWNET)
    .union(CloneFlags::CLONE_NEWIPC)
    .union(CloneFlags::CLONE_NEWUTS)
    .union(CloneFlags::CLONE_NEWCGROUP);

fn reply(control: &mut UnixStream, outcome: &EnterOutcome) {
    if let Ok(mut line) = serde_json::to_vec(outcome) {
        line.push(b'\n');
        let _ = control.write_all(&line);
    }
}

/// Entry point of `tollgate-shim enter`. Never returns.
pub(crate) fn run() -> ! {
    // SAFETY: the supervisor placed the request socket on CONTROL_FD; we take ownership of
    // it exactly once, here.
    #[allow(unsafe_code)]
    let mut control = unsafe { UnixStream::from_raw_fd(CONTROL_FD) };
    let outcome = match enter(&control) {
        Ok(outcome) => outcome,
        Err(reason) => EnterOutcome::Failed { reason },
    };
    reply(&mut control, &outcome);
    std::process::exit(0)
}

fn enter(control: &UnixStream) -> Result<EnterOutcome, String> {
    let mut line = String::new();
    BufReader::new(control)
        .read_line(&mut line)
        .map_err(|e| format!("reading the request: {e}"))?;
    let request: EnterRequest =
        serde_json::from_str(&line).map_err(|e| format!("invalid request: {e}"))?;
    let seccomp = crate::confine::SeccompPrograms::compile().map_err(|e| e.to_string())?;
    // Host /proc, held across the mount namespace change: the command's host pid (what fork
    // returns here) is how its id map is written.
    let host_proc = crate::agent::open_proc()?;
    // SAFETY: the supervisor placed a pidfd of the sandbox's pid 1 on PID_ONE_FD; we take
    // ownership of it exactly once, here.
    #[allow(unsafe_code)]
    let pid_one = unsafe { OwnedFd::from_raw_fd(PID_ONE_FD) };
    // All of pid 1's namespaces but its user namespace (the host's) at once, through the
    // pidfd the supervisor pinned when the sandbox started: never a pid looked up again. If
    // pid 1 has exited this fails, and nothing runs.
    setns(&pid_one, NAMESPACES).map_err(|e| format!("joining the sandbox's namespaces: {e}"))?;
    drop(pid_one);
    if let Some(target) = &request.unmount {
        // Joining the mount namespace made its root (the sandbox's) this process's root: the
        // target is the sandbox path. Not a lazy unmount: while the agent holds a file or its
        // working directory beneath it, a detached mount would stay reachable through them,
        // so the unmount is refused instead (EBUSY) and the operator told.
        match nix::mount::umount2(target.as_str(), nix::mount::MntFlags::UMOUNT_NOFOLLOW) {
            Ok(()) => {}
            Err(nix::errno::Errno::EBUSY) => {
                return Err(format!(
                    "the agent holds files or a working directory beneath {target}; the grant stays until they are closed (or stop the run)"
                ))
            }
            Err(e) => return Err(format!("unmounting {target}: {e}")),
        }
        return Ok(EnterOutcome::Unmounted);
    }
    if let Some(program) = &request.hide {
        // Joined the mount namespace: the agent's view, where the cover goes.
        crate::setup::hide_programs(
            std::slice::from_ref(program),
            &request.plan.landlock.execute,
        )
        .map_err(|e| e.to_string())?;
        return Ok(EnterOutcome::Hidden);
    }
    let cpu_seconds = request.timeout_ms.div_ceil(1000).max(1);
    // Inherited by the command; the helper itself only waits.
    setrlimit(Resource::RLIMIT_CPU, cpu_seconds, cpu_seconds)
        .map_err(|e| format!("setting the CPU-time limit: {e}"))?;
    let mut plan = request.plan;
    if let Some(program) = &request.also_execute {
        // The agent cannot see the program (it is covered in the sandbox's mount namespace):
        // this command alone does, in a mount namespace of its own.
        crate::setup::reveal_program(program)?;
        // Resolved here, through the sandbox's root (joined above): the program and its
        // loader as this sandbox shows them. This command's Landlock domain alone gets them;
        // the agent's never does.
        for path in crate::confine::with_interpreters(std::slice::from_ref(program)) {
            if !plan.landlock.execute.contains(&path) {
                plan.landlock.execute.push(path);
            }
        }
    }
    let (child, _) = crate::agent::start_agent(&plan, &seccomp, &host_proc, None)?;
    // No threads here: a process that joined another pid namespace cannot create them. The
    // command stays unreaped (its pid, and so its group's number, reserved) until after its
    // group is signalled, so a kill never reaches a recycled pid.
    let timed_out = !wait_unreaped(child, Duration::from_millis(request.timeout_ms.max(1)))?;
    // At the time limit the command's group is killed; after it ends, whatever it left in
    // its group (it leads its own session and process group) ends with it.
    let _ = killpg(child, Signal::SIGKILL);
    let exit = loop {
        match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, code)) => break AgentExit::Code(code),
            Ok(WaitStatus::Signaled(_, signal, _)) => break AgentExit::Signal(signal as i32),
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(format!("reaping the command: {e}")),
        }
    };
    Ok(EnterOutcome::Ended { exit, timed_out })
}

/// Waits until `child` has ended, without reaping it, for at most `limit`. Returns whether
/// it ended.
fn wait_unreaped(child: Pid, limit: Duration) -> Result<bool, String> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; nothing
    // of this process's memory is involved.
    #[allow(unsafe_code)]
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, child.as_raw(), 0) };
    if raw < 0 {
        return Err(format!("pidfd_open: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    #[allow(unsafe_code)]
    let pidfd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let millis = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(millis)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => return Ok(true),
            Err(e) => return Err(format!("waiting for the command: {e}")),
        }
    }
}
