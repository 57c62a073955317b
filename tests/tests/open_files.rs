//! The receipt's open-file limit (`limits.files`, RLIMIT_NOFILE) in real sandboxes: the
//! agent and the commands the gateway execs for it get exactly the receipt's value (1024 when
//! it gives none), not the supervisor's own limit, and a value above the operator's ceiling is
//! refused at mint.

use std::process::Command;

use tollgate_proto::v1 as pb;
use tollgate_tests::{
    authed, bin_path, leftovers, require_root, AuthorityProcess, SupervisorProcess,
};
use tonic::Code;

/// What the agent prints: its own soft and hard limits, then the exec'd command's.
const SCRIPT: &str =
    "ulimit -Sn; ulimit -Hn; tollgate-shim tool exec -- /bin/sh -c 'ulimit -Sn; ulimit -Hn'";

fn request(files: Option<u32>) -> pb::MintReceiptRequest {
    pb::MintReceiptRequest {
        subject: "fd-counter".into(),
        ttl_seconds: 60,
        audience: vec!["workstation".into()],
        agent: Some(pb::AgentSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), SCRIPT.into()],
            ..Default::default()
        }),
        exec: vec!["/bin/sh".into()],
        limits: files.map(|files| pb::Limits {
            files,
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_and_exec_get_the_receipts_open_file_limit() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let admin = authority.admin_token();
    let supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        authority.addr(),
        "open-files",
        232_100,
    );
    let mut client = authority.client().await;
    for (files, want) in [(None, 1024), (Some(77), 77), (Some(4096), 4096)] {
        let minted = client
            .mint_receipt(authed(&admin, request(files)))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            minted.receipt.as_ref().unwrap().limits.unwrap().files,
            want,
            "the authority resolves the default"
        );
        let receipt = dir.path().join("r.tgr");
        std::fs::write(&receipt, &minted.text).unwrap();
        let output = Command::new(bin_path("tollgate"))
            .args(["--supervisor", supervisor.addr()])
            .arg("--token-file")
            .arg(supervisor.token_file())
            .args(["run", "--receipt", receipt.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            format!("{want}\n").repeat(4),
            "agent soft, hard, exec'd soft, hard ({files:?}): {output:?}"
        );
    }
    assert!(leftovers(supervisor.data_dir(), &supervisor.cgroup_parent).is_empty());

    // An operator whose ceiling allows 2048: 4096 is refused before anything is signed, and
    // a request without a value gets the default under the ceiling.
    let bob = authority
        .add_operator(
            "bob",
            pb::Ceiling {
                exec: vec!["/bin/sh".into()],
                limits: Some(pb::Limits {
                    files: 2048,
                    ..Default::default()
                }),
                max_ttl_seconds: 600,
                audience: vec!["workstation".into()],
                ..Default::default()
            },
        )
        .await;
    let status = client
        .mint_receipt(authed(&bob, request(Some(4096))))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status
            .message()
            .contains("limits.files = 4096 (ceiling 2048)"),
        "{}",
        status.message()
    );
    let minted = client
        .mint_receipt(authed(&bob, request(None)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(minted.receipt.unwrap().limits.unwrap().files, 1024);
    // Above what setrlimit accepts: malformed, for anyone.
    let status = client
        .mint_receipt(authed(&admin, request(Some(tollgate_proto::MAX_FILES + 1))))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().starts_with("limits.files"), "{status:?}");
}
