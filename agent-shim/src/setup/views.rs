//! What the sandbox shows of the host: its system paths (read-only), a generated `/etc`, a
//! minimal `/dev`, and `/proc` with the files that show the host masked.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};
use tollgate_shim_protocol::plan::{generated_etc, generated_passwd, ETC_FROM_HOST};

use super::error::SetupError;
use super::mounts::{bind, create_dir, inside, restrict_recursively, Restrict};

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

/// Where, in the sandboxes' base, the `/dev` every sandbox shows is built (see [`dev_and_masks_in_base`]).
const DEV_IN_BASE: &str = "/.tollgate-dev";
/// Where, in the sandboxes' base, the empty file and directory masks are bound from.
const MASKS_IN_BASE: &str = "/.tollgate-masked";

/// The base's `/etc`, which every sandbox shows as its own (see [`show_etc`]): the files
/// [`generated_etc`] writes (users with the agent, hosts, no name server), and the few host
/// entries programs need to run ([`ETC_FROM_HOST`], those the host has) shown read-only, links
/// recreated as links. `top` is the base's root, read-only once made.
pub(super) fn etc_in_base(top: &Path, hostname: &str) -> Result<(), SetupError> {
    let etc = inside(top, Path::new("/etc"));
    create_dir(&etc)?;
    write_generated_etc(&etc, hostname)?;
    for name in etc_from_host() {
        let host = Path::new("/etc").join(&name);
        show_host_path(&host, &inside(top, &host), true)?;
    }
    Ok(())
}

/// The sandbox's `/etc` under `root`: the base's (see [`etc_in_base`]), bound with every bind
/// inside it, read-only. Bound rather than built: a file system of its own per sandbox would
/// cost the kernel a shrinker for every memory cgroup on the host. The agent's own
/// `/etc/passwd` is bound over the base's by [`finish_etc`].
pub(super) fn show_etc(root: &Path) -> Result<(), SetupError> {
    bind(
        Path::new("/etc"),
        &inside(root, Path::new("/etc")),
        Restrict {
            read_only: true,
            devices: false,
            no_exec: true,
        },
    )
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

/// Writes the agent's `/etc/passwd`, with its home (the plan's `HOME`), into `generated` (the
/// copy of the generated files a run on its own userland takes, in the root's own tmpfs) and
/// binds it, read-only, over the base's `/etc/passwd` in the sandbox's `/etc` under `root`.
pub(super) fn finish_etc(root: &Path, generated: &Path, home: &str) -> Result<(), SetupError> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = generated.join("passwd");
    fs::write(&path, generated_passwd(home))
        .and_then(|()| fs::set_permissions(&path, fs::Permissions::from_mode(0o644)))
        .map_err(|source| SetupError::MountPoint {
            path: path.clone(),
            source,
        })?;
    let target = inside(root, Path::new("/etc/passwd"));
    mount(
        Some(path.as_path()),
        target.as_path(),
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|source| SetupError::Mount {
        what: "the agent's /etc/passwd".into(),
        target: target.clone(),
        source,
    })?;
    restrict_recursively(
        &target,
        Restrict {
            read_only: true,
            devices: false,
            no_exec: true,
        },
    )
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

/// Builds, in the base under `top`, the `/dev` every sandbox shows (see [`minimal_dev`]): the
/// host's [`DEVICES`] bound in and the `fd`/`stdin`/`stdout`/`stderr` links; and the empty file
/// and directory [`mask_host_views`] binds from.
pub(super) fn dev_and_masks_in_base(top: &Path) -> Result<(), SetupError> {
    let dev = inside(top, Path::new(DEV_IN_BASE));
    create_dir(&dev)?;
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
    let masks = inside(top, Path::new(MASKS_IN_BASE));
    create_dir(&masks)?;
    let (empty_file, empty_dir) = (masks.join("file"), masks.join("dir"));
    let made = |path: &Path, result: std::io::Result<()>| {
        result.map_err(|source| SetupError::MountPoint {
            path: path.to_owned(),
            source,
        })
    };
    made(&empty_file, fs::write(&empty_file, b""))?;
    made(&empty_dir, fs::create_dir(&empty_dir))?;
    use std::os::unix::fs::PermissionsExt as _;
    made(
        &empty_file,
        fs::set_permissions(&empty_file, fs::Permissions::from_mode(0o444)),
    )?;
    made(
        &empty_dir,
        fs::set_permissions(&empty_dir, fs::Permissions::from_mode(0o555)),
    )
}

/// A minimal `/dev` under `root`: the base's (see [`dev_and_masks_in_base`]) bound with its
/// device binds, read-only (the devices stay usable).
pub(super) fn minimal_dev(root: &Path) -> Result<(), SetupError> {
    bind(
        Path::new(DEV_IN_BASE),
        &inside(root, Path::new("/dev")),
        Restrict {
            read_only: true,
            devices: true,
            no_exec: true,
        },
    )
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
/// or executed through them. Both are the base's (read-only, `noexec`, `nosuid`, `nodev`, and
/// covered by the sandbox's root once it is switched to).
pub(super) fn mask_host_views(root: &Path) -> Result<(), SetupError> {
    let masks = Path::new(MASKS_IN_BASE);
    let (empty_file, empty_dir) = (masks.join("file"), masks.join("dir"));
    for path in MASKED {
        let target = inside(root, Path::new(path));
        let Ok(meta) = fs::symlink_metadata(&target) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            continue;
        }
        let what = if meta.is_dir() {
            &empty_dir
        } else {
            &empty_file
        };
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
    Ok(())
}
