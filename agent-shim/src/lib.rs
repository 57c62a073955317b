//! `tollgate-shim`: builds one sandbox from the plan the supervisor sends, starts the agent in
//! it, and is the sandbox's pid 1.
//!
//! The supervisor starts the shim inside the sandbox's cgroup, with the control socket on fd 3
//! ([`CONTROL_FD`]), often ahead of need: everything that does not depend on the
//! plan happens before the plan arrives, and the supervisor applies the run's limits to the
//! cgroup before it sends the plan. Then, in three processes:
//!
//! 1. **outer** (host pid namespace, real root): compiles the seccomp programs, unshares
//!    mount, pid, net, ipc, uts and cgroup namespaces, forks pid 1 and waits for it, exiting
//!    with its status.
//! 2. **pid 1** (new namespaces, real root): reads the plan, builds the root file system
//!    ([`setup`]), forks the agent, writes the agent's uid/gid map, reports `Started`, then
//!    reaps children and watches the control socket. When the agent exits it reports `Exited` and exits; when the
//!    socket closes (the supervisor is gone) it exits at once. Either way the kernel kills
//!    everything left in the pid namespace.
//! 3. **agent**: clears groups, enters a new user namespace where it is an unprivileged
//!    mapped id (unique on the host), drops every capability (bounding set too), sets
//!    `no_new_privs`, applies Landlock and seccomp ([`confine`]), closes inherited fds and
//!    executes the agent's argv in a new session.
//!
//! The shim is single-threaded, so `fork` here is ordinary (no other thread can hold a lock).

// Every `unsafe` block is allowed where it stands, with its `// SAFETY:` line.
#![deny(unsafe_code)]

pub mod child;
pub mod confine;
mod enter;
pub mod models;
pub mod setup;
pub mod tool;

use std::ffi::CString;
use std::io::Write as _;
use std::os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::net::UnixStream;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};
use tollgate_shim_protocol::plan::{self, SandboxPlan};
use tollgate_shim_protocol::protocol::{AgentExit, FromShim, ToShim, CONTROL_FD};

/// Exit status of the shim when the sandbox could not be built.
pub const EXIT_SETUP_FAILED: i32 = 125;

fn send(control: &mut UnixStream, message: &FromShim) {
    // The supervisor may be gone; pid 1 notices through the socket's EOF.
    if let Ok(mut line) = serde_json::to_vec(message) {
        line.push(b'\n');
        let _ = control.write_all(&line);
    }
}

/// Entry point of `tollgate-shim enter` (run by the supervisor's gateway: one command inside
/// a live sandbox, see [`enter`](self::enter)). Never returns.
pub fn enter() -> ! {
    enter::run()
}

/// Entry point of `tollgate-shim` in sandbox mode. Never returns.
pub fn run() -> ! {
    // SAFETY: the supervisor placed the control socket on CONTROL_FD; we take ownership of
    // it exactly once, here.
    #[allow(unsafe_code)]
    let control = unsafe { UnixStream::from_raw_fd(CONTROL_FD) };
    let mut control_writer = match control.try_clone() {
        Ok(writer) => writer,
        Err(e) => fail_early(&format!("control socket unusable: {e}")),
    };
    let fail = |writer: &mut UnixStream, reason: String| -> ! {
        send(
            writer,
            &FromShim::Failed {
                reason: reason.clone(),
            },
        );
        fail_early(&reason)
    };
    // Everything that does not depend on the plan comes first: the supervisor starts shims
    // ahead of need, and a run's start then only pays for what its receipt decides.
    let seccomp = confine::SeccompPrograms::compile();
    let namespaces = CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWNET
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWCGROUP;
    if let Err(e) = unshare(namespaces) {
        fail(&mut control_writer, format!("unsharing namespaces: {e}"));
    }
    // SAFETY: single-threaded process; the child only runs ordinary Rust code.
    #[allow(unsafe_code)]
    let forked = unsafe { fork() };
    match forked {
        Ok(ForkResult::Child) => pid_one(&control, seccomp, control_writer),
        Ok(ForkResult::Parent { child }) => {
            // Only pid 1 keeps the link: when it exits, the supervisor sees EOF.
            drop(control);
            drop(control_writer);
            let code = match waitpid(child, None) {
                Ok(WaitStatus::Exited(_, code)) => code,
                Ok(WaitStatus::Signaled(_, signal, _)) => 128 + signal as i32,
                _ => EXIT_SETUP_FAILED,
            };
            std::process::exit(code)
        }
        Err(e) => fail(&mut control_writer, format!("forking pid 1: {e}")),
    }
}

fn fail_early(reason: &str) -> ! {
    eprintln!("tollgate-shim: {reason}");
    std::process::exit(EXIT_SETUP_FAILED)
}

/// Reads the supervisor's messages from the control socket with `recvmsg`, so descriptors
/// sent with a message (SCM_RIGHTS: the plan's detached grant mounts) arrive with it; a plain
/// buffered read would drop them.
struct ControlReader<'a> {
    socket: &'a UnixStream,
    buffer: Vec<u8>,
    fds: std::collections::VecDeque<OwnedFd>,
}

impl<'a> ControlReader<'a> {
    fn new(socket: &'a UnixStream) -> Self {
        Self {
            socket,
            buffer: Vec::new(),
            fds: std::collections::VecDeque::new(),
        }
    }

    /// The next message (one JSON line).
    fn next_message(&mut self) -> Result<ToShim, String> {
        use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
        loop {
            if let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return serde_json::from_slice(&line).map_err(|e| format!("invalid message: {e}"));
            }
            let mut chunk = [0u8; 16 * 1024];
            let mut space = nix::cmsg_space!([std::os::fd::RawFd; 253]);
            let mut iov = [std::io::IoSliceMut::new(&mut chunk)];
            let received = recvmsg::<()>(
                self.socket.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            )
            .map_err(|e| format!("reading the control socket: {e}"))?;
            let (bytes, truncated) = (
                received.bytes,
                received.flags.contains(MsgFlags::MSG_CTRUNC),
            );
            for message in received
                .cmsgs()
                .map_err(|e| format!("reading the control socket: {e}"))?
            {
                if let ControlMessageOwned::ScmRights(fds) = message {
                    // SAFETY: the kernel installed these descriptors in this process for this
                    // message; nothing else owns them.
                    #[allow(unsafe_code)]
                    self.fds.extend(
                        fds.into_iter()
                            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                    );
                }
            }
            if truncated {
                return Err("descriptors sent on the control socket were truncated".into());
            }
            if bytes == 0 {
                return Err("the supervisor closed the control socket".into());
            }
            self.buffer.extend_from_slice(&chunk[..bytes]);
        }
    }

    /// The next `count` descriptors received, in the order they were sent.
    fn take_fds(&mut self, count: usize) -> Result<Vec<OwnedFd>, String> {
        if self.fds.len() != count {
            return Err(format!(
                "the plan has {count} mounts but {} descriptors came with it",
                self.fds.len()
            ));
        }
        Ok(self.fds.drain(..).collect())
    }
}

fn pid_one(
    control_reader: &UnixStream,
    seccomp: Result<confine::SeccompPrograms, confine::ConfineError>,
    mut control: UnixStream,
) -> ! {
    let fail = |control: &mut UnixStream, reason: String| -> ! {
        send(
            control,
            &FromShim::Failed {
                reason: reason.clone(),
            },
        );
        fail_early(&reason)
    };
    let seccomp = match seccomp {
        Ok(programs) => programs,
        Err(e) => fail(&mut control, e.to_string()),
    };
    // One reader for both messages: the second may arrive in the same read as the first.
    let mut reader = ControlReader::new(control_reader);
    let base = match reader.next_message() {
        Ok(ToShim::Prepare(base)) => *base,
        Ok(ToShim::Start(_)) => fail(&mut control, "the plan came before the base".into()),
        Err(reason) => fail(&mut control, reason),
    };
    if let Err(e) = setup::prepare_root(&base) {
        fail(&mut control, e.to_string());
    }
    // SIGCHLD arrives through a signalfd so one poll() watches children and the socket.
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    if let Err(e) = mask.thread_block() {
        fail(&mut control, format!("blocking SIGCHLD: {e}"));
    }
    let signals = match SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
    {
        Ok(fd) => fd,
        Err(e) => fail(&mut control, format!("signalfd: {e}")),
    };
    // Everything above ran before the plan when the sandbox was prepared ahead of need.
    let plan = match reader.next_message() {
        Ok(ToShim::Start(plan)) => *plan,
        Ok(ToShim::Prepare(_)) => fail(
            &mut control,
            "a second base came instead of the plan".into(),
        ),
        Err(reason) => fail(&mut control, reason),
    };
    let mounts = match reader.take_fds(plan.binds.len()) {
        Ok(mounts) => mounts,
        Err(reason) => fail(&mut control, reason),
    };
    drop(reader);
    if let Err(e) = setup::finish_root(&base, &plan, mounts) {
        fail(&mut control, e.to_string());
    }
    // The executables' interpreters, resolved once, now, before the agent exists: a command
    // the gateway runs in this sandbox later gets this very list.
    let mut plan = plan;
    plan.landlock.execute = confine::with_interpreters(&plan.landlock.execute);
    plan.landlock.execute_resolved = true;
    let plan = &plan;
    // This namespace's /proc: the agent's pid as fork returns it is the one it has here.
    let proc_dir = match open_proc() {
        Ok(fd) => fd,
        Err(reason) => fail(&mut control, reason),
    };
    if let Some(models) = plan.models {
        if let Err(reason) = start_models_endpoint(plan, models.port, &seccomp, &proc_dir) {
            fail(&mut control, reason);
        }
    }
    let (agent, landlock_abi) = match start_agent(plan, &seccomp, &proc_dir) {
        Ok(started) => started,
        Err(reason) => fail(&mut control, reason),
    };
    send(
        &mut control,
        &FromShim::Started {
            agent_pid: agent.as_raw(),
            landlock_abi,
            execute: plan.landlock.execute.clone(),
        },
    );
    let exit = supervise(agent, &control, &signals);
    if let Some(exit) = exit {
        send(&mut control, &FromShim::Exited(exit));
    }
    // Exiting as pid 1 makes the kernel kill everything left in the namespace.
    std::process::exit(match exit {
        Some(AgentExit::Code(code)) => code,
        Some(AgentExit::Signal(signal)) => 128 + signal,
        None => EXIT_SETUP_FAILED,
    })
}

/// Reaps children until the agent exits (its status) or the supervisor goes away (`None`).
fn supervise(agent: Pid, control: &UnixStream, signals: &SignalFd) -> Option<AgentExit> {
    loop {
        let mut fds = [
            PollFd::new(control.as_fd(), PollFlags::POLLIN),
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
        ];
        if poll(&mut fds, PollTimeout::NONE).is_err() {
            continue;
        }
        let control_event = fds[0].revents().unwrap_or(PollFlags::empty());
        if control_event.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
            let mut buffer = [0u8; 256];
            // SAFETY: reading into a stack buffer of the given length from our socket fd.
            #[allow(unsafe_code)]
            let read = unsafe {
                libc::read(
                    control.as_raw_fd(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                )
            };
            if read <= 0 {
                return None;
            }
        }
        let _ = signals.read_signal();
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == agent => {
                    return Some(AgentExit::Code(code))
                }
                Ok(WaitStatus::Signaled(pid, signal, _)) if pid == agent => {
                    return Some(AgentExit::Signal(signal as i32))
                }
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => continue,
            }
        }
    }
}

/// Starts the sandbox's model endpoint (`tollgate-shim models`) as the agent's sibling,
/// confined exactly as the agent is (same uid, Landlock rules, seccomp filter; it may do
/// nothing the agent could not do over the gateway itself), and waits until it listens, so
/// the agent's first request finds it.
fn start_models_endpoint(
    plan: &SandboxPlan,
    port: u16,
    seccomp: &confine::SeccompPrograms,
    proc_dir: &OwnedFd,
) -> Result<(), String> {
    let mut endpoint = plan.clone();
    endpoint.agent = plan::AgentCommand {
        argv: vec![
            plan::SHIM_IN_SANDBOX.into(),
            "models".into(),
            "--port".into(),
            port.to_string(),
        ],
        env: vec![(
            "TOLLGATE_GATEWAY".into(),
            format!("unix:{}", plan::GATEWAY_IN_SANDBOX),
        )],
        cwd: "/".into(),
    };
    start_agent(&endpoint, seccomp, proc_dir)
        .map_err(|reason| format!("the model endpoint did not start: {reason}"))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    while std::net::TcpStream::connect(address).is_err() {
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "the model endpoint did not listen on 127.0.0.1:{port} within 5 s"
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    Ok(())
}

fn open_proc() -> Result<OwnedFd, String> {
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
fn start_agent(
    plan: &SandboxPlan,
    seccomp: &confine::SeccompPrograms,
    proc_dir: &OwnedFd,
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
            let reason = agent_child(plan, seccomp, &report_write, go_read);
            let _ = nix::unistd::write(&report_write, reason.as_bytes());
            std::process::exit(EXIT_SETUP_FAILED)
        }
        Ok(ForkResult::Parent { child }) => {
            drop(report_write);
            drop(go_read);
            // The child reports back after entering its user namespace; we map its ids.
            let mut byte = [0u8; 1];
            let got = nix::unistd::read(&report_read, &mut byte).map_err(|e| e.to_string())?;
            if got != 1 || byte[0] != READY {
                let rest = read_all(&report_read);
                return Err(format!(
                    "the agent process failed before its user namespace: {}{rest}",
                    String::from_utf8_lossy(&byte[..got])
                ));
            }
            let map = format!("{} {} 1\n", plan.inner_id, plan.host_id);
            for file in ["uid_map", "gid_map"] {
                write_proc_file(proc_dir, &format!("{child}/{file}"), map.as_bytes())
                    .map_err(|e| format!("writing the agent's {file}: {e}"))?;
            }
            nix::unistd::write(&go_write, &[READY]).map_err(|e| e.to_string())?;
            let failure = read_all(&report_read);
            if failure.is_empty() {
                Ok((child, confine::REQUIRED_LANDLOCK_ABI as u32))
            } else {
                let _ = waitpid(child, None);
                Err(failure)
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
) -> String {
    let step = || -> Result<(), String> {
        nix::unistd::setsid().map_err(|e| format!("setsid: {e}"))?;
        limit_open_files(plan.files)?;
        // Restore the default signal mask pid 1 set up for itself.
        SigSet::all().thread_unblock().map_err(|e| e.to_string())?;
        confine::clear_groups().map_err(|e| e.to_string())?;
        unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| format!("new user namespace: {e}"))?;
        nix::unistd::write(report, &[READY]).map_err(|e| e.to_string())?;
        // While pid 1 writes the id map: build the Landlock ruleset (it opens the allowed
        // paths and reads the executables' headers; enforcing it comes after no_new_privs).
        let landlock = confine::prepare_landlock(&plan.landlock).map_err(|e| e.to_string())?;
        let mut byte = [0u8; 1];
        if nix::unistd::read(&go, &mut byte).map_err(|e| e.to_string())? != 1 {
            return Err("pid 1 did not map the agent's ids".into());
        }
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
