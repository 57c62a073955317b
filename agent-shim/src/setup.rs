//! Building the sandbox's file system and network, from inside its new namespaces.
//!
//! Runs in the shim's pid 1, which is still real root in mount, pid, net, ipc, uts and cgroup
//! namespaces owned by the host's user namespace. Building the mounts as real root matters:
//! the mounts are then owned by the host user namespace, so nothing the agent later does
//! inside its own user namespace can unmount or remount them ("locked" mounts).
//!
//! Each privileged step has its own [`SetupError`] variant naming the step and the path.

// The privileged steps of building the sandbox call the kernel directly: `unsafe` is allowed in this
// module, and every block carries its `// SAFETY:` line (clippy::undocumented_unsafe_blocks).
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::unistd::{chdir, pivot_root, sethostname};
use tollgate_proto::SYSTEM_PATHS;
use tollgate_shim_protocol::plan::{
    generated_etc, SandboxBase, SandboxPlan, EGRESS_CA_IN_SANDBOX, ETC_FROM_HOST,
    GATEWAY_IN_SANDBOX, SHIM_IN_SANDBOX,
};

/// A step of building the sandbox failed.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// Changing the mount tree's propagation (so nothing propagates back to the host, and,
    /// once built, nothing from it) failed.
    #[error("setting mount propagation: {0}")]
    Private(nix::Error),
    /// Mounting a file system failed.
    #[error("mounting {what} at {target}: {source}")]
    Mount {
        /// What was mounted.
        what: String,
        /// Where.
        target: PathBuf,
        /// The error.
        source: nix::Error,
    },
    /// Making a mount read-only (and nosuid, nodev) failed.
    #[error("making {target} read-only: {source}")]
    ReadOnly {
        /// The mount.
        target: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Creating a mount point or link in the new root failed.
    #[error("creating {path} in the new root: {source}")]
    MountPoint {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Attaching a grant's detached mount (sent by the supervisor) failed.
    #[error("attaching the grant {grant} at {target}: {source}")]
    Attach {
        /// The granted host path (for the message only: the mount came as a descriptor).
        grant: PathBuf,
        /// Where inside the sandbox.
        target: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The supervisor sent a different number of grant mounts than the plan has binds.
    #[error("the plan has {binds} mounted grants but {mounts} mounts came with it")]
    MountCount {
        /// Mounts received.
        mounts: usize,
        /// Binds in the plan.
        binds: usize,
    },
    /// A bind source does not exist on the host.
    #[error("bind source {0} does not exist")]
    MissingSource(PathBuf),
    /// `pivot_root` or detaching the old root failed.
    #[error("switching to the new root: {0}")]
    PivotRoot(nix::Error),
    /// Setting the host name failed.
    #[error("setting the host name: {0}")]
    Hostname(nix::Error),
    /// A program granted only through the gateway cannot be hidden from the agent, or the
    /// agent would reach it all the same.
    #[error("gateway-only program {program}: {reason}")]
    GatewayProgram {
        /// The program (a sandbox path).
        program: PathBuf,
        /// Why, in one line.
        reason: String,
    },
    /// Bringing up the loopback interface failed.
    #[error("bringing up loopback: {0}")]
    Loopback(std::io::Error),
}

/// Device nodes bound from the host into the sandbox's `/dev`.
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

fn inside(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

fn create_dir(path: &Path) -> Result<(), SetupError> {
    fs::create_dir_all(path).map_err(|source| SetupError::MountPoint {
        path: path.to_owned(),
        source,
    })
}

fn mount_fs(
    what: &str,
    target: &Path,
    fstype: &str,
    flags: MsFlags,
    data: &str,
) -> Result<(), SetupError> {
    mount(Some(what), target, Some(fstype), flags, Some(data)).map_err(|source| SetupError::Mount {
        what: format!("{fstype} ({data})"),
        target: target.to_owned(),
        source,
    })
}

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const AT_RECURSIVE: libc::c_uint = 0x8000;

/// How a bind mount is restricted.
#[derive(Clone, Copy)]
struct Restrict {
    read_only: bool,
    /// Device nodes stay usable (only for the /dev binds).
    devices: bool,
    /// Nothing on it may be executed or mapped executable: everything but the system paths
    /// and executable read grants. Landlock alone would let the dynamic loader run a file the
    /// agent wrote.
    no_exec: bool,
}

/// Adds nosuid and the restrictions in `how` to the mount at `target` and every mount beneath
/// it, in one call (mount_setattr, Linux 5.12+). Only adds restrictions, which the kernel
/// allows even on locked mounts.
fn restrict_recursively(target: &Path, how: Restrict) -> Result<(), SetupError> {
    let error = |source| SetupError::ReadOnly {
        target: target.to_owned(),
        source,
    };
    let path = CString::new(target.as_os_str().as_bytes())
        .map_err(|_| error(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_NOSUID
            | if how.devices { 0 } else { MOUNT_ATTR_NODEV }
            | if how.read_only { MOUNT_ATTR_RDONLY } else { 0 }
            | if how.no_exec { MOUNT_ATTR_NOEXEC } else { 0 },
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: `path` is a valid NUL-terminated string and `attr` a properly laid out
    // `struct mount_attr` that outlives the call; the size passed is its exact size.
    let result = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            AT_RECURSIVE,
            &attr as *const MountAttr,
            size_of::<MountAttr>(),
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(error(std::io::Error::last_os_error()))
    }
}

/// Creates the mount point `target`: a directory, or an empty file (and its directory).
fn mount_point(target: &Path, directory: bool) -> Result<(), SetupError> {
    if directory {
        return create_dir(target);
    }
    if let Some(parent) = target.parent() {
        create_dir(parent)?;
    }
    fs::write(target, b"").map_err(|e| SetupError::MountPoint {
        path: target.to_owned(),
        source: e,
    })
}

/// Bind-mounts host `source` at `target` (creating the mount point as a file or directory to
/// match), then restricts it.
fn bind(source: &Path, target: &Path, how: Restrict) -> Result<(), SetupError> {
    let meta = fs::metadata(source).map_err(|_| SetupError::MissingSource(source.to_owned()))?;
    mount_point(target, meta.is_dir())?;
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| SetupError::Mount {
        what: format!("bind of {}", source.display()),
        target: target.to_owned(),
        source: e,
    })?;
    restrict_recursively(target, how)
}

/// Attaches the detached mount `mount` (a grant's tree, cloned by the supervisor from the
/// descriptor it pinned at start: `open_tree(OPEN_TREE_CLONE)`) at `target`, creating the
/// mount point as a file or directory to match, then restricts it. No host path is looked up
/// here: a link planted on the granted path after the supervisor pinned it changes nothing.
fn attach(mount: &OwnedFd, grant: &Path, target: &Path, how: Restrict) -> Result<(), SetupError> {
    let error = |source: std::io::Error| SetupError::Attach {
        grant: grant.to_owned(),
        target: target.to_owned(),
        source,
    };
    let stat = nix::sys::stat::fstat(mount).map_err(|e| error(e.into()))?;
    mount_point(target, stat.st_mode & libc::S_IFMT == libc::S_IFDIR)?;
    let path = CString::new(target.as_os_str().as_bytes())
        .map_err(|_| error(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    // SAFETY: move_mount reads two NUL-terminated strings (a static empty one and `path`,
    // both alive for the call) and two descriptors; it touches no other memory.
    let result = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mount.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            path.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if result != 0 {
        return Err(error(std::io::Error::last_os_error()));
    }
    restrict_recursively(target, how)
}

/// Builds the part of the sandbox no receipt decides: a tmpfs root at `base.root_dir` with
/// the host's system directories read-only, a fresh `/proc`, a minimal `/dev`, the host
/// name and loopback. Must run in fresh mount, uts and net namespaces and, for `/proc`, as
/// pid 1 of a fresh pid namespace. Runs before the plan arrives when the sandbox is prepared
/// ahead of need.
pub fn prepare_root(base: &SandboxBase) -> Result<(), SetupError> {
    // Nothing we mount may propagate back to the host, but the host's mounts and unmounts
    // keep reaching this copy while the sandbox waits for its plan (it may wait for hours):
    // its binds must see the host as it is when the run starts, and it must not keep an
    // unmounted volume busy. `finish_root` cuts the link once the binds are made.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(SetupError::Private)?;
    let root = base.root_dir.as_path();
    mount_fs(
        "tollgate-root",
        root,
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        "mode=0755,size=1m",
    )?;

    show_system_paths(root, &base.system_paths)?;
    generate_etc(root, &base.hostname)?;
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

/// Shows each host system path at the same place under `root`, read-only; a symlink (as on
/// merged-/usr systems) is recreated as a symlink. A system path this host lacks (no /lib64
/// on some systems) is simply absent.
fn show_system_paths(root: &Path, system_paths: &[PathBuf]) -> Result<(), SetupError> {
    for path in system_paths {
        show_host_path(path, &inside(root, path), false)?;
    }
    Ok(())
}

/// Shows the host's `host` at `target`, read-only (and `noexec` when asked): a link is
/// recreated as a link, anything else bound. Nothing when the host has no such path.
fn show_host_path(host: &Path, target: &Path, no_exec: bool) -> Result<(), SetupError> {
    match fs::symlink_metadata(host) {
        Ok(meta) if meta.file_type().is_symlink() => {
            let link = fs::read_link(host).map_err(|source| SetupError::MountPoint {
                path: host.to_owned(),
                source,
            })?;
            if let Some(parent) = target.parent() {
                create_dir(parent)?;
            }
            symlink(&link, target).map_err(|source| SetupError::MountPoint {
                path: target.to_owned(),
                source,
            })
        }
        Ok(_) => bind(
            host,
            target,
            Restrict {
                read_only: true,
                devices: false,
                no_exec,
            },
        ),
        Err(_) => Ok(()),
    }
}

/// A small `/etc` of the sandbox's own under `root` instead of the host's: the files
/// [`generated_etc`] writes (users with the agent, hosts, no name server), and the few host
/// entries programs need to run ([`ETC_FROM_HOST`], those the host has) shown read-only, links
/// recreated as links. The root is made read-only with everything else before the agent runs.
fn generate_etc(root: &Path, hostname: &str) -> Result<(), SetupError> {
    let etc = inside(root, Path::new("/etc"));
    create_dir(&etc)?;
    // Its own small tmpfs: a run on a root file system of its choosing covers the whole of it
    // (with everything bound inside) with one overlay.
    mount_fs(
        "tollgate-etc",
        &etc,
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        "mode=0755,size=256k",
    )?;
    write_generated_etc(&etc, hostname)?;
    let host_etc = Path::new("/etc");
    // Every /etc/python3.X too: Debian's Python reads its site customisation from there.
    let pythons = fs::read_dir(host_etc)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            name.starts_with("python3.").then_some(name)
        });
    let names: Vec<String> = ETC_FROM_HOST
        .iter()
        .map(|name| (*name).to_owned())
        .chain(pythons)
        .collect();
    for name in names {
        show_host_path(&host_etc.join(&name), &etc.join(&name), true)?;
    }
    // Read-only once its mount points exist (the binds inside keep their own flags).
    remount_tmpfs_read_only(&etc, "the generated /etc")
}

/// Remounts the tmpfs at `target` read-only (and nosuid, nodev, noexec); `what` names it in
/// the error.
fn remount_tmpfs_read_only(target: &Path, what: &str) -> Result<(), SetupError> {
    mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|source| SetupError::Mount {
        what: format!("read-only remount of {what}"),
        target: target.to_owned(),
        source,
    })
}

/// Writes the files [`generated_etc`] names into `dir`, 0644.
fn write_generated_etc(dir: &Path, hostname: &str) -> Result<(), SetupError> {
    use std::os::unix::fs::PermissionsExt as _;
    for (name, content) in generated_etc(hostname) {
        let path = dir.join(name);
        fs::write(&path, content)
            .and_then(|()| fs::set_permissions(&path, fs::Permissions::from_mode(0o644)))
            .map_err(|source| SetupError::MountPoint { path, source })?;
    }
    Ok(())
}

/// Where the prepared root keeps, hidden, what a run on its own userland needs: the generated
/// `/etc` files (an overlay's lower layer) and that userland itself, attached. Outside every
/// Landlock rule, so the agent cannot read them there (it reads them at their places).
const USERLAND_STAGING: &str = "/.tollgate-userland";

/// Puts the root file system the run chose (`userland`, a detached copy of the supervisor's
/// pinned descriptor of it) in place of the host's system paths in the prepared `root`: it is
/// attached, hidden, at [`USERLAND_STAGING`]`/root`; each of [`SYSTEM_PATHS`] it has is bound
/// from there over the host's (read-only, nosuid, nodev, executable; links recreated as
/// links), and `/etc` becomes a read-only, `noexec` overlay of the generated users, hosts and
/// resolver files over the userland's own, mounted over the generated `/etc`. Mounting over
/// rather than unmounting keeps the start free of unmounts (each waits for an RCU grace
/// period); what is covered stays covered (the mounts are the host user namespace's: the
/// agent cannot unmount them), and the staging paths are outside every Landlock rule.
fn switch_userland(root: &Path, source: &Path, userland: &OwnedFd) -> Result<(), SetupError> {
    let point = |path: &Path, source: std::io::Error| SetupError::MountPoint {
        path: path.to_owned(),
        source,
    };
    let staging = inside(root, Path::new(USERLAND_STAGING));
    let theirs_root = staging.join("root");
    attach(
        userland,
        source,
        &theirs_root,
        Restrict {
            read_only: true,
            devices: false,
            no_exec: false,
        },
    )?;
    for system in SYSTEM_PATHS {
        if system == "/etc" {
            continue;
        }
        let target = inside(root, Path::new(system));
        let from = inside(&theirs_root, Path::new(system));
        let theirs = fs::symlink_metadata(&from).ok();
        let ours = fs::symlink_metadata(&target).ok();
        let theirs_link = theirs.as_ref().is_some_and(|m| m.file_type().is_symlink());
        let theirs_dir = theirs.as_ref().is_some_and(|m| m.is_dir());
        // What the host put there that cannot be covered: a link goes (a plain unlink), a
        // host directory the userland lacks is unmounted (rare: an old /lib32).
        match &ours {
            Some(meta) if meta.file_type().is_symlink() => {
                if theirs_link && fs::read_link(&from).ok() == fs::read_link(&target).ok() {
                    continue;
                }
                fs::remove_file(&target).map_err(|e| point(&target, e))?;
            }
            Some(_) if theirs_dir => {}
            Some(_) => {
                umount2(&target, MntFlags::MNT_DETACH).map_err(|e| SetupError::Mount {
                    what: format!("detaching the host's {system}"),
                    target: target.clone(),
                    source: e,
                })?;
                fs::remove_dir(&target).map_err(|e| point(&target, e))?;
            }
            None => {}
        }
        if theirs_link {
            let link = fs::read_link(&from).map_err(|e| point(&from, e))?;
            symlink(&link, &target).map_err(|e| point(&target, e))?;
        } else if theirs_dir {
            bind(
                &from,
                &target,
                Restrict {
                    read_only: true,
                    devices: false,
                    no_exec: false,
                },
            )?;
        }
    }
    // /etc: the generated files (written when the root was prepared) over the userland's own.
    let etc = inside(root, Path::new("/etc"));
    let theirs_etc = fs::symlink_metadata(theirs_root.join("etc")).is_ok_and(|m| m.is_dir());
    if !theirs_etc {
        // A userland without /etc: only the generated files.
        return bind(
            &staging.join("generated"),
            &etc,
            Restrict {
                read_only: true,
                devices: false,
                no_exec: true,
            },
        );
    }
    // Relative to the root (the data directory's path may hold the option string's
    // separators).
    chdir(root).map_err(|e| SetupError::Mount {
        what: "overlay of /etc".into(),
        target: etc.clone(),
        source: e,
    })?;
    mount_fs(
        "tollgate-etc",
        &etc,
        "overlay",
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        "lowerdir=.tollgate-userland/generated:.tollgate-userland/root/etc",
    )
}

/// A minimal `/dev` under `root`: a small tmpfs with the host's [`DEVICES`] bound in and
/// the `fd`/`stdin`/`stdout`/`stderr` links, then made read-only.
fn minimal_dev(root: &Path) -> Result<(), SetupError> {
    let dev = inside(root, Path::new("/dev"));
    create_dir(&dev)?;
    mount_fs(
        "tollgate-dev",
        &dev,
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        "mode=0755,size=64k",
    )?;
    for device in DEVICES {
        let host = Path::new("/dev").join(device);
        if host.exists() {
            bind(
                &host,
                &dev.join(device),
                Restrict {
                    read_only: false,
                    devices: true,
                    no_exec: true,
                },
            )?;
        }
    }
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        symlink(target, dev.join(name)).map_err(|source| SetupError::MountPoint {
            path: dev.join(name),
            source,
        })?;
    }
    restrict_recursively(
        &dev,
        Restrict {
            read_only: true,
            devices: true,
            no_exec: true,
        },
    )?;
    Ok(())
}

/// Completes the root prepared by [`prepare_root`] from the plan (`/tmp`, `/work`, the
/// receipt's grants, attached from `mounts`: one detached mount per bind, in order) and
/// switches to it.
pub fn finish_root(
    base: &SandboxBase,
    plan: &SandboxPlan,
    mounts: Vec<OwnedFd>,
) -> Result<(), SetupError> {
    let root = base.root_dir.as_path();
    let tmp = inside(root, Path::new("/tmp"));
    create_dir(&tmp)?;
    mount_fs(
        "tollgate-tmp",
        &tmp,
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        &format!("mode=1777,size={}", plan.tmpfs_bytes.max(4096)),
    )?;

    bind(
        &plan.workspace,
        &inside(root, Path::new("/work")),
        Restrict {
            read_only: false,
            devices: false,
            no_exec: true,
        },
    )?;
    // The root file system's mount comes after the grants'.
    let mut mounts = mounts;
    let userland = plan.rootfs.as_ref().map(|source| (source, mounts.pop()));
    if mounts.len() != plan.binds.len() || userland.as_ref().is_some_and(|(_, m)| m.is_none()) {
        return Err(SetupError::MountCount {
            mounts: mounts.len() + usize::from(userland.is_some()),
            binds: plan.binds.len() + usize::from(userland.is_some()),
        });
    }
    if let Some((source, Some(mount))) = &userland {
        switch_userland(root, source, mount)?;
    }
    for (grant, mount) in plan.binds.iter().zip(&mounts) {
        attach(
            mount,
            &grant.source,
            &inside(root, &grant.target),
            Restrict {
                read_only: !grant.writable,
                devices: false,
                // W^X: a writable grant is never executable (the plan never says both).
                no_exec: grant.writable || !grant.executable,
            },
        )?;
    }

    if let Some(ca) = &plan.egress_ca {
        // The run's egress certificate authority (its certificate; the key stays outside).
        bind(
            ca,
            &inside(root, Path::new(EGRESS_CA_IN_SANDBOX)),
            Restrict {
                read_only: true,
                devices: false,
                no_exec: true,
            },
        )?;
    }
    if let Some(socket) = &plan.gateway_socket {
        // The run's own gateway socket: connect() needs only write permission on the socket
        // inode (it is the run's host id's, 0600), not a writable mount.
        bind(
            socket,
            &inside(root, Path::new(GATEWAY_IN_SANDBOX)),
            Restrict {
                read_only: true,
                devices: false,
                no_exec: true,
            },
        )?;
    }

    // Switch roots: the old root is stacked under the new one and detached, so no path
    // leads back to the host's file system.
    chdir(root).map_err(SetupError::PivotRoot)?;
    pivot_root(".", ".").map_err(SetupError::PivotRoot)?;
    umount2(".", MntFlags::MNT_DETACH).map_err(SetupError::PivotRoot)?;
    chdir("/").map_err(SetupError::PivotRoot)?;
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
    // The root tmpfs itself becomes read-only: the agent writes only /work and /tmp.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
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

/// Hides `programs` (sandbox paths of programs the agent may run only through the gateway's
/// exec tool) from the agent: `/dev/null` is bound over each, read-only, `nodev` (nothing can
/// open it), `noexec`, so neither `execve` nor the dynamic loader (`ld.so PROGRAM`, which
/// Landlock's execute right does not cover) reaches its content. Only the gateway's command
/// lifts the cover, in a mount namespace of its own (see [`reveal_program`]). Refused when the
/// agent would reach the program all the same: through another name (a hard link), or because
/// one of its own executables (`execute`), or the interpreter one of them runs through, is
/// that file. A program absent here hides nothing; one already hidden is left as it is.
pub(crate) fn hide_programs(programs: &[PathBuf], execute: &[PathBuf]) -> Result<(), SetupError> {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    if programs.is_empty() {
        return Ok(());
    }
    let refuse = |program: &Path, reason: String| SetupError::GatewayProgram {
        program: program.to_owned(),
        reason,
    };
    let mut hidden = Vec::new();
    for program in programs {
        let meta = match fs::metadata(program) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(refuse(program, e.to_string())),
        };
        if meta.file_type().is_char_device() {
            continue;
        }
        if !meta.is_file() {
            return Err(refuse(program, "not a regular file".into()));
        }
        if meta.nlink() > 1 {
            return Err(refuse(
                program,
                format!(
                    "it has {} hard links, and the agent could run it through another name; grant a program with one name only",
                    meta.nlink()
                ),
            ));
        }
        hidden.push((program, meta.dev(), meta.ino()));
    }
    for executable in crate::confine::with_interpreters(execute) {
        let Ok(meta) = fs::metadata(&executable) else {
            continue;
        };
        if let Some((program, ..)) = hidden
            .iter()
            .find(|(_, dev, ino)| (*dev, *ino) == (meta.dev(), meta.ino()))
        {
            return Err(refuse(
                program,
                format!(
                    "the agent's own executable {} is (or runs through) it: list the program in one place only",
                    executable.display()
                ),
            ));
        }
    }
    for (program, ..) in hidden {
        mount(
            Some("/dev/null"),
            program.as_path(),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| refuse(program, format!("covering it: {e}")))?;
        restrict_recursively(
            program,
            Restrict {
                read_only: true,
                devices: false,
                no_exec: true,
            },
        )?;
    }
    Ok(())
}

/// Lifts the cover [`hide_programs`] put over `program`, for this process (the gateway's
/// command) alone: a mount namespace of its own, private, without the cover. Every cover
/// stacked there goes (a program hidden again after an amendment re-added it).
pub(crate) fn reveal_program(program: &Path) -> Result<(), String> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("a mount namespace for the command: {e}"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("making the command's mounts private: {e}"))?;
    for _ in 0..16 {
        match umount2(program, MntFlags::MNT_DETACH) {
            Ok(()) => continue,
            // Not (any more) a mount point: nothing covers it.
            Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(format!("uncovering {}: {e}", program.display())),
        }
    }
    Err(format!("{} is covered too many times", program.display()))
}

/// Brings up `lo` in the (new, empty) network namespace: the only interface the sandbox has.
fn loopback_up() -> std::io::Result<()> {
    // SAFETY: plain socket(2) call; the result is checked and the fd closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *slot = *byte as libc::c_char;
    }
    // SAFETY: `fd` is an open socket and `request` a valid ifreq naming "lo"; SIOCGIFFLAGS
    // and SIOCSIFFLAGS read and write only that struct.
    let result = unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut request) < 0 {
            -1
        } else {
            request.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            libc::ioctl(fd, libc::SIOCSIFFLAGS, &request)
        }
    };
    let error = std::io::Error::last_os_error();
    // SAFETY: `fd` is ours and closed exactly once.
    unsafe { libc::close(fd) };
    if result < 0 {
        Err(error)
    } else {
        Ok(())
    }
}

/// Files and directories that show the host rather than the sandbox, masked (where this
/// kernel has them) as container runtimes mask them: the host's kernel command line, kernel
/// memory, keys, timers and scheduler state, interrupt counts, and the host's ACPI, sound
/// and SCSI devices and firmware tables. `/sys` is listed for a sandbox that would show it;
/// none does today.
const MASKED: [&str; 13] = [
    "/proc/cmdline",
    "/proc/kcore",
    "/proc/keys",
    "/proc/key-users",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/interrupts",
    "/proc/acpi",
    "/proc/asound",
    "/proc/scsi",
    "/sys/firmware",
];

/// Binds an empty read-only file over each file of [`MASKED`] inside `root`, and an empty
/// read-only directory over each directory: they read as empty, and nothing can be written
/// or executed through them. Both come from one small tmpfs, detached from the tree once
/// bound, so no path inside the sandbox leads to it.
fn mask_host_views(root: &Path) -> Result<(), SetupError> {
    let targets: Vec<(PathBuf, bool)> = MASKED
        .iter()
        .map(|path| inside(root, Path::new(path)))
        .filter_map(|target| {
            let meta = fs::symlink_metadata(&target).ok()?;
            (!meta.file_type().is_symlink()).then_some((target, meta.is_dir()))
        })
        .collect();
    if targets.is_empty() {
        return Ok(());
    }
    let source = root.join(".tollgate-masked");
    create_dir(&source)?;
    mount_fs(
        "tollgate-masked",
        &source,
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        "mode=0555,size=4k,nr_inodes=4",
    )?;
    let (empty_file, empty_dir) = (source.join("file"), source.join("dir"));
    let made = |path: &Path, result: std::io::Result<()>| {
        result.map_err(|source| SetupError::MountPoint {
            path: path.to_owned(),
            source,
        })
    };
    made(&empty_file, fs::write(&empty_file, b""))?;
    made(&empty_dir, fs::create_dir(&empty_dir))?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        made(
            &empty_file,
            fs::set_permissions(&empty_file, fs::Permissions::from_mode(0o444)),
        )?;
        made(
            &empty_dir,
            fs::set_permissions(&empty_dir, fs::Permissions::from_mode(0o555)),
        )?;
    }
    // Read-only before anything is bound from it: the binds inherit its flags.
    remount_tmpfs_read_only(&source, "the masking tmpfs")?;
    for (target, is_dir) in &targets {
        let what = if *is_dir { &empty_dir } else { &empty_file };
        mount(
            Some(what.as_path()),
            target.as_path(),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| SetupError::Mount {
            what: format!("mask over {}", target.display()),
            target: target.clone(),
            source: e,
        })?;
    }
    umount2(&source, MntFlags::MNT_DETACH).map_err(|e| SetupError::Mount {
        what: "detaching the masking tmpfs".into(),
        target: source.clone(),
        source: e,
    })?;
    made(&source, fs::remove_dir(&source))
}
