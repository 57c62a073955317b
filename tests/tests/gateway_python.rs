//! The Python example agent (examples/python/gateway_agent.py, grpcio) run for real against an
//! in-process gateway: every fs tool over the run's Unix socket, a refusal with its call id,
//! exec refused as unavailable, the snapshots and the supervisor's audit log.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use tollgate_audit::{AuditConfig, AuditLog};
use tollgate_proto::v1 as pb;
use tollgate_supervisor::gateway::{self, FsGrant, RunGateway, RunGatewayConfig};
use tollgate_supervisor::snapshot::SnapshotStore;
use tollgate_tests::repo_root;

// A UUID: snapshots are kept under the run id.
const RUN_ID: &str = "01900000-0000-7000-8000-0000000a9e47";
const FILE_NAME: &str = "gateway-agent.txt";
const CANARY: &str = "tollgate-agent-canary";

fn python() -> String {
    std::env::var("TOLLGATE_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The bytes the example writes (its `content()`): numbered lines, cut at `size`.
fn content(size: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(size + 32);
    let mut line = 0;
    while out.len() < size {
        out.extend_from_slice(format!("{line:08} {CANARY}\n").as_bytes());
        line += 1;
    }
    out.truncate(size);
    out
}

/// The line of `step` (its first word).
fn step<'a>(lines: &'a [String], name: &str) -> &'a str {
    lines
        .iter()
        .find(|l| l.split(' ').next() == Some(name))
        .unwrap_or_else(|| panic!("no {name} line in {lines:#?}"))
}

/// `key=value` of a step's line; `details=` runs to the end of the line.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let at = line
        .find(&format!(" {key}="))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"));
    let rest = &line[at + key.len() + 2..];
    if key == "details" {
        rest
    } else {
        rest.split(' ').next().unwrap_or_default()
    }
}

fn call_id(line: &str) -> String {
    let id = field(line, "call");
    uuid::Uuid::parse_str(id).unwrap_or_else(|_| panic!("call id of {line:?}"));
    id.to_owned()
}

/// Runs the example; its exit code and stdout lines.
fn agent(stubs: &Path, socket: &Path, args: &[&str]) -> (Option<i32>, Vec<String>) {
    let output = Command::new(python())
        .arg(repo_root().join("examples/python/gateway_agent.py"))
        .args(args)
        .env("TOLLGATE_STUBS", stubs)
        .env("TOLLGATE_GATEWAY", format!("unix:{}", socket.display()))
        .output()
        .expect("run gateway_agent.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!(
        "gateway_agent.py {args:?}: {}\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    (
        output.status.code(),
        stdout.lines().map(str::to_owned).collect(),
    )
}

#[test]
fn python_agent_calls_every_fs_tool_through_the_gateway() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: the gateway serves only its run's host id, here root; run as root");
        return;
    }
    let probe = Command::new(python())
        .args(["-c", "import grpc, grpc_tools, google.protobuf"])
        .status()
        .expect("run python");
    assert!(
        probe.success(),
        "{} lacks grpcio/grpcio-tools: run `pip install -r tests/python/requirements.txt` \
         or set TOLLGATE_PYTHON to a venv's python (scripts/test does both)",
        python()
    );
    // Under /tmp: the client connects by path, and sun_path holds only 108 bytes.
    let dir = tempfile::Builder::new()
        .prefix("tg-py")
        .tempdir_in("/tmp")
        .unwrap();
    let grant = dir.path().join("grant");
    std::fs::create_dir_all(grant.join("second")).unwrap();

    // The stubs, generated as the example's docstring says.
    let stubs = dir.path().join("stubs");
    std::fs::create_dir_all(&stubs).unwrap();
    let proto = repo_root().join("proto");
    let mut protos: Vec<PathBuf> = std::fs::read_dir(proto.join("tollgate/v1"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "proto"))
        .collect();
    protos.sort();
    let protoc = Command::new(python())
        .args(["-m", "grpc_tools.protoc", "-I"])
        .arg(&proto)
        .arg(format!("--python_out={}", stubs.display()))
        .arg(format!("--grpc_python_out={}", stubs.display()))
        .args(&protos)
        .output()
        .expect("run grpc_tools.protoc");
    assert!(
        protoc.status.success(),
        "protoc: {}",
        String::from_utf8_lossy(&protoc.stderr)
    );

    let key = ed25519_dalek::SigningKey::from_bytes(&[5; 32]);
    let audit_dir = dir.path().join("audit");
    let audit = AuditLog::open(AuditConfig::new(
        &audit_dir,
        "supervisor",
        key,
        "python-test",
    ))
    .unwrap();
    let snapshots = SnapshotStore::new(dir.path());
    let run = Arc::new(RunGateway::new(RunGatewayConfig {
        run_id: RUN_ID.into(),
        host_id: 0,
        // exec is granted, but with `exec: None` there is no sandbox to run it in.
        receipt: pb::Receipt {
            exec: vec!["/bin/echo".into()],
            ..Default::default()
        },
        expires_at: tollgate_receipt::unix_now() + 3600,
        grants: vec![FsGrant::open(&grant.display().to_string(), true, false)],
        max_calls: 1000,
        closing: Arc::new(AtomicBool::new(false)),
        is_revoked: Arc::new(|_: &str| false),
        audit: audit.clone(),
        snapshots: SnapshotStore::new(dir.path()),
        exec: None,
        models: None,
        children: Default::default(),
        egress: Default::default(),
        approvals: Default::default(),
        output_limit: Arc::default(),
    }));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut handle = gateway::serve(runtime.handle(), dir.path(), run).unwrap();
    assert!(handle.socket.as_os_str().len() < 108, "{:?}", handle.socket);

    // Run 1: more than 1 MiB, so the read loop takes two calls.
    let size = (1 << 20) + 4096;
    let file = grant.join(FILE_NAME);
    let grant_arg = grant.display().to_string();
    let (code, lines) = agent(&stubs, &handle.socket, &[&grant_arg]);
    assert_eq!(code, Some(0), "{lines:#?}");
    let write = step(&lines, "write");
    assert!(write.starts_with(&format!("write ok size={size} existed=false ")));
    let read = step(&lines, "read");
    assert!(read.starts_with(&format!("read ok bytes={size} calls=2 same=true ")));
    let list = step(&lines, "list");
    // The file and the directory `second`.
    assert!(list.starts_with(&format!(
        "list ok entries=2 found=true kind=FILE size={size} "
    )));
    let stat = step(&lines, "stat");
    assert!(stat.starts_with(&format!("stat ok kind=FILE size={size} ")));
    let refused = step(&lines, "refused");
    assert!(refused.starts_with("refused PERMISSION_DENIED call="));
    assert_eq!(
        field(refused, "details"),
        format!("receipt {RUN_ID}: no fs grant covers /etc/passwd (missing grant: fs read on /etc/passwd)")
    );
    let delete = step(&lines, "delete");
    assert!(delete.starts_with(&format!("delete ok kind=FILE size={size} ")));
    assert_eq!(lines.last().map(String::as_str), Some("done"));
    assert!(!file.exists(), "fs.delete removed it");
    let mut allowed: Vec<String> = [write, read, list, stat, delete]
        .into_iter()
        .map(call_id)
        .collect();
    let mut denied = vec![call_id(refused)];

    // The write's snapshot records a new file; the delete's kept the exact bytes written,
    // and restoring it puts them back on disk.
    assert!(!snapshots.manifest(RUN_ID, &call_id(write)).unwrap().existed);
    snapshots.restore(RUN_ID, &call_id(delete)).unwrap();
    assert_eq!(std::fs::read(&file).unwrap(), content(size));

    // Run 2, in the subdirectory (the restored file stays put), with exec: refused as
    // UNAVAILABLE after every fs step, so the agent exits 1.
    let second = grant.join("second").display().to_string();
    let (code, lines) = agent(
        &stubs,
        &handle.socket,
        &[&second, "--size", "100", "--exec", "/bin/echo", "hi"],
    );
    assert_eq!(code, Some(1), "{lines:#?}");
    for name in ["write", "read", "list", "stat", "delete"] {
        let line = step(&lines, name);
        assert!(line.starts_with(&format!("{name} ok ")), "{line}");
        allowed.push(call_id(line));
    }
    let refused = step(&lines, "refused");
    assert!(refused.starts_with("refused PERMISSION_DENIED "));
    denied.push(call_id(refused));
    let exec = lines.last().unwrap();
    assert!(exec.starts_with("exec failed UNAVAILABLE call="), "{exec}");
    assert_eq!(field(exec, "details"), "exec is not available for this run");
    denied.push(call_id(exec));
    assert!(!grant.join("second").join(FILE_NAME).exists());
    assert_eq!(std::fs::read(&file).unwrap(), content(size), "untouched");

    handle.stop();
    audit.close().unwrap();
    let log = std::fs::read_to_string(audit_dir.join("log-000001.jsonl")).unwrap();
    let calls: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("\"tool_call\""))
        .collect();
    let entry = |id: &str| -> &str {
        let found: Vec<&&str> = calls.iter().filter(|l| l.contains(id)).collect();
        assert_eq!(found.len(), 1, "one entry for call {id}: {log}");
        found[0]
    };
    for id in &allowed {
        assert!(
            entry(id).contains("\"decision\":\"allow\""),
            "{}",
            entry(id)
        );
    }
    for id in &denied {
        assert!(entry(id).contains("\"decision\":\"deny\""), "{}", entry(id));
    }
    // Run 1's first read is the only call whose id the agent does not print.
    let allows = calls
        .iter()
        .filter(|l| l.contains("\"decision\":\"allow\""))
        .count();
    let denies = calls
        .iter()
        .filter(|l| l.contains("\"decision\":\"deny\""))
        .count();
    assert_eq!((allows, denies), (allowed.len() + 1, 3), "{log}");
    assert!(!log.contains(CANARY), "never file contents");
}
