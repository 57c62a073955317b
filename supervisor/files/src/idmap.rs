//! Id-mapped grants: a granted directory owned by an unprivileged host user (a home directory
//! at 0700) is shown to the sandbox's agent as its own, and what the agent creates there lands
//! owned by that user on the host — without changing anything on disk and without the agent
//! holding any privilege. The kernel does the mapping (`mount_setattr` with
//! `MOUNT_ATTR_IDMAP`): the detached mount of a grant is given a user namespace whose only
//! mapping is the grant owner's uid and gid to the sandbox's host id.

use std::ffi::CStr;
use std::os::fd::{AsRawFd as _, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sched::CloneFlags;
use nix::sys::stat::Mode;
use nix::sys::wait::waitpid;

/// A user namespace mapping one host user (uid and gid) to another, used only to id-map
/// mounts. It holds no process: the namespace lives as long as this descriptor (and the
/// mounts made with it).
#[derive(Debug)]
pub struct IdmapNamespace {
    ns: OwnedFd,
}

/// Why a user namespace for an id-mapped mount could not be made.
#[derive(Debug, thiserror::Error)]
pub enum IdmapError {
    /// The helper process that creates the namespace could not be started.
    #[error("starting the id-map helper: {0}")]
    Clone(Errno),
    /// Writing the namespace's uid or gid map failed.
    #[error("writing the id map {map}: {source}")]
    Map {
        /// `uid_map` or `gid_map`.
        map: &'static str,
        /// The failure.
        source: std::io::Error,
    },
    /// Opening the namespace failed.
    #[error("opening the id-map namespace: {0}")]
    Open(Errno),
    /// The kernel refused to id-map the mount (the file system cannot).
    #[error("{0}")]
    Mount(Errno),
}

impl IdmapNamespace {
    /// A user namespace in which host uid `owner_uid` and gid `owner_gid` (and nothing else)
    /// are mapped to `to`: a mount id-mapped with it shows files of `owner_uid` as `to`'s, and
    /// files `to` creates through it land as `owner_uid`'s.
    pub fn new(owner_uid: u32, owner_gid: u32, to: u32) -> Result<Self, IdmapError> {
        let (hold_read, hold_write) = nix::unistd::pipe().map_err(IdmapError::Clone)?;
        let (read_fd, write_fd) = (hold_read.as_raw_fd(), hold_write.as_raw_fd());
        let mut stack = vec![0u8; 16 * 1024];
        // The child only waits for the pipe to close: it touches no lock, allocates nothing
        // and calls only async-signal-safe functions, as a child of a threaded process must.
        let wait = Box::new(move || hold_until_closed(read_fd, write_fd));
        #[allow(unsafe_code)]
        // SAFETY: the child shares this address space (CLONE_VM: no page tables copied, which
        // for a large daemon is most of a fork's cost) but only runs `hold_until_closed` on
        // `stack`, which outlives it (the parent waits for it below): two system calls, no
        // allocation, no lock, nothing of the parent's memory written. It exits when that
        // returns.
        let child = unsafe {
            nix::sched::clone(
                wait,
                &mut stack,
                CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_VM,
                Some(libc::SIGCHLD),
            )
        }
        .map_err(IdmapError::Clone)?;
        drop(hold_read);
        let made = (|| {
            // Written as root of the parent namespace: any one-line map is allowed, and
            // gid_map needs no `setgroups deny` first.
            for (map, line) in [
                ("uid_map", format!("{owner_uid} {to} 1\n")),
                ("gid_map", format!("{owner_gid} {to} 1\n")),
            ] {
                std::fs::write(format!("/proc/{child}/{map}"), line)
                    .map_err(|source| IdmapError::Map { map, source })?;
            }
            nix::fcntl::open(
                format!("/proc/{child}/ns/user").as_str(),
                OFlag::O_RDONLY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(IdmapError::Open)
        })();
        drop(hold_write);
        let _ = waitpid(child, None);
        Ok(Self { ns: made? })
    }

    /// Id-maps the detached mount `mount` (and every mount beneath it) with this namespace.
    /// Fails with the kernel's error where the file system cannot be id-mapped.
    pub fn apply(&self, mount: &OwnedFd) -> Result<(), IdmapError> {
        const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
        const AT_RECURSIVE: libc::c_uint = 0x8000;
        #[repr(C)]
        struct MountAttr {
            attr_set: u64,
            attr_clr: u64,
            propagation: u64,
            userns_fd: u64,
        }
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_IDMAP,
            attr_clr: 0,
            propagation: 0,
            userns_fd: u64::try_from(self.ns.as_raw_fd())
                .map_err(|_| IdmapError::Open(Errno::EBADF))?,
        };
        let empty: &CStr = c"";
        #[allow(unsafe_code)]
        // SAFETY: mount_setattr reads a NUL-terminated path (a static empty string) and
        // `attr`, a properly laid out `struct mount_attr` that outlives the call, of the size
        // passed; both descriptors are owned here.
        let result = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                mount.as_raw_fd(),
                empty.as_ptr(),
                libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
                &attr as *const MountAttr,
                size_of::<MountAttr>(),
            )
        };
        if result == 0 {
            Ok(())
        } else {
            Err(IdmapError::Mount(Errno::last()))
        }
    }
}

/// The id-map helper child's whole life: close its copy of the pipe's write end, then wait
/// for the parent to close its own (EOF), then exit.
#[allow(unsafe_code)]
fn hold_until_closed(read_fd: i32, write_fd: i32) -> isize {
    let mut byte = 0u8;
    // SAFETY: closing an inherited descriptor and reading one byte into a local; both are
    // async-signal-safe, as a child of a threaded process must limit itself to.
    unsafe {
        libc::close(write_fd);
        libc::read(read_fd, (&mut byte as *mut u8).cast(), 1);
    }
    0
}

/// The name of the file system holding `fd`, for a refusal that names it (its magic number
/// in hex when it is not one of the common ones).
pub fn filesystem_name(fd: &OwnedFd) -> String {
    let Ok(stat) = nix::sys::statfs::fstatfs(fd) else {
        return "unknown".into();
    };
    let magic = stat.filesystem_type().0 as u64;
    match magic {
        0xEF53 => "ext4".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x0102_1994 => "tmpfs".into(),
        0x794C_7630 => "overlayfs".into(),
        0x6969 => "nfs".into(),
        0x0102_1997 => "9p".into(),
        0x6573_5546 => "fuse".into(),
        0xFF53_4D42 | 0xFE53_4D42 => "cifs/smb".into(),
        0x2FC1_2FC1 => "zfs".into(),
        0xF2F5_2010 => "f2fs".into(),
        0x5346_544E => "ntfs".into(),
        0x4D44 => "vfat".into(),
        other => format!("file system 0x{other:x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    #[test]
    fn an_id_mapped_mount_shows_the_owners_files_as_the_targets() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let granted = dir.path().join("home");
        std::fs::create_dir(&granted).unwrap();
        std::fs::write(granted.join("notes"), b"x").unwrap();
        for path in [granted.clone(), granted.join("notes")] {
            nix::unistd::chown(
                &path,
                Some(nix::unistd::Uid::from_raw(4242)),
                Some(nix::unistd::Gid::from_raw(4243)),
            )
            .unwrap();
        }
        let root = crate::beneath::GrantRoot::open(granted.to_str().unwrap()).unwrap();
        let mount = crate::beneath::detached_mount(&root).unwrap();
        let ns = IdmapNamespace::new(4242, 4243, 5151).unwrap();
        if let Err(e) = ns.apply(&mount) {
            panic!("{} cannot id-map: {e}", filesystem_name(&mount));
        }
        // The detached mount is reachable through its descriptor.
        let seen = std::fs::metadata(format!("/proc/self/fd/{}/notes", mount.as_raw_fd())).unwrap();
        assert_eq!((seen.uid(), seen.gid()), (5151, 5151));
        // On disk nothing changed.
        let disk = std::fs::metadata(granted.join("notes")).unwrap();
        assert_eq!((disk.uid(), disk.gid()), (4242, 4243));
    }
}
