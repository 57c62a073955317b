//! What may run where the agent writes, and the agent's own home: the rules for a receipt's
//! `exec` list (files and directories) and its `home`, applied by the authority before it
//! signs and by every supervisor again. Re-exported from [`crate::paths`].

use tollgate_proto::v1 as pb;

use crate::paths::{is_normal_absolute, path_within, SYSTEM_PATHS};

/// Why a receipt's `exec` list cannot be signed or honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecListError {
    /// Not an absolute, normalised path (a directory entry ends in one `/`), or `/` alone.
    #[error("{entry:?} must be the absolute, normalised path of an executable, or of a directory ending in \"/\" (not / itself)")]
    Shape {
        /// The entry's index.
        index: usize,
        /// The entry.
        entry: String,
    },
    /// An entry lies beneath a WRITE mount that is not executable: the agent could replace
    /// the program, and the noexec mount would stop it running anyway.
    #[error("a writable mount at {mount:?} would let the agent replace exec[{index}] {entry:?}: say exec = true on that grant if the agent may run what it writes there (W^X lifted for it alone), or mount it read-only")]
    UnderWriteMount {
        /// The entry's index.
        index: usize,
        /// The entry.
        entry: String,
        /// The write grant's mount.
        mount: String,
    },
}

impl ExecListError {
    /// The request field at fault: `exec[i]` or `fs[i].mount`.
    pub fn field(&self) -> String {
        match self {
            Self::Shape { index, .. } | Self::UnderWriteMount { index, .. } => {
                format!("exec[{index}]")
            }
        }
    }
}

/// The rule for a receipt's `exec` list, applied by the authority before it signs and by
/// every supervisor again: each entry an absolute, normalised path, or a directory ending in
/// `/` (not `/` itself); none at or beneath a WRITE mount unless that grant says
/// `exec = true`: a program the agent can rewrite runs only where the receipt says so
/// explicitly.
pub fn check_exec_list(exec: &[String], fs: &[pb::FsGrant]) -> Result<(), ExecListError> {
    for (index, entry) in exec.iter().enumerate() {
        let (path, _) = tollgate_proto::exec_entry(entry);
        if path == "/" || !is_normal_absolute(path) || entry.ends_with("//") {
            return Err(ExecListError::Shape {
                index,
                entry: entry.clone(),
            });
        }
        if let Some(write) = fs.iter().find(|g| {
            g.access == pb::FsAccess::Write as i32
                && !g.mount.is_empty()
                && !g.exec
                && path_within(path, &g.mount)
        }) {
            return Err(ExecListError::UnderWriteMount {
                index,
                entry: entry.clone(),
                mount: write.mount.clone(),
            });
        }
    }
    Ok(())
}

/// Where a home is mounted when `[home]` does not say.
pub const DEFAULT_HOME_MOUNT: &str = "/home/agent";

/// Why a receipt's `home` cannot be signed or honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HomeError {
    /// No WRITE grant of `fs` is mounted at the home.
    #[error("home {home:?} is not the mount of a write grant in fs")]
    NoGrant {
        /// The receipt's `home`.
        home: String,
    },
    /// The home's host directory is one the agent must never own.
    #[error("home {path:?} {why}: a home is a directory of the agent's own, kept across runs; make one, e.g. /srv/agents/NAME/home")]
    Refused {
        /// The home grant's host path.
        path: String,
        /// Why, in a few words.
        why: String,
    },
}

/// The rule for a receipt's `home`, applied by the authority before it signs and by every
/// supervisor again: the mount of exactly one WRITE grant; its host path neither `/`, nor a
/// system path or anything above or beneath one, nor `/home` or `/root` themselves, nor —
/// where the caller knows it (`user_home`, the operator's own `$HOME`, checked where the spec
/// is read) — the operator's home or one of its ancestors.
pub fn check_home(
    home: &str,
    fs: &[pb::FsGrant],
    user_home: Option<&str>,
) -> Result<(), HomeError> {
    if home.is_empty() {
        return Ok(());
    }
    let Some(grant) = fs
        .iter()
        .find(|g| g.mount == home && g.access == pb::FsAccess::Write as i32)
    else {
        return Err(HomeError::NoGrant { home: home.into() });
    };
    let path = grant.path.as_str();
    let refused = |why: String| {
        Err(HomeError::Refused {
            path: path.into(),
            why,
        })
    };
    if path == "/" || matches!(path, "/home" | "/root") {
        return refused("is not a home of its own".into());
    }
    if let Some(system) = SYSTEM_PATHS
        .iter()
        .find(|s| path_within(path, s) || path_within(s, path))
    {
        return refused(format!("reaches the system path {system}"));
    }
    if let Some(user_home) = user_home.filter(|h| is_normal_absolute(h) && *h != "/") {
        if path_within(user_home, path) {
            return refused(format!("is (or holds) your own home {user_home}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::{check_gateway_exec, executable_in_sandbox};

    fn grant(path: &str, mount: &str) -> pb::FsGrant {
        pb::FsGrant {
            path: path.into(),
            access: pb::FsAccess::Read as i32,
            mount: mount.into(),
            exec: false,
            ask: false,
            ask_reads: false,
        }
    }

    #[test]
    fn exec_entries_are_files_or_directories_and_run_from_a_writable_mount_only_when_it_says_exec()
    {
        let allowed = ["/usr/bin/".to_owned(), "/opt/tool".to_owned()];
        for (program, ok) in [
            ("/usr/bin/ls", true),
            ("/usr/bin/sub/x", true),
            ("/usr/bin", false),
            ("/usr/binx", false),
            ("/opt/tool", true),
            ("/opt/tool/x", false),
        ] {
            assert_eq!(
                tollgate_proto::exec_allows(&allowed, program),
                ok,
                "{program}"
            );
        }
        assert_eq!(check_exec_list(&allowed, &[]), Ok(()));
        for bad in ["/", "usr/bin/", "/usr//", "/usr/../bin/", "/a/./b"] {
            let error = check_exec_list(&[bad.to_owned()], &[]).unwrap_err();
            assert_eq!(error.field(), "exec[0]", "{bad}");
        }
        // A directory entry above a read mount makes it executable.
        assert!(grant("/srv/tools", "/opt/tools").is_executable(&["/opt/".to_owned()]));
        let mut proj = pb::FsGrant {
            access: pb::FsAccess::Write as i32,
            ..grant("/srv/proj", "/proj")
        };
        let built = ["/proj/hello".to_owned()];
        let error = check_exec_list(&built, std::slice::from_ref(&proj)).unwrap_err();
        assert!(error.to_string().contains("exec = true"), "{error}");
        proj.exec = true;
        assert_eq!(check_exec_list(&built, std::slice::from_ref(&proj)), Ok(()));
        assert!(executable_in_sandbox(
            "/proj/hello",
            std::slice::from_ref(&proj),
            &[]
        ));
        // The gateway never runs what the agent can rewrite.
        let gateway = [pb::GatewayExecGrant {
            program: "/proj/hello".into(),
            ask: false,
        }];
        let error = check_gateway_exec(&gateway, std::slice::from_ref(&proj), &[]).unwrap_err();
        assert!(error.to_string().contains("writable mount"), "{error}");
    }

    #[test]
    fn a_home_is_a_write_grant_of_its_own_never_the_operators() {
        let home = |path: &str| pb::FsGrant {
            access: pb::FsAccess::Write as i32,
            ..grant(path, DEFAULT_HOME_MOUNT)
        };
        assert_eq!(check_home("", &[], None), Ok(()));
        assert_eq!(
            check_home(
                DEFAULT_HOME_MOUNT,
                &[home("/srv/agents/a")],
                Some("/home/me")
            ),
            Ok(())
        );
        assert_eq!(
            check_home(
                DEFAULT_HOME_MOUNT,
                &[home("/home/me/.agents/a")],
                Some("/home/me")
            ),
            Ok(()),
            "a directory beneath the operator's home is the agent's own"
        );
        assert!(matches!(
            check_home(
                DEFAULT_HOME_MOUNT,
                &[grant("/srv/a", DEFAULT_HOME_MOUNT)],
                None
            ),
            Err(HomeError::NoGrant { .. })
        ));
        for (path, why) in [
            ("/home/me", "your own home"),
            ("/home", "not a home"),
            ("/", "not a home"),
            ("/root", "not a home"),
            ("/usr/local", "system path"),
            ("/etc/agent", "system path"),
        ] {
            let error = check_home(DEFAULT_HOME_MOUNT, &[home(path)], Some("/home/me"))
                .unwrap_err()
                .to_string();
            assert!(error.contains(why), "{path}: {error}");
        }
    }
}
