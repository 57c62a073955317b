//! Pinning a child's grants beneath its parent's, never through a link.

use nix::errno::Errno;
use tollgate_proto::v1 as pb;
use tollgate_receipt::paths::path_within;

use tollgate_files::beneath::GrantRoot;

use crate::gateway::fs::FsGrant;

/// Pins a child's grants beneath the parent's: each resolved from the parent's outermost
/// covering pinned grant without following any link, never by path. A mounted child grant
/// beneath (not at) a parent's writable grant is refused: the parent's agent could move what
/// is under it between the parent's start and this one (the mount itself is cloned from the
/// descriptor pinned here).
pub fn pin_child_grants(
    parent: &[std::sync::Arc<FsGrant>],
    child: &pb::Receipt,
) -> Result<Vec<FsGrant>, (&'static str, String)> {
    let mut pinned = Vec::with_capacity(child.fs.len());
    for (i, grant) in child.fs.iter().enumerate() {
        let covering = || parent.iter().filter(|p| path_within(&grant.path, &p.path));
        if !grant.mount.is_empty() {
            if let Some(writable) = covering().find(|p| p.writable && p.path != grant.path) {
                return Err((
                    "grant_escapes",
                    format!(
                        "fs[{i}].mount: a mounted grant beneath the parent's writable grant {} must be that grant itself, or gateway-only (no mount)",
                        writable.path
                    ),
                ));
            }
        }
        // Resolved from a grant that itself gives the access asked for.
        let writable = grant.access == pb::FsAccess::Write as i32;
        let outer = covering()
            .filter(|p| p.root.is_ok() && (p.writable || !writable))
            .min_by_key(|p| p.path.len())
            .ok_or_else(|| {
                (
                    "grant_escapes",
                    format!("fs[{i}] = {}: no pinned parent grant covers it", grant.path),
                )
            })?;
        let rest = grant
            .path
            .strip_prefix(&outer.path)
            .unwrap_or_default()
            .trim_start_matches('/');
        let root = match &outer.root {
            Ok(root) => GrantRoot::from_beneath(root, rest),
            Err(errno) => Err(*errno),
        };
        let escapes =
            |why: &str| Err(("grant_escapes", format!("fs[{i}] = {}: {why}", grant.path)));
        match root {
            Err(Errno::ELOOP) => {
                return escapes("a symbolic link is on the path (child grants never follow links)")
            }
            Err(Errno::EXDEV) => return escapes("the path leaves the parent's grant"),
            Err(Errno::ENOTDIR) => return escapes(
                "a component of the path is not a directory (nothing lies beneath a granted file)",
            ),
            // Refused before the child's receipt is spent, as a root run's would be.
            Err(errno) if !grant.mount.is_empty() => {
                return Err((
                    "grant_missing",
                    format!(
                        "fs[{i}] = {}: the mounted grant cannot be opened ({errno})",
                        grant.path
                    ),
                ))
            }
            root => pinned.push(FsGrant {
                path: grant.path.clone(),
                writable,
                ask: grant.ask,
                ask_reads: grant.ask_reads,
                origin: crate::gateway::fs::GrantOrigin::Receipt,
                root,
            }),
        }
    }
    Ok(pinned)
}
