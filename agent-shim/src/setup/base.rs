//! The sandboxes' base mount namespace: what every sandbox's mount namespace starts as.
//!
//! A sandbox's shim makes its mount namespace with `unshare(CLONE_NEWNS)`, which copies the
//! namespace it is in, and switches to its new root. With the host's namespace as the copy,
//! the host's whole mount tree had to be cut away with `pivot_root`, and `pivot_root` walks
//! every thread on the host (the kernel re-points each one's root and working directory that
//! named the old root): a cost that grew with every live sandbox, about 5 ms a start with
//! 3,000 live. The spawner makes this base once, with one `pivot_root`, and starts each shim
//! in it: the shim copies the base (a few dozen mounts, none of them host data), builds its
//! root beside it and moves that root over the base's own (`MS_MOVE` onto `/`, then
//! `chroot`), which walks nothing.
//!
//! The base stays in each sandbox's namespace beneath the sandbox's root, covered by it: no
//! path leads below a mount stacked on `/` (`..` at a sandbox's root stays there; joining the
//! namespace lands on the topmost mount), the agent can neither unmount nor move anything
//! (the mounts are the host user namespace's, and its filter refuses every mount call and new
//! user namespaces), and `/proc/<pid>/mountinfo` lists only what is beneath a process's root.
//! So the base holds only what sandboxes are built from and already show: the host's system
//! paths, the `/etc` and `/dev` every sandbox shows (bound from here, so a sandbox makes no
//! file system of its own for them), the empty file and directory that mask parts of
//! `/proc`, the host's `/dev/ptmx` with its `/dev/pts` (where an agent's terminal is made),
//! the shim binary, and the empty mount point of the sandboxes' roots. Its own tmpfs is
//! read-only: every sandbox's copy shares it.
//!
//! Each file system a sandbox mounts costs more than its own memory: the kernel gives every
//! superblock a shrinker, and every memory cgroup on the host a slot for each shrinker, grown
//! for all of them at once (measured: a tenth of the host's time with 3,000 live sandboxes
//! went there). A sandbox mounts its root and `/tmp` tmpfs and its `/proc`, and nothing else.

use std::os::fd::OwnedFd;
use std::path::Path;

use nix::fcntl::{open, OFlag};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};
use nix::sys::stat::Mode;
use nix::unistd::{chdir, pivot_root};
use tollgate_shim_protocol::plan::SandboxBase;

use super::error::SetupError;
use super::mounts::{bind, create_dir, inside, mount_fs, receive_only, Restrict};
use super::views::{dev_and_masks_in_base, etc_in_base, show_system_paths};

/// Makes the base mount namespace of `base`'s sandboxes and returns a descriptor of it; the
/// calling process is back in the mount namespace it was in, whether or not this succeeded.
/// Needs real root, and a single-threaded caller (the way back is `setns`, which refuses a
/// process sharing its file-system context).
pub fn make_base(base: &SandboxBase) -> Result<OwnedFd, SetupError> {
    let step = |step: &'static str| move |source| SetupError::Base { step, source };
    let own_namespace = || {
        open(
            // The calling thread's: a test calls this from one thread of many.
            "/proc/thread-self/ns/mnt",
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
    };
    let host = own_namespace().map_err(step("opening this process's mount namespace"))?;
    unshare(CloneFlags::CLONE_NEWNS).map_err(step("a new mount namespace"))?;
    let made = own_namespace()
        .map_err(step("opening the new mount namespace"))
        .and_then(|namespace| fill(base).map(|()| namespace));
    // Back to the host's namespace (its root and working directory with it), even after a
    // failure: the spawner starts `exec` helpers and other programs from there.
    setns(&host, CloneFlags::CLONE_NEWNS)
        .map_err(step("returning to the host's mount namespace"))?;
    made
}

/// Fills the new namespace with the base and makes it the namespace's root.
fn fill(base: &SandboxBase) -> Result<(), SetupError> {
    // Nothing mounted here reaches the host; the host's unmounts still reach the base's
    // binds (a volume unmounted there is not kept busy here).
    receive_only()?;
    // Built on the sandboxes' own mount point, which only this namespace sees covered: it
    // must be empty, or what is beneath it (a binary the base shows, say) would be covered.
    let top = base.root_dir.as_path();
    let occupied = std::fs::read_dir(top)
        .map_err(|e| SetupError::MountPoint {
            path: top.to_owned(),
            source: e,
        })?
        .next()
        .is_some();
    if occupied {
        return Err(SetupError::MountPointNotEmpty(top.to_owned()));
    }
    mount_fs(
        "tollgate-base",
        top,
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        "mode=0755,size=64k",
    )?;
    show_system_paths(top, &base.system_paths)?;
    etc_in_base(top, &base.hostname)?;
    dev_and_masks_in_base(top)?;
    // Where an agent's terminal is made, before the sandbox's root is switched to: the host's
    // devpts, with `/dev/ptmx` a link to its `ptmx` (a bind of the host's `/dev/ptmx` node
    // would not find the devpts beside it: the kernel looks for `pts` next to the node in
    // the node's own file system).
    let pts = Path::new("/dev/pts");
    if pts.is_dir() {
        bind(
            pts,
            &inside(top, pts),
            Restrict {
                read_only: false,
                devices: true,
                no_exec: true,
            },
        )?;
        let ptmx = inside(top, Path::new("/dev/ptmx"));
        std::os::unix::fs::symlink("pts/ptmx", &ptmx)
            .map_err(|source| SetupError::MountPoint { path: ptmx, source })?;
    }
    // Bound at its own path, unless a system path shows it already (an installed shim in
    // `/usr/local/bin`): a bind there would need a mount point made in a read-only bind.
    if let Some(shim) = base
        .shim_binary
        .as_ref()
        .filter(|shim| std::fs::symlink_metadata(inside(top, shim)).is_err())
    {
        bind(
            shim,
            &inside(top, shim),
            Restrict {
                read_only: true,
                devices: false,
                no_exec: false,
            },
        )?;
    }
    create_dir(&inside(top, &base.root_dir))?;
    let switch = |source| SetupError::Base {
        step: "pivot_root into the base",
        source,
    };
    chdir(top).map_err(switch)?;
    pivot_root(".", ".").map_err(switch)?;
    umount2(".", MntFlags::MNT_DETACH).map_err(switch)?;
    chdir("/").map_err(switch)?;
    // Shared by every sandbox's copy: nothing may write to it.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|source| SetupError::Mount {
        what: "read-only remount of the base".into(),
        target: top.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::setup::views::DEVICES;
    use std::collections::BTreeSet;
    use tollgate_shim_protocol::plan::{generated_etc, ETC_FROM_HOST};

    /// The names in `dir` of the calling thread's root.
    fn names(dir: &str) -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect()
    }

    /// An empty directory for a base's mount point (the base covers whatever is beneath it,
    /// inside its own namespace: not the test binary's directory), removed when dropped.
    struct MountPoint(std::path::PathBuf);

    impl MountPoint {
        fn new(test: &str) -> Self {
            let path =
                std::env::temp_dir().join(format!("tollgate-base-{test}-{}", std::process::id()));
            std::fs::create_dir(&path).unwrap();
            Self(path)
        }
    }

    impl Drop for MountPoint {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.0);
        }
    }

    /// What `look` finds with this thread in the base `made`, back in this thread's own mount
    /// namespace afterwards (its file-system context is its own since `make_base` unshared it).
    fn inside_base<T>(made: &OwnedFd, look: impl FnOnce() -> T) -> T {
        let own = open(
            "/proc/thread-self/ns/mnt",
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        setns(made, CloneFlags::CLONE_NEWNS).unwrap();
        let found = look();
        setns(&own, CloneFlags::CLONE_NEWNS).unwrap();
        found
    }

    fn first_component(path: &Path) -> String {
        let first = path.components().nth(1).unwrap();
        first.as_os_str().to_str().unwrap().to_owned()
    }

    /// What every sandbox's namespace keeps beneath its root is only what sandboxes show:
    /// no `/proc`, `/sys`, home or data directory of the host, no `/etc` entry but those
    /// shown (`passwd` the generated one), no device but those a sandbox shows and the
    /// terminal's; and it is read-only. (Root only: it makes a mount
    /// namespace, entered from this test's thread alone.)
    #[test]
    fn the_base_holds_only_what_sandboxes_are_built_from() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let shim = std::env::current_exe().unwrap();
        let mount_point = MountPoint::new("contents");
        let root_dir = mount_point.0.clone();
        let base = SandboxBase {
            hostname: "tollgate".into(),
            root_dir: root_dir.clone(),
            system_paths: ["/usr", "/bin", "/sbin", "/lib", "/lib64"]
                .map(std::path::PathBuf::from)
                .to_vec(),
            shim_binary: Some(shim.clone()),
        };
        let made = make_base(&base).expect("the base is made");
        let (top, etc, dev, sandbox_dev, masks, passwd, terminal, shown, written) =
            inside_base(&made, || {
                (
                    names("/"),
                    names("/etc"),
                    names("/dev"),
                    names("/.tollgate-dev"),
                    names("/.tollgate-masked"),
                    std::fs::read_to_string("/etc/passwd").unwrap(),
                    nix::pty::openpty(None, None).map(drop),
                    std::fs::metadata(&shim).is_ok(),
                    std::fs::write("/written", b"x").map_err(|e| e.raw_os_error()),
                )
            });
        assert!(std::fs::metadata("/proc/self").is_ok(), "back on the host");

        let mut expected: BTreeSet<String> = base
            .system_paths
            .iter()
            .filter(|path| std::fs::symlink_metadata(path).is_ok())
            .map(|path| first_component(path))
            .collect();
        expected.extend(["etc", "dev", ".tollgate-dev", ".tollgate-masked"].map(String::from));
        expected.insert(first_component(&root_dir));
        expected.insert(first_component(&shim));
        assert_eq!(top, expected);
        let generated: BTreeSet<String> = generated_etc("tollgate")
            .iter()
            .map(|(name, _)| (*name).to_owned())
            .collect();
        let from_host: BTreeSet<String> = ETC_FROM_HOST
            .iter()
            .map(|name| first_component(&Path::new("/").join(name)))
            .collect();
        for name in &etc {
            assert!(
                generated.contains(name)
                    || from_host.contains(name)
                    || name.starts_with("python3."),
                "/etc/{name} is in the base"
            );
        }
        assert!(!etc.contains("shadow"));
        assert!(
            passwd.contains(":Tollgate agent:"),
            "the generated passwd: {passwd}"
        );
        assert_eq!(dev, BTreeSet::from(["ptmx".into(), "pts".into()]));
        let mut shown_dev: BTreeSet<String> = DEVICES.iter().map(|d| (*d).to_owned()).collect();
        shown_dev.retain(|device| Path::new("/dev").join(device).exists());
        shown_dev.extend(["fd", "stdin", "stdout", "stderr"].map(String::from));
        assert_eq!(sandbox_dev, shown_dev);
        assert_eq!(masks, BTreeSet::from(["file".into(), "dir".into()]));
        assert!(shown, "the shim binary is in the base");
        assert_eq!(terminal, Ok(()), "a terminal can be made in the base");
        assert_eq!(written, Err(Some(libc::EROFS)));
    }

    /// A mount point that holds something is refused, naming it: the base would cover it.
    #[test]
    fn a_mount_point_that_is_not_empty_is_refused() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let mount_point = MountPoint::new("occupied");
        let inside_it = mount_point.0.join("something");
        std::fs::write(&inside_it, b"").unwrap();
        let base = SandboxBase {
            hostname: "tollgate".into(),
            root_dir: mount_point.0.clone(),
            system_paths: vec!["/usr".into()],
            shim_binary: None,
        };
        let refused = make_base(&base).map(drop).map_err(|e| e.to_string());
        std::fs::remove_file(&inside_it).unwrap();
        let reason = refused.expect_err("refused");
        assert!(
            reason.contains(&mount_point.0.display().to_string()),
            "{reason}"
        );
        assert!(std::fs::metadata("/proc/self").is_ok(), "back on the host");
    }

    /// An installed shim (in a system path, as `/usr/local/bin/tollgate-shim`) is shown by
    /// that path's bind: the base is made all the same.
    #[test]
    fn a_shim_in_a_system_path_is_shown_by_that_path() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let installed = std::path::PathBuf::from("/usr/bin/true");
        let mount_point = MountPoint::new("installed");
        let base = SandboxBase {
            hostname: "tollgate".into(),
            root_dir: mount_point.0.clone(),
            system_paths: vec!["/usr".into()],
            shim_binary: Some(installed.clone()),
        };
        let made = make_base(&base).expect("the base is made");
        let shown = inside_base(&made, || std::fs::metadata(&installed).map(|m| m.len()));
        assert_eq!(
            shown.ok(),
            std::fs::metadata(&installed).ok().map(|m| m.len())
        );
    }
}
