//! `tollgate-shim`: builds one sandbox from the plan the supervisor sends, starts the agent in
//! it, and is the sandbox's pid 1.
//!
//! The supervisor starts the shim with the control socket on fd 3 ([`CONTROL_FD`]), often
//! ahead of need, already in the sandbox's cgroup (it joined before it ran anything: see
//! [`spawner`]), and only then sends the first message
//! (the go-ahead: the part of the sandbox no receipt decides). Everything that does not depend
//! on the plan happens before the plan arrives, and the supervisor applies the run's limits to
//! the cgroup before it sends the plan. Then, in two processes that stay (and one that
//! does not):
//!
//! 1. **the shim as started** (host pid namespace, real root, its own process group):
//!    waits for the go-ahead and does nothing before it; then compiles the seccomp
//!    programs, unshares mount, pid, net, ipc, uts and cgroup namespaces, forks pid 1 as
//!    the supervisor's own child (`CLONE_PARENT`), tells the supervisor pid 1's host pid
//!    (`PidOne`) and exits. The supervisor reaps both, and finds a pid 1 it was not told
//!    of (this process killed in between) through the process group.
//! 2. **pid 1** (new namespaces, real root): prepares what needs no plan, reads the plan
//!    (it writes nothing on the control socket before it has the plan), builds the root file system
//!    ([`setup`]), forks the agent, writes the agent's uid/gid map, reports `Started`, then
//!    reaps children and watches the control socket. It holds the run's gateway listening
//!    socket (sent with the plan) and, each time the supervisor asks (`Accept`), accepts one
//!    connection on it and hands it over on the control socket (`Connection`, SCM_RIGHTS),
//!    keeping its copy until the supervisor says it holds it (`Received`) and sending it
//!    again if its descriptor did not arrive (`Resend`).
//!    When the agent exits it reports `Exited` and exits; when the
//!    socket closes (the supervisor is gone) it exits at once. Either way the kernel kills
//!    everything left in the pid namespace.
//! 3. **agent**: clears groups, enters a new user namespace where it is an unprivileged
//!    mapped id (unique on the host), drops every capability (bounding set too), sets
//!    `no_new_privs`, applies Landlock and seccomp ([`confine`]), closes inherited fds and
//!    executes the agent's argv in a new session.
//!
//! The shim is single-threaded, so a fork here is ordinary (no other thread can hold a lock).

// Every `unsafe` block is allowed where it stands, with its `// SAFETY:` line.
#![deny(unsafe_code)]

mod agent;
pub mod child;
pub mod confine;
pub mod egress;
mod enter;
mod held;
mod helper;
pub mod models;
pub mod powers;
pub mod probe;
pub mod setup;
pub mod spawner;
#[cfg(test)]
mod tests;
pub mod tool;

use std::io::Write as _;
use std::os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tollgate_shim_protocol::plan::{self, SandboxPlan, INPUT_MARKER};
use tollgate_shim_protocol::protocol::{AgentExit, FromShim, ToShim, CONTROL_FD, DETACH_FDS};

pub use agent::EXIT_SETUP_FAILED;

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
    // The go-ahead first, before anything of the sandbox: the supervisor sends it once this
    // process has started (in its cgroup: it joined before it ran). Nothing is compiled,
    // unshared or forked before it arrives. The reader goes to pid 1 (the plan cannot have
    // come with it: it is sent only once the supervisor has read `PidOne`).
    let mut reader = ControlReader::new(&control);
    let base = match reader.next_message() {
        Ok(ToShim::Prepare(base)) => *base,
        Ok(ToShim::Start(_)) => fail(&mut control_writer, "the plan came before the base".into()),
        Ok(other) => fail(
            &mut control_writer,
            format!("{other:?} came before the base"),
        ),
        Err(reason) => fail(&mut control_writer, reason),
    };
    // Everything that does not depend on the plan comes next: the supervisor starts shims
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
    // pid 1 is forked as the supervisor's own child, and this process exits once it has
    // said which pid that is: a sandbox is two processes (pid 1 and the agent), not three,
    // for the kernel to schedule, map, walk and kill. Nothing was sent after the go-ahead
    // yet (the supervisor sends the plan only once it has read `PidOne`), so pid 1 has
    // everything this process read.
    #[allow(unsafe_code)]
    // SAFETY: this process is single-threaded (nothing here starts a thread), no flag is
    // added, and the child runs `pid_one` only, which never returns.
    match unsafe { spawner::fork_for_parent(0, None) } {
        Ok(0) => pid_one(reader, &base, seccomp, control_writer),
        Ok(host_pid) => {
            send(&mut control_writer, &FromShim::PidOne { host_pid });
            std::process::exit(0)
        }
        Err(e) => fail(&mut control_writer, format!("forking pid 1: {e}")),
    }
}

fn fail_early(reason: &str) -> ! {
    eprintln!("tollgate-shim: {reason}");
    std::process::exit(EXIT_SETUP_FAILED)
}

/// What has come on a control socket and is not yet taken: bytes of lines not yet parsed, and
/// the descriptors (SCM_RIGHTS) that came with them, in the order sent. Read with `recvmsg`,
/// so descriptors sent with a message (the plan's detached grant mounts, a detach's) arrive
/// with it; a plain buffered read would drop them.
#[derive(Default)]
struct Inbox {
    buffer: Vec<u8>,
    fds: std::collections::VecDeque<OwnedFd>,
}

impl Inbox {
    /// The next complete message already received, if any.
    fn message(&mut self) -> Option<Result<ToShim, String>> {
        let end = self.buffer.iter().position(|&b| b == b'\n')?;
        let line: Vec<u8> = self.buffer.drain(..=end).collect();
        Some(serde_json::from_slice(&line).map_err(|e| format!("invalid message: {e}")))
    }

    /// Receives once from `socket` (blocking until something comes); `false` at its end.
    fn receive(&mut self, socket: &UnixStream) -> Result<bool, String> {
        use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
        let mut chunk = [0u8; 16 * 1024];
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; 253]);
        let mut iov = [std::io::IoSliceMut::new(&mut chunk)];
        let received = recvmsg::<()>(
            socket.as_raw_fd(),
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
        self.buffer.extend_from_slice(&chunk[..bytes]);
        Ok(bytes > 0)
    }

    /// Every descriptor received so far, in the order sent.
    fn take_all(&mut self) -> Vec<OwnedFd> {
        self.fds.drain(..).collect()
    }
}

/// Reads the supervisor's messages from the control socket one at a time, blocking.
struct ControlReader<'a> {
    socket: &'a UnixStream,
    inbox: Inbox,
}

impl<'a> ControlReader<'a> {
    fn new(socket: &'a UnixStream) -> Self {
        Self {
            socket,
            inbox: Inbox::default(),
        }
    }

    /// The next message (one JSON line).
    fn next_message(&mut self) -> Result<ToShim, String> {
        loop {
            if let Some(message) = self.inbox.message() {
                return message;
            }
            if !self.inbox.receive(self.socket)? {
                return Err("the supervisor closed the control socket".into());
            }
        }
    }

    /// The next `count` descriptors received, in the order they were sent.
    fn take_fds(&mut self, count: usize) -> Result<Vec<OwnedFd>, String> {
        if self.inbox.fds.len() != count {
            return Err(format!(
                "the plan has {count} descriptors (mounts and the gateway socket) but {} came with it",
                self.inbox.fds.len()
            ));
        }
        Ok(self.inbox.take_all())
    }

    /// What was received and not yet taken.
    fn into_inbox(self) -> Inbox {
        self.inbox
    }
}

/// Moves pid 1 (single-threaded, alone in the sandbox: the shim has exited and the agent is
/// not forked yet) into the run's cgroup in each v1 hierarchy whose `tasks` file the
/// supervisor sent (a write of `0` moves the writer; the file was opened by the supervisor,
/// whose credentials the kernel checks), then gives it a cgroup namespace rooted there, so
/// the agent sees its own cgroups as `/`, as it would had the sandbox started in them. The
/// files are closed on return: pid 1 keeps nothing of them for the run's life.
fn join_run_cgroup(tasks: Vec<OwnedFd>) -> Result<(), String> {
    if tasks.is_empty() {
        return Ok(());
    }
    for (index, file) in tasks.iter().enumerate() {
        match nix::unistd::write(file, b"0") {
            Ok(1) => {}
            Ok(n) => {
                return Err(format!(
                    "joining the run's cgroup (v1 hierarchy {index}): {n} of 1 byte written"
                ))
            }
            Err(e) => {
                return Err(format!(
                    "joining the run's cgroup (v1 hierarchy {index}): {e}"
                ))
            }
        }
    }
    unshare(CloneFlags::CLONE_NEWCGROUP)
        .map_err(|e| format!("a cgroup namespace rooted at the run's cgroup: {e}"))
}

fn pid_one(
    mut reader: ControlReader<'_>,
    base: &plan::SandboxBase,
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
    // Everything that does not need the plan, before it: a sandbox prepared ahead of need
    // has done all of it when a run takes it. A failure is said only once the plan has come:
    // until then the process that forked this one may still be writing `PidOne`, which the
    // supervisor reads first.
    let ready = prepare_without_plan(base, seccomp);
    let plan = match reader.next_message() {
        Ok(ToShim::Start(plan)) => *plan,
        Ok(ToShim::Prepare(_)) => fail(
            &mut control,
            "a second base came instead of the plan".into(),
        ),
        Ok(other) => fail(&mut control, format!("{other:?} came instead of the plan")),
        // The supervisor is gone, or discarded this sandbox unused: nothing to tell it.
        Err(reason) => fail_early(&reason),
    };
    let (seccomp, signals) = match ready {
        Ok(ready) => ready,
        Err(reason) => fail(&mut control, reason),
    };
    let has_gateway = plan.gateway_socket.is_some();
    let mut mounts = match reader.take_fds(plan.descriptors()) {
        Ok(mounts) => mounts,
        Err(reason) => fail(&mut control, reason),
    };
    // The run's cgroup v1 hierarchies come first when this sandbox started in its shard's
    // (see `SandboxPlan::cgroup_joins`): joined before anything of the run is made.
    let joins: Vec<OwnedFd> = mounts
        .drain(..plan.cgroup_joins.min(mounts.len()))
        .collect();
    if let Err(reason) = join_run_cgroup(joins) {
        fail(&mut control, reason);
    }
    // The run's gateway listening socket comes last: pid 1 holds it and accepts on it for
    // the supervisor, one connection each time it is asked.
    let gateway = match has_gateway.then(|| mounts.pop()).flatten() {
        Some(fd) => {
            let listener = UnixListener::from(fd);
            if let Err(e) = listener.set_nonblocking(true) {
                fail(&mut control, format!("the gateway socket: {e}"));
            }
            Some(listener)
        }
        None => None,
    };
    // Nothing else comes before the supervisor has read `Started`; kept all the same.
    let inbox = reader.into_inbox();
    // The agent's input, made while the host's /dev/ptmx is still reachable (before the
    // root is switched): the agent gets one end, the supervisor the other.
    let input = match agent::AgentStdio::for_plan(&plan) {
        Ok(input) => input,
        Err(reason) => fail(&mut control, reason),
    };
    let finished = setup::PlanMounts::take(&plan, mounts)
        .and_then(|mounts| setup::finish_root(base, &plan, mounts));
    if let Err(e) = finished {
        fail(&mut control, e.to_string());
    }
    // The executables' interpreters, resolved once, now, before the agent exists: a command
    // the gateway runs in this sandbox later gets this very list.
    let mut plan = plan;
    plan.landlock.execute = confine::with_interpreters(&plan.landlock.execute);
    plan.landlock.execute_resolved = true;
    let plan = &plan;
    // This namespace's /proc: the agent's pid as fork returns it is the one it has here.
    let proc_dir = match agent::open_proc() {
        Ok(fd) => fd,
        Err(reason) => fail(&mut control, reason),
    };
    if let Some(models) = plan.models {
        let args = vec!["--port".into(), models.port.to_string()];
        let helper = Helper {
            name: "the model endpoint",
            verb: "models",
            args,
            port: models.port,
        };
        if let Err(reason) = start_helper(plan, helper, &seccomp, &proc_dir) {
            fail(&mut control, reason);
        }
    }
    if let Some(egress) = plan.egress {
        let args = vec![
            "--port".into(),
            egress.port.to_string(),
            "--channels".into(),
            egress.channels.to_string(),
        ];
        let helper = Helper {
            name: "the egress proxy",
            verb: "egress",
            args,
            port: egress.port,
        };
        if let Err(reason) = start_helper(plan, helper, &seccomp, &proc_dir) {
            fail(&mut control, reason);
        }
    }
    let (agent, landlock_abi) = match agent::start_agent(plan, &seccomp, &proc_dir, input.as_ref())
    {
        Ok(started) => started,
        Err(reason) => fail(&mut control, reason),
    };
    // The supervisor's end goes to it (pid 1 keeps no copy: the agent's exit is then the
    // terminal's hang-up, or the pipe's last reader gone).
    if let Some(input) = input {
        if let Err(reason) = send_marker_with_fd(&control, input.supervisor_end()) {
            fail(&mut control, reason);
        }
    }
    send(
        &mut control,
        &FromShim::Started {
            agent_pid: agent.as_raw(),
            landlock_abi,
            execute: plan.landlock.execute.clone(),
        },
    );
    let link = Link::Attached(Attached::new(
        control,
        inbox,
        held::HeldConnections::default(),
    ));
    let exit = supervise(agent, link, gateway, &signals, &plan.landlock.execute);
    // Exiting as pid 1 makes the kernel kill everything left in the namespace.
    std::process::exit(match exit {
        Some(AgentExit::Code(code)) => code,
        Some(AgentExit::Signal(signal)) => 128 + signal,
        None => EXIT_SETUP_FAILED,
    })
}

/// pid 1's part of the sandbox that needs no plan: the seccomp programs (compiled before the
/// fork), the root's preparation, and SIGCHLD through a signalfd, so that one poll() watches
/// children and the socket. The failure's one line, said once the plan has come.
fn prepare_without_plan(
    base: &plan::SandboxBase,
    seccomp: Result<confine::SeccompPrograms, confine::ConfineError>,
) -> Result<(confine::SeccompPrograms, SignalFd), String> {
    let seccomp = seccomp.map_err(|e| e.to_string())?;
    setup::prepare_root(base).map_err(|e| e.to_string())?;
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    mask.thread_block()
        .map_err(|e| format!("blocking SIGCHLD: {e}"))?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| format!("signalfd: {e}"))?;
    Ok((seccomp, signals))
}

/// A supervisor connected to pid 1: its control socket, what came on it and is not yet
/// taken, how many gateway connections it has asked for and not yet been handed, the
/// connections pid 1 holds until they have spoken and are asked for, and the connection
/// handed over last until the supervisor says it holds it.
struct Attached {
    control: UnixStream,
    inbox: Inbox,
    asked: u32,
    /// `ConnectionWaiting` was said and no `Accept` has come since: said again only after one.
    announced: bool,
    /// Accepted connections not yet handed over: only those that have spoken are offered.
    held: held::HeldConnections,
    /// The connection handed over last, kept until the supervisor says it holds it
    /// (`Received`): one whose descriptor did not arrive (the supervisor had no free number
    /// for it) is sent again (`Resend`) instead of being closed on its caller. One at most:
    /// the supervisor asks for the next only once it holds the last, so an `Accept` drops it
    /// too. Kept, it holds the connection open on its caller's side, so it is dropped as soon
    /// as the supervisor says so.
    handed: Option<OwnedFd>,
}

impl Attached {
    fn new(control: UnixStream, inbox: Inbox, held: held::HeldConnections) -> Self {
        Self {
            control,
            inbox,
            asked: 0,
            announced: false,
            held,
            handed: None,
        }
    }

    /// Whether the gateway socket is watched: while pid 1 has room to hold another
    /// connection.
    fn watches_gateway(&self) -> bool {
        self.held.accepting()
    }

    /// The gateway socket is readable: accepts what waits (up to the bound) and offers
    /// those that have already spoken.
    fn on_gateway(&mut self, gateway: &UnixListener) {
        self.held.accept_from(gateway);
        self.on_silent();
    }

    /// A silent connection is readable: it spoke (offered) or hung up (dropped).
    fn on_silent(&mut self) {
        self.held.sort_silent();
        self.offer();
    }

    /// Hands over spoken connections for what was asked, keeping each until the supervisor
    /// says it holds it; with none asked, says once that one waits (the supervisor asks only
    /// once it can take it).
    fn offer(&mut self) {
        while self.asked > 0 {
            let Some(connection) = self.held.next_spoken() else {
                break;
            };
            self.asked -= 1;
            self.handed = Some(OwnedFd::from(connection));
            self.send_handed();
        }
        if self.asked == 0 && self.held.has_spoken() && !self.announced {
            self.announced = true;
            send(&mut self.control, &FromShim::ConnectionWaiting);
        }
    }

    /// Reads what the supervisor sent: each `Accept` is counted, `Received` drops the kept
    /// connection, `Resend` sends it again, a `Detach` with its descriptors detaches,
    /// anything else is ignored. `None` once the socket has ended or failed: the supervisor
    /// is gone without detaching (a crash).
    fn read(mut self) -> Option<Link> {
        match self.inbox.receive(&self.control) {
            Ok(true) => {}
            Ok(false) | Err(_) => return None,
        }
        while let Some(message) = self.inbox.message() {
            match message {
                Ok(ToShim::Accept) => {
                    self.handed = None;
                    self.asked = self.asked.saturating_add(1);
                    self.announced = false;
                }
                Ok(ToShim::Received) => self.handed = None,
                Ok(ToShim::Resend) => self.send_handed(),
                Ok(ToShim::Detach { until_ms }) => {
                    let fds = self.inbox.take_all();
                    if let Some(mut detached) = detach(&mut self.control, fds, until_ms) {
                        // Held connections wait for the next supervisor.
                        if let Link::Detached { connections, .. } = &mut detached {
                            *connections = std::mem::take(&mut self.held);
                        }
                        // The control socket closes here: the old supervisor's watch ends,
                        // and the kept connection (if any) is dropped with `self`.
                        return Some(detached);
                    }
                }
                // Anything else is ignored, with whatever came with it.
                _ => drop(self.inbox.take_all()),
            }
        }
        self.offer();
        Some(Link::Attached(self))
    }

    /// Sends the kept connection (`Connection`, SCM_RIGHTS), or `NotAccepted` when none is
    /// kept. One that cannot go with its descriptor (out of memory, or the supervisor gone)
    /// is announced without it: a supervisor still there asks for it again.
    fn send_handed(&mut self) {
        let Some(connection) = &self.handed else {
            send(&mut self.control, &FromShim::NotAccepted);
            return;
        };
        if send_with_fds(
            &self.control,
            &FromShim::Connection,
            std::slice::from_ref(connection),
        )
        .is_err()
        {
            send(&mut self.control, &FromShim::Connection);
        }
    }
}

/// What pid 1 watches besides its children: the supervisor's control socket, or, while
/// detached for a live restore, the listener the next supervisor connects to.
enum Link {
    /// A supervisor is connected: its end of the socket closing ends the run (fail closed).
    Attached(Attached),
    /// The supervisor stopped cleanly and handed over what must outlive it.
    Detached {
        /// Where the next supervisor connects.
        listener: UnixListener,
        /// stdout and stderr read ends, handed back on re-adoption.
        held: Vec<OwnedFd>,
        /// When the sandbox ends if nobody re-adopts it.
        until: SystemTime,
        /// Gateway connections accepted and not yet handed over, for the next supervisor.
        connections: held::HeldConnections,
    },
}

/// Reaps children until the agent exits (its status, reported to a supervisor) or the run
/// must end without one: the supervisor went away without detaching, or the detached
/// deadline passed (`None`). While detached, an agent's exit is kept for the supervisor that
/// re-adopts the sandbox. While a supervisor is attached, pid 1 accepts connections on
/// `gateway` (the run's gateway socket, which it holds for the run's whole life, detached or
/// not), holds each until it has spoken, and hands those over as they are asked for.
fn supervise(
    agent: Pid,
    mut link: Link,
    gateway: Option<UnixListener>,
    signals: &SignalFd,
    execute: &[std::path::PathBuf],
) -> Option<AgentExit> {
    let mut exited: Option<AgentExit> = None;
    loop {
        let (watched, timeout, accepting) = match &link {
            Link::Attached(attached) => (
                attached.control.as_fd(),
                // Woken when a failed accept's back-off ends or a silent connection's
                // deadline passes.
                attached.held.wake_in().map_or(PollTimeout::NONE, |left| {
                    let millis = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
                    PollTimeout::from(millis.max(1))
                }),
                attached.watches_gateway(),
            ),
            Link::Detached {
                listener, until, ..
            } => {
                let left = until
                    .duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO);
                if left.is_zero() {
                    // The shim's own deadline: exiting makes the kernel end the sandbox.
                    return None;
                }
                let millis = u16::try_from(left.as_millis().min(60_000)).unwrap_or(u16::MAX);
                (listener.as_fd(), PollTimeout::from(millis.max(1)), false)
            }
        };
        let mut fds = vec![
            PollFd::new(watched, PollFlags::POLLIN),
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
        ];
        // Only while pid 1 has room to hold another: otherwise connections wait in the
        // socket's backlog.
        let gateway_at = gateway.as_ref().filter(|_| accepting).map(|gateway| {
            fds.push(PollFd::new(gateway.as_fd(), PollFlags::POLLIN));
            fds.len() - 1
        });
        let silent_from = fds.len();
        if let Link::Attached(attached) = &link {
            fds.extend(attached.held.silent_polls());
        }
        let Ok(woken) = poll(&mut fds, timeout) else {
            continue;
        };
        let ready = |fd: &PollFd<'_>, flags: PollFlags| {
            fd.revents().unwrap_or(PollFlags::empty()).intersects(flags)
        };
        let closed = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
        let link_ready = ready(&fds[0], closed);
        let child_ready = ready(&fds[1], PollFlags::POLLIN);
        let gateway_ready = gateway_at.is_some_and(|at| ready(&fds[at], closed));
        // A timeout may be a silent connection's deadline.
        let silent_ready = woken == 0 || fds[silent_from..].iter().any(|fd| ready(fd, closed));
        drop(fds);
        if child_ready {
            let _ = signals.read_signal();
            if let Some(exit) = reap(agent) {
                match &mut link {
                    Link::Attached(attached) => {
                        send(&mut attached.control, &FromShim::Exited(exit));
                        return Some(exit);
                    }
                    Link::Detached { .. } => exited = Some(exit),
                }
            }
        }
        if let (true, Link::Attached(attached)) = (silent_ready, &mut link) {
            attached.on_silent();
        }
        if let (true, Link::Attached(attached), Some(gateway)) =
            (gateway_ready, &mut link, gateway.as_ref())
        {
            attached.on_gateway(gateway);
        }
        if !link_ready {
            continue;
        }
        link = match link {
            // `None`: the supervisor is gone without detaching (a crash): fail closed.
            Link::Attached(attached) => attached.read()?,
            Link::Detached {
                listener,
                held,
                until,
                connections,
            } => match reattach(&listener, &held, agent, execute) {
                Some(mut control) => {
                    if let Some(exit) = exited {
                        send(&mut control, &FromShim::Exited(exit));
                        return Some(exit);
                    }
                    let mut attached = Attached::new(control, Inbox::default(), connections);
                    // What spoke while no supervisor was attached is offered to this one.
                    attached.offer();
                    Link::Attached(attached)
                }
                None => Link::Detached {
                    listener,
                    held,
                    until,
                    connections,
                },
            },
        };
    }
}

/// The agent's status once it has ended; other children are reaped along the way.
fn reap(agent: Pid) -> Option<AgentExit> {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == agent => {
                return Some(AgentExit::Code(code))
            }
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == agent => {
                return Some(AgentExit::Signal(signal as i32))
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return None,
            Ok(_) => continue,
        }
    }
}

/// Takes a `Detach`'s descriptors over: the listener the next supervisor connects to, then
/// the output pipes to hold. `None` (the detach is ignored and the supervisor stays
/// attached) when they are not what a detach carries.
fn detach(control: &mut UnixStream, fds: Vec<OwnedFd>, until_ms: u64) -> Option<Link> {
    if fds.len() != DETACH_FDS {
        return None;
    }
    let mut fds = fds.into_iter();
    let listener = UnixListener::from(fds.next()?);
    listener.set_nonblocking(true).ok()?;
    send(control, &FromShim::Detached);
    Some(Link::Detached {
        listener,
        held: fds.collect(),
        until: UNIX_EPOCH + Duration::from_millis(until_ms),
        connections: held::HeldConnections::default(),
    })
}

/// Serves one connection to the detach listener: a root peer that asks to `Reattach` gets
/// the held descriptors and becomes the control socket. Anything else is dropped.
fn reattach(
    listener: &UnixListener,
    held: &[OwnedFd],
    agent: Pid,
    execute: &[std::path::PathBuf],
) -> Option<UnixStream> {
    let (stream, _) = listener.accept().ok()?;
    stream.set_nonblocking(false).ok()?;
    // Only root may take a sandbox over (the socket lives in the root-only data directory).
    let peer =
        nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials).ok()?;
    if peer.uid() != 0 {
        return None;
    }
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut reader = ControlReader::new(&stream);
    if !matches!(reader.next_message(), Ok(ToShim::Reattach)) {
        return None;
    }
    drop(reader);
    stream.set_read_timeout(None).ok()?;
    let answer = FromShim::Reattached {
        agent_pid: agent.as_raw(),
        execute: execute.to_vec(),
        keeps_connections: true,
    };
    send_with_fds(&stream, &answer, held).ok()?;
    Some(stream)
}

/// Sends one message with descriptors attached (SCM_RIGHTS).
fn send_with_fds(control: &UnixStream, message: &FromShim, fds: &[OwnedFd]) -> Result<(), String> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let mut line = serde_json::to_vec(message).map_err(|e| e.to_string())?;
    line.push(b'\n');
    let raw: Vec<std::os::fd::RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let rights = [ControlMessage::ScmRights(&raw)];
    let iov = [std::io::IoSlice::new(&line)];
    let sent = sendmsg::<()>(control.as_raw_fd(), &iov, &rights, MsgFlags::empty(), None)
        .map_err(|e| e.to_string())?;
    // The rest of a long line, without descriptors (they went with the first byte).
    if sent < line.len() {
        (&*control)
            .write_all(&line[sent..])
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Sends [`INPUT_MARKER`] alone with `fd` attached (SCM_RIGHTS): the supervisor reads it with
/// `recvmsg` before the line-based messages that follow.
fn send_marker_with_fd(control: &UnixStream, fd: OwnedFd) -> Result<(), String> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let raw = [fd.as_raw_fd()];
    let rights = [ControlMessage::ScmRights(&raw)];
    let iov = [std::io::IoSlice::new(&[INPUT_MARKER])];
    sendmsg::<()>(control.as_raw_fd(), &iov, &rights, MsgFlags::empty(), None)
        .map_err(|e| format!("handing over the agent's input: {e}"))?;
    Ok(())
}

/// A `tollgate-shim` helper pid 1 starts beside the agent, serving on the sandbox's loopback.
struct Helper {
    /// What it is, for messages.
    name: &'static str,
    /// Its `tollgate-shim` verb.
    verb: &'static str,
    /// Its arguments.
    args: Vec<String>,
    /// The port it listens on.
    port: u16,
}

/// Starts a helper (the model endpoint, `tollgate-shim models`; the egress proxy,
/// `tollgate-shim egress`) as the agent's sibling, confined exactly as the agent is (same
/// uid, Landlock rules, seccomp filter; it may do nothing the agent could not do over the
/// gateway itself), and waits until it listens, so the agent's first request finds it.
fn start_helper(
    plan: &SandboxPlan,
    helper: Helper,
    seccomp: &confine::SeccompPrograms,
    proc_dir: &OwnedFd,
) -> Result<(), String> {
    let Helper {
        name,
        verb,
        args,
        port,
    } = helper;
    let mut endpoint = plan.clone();
    endpoint.agent = plan::AgentCommand {
        argv: [plan::SHIM_IN_SANDBOX.into(), verb.into()]
            .into_iter()
            .chain(args)
            .collect(),
        env: vec![(
            "TOLLGATE_GATEWAY".into(),
            format!("unix:{}", plan::GATEWAY_IN_SANDBOX),
        )],
        cwd: "/".into(),
    };
    agent::start_agent(&endpoint, seccomp, proc_dir, None)
        .map_err(|reason| format!("{name} did not start: {reason}"))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    while std::net::TcpStream::connect(address).is_err() {
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "{name} did not listen on 127.0.0.1:{port} within 5 s"
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}
