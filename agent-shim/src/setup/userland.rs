//! A run on a userland of its own: its system paths and `/etc` in place of the host's.

use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::symlink;
use std::path::Path;

use nix::mount::{umount2, MntFlags, MsFlags};
use nix::unistd::chdir;
use tollgate_proto::SYSTEM_PATHS;

use super::error::SetupError;
use super::mounts::{attach, bind, inside, mount_fs, Restrict};

/// Where the prepared root keeps, hidden, what a run on its own userland needs: the generated
/// `/etc` files (an overlay's lower layer) and that userland itself, attached. Outside every
/// Landlock rule, so the agent cannot read them there (it reads them at their places).
pub(super) const USERLAND_STAGING: &str = "/.tollgate-userland";

/// Puts the root file system the run chose (`userland`, a detached copy of the supervisor's
/// pinned descriptor of it) in place of the host's system paths in the prepared `root`: it is
/// attached, hidden, at [`USERLAND_STAGING`]`/root`; each of [`SYSTEM_PATHS`] it has is bound
/// from there over the host's (read-only, nosuid, nodev, executable; links recreated as
/// links), and `/etc` becomes a read-only, `noexec` overlay of the generated users, hosts and
/// resolver files over the userland's own, mounted over the generated `/etc`. Mounting over
/// rather than unmounting keeps the start free of unmounts (each waits for an RCU grace
/// period); what is covered stays covered (the mounts are the host user namespace's: the
/// agent cannot unmount them), and the staging paths are outside every Landlock rule.
pub(super) fn switch_userland(
    root: &Path,
    source: &Path,
    userland: &OwnedFd,
) -> Result<(), SetupError> {
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
