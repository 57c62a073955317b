//! Path rules shared by everyone who checks grants: the authority (against ceilings) and the
//! supervisor (again, before it mounts anything).

use tollgate_proto::v1 as pb;

/// Sandbox paths a grant may not be mounted at or beneath: the sandbox builds them itself.
pub const RESERVED_MOUNTS: [&str; 6] = ["/proc", "/dev", "/sys", "/tmp", "/work", "/run"];

/// Host directories every sandbox shows read-only at the same path (those the host has). No
/// grant may be mounted at or beneath one: the shim would follow host symlinks there as root.
/// The supervisor binds exactly this list, so what it shows and what a receipt may not cover
/// cannot drift apart.
pub const SYSTEM_PATHS: [&str; 8] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];

/// Why a receipt's mounted grants cannot be mounted: the one rule the authority applies
/// before it signs and every supervisor applies again before it mounts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MountError {
    /// A mounted grant's host path is `/` or not absolute and normalised.
    #[error("host path {path:?} must be absolute, normalised and not / to be mounted")]
    BadSource {
        /// The grant's index in the receipt's `fs`.
        index: usize,
        /// The host path.
        path: String,
    },
    /// The mount target is `/` or not absolute and normalised.
    #[error("mount {mount:?} must be absolute, normalised and not /")]
    BadTarget {
        /// The grant's index.
        index: usize,
        /// The mount target.
        mount: String,
    },
    /// The mount target is at or beneath a path the sandbox builds or shows itself.
    #[error("mount {mount:?} is at or beneath {reserved}, which every sandbox provides itself (reserved: {})", reserved_list())]
    Reserved {
        /// The grant's index.
        index: usize,
        /// The mount target.
        mount: String,
        /// The reserved or system path it lies within.
        reserved: &'static str,
    },
    /// Two mount targets overlap (one at or beneath the other).
    #[error("mount {mount:?} overlaps fs[{other}].mount {other_mount:?}")]
    Overlaps {
        /// The grant's index.
        index: usize,
        /// The mount target.
        mount: String,
        /// The other grant's index.
        other: usize,
        /// The other grant's mount target.
        other_mount: String,
    },
}

impl MountError {
    /// The index in `fs` of the grant at fault.
    pub fn index(&self) -> usize {
        match self {
            Self::BadSource { index, .. }
            | Self::BadTarget { index, .. }
            | Self::Reserved { index, .. }
            | Self::Overlaps { index, .. } => *index,
        }
    }

    /// The request field at fault: `fs[i].path` or `fs[i].mount`.
    pub fn field(&self) -> String {
        match self {
            Self::BadSource { index, .. } => format!("fs[{index}].path"),
            _ => format!("fs[{}].mount", self.index()),
        }
    }
}

fn reserved_list() -> String {
    RESERVED_MOUNTS
        .iter()
        .chain(SYSTEM_PATHS.iter())
        .copied()
        .collect::<Vec<_>>()
        .join(", ")
}

/// The reserved or system path `mount` lies at or beneath, if any.
pub fn reserved_mount(mount: &str) -> Option<&'static str> {
    RESERVED_MOUNTS
        .iter()
        .chain(SYSTEM_PATHS.iter())
        .copied()
        .find(|reserved| path_within(mount, reserved))
}

/// Checks every mounted grant of `fs` (those with a `mount`): host path and target absolute,
/// normalised and not `/`; the target not at or beneath [`RESERVED_MOUNTS`] or
/// [`SYSTEM_PATHS`]; no two targets overlapping. Grants without a mount are not looked at.
pub fn check_mounts(fs: &[pb::FsGrant]) -> Result<(), MountError> {
    let mounted = || fs.iter().enumerate().filter(|(_, g)| !g.mount.is_empty());
    let normal = |path: &str| path != "/" && is_normal_absolute(path);
    for (index, grant) in mounted() {
        if !normal(&grant.path) {
            return Err(MountError::BadSource {
                index,
                path: grant.path.clone(),
            });
        }
        if !normal(&grant.mount) {
            return Err(MountError::BadTarget {
                index,
                mount: grant.mount.clone(),
            });
        }
        if let Some(reserved) = reserved_mount(&grant.mount) {
            return Err(MountError::Reserved {
                index,
                mount: grant.mount.clone(),
                reserved,
            });
        }
        if let Some((other, o)) = mounted().find(|(j, o)| {
            *j != index
                && (path_within(&grant.mount, &o.mount) || path_within(&o.mount, &grant.mount))
        }) {
            return Err(MountError::Overlaps {
                index,
                mount: grant.mount.clone(),
                other,
                other_mount: o.mount.clone(),
            });
        }
    }
    Ok(())
}

/// Whether `path` is absolute and normalised: no empty, `.` or `..` components, no trailing
/// slash (except the root itself), no NUL or other control character (a path is quoted in
/// one-line refusals and logs, where a newline could forge a second line).
pub fn is_normal_absolute(path: &str) -> bool {
    if path == "/" {
        return true;
    }
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    !path.chars().any(char::is_control)
        && rest
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

/// Whether a program at `path` (a path inside the sandbox) can be started as a run's agent:
/// only the system paths are mounted executable in a sandbox; grants, the workspace and the
/// tmpfs are `noexec`. A receipt pinning anything else could never start, so the authority
/// refuses to sign it and the supervisor refuses such an argv before spending the receipt.
pub fn executable_in_sandbox(path: &str) -> bool {
    is_normal_absolute(path)
        && SYSTEM_PATHS
            .iter()
            .any(|system| path != *system && path_within(path, system))
}

/// Whether `path` equals or lies beneath `prefix` (both normalised), by whole components:
/// `/home/me` does not cover `/home/meow`. `/` covers everything.
pub fn path_within(path: &str, prefix: &str) -> bool {
    prefix == "/"
        || path == prefix
        || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_programs_on_the_system_paths_can_be_an_agent() {
        for good in ["/usr/bin/python3", "/bin/sh", "/usr/local/bin/agent"] {
            assert!(executable_in_sandbox(good), "{good}");
        }
        for bad in [
            "/work/agent.py",
            "/opt/agent/hello",
            "/usr",
            "/tmp/x",
            "/usrx/bin/sh",
            "bin/sh",
        ] {
            assert!(!executable_in_sandbox(bad), "{bad}");
        }
    }

    #[test]
    fn paths_must_be_normalised() {
        for good in ["/", "/a", "/a/b.c", "/a/..b"] {
            assert!(is_normal_absolute(good), "{good}");
        }
        for bad in [
            "",
            "a",
            "/a/",
            "/a//b",
            "/a/./b",
            "/a/../b",
            "/..",
            "/a\0",
            "/a\nfake: line",
            "/a\rb",
        ] {
            assert!(!is_normal_absolute(bad), "{bad:?}");
        }
    }

    fn grant(path: &str, mount: &str) -> pb::FsGrant {
        pb::FsGrant {
            path: path.into(),
            access: pb::FsAccess::Read as i32,
            mount: mount.into(),
        }
    }

    #[test]
    fn mounts_under_system_and_reserved_paths_are_refused() {
        for target in [
            "/etc",
            "/etc/ssl",
            "/usr",
            "/usr/local/bin",
            "/bin",
            "/sbin/x",
            "/lib",
            "/lib32",
            "/lib64/x",
            "/libx32",
            "/proc",
            "/dev/x",
            "/sys",
            "/tmp",
            "/work/sub",
            "/run/tollgate",
        ] {
            let error = check_mounts(&[grant("/srv", target)]).unwrap_err();
            assert!(
                matches!(error, MountError::Reserved { index: 0, .. }),
                "{target}: {error}"
            );
            assert_eq!(error.field(), "fs[0].mount");
            let message = error.to_string();
            assert!(!message.contains('\n'), "one line: {message}");
        }
        // Whole components only: these are neither system nor reserved paths.
        for target in ["/etcetera", "/usrdata", "/library", "/binaries", "/data"] {
            assert_eq!(check_mounts(&[grant("/srv", target)]), Ok(()), "{target}");
        }
    }

    #[test]
    fn mount_shapes_and_overlaps_are_refused() {
        let index = |fs: &[pb::FsGrant]| check_mounts(fs).map_err(|e| (e.index(), e));
        assert!(matches!(
            index(&[grant("/srv", "/")]),
            Err((0, MountError::BadTarget { .. }))
        ));
        assert!(matches!(
            index(&[grant("/srv", "/a"), grant("/", "/b")]),
            Err((1, MountError::BadSource { .. }))
        ));
        assert!(matches!(
            index(&[grant("/srv", "/a/../etc")]),
            Err((0, MountError::BadTarget { .. }))
        ));
        assert!(matches!(
            index(&[grant("/srv/a", "/data"), grant("/srv/b", "/data/b")]),
            Err((0, MountError::Overlaps { other: 1, .. }))
        ));
        // Gateway-only grants are not mounts: "/" is a fine gateway grant.
        let gateway_only = grant("/", "");
        assert_eq!(
            check_mounts(&[
                gateway_only,
                grant("/srv/a", "/data"),
                grant("/srv/b", "/db")
            ]),
            Ok(())
        );
    }

    #[test]
    fn prefix_match_respects_component_boundaries() {
        assert!(path_within("/home/me", "/home/me"));
        assert!(path_within("/home/me/x", "/home/me"));
        assert!(!path_within("/home/meow", "/home/me"));
        assert!(path_within("/etc", "/"));
    }
}
