//! The gateway: the only way out of a sandbox, checked against the receipt on every call.
//!
//! Each run gets its own Unix socket (`<runs>/<run_id>/gateway.sock`, owned by the run's host
//! id, mode 0600), bound before the sandbox is sent its plan and shown only inside that
//! sandbox at `/run/tollgate/gateway.sock`. The server on that socket serves exactly that run:
//! the run is known from the socket that accepted the connection, never from anything the
//! agent sends (the peer's uid must also be the run's host id).
//!
//! Every call is checked in this order: the run is still alive, the receipt has not expired
//! (by this host's clock) and is not revoked, the tool is granted, the target is in scope,
//! the tool-call budget is not spent. A refusal is `PERMISSION_DENIED` naming the receipt and
//! the missing grant. Every call, allowed or not, gets a call id (in the response, or in the
//! `tollgate-call-id` metadata of a refusal) and a `tool_call` audit entry with metadata only.
//!
//! Paths are host paths beneath one of the receipt's fs grants. They are resolved with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` from the grant's
//! directory, so no `..`, absolute path or symbolic link (planted or swapped in between calls)
//! leads out of it, and the file that was checked is the file that is read (the `O_PATH`
//! descriptor is reopened through `/proc/self/fd`). Devices, FIFOs, sockets and symbolic links
//! are never opened.

use std::collections::BTreeSet;
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{fstat, FileStat, Mode, SFlag};
use tollgate_audit::{AuditLog, Decision, EntryDraft, EntryKind, MetaValue};
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::call_tool_request::Tool;
use tollgate_proto::v1::call_tool_response::Result as ToolResult;
use tollgate_proto::v1::gateway_server::Gateway;
use tollgate_receipt::paths::{is_normal_absolute, path_within};
use tollgate_receipt::unix_now;
use tollgate_serve::{RequestLimits, ServeLimits};
use tollgate_shim_protocol::protocol::AgentExit;
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status};

use crate::beneath::{self, GrantRoot, Ownership, ParentDir};
use crate::children::ChildState;
use crate::complete::{CompleteStream, RunModels};
use crate::exec::{ExecError, ExecSandbox};
use crate::runs::COMPONENT;
use crate::snapshot::{SnapshotError, SnapshotManifest, SnapshotStore};

/// Most bytes one `fs.read` returns (read on with `offset`).
pub const MAX_READ: u64 = 1 << 20;
/// Most entries one `fs.list` returns.
pub const MAX_LIST: usize = 10_000;
/// Most bytes one `fs.write` carries (one atomic change).
pub const MAX_WRITE: usize = tollgate_shim_protocol::plan::MAX_WRITE_BYTES;
/// Most bytes of stdin one `exec` carries.
pub const MAX_STDIN: usize = (4 << 20) - 4096;
/// Longest path (a host path, a `cwd`, a mount target, a workdir) an agent may send:
/// `PATH_MAX`. A longer one is refused as such, before anything looks at it.
pub const MAX_PATH: usize = 4096;
/// Most items of an argv (or of an exec list, a child's grants, its environment).
pub const MAX_ITEMS: usize = 256;
/// Most bytes of an argv (or an environment) altogether.
pub const MAX_ARGV_BYTES: usize = 64 << 10;
/// Longest name or id an agent may send (route names, run and receipt ids, a subject).
pub const MAX_NAME: usize = 256;
/// Longest free text an agent may send (a stop reason).
pub const MAX_REASON: usize = 1024;
/// Once a run is spent (budget or audit quota), its refusals are summarised: one entry for
/// the first of each window this long, one summary entry (with a count) for the rest.
pub const SUMMARY_WINDOW: Duration = Duration::from_secs(1);
/// Least and most audit bytes one run may make the supervisor write (see [`audit_quota`]).
pub const MIN_AUDIT_QUOTA: u64 = 16 << 20;
/// See [`MIN_AUDIT_QUOTA`].
pub const MAX_AUDIT_QUOTA: u64 = 1 << 30;

/// The audit bytes a run with a budget of `max_calls` may cause: 4 KiB a call, at least
/// [`MIN_AUDIT_QUOTA`] and at most [`MAX_AUDIT_QUOTA`]. Past it every call is refused.
pub fn audit_quota(max_calls: u64) -> u64 {
    max_calls
        .saturating_mul(4096)
        .clamp(MIN_AUDIT_QUOTA, MAX_AUDIT_QUOTA)
}

/// What an agent sends, bounded field by field before anything checks, uses or audits it.
pub(crate) trait AgentInput {
    /// The first field over its bound, as a one-line reason.
    fn bound(&self) -> Result<(), String>;
}

fn text(field: &str, value: &str, max: usize) -> Result<(), String> {
    if value.len() > max {
        return Err(format!(
            "{field} is {} bytes; at most {max} are accepted",
            value.len()
        ));
    }
    Ok(())
}

fn list<'a>(
    field: &str,
    values: impl ExactSizeIterator<Item = &'a str>,
    each: usize,
) -> Result<(), String> {
    if values.len() > MAX_ITEMS {
        return Err(format!(
            "{field} has {} items; at most {MAX_ITEMS} are accepted",
            values.len()
        ));
    }
    let mut total = 0;
    for (i, value) in values.enumerate() {
        text(&format!("{field}[{i}]"), value, each)?;
        total += value.len();
    }
    if total > MAX_ARGV_BYTES {
        return Err(format!(
            "{field} is {total} bytes in all; at most {MAX_ARGV_BYTES} are accepted"
        ));
    }
    Ok(())
}

impl AgentInput for pb::CallToolRequest {
    fn bound(&self) -> Result<(), String> {
        match &self.tool {
            Some(Tool::FsRead(r)) => text("path", &r.path, MAX_PATH),
            Some(Tool::FsList(r)) => text("path", &r.path, MAX_PATH),
            Some(Tool::FsStat(r)) => text("path", &r.path, MAX_PATH),
            Some(Tool::FsWrite(r)) => text("path", &r.path, MAX_PATH),
            Some(Tool::FsDelete(r)) => text("path", &r.path, MAX_PATH),
            Some(Tool::Exec(r)) => {
                list("argv", r.argv.iter().map(String::as_str), MAX_ARGV_BYTES)?;
                text("cwd", &r.cwd, MAX_PATH)
            }
            None => Ok(()),
        }
    }
}

impl AgentInput for pb::DelegateRequest {
    fn bound(&self) -> Result<(), String> {
        let Some(spec) = &self.child else {
            return Ok(());
        };
        text("child.subject", &spec.subject, MAX_NAME)?;
        if let Some(agent) = &spec.agent {
            list(
                "child.agent.argv",
                agent.argv.iter().map(String::as_str),
                MAX_ARGV_BYTES,
            )?;
            let env: Vec<&str> = agent
                .env
                .iter()
                .flat_map(|(k, v)| [k.as_str(), v.as_str()])
                .collect();
            list("child.agent.env", env.into_iter(), MAX_ARGV_BYTES)?;
            text("child.agent.workdir", &agent.workdir, MAX_PATH)?;
        }
        list(
            "child.fs",
            spec.fs
                .iter()
                .flat_map(|g| [g.path.as_str(), g.mount.as_str()])
                .collect::<Vec<_>>()
                .into_iter(),
            MAX_PATH,
        )?;
        list("child.exec", spec.exec.iter().map(String::as_str), MAX_PATH)?;
        list(
            "child.routes",
            spec.routes.iter().map(|r| r.name.as_str()),
            MAX_NAME,
        )
    }
}

impl AgentInput for pb::StartChildRequest {
    fn bound(&self) -> Result<(), String> {
        text("receipt_id", &self.receipt_id, MAX_NAME)?;
        list("argv", self.argv.iter().map(String::as_str), MAX_ARGV_BYTES)
    }
}

impl AgentInput for pb::WatchChildRequest {
    fn bound(&self) -> Result<(), String> {
        text("run_id", &self.run_id, MAX_NAME)
    }
}

impl AgentInput for pb::StopChildRequest {
    fn bound(&self) -> Result<(), String> {
        text("run_id", &self.run_id, MAX_NAME)?;
        text("reason", &self.reason, MAX_REASON)
    }
}

impl AgentInput for pb::CompleteRequest {
    fn bound(&self) -> Result<(), String> {
        text("route", &self.route, MAX_NAME)?;
        // Message text is bounded by the call's own limits and never audited.
        for (i, message) in self.messages.iter().enumerate() {
            text(&format!("messages[{i}].role"), &message.role, MAX_NAME)?;
        }
        Ok(())
    }
}

/// What a run has made the supervisor's audit log hold, and the refusals it is summarising.
#[derive(Debug, Default)]
pub struct AuditUse {
    /// Bytes of entries this run's calls have caused.
    pub bytes: AtomicU64,
    window: Mutex<Option<RefusalWindow>>,
}

/// Refusals of a spent run in one [`SUMMARY_WINDOW`], not yet written.
#[derive(Debug)]
struct RefusalWindow {
    opened: Instant,
    count: u64,
    first_call: String,
    last_call: String,
    tools: BTreeSet<String>,
    reason: String,
}

/// One fs grant as the gateway uses it.
#[derive(Debug)]
pub struct FsGrant {
    /// The granted host path (absolute, normalised).
    pub path: String,
    /// Whether writes are granted (the read tools need only a read grant).
    pub writable: bool,
    /// The granted path, pinned when the run started (or why it could not be).
    pub root: Result<GrantRoot, Errno>,
}

impl FsGrant {
    /// The grant of `path`, pinned now: call before the agent exists.
    pub fn open(path: &str, writable: bool) -> Self {
        Self {
            path: path.to_owned(),
            writable,
            root: GrantRoot::open(path),
        }
    }
}

/// What the gateway of one run knows and counts.
pub struct RunGateway {
    /// The run (= receipt) id.
    pub run_id: String,
    /// The run's host uid/gid: the only peer allowed on the socket.
    pub host_id: u32,
    /// The receipt, for `GetRunReceipt`.
    pub receipt: pb::Receipt,
    /// Unix seconds; no call is served at or after it.
    pub expires_at: i64,
    /// The receipt's fs grants.
    pub grants: Vec<FsGrant>,
    /// The receipt's tool-call budget.
    pub max_calls: u64,
    /// Set when the run is being torn down: no call is served from then on.
    pub closing: Arc<AtomicBool>,
    /// Whether the receipt has been revoked (asked on every call).
    pub is_revoked: Arc<dyn Fn(&str) -> bool + Send + Sync>,
    /// Where every call is recorded.
    pub audit: AuditLog,
    /// Calls made so far (allowed or not), plus the calls handed on to children: one counter,
    /// so a call and a carve can never both take the budget's last call.
    pub calls: AtomicU64,
    /// The last call's id, for the teardown report.
    pub last_call: Mutex<Option<String>>,
    /// Where `fs.write` and `fs.delete` keep what they change.
    pub snapshots: SnapshotStore,
    /// How `exec` reaches the sandbox; `None`: no exec (e.g. the sandbox is not started by
    /// a shim this gateway knows).
    pub exec: Option<Arc<ExecSandbox>>,
    /// The run's model calls (its token budget); `None`: the supervisor has no routes.
    pub models: Option<Arc<RunModels>>,
    /// Delegation: the run's envelope, the supervisor link, child budgets and receipts.
    pub children: ChildState,
    /// The audit bytes this run caused (held to [`audit_quota`]) and its summarised refusals.
    pub audit_use: AuditUse,
}

impl std::fmt::Debug for RunGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunGateway")
            .field("run_id", &self.run_id)
            .finish_non_exhaustive()
    }
}

/// Why a call was refused: what to tell the agent and what the audit entry says.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) status: Status,
    pub(crate) reason: String,
    /// The call was allowed and went wrong while it ran (recorded as allowed, with why).
    ran: bool,
    /// A stable code for the audit entry (`grant_escapes`, `children_limits`, ...), when the
    /// refusal has one.
    pub(crate) code: Option<&'static str>,
}

impl Refusal {
    /// How the call is recorded: allowed when it ran (and went wrong), else denied.
    pub(crate) fn decision(&self) -> Decision {
        if self.ran {
            Decision::Allow
        } else {
            Decision::Deny
        }
    }

    /// The status the agent gets, with the call id in its metadata.
    pub(crate) fn into_status(self, call_id: &str) -> Status {
        let mut status = self.status;
        if let Ok(value) = call_id.parse() {
            status.metadata_mut().insert("tollgate-call-id", value);
        }
        status
    }

    /// A refusal with its own status (whose message the agent sees) and audit reason.
    pub(crate) fn new(status: Status, reason: String) -> Self {
        Self {
            status,
            reason,
            ran: false,
            code: None,
        }
    }

    /// The same refusal, carrying `code` for the audit entry.
    pub(crate) fn coded(self, code: &'static str) -> Self {
        Self {
            code: Some(code),
            ..self
        }
    }

    pub(crate) fn denied(run_id: &str, reason: String) -> Self {
        Self {
            status: Status::permission_denied(format!("receipt {run_id}: {reason}")),
            reason,
            ran: false,
            code: None,
        }
    }

    pub(crate) fn with(status: fn(String) -> Status, reason: String) -> Self {
        Self {
            status: status(reason.clone()),
            reason,
            ran: false,
            code: None,
        }
    }
}

/// What a tool decided: a result now, or a change to make once its audit entry is on disk.
enum Step<'a> {
    Done(ToolResult),
    Change(Box<dyn FnOnce() -> Result<ToolResult, Refusal> + Send + 'a>),
}

/// Metadata an audit entry of a call carries (never data).
pub(crate) type CallMeta = Vec<(&'static str, MetaValue)>;

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
struct Target<'a> {
    grant: &'a FsGrant,
    rest: String,
}

impl RunGateway {
    /// The grant `path` falls under (the most specific one), or why none does (naming the
    /// `access` the call needed).
    fn target<'a>(&'a self, path: &str, access: &str) -> Result<Target<'a>, String> {
        if !is_normal_absolute(path) {
            return Err(format!(
                "{path:?} is not a normalised absolute host path (no '..', '.' or '//')"
            ));
        }
        let grant = self
            .grants
            .iter()
            .filter(|g| path_within(path, &g.path))
            .max_by_key(|g| g.path.len())
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
    fn open(&self, target: &Target<'_>, flags: OFlag) -> Result<OwnedFd, Refusal> {
        beneath::open_beneath(self.root(target.grant)?, &target.rest, flags)
            .map_err(|e| self.errno_refusal(&target.grant.path, e))
    }

    /// The directory holding `target` and its name; the grant itself (a directory) is
    /// never replaced or removed.
    fn parent(&self, target: &Target<'_>, tool: &str) -> Result<ParentDir, Refusal> {
        let root = self.root(target.grant)?;
        if target.rest.is_empty() && root.name.is_none() {
            return Err(Refusal::denied(
                &self.run_id,
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
    fn writable_target<'a>(&'a self, path: &str, tool: &str) -> Result<Target<'a>, Refusal> {
        let target = self
            .target(path, "write")
            .map_err(|reason| Refusal::denied(&self.run_id, reason))?;
        if !target.grant.writable {
            return Err(Refusal::denied(
                &self.run_id,
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
        Refusal::denied(&self.run_id, reason)
    }

    /// The checks every call passes before its tool runs.
    pub(crate) fn admit(&self, tool: &str) -> Result<u64, Refusal> {
        // Every call counts, refused or not, whatever refuses it.
        let made = self.calls.fetch_add(1, Ordering::SeqCst);
        let quota = audit_quota(self.max_calls);
        if self.audit_use.bytes.load(Ordering::SeqCst) >= quota {
            return Err(Refusal::denied(
                &self.run_id,
                format!("the run's audit quota ({quota} bytes) is spent"),
            ));
        }
        // Past the budget nothing else is looked at (`child.stop` is not held to it: a run
        // must still be able to stop what it started).
        if tool != "child.stop" {
            self.charge(made)?;
        }
        if self.closing.load(Ordering::SeqCst) {
            return Err(Refusal::denied(&self.run_id, "the run is ending".into()));
        }
        let now = unix_now();
        if now >= self.expires_at {
            return Err(Refusal::denied(
                &self.run_id,
                format!("the receipt expired at unix {}", self.expires_at),
            ));
        }
        if (self.is_revoked)(&self.run_id) {
            return Err(Refusal::denied(
                &self.run_id,
                "the receipt was revoked".into(),
            ));
        }
        if tool == "exec" && self.receipt.exec.is_empty() {
            return Err(Refusal::denied(
                &self.run_id,
                "exec needs an exec grant and the receipt has none".into(),
            ));
        }
        if tool.starts_with("fs.") && self.grants.is_empty() {
            return Err(Refusal::denied(
                &self.run_id,
                format!("{tool} needs an fs grant and the receipt has none"),
            ));
        }
        Ok(made)
    }

    /// Whether the run is spent: its tool-call budget or its audit quota is used up. Its
    /// refusals are then summarised, not written one by one.
    fn spent(&self) -> bool {
        self.calls.load(Ordering::SeqCst) > self.max_calls
            || self.audit_use.bytes.load(Ordering::SeqCst) >= audit_quota(self.max_calls)
    }

    /// A refusal of a spent run: counted into the current window (no entry) and `true`, or,
    /// for the first refusal of a window, the closed window's summary written and `false`
    /// (the caller writes this one's own entry). Not spent: `false`.
    pub(crate) fn summarised(
        &self,
        tool: &str,
        call_id: &str,
        reason: &str,
    ) -> Result<bool, Status> {
        if !self.spent() {
            return Ok(false);
        }
        *self.last_call.lock().unwrap_or_else(|p| p.into_inner()) = Some(call_id.to_owned());
        let mut window = self
            .audit_use
            .window
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(open) = window.as_mut() {
            if open.opened.elapsed() < SUMMARY_WINDOW {
                open.count += 1;
                call_id.clone_into(&mut open.last_call);
                if open.tools.len() < 16 {
                    open.tools.insert(tool.to_owned());
                }
                return Ok(true);
            }
        }
        let closed = window.replace(RefusalWindow {
            opened: Instant::now(),
            count: 0,
            first_call: String::new(),
            last_call: String::new(),
            tools: BTreeSet::new(),
            reason: reason.to_owned(),
        });
        drop(window);
        if let Some(closed) = closed {
            self.write_summary(closed)?;
        }
        Ok(false)
    }

    /// Writes the summary of the refusals still being counted (at teardown).
    pub fn flush_refusals(&self) {
        let open = self
            .audit_use
            .window
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(open) = open {
            if let Err(e) = self.write_summary(open) {
                tracing::error!(run_id = %self.run_id, error = %e.message(), "could not audit refused calls");
            }
        }
    }

    fn write_summary(&self, window: RefusalWindow) -> Result<(), Status> {
        if window.count == 0 {
            return Ok(());
        }
        let entry = EntryDraft::new(COMPONENT, EntryKind::ToolCall)
            .receipt(self.run_id.as_str())
            .run(self.run_id.as_str())
            .decision(Decision::Deny)
            .reason(format!(
                "{} more calls refused within {} ms (the run is spent: {})",
                window.count,
                window.opened.elapsed().as_millis(),
                window.reason
            ))
            .meta("tool", "(refused calls)")
            .meta(
                "refused_calls",
                i64::try_from(window.count).unwrap_or(i64::MAX),
            )
            .meta("first_call_id", window.first_call)
            .meta("last_call_id", window.last_call)
            .meta("tools", window.tools.into_iter().collect::<Vec<_>>());
        self.audited(entry, false)
    }

    /// Writes one of this run's entries, counting its bytes against the run's audit quota.
    /// An entry the log cannot take now refuses the call (`UNAVAILABLE`).
    pub(crate) fn audited(&self, entry: EntryDraft, durable: bool) -> Result<(), Status> {
        let written = if durable {
            self.audit.append(entry)
        } else {
            self.audit.record(entry)
        };
        match written {
            Ok(appended) => {
                self.audit_use
                    .bytes
                    .fetch_add(appended.bytes, Ordering::SeqCst);
                Ok(())
            }
            Err(e) => {
                tracing::error!(run_id = %self.run_id, error = %e, "could not audit a call");
                Err(Status::unavailable(
                    "the audit log is unavailable; nothing is done unaudited",
                ))
            }
        }
    }

    /// A call whose request has a field over its bound: counted, refused with a one-line
    /// reason and audited (small: no field of the request is in the entry).
    pub(crate) fn refuse_input(&self, tool: &str, problem: String) -> Status {
        let started = Instant::now();
        let call_id = uuid::Uuid::now_v7().hyphenated().to_string();
        let refusal = match self.admit(tool) {
            Err(refusal) => refusal,
            Ok(_) => Refusal::with(Status::invalid_argument, problem),
        };
        match self.record_call(
            tool,
            &call_id,
            started,
            &Vec::new(),
            (refusal.decision(), Some(&refusal.reason)),
            false,
        ) {
            Ok(()) => refusal.into_status(&call_id),
            Err(status) => status,
        }
    }

    /// The last check before a tool acts: the budget left for the call numbered `made`.
    pub(crate) fn charge(&self, made: u64) -> Result<(), Refusal> {
        // `calls` also counts the calls handed on to children (delegation).
        if made >= self.max_calls {
            return Err(Refusal::denied(
                &self.run_id,
                format!("the tool-call budget ({} calls) is spent", self.max_calls),
            ));
        }
        Ok(())
    }

    fn read(&self, made: u64, request: &pb::FsReadRequest) -> Result<ToolResult, Refusal> {
        let target = self
            .target(&request.path, "read")
            .map_err(|reason| Refusal::denied(&self.run_id, reason))?;
        self.charge(made)?;
        let path_fd = self.open(&target, OFlag::O_PATH)?;
        let stat = fstat(&path_fd).map_err(|e| self.errno_refusal(&target.grant.path, e))?;
        if kind_of(&stat) != pb::FileKind::File {
            return Err(Refusal::denied(
                &self.run_id,
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
            .map_err(|reason| Refusal::denied(&self.run_id, reason))?;
        self.charge(made)?;
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
            .map_err(|reason| Refusal::denied(&self.run_id, reason))?;
        self.charge(made)?;
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
        self.charge(made)?;
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
                    &self.run_id,
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
        self.charge(made)?;
        let errno = |e| self.errno_refusal(&target.grant.path, e);
        if target.rest.is_empty() {
            return Err(Refusal::denied(
                &self.run_id,
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
                &self.run_id,
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
        target: &Target<'_>,
        path: &str,
        existing: Option<&FileStat>,
        content: Option<&OwnedFd>,
    ) -> Result<(), Refusal> {
        let manifest = SnapshotManifest {
            run_id: self.run_id.clone(),
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
                    tracing::error!(run_id = %self.run_id, call_id, error = %e, "snapshot failed");
                    Refusal::with(
                        Status::internal,
                        "the previous content could not be kept, so nothing was changed".into(),
                    )
                }
            })
    }

    /// Checks an `exec` call and takes one of the run's command slots.
    fn exec_admit(
        &self,
        made: u64,
        request: &pb::ExecRequest,
    ) -> Result<(Arc<ExecSandbox>, crate::exec::ExecSlot), Refusal> {
        let Some(program) = request.argv.first() else {
            return Err(Refusal::with(
                Status::invalid_argument,
                "exec needs argv (the executable's absolute path first)".into(),
            ));
        };
        if !self.receipt.exec.iter().any(|granted| granted == program) {
            return Err(Refusal::denied(
                &self.run_id,
                format!("exec of {program} is not granted (missing grant: exec {program})"),
            ));
        }
        self.charge(made)?;
        if !request.cwd.is_empty() && !is_normal_absolute(&request.cwd) {
            return Err(Refusal::with(
                Status::invalid_argument,
                format!(
                    "cwd {:?} is not a normalised absolute path in the sandbox",
                    request.cwd
                ),
            ));
        }
        if request.stdin.len() > MAX_STDIN {
            return Err(Refusal::with(
                Status::invalid_argument,
                format!("at most {MAX_STDIN} bytes of stdin per exec"),
            ));
        }
        let Some(sandbox) = self.exec.clone() else {
            return Err(Refusal::with(
                Status::unavailable,
                "exec is not available for this run".into(),
            ));
        };
        let slot = sandbox.slot().ok_or_else(|| {
            Refusal::with(
                Status::resource_exhausted,
                format!(
                    "{} commands are already running for this run; wait for one to end",
                    sandbox.limits.concurrent
                ),
            )
        })?;
        Ok((sandbox, slot))
    }

    /// Runs an `exec` call: checks, the command in the sandbox, the audit entry.
    async fn exec_call(
        self: &Arc<Self>,
        request: pb::ExecRequest,
    ) -> Result<pb::CallToolResponse, Status> {
        // On its own task: a client that goes away cancels its request, never the command's
        // time limit or its audit entry.
        let run = self.clone();
        tokio::spawn(async move { run.exec_to_the_end(request).await })
            .await
            .unwrap_or_else(|e| Err(Status::internal(format!("exec failed: {e}"))))
    }

    /// [`RunGateway::exec_call`]'s work.
    async fn exec_to_the_end(
        self: &Arc<Self>,
        request: pb::ExecRequest,
    ) -> Result<pb::CallToolResponse, Status> {
        let started = Instant::now();
        let call_id = uuid::Uuid::now_v7().hyphenated().to_string();
        let mut meta: CallMeta = vec![
            (
                "path",
                request.argv.first().cloned().unwrap_or_default().into(),
            ),
            ("argv", request.argv.clone().into()),
            ("stdin_bytes", (request.stdin.len() as i64).into()),
        ];
        let admitted = self
            .admit("exec")
            .and_then(|made| self.exec_admit(made, &request));
        let outcome = match admitted {
            Err(refusal) => Err(refusal),
            Ok((sandbox, slot)) => {
                let cwd = if request.cwd.is_empty() {
                    sandbox.plan.agent.cwd.clone()
                } else {
                    PathBuf::from(&request.cwd)
                };
                let timeout = sandbox.timeout_for(request.timeout_ms);
                let ran =
                    crate::exec::run(&sandbox, request.argv, request.stdin, cwd, timeout).await;
                drop(slot);
                match ran {
                    Ok(result) => {
                        let (exit_code, signal) = match result.exit {
                            AgentExit::Code(code) => (Some(code), None),
                            AgentExit::Signal(signal) => (None, Some(signal)),
                        };
                        meta.push(("exit_code", exit_code.map_or(MetaValue::Null, Into::into)));
                        meta.push(("signal", signal.map_or(MetaValue::Null, Into::into)));
                        meta.push(("timed_out", result.timed_out.into()));
                        meta.push(("stdout_bytes", (result.stdout.len() as i64).into()));
                        meta.push(("stderr_bytes", (result.stderr.len() as i64).into()));
                        meta.push(("truncated", result.truncated.into()));
                        Ok(ToolResult::Exec(pb::ExecResponse {
                            exit_code,
                            signal,
                            timed_out: result.timed_out,
                            stdout: result.stdout,
                            stderr: result.stderr,
                            truncated: result.truncated,
                            duration_ms: u64::try_from(result.duration.as_millis())
                                .unwrap_or(u64::MAX),
                        }))
                    }
                    // Never started: nothing ran. Otherwise it may have run: allowed, and why
                    // it has no result.
                    Err(e @ ExecError::NotStarted(_)) => {
                        Err(Refusal::with(Status::failed_precondition, e.to_string()))
                    }
                    Err(e) => Err(Refusal {
                        ran: true,
                        ..Refusal::with(Status::internal, e.to_string())
                    }),
                }
            }
        };
        let run = self.clone();
        // The entry is on disk before the agent hears the result.
        tokio::task::block_in_place(move || {
            run.finish(
                "exec",
                call_id,
                started,
                meta,
                outcome.map(Step::Done),
                true,
            )
        })
    }

    /// Runs one call: checks, the tool, the audit entry.
    fn call(&self, tool: Option<Tool>) -> Result<pb::CallToolResponse, Status> {
        let started = Instant::now();
        let call_id = uuid::Uuid::now_v7().hyphenated().to_string();
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
        let outcome = self.admit(name).and_then(|made| match &tool {
            Some(Tool::FsRead(request)) => self.read(made, request).map(Step::Done),
            Some(Tool::FsList(request)) => self.list(made, request).map(Step::Done),
            Some(Tool::FsStat(request)) => self.stat(made, request).map(Step::Done),
            Some(Tool::FsWrite(request)) => self.write(made, &call_id, request),
            Some(Tool::FsDelete(request)) => self.delete(made, &call_id, request),
            Some(Tool::Exec(_)) => Err(Refusal::with(
                Status::internal,
                "exec is served asynchronously".into(),
            )),
            None => Err(Refusal::with(
                Status::invalid_argument,
                "no tool given".into(),
            )),
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
        self.finish(name, call_id, started, meta, outcome, false)
    }

    /// Audits a call and answers it. A change is made only once its entry is on disk; if it
    /// then fails, a second entry says so. Other entries are on disk before the answer when
    /// `durable`, else written at once and fsynced within a bounded delay.
    fn finish(
        &self,
        tool: &str,
        call_id: String,
        started: Instant,
        meta: CallMeta,
        outcome: Result<Step<'_>, Refusal>,
        durable: bool,
    ) -> Result<pb::CallToolResponse, Status> {
        let record = |decision: Decision, reason: Option<&str>, wait: bool| {
            self.record_call(tool, &call_id, started, &meta, (decision, reason), wait)
        };
        let follow_up = |reason: &str| {
            self.record_follow_up(
                tool,
                &call_id,
                started,
                &meta,
                (Decision::Deny, Some(reason)),
                true,
            )
        };
        let result = match outcome {
            Ok(Step::Done(result)) => {
                record(Decision::Allow, None, durable)?;
                Ok(result)
            }
            Ok(Step::Change(apply)) => {
                record(Decision::Allow, None, true)?;
                let applied = apply();
                if let Err(refusal) = &applied {
                    follow_up(&format!("not done: {}", refusal.reason))?;
                }
                applied
            }
            Err(refusal) => {
                record(refusal.decision(), Some(&refusal.reason), durable)?;
                Err(refusal)
            }
        };
        match result {
            Ok(result) => Ok(pb::CallToolResponse {
                call_id,
                result: Some(result),
            }),
            Err(refusal) => Err(refusal.into_status(&call_id)),
        }
    }

    /// Writes a call's `tool_call` entry. Changes and commands (`durable`): on disk before
    /// anything else happens. Reads and refusals: written at once, fsynced within
    /// tollgate_audit::RECORD_MAX_DELAY (an fsync of their own would double a read's round
    /// trip).
    pub(crate) fn record_call(
        &self,
        tool: &str,
        call_id: &str,
        started: Instant,
        meta: &CallMeta,
        (decision, reason): (Decision, Option<&str>),
        durable: bool,
    ) -> Result<(), Status> {
        if decision == Decision::Deny && self.summarised(tool, call_id, reason.unwrap_or(""))? {
            return Ok(());
        }
        self.record_follow_up(tool, call_id, started, meta, (decision, reason), durable)
    }

    /// Writes a call's entry whatever the run's state: for the second entry of a change
    /// that failed (`not done: …`), which must never be summarised away.
    pub(crate) fn record_follow_up(
        &self,
        tool: &str,
        call_id: &str,
        started: Instant,
        meta: &CallMeta,
        (decision, reason): (Decision, Option<&str>),
        durable: bool,
    ) -> Result<(), Status> {
        let mut entry = EntryDraft::new(COMPONENT, EntryKind::ToolCall)
            .receipt(self.run_id.as_str())
            .run(self.run_id.as_str())
            .call(call_id)
            .meta("tool", tool)
            .meta(
                "duration_us",
                i64::try_from(started.elapsed().as_micros()).unwrap_or(i64::MAX),
            )
            .decision(decision);
        for (key, value) in meta {
            entry = entry.meta(*key, value.clone());
        }
        if let Some(reason) = reason {
            entry = entry.reason(reason);
        }
        let written = self.audited(entry, durable);
        *self.last_call.lock().unwrap_or_else(|p| p.into_inner()) = Some(call_id.to_owned());
        written
    }
}

use beneath::reopen;

use crate::service::RunEventStream;

/// The gRPC service of one run.
#[derive(Debug, Clone)]
pub struct GatewayService {
    run: Arc<RunGateway>,
}

impl GatewayService {
    /// The service for `run`.
    pub fn new(run: Arc<RunGateway>) -> Self {
        Self { run }
    }

    /// The one place every request's agent-given fields are bounded, before any handler
    /// checks, uses or audits them: a request over a bound is refused (and audited small).
    fn bounded<T: AgentInput>(&self, tool: &str, request: &T) -> Result<(), Status> {
        request
            .bound()
            .map_err(|problem| tokio::task::block_in_place(|| self.run.refuse_input(tool, problem)))
    }

    fn check_peer<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let uid = request
            .extensions()
            .get::<UdsConnectInfo>()
            .and_then(|info| info.peer_cred)
            .map(|cred| cred.uid());
        if uid == Some(self.run.host_id) {
            Ok(())
        } else {
            Err(Status::permission_denied(format!(
                "receipt {}: the caller is not this run's sandbox",
                self.run.run_id
            )))
        }
    }
}

#[tonic::async_trait]
impl Gateway for GatewayService {
    async fn get_run_receipt(
        &self,
        request: Request<pb::GetRunReceiptRequest>,
    ) -> Result<Response<pb::GetRunReceiptResponse>, Status> {
        self.check_peer(&request)?;
        Ok(Response::new(pb::GetRunReceiptResponse {
            receipt: Some(self.run.receipt.clone()),
        }))
    }

    type CompleteStream = CompleteStream;

    async fn complete(
        &self,
        request: Request<pb::CompleteRequest>,
    ) -> Result<Response<Self::CompleteStream>, Status> {
        self.check_peer(&request)?;
        self.bounded("model.complete", request.get_ref())?;
        self.run
            .complete(request.into_inner())
            .await
            .map(Response::new)
    }

    async fn call_tool(
        &self,
        request: Request<pb::CallToolRequest>,
    ) -> Result<Response<pb::CallToolResponse>, Status> {
        self.check_peer(&request)?;
        let name = match &request.get_ref().tool {
            Some(Tool::FsRead(_)) => "fs.read",
            Some(Tool::FsList(_)) => "fs.list",
            Some(Tool::FsStat(_)) => "fs.stat",
            Some(Tool::FsWrite(_)) => "fs.write",
            Some(Tool::FsDelete(_)) => "fs.delete",
            Some(Tool::Exec(_)) => "exec",
            None => "none",
        };
        self.bounded(name, request.get_ref())?;
        let tool = request.into_inner().tool;
        if let Some(Tool::Exec(request)) = tool {
            return self.run.exec_call(request).await.map(Response::new);
        }
        // File system work blocks: let the runtime move its other work off this thread.
        tokio::task::block_in_place(|| self.run.call(tool)).map(Response::new)
    }

    async fn delegate(
        &self,
        request: Request<pb::DelegateRequest>,
    ) -> Result<Response<pb::DelegateResponse>, Status> {
        self.check_peer(&request)?;
        self.bounded("delegate", request.get_ref())?;
        // Its own task: a client that hangs up does not cut the call short.
        let run = self.run.clone();
        let request = request.into_inner();
        tokio::spawn(async move { run.delegate(request).await })
            .await
            .map_err(|e| Status::internal(format!("delegate failed: {e}")))?
            .map(Response::new)
    }

    async fn start_child(
        &self,
        request: Request<pb::StartChildRequest>,
    ) -> Result<Response<pb::StartChildResponse>, Status> {
        self.check_peer(&request)?;
        self.bounded("child.start", request.get_ref())?;
        let run = self.run.clone();
        let request = request.into_inner();
        tokio::task::spawn_blocking(move || run.start_child(request))
            .await
            .map_err(|e| Status::internal(format!("child.start failed: {e}")))?
            .map(Response::new)
    }

    async fn list_children(
        &self,
        request: Request<pb::ListChildrenRequest>,
    ) -> Result<Response<pb::RunTree>, Status> {
        self.check_peer(&request)?;
        self.run.list_children().await.map(Response::new)
    }

    type WatchChildStream = RunEventStream;

    async fn watch_child(
        &self,
        request: Request<pb::WatchChildRequest>,
    ) -> Result<Response<Self::WatchChildStream>, Status> {
        self.check_peer(&request)?;
        self.bounded("child.watch", request.get_ref())?;
        let (history, live) = self.run.watch_child(request.into_inner().run_id).await?;
        Ok(Response::new(crate::service::event_stream(history, live)))
    }

    async fn stop_child(
        &self,
        request: Request<pb::StopChildRequest>,
    ) -> Result<Response<pb::StopChildResponse>, Status> {
        self.check_peer(&request)?;
        self.bounded("child.stop", request.get_ref())?;
        let run = self.run.clone();
        let request = request.into_inner();
        tokio::task::spawn_blocking(move || run.stop_child(request))
            .await
            .map_err(|e| Status::internal(format!("child.stop failed: {e}")))?
            .map(Response::new)
    }
}

/// A served gateway socket; stops serving when dropped or stopped.
#[derive(Debug)]
pub struct GatewayHandle {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// The socket's host path.
    pub socket: PathBuf,
}

impl GatewayHandle {
    /// Stops accepting and ends open connections.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for GatewayHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Why a gateway socket could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("gateway socket {path}: {source}")]
pub struct GatewayError {
    /// The socket's path.
    pub path: PathBuf,
    /// The failure.
    pub source: std::io::Error,
}

/// Request bytes one run's gateway holds at once beyond each call's first 64 KiB: one full
/// `fs.write` fits, a second concurrent one waits for the agent to retry.
pub const GATEWAY_IN_FLIGHT: usize = 24 << 20;

/// How long a gateway request's body may take to arrive: a local socket carries 16 MiB in
/// milliseconds, so only a stalled (hostile) client comes near it.
pub const GATEWAY_BODY_DEADLINE: Duration = Duration::from_secs(30);

/// The per-method request caps of a run's gateway: tool calls carry up to one full write,
/// model calls their text, everything else (receipt, delegation, children) is small.
fn gateway_request_limits() -> RequestLimits {
    RequestLimits::builder(256 << 10, GATEWAY_IN_FLIGHT, GATEWAY_BODY_DEADLINE)
        .cap("/tollgate.v1.Gateway/CallTool", MAX_WRITE + (64 << 10))
        .cap(
            "/tollgate.v1.Gateway/Complete",
            2 * crate::complete::MAX_TEXT + (64 << 10),
        )
        .build()
}

/// Binds `<dir>/gateway.sock` for `run` (owned by its host id, 0600) and serves it on
/// `runtime`. The socket accepts (into its backlog) as soon as this returns.
pub fn serve(
    runtime: &tokio::runtime::Handle,
    dir: &Path,
    run: Arc<RunGateway>,
) -> Result<GatewayHandle, GatewayError> {
    let socket = dir.join("gateway.sock");
    let error = |source: std::io::Error| GatewayError {
        path: socket.clone(),
        source,
    };
    // Calls run their file system work with `block_in_place`, which needs worker threads.
    if runtime.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
        return Err(error(std::io::Error::other(
            "the gateway needs a multi-threaded tokio runtime",
        )));
    }
    // Bound through /proc/self/fd: a long data directory must not hit sun_path's 108 bytes.
    let dir_fd = nix::fcntl::open(
        dir,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| error(e.into()))?;
    let short = format!("/proc/self/fd/{}/gateway.sock", dir_fd.as_raw_fd());
    let listener = std::os::unix::net::UnixListener::bind(&short).map_err(error)?;
    nix::unistd::fchownat(
        &dir_fd,
        "gateway.sock",
        Some(nix::unistd::Uid::from_raw(run.host_id)),
        Some(nix::unistd::Gid::from_raw(run.host_id)),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(|e| error(e.into()))?;
    nix::sys::stat::fchmodat(
        &dir_fd,
        "gateway.sock",
        Mode::from_bits_truncate(0o600),
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )
    .map_err(|e| error(e.into()))?;
    listener.set_nonblocking(true).map_err(error)?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = GatewayService::new(run);
    let run_id = service.run.run_id.clone();
    let limits = gateway_request_limits();
    runtime.spawn(async move {
        let listener = match tokio::net::UnixListener::from_std(listener) {
            Ok(listener) => listener,
            Err(e) => {
                tracing::error!(run_id = %run_id, error = %e, "gateway socket unusable");
                return;
            }
        };
        // What the run's agent can make the supervisor hold is bounded here: connections,
        // streams, request bytes and time (see `tollgate_serve`).
        let bounds = ServeLimits::GATEWAY;
        let served = bounds
            .server()
            .layer(limits)
            .add_service(
                pb::gateway_server::GatewayServer::new(service)
                    // A full fs.write and its framing.
                    .max_decoding_message_size(MAX_WRITE + (64 << 10)),
            )
            .serve_with_incoming_shutdown(
                tollgate_serve::incoming(listener, bounds.connections),
                async {
                    let _ = stopped.await;
                },
            )
            .await;
        if let Err(e) = served {
            tracing::warn!(run_id = %run_id, error = %e, "gateway server ended with an error");
        }
    });
    Ok(GatewayHandle {
        stop: Some(stop),
        socket,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixture {
        _dir: tempfile::TempDir,
        grant: PathBuf,
        outside: PathBuf,
        revoked: Arc<AtomicBool>,
        gateway: RunGateway,
    }

    fn fixture(max_calls: u64, expires_in: i64) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let grant = dir.path().join("grant");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(grant.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::create_dir_all(dir.path().join("rw/sub")).unwrap();
        std::fs::create_dir_all(dir.path().join("rw/nested")).unwrap();
        std::fs::write(grant.join("readme.txt"), b"granted bytes").unwrap();
        std::fs::write(grant.join("sub/inner.txt"), b"inner").unwrap();
        std::fs::write(outside.join("secret.txt"), b"host secret").unwrap();
        std::os::unix::fs::symlink(outside.join("secret.txt"), grant.join("link-out")).unwrap();
        std::os::unix::fs::symlink(&outside, grant.join("dir-out")).unwrap();
        nix::unistd::mkfifo(&grant.join("fifo"), Mode::from_bits_truncate(0o644)).unwrap();
        let audit_config = tollgate_audit::AuditConfig::new(
            dir.path().join("audit"),
            "supervisor",
            ed25519_dalek_key(),
            "test",
        );
        let revoked = Arc::new(AtomicBool::new(false));
        let flag = revoked.clone();
        let gateway = RunGateway {
            run_id: "01900000-0000-7000-8000-000000000001".into(),
            host_id: 0,
            receipt: pb::Receipt::default(),
            expires_at: unix_now() + expires_in,
            grants: vec![
                FsGrant::open(&grant.display().to_string(), false),
                FsGrant::open(&dir.path().join("rw").display().to_string(), true),
                // A grant inside another the agent may write.
                FsGrant::open(&dir.path().join("rw/nested").display().to_string(), true),
            ],
            max_calls,
            closing: Arc::default(),
            is_revoked: Arc::new(move |_: &str| flag.load(Ordering::SeqCst)),
            audit: AuditLog::open(audit_config).unwrap(),
            calls: AtomicU64::new(0),
            last_call: Mutex::new(None),
            snapshots: SnapshotStore::new(&dir.path().join("data")),
            exec: None,
            models: None,
            children: Default::default(),
            audit_use: AuditUse::default(),
        };
        Fixture {
            _dir: dir,
            grant,
            outside,
            revoked,
            gateway,
        }
    }

    fn ed25519_dalek_key() -> ed25519_dalek::SigningKey {
        ed25519_dalek::SigningKey::from_bytes(&[9; 32])
    }

    fn read(fx: &Fixture, path: impl AsRef<Path>) -> Result<pb::CallToolResponse, Status> {
        fx.gateway.call(Some(Tool::FsRead(pb::FsReadRequest {
            path: path.as_ref().display().to_string(),
            offset: 0,
            length: 0,
        })))
    }

    fn denied(result: Result<pb::CallToolResponse, Status>, needle: &str) {
        let status = result.expect_err("refused");
        assert!(status.message().contains(needle), "{status:?}");
        assert!(status.metadata().get("tollgate-call-id").is_some());
    }

    #[test]
    fn reads_lists_and_stats_beneath_the_grant() {
        let fx = fixture(100, 600);
        let response = read(&fx, fx.grant.join("readme.txt")).unwrap();
        match response.result {
            Some(ToolResult::FsRead(data)) => {
                assert_eq!(data.data, b"granted bytes");
                assert!(data.eof);
            }
            other => panic!("{other:?}"),
        }
        let listed = fx
            .gateway
            .call(Some(Tool::FsList(pb::FsListRequest {
                path: fx.grant.display().to_string(),
            })))
            .unwrap();
        let Some(ToolResult::FsList(list)) = listed.result else {
            panic!("not a listing")
        };
        let names: Vec<_> = list.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["dir-out", "fifo", "link-out", "readme.txt", "sub"]);
        let link = &list.entries[2];
        assert_eq!(
            link.kind,
            pb::FileKind::Symlink as i32,
            "links are not followed"
        );
        let stat = fx
            .gateway
            .call(Some(Tool::FsStat(pb::FsStatRequest {
                path: fx.grant.join("sub").display().to_string(),
            })))
            .unwrap();
        let Some(ToolResult::FsStat(stat)) = stat.result else {
            panic!("not a stat")
        };
        assert_eq!(stat.info.unwrap().kind, pb::FileKind::Directory as i32);
    }

    #[test]
    fn nothing_outside_the_grant_is_reachable() {
        let fx = fixture(100, 600);
        denied(
            read(&fx, fx.outside.join("secret.txt")),
            "no fs grant covers",
        );
        denied(
            read(&fx, format!("{}/../outside/secret.txt", fx.grant.display())),
            "not a normalised absolute host path",
        );
        denied(read(&fx, fx.grant.join("link-out")), "not a regular file");
        denied(
            read(&fx, fx.grant.join("dir-out/secret.txt")),
            "symbolic link",
        );
        denied(read(&fx, fx.grant.join("fifo")), "not a regular file");
        // A directory swapped for a link between two calls.
        assert!(read(&fx, fx.grant.join("sub/inner.txt")).is_ok());
        std::fs::rename(fx.grant.join("sub"), fx.outside.join("sub")).unwrap();
        std::os::unix::fs::symlink(fx.outside.join("sub"), fx.grant.join("sub")).unwrap();
        denied(read(&fx, fx.grant.join("sub/inner.txt")), "symbolic link");
    }

    #[test]
    fn revocation_expiry_ending_and_the_budget_refuse_calls() {
        let fx = fixture(100, 600);
        assert!(read(&fx, fx.grant.join("readme.txt")).is_ok());
        fx.revoked.store(true, Ordering::SeqCst);
        denied(read(&fx, fx.grant.join("readme.txt")), "revoked");
        let fx = fixture(100, 600);
        fx.gateway.closing.store(true, Ordering::SeqCst);
        denied(read(&fx, fx.grant.join("readme.txt")), "ending");
        let fx = fixture(100, 0);
        denied(read(&fx, fx.grant.join("readme.txt")), "expired");
        let fx = fixture(2, 600);
        assert!(read(&fx, fx.grant.join("readme.txt")).is_ok());
        assert!(read(&fx, fx.grant.join("readme.txt")).is_ok());
        denied(read(&fx, fx.grant.join("readme.txt")), "budget");
    }

    #[test]
    fn every_call_is_audited_with_metadata_only() {
        let fx = fixture(100, 600);
        assert!(read(&fx, fx.grant.join("readme.txt")).is_ok());
        assert!(read(&fx, fx.outside.join("secret.txt")).is_err());
        fx.gateway.audit.close().unwrap();
        let log = std::fs::read_to_string(fx._dir.path().join("audit/log-000001.jsonl")).unwrap();
        let calls: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("\"tool_call\""))
            .collect();
        assert_eq!(calls.len(), 2, "{log}");
        assert!(calls[0].contains("\"decision\":\"allow\"") && calls[0].contains("fs.read"));
        assert!(calls[1].contains("\"decision\":\"deny\""));
        assert!(!log.contains("granted bytes"), "never file contents");
        assert!(fx.gateway.last_call.lock().unwrap().is_some());
    }

    fn write(
        fx: &Fixture,
        path: impl AsRef<Path>,
        data: &[u8],
        mode: pb::WriteMode,
    ) -> Result<pb::CallToolResponse, Status> {
        fx.gateway.call(Some(Tool::FsWrite(pb::FsWriteRequest {
            path: path.as_ref().display().to_string(),
            data: data.to_vec(),
            mode: mode as i32,
        })))
    }

    fn delete(fx: &Fixture, path: impl AsRef<Path>) -> Result<pb::CallToolResponse, Status> {
        fx.gateway.call(Some(Tool::FsDelete(pb::FsDeleteRequest {
            path: path.as_ref().display().to_string(),
        })))
    }

    #[test]
    fn writes_are_atomic_snapshotted_and_restorable() {
        use std::os::unix::fs::PermissionsExt as _;
        let fx = fixture(100, 600);
        let rw = fx._dir.path().join("rw");
        let file = rw.join("sub/data.bin");
        let first: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
        let created = write(&fx, &file, &first, pb::WriteMode::Create).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), first);
        let again = write(&fx, &file, b"x", pb::WriteMode::Create).expect_err("exists");
        assert_eq!(again.code(), tonic::Code::AlreadyExists, "{again:?}");
        let overwrite = write(&fx, &file, b"\0new\0", pb::WriteMode::Overwrite).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"\0new\0");
        let appended = write(&fx, &file, b"tail", pb::WriteMode::Append).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"\0new\0tail");
        let Some(ToolResult::FsWrite(response)) = appended.result else {
            panic!("not a write")
        };
        assert_eq!((response.size, response.existed), (9, true));
        // No temporary file is left beside it.
        let names: Vec<_> = std::fs::read_dir(rw.join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["data.bin"]);

        // Set-uid and set-gid bits do not survive new content.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o6755)).unwrap();
        write(&fx, &file, b"\0new\0tail", pb::WriteMode::Overwrite).unwrap();
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o755);

        let store = SnapshotStore::new(&fx._dir.path().join("data"));
        let run = fx.gateway.run_id.clone();
        store.restore(&run, &overwrite.call_id).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), first, "binary-safe");
        store.restore(&run, &appended.call_id).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"\0new\0");
        // The call that created it: restoring removes it.
        let restored = store.restore(&run, &created.call_id).unwrap();
        assert!(restored.removed && !file.exists());

        std::fs::write(&file, b"keep me").unwrap();
        let deleted = delete(&fx, &file).unwrap();
        assert!(!file.exists());
        store.restore(&run, &deleted.call_id).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
        let err = store
            .restore(&run, &fx.gateway.run_id)
            .expect_err("no snapshot");
        assert!(err.to_string().contains("no snapshot"), "{err}");
    }

    #[test]
    fn writes_and_deletes_stay_within_write_grants() {
        let fx = fixture(100, 600);
        let rw = fx._dir.path().join("rw");
        denied(
            write(
                &fx,
                fx.grant.join("readme.txt"),
                b"x",
                pb::WriteMode::Overwrite,
            ),
            "missing grant: fs write on",
        );
        assert_eq!(
            std::fs::read(fx.grant.join("readme.txt")).unwrap(),
            b"granted bytes"
        );
        denied(
            delete(&fx, fx.grant.join("readme.txt")),
            "granted read-only",
        );
        denied(
            write(&fx, fx.outside.join("new.txt"), b"x", pb::WriteMode::Create),
            "no fs grant covers",
        );
        // Links planted in the write grant lead nowhere.
        std::os::unix::fs::symlink(fx.outside.join("secret.txt"), rw.join("link")).unwrap();
        std::os::unix::fs::symlink(&fx.outside, rw.join("dir-link")).unwrap();
        denied(
            write(&fx, rw.join("link"), b"x", pb::WriteMode::Overwrite),
            "not a regular file",
        );
        denied(
            write(
                &fx,
                rw.join("dir-link/new.txt"),
                b"x",
                pb::WriteMode::Create,
            ),
            "symbolic link",
        );
        denied(delete(&fx, rw.join("link")), "never removed");
        assert_eq!(
            std::fs::read(fx.outside.join("secret.txt")).unwrap(),
            b"host secret"
        );
        assert!(!fx.outside.join("new.txt").exists());
        denied(delete(&fx, &rw), "never removes a grant itself");
        std::fs::write(rw.join("sub/x"), b"x").unwrap();
        let full = delete(&fx, rw.join("sub")).expect_err("not empty");
        assert_eq!(full.code(), tonic::Code::FailedPrecondition);
        assert!(delete(&fx, rw.join("sub/x")).is_ok());
        assert!(delete(&fx, rw.join("sub")).is_ok());
        let exec = fx.gateway.call(Some(Tool::Exec(pb::ExecRequest {
            argv: vec!["/bin/true".into()],
            ..Default::default()
        })));
        assert!(exec.is_err());
    }

    #[test]
    fn a_grant_inside_a_writable_grant_cannot_be_redirected() {
        let fx = fixture(100, 600);
        let rw = fx._dir.path().join("rw");
        let file = rw.join("nested/file.txt");
        let written = write(&fx, &file, b"one", pb::WriteMode::Create).unwrap();
        // The agent, able to write `rw`, swaps the nested grant for a link out of it.
        std::fs::rename(rw.join("nested"), rw.join("nested.old")).unwrap();
        std::os::unix::fs::symlink(&fx.outside, rw.join("nested")).unwrap();
        // The nested grant still means the directory pinned at start: the link leads nowhere.
        denied(read(&fx, rw.join("nested/secret.txt")), "");
        assert!(write(&fx, rw.join("nested/new.txt"), b"x", pb::WriteMode::Create).is_ok());
        assert!(!fx.outside.join("new.txt").exists());
        assert!(rw.join("nested.old/new.txt").exists());
        // A restore through the moved grant's path is refused, not redirected.
        let store = SnapshotStore::new(&fx._dir.path().join("data"));
        let err = store
            .restore(&fx.gateway.run_id, &written.call_id)
            .expect_err("redirected");
        assert!(err.to_string().contains("no longer the directory"), "{err}");
        assert_eq!(
            std::fs::read(fx.outside.join("secret.txt")).unwrap(),
            b"host secret"
        );
    }

    #[test]
    fn changes_stop_at_the_snapshot_limits() {
        let mut fx = fixture(100, 600);
        fx.gateway.snapshots = SnapshotStore::with_limits(&fx._dir.path().join("data"), 1000, 1500);
        let rw = fx._dir.path().join("rw");
        // A file larger than a snapshot may be (a sparse one: nothing is copied).
        let huge = std::fs::File::create(rw.join("sparse")).unwrap();
        huge.set_len(10 << 40).unwrap();
        let refused =
            write(&fx, rw.join("sparse"), b"x", pb::WriteMode::Append).expect_err("too large");
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        assert!(
            refused.message().contains("at most 1000 bytes"),
            "{refused:?}"
        );
        assert!(delete(&fx, rw.join("sparse")).is_err());
        assert!(std::fs::read_dir(fx._dir.path().join("data/snapshots"))
            .map(|d| d
                .flatten()
                .all(|run| std::fs::read_dir(run.path()).unwrap().count() == 0))
            .unwrap_or(true));
        // The run's quota: 900 + 900 bytes of snapshots do not fit in 1500.
        std::fs::write(rw.join("a"), vec![1u8; 900]).unwrap();
        std::fs::write(rw.join("b"), vec![2u8; 900]).unwrap();
        assert!(write(&fx, rw.join("a"), b"new", pb::WriteMode::Overwrite).is_ok());
        let spent = write(&fx, rw.join("b"), b"new", pb::WriteMode::Overwrite).expect_err("quota");
        assert!(spent.message().contains("quota"), "{spent:?}");
        assert_eq!(std::fs::read(rw.join("b")).unwrap(), vec![2u8; 900]);
        // Appends continue the content as it was snapshotted.
        assert!(write(&fx, rw.join("new"), b"abc", pb::WriteMode::Append).is_ok());
        assert!(write(&fx, rw.join("new"), b"def", pb::WriteMode::Append).is_ok());
        assert_eq!(std::fs::read(rw.join("new")).unwrap(), b"abcdef");
    }

    #[test]
    fn calls_handed_on_to_children_are_spent_here_too() {
        let fx = fixture(10, 600);
        let gateway = &fx.gateway;
        // 1 call made; of the 9 left, one stays for starting the child and half of the rest
        // is carved when a child asks for none.
        read(&fx, fx.grant.join("readme.txt")).unwrap();
        assert_eq!(gateway.carve_calls(0).unwrap(), 4);
        let refused = gateway.carve_calls(5).expect_err("4 may be handed on");
        assert!(
            refused
                .reason
                .contains("limits.tool_calls = 5: this run has 5 tool calls left to hand on"),
            "{}",
            refused.reason
        );
        assert_eq!(gateway.carve_calls(4).unwrap(), 4);
        // 1 made + 8 handed on: the last call is the run's (for starting a child).
        read(&fx, fx.grant.join("readme.txt")).unwrap();
        denied(read(&fx, fx.grant.join("readme.txt")), "budget");
        assert!(gateway.carve_calls(0).is_err(), "nothing left to halve");
        gateway.refund_calls(4);
        read(&fx, fx.grant.join("readme.txt")).unwrap();
    }

    #[test]
    fn a_child_grant_never_reaches_through_a_link_or_mounts_beneath_a_writable_grant() {
        let fx = fixture(10, 600);
        let rw = fx.grant.parent().unwrap().join("rw");
        let child = |path: &Path, access: pb::FsAccess, mount: &str| pb::Receipt {
            fs: vec![pb::FsGrant {
                path: path.display().to_string(),
                access: access as i32,
                mount: mount.into(),
            }],
            ..Default::default()
        };
        let pin =
            |receipt: pb::Receipt| crate::children::pin_child_grants(&fx.gateway.grants, &receipt);
        // Beneath the grant, no link on the way: pinned, by descriptor.
        let pinned = pin(child(&fx.grant.join("sub"), pb::FsAccess::Read, "")).unwrap();
        let root = pinned[0].root.as_ref().unwrap();
        let sub = std::fs::metadata(fx.grant.join("sub")).unwrap();
        use std::os::unix::fs::MetadataExt as _;
        assert_eq!((root.dev, root.ino), (sub.dev(), sub.ino()));
        // A granted file beneath the grant: pinned as its directory and name.
        let file = pin(child(&fx.grant.join("readme.txt"), pb::FsAccess::Read, "")).unwrap();
        assert!(file[0].root.as_ref().unwrap().name.is_some());
        // A link, as the grant itself or on the way to it.
        for path in [
            fx.grant.join("dir-out"),
            fx.grant.join("link-out"),
            fx.grant.join("dir-out/x"),
        ] {
            let (code, reason) = pin(child(&path, pb::FsAccess::Read, "")).err().unwrap();
            assert_eq!(code, "grant_escapes");
            assert!(reason.contains("symbolic link"), "{reason}");
        }
        // Mounted beneath a writable grant: refused; the writable grant itself: allowed.
        let (_, reason) = pin(child(&rw.join("sub"), pb::FsAccess::Read, "/sub"))
            .err()
            .unwrap();
        assert!(
            reason.starts_with("fs[0].mount: a mounted grant beneath the parent's writable grant"),
            "{reason}"
        );
        pin(child(&rw, pb::FsAccess::Read, "/rw")).unwrap();
        // A path no parent grant covers (check_within refuses it first; never pinned here).
        assert!(pin(child(&fx.outside, pb::FsAccess::Read, "")).is_err());
    }

    /// A fixture's gateway served on its socket, and a client calling it as an agent would.
    struct Served {
        run: Arc<RunGateway>,
        dir: tempfile::TempDir,
        grant: PathBuf,
        _handle: GatewayHandle,
        _server: tokio::runtime::Runtime,
        client_rt: tokio::runtime::Runtime,
        client: pb::gateway_client::GatewayClient<tonic::transport::Channel>,
    }

    fn served(max_calls: u64) -> Served {
        let Fixture {
            _dir: dir,
            grant,
            gateway,
            ..
        } = fixture(max_calls, 600);
        let run = Arc::new(gateway);
        let server = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let sock_dir = dir.path().join("sock");
        std::fs::create_dir(&sock_dir).unwrap();
        let handle = serve(server.handle(), &sock_dir, run.clone()).unwrap();
        let client_rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let target = format!("unix:{}", handle.socket.display());
        let client = client_rt.block_on(async {
            let channel = tonic::transport::Endpoint::from_shared(target)
                .unwrap()
                .connect()
                .await
                .unwrap();
            pb::gateway_client::GatewayClient::new(channel)
        });
        Served {
            run,
            dir,
            grant,
            _handle: handle,
            _server: server,
            client_rt,
            client,
        }
    }

    impl Served {
        fn read(&mut self, path: String) -> Result<pb::CallToolResponse, Status> {
            let request = pb::CallToolRequest {
                tool: Some(Tool::FsRead(pb::FsReadRequest {
                    path,
                    offset: 0,
                    length: 0,
                })),
            };
            self.client_rt
                .block_on(self.client.call_tool(request))
                .map(Response::into_inner)
        }

        /// Bytes of the audit log on disk, everything handed over so far written.
        fn audit_bytes(&self) -> u64 {
            self.run.audit.flush().unwrap();
            std::fs::read_dir(self.dir.path().join("audit"))
                .unwrap()
                .map(|e| e.unwrap().metadata().unwrap().len())
                .sum()
        }
    }

    #[test]
    fn ten_thousand_refused_calls_past_the_budget_add_under_a_mebibyte_of_audit() {
        let mut fx = served(5);
        let file = fx.grant.join("readme.txt").display().to_string();
        for _ in 0..5 {
            fx.read(file.clone()).unwrap();
        }
        let before = fx.audit_bytes();
        for _ in 0..10_000 {
            let refused = fx.read(file.clone()).expect_err("over the budget");
            assert!(refused.message().contains("budget"), "{refused:?}");
            assert!(refused.metadata().get("tollgate-call-id").is_some());
        }
        fx.run.flush_refusals();
        let added = fx.audit_bytes() - before;
        assert!(
            added < 1 << 20,
            "{added} bytes of audit for 10,000 refusals"
        );
        // Every refusal is accounted for: written one by one, or counted in a summary.
        fx.run.audit.close().unwrap();
        let (mut single, mut summarised) = (0, 0);
        for entry in tollgate_audit::read_entries(&fx.dir.path().join("audit")).unwrap() {
            let entry = entry.unwrap();
            if entry.decision != Some(Decision::Deny) {
                continue;
            }
            match entry.metadata.get("refused_calls") {
                Some(MetaValue::Int(n)) => summarised += n,
                _ => single += 1,
            }
        }
        assert_eq!(single + summarised, 10_000, "{single} + {summarised}");
    }

    #[test]
    fn a_path_over_4_kib_is_refused_as_such_and_audited_small() {
        let mut fx = served(100);
        let huge = format!("{}/{}", fx.grant.display(), "a".repeat(15 << 20));
        let before = fx.audit_bytes();
        for _ in 0..5 {
            let refused = fx.read(huge.clone()).expect_err("too long");
            assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
            assert!(
                refused.message().contains("at most 4096"),
                "{}",
                &refused.message()[..refused.message().len().min(200)]
            );
            assert!(!refused.message().contains('\n'));
            assert!(refused.message().len() < 200, "one short line");
        }
        let added = fx.audit_bytes() - before;
        assert!(added < 5 * 2048, "{added} bytes of audit for 5 refusals");
        // A path at the bound is looked at as usual.
        let at_bound = format!("{}/{}", fx.grant.display(), "b".repeat(100));
        let missing = fx.read(at_bound).expect_err("no such file");
        assert_eq!(missing.code(), tonic::Code::NotFound);
    }

    #[test]
    fn a_run_past_its_audit_quota_is_refused() {
        let fx = fixture(100, 600);
        assert!(read(&fx, fx.grant.join("readme.txt")).is_ok());
        fx.gateway
            .audit_use
            .bytes
            .store(audit_quota(100), Ordering::SeqCst);
        denied(read(&fx, fx.grant.join("readme.txt")), "audit quota");
    }
}
