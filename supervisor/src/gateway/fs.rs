//! The file tools (`fs.read`, `fs.list`, `fs.stat`, `fs.write`, `fs.delete`): paths are host
//! paths beneath one of the receipt's fs grants, resolved from the grant's pinned directory
//! without following any link; changes are snapshotted first and made only once their
//! audit entry is durable.

use std::os::fd::{AsFd as _, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{fstat, FileStat, SFlag};
use tollgate_files::beneath::{self, reopen, GrantRoot, Ownership, ParentDir};
use tollgate_files::snapshot::{SnapshotError, SnapshotManifest, SnapshotStore};
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::call_tool_request::Tool;
use tollgate_proto::v1::call_tool_response::Result as ToolResult;
use tollgate_receipt::paths::{is_normal_absolute, path_within};
use tollgate_receipt::unix_now;
use tonic::Status;

use super::approval::{Approval, Asked};
use super::gate::{new_call_id, CallGate, CallMeta, Refusal, Step};
use super::input::{MAX_LIST, MAX_READ, MAX_WRITE};

/// One fs grant as the gateway uses it.
#[derive(Debug)]
pub struct FsGrant {
    /// The granted host path (absolute, normalised).
    pub path: String,
    /// Whether writes are granted (the read tools need only a read grant).
    pub writable: bool,
    /// Whether each change beneath it waits for an operator's approval.
    pub ask: bool,
    /// Whether each read beneath it waits for an operator's approval too.
    pub ask_reads: bool,
    /// Where the grant came from: what decides whether children may be pinned beneath it.
    pub origin: GrantOrigin,
    /// The granted path, pinned when the run started (or why it could not be).
    pub root: Result<GrantRoot, Errno>,
}

impl FsGrant {
    /// The receipt's (or an amendment's) grant `grant`, pinned now: call before the agent
    /// exists.
    pub fn pin(grant: &pb::FsGrant) -> Self {
        Self {
            ask_reads: grant.ask_reads,
            ..Self::open(
                &grant.path,
                grant.access == pb::FsAccess::Write as i32,
                grant.ask,
            )
        }
    }

    /// The grant of `path`, pinned now: call before the agent exists.
    pub fn open(path: &str, writable: bool, ask: bool) -> Self {
        Self {
            path: path.to_owned(),
            writable,
            ask,
            ask_reads: false,
            origin: GrantOrigin::Receipt,
            root: GrantRoot::open(path),
        }
    }
}

/// Where a live run's grant came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantOrigin {
    /// The receipt signed it.
    Receipt,
    /// A signed amendment added it to the live run; children never gain it.
    Amendment,
    /// A signed amendment for the run's children too (`for_children`) added it.
    AmendmentForChildren,
}

impl GrantOrigin {
    /// Whether the run's delegated children may be pinned beneath a grant of this origin.
    pub fn reaches_children(self) -> bool {
        self != Self::Amendment
    }
}

/// A run's fs grants as its gateway uses them now: pinned when it started, then narrowed or
/// widened while it lives (an amendment). Each call works on the set it found when it began.
#[derive(Debug)]
pub struct LiveGrants(std::sync::RwLock<Arc<[Arc<FsGrant>]>>);

impl LiveGrants {
    /// The grants a run starts with.
    pub fn new(grants: Vec<FsGrant>) -> Self {
        Self(std::sync::RwLock::new(
            grants.into_iter().map(Arc::new).collect(),
        ))
    }

    /// The grants now.
    pub fn current(&self) -> Arc<[Arc<FsGrant>]> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The grants now that the receipt signed, or an amendment for children added: what
    /// children are pinned beneath.
    pub fn for_children(&self) -> Vec<Arc<FsGrant>> {
        self.current()
            .iter()
            .filter(|grant| grant.origin.reaches_children())
            .cloned()
            .collect()
    }

    /// Replaces the grants with what `change` makes of them.
    pub fn change(&self, change: impl FnOnce(&[Arc<FsGrant>]) -> Vec<Arc<FsGrant>>) {
        let mut grants = self.0.write().unwrap_or_else(|p| p.into_inner());
        *grants = change(&grants).into();
    }
}

/// The file tools of one run: its grants, pinned when it started, and its snapshots.
#[derive(Debug)]
pub struct FsTools {
    /// The run's call gate.
    pub gate: Arc<CallGate>,
    /// The run's fs grants now (shared with delegation, which pins children beneath them).
    pub grants: Arc<LiveGrants>,
    /// Where `fs.write` and `fs.delete` keep what they change.
    pub snapshots: SnapshotStore,
}

fn kind_of(stat: &FileStat) -> pb::FileKind {
    match SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFREG => pb::FileKind::File,
        SFlag::S_IFDIR => pb::FileKind::Directory,
        SFlag::S_IFLNK => pb::FileKind::Symlink,
        _ => pb::FileKind::Other,
    }
}

fn info(name: String, stat: &FileStat) -> pb::FileInfo {
    pb::FileInfo {
        name,
        kind: kind_of(stat) as i32,
        size: u64::try_from(stat.st_size).unwrap_or(0),
        mode: stat.st_mode & 0o7777,
        modified: Some(prost_types::Timestamp {
            seconds: stat.st_mtime,
            nanos: i32::try_from(stat.st_mtime_nsec).unwrap_or(0),
        }),
    }
}

/// A path resolved to its grant: the grant's directory (or file) and the rest beneath it.
struct Target {
    grant: Arc<FsGrant>,
    rest: String,
}

impl FsTools {
    /// The grant `path` falls under (the most specific one), or why none does (naming the
    /// `access` the call needed).
    fn target(&self, path: &str, access: &str) -> Result<Target, String> {
        if !is_normal_absolute(path) {
            return Err(format!(
                "{path:?} is not a normalised absolute host path (no '..', '.' or '//')"
            ));
        }
        let grants = self.grants.current();
        let grant = grants
            .iter()
            .filter(|g| path_within(path, &g.path))
            .max_by_key(|g| g.path.len())
            .cloned()
            .ok_or_else(|| {
                format!("no fs grant covers {path} (missing grant: fs {access} on {path})")
            })?;
        let rest = path
            .strip_prefix(&grant.path)
            .unwrap_or_default()
            .trim_start_matches('/')
            .to_owned();
        Ok(Target { grant, rest })
    }

    /// The grant's pinned root, or why there is none.
    fn root<'a>(&self, grant: &'a FsGrant) -> Result<&'a GrantRoot, Refusal> {
        grant.root.as_ref().map_err(|errno| {
            let reason = format!(
                "the granted path {} could not be opened when the run started ({errno})",
                grant.path
            );
            Refusal::with(Status::not_found, reason)
        })
    }

    /// Opens `target` with `flags`, never leaving its grant.
    fn open(&self, target: &Target, flags: OFlag) -> Result<OwnedFd, Refusal> {
        beneath::open_beneath(self.root(&target.grant)?, &target.rest, flags)
            .map_err(|e| self.errno_refusal(&target.grant.path, e))
    }

    /// The directory holding `target` and its name; the grant itself (a directory) is
    /// never replaced or removed.
    fn parent(&self, target: &Target, tool: &str) -> Result<ParentDir, Refusal> {
        let root = self.root(&target.grant)?;
        if target.rest.is_empty() && root.name.is_none() {
            return Err(Refusal::denied(
                &self.gate.run_id,
                format!(
                    "{tool} never acts on a granted directory itself ({})",
                    target.grant.path
                ),
            ));
        }
        beneath::parent_beneath(root, &target.rest)
            .map_err(|e| self.errno_refusal(&target.grant.path, e))
    }

    /// `target`, checked to be under a write grant.
    fn writable_target(&self, path: &str, tool: &str) -> Result<Target, Refusal> {
        let target = self
            .target(path, "write")
            .map_err(|reason| Refusal::denied(&self.gate.run_id, reason))?;
        if !target.grant.writable {
            return Err(Refusal::denied(
                &self.gate.run_id,
                format!(
                    "{tool} needs a write grant and {} is granted read-only (missing grant: fs write on {path})",
                    target.grant.path
                ),
            ));
        }
        Ok(target)
    }

    fn errno_refusal(&self, grant: &str, errno: Errno) -> Refusal {
        let reason = match errno {
            Errno::EXDEV => format!("the path escapes its grant {grant}"),
            Errno::ELOOP => {
                "a symbolic link is on the path; symbolic links are never followed".to_owned()
            }
            Errno::ENOTDIR => "not a directory (symbolic links are never followed)".to_owned(),
            Errno::ESTALE => "the file changed while it was being checked; try again".to_owned(),
            Errno::ENOTEMPTY => {
                return Refusal::with(
                    Status::failed_precondition,
                    "the directory is not empty (fs.delete never removes recursively)".into(),
                )
            }
            Errno::EEXIST => {
                return Refusal::with(
                    Status::already_exists,
                    "the file exists (mode create never replaces a file)".into(),
                )
            }
            Errno::ENOENT => {
                return Refusal::with(Status::not_found, "no such file or directory".into())
            }
            other => format!("cannot open it: {other}"),
        };
        Refusal::denied(&self.gate.run_id, reason)
    }

    fn read(&self, made: u64, request: &pb::FsReadRequest) -> Result<ToolResult, Refusal> {
        let target = self
            .target(&request.path, "read")
            .map_err(|reason| Refusal::denied(&self.gate.run_id, reason))?;
        self.gate.charge(made)?;
        let path_fd = self.open(&target, OFlag::O_PATH)?;
        let stat = fstat(&path_fd).map_err(|e| self.errno_refusal(&target.grant.path, e))?;
        if kind_of(&stat) != pb::FileKind::File {
            return Err(Refusal::denied(
                &self.gate.run_id,
                "not a regular file (devices, FIFOs, sockets and symbolic links are never opened)"
                    .into(),
            ));
        }
        // The same inode that was checked: no check-then-open race.
        let fd = reopen(&path_fd, OFlag::O_RDONLY)
            .map_err(|e| self.errno_refusal(&target.grant.path, e))?;
        let size = u64::try_from(stat.st_size).unwrap_or(0);
        let wanted = if request.length == 0 {
            MAX_READ
        } else {
            request.length.min(MAX_READ)
        };
        let len = usize::try_from(wanted.min(size.saturating_sub(request.offset))).unwrap_or(0);
        let mut data = vec![0u8; len];
        let mut filled = 0;
        while filled < len {
            let at = i64::try_from(request.offset + filled as u64).unwrap_or(i64::MAX);
            match nix::sys::uio::pread(&fd, &mut data[filled..], at) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(self.errno_refusal(&target.grant.path, e)),
            }
        }
        data.truncate(filled);
        let eof = request.offset + filled as u64 >= size;
        Ok(ToolResult::FsRead(pb::FsReadResponse { data, size, eof }))
    }

    fn list(&self, made: u64, request: &pb::FsListRequest) -> Result<ToolResult, Refusal> {
        let target = self
            .target(&request.path, "read")
            .map_err(|reason| Refusal::denied(&self.gate.run_id, reason))?;
        self.gate.charge(made)?;
        // O_DIRECTORY fails on anything else before a FIFO or device could be opened.
        let fd = self.open(&target, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
        let mut dir =
            nix::dir::Dir::from_fd(fd).map_err(|e| self.errno_refusal(&target.grant.path, e))?;
        let mut names = Vec::new();
        let mut truncated = false;
        for entry in dir.iter() {
            let entry = entry.map_err(|e| self.errno_refusal(&target.grant.path, e))?;
            let name = entry.file_name().to_owned();
            if name.as_bytes() == b"." || name.as_bytes() == b".." {
                continue;
            }
            if names.len() == MAX_LIST {
                truncated = true;
                break;
            }
            names.push(name);
        }
        let mut entries = Vec::with_capacity(names.len());
        for name in names {
            // Relative to the directory itself, never following a link.
            if let Ok(stat) = nix::sys::stat::fstatat(
                dir.as_fd(),
                name.as_c_str(),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            ) {
                entries.push(info(name.to_string_lossy().into_owned(), &stat));
            }
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(ToolResult::FsList(pb::FsListResponse {
            entries,
            truncated,
        }))
    }

    fn stat(&self, made: u64, request: &pb::FsStatRequest) -> Result<ToolResult, Refusal> {
        let target = self
            .target(&request.path, "read")
            .map_err(|reason| Refusal::denied(&self.gate.run_id, reason))?;
        self.gate.charge(made)?;
        let fd = self.open(&target, OFlag::O_PATH)?;
        let stat = fstat(&fd).map_err(|e| self.errno_refusal(&target.grant.path, e))?;
        let name = Path::new(&request.path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(ToolResult::FsStat(pb::FsStatResponse {
            info: Some(info(name, &stat)),
        }))
    }

    fn write(
        &self,
        made: u64,
        call_id: &str,
        request: &pb::FsWriteRequest,
    ) -> Result<Step<'_>, Refusal> {
        let target = self.writable_target(&request.path, "fs.write")?;
        self.gate.charge(made)?;
        if request.data.len() > MAX_WRITE {
            return Err(Refusal::with(
                Status::invalid_argument,
                format!("at most {MAX_WRITE} bytes per fs.write; write the rest with mode append"),
            ));
        }
        let mode = match pb::WriteMode::try_from(request.mode) {
            Ok(pb::WriteMode::Unspecified) => pb::WriteMode::Overwrite,
            Ok(mode) => mode,
            Err(_) => {
                return Err(Refusal::with(
                    Status::invalid_argument,
                    format!("unknown write mode {}", request.mode),
                ))
            }
        };
        let errno = |e| self.errno_refusal(&target.grant.path, e);
        let parent = self.parent(&target, "fs.write")?;
        let existing = parent.entry().map_err(errno)?;
        if let Some(stat) = &existing {
            if !beneath::is_regular(stat) {
                return Err(Refusal::denied(
                    &self.gate.run_id,
                    "not a regular file (only regular files are written; devices, FIFOs, \
                     sockets and symbolic links are never opened)"
                        .into(),
                ));
            }
            if mode == pb::WriteMode::Create {
                return Err(errno(Errno::EEXIST));
            }
        }
        let old = existing
            .as_ref()
            .map(|stat| parent.open_existing(stat))
            .transpose()
            .map_err(errno)?;
        let owner = match &existing {
            // New content never keeps set-uid/set-gid bits (as a write by anyone but root
            // would clear them): the agent's bytes must not become a privileged program.
            Some(stat) => Ownership {
                uid: stat.st_uid,
                gid: stat.st_gid,
                mode: stat.st_mode & 0o1777,
            },
            // A new file belongs to whoever owns its directory (the grant's owner, not the
            // supervisor's root).
            None => {
                let dir = fstat(&parent.fd).map_err(errno)?;
                Ownership {
                    uid: dir.st_uid,
                    gid: dir.st_gid,
                    mode: 0o644,
                }
            }
        };
        self.snapshot(
            call_id,
            "fs.write",
            &target,
            &request.path,
            existing.as_ref(),
            old.as_ref(),
        )?;
        // An append continues the content as it was snapshotted.
        let prefix = match (mode, &old, &existing) {
            (pb::WriteMode::Append, Some(old), Some(stat)) => {
                Some((old, u64::try_from(stat.st_size).unwrap_or(0)))
            }
            _ => None,
        };
        let staged = beneath::stage(
            parent,
            &format!("write-{call_id}"),
            prefix,
            &request.data,
            owner,
        )
        .map_err(errno)?;
        let existed = existing.is_some();
        let grant = target.grant.path.clone();
        Ok(Step::Change(Box::new(move || {
            let size = staged.size;
            // A file that did not exist must still not: one created since is not clobbered.
            staged
                .commit(!existed)
                .map_err(|e| self.errno_refusal(&grant, e))?;
            Ok(ToolResult::FsWrite(pb::FsWriteResponse { size, existed }))
        })))
    }

    fn delete(
        &self,
        made: u64,
        call_id: &str,
        request: &pb::FsDeleteRequest,
    ) -> Result<Step<'_>, Refusal> {
        let target = self.writable_target(&request.path, "fs.delete")?;
        self.gate.charge(made)?;
        let errno = |e| self.errno_refusal(&target.grant.path, e);
        if target.rest.is_empty() {
            return Err(Refusal::denied(
                &self.gate.run_id,
                format!(
                    "fs.delete never removes a grant itself ({})",
                    target.grant.path
                ),
            ));
        }
        let parent = self.parent(&target, "fs.delete")?;
        let Some(stat) = parent.entry().map_err(errno)? else {
            return Err(errno(Errno::ENOENT));
        };
        let dir = beneath::is_dir(&stat);
        if !dir && !beneath::is_regular(&stat) {
            return Err(Refusal::denied(
                &self.gate.run_id,
                "not a regular file or directory (symbolic links, devices, FIFOs and sockets \
                 are never removed)"
                    .into(),
            ));
        }
        if !dir {
            let old = parent.open_existing(&stat).map_err(errno)?;
            self.snapshot(
                call_id,
                "fs.delete",
                &target,
                &request.path,
                Some(&stat),
                Some(&old),
            )?;
        }
        let kind = kind_of(&stat);
        let size = u64::try_from(stat.st_size).unwrap_or(0);
        let grant = target.grant.path.clone();
        Ok(Step::Change(Box::new(move || {
            beneath::remove(&parent, dir).map_err(|e| self.errno_refusal(&grant, e))?;
            Ok(ToolResult::FsDelete(pb::FsDeleteResponse {
                kind: kind as i32,
                size,
            }))
        })))
    }

    /// Keeps the file's state before `call_id` changes it.
    fn snapshot(
        &self,
        call_id: &str,
        tool: &str,
        target: &Target,
        path: &str,
        existing: Option<&FileStat>,
        content: Option<&OwnedFd>,
    ) -> Result<(), Refusal> {
        let manifest = SnapshotManifest {
            run_id: self.gate.run_id.clone(),
            call_id: call_id.to_owned(),
            tool: tool.to_owned(),
            path: path.to_owned(),
            grant: target.grant.path.clone(),
            grant_dev: target.grant.root.as_ref().map_or(0, |r| r.dev),
            grant_ino: target.grant.root.as_ref().map_or(0, |r| r.ino),
            rest: target.rest.clone(),
            existed: existing.is_some(),
            size: existing.map_or(0, |s| u64::try_from(s.st_size).unwrap_or(0)),
            uid: existing.map_or(0, |s| s.st_uid),
            gid: existing.map_or(0, |s| s.st_gid),
            mode: existing.map_or(0, |s| s.st_mode & 0o7777),
            taken_at: unix_now(),
        };
        self.snapshots
            .take(&manifest, content)
            .map_err(|e| match e {
                SnapshotError::TooLarge { .. } | SnapshotError::QuotaSpent { .. } => {
                    Refusal::with(Status::failed_precondition, e.to_string())
                }
                e => {
                    tracing::error!(run_id = %self.gate.run_id, call_id, error = %e, "snapshot failed");
                    Refusal::with(
                        Status::internal,
                        "the previous content could not be kept, so nothing was changed".into(),
                    )
                }
            })
    }

    /// What `tool` would do, when the grant it falls under asks for approval; `None` when it
    /// needs none (grants that do not ask; calls the checks refuse anyway).
    pub(crate) fn approval_needed(&self, tool: &Option<Tool>) -> Option<Asked> {
        // Past the budget the call is refused before anything else: no one is asked about it.
        if self.gate.calls_left() == 0 {
            return None;
        }
        if !self
            .grants
            .current()
            .iter()
            .any(|grant| grant.ask || grant.ask_reads)
        {
            return None;
        }
        // A read asks when the most specific grant covering its path asks before reads.
        let read = match tool {
            Some(Tool::FsRead(r)) => Some(("fs.read", &r.path)),
            Some(Tool::FsList(r)) => Some(("fs.list", &r.path)),
            Some(Tool::FsStat(r)) => Some(("fs.stat", &r.path)),
            _ => None,
        };
        if let Some((name, path)) = read {
            let target = self.target(path, "read").ok()?;
            return target
                .grant
                .ask_reads
                .then(|| Asked::new(name, path.clone()));
        }
        let (name, path, bytes, mode) = match tool {
            Some(Tool::FsWrite(r)) => (
                "fs.write",
                &r.path,
                r.data.len() as u64,
                pb::WriteMode::try_from(r.mode).map_or("unknown", |m| m.as_str_name()),
            ),
            Some(Tool::FsDelete(r)) => ("fs.delete", &r.path, 0, ""),
            _ => return None,
        };
        let target = self.writable_target(path, name).ok()?;
        target.grant.ask.then(|| Asked {
            bytes,
            mode: mode.to_owned(),
            ..Asked::new(name, path.clone())
        })
    }

    /// Runs one call: checks, the tool, the audit entry.
    pub(crate) fn call(&self, tool: Option<Tool>) -> Result<pb::CallToolResponse, Status> {
        self.call_as(tool, new_call_id(), Approval::NotAsked)
    }

    /// Runs call `call_id`, which waited for `approval` when its grant asks: approved, it
    /// runs as any call (its entry says who approved); refused, it is counted and audited as
    /// refused.
    pub(crate) fn call_as(
        &self,
        tool: Option<Tool>,
        call_id: String,
        approval: Approval,
    ) -> Result<pb::CallToolResponse, Status> {
        let started = Instant::now();
        let (name, path) = match &tool {
            Some(Tool::FsRead(r)) => ("fs.read", r.path.clone()),
            Some(Tool::FsList(r)) => ("fs.list", r.path.clone()),
            Some(Tool::FsStat(r)) => ("fs.stat", r.path.clone()),
            Some(Tool::FsWrite(r)) => ("fs.write", r.path.clone()),
            Some(Tool::FsDelete(r)) => ("fs.delete", r.path.clone()),
            Some(Tool::Exec(r)) => ("exec", r.argv.first().cloned().unwrap_or_default()),
            None => ("none", String::new()),
        };
        let mut meta: CallMeta = vec![("path", path.into())];
        if let Some(Tool::FsWrite(r)) = &tool {
            meta.push(("bytes", (r.data.len() as i64).into()));
            meta.push((
                "mode",
                pb::WriteMode::try_from(r.mode)
                    .map_or("unknown", |m| m.as_str_name())
                    .into(),
            ));
        }
        let refused = match approval {
            Approval::NotAsked => None,
            Approval::Approved { by } => {
                meta.push(("approved_by", by.into()));
                None
            }
            Approval::Refused(refusal) => Some(refusal),
        };
        let outcome = self
            .gate
            .admit(name)
            .and_then(|made| match (refused, &tool) {
                (Some(refusal), _) => Err(refusal),
                (None, tool) => self.run(made, &call_id, tool),
            });
        match &outcome {
            Ok(Step::Done(ToolResult::FsRead(read))) => {
                meta.push(("bytes", (read.data.len() as i64).into()));
            }
            Ok(Step::Done(ToolResult::FsList(list))) => {
                meta.push(("entries", (list.entries.len() as i64).into()));
            }
            _ => {}
        }
        self.gate
            .finish(name, call_id, started, meta, outcome, false)
    }

    /// The tool itself, once admitted.
    fn run(&self, made: u64, call_id: &str, tool: &Option<Tool>) -> Result<Step<'_>, Refusal> {
        match tool {
            Some(Tool::FsRead(request)) => self.read(made, request).map(Step::Done),
            Some(Tool::FsList(request)) => self.list(made, request).map(Step::Done),
            Some(Tool::FsStat(request)) => self.stat(made, request).map(Step::Done),
            Some(Tool::FsWrite(request)) => self.write(made, call_id, request),
            Some(Tool::FsDelete(request)) => self.delete(made, call_id, request),
            Some(Tool::Exec(_)) => Err(Refusal::with(
                Status::internal,
                "exec is served asynchronously".into(),
            )),
            None => Err(Refusal::with(
                Status::invalid_argument,
                "no tool given".into(),
            )),
        }
    }
}
