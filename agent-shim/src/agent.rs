//! Starting one confined process in a sandbox: the agent, the model endpoint beside it, and
//! each command `tollgate-shim enter` runs. A fork, a new user namespace whose id map the
//! parent writes, then every step of [`confine`](crate::confine), then exec.
//!
//! A leaf below the crate root and `enter`, so both start processes the same way without
//! reaching into each other.

use std::ffi::CString;
use std::os::fd::OwnedFd;

use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::SigSet;
use nix::sys::wait::waitpid;
use nix::unistd::{fork, ForkResult, Pid};
use tollgate_shim_protocol::plan::{AgentInput, SandboxPlan};

use crate::confine;

/// The agent's input, made by pid 1 before the agent: the end the agent gets as its stdin (a
/// terminal also as stdout, stderr and controlling terminal), and the end for the supervisor.
#[derive(Debug)]
pub(crate) struct AgentStdio {
    agent: OwnedFd,
    supervisor: OwnedFd,
    terminal: bool,
}

impl AgentStdio {
    /// The input the plan asks for: none, a pipe, or a pseudo-terminal of its size (from the
    /// host's `/dev/ptmx`, so call before the root is switched), its slave owned by the
    /// agent's host id so that the terminal is the agent's own.
    pub(crate) fn for_plan(plan: &SandboxPlan) -> Result<Option<Self>, String> {
        use nix::fcntl::OFlag;
        match plan.input {
            AgentInput::Null => Ok(None),
            AgentInput::Pipe => {
                let (read, write) =
                    nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
                Ok(Some(Self {
                    agent: read,
                    supervisor: write,
                    terminal: false,
                }))
            }
            AgentInput::Terminal { rows, cols } => {
                let size = nix::pty::Winsize {
                    ws_row: rows,
                    ws_col: cols,
                    ws_xpixel: 0,
                    ws_ypixel: 0,
                };
                let pty = nix::pty::openpty(Some(&size), None)
                    .map_err(|e| format!("opening a pseudo-terminal: {e}"))?;
                nix::unistd::fchown(
                    &pty.slave,
                    Some(nix::unistd::Uid::from_raw(plan.host_id)),
                    Some(nix::unistd::Gid::from_raw(plan.host_id)),
                )
                .map_err(|e| format!("giving the terminal to the agent: {e}"))?;
                Ok(Some(Self {
                    agent: pty.slave,
                    supervisor: pty.master,
                    terminal: true,
                }))
            }
        }
    }

    /// The supervisor's end (the agent's end closes with this).
    pub(crate) fn supervisor_end(self) -> OwnedFd {
        self.supervisor
    }
}

/// In the agent process: its input becomes stdin (and, for a terminal, stdout, stderr and
/// the controlling terminal of its new session).
fn take_input(input: &AgentStdio) -> Result<(), String> {
    use std::os::fd::AsRawFd as _;
    let targets: &[i32] = if input.terminal { &[0, 1, 2] } else { &[0] };
    for target in targets {
        // SAFETY: dup2 of a descriptor this process holds onto a standard stream number.
        #[allow(unsafe_code)]
        if unsafe { libc::dup2(input.agent.as_raw_fd(), *target) } < 0 {
            return Err(format!("dup2: {}", std::io::Error::last_os_error()));
        }
    }
    if input.terminal {
        // SAFETY: TIOCSCTTY on stdin (the terminal's slave) with argument 0; this process is
        // a session leader without a controlling terminal (setsid came first).
        #[allow(unsafe_code)]
        if unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) } < 0 {
            return Err(format!(
                "making the terminal the agent's: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// Exit status of the shim when the sandbox could not be built.
pub const EXIT_SETUP_FAILED: i32 = 125;

/// This pid namespace's `/proc`, held open: fork returns pids as they are in it.
pub(crate) fn open_proc() -> Result<OwnedFd, String> {
    nix::fcntl::open(
        "/proc",
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| format!("opening /proc: {e}"))
}

/// Forks the agent, maps its ids (through `proc_dir`, the /proc of the pid namespace the
/// caller is in), and waits until it has executed (or failed). Returns its pid and the
/// Landlock ABI it runs under.
pub(crate) fn start_agent(
    plan: &SandboxPlan,
    seccomp: &confine::SeccompPrograms,
    proc_dir: &OwnedFd,
    input: Option<&AgentStdio>,
) -> Result<(Pid, u32), String> {
    use nix::fcntl::OFlag;
    // Both ends close on exec: EOF on the report pipe means the agent's exec succeeded.
    let (report_read, report_write) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    let (go_read, go_write) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    // SAFETY: single-threaded process; the child only runs ordinary Rust code and execs.
    #[allow(unsafe_code)]
    let forked = unsafe { fork() };
    match forked {
        Ok(ForkResult::Child) => {
            drop(report_read);
            drop(go_write);
            let reason = agent_child(plan, seccomp, &report_write, go_read, input);
            let _ = nix::unistd::write(&report_write, reason.as_bytes());
            std::process::exit(EXIT_SETUP_FAILED)
        }
        Ok(ForkResult::Parent { child }) => {
            drop(report_write);
            drop(go_read);
            // The child reports back after entering its user namespace; we map its ids.
            let mut byte = [0u8; 1];
            let got = nix::unistd::read(&report_read, &mut byte)
                .map_err(|e| format!("reading the agent process's report: {e}"))?;
            if got != 1 || byte[0] != READY {
                let rest = read_all(&report_read);
                let _ = waitpid(child, None);
                return Err(format!(
                    "the agent process failed before its user namespace: {}{rest}",
                    String::from_utf8_lossy(&byte[..got])
                ));
            }
            let map = format!("{} {} 1\n", plan.inner_id, plan.host_id);
            let mapped = ["uid_map", "gid_map"]
                .into_iter()
                .try_for_each(|file| {
                    write_proc_file(proc_dir, &format!("{child}/{file}"), map.as_bytes())
                        .map_err(|e| format!("writing the agent's {file}: {e}"))
                })
                .and_then(|()| {
                    nix::unistd::write(&go_write, &[READY])
                        .map(drop)
                        .map_err(|e| format!("letting the agent process go on: {e}"))
                });
            // Closed before reading the report: an agent process still waiting for the go
            // (when the map could not be written) then stops at once with NOT_MAPPED.
            drop(go_write);
            let failure = read_all(&report_read);
            match mapped {
                Ok(()) if failure.is_empty() => Ok((child, confine::REQUIRED_LANDLOCK_ABI as u32)),
                Ok(()) => {
                    let _ = waitpid(child, None);
                    Err(failure)
                }
                Err(ours) => {
                    let _ = waitpid(child, None);
                    // An agent process that failed first (its pipe closed, its /proc entry
                    // gone, which is why ours failed) says which of its steps failed and why.
                    Err(if failure.is_empty() || failure == NOT_MAPPED {
                        ours
                    } else {
                        failure
                    })
                }
            }
        }
        Err(e) => Err(format!("forking the agent: {e}")),
    }
}

fn write_proc_file(proc_dir: &OwnedFd, path: &str, bytes: &[u8]) -> nix::Result<()> {
    let fd = nix::fcntl::openat(
        proc_dir,
        path,
        nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    if nix::unistd::write(&fd, bytes)? == bytes.len() {
        Ok(())
    } else {
        Err(nix::errno::Errno::EIO)
    }
}

/// What the agent process reports when pid 1 let it go on without a byte: pid 1 could not
/// write its id map (and reports why itself).
const NOT_MAPPED: &str = "pid 1 did not map the agent's ids";

/// Byte the agent process sends once it is in its user namespace, and pid 1 sends back once
/// the ids are mapped.
const READY: u8 = 1;

fn read_all(fd: &OwnedFd) -> String {
    let mut text = Vec::new();
    let mut buffer = [0u8; 512];
    while let Ok(n) = nix::unistd::read(fd, &mut buffer) {
        if n == 0 {
            break;
        }
        text.extend_from_slice(&buffer[..n]);
    }
    String::from_utf8_lossy(&text).into_owned()
}

/// Sets the receipt's open-file limit, soft and hard, so an agent (or an exec'd command) can
/// hold no more descriptors, gateway connections included, than its receipt says. Called while
/// still real root in the host's user namespace: raising the hard limit above what the
/// supervisor passed down needs `CAP_SYS_RESOURCE` there, which the new user namespace lacks.
fn limit_open_files(files: u32) -> Result<(), String> {
    let files = u64::from(tollgate_proto::effective_files(files));
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, files, files)
        .map_err(|e| format!("setting the open-file limit to {files}: {e}"))
}

/// The agent side: returns only on failure (with the reason). On success it executes the
/// agent, which closes the report pipe.
fn agent_child(
    plan: &SandboxPlan,
    seccomp: &confine::SeccompPrograms,
    report: &OwnedFd,
    go: OwnedFd,
    input: Option<&AgentStdio>,
) -> String {
    let step = || -> Result<(), String> {
        nix::unistd::setsid().map_err(|e| format!("setsid: {e}"))?;
        if let Some(input) = input {
            take_input(input)?;
        }
        limit_open_files(plan.files)?;
        // Restore the default signal mask pid 1 set up for itself.
        SigSet::all()
            .thread_unblock()
            .map_err(|e| format!("unblocking signals: {e}"))?;
        confine::clear_groups().map_err(|e| e.to_string())?;
        unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| format!("new user namespace: {e}"))?;
        nix::unistd::write(report, &[READY])
            .map_err(|e| format!("telling pid 1 the user namespace is made: {e}"))?;
        let mut byte = [0u8; 1];
        if nix::unistd::read(&go, &mut byte)
            .map_err(|e| format!("waiting for pid 1 to map the agent's ids: {e}"))?
            != 1
        {
            return Err(NOT_MAPPED.into());
        }
        // Only now, with the ids mapped: building the Landlock ruleset opens the allowed
        // paths and reads the executables' headers, and until the map is written this
        // process's capabilities reach no file whose owner is outside the namespace (an
        // id-mapped grant's files, in a user's private directory, would be refused).
        let landlock = confine::prepare_landlock(&plan.landlock).map_err(|e| e.to_string())?;
        confine::drop_bounding_set().map_err(|e| e.to_string())?;
        confine::become_agent(plan.inner_id).map_err(|e| e.to_string())?;
        confine::no_new_privs().map_err(|e| e.to_string())?;
        confine::no_core_dumps().map_err(|e| e.to_string())?;
        landlock.enforce().map_err(|e| e.to_string())?;
        seccomp.install().map_err(|e| e.to_string())?;
        std::env::set_current_dir(&plan.agent.cwd)
            .map_err(|e| format!("cwd {}: {e}", plan.agent.cwd.display()))?;
        Ok(())
    };
    if let Err(reason) = step() {
        return reason;
    }
    drop(go);
    // Every inherited fd above stderr closes at exec; the report pipe is one of them.
    if let Err(e) = confine::mark_fds_cloexec_from(3) {
        return e.to_string();
    }
    let to_c = |s: &str| CString::new(s.as_bytes()).map_err(|_| format!("{s:?} contains NUL"));
    let argv: Result<Vec<CString>, String> = plan.agent.argv.iter().map(|a| to_c(a)).collect();
    let env: Result<Vec<CString>, String> = plan
        .agent
        .env
        .iter()
        .map(|(k, v)| to_c(&format!("{k}={v}")))
        .collect();
    let (argv, env) = match (argv, env) {
        (Ok(argv), Ok(env)) if !argv.is_empty() => (argv, env),
        (Err(e), _) | (_, Err(e)) => return e,
        _ => return "empty argv".into(),
    };
    match nix::unistd::execve(&argv[0], &argv, &env) {
        Err(e) => format!("exec {}: {e}", plan.agent.argv[0]),
        Ok(never) => match never {},
    }
}
