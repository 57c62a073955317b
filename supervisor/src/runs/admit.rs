//! Admission: everything a start can be refused for, checked before the single-use record,
//! so a refused start never spends its receipt; then the record itself.

use std::sync::atomic::Ordering;

use nix::errno::Errno;
use prost::Message as _;
use tollgate_receipt::{unix_now, SignedReceipt, VerifyError};

use crate::beneath::GrantRoot;
use crate::error::StartError;
use crate::gateway::FsGrant;
use crate::records::NewRun;
use crate::sandbox::SandboxError;
use crate::COMPONENT;
use tollgate_audit::{Decision, EntryDraft, EntryKind};

use super::{Holds, RunManager};

/// Pins every fs grant of a root run's receipt (see [`GrantRoot::open`]): a symbolic link
/// anywhere on a granted path refuses the start, naming the link; so does a mounted grant
/// that does not exist. A gateway-only grant that cannot be opened for another reason is kept
/// as such: its calls are refused, naming why.
pub(super) fn pin_grants(
    receipt: &tollgate_proto::v1::Receipt,
) -> Result<Vec<FsGrant>, StartError> {
    receipt
        .fs
        .iter()
        .enumerate()
        .map(|(i, grant)| {
            let pinned = FsGrant::pin(grant);
            match &pinned.root {
                Err(Errno::ELOOP) => {
                    let link = crate::beneath::first_link(&grant.path)
                        .unwrap_or_else(|| grant.path.clone());
                    Err(StartError::Grant {
                        code: "grant_link",
                        reason: format!(
                            "fs[{i}] = {}: {link} is a symbolic link, and links are never followed in a granted path; grant the real path instead",
                            grant.path
                        ),
                    })
                }
                Err(errno) if !grant.mount.is_empty() => Err(StartError::Grant {
                    code: "grant_missing",
                    reason: format!(
                        "fs[{i}] = {}: the mounted grant cannot be opened on this host ({errno})",
                        grant.path
                    ),
                }),
                _ => Ok(pinned),
            }
        })
        .collect()
}

/// W^X on the host files themselves: no write grant (mounted or gateway-only) may reach
/// what an executable grant shows — not by path (the rule the authority applied before it
/// signed, applied again here) and not by identity: the pinned directories' ancestors, the
/// roots of mounts inside each grant, a hard-linked granted file. Otherwise the agent could
/// write a program through one grant and run it through the other.
pub(super) fn check_write_exec(
    receipt: &tollgate_proto::v1::Receipt,
    pinned: &[FsGrant],
    rootfs: Option<&PinnedRootfs>,
) -> Result<(), StartError> {
    use tollgate_files::reach;
    use tollgate_receipt::paths::check_exec_grants;
    let refuse = |reason: String| StartError::Grant {
        code: "grant_wx",
        reason,
    };
    check_exec_grants(&receipt.fs, &receipt.exec)
        .map_err(|e| refuse(format!("{}: {e}", e.field())))?;
    // Each executable grant, and the root file system (its programs run too), by name and
    // host path.
    let mut executable: Vec<(String, &str, &GrantRoot)> = receipt
        .fs
        .iter()
        .zip(pinned)
        .enumerate()
        // Executable read grants: a write grant with exec = true is writable and executable
        // on the receipt's explicit word (W^X lifted for it alone), so it is no executable
        // grant to protect here; it is one of the write grants checked against the others.
        .filter(|(_, (grant, _))| {
            grant.access == tollgate_proto::v1::FsAccess::Read as i32
                && grant.is_executable(&receipt.exec)
        })
        .filter_map(|(i, (grant, pin))| {
            pin.root.as_ref().ok().map(|root| {
                (
                    format!("the executable grant fs[{i}] = {}", grant.path),
                    grant.path.as_str(),
                    root,
                )
            })
        })
        .collect();
    if let Some(rootfs) = rootfs {
        let path = rootfs.path.to_str().unwrap_or_default();
        executable.push((format!("the root file system {path}"), path, &rootfs.root));
    }
    let writable: Vec<(usize, &FsGrant, &GrantRoot)> = pinned
        .iter()
        .enumerate()
        .filter(|(_, pin)| pin.writable)
        .filter_map(|(w, pin)| pin.root.as_ref().ok().map(|root| (w, pin, root)))
        .collect();
    if executable.is_empty() || writable.is_empty() {
        return Ok(());
    }
    // Read once per start, and only for receipts with both kinds of grant.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let failed = |path: &str, e: Errno| refuse(format!("{path}: cannot be checked for W^X ({e})"));
    // Each write grant's identities once, whatever the number of executable grants.
    let mut writes = Vec::with_capacity(writable.len());
    for &(w, write, root) in &writable {
        let fail = |e| failed(&write.path, e);
        writes.push((
            w,
            write,
            reach::ancestry(root).map_err(fail)?,
            reach::reach(root, &write.path, &mountinfo).map_err(fail)?,
            reach::shared_file(root).map_err(fail)?,
        ));
    }
    for (what, exec_path, exec_root) in &executable {
        let exec_up = reach::ancestry(exec_root).map_err(|e| failed(exec_path, e))?;
        let exec_reach =
            reach::reach(exec_root, exec_path, &mountinfo).map_err(|e| failed(exec_path, e))?;
        for (w, write, write_up, write_reach, shared) in &writes {
            let linked = shared.is_some_and(|dev| dev == exec_root.dev);
            if linked
                || exec_up.iter().any(|id| write_reach.contains(id))
                || write_up.iter().any(|id| exec_reach.contains(id))
            {
                return Err(refuse(format!(
                    "fs[{w}] = {} (write) reaches the same host files as {what}{}: W^X refuses a run whose agent could execute what it or the gateway wrote",
                    write.path,
                    if linked { " (a hard link)" } else { " (through another name or mount)" },
                )));
            }
        }
    }
    Ok(())
}

/// A home is the agent's own directory, never a person's: the receipt's home grant may not be
/// (or hold) the home directory of any user of this host (`passwd`, the text of
/// /etc/passwd). The authority cannot know this host's users, and the CLI checks only its
/// caller's own `$HOME`; this is where every user's is.
pub(super) fn check_home_of_users(
    receipt: &tollgate_proto::v1::Receipt,
    passwd: &str,
) -> Result<(), StartError> {
    use tollgate_receipt::paths::{is_normal_absolute, path_within};
    if receipt.home.is_empty() {
        return Ok(());
    }
    let Some(grant) = receipt.fs.iter().find(|g| g.mount == receipt.home) else {
        return Ok(()); // refused with the plan's checks, naming the home
    };
    for line in passwd.lines() {
        let fields: Vec<&str> = line.split(':').collect();
        let (Some(user), Some(home)) = (fields.first(), fields.get(5)) else {
            continue;
        };
        // "/" and the like are no one's own directory (and a home reaching the system
        // paths is refused anyway).
        if home.len() > 1 && is_normal_absolute(home) && path_within(home, &grant.path) {
            return Err(StartError::Grant {
                code: "home",
                reason: format!(
                    "home {} is (or holds) the home directory {home} of user {user} on this host: a home is a directory of the agent's own; make one, e.g. /srv/agents/NAME/home",
                    grant.path
                ),
            });
        }
    }
    Ok(())
}

/// A run's root file system, resolved and pinned: its host path and descriptor.
pub(super) struct PinnedRootfs {
    /// `<rootfs dir>/<name>`, or the path the receipt gives.
    pub(super) path: std::path::PathBuf,
    /// Pinned from `/` without following a link, as grants are.
    pub(super) root: GrantRoot,
}

/// Resolves the receipt's `rootfs` (a name under `rootfs_dir`, or a host path) and pins it;
/// none for the host's userland. Refused in one line naming it when it is malformed, missing,
/// reached through a link, or not a userland (no `usr` or `bin` in it).
pub(super) fn pin_rootfs(
    receipt: &tollgate_proto::v1::Receipt,
    rootfs_dir: &std::path::Path,
) -> Result<Option<PinnedRootfs>, StartError> {
    use tollgate_receipt::paths::Rootfs;
    let refuse = |reason: String| StartError::Grant {
        code: "rootfs",
        reason,
    };
    let path = match Rootfs::parse(&receipt.rootfs, &receipt.fs) {
        Ok(Rootfs::Host) => return Ok(None),
        Ok(Rootfs::Path(path)) => std::path::PathBuf::from(path),
        Ok(Rootfs::Name(name)) => rootfs_dir.join(name),
        Err(e) => return Err(refuse(format!("rootfs: {e}"))),
    };
    let text = path.to_str().unwrap_or_default();
    let root = match GrantRoot::open(text) {
        Ok(root) if root.name.is_none() => root,
        Ok(_) => return Err(refuse(format!("rootfs {text} is a file, not a directory"))),
        Err(Errno::ELOOP) => {
            let link = crate::beneath::first_link(text).unwrap_or_else(|| text.to_owned());
            return Err(refuse(format!(
                "rootfs {text}: {link} is a symbolic link, and links are never followed; name the real path"
            )));
        }
        Err(Errno::ENOENT) if !receipt.rootfs.starts_with('/') => {
            return Err(refuse(format!(
                "no root file system named {:?} on this supervisor (looked for {text}): import one with `tollgate rootfs import {} FILE.tar`",
                receipt.rootfs, receipt.rootfs
            )))
        }
        Err(errno) => return Err(refuse(format!("rootfs {text} cannot be opened ({errno})"))),
    };
    let has = |entry: &std::ffi::CStr| {
        nix::sys::stat::fstatat(&root.dir, entry, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
    };
    if !has(c"usr") && !has(c"bin") {
        return Err(refuse(format!(
            "rootfs {text} has no usr or bin: it is not an unpacked userland (debootstrap, or `docker export` through `tollgate rootfs import`)"
        )));
    }
    Ok(Some(PinnedRootfs { path, root }))
}

pub(super) fn holds_of(limits: &tollgate_proto::v1::Limits) -> Holds {
    [
        limits.memory_bytes,
        u64::from(limits.pids),
        u64::from(limits.cpu_millicores),
    ]
}

/// A child receipt starts only through its parent's gateway (which checks it lies within
/// the parent and ends with it); an operator's start would escape both.
fn check_place(
    receipt: &tollgate_proto::v1::Receipt,
    parent: Option<&str>,
) -> Result<(), StartError> {
    let run_id = &receipt.receipt_id;
    match parent {
        None if receipt.depth > 0 => Err(StartError::Delegated {
            code: "delegated",
            reason: format!(
                "receipt {run_id} is delegated (depth {}): it starts only through its parent's gateway",
                receipt.depth
            ),
        }),
        Some(parent) if receipt.depth == 0 || receipt.parent_receipt_id != parent => {
            Err(StartError::Delegated {
                code: "delegated",
                reason: format!("receipt {run_id} is not a child of run {parent}"),
            })
        }
        _ => Ok(()),
    }
}

/// The argv rules: a receipt that pins its agent takes no argv; the command run (given or
/// pinned) must exist and be granted `exec`.
fn check_command(
    receipt: &tollgate_proto::v1::Receipt,
    argv: Option<&[String]>,
) -> Result<(), StartError> {
    if argv.is_some() && receipt.agent.as_ref().is_some_and(|a| !a.argv.is_empty()) {
        return Err(StartError::ArgvNotAllowed(receipt.receipt_id.clone()));
    }
    let command = argv
        .map(<[String]>::to_vec)
        .or_else(|| receipt.agent.as_ref().map(|a| a.argv.clone()))
        .filter(|argv| !argv.is_empty());
    match command {
        None => Err(SandboxError::NoAgent.into()),
        Some(command) if !tollgate_proto::exec_allows(&receipt.exec, &command[0]) => {
            Err(SandboxError::NotExecutable(command[0].clone()).into())
        }
        Some(command)
            if !tollgate_receipt::paths::executable_in_sandbox(
                &command[0],
                &receipt.fs,
                &receipt.exec,
            ) =>
        {
            Err(SandboxError::NotInSandbox(command[0].clone()).into())
        }
        Some(_) => Ok(()),
    }
}

/// The clock skew helps admit a receipt minted on a slightly different clock; it never lets
/// a run start at or after its expiry by this host's clock.
fn check_unexpired(receipt: &tollgate_proto::v1::Receipt) -> Result<(), StartError> {
    let expires_at = receipt.expires_at.as_ref().map_or(0, |t| t.seconds);
    let now = unix_now();
    if now >= expires_at {
        return Err(VerifyError::Expired {
            receipt_id: receipt.receipt_id.clone(),
            expires_at,
            now,
        }
        .into());
    }
    Ok(())
}

impl RunManager {
    /// Admission: strict verification, the argv rules, expiry by this host's clock, a host id,
    /// and the single-use record. On success the start counts as in flight. Everything that
    /// can be refused without a sandbox is checked before the record: a refused start never
    /// spends the receipt.
    pub(super) fn admit_and_record(
        &self,
        signed: &SignedReceipt,
        argv: Option<&[String]>,
        tree: Option<(&str, &tollgate_proto::v1::Limits)>,
    ) -> Result<(tollgate_proto::v1::Receipt, u32, Option<Vec<FsGrant>>), StartError> {
        let parent = tree.map(|(parent, _)| parent);
        // A partitioned supervisor fails closed: a receipt revoked since it last heard from
        // its authority must not start.
        self.check_fresh()?;
        let receipt = self.verify(signed)?;
        check_place(&receipt, parent)?;
        check_command(&receipt, argv)?;
        check_unexpired(&receipt)?;
        // A root run's grants are pinned now, before the record: a grant through a link is
        // refused without spending the receipt. (A child's were pinned beneath its parent's.)
        let pinned = match parent {
            None => {
                let pinned = pin_grants(&receipt)?;
                let rootfs = pin_rootfs(&receipt, &self.settings.rootfs_dir)?;
                check_write_exec(&receipt, &pinned, rootfs.as_ref())?;
                if !receipt.home.is_empty() {
                    // Fails closed: a home no one could check against this host's users
                    // does not start.
                    let passwd =
                        std::fs::read_to_string("/etc/passwd").map_err(|e| StartError::Grant {
                            code: "home",
                            reason: format!(
                                "/etc/passwd: {e}: the home cannot be checked against this host's users"
                            ),
                        })?;
                    check_home_of_users(&receipt, &passwd)?;
                }
                Some(pinned)
            }
            Some(_) => None,
        };
        let _guard = self.allocation.lock().unwrap_or_else(|p| p.into_inner());
        if self.closing.load(Ordering::SeqCst) {
            return Err(StartError::ShuttingDown);
        }
        // A child of a run that is ending never starts (and never spends its receipt).
        if let Some(parent) = parent {
            let parent_live = self
                .live_run(parent)
                .is_some_and(|run| !run.closing.load(Ordering::SeqCst));
            if !parent_live {
                return Err(StartError::Delegated {
                    code: "parent_not_live",
                    reason: format!("run {parent} is ending; its children start no more"),
                });
            }
        }
        let holds = match tree {
            Some((parent, parent_limits)) => Some(self.child_holds_within(
                parent,
                parent_limits,
                &receipt.limits.unwrap_or_default(),
            )?),
            None => None,
        };
        let host_id = self.record(signed, &receipt, parent)?;
        if let Some((parent, holds)) = holds {
            self.family.lock().unwrap_or_else(|p| p.into_inner()).add(
                &receipt.receipt_id,
                &parent,
                holds,
            );
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        Ok((receipt, host_id, pinned))
    }

    /// What a child of `parent` would hold of its parent's memory, pids and cpu, or why it
    /// may not: live children together stay within their parent's limits (without this, a
    /// run could start many children each as large as itself). Called under `allocation`.
    fn child_holds_within(
        &self,
        parent: &str,
        parent_limits: &tollgate_proto::v1::Limits,
        limits: &tollgate_proto::v1::Limits,
    ) -> Result<(String, Holds), StartError> {
        let wanted = holds_of(limits);
        let ceiling = holds_of(parent_limits);
        // Kept summed per parent: no walk over every live child.
        let held = self
            .family
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .held_by(parent);
        let names = [
            "limits.memory_bytes",
            "limits.pids",
            "limits.cpu_millicores",
        ];
        for i in 0..3 {
            if held[i].saturating_add(wanted[i]) > ceiling[i] {
                return Err(StartError::ChildrenLimits(format!(
                    "{} = {}: live children of run {parent} already hold {} of its {}; wait for one to end",
                    names[i], wanted[i], held[i], ceiling[i]
                )));
            }
        }
        Ok((parent.to_owned(), wanted))
    }

    /// A free host id and the single-use record (called under `allocation`): the id, or
    /// `AlreadyUsed` when the receipt has started a run before. The id is taken from
    /// [`HostIds`](crate::host_ids::HostIds), not by reading every live run's; it goes back
    /// when the start is refused here, or when the run's final record is written.
    fn record(
        &self,
        signed: &SignedReceipt,
        receipt: &tollgate_proto::v1::Receipt,
        parent: Option<&str>,
    ) -> Result<u32, StartError> {
        let run_id = receipt.receipt_id.as_str();
        let host_id = {
            let mut ids = self.host_ids.lock().unwrap_or_else(|p| p.into_inner());
            // Live (or its end not recorded): the record refuses it too, but the id it holds
            // must not be given back for this start.
            if ids.holds(run_id) {
                return Err(StartError::AlreadyUsed(run_id.to_owned()));
            }
            ids.take(run_id)
                .ok_or_else(|| StartError::NoHostId(ids.range()))?
        };
        let recorded = self.records.insert(&NewRun {
            run_id: &receipt.receipt_id,
            owner: &receipt.owner,
            subject: &receipt.subject,
            receipt: &signed.encode_to_vec(),
            host_id,
            now: unix_now(),
            expires_at: receipt.expires_at.as_ref().map_or(0, |t| t.seconds),
            parent_run_id: parent,
            depth: receipt.depth,
        });
        if !matches!(recorded, Ok(true)) {
            self.give_back_host_id(run_id);
        }
        if !recorded? {
            return Err(StartError::AlreadyUsed(receipt.receipt_id.clone()));
        }
        Ok(host_id)
    }

    /// Audits a refused start. The receipt id is the one the receipt claims: for a forged or
    /// malformed receipt it is not verified (`receipt_verified` says which).
    pub fn audit_refusal(&self, signed: &SignedReceipt, error: &StartError) {
        let claimed = tollgate_proto::v1::Receipt::decode(signed.receipt.as_slice())
            .ok()
            .map(|receipt| receipt.receipt_id)
            .filter(|id| uuid::Uuid::try_parse(id).is_ok());
        let code = error.code();
        let mut draft = EntryDraft::new(COMPONENT, EntryKind::RunRefused)
            .decision(Decision::Deny)
            .reason(error.to_string())
            .meta("code", code)
            .meta("receipt_verified", !matches!(error, StartError::Receipt(_)));
        if let Some(id) = claimed {
            draft = draft.receipt(id);
        }
        if let Err(e) = self.audit.append(draft) {
            tracing::error!(error = %e, "could not audit a refused start");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_proto::v1 as pb;

    #[test]
    fn a_home_is_never_a_users_home_on_this_host() {
        let passwd = "root:x:0:0:root:/root:/bin/sh\n\
                      nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n\
                      me:x:1000:1000:Me:/home/me:/bin/bash\n\
                      weird:x:1001:1001::/:/bin/sh\n";
        let receipt = |path: &str| pb::Receipt {
            fs: vec![pb::FsGrant {
                path: path.into(),
                access: pb::FsAccess::Write as i32,
                mount: "/home/agent".into(),
                ..Default::default()
            }],
            home: "/home/agent".into(),
            ..Default::default()
        };
        for own in ["/srv/agents/a", "/home/me/agents/a", "/home/other"] {
            assert!(check_home_of_users(&receipt(own), passwd).is_ok(), "{own}");
        }
        for person in ["/home/me", "/root"] {
            match check_home_of_users(&receipt(person), passwd) {
                Err(StartError::Grant {
                    code: "home",
                    reason,
                }) => {
                    assert!(reason.contains("home directory"), "{reason}")
                }
                other => panic!("{person}: {other:?}"),
            }
        }
        // No home: nothing to check.
        let mut none = receipt("/home/me");
        none.home.clear();
        assert!(check_home_of_users(&none, passwd).is_ok());
    }
}
