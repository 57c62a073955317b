//! From a verified receipt to a running sandbox: the plan (pure, unit-tested) and the spawn
//! of `tollgate-shim` in the sandbox's cgroup (see [`crate::warm`] for sandboxes prepared
//! ahead of need).

use std::fs;
use std::io::{BufRead as _, BufReader, PipeReader, Write as _};
use std::os::fd::{AsFd as _, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use tollgate_proto::v1 as pb;
use tollgate_shim_protocol::plan::{
    egress_ca_env, proxy_env, AgentCommand, AgentInput, Bind, EgressProxy, LandlockPlan,
    ModelsEndpoint, SandboxBase, SandboxPlan, EGRESS_CA_IN_SANDBOX, EGRESS_PORT,
    GATEWAY_IN_SANDBOX, INPUT_MARKER, MODELS_PORT, SHIM_IN_SANDBOX,
};
use tollgate_shim_protocol::protocol::{FromShim, ToShim, CONTROL_FD, PID_ONE_FD, REATTACH_FDS};

use crate::cgroup::RunCgroup;

/// Host directories shown read-only inside every sandbox (those that exist on the host): the
/// receipt crate's list, the same one the authority refuses mount targets beneath.
pub use tollgate_receipt::paths::SYSTEM_PATHS;

/// What every sandbox of this supervisor shares: the mount point of the new root
/// (`<data-dir>/root`, empty; each sandbox mounts its root there in its own mount namespace),
/// the system directories shown read-only (`/etc` is generated instead), and the shim binary (the agent's gateway client,
/// at `/run/tollgate/bin/tollgate-shim`).
pub fn sandbox_base(data_dir: &Path, shim: &Path) -> SandboxBase {
    SandboxBase {
        hostname: "tollgate".into(),
        root_dir: data_dir.join("root"),
        // The shim skips system paths this host lacks, and generates /etc instead of showing
        // the host's.
        system_paths: SYSTEM_PATHS
            .iter()
            .filter(|path| **path != "/etc")
            .map(PathBuf::from)
            .collect(),
        shim_binary: Some(shim.to_owned()),
    }
}

/// Creates the (empty, root-owned, traversable) mount point of `base`.
pub fn create_mount_point(base: &SandboxBase) -> Result<(), SandboxError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(&base.root_dir)
        .map_err(|source| SandboxError::RunDir {
            path: base.root_dir.clone(),
            source,
        })
}

/// The agent's uid and gid inside its user namespace.
pub const AGENT_INNER_ID: u32 = 1000;

/// A sandbox could not be prepared or started.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The receipt pins no agent and none was given.
    #[error("no agent command: the receipt pins none and none was given")]
    NoAgent,
    /// The agent's executable is not in the receipt's exec list.
    #[error("{0} is not in the receipt's exec list")]
    NotExecutable(String),
    /// The agent's executable is not on a path the sandbox mounts executable.
    #[error("{0} cannot run in a sandbox: only programs on the system paths (/usr, /bin, ...) or beneath a read grant's mount are executable there; write grants, /work and /tmp are mounted noexec")]
    NotInSandbox(String),
    /// A file-system grant cannot be mounted safely (re-checked here: the supervisor does
    /// not rely on every signer having validated it).
    #[error("fs grant {path}: {reason}")]
    BadGrant {
        /// The grant's host path.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// Preparing the run directory failed.
    #[error("preparing {path}: {source}")]
    RunDir {
        /// The directory.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// Starting `tollgate-shim` failed.
    #[error("starting {shim}: {source}")]
    Spawn {
        /// The shim binary.
        shim: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// Talking to the shim failed.
    #[error("control socket: {0}")]
    Control(std::io::Error),
    /// The shim reported a failure (the step and reason).
    #[error("sandbox setup failed: {0}")]
    Setup(String),
}

/// Where a run's host-side files live: `<runs>/<run_id>/work`.
#[derive(Debug, Clone)]
pub struct RunDirs {
    /// `<runs>/<run_id>`.
    pub base: PathBuf,
    /// The workspace, shown at `/work`.
    pub work: PathBuf,
}

impl RunDirs {
    /// The directories of `run_id` under `runs`.
    pub fn new(runs: &Path, run_id: &str) -> Self {
        let base = runs.join(run_id);
        Self {
            work: base.join("work"),
            base,
        }
    }

    /// Creates them: `base` 0711 (owned by root, traversable), `work` 0700 owned by the
    /// sandbox's host id so only that sandbox's agent can use it.
    pub fn create(&self, host_id: u32) -> Result<(), SandboxError> {
        let error = |path: &Path| {
            let path = path.to_owned();
            move |source| SandboxError::RunDir { path, source }
        };
        for dir in [&self.base, &self.work] {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o711)
                .create(dir)
                .map_err(error(dir))?;
        }
        fs::set_permissions(&self.work, fs::Permissions::from_mode(0o700))
            .map_err(error(&self.work))?;
        nix::unistd::chown(
            &self.work,
            Some(nix::unistd::Uid::from_raw(host_id)),
            Some(nix::unistd::Gid::from_raw(host_id)),
        )
        .map_err(|e| SandboxError::RunDir {
            path: self.work.clone(),
            source: e.into(),
        })
    }

    /// Removes everything (after the sandbox's mounts died with its namespace).
    pub fn remove(&self) -> Result<(), SandboxError> {
        match fs::remove_dir_all(&self.base) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(SandboxError::RunDir {
                path: self.base.clone(),
                source,
            }),
        }
    }
}

/// Re-checks the receipt's mounts and gateway-only programs with the receipt crate's rules,
/// the ones the authority applies before it signs (the supervisor does not rely on every
/// signer having done so).
fn check_mounts(receipt: &pb::Receipt) -> Result<(), SandboxError> {
    tollgate_receipt::paths::check_mounts(&receipt.fs).map_err(|e| SandboxError::BadGrant {
        path: receipt.fs[e.index()].path.clone(),
        reason: e.to_string(),
    })?;
    tollgate_receipt::paths::check_gateway_exec(&receipt.gateway_exec, &receipt.fs, &receipt.exec)
        .map_err(|e| SandboxError::BadGrant {
            path: receipt.gateway_exec[e.index].program.clone(),
            reason: e.to_string(),
        })
}

/// Builds the sandbox plan for `receipt`. `argv` overrides the receipt's pinned agent (the
/// caller checks the receipt allows that); `rootfs` is the host path of the root file
/// system the receipt names, resolved by the caller (none: the host's userland). Writes
/// nothing; reads only which system paths exist on the host or in the root file system.
pub fn plan_for(
    receipt: &pb::Receipt,
    dirs: &RunDirs,
    host_id: u32,
    argv: Option<Vec<String>>,
    rootfs: Option<&Path>,
) -> Result<SandboxPlan, SandboxError> {
    let pinned = receipt.agent.as_ref();
    let argv = argv
        .or_else(|| pinned.map(|a| a.argv.clone()))
        .filter(|argv| !argv.is_empty())
        .ok_or(SandboxError::NoAgent)?;
    if !receipt.exec.contains(&argv[0]) {
        return Err(SandboxError::NotExecutable(argv[0].clone()));
    }
    check_mounts(receipt)?;
    let limits = receipt.limits.unwrap_or_default();
    let binds: Vec<Bind> = receipt
        .fs
        .iter()
        .filter(|grant| !grant.mount.is_empty())
        .map(|grant| Bind {
            source: PathBuf::from(&grant.path),
            target: PathBuf::from(&grant.mount),
            writable: grant.access == pb::FsAccess::Write as i32,
            executable: grant.is_executable(&receipt.exec),
        })
        .collect();
    // System paths are shown at the same path, so the host (or the root file system) tells
    // which exist, following links as the sandbox will (a link to a directory the userland
    // lacks, like Ubuntu's /lib32, is not there for Landlock to open); /etc always does
    // (generated, or the root file system's); everything else below is a sandbox path the
    // shim creates.
    let userland = rootfs.map(open_userland).transpose()?;
    let exists = |system: &str| match &userland {
        Some(userland) => exists_in_userland(userland, system),
        None => system == "/etc" || Path::new(system).exists(),
    };
    let mut read: Vec<PathBuf> = SYSTEM_PATHS
        .iter()
        .filter(|system| exists(system))
        .map(PathBuf::from)
        .collect();
    read.extend(["/proc", "/dev"].map(PathBuf::from));
    read.extend(
        binds
            .iter()
            .filter(|b| !b.writable)
            .map(|b| b.target.clone()),
    );
    let mut write: Vec<PathBuf> = ["/work", "/tmp", "/dev"].map(PathBuf::from).to_vec();
    write.extend(
        binds
            .iter()
            .filter(|b| b.writable)
            .map(|b| b.target.clone()),
    );
    let models = (!receipt.routes.is_empty()).then_some(ModelsEndpoint { port: MODELS_PORT });
    let egress = (!receipt.egress.is_empty()).then(|| EgressProxy {
        port: EGRESS_PORT,
        // 16 streams per gateway connection (the gateway's HTTP/2 bound), at most 8.
        channels: u16::try_from(tollgate_proto::effective_egress(&limits).0.div_ceil(16))
            .unwrap_or(8)
            .clamp(1, 8),
    });
    let env = agent_env(receipt, models.is_some(), egress.is_some());
    // The run's CA (inspected grants) is readable; the run manager makes it and sets
    // `egress_ca` before the plan is sent.
    if crate::egress::ca::needs_ca(receipt) {
        read.push(PathBuf::from(EGRESS_CA_IN_SANDBOX));
    }
    let cwd = pinned
        .map(|a| a.workdir.clone())
        .filter(|w| !w.is_empty())
        .unwrap_or_else(|| "/work".into());
    Ok(SandboxPlan {
        run_id: receipt.receipt_id.clone(),
        workspace: dirs.work.clone(),
        tmpfs_bytes: limits.tmpfs_bytes,
        files: tollgate_proto::effective_files(limits.files),
        binds,
        landlock: LandlockPlan {
            read,
            write,
            // The shim, the agent's gateway client, is always executable.
            execute: receipt
                .exec
                .iter()
                .map(PathBuf::from)
                .chain([PathBuf::from(SHIM_IN_SANDBOX)])
                .collect(),
            execute_resolved: false,
        },
        agent: AgentCommand {
            argv,
            env,
            cwd: PathBuf::from(cwd),
        },
        inner_id: AGENT_INNER_ID,
        models,
        egress,
        egress_ca: None,
        // Set by the run manager once the run's gateway socket is bound.
        gateway_socket: None,
        host_id,
        rootfs: rootfs.map(Path::to_owned),
        // Set by the run manager from the start request.
        input: AgentInput::Null,
        // Gateway-only programs: the agent never reaches them.
        hidden: receipt
            .gateway_exec
            .iter()
            .map(|g| PathBuf::from(&g.program))
            .collect(),
    })
}

/// The root file system's directory, to resolve its paths in (its mount comes from the
/// descriptor pinned at admission; this only decides which system paths it has).
fn open_userland(rootfs: &Path) -> Result<OwnedFd, SandboxError> {
    nix::fcntl::open(
        rootfs,
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| {
        SandboxError::Setup(format!(
            "opening the root file system {}: {e}",
            rootfs.display()
        ))
    })
}

/// Whether `path` (absolute) exists in the userland as the sandbox resolves it: links followed,
/// absolute ones from the userland's own root (`RESOLVE_IN_ROOT`), never out of it.
fn exists_in_userland(userland: &OwnedFd, path: &str) -> bool {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    nix::fcntl::openat2(userland, path.trim_start_matches('/'), how).is_ok()
}

/// The agent's environment: Tollgate's own variables (the gateway, the run id, the model
/// endpoint when a route is granted), then the receipt's, which never override them.
fn agent_env(receipt: &pb::Receipt, models: bool, egress: bool) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        (
            "PATH".into(),
            "/run/tollgate/bin:/usr/local/bin:/usr/bin:/bin".into(),
        ),
        (
            "TOLLGATE_GATEWAY".into(),
            format!("unix:{GATEWAY_IN_SANDBOX}"),
        ),
        ("HOME".into(), "/work".into()),
        ("TMPDIR".into(), "/tmp".into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("TOLLGATE_RUN_ID".into(), receipt.receipt_id.clone()),
    ];
    // With a model route granted, the official SDKs find the sandbox's own endpoint; the
    // keys are placeholders it ignores (the SDKs refuse to start without one).
    if models {
        let base = format!("http://127.0.0.1:{MODELS_PORT}");
        env.extend([
            ("OPENAI_BASE_URL".into(), format!("{base}/v1")),
            ("OPENAI_API_KEY".into(), "tollgate".into()),
            ("ANTHROPIC_BASE_URL".into(), base.clone()),
            ("ANTHROPIC_API_KEY".into(), "tollgate".into()),
            ("TOLLGATE_MODELS".into(), base),
        ]);
    }
    // With egress granted, every client that honours the proxy variables goes out through
    // the sandbox's proxy (and nothing else can: the sandbox has no route).
    if egress {
        env.extend(proxy_env(EGRESS_PORT));
    }
    // With a host inspected, the usual clients trust the run's certificate authority.
    if crate::egress::ca::needs_ca(receipt) {
        env.extend(egress_ca_env());
    }
    if let Some(agent) = receipt.agent.as_ref() {
        let mut extra: Vec<_> = agent
            .env
            .iter()
            .filter(|(k, _)| !env.iter().any(|(set, _)| set == *k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        extra.sort();
        env.extend(extra);
    }
    env
}

/// A `tollgate-shim` that has not been given its plan yet. It was started inside its
/// sandbox's cgroup (it joins every hierarchy between fork and exec, so nothing of the
/// sandbox ever runs outside that cgroup), has compiled the seccomp programs, unshared the
/// sandbox's namespaces and forked pid 1, which is blocked reading the plan on the control
/// socket. A shim serves exactly one sandbox. When the supervisor goes away the socket
/// closes and the shim exits.
#[derive(Debug)]
pub struct IdleShim {
    child: Child,
    control: UnixStream,
    stdout: PipeReader,
    stderr: PipeReader,
}

/// Sends one message as a JSON line.
fn send_line(control: &mut UnixStream, message: &ToShim) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    line.push(b'\n');
    control.write_all(&line)
}

/// Most descriptors one `sendmsg` carries (the kernel's SCM_MAX_FD is 253).
const FDS_PER_MESSAGE: usize = 250;

/// Sends one message as a JSON line with `fds` attached (SCM_RIGHTS), in order: each batch of
/// descriptors rides on one byte of the line, the rest of the line follows. The shim's
/// control reader collects them with the message.
pub(crate) fn send_line_with_fds(
    control: &mut UnixStream,
    message: &ToShim,
    fds: &[OwnedFd],
) -> std::io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let batches: Vec<Vec<RawFd>> = fds
        .chunks(FDS_PER_MESSAGE)
        .map(|batch| batch.iter().map(AsRawFd::as_raw_fd).collect())
        .collect();
    if batches.len() >= line.len() {
        return Err(std::io::Error::other(
            "too many descriptors for one message",
        ));
    }
    for (i, batch) in batches.iter().enumerate() {
        let byte = [std::io::IoSlice::new(&line[i..=i])];
        let rights = [ControlMessage::ScmRights(batch)];
        let sent = sendmsg::<()>(control.as_raw_fd(), &byte, &rights, MsgFlags::empty(), None)
            .map_err(std::io::Error::from)?;
        if sent != 1 {
            return Err(std::io::Error::other("short send on the control socket"));
        }
    }
    control.write_all(&line[batches.len()..])
}

/// Formats `value` in decimal into `buffer`, returning the digits (no allocation: used
/// between fork and exec).
fn decimal(mut value: u32, buffer: &mut [u8; 10]) -> &[u8] {
    let mut at = buffer.len();
    loop {
        at -= 1;
        buffer[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            return &buffer[at..];
        }
    }
}

/// Makes `command`'s child join a cgroup (writing its pid to each of `procs_fds`, opened
/// before the fork) between fork and exec, so nothing of it ever runs outside the cgroup, and
/// gives it `control_fd` as fd 3 and `extra_fd`, if any, as fd 4.
pub(crate) fn in_cgroup_with_control(
    command: &mut Command,
    procs_fds: Vec<RawFd>,
    control_fd: RawFd,
    extra_fd: Option<RawFd>,
) {
    #[allow(unsafe_code)]
    // SAFETY: the closure runs between fork and exec in the child and only makes
    // async-signal-safe system calls (getpid, write, fcntl, dup2) on descriptors opened
    // before the fork, with no allocation: `decimal` writes into a stack buffer.
    unsafe {
        command.pre_exec(move || {
            let mut buffer = [0u8; 10];
            let pid = decimal(libc::getpid() as u32, &mut buffer);
            for &fd in &procs_fds {
                if libc::write(fd, pid.as_ptr().cast(), pid.len()) != pid.len() as isize {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // Moved above the target numbers first, so placing one cannot overwrite the
            // other (the copies close on exec).
            let mut moved = [-1; 2];
            for (slot, fd) in moved.iter_mut().zip([Some(control_fd), extra_fd]) {
                if let Some(fd) = fd {
                    *slot = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10);
                    if *slot < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
            }
            for (target, fd) in [CONTROL_FD, PID_ONE_FD].into_iter().zip(moved) {
                // dup2 clears close-on-exec on the new number.
                if fd >= 0 && libc::dup2(fd, target) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

impl IdleShim {
    /// Starts `shim` inside `cgroup`, with the control socket on fd 3 and fresh stdout and
    /// stderr pipes, and sends it `base` to prepare.
    pub fn spawn(
        shim: &Path,
        cgroup: &RunCgroup,
        base: &SandboxBase,
    ) -> Result<Self, SandboxError> {
        let (ours, theirs) = UnixStream::pair().map_err(SandboxError::Control)?;
        let (stdout, out_write) = std::io::pipe().map_err(SandboxError::Control)?;
        let (stderr, err_write) = std::io::pipe().map_err(SandboxError::Control)?;
        let procs: Vec<OwnedFd> = cgroup
            .procs_files()
            .iter()
            .map(|file| {
                fs::OpenOptions::new()
                    .write(true)
                    .open(file)
                    .map(OwnedFd::from)
                    .map_err(|source| SandboxError::Spawn {
                        shim: file.clone(),
                        source,
                    })
            })
            .collect::<Result<_, _>>()?;
        let procs_fds: Vec<RawFd> = procs.iter().map(|fd| fd.as_raw_fd()).collect();
        let control_fd = theirs.as_raw_fd();
        let mut command = Command::new(shim);
        command
            .stdin(Stdio::null())
            .stdout(out_write)
            .stderr(err_write)
            .env_clear();
        in_cgroup_with_control(&mut command, procs_fds, control_fd, None);
        let child = command.spawn().map_err(|source| SandboxError::Spawn {
            shim: shim.to_owned(),
            source,
        })?;
        // `command` still holds the pipes' write ends: drop it so the relays see EOF once
        // the sandbox's last process has exited.
        drop(command);
        drop(theirs);
        drop(procs);
        let mut idle = Self {
            child,
            control: ours,
            stdout,
            stderr,
        };
        if let Err(e) = send_line(&mut idle.control, &ToShim::Prepare(Box::new(base.clone()))) {
            idle.discard();
            return Err(SandboxError::Control(e));
        }
        Ok(idle)
    }

    /// The shim's host pid (its only child becomes the sandbox's pid 1).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills and reaps the shim (it was never given a plan; its pid 1 exits with the
    /// socket, and the cgroup's owner kills what is left).
    pub fn discard(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a started sandbox writes: the read ends of its stdout and stderr pipes (with a
/// terminal, stdout reads the terminal's master: everything the agent writes), and the
/// supervisor's end of the agent's input when its plan asked for one.
#[derive(Debug)]
pub struct SandboxOutput {
    /// The agent's standard output.
    pub stdout: PipeReader,
    /// The agent's standard error.
    pub stderr: PipeReader,
    /// The write end of the agent's stdin pipe, or the terminal's master.
    pub input: Option<OwnedFd>,
}

/// A running `tollgate-shim` and its control socket.
#[derive(Debug)]
pub struct SandboxProcess {
    /// The shim, when this supervisor started it (a re-adopted one is not its child).
    child: Option<Child>,
    events: BufReader<UnixStream>,
    // Kept open: closing it tells pid 1 the supervisor is gone.
    control: UnixStream,
}

/// A sandbox a previous supervisor left running detached, taken over through its detach
/// socket ([`SandboxProcess::reattach`]).
#[derive(Debug)]
pub struct ReattachedSandbox {
    /// Its shim and new control socket.
    pub process: SandboxProcess,
    /// The read ends of the agent's stdout and stderr, as pid 1 held them.
    pub output: SandboxOutput,
    /// The run's gateway socket, still bound where the sandbox has it mounted.
    pub gateway: std::os::unix::net::UnixListener,
    /// The executables Landlock allows, as resolved when the sandbox started.
    pub execute: Vec<PathBuf>,
    /// A pidfd of the sandbox's pid 1.
    pub pid_one: OwnedFd,
}

impl SandboxProcess {
    /// Sends the idle `shim` its plan, with `mounts` (detached mounts of the plan's binds, in
    /// order, then its root file system's when it has one) attached, and waits for `Started`.
    /// The caller has applied the run's limits to the shim's cgroup first.
    pub fn start(
        shim: IdleShim,
        plan: &SandboxPlan,
        mounts: Vec<OwnedFd>,
    ) -> Result<(Self, FromShim, SandboxOutput), SandboxError> {
        let expected = plan.binds.len() + usize::from(plan.rootfs.is_some());
        if mounts.len() != expected {
            shim.discard();
            return Err(SandboxError::Setup(format!(
                "{} mounts for {expected} (binds and root file system)",
                mounts.len(),
            )));
        }
        let IdleShim {
            child,
            control,
            stdout,
            stderr,
        } = shim;
        let mut child = child;
        let mut control = control;
        let sent = send_line_with_fds(
            &mut control,
            &ToShim::Start(Box::new(plan.clone())),
            &mounts,
        )
        .and_then(|()| control.try_clone());
        // The shim holds its own copies now (or never will).
        drop(mounts);
        let events = match sent {
            Ok(clone) => BufReader::new(clone),
            Err(e) => {
                // A shim that failed while idle has said why before closing the socket.
                let reason = control.try_clone().ok().and_then(|clone| {
                    // Bounded: the shim may be alive and simply not reading.
                    clone
                        .set_read_timeout(Some(std::time::Duration::from_secs(1)))
                        .ok()?;
                    let mut line = String::new();
                    BufReader::new(clone).read_line(&mut line).ok()?;
                    match serde_json::from_str(&line).ok()? {
                        FromShim::Failed { reason } => Some(reason),
                        _ => None,
                    }
                });
                // Never leave a zombie (or a live shim) behind an error.
                let _ = child.kill();
                let _ = child.wait();
                return Err(match reason {
                    Some(reason) => SandboxError::Setup(reason),
                    None => SandboxError::Control(e),
                });
            }
        };
        let mut process = Self {
            child: Some(child),
            events,
            control,
        };
        // The agent's input comes first, alone with its descriptor (SCM_RIGHTS), when the
        // plan asks for one; anything else there is the start of the shim's failure line.
        let mut input = None;
        let mut stdout = stdout;
        if plan.input != AgentInput::Null {
            match recv_byte_with_fds(&process.control) {
                Ok((INPUT_MARKER, mut fds)) if fds.len() == 1 => {
                    let end = fds.remove(0);
                    if matches!(plan.input, AgentInput::Terminal { .. }) {
                        // Everything the agent writes comes through the terminal.
                        match end.try_clone() {
                            Ok(reader) => stdout = PipeReader::from(reader),
                            Err(e) => {
                                process.kill();
                                return Err(SandboxError::Control(e));
                            }
                        }
                    }
                    input = Some(end);
                }
                Ok((byte, _)) => {
                    let mut line = vec![byte];
                    let _ = process.events.read_until(b'\n', &mut line);
                    let reason = match serde_json::from_slice(&line) {
                        Ok(FromShim::Failed { reason }) => reason,
                        _ => "the shim did not hand over the agent's input".into(),
                    };
                    let _ = process.wait();
                    return Err(SandboxError::Setup(reason));
                }
                Err(e) => {
                    process.kill();
                    return Err(SandboxError::Control(e));
                }
            }
        }
        let first = match process.next_event() {
            Ok(event) => event,
            Err(e) => {
                process.kill();
                return Err(e);
            }
        };
        match first {
            Some(started @ FromShim::Started { .. }) => Ok((
                process,
                started,
                SandboxOutput {
                    stdout,
                    stderr,
                    input,
                },
            )),
            Some(FromShim::Failed { reason }) => {
                let _ = process.wait();
                Err(SandboxError::Setup(reason))
            }
            other => {
                let status = process.wait().ok().flatten();
                Err(SandboxError::Setup(format!(
                    "the shim ended without starting the agent ({other:?}, status {status:?})"
                )))
            }
        }
    }

    /// The shim's host pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A second handle on the control socket, to send it a message (a live restore's
    /// `Detach`) while the run's thread reads events.
    pub fn control(&self) -> std::io::Result<UnixStream> {
        self.control.try_clone()
    }

    /// A pidfd of the sandbox's pid 1 (the shim's only child). The shim is this process's
    /// child and not yet reaped, so its pid is its own; a pid 1 that already ended, with its
    /// number taken by another process, is recognised by that process's parent.
    pub fn pin_pid_one(&self) -> std::io::Result<OwnedFd> {
        let shim = self
            .pid()
            .ok_or_else(|| std::io::Error::other("the shim is not this process's child"))?;
        pin_pid_one(shim)
    }

    /// Takes over a sandbox left running detached: connects to its detach socket, asks pid 1
    /// to `Reattach`, and receives the agent's output pipes and the gateway socket. `shim` is
    /// the shim's host pid as recorded at the detach; it must still be in `cgroup` (a pid
    /// reused by anything else is refused).
    pub fn reattach(
        socket: &Path,
        shim: u32,
        cgroup: &RunCgroup,
    ) -> Result<ReattachedSandbox, SandboxError> {
        let lost = |detail: String| SandboxError::Setup(format!("re-adopting: {detail}"));
        if !cgroup
            .pids()
            .map_err(|e| lost(e.to_string()))?
            .contains(&shim)
        {
            return Err(lost(format!(
                "the shim (pid {shim}) is no longer in {}",
                cgroup.relative()
            )));
        }
        let pid_one = pin_pid_one(shim).map_err(|e| lost(e.to_string()))?;
        let mut control =
            connect_unix(socket).map_err(|e| lost(format!("{}: {e}", socket.display())))?;
        control
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .map_err(SandboxError::Control)?;
        send_line(&mut control, &ToShim::Reattach).map_err(SandboxError::Control)?;
        // The descriptors ride on the answer's first byte; the rest of the line (and an
        // `Exited` that may follow at once) is read through the events reader kept below.
        let (first, fds) = recv_byte_with_fds(&control).map_err(SandboxError::Control)?;
        let mut events = BufReader::new(control.try_clone().map_err(SandboxError::Control)?);
        let mut line = vec![first];
        events
            .read_until(b'\n', &mut line)
            .map_err(SandboxError::Control)?;
        control
            .set_read_timeout(None)
            .map_err(SandboxError::Control)?;
        let execute = match serde_json::from_slice(&line) {
            Ok(FromShim::Reattached { execute, .. }) => execute,
            Ok(other) => return Err(lost(format!("pid 1 answered {other:?}"))),
            Err(e) => return Err(lost(format!("pid 1's answer: {e}"))),
        };
        let mut fds = fds.into_iter();
        let (Some(stdout), Some(stderr), Some(gateway), None) =
            (fds.next(), fds.next(), fds.next(), fds.next())
        else {
            return Err(lost(format!(
                "pid 1 handed back the wrong number of descriptors (expected {REATTACH_FDS})"
            )));
        };
        Ok(ReattachedSandbox {
            process: Self {
                child: None,
                events,
                control,
            },
            // A run with input is never left detached: nothing of it to hand back.
            output: SandboxOutput {
                stdout: PipeReader::from(stdout),
                stderr: PipeReader::from(stderr),
                input: None,
            },
            gateway: std::os::unix::net::UnixListener::from(gateway),
            execute,
            pid_one,
        })
    }
}

/// Connects to a Unix socket by path, through `/proc/self/fd` so that a long data directory
/// does not hit `sun_path`'s 108 bytes.
pub(crate) fn connect_unix(socket: &Path) -> std::io::Result<UnixStream> {
    let (dir, name) = split_socket_path(socket)?;
    let dir = fs::File::open(dir)?;
    UnixStream::connect(format!("/proc/self/fd/{}/{name}", dir.as_raw_fd()))
}

/// Binds a Unix socket by path (0600, root's), through `/proc/self/fd` as [`connect_unix`].
pub(crate) fn bind_unix(socket: &Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    let (dir, name) = split_socket_path(socket)?;
    let dir = fs::File::open(dir)?;
    let short = format!("/proc/self/fd/{}/{name}", dir.as_raw_fd());
    match fs::remove_file(&short) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = std::os::unix::net::UnixListener::bind(&short)?;
    fs::set_permissions(&short, fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

fn split_socket_path(socket: &Path) -> std::io::Result<(&Path, String)> {
    match (socket.parent(), socket.file_name()) {
        (Some(dir), Some(name)) => Ok((dir, name.to_string_lossy().into_owned())),
        _ => Err(std::io::Error::other("not a socket path")),
    }
}

/// Receives one byte and the descriptors that ride on it (SCM_RIGHTS).
fn recv_byte_with_fds(control: &UnixStream) -> std::io::Result<(u8, Vec<OwnedFd>)> {
    let mut byte = [0u8; 1];
    let (received, fds) = recv_with_fds(control.as_fd(), &mut byte)?;
    if received == 0 {
        return Err(std::io::Error::other("pid 1 closed the connection"));
    }
    Ok((byte[0], fds))
}

/// Receives into `buffer` from the Unix socket `socket`, with the descriptors (SCM_RIGHTS,
/// at most 8; more are closed by the kernel) that ride on those bytes: how many bytes came
/// (0 at the end), and the descriptors, owned here and close-on-exec.
pub(crate) fn recv_with_fds(
    socket: std::os::fd::BorrowedFd<'_>,
    buffer: &mut [u8],
) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut space = nix::cmsg_space!([RawFd; 8]);
    let mut iov = [std::io::IoSliceMut::new(buffer)];
    let received = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(std::io::Error::from)?;
    let mut fds = Vec::new();
    for message in received.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::ScmRights(raw) = message {
            // SAFETY: the kernel installed these descriptors in this process for this
            // message; nothing else owns them.
            #[allow(unsafe_code)]
            fds.extend(
                raw.into_iter()
                    .map(|fd| unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }),
            );
        }
    }
    Ok((received.bytes, fds))
}

/// A pidfd of the sandbox's pid 1, the only child of the shim `shim`; checked to still be
/// that shim's child after it is opened (a pid reused since is refused).
fn pin_pid_one(shim: u32) -> std::io::Result<OwnedFd> {
    {
        let children = fs::read_to_string(format!("/proc/{shim}/task/{shim}/children"))?;
        let pid: i32 = children
            .split_whitespace()
            .next()
            .and_then(|pid| pid.parse().ok())
            .ok_or_else(|| std::io::Error::other("the sandbox has no pid 1"))?;
        #[allow(unsafe_code)]
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; no
        // memory of this process is involved.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        #[allow(unsafe_code)]
        // SAFETY: the kernel just returned this descriptor; nothing else owns it.
        let pidfd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw as RawFd) };
        let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
        let parent = status
            .lines()
            .find_map(|line| line.strip_prefix("PPid:"))
            .and_then(|ppid| ppid.trim().parse::<u32>().ok());
        if parent != Some(shim) {
            return Err(std::io::Error::other("the sandbox's pid 1 has ended"));
        }
        Ok(pidfd)
    }
}

impl SandboxProcess {
    /// The next event from the shim; `None` when it has closed the socket.
    pub fn next_event(&mut self) -> Result<Option<FromShim>, SandboxError> {
        let mut line = String::new();
        let read = self
            .events
            .read_line(&mut line)
            .map_err(SandboxError::Control)?;
        if read == 0 {
            return Ok(None);
        }
        serde_json::from_str(&line)
            .map(Some)
            .map_err(|e| SandboxError::Control(std::io::Error::other(e)))
    }

    /// Kills and reaps the shim, when it is this process's child.
    fn kill(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits for the shim process to exit, when it is this process's child (a re-adopted
    /// shim's parent reaps it).
    pub fn wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        self.child.as_mut().map(Child::wait).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt() -> pb::Receipt {
        pb::Receipt {
            receipt_id: "01900000-0000-7000-8000-000000000000".into(),
            agent: Some(pb::AgentSpec {
                argv: vec!["/usr/bin/python3".into(), "/work/agent.py".into()],
                env: [("MODE".to_owned(), "fast".to_owned())].into(),
                workdir: String::new(),
            }),
            limits: Some(pb::Limits {
                tmpfs_bytes: 1 << 20,
                ..Default::default()
            }),
            fs: vec![
                pb::FsGrant {
                    path: "/srv/data".into(),
                    access: pb::FsAccess::Read as i32,
                    mount: "/data".into(),
                    exec: false,
                    ask: false,
                    ask_reads: false,
                },
                pb::FsGrant {
                    path: "/srv/out".into(),
                    access: pb::FsAccess::Write as i32,
                    mount: "/out".into(),
                    exec: false,
                    ask: false,
                    ask_reads: false,
                },
                pb::FsGrant {
                    path: "/srv/gateway-only".into(),
                    access: pb::FsAccess::Read as i32,
                    mount: String::new(),
                    exec: false,
                    ask: false,
                    ask_reads: false,
                },
            ],
            exec: vec!["/usr/bin/python3".into()],
            ..Default::default()
        }
    }

    #[test]
    fn plan_mirrors_the_receipt_and_nothing_more() {
        let dirs = RunDirs::new(Path::new("/var/lib/tollgate/runs"), "r1");
        let plan = plan_for(&receipt(), &dirs, 200_001, None, None).unwrap();
        assert_eq!(plan.agent.argv[0], "/usr/bin/python3");
        assert_eq!(plan.agent.cwd, PathBuf::from("/work"));
        assert!(plan.agent.env.contains(&("MODE".into(), "fast".into())));
        assert!(plan.agent.env.iter().all(|(k, _)| k != "OPENAI_API_KEY"));
        assert_eq!(plan.binds.len(), 2, "gateway-only grants are not mounted");
        assert!(!plan.binds[0].writable && plan.binds[1].writable);
        assert!(plan.landlock.write.contains(&PathBuf::from("/out")));
        assert!(plan.landlock.read.contains(&PathBuf::from("/data")));
        assert!(!plan.landlock.write.contains(&PathBuf::from("/data")));
        assert!(!plan.landlock.write.iter().any(|p| p == Path::new("/usr")));
        assert_eq!(
            plan.landlock.execute,
            vec![
                PathBuf::from("/usr/bin/python3"),
                PathBuf::from(SHIM_IN_SANDBOX)
            ]
        );
        assert_eq!(plan.tmpfs_bytes, 1 << 20);
        assert_eq!(plan.host_id, 200_001);
        assert_eq!(
            plan.workspace,
            PathBuf::from("/var/lib/tollgate/runs/r1/work")
        );
    }

    #[test]
    fn a_userlands_system_paths_are_those_its_links_reach_inside_it() {
        let userland = tempfile::tempdir().unwrap();
        let at = |p: &str| userland.path().join(p);
        for dir in ["usr/bin", "usr/lib", "etc"] {
            fs::create_dir_all(at(dir)).unwrap();
        }
        // Merged /usr, Ubuntu's dangling /lib32, and an absolute link to a directory the host
        // has but the userland lacks: only the first resolves inside the userland.
        for (link, target) in [
            ("bin", "usr/bin"),
            ("lib", "/usr/lib"),
            ("lib32", "usr/lib32"),
        ] {
            std::os::unix::fs::symlink(target, at(link)).unwrap();
        }
        std::os::unix::fs::symlink("/usr/sbin", at("sbin")).unwrap();
        let dirs = RunDirs::new(Path::new("/runs"), "r1");
        let plan = plan_for(&receipt(), &dirs, 1, None, Some(userland.path())).unwrap();
        let system: Vec<&Path> = plan
            .landlock
            .read
            .iter()
            .map(PathBuf::as_path)
            .filter(|p| SYSTEM_PATHS.contains(&p.to_str().unwrap()))
            .collect();
        assert_eq!(
            system,
            ["/usr", "/bin", "/lib", "/etc"].map(Path::new).to_vec(),
            "/sbin (to the host's /usr/sbin) and /lib32 are not in the userland"
        );
    }

    #[test]
    fn agent_must_be_allowed_and_present() {
        let dirs = RunDirs::new(Path::new("/runs"), "r1");
        let mut r = receipt();
        assert!(matches!(
            plan_for(&r, &dirs, 1, Some(vec!["/bin/sh".into()]), None),
            Err(SandboxError::NotExecutable(_))
        ));
        r.agent = None;
        assert!(matches!(
            plan_for(&r, &dirs, 1, None, None),
            Err(SandboxError::NoAgent)
        ));
    }

    #[test]
    fn unsafe_mount_targets_are_refused() {
        let dirs = RunDirs::new(Path::new("/runs"), "r1");
        for mount in [
            "/usr/lib/x",
            "/etc",
            "/tmp",
            "/work/a",
            "/",
            "relative",
            "/a/../b",
        ] {
            let mut r = receipt();
            r.fs[0].mount = mount.into();
            assert!(
                matches!(
                    plan_for(&r, &dirs, 1, None, None),
                    Err(SandboxError::BadGrant { .. })
                ),
                "{mount}"
            );
        }
        let mut r = receipt();
        r.fs[1].mount = "/data/inner".into();
        assert!(matches!(
            plan_for(&r, &dirs, 1, None, None),
            Err(SandboxError::BadGrant { .. })
        ));
    }

    #[test]
    fn decimal_formats_without_allocating() {
        let mut buffer = [0u8; 10];
        assert_eq!(decimal(0, &mut buffer), b"0");
        assert_eq!(decimal(4_294_967_295, &mut buffer), b"4294967295");
        assert_eq!(decimal(1234, &mut buffer), b"1234");
    }
}
