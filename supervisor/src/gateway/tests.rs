//! The gateway's unit tests: the fs tools, the gate's bounds and budget, delegation's
//! pinning, and the served socket.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nix::sys::stat::Mode;
use tollgate_audit::{AuditLog, Decision, MetaValue};
use tollgate_files::snapshot::SnapshotStore;
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::call_tool_request::Tool;
use tollgate_proto::v1::call_tool_response::Result as ToolResult;
use tollgate_receipt::unix_now;
use tonic::{Response, Status};

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
    let gateway = RunGateway::new(RunGatewayConfig {
        run_id: "01900000-0000-7000-8000-000000000001".into(),
        host_id: 0,
        receipt: pb::Receipt::default(),
        expires_at: unix_now() + expires_in,
        grants: vec![
            FsGrant::open(&grant.display().to_string(), false, false),
            FsGrant::open(&dir.path().join("rw").display().to_string(), true, false),
            // A grant inside another the agent may write.
            FsGrant::open(
                &dir.path().join("rw/nested").display().to_string(),
                true,
                false,
            ),
        ],
        max_calls,
        closing: Arc::default(),
        is_revoked: Arc::new(move |_: &str| flag.load(Ordering::SeqCst)),
        audit: AuditLog::open(audit_config).unwrap(),
        snapshots: SnapshotStore::new(&dir.path().join("data")),
        exec: None,
        models: None,
        children: Default::default(),
        egress: Default::default(),
        approvals: Default::default(),
        output_limit: Arc::default(),
    });
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
    fx.gateway.fs.call(Some(Tool::FsRead(pb::FsReadRequest {
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
        .fs
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
        .fs
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
    fx.gateway.gate.closing.store(true, Ordering::SeqCst);
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
    fx.gateway.gate.audit.close().unwrap();
    let log = std::fs::read_to_string(fx._dir.path().join("audit/log-000001.jsonl")).unwrap();
    let calls: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("\"tool_call\""))
        .collect();
    assert_eq!(calls.len(), 2, "{log}");
    assert!(calls[0].contains("\"decision\":\"allow\"") && calls[0].contains("fs.read"));
    assert!(calls[1].contains("\"decision\":\"deny\""));
    assert!(!log.contains("granted bytes"), "never file contents");
    assert!(fx.gateway.gate.last_call.lock().unwrap().is_some());
}

fn write(
    fx: &Fixture,
    path: impl AsRef<Path>,
    data: &[u8],
    mode: pb::WriteMode,
) -> Result<pb::CallToolResponse, Status> {
    fx.gateway.fs.call(Some(Tool::FsWrite(pb::FsWriteRequest {
        path: path.as_ref().display().to_string(),
        data: data.to_vec(),
        mode: mode as i32,
    })))
}

fn delete(fx: &Fixture, path: impl AsRef<Path>) -> Result<pb::CallToolResponse, Status> {
    fx.gateway.fs.call(Some(Tool::FsDelete(pb::FsDeleteRequest {
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
    let run = fx.gateway.gate.run_id.clone();
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
        .restore(&run, &fx.gateway.gate.run_id)
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
    let exec = fx.gateway.fs.call(Some(Tool::Exec(pb::ExecRequest {
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
        .restore(&fx.gateway.gate.run_id, &written.call_id)
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
    fx.gateway.fs.snapshots = SnapshotStore::with_limits(&fx._dir.path().join("data"), 1000, 1500);
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
    let gateway = &fx.gateway.children;
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
            exec: false,
            ask: false,
            ask_reads: false,
        }],
        ..Default::default()
    };
    let pin = |receipt: pb::Receipt| {
        children::pin_child_grants(&fx.gateway.fs.grants.for_children(), &receipt)
    };
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
        self.run.gate.audit.flush().unwrap();
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
    fx.run.gate.flush_refusals();
    let added = fx.audit_bytes() - before;
    assert!(
        added < 1 << 20,
        "{added} bytes of audit for 10,000 refusals"
    );
    // Every refusal is accounted for: written one by one, or counted in a summary.
    fx.run.gate.audit.close().unwrap();
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
        .gate
        .audit_use
        .bytes
        .store(audit_quota(100), Ordering::SeqCst);
    denied(read(&fx, fx.grant.join("readme.txt")), "audit quota");
}

impl Served {
    /// Asks for an outbound connection to `host`:`port`; the refusal, if any.
    fn egress(&mut self, host: &str, port: u32) -> Result<(), Status> {
        let open = pb::EgressFrame {
            frame: Some(pb::egress_frame::Frame::Open(pb::EgressOpen {
                host: host.into(),
                port,
                http: false,
            })),
        };
        self.client_rt
            .block_on(self.client.egress(tokio_stream::iter([open])))
            .map(|_| ())
    }
}

/// A loop of refused outbound connections is audited one by one until the run's audit quota
/// is spent, then summarised: what it makes the supervisor write stays bounded.
#[test]
fn refused_connections_past_the_audit_quota_add_under_a_mebibyte_of_audit() {
    let mut fx = served(100);
    let refused = fx
        .egress("api.example.test", 443)
        .expect_err("no egress grant");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert!(
        refused
            .message()
            .contains("egress to api.example.test:443 is not granted"),
        "{refused:?}"
    );
    assert!(refused.metadata().get("tollgate-call-id").is_some());
    let bad = fx.egress("not a host", 443).expect_err("a bad host");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument, "{bad:?}");
    // The run has made the log hold its quota.
    fx.run
        .gate
        .audit_use
        .bytes
        .store(audit_quota(100), Ordering::SeqCst);
    let before = fx.audit_bytes();
    for _ in 0..4_000 {
        let refused = fx.egress("api.example.test", 443).expect_err("quota spent");
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    }
    fx.run.gate.flush_refusals();
    let added = fx.audit_bytes() - before;
    assert!(added < 1 << 20, "{added} bytes of audit for 4,000 refusals");
}
