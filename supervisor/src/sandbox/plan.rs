//! From a verified receipt to the shim's plan (pure, unit-tested): what the sandbox shows,
//! mounts and allows, and the agent's command and environment; and what every sandbox of this
//! supervisor shares.

use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};

use tollgate_proto::v1 as pb;
use tollgate_receipt::paths::SYSTEM_PATHS;
use tollgate_shim_protocol::plan::{
    egress_ca_env, proxy_env, AgentCommand, AgentInput, Bind, EgressProxy, LandlockPlan,
    ModelsEndpoint, SandboxBase, SandboxPlan, EGRESS_CA_IN_SANDBOX, EGRESS_PORT,
    GATEWAY_IN_SANDBOX, MODELS_PORT, SHIM_IN_SANDBOX,
};

use super::dirs::RunDirs;
use super::error::SandboxError;

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

/// Re-checks the receipt's mounts and gateway-only programs with the receipt crate's rules,
/// the ones the authority applies before it signs (the supervisor does not rely on every
/// signer having done so).
pub(super) fn check_mounts(receipt: &pb::Receipt) -> Result<(), SandboxError> {
    tollgate_receipt::paths::check_mounts(&receipt.fs).map_err(|e| SandboxError::BadGrant {
        path: receipt.fs[e.index()].path.clone(),
        reason: e.to_string(),
    })?;
    tollgate_receipt::paths::check_gateway_exec(&receipt.gateway_exec, &receipt.fs, &receipt.exec)
        .map_err(|e| SandboxError::BadGrant {
            path: receipt.gateway_exec[e.index].program.clone(),
            reason: e.to_string(),
        })?;
    tollgate_receipt::paths::check_exec_list(&receipt.exec, &receipt.fs).map_err(|e| {
        SandboxError::BadGrant {
            path: e.field(),
            reason: e.to_string(),
        }
    })?;
    tollgate_receipt::paths::check_home(&receipt.home, &receipt.fs, None).map_err(|e| {
        SandboxError::BadGrant {
            path: receipt.home.clone(),
            reason: e.to_string(),
        }
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
    if !tollgate_proto::exec_allows(&receipt.exec, &argv[0]) {
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
        workspace_exec: receipt.workspace_exec,
        tmpfs_bytes: limits.tmpfs_bytes,
        files: tollgate_proto::effective_files(limits.files),
        binds,
        landlock: LandlockPlan {
            read,
            write,
            // The shim, the agent's gateway client, is always executable; so is everything
            // beneath a mount the receipt makes writable and executable (W^X lifted there
            // alone: the agent runs what it builds).
            execute: receipt
                .exec
                .iter()
                .map(PathBuf::from)
                .chain([PathBuf::from(SHIM_IN_SANDBOX)])
                .chain(
                    receipt
                        .fs
                        .iter()
                        .filter(|g| g.is_writable_executable())
                        .map(|g| PathBuf::from(&g.mount)),
                )
                .chain(receipt.workspace_exec.then(|| PathBuf::from("/work")))
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
        // Set by the run manager when its sandbox's pid 1 is to join the run's v1 cgroups.
        cgroup_joins: 0,
    })
}

/// The root file system's directory, to resolve its paths in (its mount comes from the
/// descriptor pinned at admission; this only decides which system paths it has).
pub(super) fn open_userland(rootfs: &Path) -> Result<OwnedFd, SandboxError> {
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
pub(super) fn exists_in_userland(userland: &OwnedFd, path: &str) -> bool {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    nix::fcntl::openat2(userland, path.trim_start_matches('/'), how).is_ok()
}

/// The agent's environment: Tollgate's own variables (the gateway, the run id, the model
/// endpoint when a route is granted), then the receipt's, which never override them.
pub(super) fn agent_env(
    receipt: &pb::Receipt,
    models: bool,
    egress: bool,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        (
            "PATH".into(),
            "/run/tollgate/bin:/usr/local/bin:/usr/bin:/bin".into(),
        ),
        (
            "TOLLGATE_GATEWAY".into(),
            format!("unix:{GATEWAY_IN_SANDBOX}"),
        ),
        // The receipt's home, kept across runs; else the run's own /work.
        (
            "HOME".into(),
            if receipt.home.is_empty() {
                "/work".into()
            } else {
                receipt.home.clone()
            },
        ),
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
    fn what_the_receipt_makes_writable_and_executable_is_mounted_and_ruled_so() {
        let dirs = RunDirs::new(Path::new("/var/lib/tollgate/runs"), "r1");
        let mut r = receipt();
        assert!(!plan_for(&r, &dirs, 1, None, None).unwrap().workspace_exec);
        r.fs[1].exec = true;
        r.workspace_exec = true;
        r.exec.push("/usr/lib/git-core/".into());
        r.fs.push(pb::FsGrant {
            path: "/srv/agents/a".into(),
            access: pb::FsAccess::Write as i32,
            mount: "/home/agent".into(),
            ..Default::default()
        });
        r.home = "/home/agent".into();
        let plan = plan_for(&r, &dirs, 1, None, None).unwrap();
        assert!(plan.workspace_exec);
        assert!(plan.binds[1].writable && plan.binds[1].executable);
        assert!(
            !plan.binds[2].executable,
            "a home is noexec unless it says exec"
        );
        for ruled in ["/out", "/work", "/usr/lib/git-core/"] {
            assert!(
                plan.landlock.execute.contains(&PathBuf::from(ruled)),
                "{ruled}: {:?}",
                plan.landlock.execute
            );
        }
        assert!(!plan
            .landlock
            .execute
            .contains(&PathBuf::from("/home/agent")));
        assert!(plan
            .agent
            .env
            .contains(&("HOME".into(), "/home/agent".into())));
        // A home that is no write grant's mount is refused before anything is planned.
        r.home = "/elsewhere".into();
        assert!(matches!(
            plan_for(&r, &dirs, 1, None, None),
            Err(SandboxError::BadGrant { .. })
        ));
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
}
