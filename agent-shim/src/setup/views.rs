//! What the sandbox shows of the host: its system paths (read-only), a generated `/etc`, a
//! minimal `/dev`, and `/proc` with the files that show the host masked.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use tollgate_shim_protocol::plan::{generated_etc, generated_passwd, ETC_FROM_HOST};

use super::error::SetupError;
use super::mounts::{bind, create_dir, inside, mount_fs, restrict_recursively, Restrict};

/// Device nodes bound from the host into the sandbox's `/dev`.
pub(super) const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// Shows each host system path at the same place under `root`, read-only; a symlink (as on
/// merged-/usr systems) is recreated as a symlink. A system path this host lacks (no /lib64
/// on some systems) is simply absent.
pub(super) fn show_system_paths(root: &Path, system_paths: &[PathBuf]) -> Result<(), SetupError> {
    for path in system_paths {
        show_host_path(path, &inside(root, path), false)?;
    }
    Ok(())
}

/// Shows the host's `host` at `target`, read-only (and `noexec` when asked): a link is
/// recreated as a link, anything else bound. Nothing when the host has no such path.
pub(super) fn show_host_path(host: &Path, target: &Path, no_exec: bool) -> Result<(), SetupError> {
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
/// recreated as links. It is made read-only by [`finish_etc`], once the plan is known.
pub(super) fn generate_etc(root: &Path, hostname: &str) -> Result<(), SetupError> {
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
    for name in etc_from_host() {
        show_host_path(&Path::new("/etc").join(&name), &etc.join(&name), true)?;
    }
    // Made read-only by `finish_etc` once the plan names the agent's home.
    Ok(())
}

/// The entries of `/etc` a sandbox shows from the host: [`ETC_FROM_HOST`] and every
/// `/etc/python3.X` (Debian's Python reads its site customisation from there). Whether the
/// host has each is decided where it is shown.
pub(super) fn etc_from_host() -> Vec<String> {
    let pythons = fs::read_dir("/etc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            name.starts_with("python3.").then_some(name)
        });
    ETC_FROM_HOST
        .iter()
        .map(|name| (*name).to_owned())
        .chain(pythons)
        .collect()
}

/// Writes the agent's home (the plan's `HOME`) into the generated `/etc/passwd` under `root`
/// and into the copy a run on its own userland takes (`generated`), then makes the generated
/// `/etc` read-only (the binds inside keep their own flags).
pub(super) fn finish_etc(root: &Path, generated: &Path, home: &str) -> Result<(), SetupError> {
    use std::os::unix::fs::PermissionsExt as _;
    let etc = inside(root, Path::new("/etc"));
    let passwd = generated_passwd(home);
    for dir in [&etc, generated] {
        let path = dir.join("passwd");
        fs::write(&path, &passwd)
            .and_then(|()| fs::set_permissions(&path, fs::Permissions::from_mode(0o644)))
            .map_err(|source| SetupError::MountPoint { path, source })?;
    }
    remount_tmpfs_read_only(&etc, "the generated /etc")
}

/// Remounts the tmpfs at `target` read-only (and nosuid, nodev, noexec); `what` names it in
/// the error.
pub(super) fn remount_tmpfs_read_only(target: &Path, what: &str) -> Result<(), SetupError> {
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
pub(super) fn write_generated_etc(dir: &Path, hostname: &str) -> Result<(), SetupError> {
    use std::os::unix::fs::PermissionsExt as _;
    for (name, content) in generated_etc(hostname) {
        let path = dir.join(name);
        fs::write(&path, content)
            .and_then(|()| fs::set_permissions(&path, fs::Permissions::from_mode(0o644)))
            .map_err(|source| SetupError::MountPoint { path, source })?;
    }
    Ok(())
}

/// A minimal `/dev` under `root`: a small tmpfs with the host's [`DEVICES`] bound in and
/// the `fd`/`stdin`/`stdout`/`stderr` links, then made read-only.
pub(super) fn minimal_dev(root: &Path) -> Result<(), SetupError> {
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

/// Files and directories that show the host rather than the sandbox, masked (where this
/// kernel has them) as container runtimes mask them: the host's kernel command line, kernel
/// memory, keys, timers and scheduler state, interrupt counts, and the host's ACPI, sound
/// and SCSI devices and firmware tables. `/sys` is listed for a sandbox that would show it;
/// none does today.
pub(super) const MASKED: [&str; 13] = [
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
pub(super) fn mask_host_views(root: &Path) -> Result<(), SetupError> {
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
