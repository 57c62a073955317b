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

use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, FileStat, Mode, SFlag};
use tollgate_audit::{AuditLog, Decision, EntryDraft, EntryKind};
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::call_tool_request::Tool;
use tollgate_proto::v1::call_tool_response::Result as ToolResult;
use tollgate_proto::v1::gateway_server::Gateway;
use tollgate_receipt::paths::{is_normal_absolute, path_within};
use tollgate_receipt::unix_now;
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status};

use crate::runs::COMPONENT;

/// Most bytes one `fs.read` returns (read on with `offset`).
pub const MAX_READ: u64 = 1 << 20;
/// Most entries one `fs.list` returns.
pub const MAX_LIST: usize = 10_000;

/// One fs grant as the gateway uses it.
#[derive(Debug, Clone)]
pub struct FsGrant {
    /// The granted host path (absolute, normalised).
    pub path: String,
    /// Whether writes are granted (the read tools need only a read grant).
    pub writable: bool,
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
    /// Calls made so far (allowed or not).
    pub calls: AtomicU64,
    /// The last call's id, for the teardown report.
    pub last_call: Mutex<Option<String>>,
}

impl std::fmt::Debug for RunGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunGateway")
            .field("run_id", &self.run_id)
            .finish_non_exhaustive()
    }
}

/// Why a call was refused: what to tell the agent and what the audit entry says.
struct Refusal {
    status: Status,
    reason: String,
}

impl Refusal {
    fn denied(run_id: &str, reason: String) -> Self {
        Self {
            status: Status::permission_denied(format!("receipt {run_id}: {reason}")),
            reason,
        }
    }
}

fn resolve_flags() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS
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
struct Target<'a> {
    grant: &'a FsGrant,
    rest: String,
}

impl RunGateway {
    /// The grant `path` falls under (the most specific one), or why none does.
    fn target<'a>(&'a self, path: &str) -> Result<Target<'a>, String> {
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
            .ok_or_else(|| format!("no fs grant covers {path}"))?;
        let rest = path
            .strip_prefix(&grant.path)
            .unwrap_or_default()
            .trim_start_matches('/')
            .to_owned();
        Ok(Target { grant, rest })
    }

    /// Opens `target` with `flags`, never leaving its grant.
    fn open(&self, target: &Target<'_>, flags: OFlag) -> Result<OwnedFd, Refusal> {
        let errno = |e: Errno| self.errno_refusal(&target.grant.path, e);
        // The grant's own path is the operator's, trusted as signed; below it nothing is.
        let root = nix::fcntl::open(
            Path::new(&target.grant.path),
            OFlag::O_PATH | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        if target.rest.is_empty() {
            if flags.contains(OFlag::O_PATH) {
                return Ok(root);
            }
            return reopen(&root, flags).map_err(errno);
        }
        openat2(
            &root,
            target.rest.as_str(),
            OpenHow::new()
                .flags(flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
                .resolve(resolve_flags()),
        )
        .map_err(errno)
    }

    fn errno_refusal(&self, grant: &str, errno: Errno) -> Refusal {
        let reason = match errno {
            Errno::EXDEV => format!("the path escapes its grant {grant}"),
            Errno::ELOOP => {
                "a symbolic link is on the path; symbolic links are never followed".to_owned()
            }
            Errno::ENOTDIR => "not a directory".to_owned(),
            Errno::ENOENT => {
                return Refusal {
                    status: Status::not_found("no such file or directory"),
                    reason: "no such file or directory".into(),
                }
            }
            other => format!("cannot open it: {other}"),
        };
        Refusal::denied(&self.run_id, reason)
    }

    /// The checks every call passes before its tool runs.
    fn admit(&self, tool: &str) -> Result<(), Refusal> {
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
        if tool.starts_with("fs.") && self.grants.is_empty() {
            return Err(Refusal::denied(
                &self.run_id,
                format!("{tool} needs an fs grant and the receipt has none"),
            ));
        }
        let made = self.calls.fetch_add(1, Ordering::SeqCst);
        if made >= self.max_calls {
            return Err(Refusal::denied(
                &self.run_id,
                format!("the tool-call budget ({} calls) is spent", self.max_calls),
            ));
        }
        Ok(())
    }

    fn read(&self, request: &pb::FsReadRequest) -> Result<ToolResult, Refusal> {
        let target = self
            .target(&request.path)
            .map_err(|reason| Refusal::denied(&self.run_id, reason))?;
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

    fn list(&self, request: &pb::FsListRequest) -> Result<ToolResult, Refusal> {
        let target = self
            .target(&request.path)
            .map_err(|reason| Refusal::denied(&self.run_id, reason))?;
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

    fn stat(&self, request: &pb::FsStatRequest) -> Result<ToolResult, Refusal> {
        let target = self
            .target(&request.path)
            .map_err(|reason| Refusal::denied(&self.run_id, reason))?;
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

    /// Runs one call: checks, the tool, the audit entry.
    fn call(&self, tool: Option<Tool>) -> Result<pb::CallToolResponse, Status> {
        let started = Instant::now();
        let call_id = uuid::Uuid::now_v7().hyphenated().to_string();
        let (name, path) = match &tool {
            Some(Tool::FsRead(r)) => ("fs.read", r.path.clone()),
            Some(Tool::FsList(r)) => ("fs.list", r.path.clone()),
            Some(Tool::FsStat(r)) => ("fs.stat", r.path.clone()),
            None => ("none", String::new()),
        };
        let outcome = self.admit(name).and_then(|()| match &tool {
            Some(Tool::FsRead(request)) => self.read(request),
            Some(Tool::FsList(request)) => self.list(request),
            Some(Tool::FsStat(request)) => self.stat(request),
            None => Err(Refusal {
                status: Status::invalid_argument("no tool given"),
                reason: "no tool given".into(),
            }),
        });
        let bytes = match &outcome {
            Ok(ToolResult::FsRead(read)) => read.data.len() as i64,
            Ok(ToolResult::FsList(list)) => list.entries.len() as i64,
            _ => 0,
        };
        let mut entry = EntryDraft::new(COMPONENT, EntryKind::ToolCall)
            .receipt(self.run_id.as_str())
            .run(self.run_id.as_str())
            .call(call_id.as_str())
            .meta("tool", name)
            .meta("path", path)
            .meta("bytes", bytes)
            .meta(
                "duration_us",
                i64::try_from(started.elapsed().as_micros()).unwrap_or(i64::MAX),
            );
        entry = match &outcome {
            Ok(_) => entry.decision(Decision::Allow),
            Err(refusal) => entry
                .decision(Decision::Deny)
                .reason(refusal.reason.as_str()),
        };
        // Handed to the writer without waiting for its fsync (a read's round trip would
        // double); a broken log refuses the call.
        if let Err(e) = self.audit.submit(entry) {
            tracing::error!(run_id = %self.run_id, error = %e, "could not audit a tool call");
            return Err(Status::internal(
                "the audit log is unavailable; nothing is done unaudited",
            ));
        }
        *self.last_call.lock().unwrap_or_else(|p| p.into_inner()) = Some(call_id.clone());
        match outcome {
            Ok(result) => Ok(pb::CallToolResponse {
                call_id,
                result: Some(result),
            }),
            Err(refusal) => {
                let mut status = refusal.status;
                if let Ok(value) = call_id.parse() {
                    status.metadata_mut().insert("tollgate-call-id", value);
                }
                Err(status)
            }
        }
    }
}

/// Reopens an `O_PATH` descriptor for real I/O through its `/proc/self/fd` link: the same
/// inode, never a path looked up again.
fn reopen(fd: &OwnedFd, flags: OFlag) -> nix::Result<OwnedFd> {
    nix::fcntl::open(
        format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str(),
        flags | OFlag::O_CLOEXEC | OFlag::O_NOCTTY,
        Mode::empty(),
    )
}

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

    async fn call_tool(
        &self,
        request: Request<pb::CallToolRequest>,
    ) -> Result<Response<pb::CallToolResponse>, Status> {
        self.check_peer(&request)?;
        let tool = request.into_inner().tool;
        // File system work blocks: let the runtime move its other work off this thread.
        tokio::task::block_in_place(|| self.run.call(tool)).map(Response::new)
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

/// Binds `<dir>/gateway.sock` for `run` (owned by its host id, 0600) and serves it on
/// `runtime`. The socket accepts (into its backlog) as soon as this returns.
pub fn serve(
    runtime: &tokio::runtime::Handle,
    dir: &Path,
    run: Arc<RunGateway>,
) -> Result<GatewayHandle, GatewayError> {
    use tonic::transport::Server;
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
    runtime.spawn(async move {
        let listener = match tokio::net::UnixListener::from_std(listener) {
            Ok(listener) => listener,
            Err(e) => {
                tracing::error!(run_id = %run_id, error = %e, "gateway socket unusable");
                return;
            }
        };
        let served = Server::builder()
            .add_service(pb::gateway_server::GatewayServer::new(service))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
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
            grants: vec![FsGrant {
                path: grant.display().to_string(),
                writable: false,
            }],
            max_calls,
            closing: Arc::default(),
            is_revoked: Arc::new(move |_: &str| flag.load(Ordering::SeqCst)),
            audit: AuditLog::open(audit_config).unwrap(),
            calls: AtomicU64::new(0),
            last_call: Mutex::new(None),
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
}
