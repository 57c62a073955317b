//! Which host files a pinned grant reaches, by identity (device and inode) rather than by
//! path: the supervisor's W^X check at start. Two grants with different paths can still
//! show the same files — a bind mount of one inside the other, a path through another mount
//! of the same directory, a hard link — and a path comparison sees none of that.

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, Mode};

use crate::beneath::GrantRoot;

/// A file's identity on this host.
pub type Identity = (u64, u64);

/// Most directories walked up from a grant (deeper trees are refused, not trusted).
const MAX_DEPTH: usize = 4096;

/// The identities from the pinned grant up to `/`: the granted file (for a granted file),
/// its directory and every directory above it, through `..` of the pinned descriptors, so
/// the walk sees the tree the grant is in now, not a path.
pub fn ancestry(root: &GrantRoot) -> nix::Result<Vec<Identity>> {
    let mut found = Vec::new();
    if let Some(file) = &root.file {
        let stat = fstat(file)?;
        found.push((stat.st_dev, stat.st_ino));
    }
    let mut at: OwnedFd = root.dir.try_clone().map_err(|_| Errno::EMFILE)?;
    for _ in 0..MAX_DEPTH {
        let stat = fstat(&at)?;
        found.push((stat.st_dev, stat.st_ino));
        let parent = openat(
            &at,
            c"..",
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let above = fstat(&parent)?;
        if (above.st_dev, above.st_ino) == (stat.st_dev, stat.st_ino) {
            return Ok(found);
        }
        at = parent;
    }
    Err(Errno::ELOOP)
}

/// The identities a pinned grant at host path `path` reaches: the grant itself and the root
/// of every mount at or beneath `path` (read from `mountinfo`, this process's mount table):
/// a write grant whose tree holds a bind mount of an executable one reaches its files.
pub fn reach(root: &GrantRoot, path: &str, mountinfo: &str) -> nix::Result<HashSet<Identity>> {
    let mut found = HashSet::new();
    let stat = fstat(root.file.as_ref().unwrap_or(&root.dir))?;
    found.insert((stat.st_dev, stat.st_ino));
    if root.file.is_none() {
        for mount_point in mount_points(mountinfo) {
            if tollgate_receipt::paths::path_within(&mount_point, path) {
                if let Ok(meta) = std::fs::metadata(Path::new(&mount_point)) {
                    use std::os::unix::fs::MetadataExt as _;
                    found.insert((meta.dev(), meta.ino()));
                }
            }
        }
    }
    Ok(found)
}

/// Whether the granted file is a hard link other names share (`st_nlink` above one), and its
/// device: such a file can be reached through a name outside its grant.
pub fn shared_file(root: &GrantRoot) -> nix::Result<Option<u64>> {
    match &root.file {
        Some(file) => {
            let stat = fstat(file)?;
            Ok((stat.st_nlink > 1 && crate::beneath::is_regular(&stat)).then_some(stat.st_dev))
        }
        None => Ok(None),
    }
}

/// The mount points of a `mountinfo` table (its fifth field, `\NNN` escapes decoded).
pub fn mount_points(mountinfo: &str) -> impl Iterator<Item = String> + '_ {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape)
}

/// Decodes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            if let Ok(value) = u8::from_str_radix(&field[i + 1..i + 4], 8) {
                out.push(value);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_decoded() {
        let table = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                     40 22 0:35 / /srv/my\\040data rw - tmpfs tmpfs rw\n";
        let points: Vec<String> = mount_points(table).collect();
        assert_eq!(points, ["/", "/srv/my data"]);
    }

    #[test]
    fn ancestry_climbs_to_the_root_and_reach_sees_the_grant() {
        let dir = tempfile::tempdir().unwrap();
        let inner = dir.path().join("a/b");
        std::fs::create_dir_all(&inner).unwrap();
        let root = GrantRoot::open(inner.to_str().unwrap()).unwrap();
        let up = ancestry(&root).unwrap();
        let outer = GrantRoot::open(dir.path().to_str().unwrap()).unwrap();
        assert!(up.contains(&(outer.dev, outer.ino)));
        assert_eq!(up[0], (root.dev, root.ino));
        let slash = std::fs::metadata("/").unwrap();
        use std::os::unix::fs::MetadataExt as _;
        assert_eq!(up.last(), Some(&(slash.dev(), slash.ino())));
        let reached = reach(&outer, dir.path().to_str().unwrap(), "").unwrap();
        assert!(reached.contains(&(outer.dev, outer.ino)));
        assert!(!reached.contains(&(root.dev, root.ino)));
    }
}
