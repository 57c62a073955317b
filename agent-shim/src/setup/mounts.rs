//! The mount primitives every step uses: mounting a file system, binding a path, attaching a
//! detached mount, and restricting a mount tree (read-only, nosuid, nodev, noexec) in one call.

use std::ffi::CString;
use std::fs;
use std::os::fd::AsRawFd as _;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};

use super::error::SetupError;

pub(super) fn inside(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

pub(super) fn create_dir(path: &Path) -> Result<(), SetupError> {
    fs::create_dir_all(path).map_err(|source| SetupError::MountPoint {
        path: path.to_owned(),
        source,
    })
}

pub(super) fn mount_fs(
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

/// Makes every mount of this mount namespace a slave of its peers: nothing mounted here
/// propagates out, and what is mounted or unmounted there still propagates in.
pub(super) fn receive_only() -> Result<(), SetupError> {
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(SetupError::Private)
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
pub(super) struct Restrict {
    pub(super) read_only: bool,
    /// Device nodes stay usable (only for the /dev binds).
    pub(super) devices: bool,
    /// Nothing on it may be executed or mapped executable: everything but the system paths,
    /// executable read grants and what the receipt makes writable and executable. Landlock alone would let the dynamic loader run a file the
    /// agent wrote.
    pub(super) no_exec: bool,
}

/// Adds nosuid and the restrictions in `how` to the mount at `target` and every mount beneath
/// it, in one call (mount_setattr, Linux 5.12+). Only adds restrictions, which the kernel
/// allows even on locked mounts.
pub(super) fn restrict_recursively(target: &Path, how: Restrict) -> Result<(), SetupError> {
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
pub(super) fn mount_point(target: &Path, directory: bool) -> Result<(), SetupError> {
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
pub(super) fn bind(source: &Path, target: &Path, how: Restrict) -> Result<(), SetupError> {
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
pub(super) fn attach(
    mount: &OwnedFd,
    grant: &Path,
    target: &Path,
    how: Restrict,
) -> Result<(), SetupError> {
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
