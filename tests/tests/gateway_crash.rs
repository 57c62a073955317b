//! Crash safety of the gateway's writes (root): the real supervisor is SIGKILLed while an
//! agent rewrites a granted file through `fs.write` as fast as it can. After each kill the
//! file is one whole version or the other, never a mix or a prefix, and the snapshot of the
//! last write the audit log recorded brings back the content from before it.

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tollgate_audit::{AuditReader, EntryFilter, EntryKind, MetaValue};
use tollgate_proto::v1 as pb;
use tollgate_tests::{authed, bin_path, require_root, AuthorityProcess, SupervisorProcess};

const A_LEN: usize = 512 << 10;
const B_LEN: usize = 640 << 10;

/// Which whole version the file holds, if it is one.
fn version(bytes: &[u8]) -> Option<char> {
    match (bytes.len(), bytes.first()) {
        (A_LEN, Some(b'A')) if bytes.iter().all(|&b| b == b'A') => Some('A'),
        (B_LEN, Some(b'B')) if bytes.iter().all(|&b| b == b'B') => Some('B'),
        _ => None,
    }
}

/// A few pseudo-random milliseconds (the clock's low bits): kills land at varied points of
/// a write.
fn jitter(max_ms: u64) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    Duration::from_millis(nanos % max_ms)
}

/// The last allowed `fs.write` of `run_id` in the supervisor's audit log.
fn last_write(audit_dir: &Path, run_id: &str) -> Option<String> {
    let filter = EntryFilter {
        run_id: Some(run_id.to_owned()),
        ..Default::default()
    };
    AuditReader::open(audit_dir)
        .ok()?
        .filtered(filter)
        .filter_map(Result::ok)
        .filter(|e| {
            e.kind == EntryKind::ToolCall
                && e.metadata.get("tool") == Some(&MetaValue::Str("fs.write".into()))
                && e.decision.map(|d| d.as_str()) == Some("allow")
        })
        .filter_map(|e| e.call_id)
        .last()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisor_killed_mid_write_leaves_a_whole_file_and_a_restorable_snapshot() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (project, sources) = (dir.path().join("project"), dir.path().join("sources"));
    std::fs::create_dir_all(&project).unwrap();
    std::fs::create_dir_all(&sources).unwrap();
    std::fs::write(sources.join("a"), vec![b'A'; A_LEN]).unwrap();
    std::fs::write(sources.join("b"), vec![b'B'; B_LEN]).unwrap();
    let target = project.join("data.bin");
    std::fs::write(&target, vec![b'A'; A_LEN]).unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let mut supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        authority.addr(),
        "crash-write",
        203_000,
    );
    let script = format!(
        "while :; do tollgate-shim tool write {0} < /sources/b || exit 1; \
         tollgate-shim tool write {0} < /sources/a || exit 1; done",
        target.display()
    );
    let mut versions_seen = Vec::new();
    for round in 0..10 {
        let minted = authority
            .client()
            .await
            .mint_receipt(authed(
                &authority.admin_token(),
                pb::MintReceiptRequest {
                    subject: "writer".into(),
                    ttl_seconds: 120,
                    audience: vec!["workstation".into()],
                    agent: Some(pb::AgentSpec {
                        argv: vec!["/bin/sh".into(), "-c".into(), script.clone()],
                        ..Default::default()
                    }),
                    fs: vec![
                        pb::FsGrant {
                            path: project.display().to_string(),
                            access: pb::FsAccess::Write as i32,
                            mount: String::new(),
                            exec: false,
                            ask: false,
                            ask_reads: false,
                        },
                        pb::FsGrant {
                            path: sources.display().to_string(),
                            access: pb::FsAccess::Read as i32,
                            mount: "/sources".into(),
                            exec: false,
                            ask: false,
                            ask_reads: false,
                        },
                    ],
                    exec: vec!["/bin/sh".into()],
                    ..Default::default()
                },
            ))
            .await
            .unwrap()
            .into_inner();
        let run_id = minted.receipt.unwrap().receipt_id;
        supervisor
            .client()
            .await
            .start_run(authed(
                &supervisor.token(),
                pb::StartRunRequest {
                    receipt: minted.text,
                    argv: vec![],
                    ..Default::default()
                },
            ))
            .await
            .unwrap();
        // Let it rewrite the file a few times, then kill at a varied point of a write.
        let audit_dir = supervisor.data_dir().join("audit");
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut changes = 0;
        let mut seen = None;
        while changes < 4 {
            assert!(
                Instant::now() < deadline,
                "round {round}: the agent is not writing"
            );
            let now = std::fs::metadata(&target).and_then(|m| m.modified());
            if let Ok(now) = now {
                if seen.is_some_and(|before| before != now) {
                    changes += 1;
                }
                seen = Some(now);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(jitter(40)).await;
        supervisor = supervisor.restart(Signal::SIGKILL);

        let bytes = std::fs::read(&target).unwrap();
        let whole = version(&bytes).unwrap_or_else(|| {
            panic!(
                "round {round}: a torn file: {} bytes, first {:?}",
                bytes.len(),
                bytes.first()
            )
        });
        versions_seen.push(whole);

        // The last write the log recorded was snapshotted before it was made: restoring it
        // gives the whole version from before that write.
        let call_id = last_write(&audit_dir, &run_id)
            .unwrap_or_else(|| panic!("round {round}: no fs.write in the audit log"));
        let restored = std::process::Command::new(bin_path("tollgate"))
            .args(["restore", &run_id, &call_id, "--data-dir"])
            .arg(supervisor.data_dir())
            .output()
            .unwrap();
        assert!(
            restored.status.success(),
            "round {round}: {}",
            String::from_utf8_lossy(&restored.stderr)
        );
        let back = std::fs::read(&target).unwrap();
        let snapshot = std::fs::read(
            supervisor
                .data_dir()
                .join("snapshots")
                .join(&run_id)
                .join(format!("{call_id}.data")),
        )
        .unwrap();
        assert_eq!(back, snapshot, "round {round}: restored = the snapshot");
        assert!(version(&back).is_some(), "round {round}: a torn snapshot");
    }
    eprintln!("versions after each kill: {versions_seen:?}");
}
