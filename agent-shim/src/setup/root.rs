//! The two halves of building the root: what does not depend on the plan (`prepare_root`,
//! done ahead of need) and what does (`finish_root`, with the plan), ending with the new root
//! moved over the base's (see the `base` module).

use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};
use nix::sys::statvfs::statvfs;
use nix::unistd::{chdir, chroot, sethostname};
use tollgate_shim_protocol::plan::{
    SandboxBase, SandboxPlan, EGRESS_CA_IN_SANDBOX, GATEWAY_IN_SANDBOX, SHIM_IN_SANDBOX,
};

use super::error::SetupError;
use super::mounts::{attach, bind, create_dir, inside, mount_fs, receive_only, Restrict};
use super::net::loopback_up;
use super::programs::hide_programs;
use super::userland::{switch_userland, USERLAND_STAGING};
use super::views::{
    finish_etc, mask_host_views, minimal_dev, show_etc, show_system_paths, write_generated_etc,
};

/// Builds the part of the sandbox no receipt decides: a tmpfs root at `base.root_dir` with
/// the host's system directories read-only, a fresh `/proc`, a minimal `/dev`, the host
/// name and loopback. Must run in fresh mount, uts and net namespaces (the mount namespace a
/// copy of the sandboxes' base, see [`make_base`](super::make_base)) and, for `/proc`, as
/// pid 1 of a fresh pid namespace. Runs before the plan arrives when the sandbox is prepared
/// ahead of need.
pub fn prepare_root(base: &SandboxBase) -> Result<(), SetupError> {
    // Nothing we mount may propagate back to the host, but the host's mounts and unmounts
    // keep reaching this copy while the sandbox waits for its plan (it may wait for hours):
    // its binds must see the host as it is when the run starts, and it must not keep an
    // unmounted volume busy. `finish_root` cuts the link once the binds are made.
    receive_only()?;
    let root = base.root_dir.as_path();
    mount_fs(
        "tollgate-root",
        root,
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        "mode=0755,size=1m",
    )?;

    show_system_paths(root, &base.system_paths)?;
    show_etc(root)?;
    // The generated files again, where a run on its own userland takes them from (hidden, and
    // outside every Landlock rule).
    let generated = inside(root, Path::new(USERLAND_STAGING)).join("generated");
    create_dir(&generated)?;
    write_generated_etc(&generated, &base.hostname)?;

    if let Some(shim) = &base.shim_binary {
        // Executable (the system paths are too; everything the agent can write is noexec):
        // exec is decided by the bind's own mount flags, and Landlock allows it by path.
        bind(
            shim,
            &inside(root, Path::new(SHIM_IN_SANDBOX)),
            Restrict {
                read_only: true,
                devices: false,
                no_exec: false,
            },
        )?;
    }

    let proc_dir = inside(root, Path::new("/proc"));
    create_dir(&proc_dir)?;
    mount_fs(
        "proc",
        &proc_dir,
        "proc",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        "",
    )?;
    mask_host_views(root)?;

    minimal_dev(root)?;

    // The network and uts namespaces are the sandbox's own: set them up now too.
    sethostname(&base.hostname).map_err(SetupError::Hostname)?;
    loopback_up().map_err(SetupError::Loopback)?;
    Ok(())
}

/// The detached mounts that come with a plan (see [`SandboxPlan::descriptors`]), taken apart.
pub struct PlanMounts {
    /// The workspace, shown at `/work`.
    pub workspace: OwnedFd,
    /// The egress certificate authority's directory, when the plan has one.
    pub egress_ca: Option<OwnedFd>,
    /// The gateway socket, when the plan has one.
    pub gateway_socket: Option<OwnedFd>,
    /// One per bind, in order.
    pub grants: Vec<OwnedFd>,
    /// The root file system, when the plan has one.
    pub userland: Option<OwnedFd>,
}

impl PlanMounts {
    /// Takes `plan`'s mounts apart from `mounts`, in the order they were sent (the cgroup
    /// files pid 1 joins, if any came, already taken off the front, and the gateway's
    /// listening socket, if it came, off the end).
    pub fn take(plan: &SandboxPlan, mounts: Vec<OwnedFd>) -> Result<Self, SetupError> {
        let gateway = usize::from(plan.gateway_socket.is_some());
        let expected = plan.descriptors() - gateway - plan.cgroup_joins;
        if mounts.len() != expected {
            return Err(SetupError::MountCount {
                received: mounts.len(),
                expected,
            });
        }
        let mut mounts = mounts.into_iter();
        let mut next = |wanted: bool| if wanted { mounts.next() } else { None };
        let workspace = next(true);
        let egress_ca = next(plan.egress_ca.is_some());
        let gateway_socket = next(plan.gateway_socket.is_some());
        let grants: Vec<OwnedFd> = (0..plan.binds.len()).filter_map(|_| next(true)).collect();
        let userland = next(plan.rootfs.is_some());
        Ok(Self {
            workspace: workspace.ok_or(SetupError::MountCount {
                received: 0,
                expected,
            })?,
            egress_ca,
            gateway_socket,
            grants,
            userland,
        })
    }
}

/// Completes the root prepared by [`prepare_root`] from the plan (`/tmp`, `/work`, the
/// receipt's grants, the run's gateway socket and certificate authority, each attached from
/// its detached mount in `mounts`) and switches to it.
pub fn finish_root(
    base: &SandboxBase,
    plan: &SandboxPlan,
    mounts: PlanMounts,
) -> Result<(), SetupError> {
    let root = base.root_dir.as_path();
    tmp_in_root(root, plan.tmpfs_bytes)?;

    attach(
        &mounts.workspace,
        &plan.workspace,
        &inside(root, Path::new("/work")),
        Restrict {
            read_only: false,
            devices: false,
            // W^X, unless the receipt lifts it for /work alone.
            no_exec: !plan.workspace_exec,
        },
    )?;
    // The agent's home in /etc/passwd, in the generated /etc and in the copy a run on its own
    // userland takes, before either is shown.
    finish_etc(
        root,
        &inside(root, Path::new(USERLAND_STAGING)).join("generated"),
        plan.agent.home(),
    )?;
    // The root file system's mount comes after the grants'.
    if let (Some(source), Some(mount)) = (&plan.rootfs, &mounts.userland) {
        switch_userland(root, source, mount)?;
    }
    for (grant, mount) in plan.binds.iter().zip(&mounts.grants) {
        attach(
            mount,
            &grant.source,
            &inside(root, &grant.target),
            Restrict {
                read_only: !grant.writable,
                devices: false,
                // W^X: a writable grant is executable only where the receipt lifts W^X for
                // it alone (exec = true on a write grant); nosuid stays either way.
                no_exec: !grant.executable,
            },
        )?;
    }

    if let (Some(ca), Some(mount)) = (&plan.egress_ca, &mounts.egress_ca) {
        // The run's egress certificate authority (its certificate; the key stays outside).
        attach(
            mount,
            ca,
            &inside(root, Path::new(EGRESS_CA_IN_SANDBOX)),
            Restrict {
                read_only: true,
                devices: false,
                no_exec: true,
            },
        )?;
    }
    if let (Some(socket), Some(mount)) = (&plan.gateway_socket, &mounts.gateway_socket) {
        // The run's own gateway socket: connect() needs only write permission on the socket
        // inode (it is the run's host id's, 0600), not a writable mount.
        attach(
            mount,
            socket,
            &inside(root, Path::new(GATEWAY_IN_SANDBOX)),
            Restrict {
                read_only: true,
                devices: false,
                no_exec: true,
            },
        )?;
    }

    // Switch roots: the new root is moved over the base's `/` and becomes this process's
    // root. The base stays beneath it, covered: no path leads below a mount stacked on `/`,
    // and the base holds nothing a sandbox does not show (see the `base` module). No
    // `pivot_root`, which walks every thread on the host.
    chdir(root).map_err(SetupError::SwitchRoot)?;
    mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>)
        .map_err(SetupError::SwitchRoot)?;
    chroot(".").map_err(SetupError::SwitchRoot)?;
    chdir("/").map_err(SetupError::SwitchRoot)?;
    // From here on nothing the host mounts reaches the agent: a mount propagated under a
    // grant would arrive without the restrictions set above (read-only, noexec).
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(SetupError::Private)?;
    // Programs the agent may run only through the gateway: out of its reach before it exists.
    hide_programs(&plan.hidden, &plan.landlock.execute)?;
    // The root's mount becomes read-only: the agent writes only /work and /tmp. The mount,
    // not the file system: `/tmp` is the same tmpfs, through its own writable bind. The
    // mounts are the host user namespace's, so the agent cannot make it writable again.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_BIND
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(|source| SetupError::Mount {
        what: "read-only remount of the root".into(),
        target: PathBuf::from("/"),
        source,
    })?;

    // memfds in this pid namespace are never executable (Linux 6.3+): otherwise an agent could
    // write any program into one and execute it past the exec allow-list.
    let memfd_noexec = Path::new("/proc/sys/vm/memfd_noexec");
    if memfd_noexec.exists() {
        fs::write(memfd_noexec, "2").map_err(|source| SetupError::MountPoint {
            path: memfd_noexec.to_owned(),
            source,
        })?;
    }
    Ok(())
}

/// Makes `/tmp` a directory of the root's own tmpfs, bound over itself (writable, `noexec`,
/// `nosuid`, `nodev`) so that it stays writable once the root's mount is made read-only, and
/// grows that tmpfs by `tmpfs_bytes` (the receipt's size for `/tmp`) over what the root
/// already holds: the agent can write `tmpfs_bytes` there and no more.
///
/// Not a tmpfs of its own: every file system is a superblock, with a shrinker for which every
/// memory cgroup on the host keeps a slot, sized by the most superblocks the host has ever held
/// at once, until reboot. A sandbox holds three (its root, `/proc`, its IPC namespace's
/// message queues), not four, and its start mounts one file system fewer.
fn tmp_in_root(root: &Path, tmpfs_bytes: u64) -> Result<(), SetupError> {
    let tmp = inside(root, Path::new("/tmp"));
    create_dir(&tmp)?;
    // Sticky and writable by all, as a tmpfs of its own was (mode=1777); mkdir's mode is
    // cut by the umask.
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o1777)).map_err(|source| {
        SetupError::MountPoint {
            path: tmp.clone(),
            source,
        }
    })?;
    let held = statvfs(root).map_err(SetupError::RootSize)?;
    let used = held
        .blocks()
        .saturating_sub(held.blocks_free())
        .saturating_mul(held.fragment_size());
    let size = used.saturating_add(tmpfs_bytes.max(4096));
    // A remount of the tmpfs itself (not of a mount): only its size changes, and the flags
    // given are the root mount's as they were.
    mount_fs(
        "tollgate-root",
        root,
        "tmpfs",
        MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        &format!("size={size}"),
    )?;
    bind(
        &tmp,
        &tmp,
        Restrict {
            read_only: false,
            devices: false,
            no_exec: true,
        },
    )
}
