//! Files out of a run's workspace as a tar stream (`tollgate cp RUN:/work/... DEST`), read by
//! descriptor beneath the workspace: every directory is opened from its parent's descriptor
//! with `O_NOFOLLOW`, every file checked by `fstat` on the descriptor that is read, and a link
//! is archived as a link, never followed. An agent still running can rename, swap or link
//! whatever it likes meanwhile; the supervisor (root) reads nothing outside the workspace.

use std::ffi::{CStr, CString, OsStr};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode, SFlag};

use crate::beneath::{open_beneath, GrantRoot};

/// Deepest directory nesting archived (deeper is refused, not silently cut).
const MAX_DEPTH: usize = 256;

/// Why an archive could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The path does not exist beneath the workspace (or leaves it).
    #[error("{0}: no such file or directory in the workspace")]
    NotFound(String),
    /// The archive would pass its byte limit.
    #[error("more than {0} bytes to copy")]
    TooLarge(u64),
    /// Directories nest deeper than [`MAX_DEPTH`].
    #[error("directories nest deeper than {MAX_DEPTH}")]
    TooDeep,
    /// An entry of an archive to unpack names a path outside its destination.
    #[error("{0}: the archive names a path outside the destination")]
    Outside(String),
    /// The directory to unpack into does not exist in the workspace (or is not a directory).
    #[error("/work/{0}: no such directory in the run's workspace; copy into a directory that exists (or into /work)")]
    NoDirectory(String),
    /// Reading a file or writing the archive failed.
    #[error("{path}: {source}")]
    Io {
        /// The path in the archive.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn errno(path: &Path) -> impl Fn(Errno) -> ArchiveError + '_ {
    move |e| ArchiveError::Io {
        path: path.display().to_string(),
        source: e.into(),
    }
}

fn kind(stat: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits())
}

/// A file's content as exactly `len` bytes: what is read, then zeros if it shrank meanwhile
/// (the header already said `len`).
struct Exactly<R> {
    inner: std::io::Take<R>,
    left: u64,
}

impl<R: Read> Read for Exactly<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let mut got = self.inner.read(&mut buf[..want])?;
        if got == 0 {
            buf[..want].fill(0);
            got = want;
        }
        self.left -= got as u64;
        Ok(got)
    }
}

/// Writes `rest` (relative to the workspace `root`; empty for the workspace itself) as a tar
/// stream to `out`, named `name` at its top: a file as one entry, a directory with everything
/// beneath it. Set-uid and set-gid bits are dropped; owners are kept as numbers. Refused past
/// `limit` bytes of file content. Returns the bytes of content archived.
pub fn write_tar(
    root: &GrantRoot,
    rest: &str,
    name: &str,
    out: impl Write,
    limit: u64,
) -> Result<u64, ArchiveError> {
    let mut builder = tar::Builder::new(out);
    builder.mode(tar::HeaderMode::Complete);
    let top = PathBuf::from(name);
    let entry =
        open_beneath(root, rest, OFlag::O_PATH).map_err(|_| ArchiveError::NotFound(rest.into()))?;
    let stat = fstat(&entry).map_err(errno(&top))?;
    let mut walk = Walk {
        builder: &mut builder,
        bytes: 0,
        limit,
    };
    match kind(&stat) {
        SFlag::S_IFDIR => {
            let dir = crate::beneath::reopen(&entry, OFlag::O_RDONLY | OFlag::O_DIRECTORY)
                .map_err(errno(&top))?;
            walk.directory(dir, &stat, &top, 0)?;
        }
        SFlag::S_IFREG => {
            let file = crate::beneath::reopen(&entry, OFlag::O_RDONLY).map_err(errno(&top))?;
            walk.file(file, &top)?;
        }
        _ => return Err(ArchiveError::NotFound(rest.into())),
    }
    let bytes = walk.bytes;
    builder
        .into_inner()
        .map_err(io(&top))?
        .flush()
        .map_err(io(&top))?;
    Ok(bytes)
}

struct Walk<'a, W: Write> {
    builder: &'a mut tar::Builder<W>,
    bytes: u64,
    limit: u64,
}

impl<W: Write> Walk<'_, W> {
    fn header(stat: &FileStat, kind: tar::EntryType) -> tar::Header {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(stat.st_mode & 0o1777);
        header.set_uid(u64::from(stat.st_uid));
        header.set_gid(u64::from(stat.st_gid));
        header.set_mtime(u64::try_from(stat.st_mtime).unwrap_or(0));
        header.set_size(0);
        header
    }

    fn file(&mut self, file: OwnedFd, path: &Path) -> Result<(), ArchiveError> {
        // Checked on the descriptor that is read: a regular file, whatever the name is now.
        let stat = fstat(&file).map_err(errno(path))?;
        if kind(&stat) != SFlag::S_IFREG {
            return Ok(());
        }
        let len = u64::try_from(stat.st_size).unwrap_or(0);
        self.bytes = self.bytes.saturating_add(len);
        if self.bytes > self.limit {
            return Err(ArchiveError::TooLarge(self.limit));
        }
        let mut header = Self::header(&stat, tar::EntryType::Regular);
        header.set_size(len);
        let content = Exactly {
            inner: std::fs::File::from(file).take(len),
            left: len,
        };
        self.builder
            .append_data(&mut header, path, content)
            .map_err(io(path))
    }

    fn directory(
        &mut self,
        dir: OwnedFd,
        stat: &FileStat,
        path: &Path,
        depth: usize,
    ) -> Result<(), ArchiveError> {
        if depth > MAX_DEPTH {
            return Err(ArchiveError::TooDeep);
        }
        let mut header = Self::header(stat, tar::EntryType::Directory);
        self.builder
            .append_data(&mut header, path, std::io::empty())
            .map_err(io(path))?;
        let listing = Dir::from_fd(dir).map_err(errno(path))?;
        let mut names: Vec<CString> = Vec::new();
        // Listed first, then each opened from the same descriptor: the listing's own
        // iteration must not hold the directory while files are read.
        let mut listing = listing;
        for entry in listing.iter() {
            let entry = entry.map_err(errno(path))?;
            let name = entry.file_name();
            if name != c"." && name != c".." {
                names.push(name.to_owned());
            }
        }
        names.sort();
        for name in names {
            let child = path.join(OsStr::from_bytes(name.as_bytes()));
            self.entry(&listing, &name, &child, depth)?;
        }
        Ok(())
    }

    fn entry(
        &mut self,
        dir: &Dir,
        name: &CStr,
        path: &Path,
        depth: usize,
    ) -> Result<(), ArchiveError> {
        let stat = match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            // Gone since the listing.
            Err(Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(errno(path)(e)),
        };
        let open = |flags: OFlag| {
            openat(
                dir,
                name,
                flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
        };
        match kind(&stat) {
            SFlag::S_IFDIR => match open(OFlag::O_RDONLY | OFlag::O_DIRECTORY) {
                Ok(child) => {
                    let stat = fstat(&child).map_err(errno(path))?;
                    self.directory(child, &stat, path, depth + 1)
                }
                // Swapped for something else since the look: left out.
                Err(Errno::ENOENT | Errno::ELOOP | Errno::ENOTDIR) => Ok(()),
                Err(e) => Err(errno(path)(e)),
            },
            SFlag::S_IFREG => match open(OFlag::O_RDONLY | OFlag::O_NONBLOCK) {
                Ok(file) => self.file(file, path),
                Err(Errno::ENOENT | Errno::ELOOP) => Ok(()),
                Err(e) => Err(errno(path)(e)),
            },
            SFlag::S_IFLNK => {
                let target = match nix::fcntl::readlinkat(dir, name) {
                    Ok(target) => target,
                    Err(Errno::ENOENT | Errno::EINVAL) => return Ok(()),
                    Err(e) => return Err(errno(path)(e)),
                };
                let mut header = Self::header(&stat, tar::EntryType::Symlink);
                self.builder
                    .append_link(&mut header, path, Path::new(&target))
                    .map_err(io(path))
            }
            // Devices, FIFOs and sockets are not copied.
            _ => Ok(()),
        }
    }
}

/// What [`extract_tar`] gives the files it makes.
#[derive(Debug, Clone, Copy)]
pub struct Extract {
    /// Owner uid and gid of everything made (the run's host id: the agent's own).
    pub owner: (u32, u32),
    /// Most bytes of one file (its content is staged in memory).
    pub max_file: u64,
    /// Most bytes of file content in all.
    pub limit: u64,
}

/// The components of an archive entry's path beneath its destination: normal names only
/// (`./` skipped); `None` when it would leave it (`..`, an absolute path).
fn entry_components(path: &Path) -> Option<Vec<String>> {
    let mut parts = Vec::new();
    for component in path.components() {
        match component {
            std::path::Component::Normal(name) => parts.push(name.to_str()?.to_owned()),
            std::path::Component::CurDir => {}
            _ => return None,
        }
    }
    (!parts.is_empty()).then_some(parts)
}

/// Unpacks a tar stream into the workspace `root`, beneath `rest` (a directory there; empty
/// for the workspace itself), by descriptor: each directory made with `mkdirat` in its
/// parent as opened beneath the root without following a link (a link the agent planted on
/// the way refuses the entry), each file written beside its place and renamed in, links made
/// as links and never followed, everything owned by `extract.owner`, set-id bits dropped.
/// Devices, FIFOs and the like are skipped. Returns the bytes of file content unpacked.
pub fn extract_tar(
    root: &GrantRoot,
    rest: &str,
    tar: impl Read,
    extract: Extract,
) -> Result<u64, ArchiveError> {
    use crate::beneath::{parent_beneath, stage, Ownership};
    let mut archive = tar::Archive::new(tar);
    let mut bytes = 0u64;
    let (uid, gid) = extract.owner;
    // The destination must already be a directory: otherwise the first entry's parent is
    // missing and the failure would name the entry (the caller's file), not the directory.
    if !rest.is_empty() {
        open_beneath(root, rest, OFlag::O_PATH | OFlag::O_DIRECTORY)
            .map_err(|_| ArchiveError::NoDirectory(rest.into()))?;
    }
    let chown = |parent: &crate::beneath::ParentDir, path: &Path| {
        nix::unistd::fchownat(
            &parent.fd,
            parent.name.as_c_str(),
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(errno(path))
    };
    let bad = |path: &Path| {
        let path = path.to_owned();
        move |e: std::io::Error| ArchiveError::Io {
            path: path.display().to_string(),
            source: e,
        }
    };
    for entry in archive.entries().map_err(bad(Path::new("archive")))? {
        let mut entry = entry.map_err(bad(Path::new("archive")))?;
        let path = entry
            .path()
            .map_err(bad(Path::new("archive")))?
            .into_owned();
        let parts = entry_components(&path)
            .ok_or_else(|| ArchiveError::Outside(path.display().to_string()))?;
        let kind = entry.header().entry_type();
        let mode = entry.header().mode().unwrap_or(0o644) & 0o1777;
        // Every directory on the way, made (owned by the agent) where missing.
        let mut at = rest.to_owned();
        let last = parts.len() - 1;
        for (i, part) in parts.iter().enumerate() {
            at = if at.is_empty() {
                part.clone()
            } else {
                format!("{at}/{part}")
            };
            if i == last && !kind.is_dir() {
                break;
            }
            let parent = parent_beneath(root, &at).map_err(errno(&path))?;
            let made = if i == last { mode | 0o700 } else { 0o755 };
            match nix::sys::stat::mkdirat(
                &parent.fd,
                parent.name.as_c_str(),
                Mode::from_bits_truncate(made),
            ) {
                Ok(()) => chown(&parent, &path)?,
                Err(Errno::EEXIST) => {}
                Err(e) => return Err(errno(&path)(e)),
            }
        }
        if kind.is_dir() {
            continue;
        }
        let parent = parent_beneath(root, &at).map_err(errno(&path))?;
        if kind.is_symlink() {
            let Some(target) = entry.link_name().map_err(bad(&path))? else {
                continue;
            };
            match nix::unistd::unlinkat(
                &parent.fd,
                parent.name.as_c_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            ) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(errno(&path)(e)),
            }
            nix::unistd::symlinkat(target.as_ref(), &parent.fd, parent.name.as_c_str())
                .map_err(errno(&path))?;
            chown(&parent, &path)?;
            continue;
        }
        if !kind.is_file() {
            continue;
        }
        let size = entry.header().size().unwrap_or(0);
        if size > extract.max_file {
            return Err(ArchiveError::TooLarge(extract.max_file));
        }
        bytes = bytes.saturating_add(size);
        if bytes > extract.limit {
            return Err(ArchiveError::TooLarge(extract.limit));
        }
        let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        entry.read_to_end(&mut data).map_err(bad(&path))?;
        let owner = Ownership { uid, gid, mode };
        stage(parent, "copy-in", None, &data, owner)
            .and_then(|staged| staged.commit(false))
            .map_err(errno(&path))?;
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_archived_with_its_links_as_links_and_nothing_outside() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(work.join("out/sub")).unwrap();
        std::fs::write(work.join("out/a.txt"), "alpha").unwrap();
        std::fs::write(work.join("out/sub/b.txt"), "beta").unwrap();
        std::fs::write(dir.path().join("secret"), "outside").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), work.join("out/link")).unwrap();
        let root = GrantRoot::open(work.to_str().unwrap()).unwrap();
        let mut tar = Vec::new();
        let bytes = write_tar(&root, "out", "out", &mut tar, 1 << 20).unwrap();
        assert_eq!(bytes, 9);
        let mut archive = tar::Archive::new(&tar[..]);
        let mut seen = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().display().to_string();
            let mut content = String::new();
            if entry.header().entry_type().is_file() {
                entry.read_to_string(&mut content).unwrap();
            }
            let link = entry
                .link_name()
                .unwrap()
                .map(|l| l.display().to_string())
                .unwrap_or_default();
            seen.push(format!("{path}|{content}|{link}"));
        }
        let secret = dir.path().join("secret").display().to_string();
        assert_eq!(
            seen,
            [
                "out||".to_owned(),
                "out/a.txt|alpha|".into(),
                format!("out/link||{secret}"),
                "out/sub||".into(),
                "out/sub/b.txt|beta|".into(),
            ]
        );
        // A single file; a limit; a path that leaves the workspace.
        let mut one = Vec::new();
        write_tar(&root, "out/a.txt", "a.txt", &mut one, 1 << 20).unwrap();
        assert!(matches!(
            write_tar(&root, "out", "out", Vec::new(), 4),
            Err(ArchiveError::TooLarge(4))
        ));
        // Back in, elsewhere in the workspace, owned as asked; nothing lands outside.
        let owner = nix::unistd::geteuid().as_raw();
        let extract = Extract {
            owner: (owner, owner),
            max_file: 1 << 20,
            limit: 1 << 20,
        };
        std::fs::create_dir(work.join("in")).unwrap();
        let got = extract_tar(&root, "in", &tar[..], extract).unwrap();
        assert_eq!(got, 9);
        assert_eq!(
            std::fs::read_to_string(work.join("in/out/sub/b.txt")).unwrap(),
            "beta"
        );
        assert_eq!(
            std::fs::read_link(work.join("in/out/link")).unwrap(),
            dir.path().join("secret")
        );
        // A planted link on the way is never followed.
        std::os::unix::fs::symlink(dir.path(), work.join("in/escape")).unwrap();
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(1);
        header.set_mode(0o644);
        builder
            .append_data(&mut header, "escape/planted", &b"x"[..])
            .unwrap();
        let planted = builder.into_inner().unwrap();
        assert!(extract_tar(&root, "in", &planted[..], extract).is_err());
        assert!(!dir.path().join("planted").exists());
        for outside in ["../secret", "out/link", "missing"] {
            assert!(
                matches!(
                    write_tar(&root, outside, "x", Vec::new(), 1 << 20),
                    Err(ArchiveError::NotFound(_))
                ),
                "{outside}"
            );
        }
    }

    #[test]
    fn unpacking_into_a_missing_directory_names_that_directory() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        std::fs::write(work.join("plain"), "x").unwrap();
        let root = GrantRoot::open(work.to_str().unwrap()).unwrap();
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_size(2);
        builder
            .append_data(&mut header, "local.txt", &b"hi"[..])
            .unwrap();
        let tar = builder.into_inner().unwrap();
        let extract = Extract {
            owner: (0, 0),
            max_file: 1 << 20,
            limit: 1 << 20,
        };
        for missing in ["missing/x", "plain"] {
            let error = extract_tar(&root, missing, &tar[..], extract).unwrap_err();
            assert!(
                matches!(&error, ArchiveError::NoDirectory(d) if d == missing),
                "{error:?}"
            );
            let shown = error.to_string();
            assert!(shown.contains(&format!("/work/{missing}")), "{shown}");
            assert!(!shown.contains("local.txt"), "{shown}");
        }
        assert!(!work.join("missing").exists());
    }
}
