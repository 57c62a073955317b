//! Path rules shared by everyone who checks grants: the authority (against ceilings) and the
//! supervisor (again, before it mounts anything).

use tollgate_proto::v1 as pb;

/// Sandbox paths a grant may not be mounted at or beneath: the sandbox builds them itself.
pub const RESERVED_MOUNTS: [&str; 6] = ["/proc", "/dev", "/sys", "/tmp", "/work", "/run"];

pub use tollgate_proto::SYSTEM_PATHS;

pub use crate::runnable::{
    check_exec_list, check_home, ExecListError, HomeError, DEFAULT_HOME_MOUNT,
};

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
    /// A grant that asks for approval is mounted: the kernel reaches its files, and the
    /// kernel cannot ask.
    #[error("a grant that asks ({}) cannot be mounted: the kernel reaches a mounted grant's files and cannot ask; drop `mount` (the gateway's file tools then reach it) or `{}`", if *.reads { "ask_reads = true" } else { "ask = true" }, if *.reads { "ask_reads" } else { "ask" })]
    AskMounted {
        /// The grant's index.
        index: usize,
        /// Whether it is `ask_reads` (not `ask`) that asks.
        reads: bool,
    },
    /// A grant that asks reaches the same host files as a WRITE mount, through which the
    /// agent would change them without asking.
    #[error("fs[{index}] asks for approval but fs[{other}] mounts {other_path:?} writable over the same files, where the agent changes them without asking")]
    AskUnderWriteMount {
        /// The asking grant's index.
        index: usize,
        /// The mounted grant's index.
        other: usize,
        /// The mounted grant's host path.
        other_path: String,
    },
    /// A grant that asks before reads reaches the same host files as a mount, through which
    /// the agent would read them without asking.
    #[error("fs[{index}] asks before reads but fs[{other}] mounts {other_path:?} over the same files, where the agent reads them without asking")]
    AskReadsUnderMount {
        /// The asking grant's index.
        index: usize,
        /// The mounted grant's index.
        other: usize,
        /// The mounted grant's host path.
        other_path: String,
    },
    /// A grant that asks before reads reaches a system path, which every sandbox without a
    /// root file system of its own shows from the host.
    #[error("fs[{index}] asks before reads, but the sandbox shows {system} from the host, where the agent reads it without asking")]
    AskReadsSystem {
        /// The grant's index.
        index: usize,
        /// The system path.
        system: &'static str,
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
            | Self::Overlaps { index, .. }
            | Self::AskMounted { index, .. }
            | Self::AskUnderWriteMount { index, .. }
            | Self::AskReadsUnderMount { index, .. }
            | Self::AskReadsSystem { index, .. } => *index,
        }
    }

    /// The request field at fault: `fs[i].path`, `fs[i].mount` or `fs[i].ask`.
    pub fn field(&self) -> String {
        match self {
            Self::BadSource { index, .. } => format!("fs[{index}].path"),
            Self::AskMounted { index, reads: true } => format!("fs[{index}].ask_reads"),
            Self::AskMounted { index, .. } | Self::AskUnderWriteMount { index, .. } => {
                format!("fs[{index}].ask")
            }
            Self::AskReadsUnderMount { index, .. } | Self::AskReadsSystem { index, .. } => {
                format!("fs[{index}].ask_reads")
            }
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
/// [`SYSTEM_PATHS`]; no two targets overlapping. A grant that asks for approval is not mounted
/// and shares no host files with a WRITE mount (the kernel cannot ask). Grants without a mount
/// are otherwise not looked at.
pub fn check_mounts(fs: &[pb::FsGrant]) -> Result<(), MountError> {
    let mounted = || fs.iter().enumerate().filter(|(_, g)| !g.mount.is_empty());
    let normal = |path: &str| path != "/" && is_normal_absolute(path);
    let reaches = |a: &pb::FsGrant, b: &pb::FsGrant| {
        path_within(&a.path, &b.path) || path_within(&b.path, &a.path)
    };
    for (index, grant) in fs.iter().enumerate().filter(|(_, g)| g.ask || g.ask_reads) {
        if !grant.mount.is_empty() {
            return Err(MountError::AskMounted {
                index,
                reads: !grant.ask,
            });
        }
        if grant.ask_reads {
            // The sandbox shows the host's system paths (without a root file system of its
            // own): the agent reads them without asking.
            if let Some(system) = SYSTEM_PATHS
                .iter()
                .find(|s| path_within(&grant.path, s) || path_within(s, &grant.path))
            {
                return Err(MountError::AskReadsSystem { index, system });
            }
            if let Some((other, o)) = mounted().find(|(_, o)| reaches(grant, o)) {
                return Err(MountError::AskReadsUnderMount {
                    index,
                    other,
                    other_path: o.path.clone(),
                });
            }
        }
        if let Some((other, o)) =
            mounted().find(|(_, o)| o.access == pb::FsAccess::Write as i32 && reaches(grant, o))
        {
            return Err(MountError::AskUnderWriteMount {
                index,
                other,
                other_path: o.path.clone(),
            });
        }
    }
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

/// The asking entry of `entries` (a ceiling's, or a parent receipt's grants) that makes
/// `grant` ask for approval too, if one does: an asking entry beneath `grant` (its files
/// would be changed without asking), or the most specific entry covering `grant` with enough
/// access, when that one asks. A grant that asks itself is never held back.
pub fn ask_required<'a>(
    grant: &pb::FsGrant,
    entries: &'a [pb::FsGrant],
) -> Option<&'a pb::FsGrant> {
    required(grant, entries, |g| g.ask, true)
}

/// [`ask_required`] for reads: the entry of `entries` asking before reads that makes `grant`
/// ask before reads too, if one does (an entry beneath `grant`, or the most specific entry
/// covering it, whatever its access: every grant reads).
pub fn ask_reads_required<'a>(
    grant: &pb::FsGrant,
    entries: &'a [pb::FsGrant],
) -> Option<&'a pb::FsGrant> {
    required(grant, entries, |g| g.ask_reads, false)
}

/// The entry of `entries` whose `asks` makes `grant` ask too: one beneath it, or the most
/// specific one covering it (with enough access, when `by_access`: for changes, only a
/// grant that could make them decides).
fn required<'a>(
    grant: &pb::FsGrant,
    entries: &'a [pb::FsGrant],
    asks: impl Fn(&pb::FsGrant) -> bool,
    by_access: bool,
) -> Option<&'a pb::FsGrant> {
    if asks(grant) {
        return None;
    }
    if let Some(nested) = entries
        .iter()
        .find(|e| asks(e) && e.path != grant.path && path_within(&e.path, &grant.path))
    {
        return Some(nested);
    }
    entries
        .iter()
        .filter(|e| path_within(&grant.path, &e.path) && (!by_access || e.access >= grant.access))
        .max_by_key(|e| (e.path.len(), asks(e)))
        .filter(|e| asks(e))
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
/// only the system paths and executable grants (`FsGrant::is_executable`) are mounted
/// executable in a sandbox; other grants, the workspace and the tmpfs are `noexec`. A receipt
/// pinning anything else could never start, so the authority refuses to sign it and the
/// supervisor refuses such an argv before spending the receipt.
pub fn executable_in_sandbox(path: &str, fs: &[pb::FsGrant], exec: &[String]) -> bool {
    is_normal_absolute(path)
        && (SYSTEM_PATHS
            .iter()
            .any(|system| path != *system && path_within(path, system))
            || fs
                .iter()
                .any(|grant| grant.is_executable(exec) && path_within(path, &grant.mount)))
}

/// Why a receipt's gateway-only exec grant (`gateway_exec[index]`) cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct GatewayExecError {
    /// The grant's index in `gateway_exec`.
    pub index: usize,
    /// Why, in one line.
    pub reason: String,
}

impl GatewayExecError {
    /// The request field at fault: `gateway_exec[i].program`.
    pub fn field(&self) -> String {
        format!("gateway_exec[{}].program", self.index)
    }
}

/// The rule for gateway-only exec grants, applied by the authority before it signs and by
/// every supervisor again: each program an absolute, normalised path that can run in the
/// sandbox (see [`executable_in_sandbox`]: W^X holds for it as for `exec`), listed once, and
/// never also in `exec` (the agent could then run it without the gateway).
pub fn check_gateway_exec(
    grants: &[pb::GatewayExecGrant],
    fs: &[pb::FsGrant],
    exec: &[String],
) -> Result<(), GatewayExecError> {
    for (index, grant) in grants.iter().enumerate() {
        let program = &grant.program;
        let reason = if program == "/" || !is_normal_absolute(program) {
            format!("{program:?} must be the absolute, normalised path of an executable")
        } else if exec.contains(program) {
            format!("{program} is also in exec, where the agent runs it without the gateway: list it in one of the two")
        } else if grants[..index].iter().any(|g| g.program == *program) {
            format!("{program} is listed twice")
        } else if !executable_in_sandbox(program, fs, exec) {
            format!(
                "{program} cannot run in a sandbox: only programs under {} or beneath an executable read grant's mount are executable there",
                SYSTEM_PATHS.join(", ")
            )
        } else if fs
            .iter()
            .any(|g| g.is_writable_executable() && path_within(program, &g.mount))
        {
            format!("{program} lies beneath a writable mount, where the agent could replace what the gateway runs: grant it from a read-only place")
        } else {
            continue;
        };
        return Err(GatewayExecError { index, reason });
    }
    Ok(())
}

/// Why a receipt's executable grants break W^X: what the agent (or the gateway on its
/// behalf) can write must never be what it can execute.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecGrantError {
    /// `exec = true` on a grant without a mount.
    #[error("exec = true needs a grant with a mount (a gateway-only grant is never mapped into the sandbox)")]
    NotMountedRead {
        /// The grant's index in the receipt's `fs`.
        index: usize,
    },
    /// A WRITE grant reaches host files an executable grant shows.
    #[error("write grant {write:?} reaches the same host files as the executable grant {exec:?} (fs[{exec_index}]): W^X refuses a receipt whose agent could execute what it or the gateway wrote")]
    WriteReachesExec {
        /// The write grant's index.
        index: usize,
        /// Its host path.
        write: String,
        /// The executable grant's index.
        exec_index: usize,
        /// Its host path.
        exec: String,
    },
}

impl ExecGrantError {
    /// The index in `fs` of the grant at fault.
    pub fn index(&self) -> usize {
        match self {
            Self::NotMountedRead { index } | Self::WriteReachesExec { index, .. } => *index,
        }
    }

    /// The request field at fault: `fs[i].exec` or `fs[i].path`.
    pub fn field(&self) -> String {
        match self {
            Self::NotMountedRead { index } => format!("fs[{index}].exec"),
            Self::WriteReachesExec { index, .. } => format!("fs[{index}].path"),
        }
    }
}

/// W^X by path, the rule the authority applies before it signs and every supervisor again
/// (the supervisor then also compares the pinned files themselves): `exec = true` only on a
/// mounted grant, and no WRITE grant, mounted or gateway-only, at, beneath or above an
/// executable READ grant's host path. A WRITE grant with `exec = true` is the receipt's
/// explicit word that W^X is lifted for that grant alone; it still may not reach an
/// executable READ grant (whose point is that nothing the agent writes runs from it).
pub fn check_exec_grants(fs: &[pb::FsGrant], exec: &[String]) -> Result<(), ExecGrantError> {
    for (index, grant) in fs.iter().enumerate() {
        if grant.exec && !grant.is_executable(exec) {
            return Err(ExecGrantError::NotMountedRead { index });
        }
    }
    for (exec_index, executable) in fs
        .iter()
        .enumerate()
        .filter(|(_, g)| g.access == pb::FsAccess::Read as i32 && g.is_executable(exec))
    {
        if let Some((index, write)) = write_grant_reaching(fs, &executable.path) {
            return Err(ExecGrantError::WriteReachesExec {
                index,
                write: write.path.clone(),
                exec_index,
                exec: executable.path.clone(),
            });
        }
    }
    Ok(())
}

/// The first WRITE grant of `fs` (mounted or gateway-only) at, beneath or above the host
/// path `path`, with its index: W^X by path, for executable grants and root file systems.
fn write_grant_reaching<'a>(fs: &'a [pb::FsGrant], path: &str) -> Option<(usize, &'a pb::FsGrant)> {
    fs.iter().enumerate().find(|(_, w)| {
        w.access == pb::FsAccess::Write as i32
            && (path_within(&w.path, path) || path_within(path, &w.path))
    })
}

/// Which userland a receipt's `rootfs` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rootfs<'a> {
    /// Empty: the host's system paths, with a generated `/etc`.
    Host,
    /// An unpacked root file system at this absolute host path.
    Path(&'a str),
    /// One registered with the supervisor under this name.
    Name(&'a str),
}

/// Why a receipt's `rootfs` cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RootfsError {
    /// Neither an absolute, normalised path (not `/`) nor a registered name's shape.
    #[error("{0:?} is neither an absolute, normalised host path (not /) nor a name of letters, digits, '.', '_' and '-' (1 to 64, not starting with '.')")]
    Shape(String),
    /// A write grant reaches the root file system.
    #[error("write grant fs[{index}] = {write:?} reaches the root file system {rootfs:?}: W^X refuses a run whose agent could change the programs it runs")]
    WriteReaches {
        /// The write grant's index.
        index: usize,
        /// Its host path.
        write: String,
        /// The root file system's path.
        rootfs: String,
    },
    /// A write grant reaches a system path the sandbox shows from the host (the host's
    /// userland), where programs the agent runs live.
    #[error("write grant fs[{index}] = {write:?} reaches {system}, which the sandbox shows from the host: W^X refuses a run whose agent (or the gateway on its behalf) could change the programs it runs")]
    WriteReachesSystem {
        /// The write grant's index.
        index: usize,
        /// Its host path.
        write: String,
        /// The system path.
        system: &'static str,
    },
    /// A grant that asks before reads reaches the root file system, which the agent reads
    /// directly.
    #[error("fs[{index}] = {grant:?} asks before reads, but the root file system {rootfs:?} shows the same files to the agent, which reads them without asking")]
    AskReadsReaches {
        /// The grant's index.
        index: usize,
        /// Its host path.
        grant: String,
        /// The root file system's path.
        rootfs: String,
    },
}

impl<'a> Rootfs<'a> {
    /// Reads a receipt's `rootfs` field, and checks that no write grant of `fs` reaches a
    /// rootfs given as a path (by path; the supervisor checks the pinned files again).
    pub fn parse(rootfs: &'a str, fs: &[pb::FsGrant]) -> Result<Self, RootfsError> {
        let parsed = if rootfs.is_empty() {
            Self::Host
        } else if rootfs.starts_with('/') {
            if rootfs == "/" || !is_normal_absolute(rootfs) {
                return Err(RootfsError::Shape(rootfs.to_owned()));
            }
            Self::Path(rootfs)
        } else if rootfs.len() <= 64
            && !rootfs.starts_with('.')
            && rootfs
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            Self::Name(rootfs)
        } else {
            return Err(RootfsError::Shape(rootfs.to_owned()));
        };
        if let Self::Host = parsed {
            // The host's system paths are the userland (its own /etc is generated).
            for system in SYSTEM_PATHS.iter().filter(|s| **s != "/etc") {
                if let Some((index, write)) = write_grant_reaching(fs, system) {
                    return Err(RootfsError::WriteReachesSystem {
                        index,
                        write: write.path.clone(),
                        system,
                    });
                }
            }
        }
        if let Self::Path(path) = parsed {
            if let Some((index, write)) = write_grant_reaching(fs, path) {
                return Err(RootfsError::WriteReaches {
                    index,
                    write: write.path.clone(),
                    rootfs: path.to_owned(),
                });
            }
            if let Some((index, grant)) = fs.iter().enumerate().find(|(_, g)| {
                g.ask_reads && (path_within(&g.path, path) || path_within(path, &g.path))
            }) {
                return Err(RootfsError::AskReadsReaches {
                    index,
                    grant: grant.path.clone(),
                    rootfs: path.to_owned(),
                });
            }
        }
        Ok(parsed)
    }
}

pub use tollgate_proto::path_within;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gateway_only_program_runs_in_the_sandbox_and_only_through_the_gateway() {
        let grant = |program: &str| pb::GatewayExecGrant {
            program: program.into(),
            ask: true,
        };
        let exec = ["/bin/sh".to_owned()];
        assert!(check_gateway_exec(&[grant("/usr/bin/git")], &[], &exec).is_ok());
        for (bad, why) in [
            (vec![grant("/bin/sh")], "also in exec"),
            (
                vec![grant("/usr/bin/git"), grant("/usr/bin/git")],
                "listed twice",
            ),
            (vec![grant("/work/tool")], "cannot run in a sandbox"),
            (vec![grant("usr/bin/git")], "absolute, normalised"),
        ] {
            let error = check_gateway_exec(&bad, &[], &exec).unwrap_err();
            assert!(error.to_string().contains(why), "{bad:?}: {error}");
            assert!(error.field().starts_with("gateway_exec["), "{error:?}");
        }
    }

    #[test]
    fn only_programs_on_the_system_paths_or_executable_grants_can_be_an_agent() {
        for good in ["/usr/bin/python3", "/bin/sh", "/usr/local/bin/agent"] {
            assert!(executable_in_sandbox(good, &[], &[]), "{good}");
        }
        for bad in [
            "/work/agent.py",
            "/opt/agent/hello",
            "/usr",
            "/tmp/x",
            "/usrx/bin/sh",
            "bin/sh",
        ] {
            assert!(!executable_in_sandbox(bad, &[], &[]), "{bad}");
        }
        let exec = vec!["/opt/agent/hello".to_owned()];
        let read = grant("/srv/agent", "/opt/agent");
        assert!(executable_in_sandbox(
            "/opt/agent/hello",
            std::slice::from_ref(&read),
            &exec
        ));
        // Not listed and no exec = true: the mount stays noexec.
        assert!(!executable_in_sandbox(
            "/opt/agent/hello",
            std::slice::from_ref(&read),
            &[]
        ));
        let mut flagged = read.clone();
        flagged.exec = true;
        assert!(executable_in_sandbox("/opt/agent/bin/x", &[flagged], &[]));
        let mut write = read;
        write.access = pb::FsAccess::Write as i32;
        assert!(!executable_in_sandbox("/opt/agent/hello", &[write], &exec));
    }

    #[test]
    fn a_write_grant_never_reaches_an_executable_one() {
        let exec = vec!["/opt/venv/bin/python".to_owned()];
        let venv = grant("/srv/venv", "/opt/venv");
        let write = |path: &str, mount: &str| pb::FsGrant {
            path: path.into(),
            access: pb::FsAccess::Write as i32,
            mount: mount.into(),
            exec: false,
            ask: false,
            ask_reads: false,
        };
        assert_eq!(
            check_exec_grants(std::slice::from_ref(&venv), &exec),
            Ok(())
        );
        // Beneath, above, the same path; mounted or gateway-only.
        for (path, mount) in [
            ("/srv/venv/lib", ""),
            ("/srv", "/data"),
            ("/srv/venv", ""),
            ("/srv/venv/bin", "/out"),
        ] {
            let error = check_exec_grants(&[venv.clone(), write(path, mount)], &exec).unwrap_err();
            assert!(
                matches!(
                    error,
                    ExecGrantError::WriteReachesExec {
                        index: 1,
                        exec_index: 0,
                        ..
                    }
                ),
                "{path}: {error}"
            );
            assert_eq!(error.field(), "fs[1].path");
        }
        // Beside it is fine, and so is a write grant beside a noexec read grant.
        assert_eq!(
            check_exec_grants(&[venv.clone(), write("/srv/out", "/out")], &exec),
            Ok(())
        );
        assert_eq!(
            check_exec_grants(
                &[grant("/srv/docs", "/docs"), write("/srv/docs/x", "")],
                &exec
            ),
            Ok(())
        );
        // exec = true on a mounted write grant lifts W^X for it alone; a gateway-only grant
        // is never mapped, so never executable.
        let mut on_write = write("/srv/bin", "/bin2");
        on_write.exec = true;
        assert_eq!(
            check_exec_grants(std::slice::from_ref(&on_write), &[]),
            Ok(())
        );
        assert!(on_write.is_executable(&[]));
        // Still never reaching an executable read grant.
        on_write.path = "/srv/venv/build".into();
        assert!(matches!(
            check_exec_grants(&[venv.clone(), on_write], &exec),
            Err(ExecGrantError::WriteReachesExec { index: 1, .. })
        ));
        let mut unmounted_write = write("/srv/bin", "");
        unmounted_write.exec = true;
        assert_eq!(
            check_exec_grants(&[unmounted_write], &[]),
            Err(ExecGrantError::NotMountedRead { index: 0 })
        );
        let mut unmounted = grant("/srv/bin", "");
        unmounted.exec = true;
        assert_eq!(
            check_exec_grants(&[unmounted], &[]).unwrap_err().field(),
            "fs[0].exec"
        );
    }

    #[test]
    fn a_rootfs_is_a_path_or_a_name_and_never_writable() {
        assert_eq!(Rootfs::parse("", &[]), Ok(Rootfs::Host));
        assert_eq!(
            Rootfs::parse("/srv/rootfs/trixie", &[]),
            Ok(Rootfs::Path("/srv/rootfs/trixie"))
        );
        assert_eq!(
            Rootfs::parse("debian-13", &[]),
            Ok(Rootfs::Name("debian-13"))
        );
        for bad in ["/", "/a/../b", ".hidden", "a/b", "sp ace", &"x".repeat(65)] {
            assert!(
                matches!(Rootfs::parse(bad, &[]), Err(RootfsError::Shape(_))),
                "{bad}"
            );
        }
        let write = pb::FsGrant {
            path: "/srv".into(),
            access: pb::FsAccess::Write as i32,
            mount: String::new(),
            exec: false,
            ask: false,
            ask_reads: false,
        };
        let error = Rootfs::parse("/srv/rootfs", std::slice::from_ref(&write)).unwrap_err();
        assert!(error.to_string().contains("W^X"), "{error}");
        assert_eq!(
            Rootfs::parse("debian", std::slice::from_ref(&write)),
            Ok(Rootfs::Name("debian"))
        );
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
            exec: false,
            ask: false,
            ask_reads: false,
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
    fn a_grant_that_asks_is_never_reached_by_the_kernel() {
        let asking = |path: &str, mount: &str| pb::FsGrant {
            access: pb::FsAccess::Write as i32,
            ask: true,
            ..grant(path, mount)
        };
        let writable = |path: &str, mount: &str| pb::FsGrant {
            access: pb::FsAccess::Write as i32,
            ..grant(path, mount)
        };
        let error = check_mounts(&[asking("/srv/a", "/data")]).unwrap_err();
        assert_eq!(
            error,
            MountError::AskMounted {
                index: 0,
                reads: false
            }
        );
        assert_eq!(error.field(), "fs[0].ask");
        // A WRITE mount over the same files, from above or below, lets the agent skip asking.
        for mounted in ["/srv", "/srv/a/sub"] {
            let error = check_mounts(&[asking("/srv/a", ""), writable(mounted, "/data")]);
            assert!(
                matches!(
                    error,
                    Err(MountError::AskUnderWriteMount {
                        index: 0,
                        other: 1,
                        ..
                    })
                ),
                "{mounted}: {error:?}"
            );
        }
        // Reading through a mount is no change; other files are no concern.
        assert_eq!(
            check_mounts(&[asking("/srv/a", ""), grant("/srv", "/data")]),
            Ok(())
        );
        assert_eq!(
            check_mounts(&[asking("/srv/a", ""), writable("/srv/b", "/data")]),
            Ok(())
        );
        // Asking before reads: no mount at all may reach the same files.
        let reading = |path: &str, mount: &str| pb::FsGrant {
            ask_reads: true,
            ..grant(path, mount)
        };
        let error = check_mounts(&[reading("/srv/a", "/data")]).unwrap_err();
        assert_eq!(error.field(), "fs[0].ask_reads");
        assert!(error.to_string().contains("ask_reads = true"), "{error}");
        for mounted in ["/srv", "/srv/a/sub"] {
            let error = check_mounts(&[reading("/srv/a", ""), grant(mounted, "/data")]);
            assert!(
                matches!(
                    error,
                    Err(MountError::AskReadsUnderMount {
                        index: 0,
                        other: 1,
                        ..
                    })
                ),
                "{mounted}: {error:?}"
            );
        }
        assert_eq!(
            check_mounts(&[reading("/srv/a", ""), grant("/srv/b", "/data")]),
            Ok(())
        );
    }

    #[test]
    fn no_write_grant_reaches_the_hosts_userland() {
        let write = |path: &str| pb::FsGrant {
            access: pb::FsAccess::Write as i32,
            ..grant(path, "")
        };
        for path in ["/usr/local/bin", "/", "/lib"] {
            assert!(
                matches!(
                    Rootfs::parse("", &[write(path)]),
                    Err(RootfsError::WriteReachesSystem { index: 0, .. })
                ),
                "{path}"
            );
        }
        // The host's /etc is not the sandbox's (it is generated); other paths are no concern.
        assert_eq!(
            Rootfs::parse("", &[write("/etc/app"), write("/srv")]),
            Ok(Rootfs::Host)
        );
    }

    #[test]
    fn asking_before_reads_binds_every_grant_beneath_whatever_its_access() {
        let parent = [
            pb::FsGrant {
                access: pb::FsAccess::Write as i32,
                ..grant("/srv", "")
            },
            pb::FsGrant {
                ask_reads: true,
                ..grant("/srv/a", "")
            },
        ];
        let child = pb::FsGrant {
            access: pb::FsAccess::Write as i32,
            ..grant("/srv/a/x", "")
        };
        assert_eq!(
            ask_reads_required(&child, &parent).map(|g| g.path.as_str()),
            Some("/srv/a"),
            "a write grant beneath reads there too"
        );
        assert!(ask_required(&child, &parent).is_none());
        // The sandbox shows the host's system paths, and a root file system, to the agent.
        let usr = pb::FsGrant {
            ask_reads: true,
            ..grant("/usr/share/doc", "")
        };
        assert_eq!(
            check_mounts(std::slice::from_ref(&usr)).map_err(|e| e.field()),
            Err("fs[0].ask_reads".into())
        );
        let reading = pb::FsGrant {
            ask_reads: true,
            ..grant("/srv/rootfs/etc", "")
        };
        assert!(matches!(
            Rootfs::parse("/srv/rootfs", std::slice::from_ref(&reading)),
            Err(RootfsError::AskReadsReaches { index: 0, .. })
        ));
    }

    #[test]
    fn asking_is_inherited_from_the_most_specific_entry_and_from_any_beneath() {
        let entry = |path: &str, ask: bool| pb::FsGrant {
            access: pb::FsAccess::Write as i32,
            ask,
            ..grant(path, "")
        };
        let entries = [
            entry("/srv", true),
            entry("/srv/tmp", false),
            entry("/", false),
        ];
        let asked =
            |path: &str| ask_required(&entry(path, false), &entries).map(|e| e.path.clone());
        assert_eq!(asked("/srv/app"), Some("/srv".into()));
        assert_eq!(
            asked("/srv/tmp/x"),
            None,
            "a more specific entry that does not ask"
        );
        assert_eq!(asked("/home"), None);
        assert_eq!(
            asked("/"),
            Some("/srv".into()),
            "an asking entry beneath it"
        );
        assert_eq!(ask_required(&entry("/srv/app", true), &entries), None);
    }

    #[test]
    fn prefix_match_respects_component_boundaries() {
        assert!(path_within("/home/me", "/home/me"));
        assert!(path_within("/home/me/x", "/home/me"));
        assert!(!path_within("/home/meow", "/home/me"));
        assert!(path_within("/etc", "/"));
    }
}
