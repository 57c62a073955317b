//! File operations beneath a granted path, shared by the gateway and `tollgate restore`.
//!
//! Everything below a grant is resolved with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)` from a descriptor of the grant itself, so no `..`, absolute path or
//! symbolic link leads out of it, and the file that was checked is the file that is used.
//! Files are replaced atomically: a temporary file in the same directory, written and
//! fsynced, renamed over the old one, and the directory fsynced — a crash leaves the old file
//! or the new one, never a mix.

use std::ffi::{CStr, CString};
use std::io::{Read as _, Seek as _, Write as _};
use std::os::fd::{AsFd, AsRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat, openat2, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode, SFlag};

fn resolve_flags() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

/// A granted path, pinned: opened once when the run starts, before any agent exists, resolved
/// from `/` without following a symbolic link in any component, and used by descriptor from
/// then on (the bind mount too: see [`detached_mount`]). Whatever an agent later renames or
/// links — even where one grant lies inside another it may write, or where another run's agent
/// planted a link on the granted path — cannot change which directory a grant means.
#[derive(Debug)]
pub struct GrantRoot {
    /// The granted directory, or the directory holding a granted file (`O_PATH`).
    pub dir: OwnedFd,
    /// For a granted file: its name in `dir`.
    pub name: Option<CString>,
    /// For a granted file: the file itself as pinned (`O_PATH`), which its mount is cloned
    /// from (the gateway's tools use `dir` and `name`: a write replaces the file).
    pub file: Option<OwnedFd>,
    /// `dir`'s device, to recognise it later (`tollgate restore`).
    pub dev: u64,
    /// `dir`'s inode.
    pub ino: u64,
}

/// Opens `path` (absolute) from `/` with `flags`, following no symbolic link on the way: a
/// link in any component, the last included, is `ELOOP`.
fn open_no_links(path: &CStr, flags: OFlag) -> nix::Result<OwnedFd> {
    openat2(
        nix::fcntl::AT_FDCWD,
        path,
        OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS),
    )
}

impl GrantRoot {
    /// Pins the granted host path `grant` (absolute, normalised), following no symbolic link
    /// in any component: a link anywhere on the path is `ELOOP` ([`first_link`] names it).
    /// The operator's signature covers a path, not whatever a link on it points to today —
    /// and a run's agent can plant links inside its own write grant for another run to follow.
    pub fn open(grant: &str) -> nix::Result<GrantRoot> {
        // Signed paths are normalised; anything else (`..`, `//`) is never resolved here.
        if !tollgate_receipt::paths::is_normal_absolute(grant) {
            return Err(Errno::EINVAL);
        }
        let path = Path::new(grant);
        let (dir, name, file) = match (path.parent(), path.file_name()) {
            (Some(parent), Some(name)) => {
                let parent =
                    CString::new(parent.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
                let name = CString::new(name.as_encoded_bytes()).map_err(|_| Errno::EINVAL)?;
                // The entry is opened beneath its pinned directory: one resolution, no window
                // between looking at the directory and at the entry.
                let dir = open_no_links(&parent, OFlag::O_PATH | OFlag::O_DIRECTORY)?;
                let entry = openat2(
                    &dir,
                    name.as_c_str(),
                    OpenHow::new()
                        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
                        .resolve(resolve_flags()),
                )?;
                if is_dir(&fstat(&entry)?) {
                    (entry, None, None)
                } else {
                    (dir, Some(name), Some(entry))
                }
            }
            // The root itself.
            _ => (
                open_no_links(c"/", OFlag::O_PATH | OFlag::O_DIRECTORY)?,
                None,
                None,
            ),
        };
        let stat = fstat(&dir)?;
        Ok(GrantRoot {
            dir,
            name,
            file,
            dev: stat.st_dev,
            ino: stat.st_ino,
        })
    }
}

/// The first component of the absolute path `path` that is a symbolic link now (for a
/// refusal that names it), if any.
pub fn first_link(path: &str) -> Option<String> {
    let mut at = std::path::PathBuf::from("/");
    for component in Path::new(path).components().skip(1) {
        at.push(component);
        match std::fs::symlink_metadata(&at) {
            Ok(meta) if meta.file_type().is_symlink() => return Some(at.display().to_string()),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
    None
}

/// A detached copy of the mount tree at the pinned grant `root` (`open_tree` with
/// `OPEN_TREE_CLONE | AT_RECURSIVE`), for the shim to attach inside the sandbox with
/// `move_mount`: a grant is bind-mounted from the descriptor pinned at start, never from its
/// path again, so nothing renamed or linked between the pin and the mount changes what the
/// sandbox sees.
pub fn detached_mount(root: &GrantRoot) -> nix::Result<OwnedFd> {
    // The very inode pinned at start (a granted file's too), never its name again.
    detached_copy(root.file.as_ref().unwrap_or(&root.dir).as_fd())
}

/// A detached copy of the mount tree at `entry` (a descriptor of any file, `O_PATH` will do):
/// `open_tree` with `OPEN_TREE_CLONE | AT_RECURSIVE`, for the shim to attach with
/// `move_mount`.
pub fn detached_copy(entry: std::os::fd::BorrowedFd<'_>) -> nix::Result<OwnedFd> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const AT_RECURSIVE: libc::c_uint = 0x8000;
    let flags = OPEN_TREE_CLONE
        | AT_RECURSIVE
        | libc::O_CLOEXEC as libc::c_uint
        | libc::AT_EMPTY_PATH as libc::c_uint;
    #[allow(unsafe_code)]
    // SAFETY: open_tree reads a NUL-terminated path (the empty string, a static) and a
    // descriptor this function owns for the duration of the call; it returns a new
    // descriptor or -1 and touches no other memory of this process.
    let raw = unsafe { libc::syscall(libc::SYS_open_tree, entry.as_raw_fd(), c"".as_ptr(), flags) };
    if raw < 0 {
        return Err(Errno::last());
    }
    #[allow(unsafe_code)]
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw as std::os::fd::RawFd) })
}

impl GrantRoot {
    /// Pins `rest` beneath the pinned `root` (a delegated child's grant beneath its parent's):
    /// resolved from `root`'s descriptor without following any symbolic link, never by path.
    /// A link anywhere on the way, the granted path itself included, is `ELOOP`.
    pub fn from_beneath(root: &GrantRoot, rest: &str) -> nix::Result<GrantRoot> {
        if rest.is_empty() {
            let file = match &root.file {
                Some(file) => Some(file.try_clone().map_err(|e| errno_of(&e))?),
                None => None,
            };
            return Ok(GrantRoot {
                dir: root.dir.try_clone().map_err(|e| errno_of(&e))?,
                name: root.name.clone(),
                file,
                dev: root.dev,
                ino: root.ino,
            });
        }
        let fd = open_beneath(root, rest, OFlag::O_PATH)?;
        let stat = fstat(&fd)?;
        if is_dir(&stat) {
            return Ok(GrantRoot {
                dir: fd,
                name: None,
                file: None,
                dev: stat.st_dev,
                ino: stat.st_ino,
            });
        }
        if SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFLNK {
            return Err(Errno::ELOOP);
        }
        let parent = parent_beneath(root, rest)?;
        let dir_stat = fstat(&parent.fd)?;
        Ok(GrantRoot {
            dir: parent.fd,
            name: Some(parent.name),
            file: Some(fd),
            dev: dir_stat.st_dev,
            ino: dir_stat.st_ino,
        })
    }
}

/// Opens `rest` (relative; empty for the grant itself) beneath `root` with `flags`, never
/// leaving it.
pub fn open_beneath(root: &GrantRoot, rest: &str, flags: OFlag) -> nix::Result<OwnedFd> {
    let rest: &CStr = match (&root.name, rest.is_empty()) {
        (Some(name), true) => name.as_c_str(),
        // Nothing lies beneath a granted file.
        (Some(_), false) => return Err(Errno::ENOTDIR),
        (None, true) if flags.contains(OFlag::O_PATH) => {
            return root.dir.try_clone().map_err(|e| errno_of(&e))
        }
        (None, true) => return reopen(&root.dir, flags),
        (None, false) => &CString::new(rest).map_err(|_| Errno::EINVAL)?,
    };
    openat2(
        &root.dir,
        rest,
        OpenHow::new()
            .flags(flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .resolve(resolve_flags()),
    )
}

/// Reopens a descriptor (usually `O_PATH`) for real I/O through its `/proc/self/fd` link:
/// the same inode, never a path looked up again.
pub fn reopen(fd: &OwnedFd, flags: OFlag) -> nix::Result<OwnedFd> {
    nix::fcntl::open(
        format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str(),
        flags | OFlag::O_CLOEXEC | OFlag::O_NOCTTY,
        Mode::empty(),
    )
}

/// The directory holding a path beneath a grant, opened beneath it, and the path's last
/// component.
#[derive(Debug)]
pub struct ParentDir {
    /// The directory, opened `O_RDONLY | O_DIRECTORY`.
    pub fd: OwnedFd,
    /// The last component (never empty, never `.` or `..`).
    pub name: CString,
}

/// Opens the directory that holds `rest` beneath `root` (for a granted file: the directory
/// holding it, with `rest` empty). A granted directory itself has no parent here.
pub fn parent_beneath(root: &GrantRoot, rest: &str) -> nix::Result<ParentDir> {
    let directory = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
    if let Some(name) = &root.name {
        if !rest.is_empty() {
            return Err(Errno::ENOTDIR);
        }
        return Ok(ParentDir {
            fd: reopen(&root.dir, directory)?,
            name: name.clone(),
        });
    }
    let (dir, name) = match rest.rsplit_once('/') {
        Some((dir, name)) => (dir, name),
        None => ("", rest),
    };
    if name.is_empty() || name == "." || name == ".." {
        return Err(Errno::EINVAL);
    }
    let fd = open_beneath(root, dir, directory)?;
    let name = CString::new(name).map_err(|_| Errno::EINVAL)?;
    Ok(ParentDir { fd, name })
}

impl ParentDir {
    /// What the entry is now, without following a link; `None` if it does not exist.
    pub fn entry(&self) -> nix::Result<Option<FileStat>> {
        match fstatat(&self.fd, self.name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(stat) => Ok(Some(stat)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Opens the entry for reading if it is the regular file `expected` (same inode), never
    /// following a link and never opening a device or FIFO.
    pub fn open_existing(&self, expected: &FileStat) -> nix::Result<OwnedFd> {
        let fd = openat(
            &self.fd,
            self.name.as_c_str(),
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let stat = fstat(&fd)?;
        if !is_regular(&stat) || stat.st_ino != expected.st_ino || stat.st_dev != expected.st_dev {
            // Swapped between the look and the open.
            return Err(Errno::ESTALE);
        }
        reopen(&fd, OFlag::O_RDONLY)
    }
}

/// Whether `stat` describes a regular file.
pub fn is_regular(stat: &FileStat) -> bool {
    SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFREG
}

/// Whether `stat` describes a directory.
pub fn is_dir(stat: &FileStat) -> bool {
    SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFDIR
}

/// Owner and permission bits a replaced or created file gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ownership {
    /// Owner uid.
    pub uid: u32,
    /// Owner gid.
    pub gid: u32,
    /// Permission bits.
    pub mode: u32,
}

/// A new file's content, written and fsynced beside the target, not yet in place. Dropped
/// without [`StagedFile::commit`], it leaves nothing behind.
#[derive(Debug)]
pub struct StagedFile {
    parent: ParentDir,
    /// The unnamed file (`O_TMPFILE`), until it is linked at `temp` just before the rename.
    unnamed: Option<OwnedFd>,
    /// The temporary name, used only around the rename (or throughout where the file system
    /// has no `O_TMPFILE`).
    temp: CString,
    named: bool,
    committed: bool,
    /// The new file's size.
    pub size: u64,
}

/// Writes a new file in `parent` with `prefix` (the first `len` bytes of an open file, e.g.
/// the old content for an append, as snapshotted) followed by `data`, owned and moded as `owner`, and fsyncs it. The file
/// has no name until [`StagedFile::commit`] (`O_TMPFILE`), so a crash while it is written
/// leaves nothing in the directory; file systems without `O_TMPFILE` get a temporary name
/// (`.tollgate-TAG.tmp`) instead.
pub fn stage(
    parent: ParentDir,
    tag: &str,
    prefix: Option<(&OwnedFd, u64)>,
    data: &[u8],
    owner: Ownership,
) -> nix::Result<StagedFile> {
    let temp = CString::new(format!(".tollgate-{tag}.tmp")).map_err(|_| Errno::EINVAL)?;
    let mut staged = StagedFile {
        parent,
        unnamed: None,
        temp,
        named: false,
        committed: false,
        size: 0,
    };
    let fd = match openat(
        &staged.parent.fd,
        ".",
        OFlag::O_TMPFILE | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    ) {
        Ok(fd) => fd,
        Err(Errno::EOPNOTSUPP | Errno::EISDIR | Errno::EINVAL) => {
            let fd = openat(
                &staged.parent.fd,
                staged.temp.as_c_str(),
                OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o600),
            )?;
            staged.named = true;
            fd
        }
        Err(e) => return Err(e),
    };
    let mut file = std::fs::File::from(fd);
    if let Some((prefix, len)) = prefix {
        // A duplicate shares the file offset: read from the start whatever read it before.
        let mut source = std::fs::File::from(prefix.try_clone().map_err(|e| errno_of(&e))?);
        source
            .seek(std::io::SeekFrom::Start(0))
            .map_err(|e| errno_of(&e))?;
        staged.size += std::io::copy(&mut source.take(len), &mut file).map_err(|e| errno_of(&e))?;
    }
    file.write_all(data).map_err(|e| errno_of(&e))?;
    staged.size += data.len() as u64;
    // Owner and mode before the rename: the file never appears with the wrong ones.
    nix::unistd::fchown(
        &file,
        Some(nix::unistd::Uid::from_raw(owner.uid)),
        Some(nix::unistd::Gid::from_raw(owner.gid)),
    )?;
    nix::sys::stat::fchmod(&file, Mode::from_bits_truncate(owner.mode & 0o7777))?;
    file.sync_all().map_err(|e| errno_of(&e))?;
    if !staged.named {
        staged.unnamed = Some(OwnedFd::from(file));
    }
    Ok(staged)
}

fn errno_of(e: &std::io::Error) -> Errno {
    e.raw_os_error().map_or(Errno::EIO, Errno::from_raw)
}

impl StagedFile {
    /// Puts the staged file in place atomically (refusing to replace an existing file when
    /// `no_replace`) and fsyncs the directory.
    pub fn commit(mut self, no_replace: bool) -> nix::Result<()> {
        if let Some(unnamed) = self.unnamed.take() {
            // Named only now; `linkat` by descriptor (AT_EMPTY_PATH) needs the supervisor's
            // CAP_DAC_READ_SEARCH.
            nix::unistd::linkat(
                &unnamed,
                "",
                &self.parent.fd,
                self.temp.as_c_str(),
                AtFlags::AT_EMPTY_PATH,
            )?;
            self.named = true;
        }
        let flags = if no_replace {
            nix::fcntl::RenameFlags::RENAME_NOREPLACE
        } else {
            nix::fcntl::RenameFlags::empty()
        };
        nix::fcntl::renameat2(
            &self.parent.fd,
            self.temp.as_c_str(),
            &self.parent.fd,
            self.parent.name.as_c_str(),
            flags,
        )?;
        self.committed = true;
        nix::unistd::fsync(&self.parent.fd)
    }
}

impl Drop for StagedFile {
    fn drop(&mut self) {
        if self.named && !self.committed {
            let _ = nix::unistd::unlinkat(
                &self.parent.fd,
                self.temp.as_c_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
    }
}

/// Removes `parent`'s entry (a regular file, or an empty directory when `dir`) and fsyncs
/// the directory.
pub fn remove(parent: &ParentDir, dir: bool) -> nix::Result<()> {
    nix::unistd::unlinkat(
        &parent.fd,
        parent.name.as_c_str(),
        if dir {
            nix::unistd::UnlinkatFlags::RemoveDir
        } else {
            nix::unistd::UnlinkatFlags::NoRemoveDir
        },
    )?;
    nix::unistd::fsync(&parent.fd)
}

/// Copies the first `len` bytes of `source` into a new file at `path` (mode 0600) and fsyncs
/// it; fails if `source` is shorter. Used for snapshots: binary-safe, the content exactly as
/// it was when it was checked.
pub fn copy_to_new(source: &OwnedFd, path: &Path, len: u64) -> std::io::Result<u64> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut from = std::fs::File::from(source.try_clone()?);
    // A duplicate shares the file offset: read from the start whatever read it before.
    from.seek(std::io::SeekFrom::Start(0))?;
    let mut to = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    let copied = std::io::copy(&mut from.take(len), &mut to)?;
    if copied != len {
        return Err(std::io::Error::other(format!(
            "the file shrank while it was copied ({copied} of {len} bytes)"
        )));
    }
    to.sync_all()?;
    Ok(copied)
}

/// Reads a whole small file that is opened already.
pub fn read_fd(fd: impl AsFd) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::from(fd.as_fd().try_clone_to_owned()?).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The last component of `name` as UTF-8 (lossy), for messages.
pub fn display_name(name: &CStr) -> String {
    name.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_are_pinned_without_following_any_link() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        let real = base.join("real");
        std::fs::create_dir_all(real.join("sub")).unwrap();
        std::fs::write(real.join("file"), b"x").unwrap();
        std::os::unix::fs::symlink(&real, base.join("link")).unwrap();
        std::os::unix::fs::symlink(real.join("file"), base.join("file-link")).unwrap();
        let path = |p: &Path| p.display().to_string();

        // Real paths pin: a directory as itself, a file as its directory and name.
        assert!(GrantRoot::open(&path(&real)).unwrap().name.is_none());
        let file = GrantRoot::open(&path(&real.join("file"))).unwrap();
        assert_eq!(file.name.as_deref(), Some(c"file"));
        assert!(GrantRoot::open("/").is_ok());

        // A link as the last component, or anywhere before it, is ELOOP, and is named.
        for (through, link) in [
            (base.join("link"), base.join("link")),
            (base.join("link/sub"), base.join("link")),
            (base.join("file-link"), base.join("file-link")),
        ] {
            assert_eq!(GrantRoot::open(&path(&through)).unwrap_err(), Errno::ELOOP);
            assert_eq!(first_link(&path(&through)), Some(path(&link)));
        }
        assert_eq!(first_link(&path(&real.join("sub"))), None);
        assert_eq!(GrantRoot::open("relative").unwrap_err(), Errno::EINVAL);
    }
}
