//! Changing a live run without restarting it, with real daemons and a real sandbox: a signed
//! amendment widens a gateway grant and extends the expiry (the agent's next call to the new
//! path passes, and the run outlives its old expiry); a forged or foreign-signed one is
//! refused; narrowing drops a grant (the agent's next call there is refused), unmounts a
//! mounted one from the live sandbox (the agent's next read there fails) and brings the
//! expiry forward; neither widens through the other's door; another operator can do neither.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use prost::Message as _;
use tollgate_audit::EntryKind;
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::supervisor_client::SupervisorClient;
use tollgate_receipt::{timestamp_from_unix, ReceiptSigner};
use tollgate_tests::{authed, require_root, AuthorityProcess, SupervisorProcess};
use tonic::transport::Channel;
use tonic::Code;

fn ceiling(root: &str) -> pb::Ceiling {
    pb::Ceiling {
        exec: vec!["/bin/sh".into(), "/usr/bin/sleep".into()],
        max_ttl_seconds: 3600,
        audience: vec!["workstation".into()],
        fs: vec![pb::FsGrant {
            path: root.into(),
            access: pb::FsAccess::Write as i32,
            ..Default::default()
        }],
        ..Default::default()
    }
}

async fn amend(
    client: &mut SupervisorClient<Channel>,
    token: &str,
    run_id: &str,
    change: pb::amend_run_request::Change,
) -> Result<pb::AmendRunResponse, tonic::Status> {
    client
        .amend_run(authed(
            token,
            pb::AmendRunRequest {
                run_id: run_id.into(),
                change: Some(change),
            },
        ))
        .await
        .map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_run_is_widened_only_by_a_signed_amendment_and_narrowed_by_its_owner() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        authority.addr(),
        "amendments",
        211_400,
    );
    let files = dir.path().join("files");
    let (a, b, m) = (files.join("a"), files.join("b"), files.join("m"));
    for (dir, name) in [(&a, "a.txt"), (&b, "b.txt"), (&m, "m.txt")] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(name), "bytes\n").unwrap();
    }
    let m = m.display().to_string();
    let root = files.display().to_string();
    let alice = authority.add_operator("alice", ceiling(&root)).await;
    let bob = authority.add_operator("bob", ceiling(&root)).await;
    let (a, b) = (a.display().to_string(), b.display().to_string());
    // Each round: one call to each gateway directory and a read of the mounted one (a
    // shell builtin: the kernel, not the gateway, answers it), each outcome printed.
    let script = format!(
        "while :; do \
           tollgate-shim tool read {a}/a.txt >/dev/null 2>&1; echo \"a rc=$?\"; \
           tollgate-shim tool read {b}/b.txt >/dev/null 2>&1; echo \"b rc=$?\"; \
           if (read line < /data/m.txt) 2>/dev/null; then echo \"m read\"; else echo \"m refused\"; fi; \
           sleep 0.2; \
         done"
    );
    let ttl = 12;
    let minted = authority
        .client()
        .await
        .mint_receipt(authed(
            &alice,
            pb::MintReceiptRequest {
                subject: "amended".into(),
                ttl_seconds: ttl,
                audience: vec!["workstation".into()],
                agent: Some(pb::AgentSpec {
                    argv: vec!["/bin/sh".into(), "-c".into(), script],
                    ..Default::default()
                }),
                exec: vec!["/bin/sh".into(), "/usr/bin/sleep".into()],
                fs: vec![
                    pb::FsGrant {
                        path: a.clone(),
                        access: pb::FsAccess::Read as i32,
                        ..Default::default()
                    },
                    pb::FsGrant {
                        path: m.clone(),
                        access: pb::FsAccess::Read as i32,
                        mount: "/data".into(),
                        ..Default::default()
                    },
                ],
                limits: Some(pb::Limits {
                    tool_calls: 10_000,
                    ..Default::default()
                }),
                ..Default::default()
            },
        ))
        .await
        .expect("mint")
        .into_inner();
    let started = Instant::now();
    let receipt = minted.receipt.unwrap();
    let run_id = supervisor
        .start_run_as(&alice, minted.text)
        .await
        .expect("alice starts her run");
    supervisor.until_printed(&alice, &run_id, "b rc=1").await;
    supervisor.until_printed(&alice, &run_id, "m read").await;
    let mut client = supervisor.client().await;

    // The authority signs a widening for the owner: b, and 60 s more.
    let widened = authority
        .client()
        .await
        .amend_receipt(authed(
            &alice,
            pb::AmendReceiptRequest {
                receipt_id: run_id.clone(),
                add_fs: vec![pb::FsGrant {
                    path: b.clone(),
                    access: pb::FsAccess::Read as i32,
                    ..Default::default()
                }],
                extend_seconds: 60,
                ..Default::default()
            },
        ))
        .await
        .expect("AmendReceipt")
        .into_inner();
    let signed = widened.signed.unwrap();
    // Beyond the ceiling, or with a mount, the authority signs nothing.
    let refused = authority
        .client()
        .await
        .amend_receipt(authed(
            &alice,
            pb::AmendReceiptRequest {
                receipt_id: run_id.clone(),
                add_fs: vec![pb::FsGrant {
                    path: "/etc".into(),
                    access: pb::FsAccess::Read as i32,
                    ..Default::default()
                }],
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");

    // Forged (a byte changed) and foreign-signed (a key the supervisor does not trust): refused.
    let mut forged = signed.clone();
    let mut tampered = pb::Amendment::decode(forged.amendment.as_slice()).unwrap();
    tampered.add_fs[0].path = root.clone();
    forged.amendment = tampered.encode_to_vec();
    let stranger = ReceiptSigner::from_seed(&[42; 32]).sign_amendment(&mut tampered);
    for bad in [forged, stranger] {
        let refused = amend(
            &mut client,
            &alice,
            &run_id,
            pb::amend_run_request::Change::Amendment(bad),
        )
        .await
        .unwrap_err();
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    }
    // Bob does not own the run: even a good amendment is not his to apply.
    let refused = amend(
        &mut client,
        &bob,
        &run_id,
        pb::amend_run_request::Change::Amendment(signed.clone()),
    )
    .await
    .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");

    let after = amend(
        &mut client,
        &alice,
        &run_id,
        pb::amend_run_request::Change::Amendment(signed),
    )
    .await
    .expect("the signed amendment applies");
    assert!(after.fs.iter().any(|g| g.path == b));
    let old_expiry = receipt.expires_at.unwrap().seconds;
    assert_eq!(after.expires_at.unwrap().seconds, old_expiry + 60);
    supervisor.until_printed(&alice, &run_id, "b rc=0").await;

    // Narrowing cannot widen: a later expiry is refused without a signature.
    let refused = amend(
        &mut client,
        &alice,
        &run_id,
        pb::amend_run_request::Change::Narrow(pb::Narrowing {
            expires_at: Some(timestamp_from_unix(old_expiry + 3600)),
            ..Default::default()
        }),
    )
    .await
    .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    // Alice drops a: the agent's next read there is refused.
    amend(
        &mut client,
        &alice,
        &run_id,
        pb::amend_run_request::Change::Narrow(pb::Narrowing {
            drop_fs: vec![a.clone()],
            ..Default::default()
        }),
    )
    .await
    .expect("narrowing needs no signature");
    supervisor.until_printed(&alice, &run_id, "a rc=1").await;
    // And the mounted grant: unmounted from the live sandbox, the agent's next read fails.
    let narrowed = amend(
        &mut client,
        &alice,
        &run_id,
        pb::amend_run_request::Change::Narrow(pb::Narrowing {
            drop_fs: vec![m.clone()],
            ..Default::default()
        }),
    )
    .await
    .expect("a mounted grant is narrowed away too");
    assert!(narrowed.fs.iter().all(|g| g.path != m && g.path != a));
    supervisor.until_printed(&alice, &run_id, "m refused").await;

    // The run outlived its receipt's own expiry.
    let left = Duration::from_secs(ttl + 1).saturating_sub(started.elapsed());
    tokio::time::sleep(left).await;
    let run = client
        .get_run(authed(
            &alice,
            pb::GetRunRequest {
                run_id: run_id.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(
        run.report.is_none(),
        "still running past the old expiry: {run:?}"
    );
    assert_eq!(
        run.expires_at.map(|t| t.seconds),
        Some(old_expiry + 60),
        "listings show the expiry in force"
    );

    // From the command line: widen the budget (the authority signs, the supervisor applies),
    // then bring the expiry forward, which ends the run now.
    let alice_file = dir.path().join("alice.token");
    std::fs::write(&alice_file, &alice).unwrap();
    let tollgate = |args: &[&str]| {
        let output = std::process::Command::new(tollgate_tests::bin_path("tollgate"))
            .env("RUST_LOG", "off")
            .args([
                "--authority",
                authority.addr(),
                "--supervisor",
                supervisor.addr(),
            ])
            .arg("--token-file")
            .arg(&alice_file)
            .args(args)
            .output()
            .expect("run tollgate");
        assert!(output.status.success(), "{args:?}: {output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let widened = tollgate(&["widen", &run_id, "--tool-calls", "20000", "--json"]);
    assert!(widened.contains("\"tool_calls\":20000"), "{widened}");
    let narrowed = tollgate(&["narrow", &run_id, "--expires-in", "1s"]);
    assert!(narrowed.contains("tool_calls 20000"), "{narrowed}");
    let ended = supervisor
        .wait_ended(&run_id, Duration::from_secs(10))
        .await;
    assert_eq!(ended.state, pb::RunState::Expired as i32, "{ended:?}");

    // Each change is in the supervisor's audit, the signed one at the authority's too.
    let changes: Vec<_> = supervisor
        .audit()
        .into_iter()
        .filter(|e| e.kind == EntryKind::RunAmended && e.run_id.as_deref() == Some(&run_id))
        .collect();
    assert_eq!(changes.len(), 5, "{changes:?}");
    let authority_entries = SupervisorProcess::audit_entries(&authority.data_dir().join("audit"));
    assert!(authority_entries
        .iter()
        .any(|e| e.kind == EntryKind::ReceiptAmended
            && e.receipt_id.as_deref() == Some(&run_id)
            && e.decision == Some(tollgate_audit::Decision::Allow)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrowing_lowers_the_budgets_of_a_live_run_and_never_raises_one() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        authority.addr(),
        "budgets",
        211_700,
    );
    let alice = authority
        .add_operator("alice", ceiling(&dir.path().display().to_string()))
        .await;
    let minted = authority
        .client()
        .await
        .mint_receipt(authed(
            &alice,
            pb::MintReceiptRequest {
                subject: "budgets".into(),
                ttl_seconds: 30,
                audience: vec!["workstation".into()],
                agent: Some(pb::AgentSpec {
                    argv: vec![
                        "/bin/sh".into(),
                        "-c".into(),
                        "i=0; while :; do i=$((i+1)); echo \"tick $i\"; sleep 0.1; done".into(),
                    ],
                    ..Default::default()
                }),
                exec: vec!["/bin/sh".into(), "/usr/bin/sleep".into()],
                limits: Some(pb::Limits {
                    output_bytes: 1 << 20,
                    egress_bytes: 1 << 30,
                    ..Default::default()
                }),
                ..Default::default()
            },
        ))
        .await
        .expect("mint")
        .into_inner();
    let run_id = supervisor
        .start_run_as(&alice, minted.text)
        .await
        .expect("alice starts her run");
    supervisor.until_printed(&alice, &run_id, "tick 3").await;
    let mut client = supervisor.client().await;
    let narrow = |narrowing: pb::Narrowing| pb::amend_run_request::Change::Narrow(narrowing);

    // Raising a budget is not a narrowing, and this run has no model calls to budget.
    for (asked, code) in [
        (
            pb::Narrowing {
                output_bytes: 2 << 20,
                ..Default::default()
            },
            Code::FailedPrecondition,
        ),
        (
            pb::Narrowing {
                egress_bytes: 2 << 30,
                ..Default::default()
            },
            Code::FailedPrecondition,
        ),
        (
            pb::Narrowing {
                tokens: 10,
                ..Default::default()
            },
            Code::FailedPrecondition,
        ),
    ] {
        let refused = amend(&mut client, &alice, &run_id, narrow(asked.clone()))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), code, "{asked:?}: {refused:?}");
    }
    let after = amend(
        &mut client,
        &alice,
        &run_id,
        narrow(pb::Narrowing {
            egress_bytes: 4096,
            output_bytes: 1,
            ..Default::default()
        }),
    )
    .await
    .expect("lowering budgets needs no signature");
    assert_eq!((after.egress_bytes, after.output_bytes), (4096, 1));
    // The output budget is spent: nothing more of the agent's output is relayed, and the
    // report says its output was cut (the agent prints every 0.1 s).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let run = client
        .stop_run(authed(
            &alice,
            pb::StopRunRequest {
                run_id: run_id.clone(),
                reason: "done".into(),
            },
        ))
        .await
        .expect("stop")
        .into_inner()
        .run
        .expect("the run");
    let report = run.report.expect("a teardown report");
    assert!(report.output_truncated, "{report:?}");
    let change = supervisor
        .audit()
        .into_iter()
        .find(|e| e.kind == EntryKind::RunAmended && e.run_id.as_deref() == Some(&run_id))
        .expect("the narrowing is audited");
    assert_eq!(
        change.metadata.get("egress_bytes"),
        Some(&tollgate_audit::MetaValue::from(4096_i64)),
        "{change:?}"
    );
}

/// A live restore keeps what amendments made of a run: the next supervisor re-adopts it with
/// the grant a narrowing dropped still gone, the grant an amendment added still there, and
/// its budget and later expiry as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_restore_keeps_what_amendments_made_of_a_run() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start_with_flags(
        &dir.path().join("supervisor"),
        authority.addr(),
        "amend-restore",
        212_000,
        vec![
            "--live-restore".into(),
            "--live-restore-window".into(),
            "120".into(),
        ],
    );
    let files = dir.path().join("files");
    let (a, c) = (files.join("a"), files.join("c"));
    for d in [&a, &c] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::write(d.join("f.txt"), "bytes\n").unwrap();
    }
    let alice = authority
        .add_operator("alice", ceiling(&files.display().to_string()))
        .await;
    let (a, c) = (a.display().to_string(), c.display().to_string());
    // Calls the gateway only once a file the test writes while no supervisor runs exists.
    let script = format!(
        "while [ ! -e /work/go ]; do sleep 0.05; done; \
         tollgate-shim tool read {a}/f.txt >/dev/null 2>&1; echo \"a rc=$?\"; \
         tollgate-shim tool read {c}/f.txt >/dev/null 2>&1; echo \"c rc=$?\"; \
         r=$(tollgate-shim receipt); p=read; n=500; \
         case \"$r\" in *\"{a} $p\"*) echo \"view: a listed\";; *) echo \"view: a gone\";; esac; \
         case \"$r\" in *\"{c} $p\"*) echo \"view: c listed\";; esac; \
         case \"$r\" in *\" of $n tool calls\"*) echo \"view: 500 calls\";; esac; \
         sleep 3600"
    );
    let minted = authority
        .client()
        .await
        .mint_receipt(authed(
            &alice,
            pb::MintReceiptRequest {
                subject: "restored".into(),
                ttl_seconds: 300,
                audience: vec!["workstation".into()],
                agent: Some(pb::AgentSpec {
                    argv: vec!["/bin/sh".into(), "-c".into(), script],
                    ..Default::default()
                }),
                exec: vec!["/bin/sh".into(), "/usr/bin/sleep".into()],
                fs: vec![pb::FsGrant {
                    path: a.clone(),
                    access: pb::FsAccess::Read as i32,
                    ..Default::default()
                }],
                limits: Some(pb::Limits {
                    tool_calls: 1_000,
                    ..Default::default()
                }),
                ..Default::default()
            },
        ))
        .await
        .expect("mint")
        .into_inner();
    let expiry = minted.receipt.unwrap().expires_at.unwrap().seconds;
    let run_id = supervisor
        .start_run_as(&alice, minted.text)
        .await
        .expect("alice starts her run");
    let mut client = supervisor.client().await;
    let signed = authority
        .client()
        .await
        .amend_receipt(authed(
            &alice,
            pb::AmendReceiptRequest {
                receipt_id: run_id.clone(),
                add_fs: vec![pb::FsGrant {
                    path: c.clone(),
                    access: pb::FsAccess::Read as i32,
                    ..Default::default()
                }],
                extend_seconds: 600,
                tool_calls: 2_000,
                ..Default::default()
            },
        ))
        .await
        .expect("AmendReceipt")
        .into_inner()
        .signed
        .unwrap();
    amend(
        &mut client,
        &alice,
        &run_id,
        pb::amend_run_request::Change::Amendment(signed.clone()),
    )
    .await
    .expect("widen");
    // Then narrowed below what the amendment gave: a replay after the restart must not undo it.
    amend(
        &mut client,
        &alice,
        &run_id,
        pb::amend_run_request::Change::Narrow(pb::Narrowing {
            drop_fs: vec![a.clone()],
            tool_calls: 500,
            ..Default::default()
        }),
    )
    .await
    .expect("narrow");
    drop(client);

    let runs = supervisor.data_dir().join("runs");
    let supervisor = supervisor.restart_after(Signal::SIGTERM, || {
        std::fs::write(runs.join(&run_id).join("work/go"), "").unwrap();
    });
    // The agent's first calls after the restart: the dropped grant stays dropped, the added
    // one stays added.
    supervisor.until_printed(&alice, &run_id, "a rc=1").await;
    supervisor.until_printed(&alice, &run_id, "c rc=0").await;
    // The agent's own view is the restored powers too.
    supervisor
        .until_printed(&alice, &run_id, "view: a gone")
        .await;
    supervisor
        .until_printed(&alice, &run_id, "view: c listed")
        .await;
    supervisor
        .until_printed(&alice, &run_id, "view: 500 calls")
        .await;
    // Budget and expiry as amended (a narrowing that changes nothing shows them), and the
    // amendment, applied once, does not apply again.
    let mut client = supervisor.client().await;
    let now = amend(
        &mut client,
        &alice,
        &run_id,
        pb::amend_run_request::Change::Narrow(pb::Narrowing {
            tool_calls: 500,
            ..Default::default()
        }),
    )
    .await
    .expect("the re-adopted run can be amended");
    assert_eq!(now.tool_calls, 500);
    assert_eq!(now.expires_at.unwrap().seconds, expiry + 600);
    let paths: Vec<&str> = now.fs.iter().map(|g| g.path.as_str()).collect();
    assert_eq!(paths, [c.as_str()]);
    let again = amend(
        &mut client,
        &alice,
        &run_id,
        pb::amend_run_request::Change::Amendment(signed),
    )
    .await
    .expect("a replay changes nothing");
    assert_eq!(again.tool_calls, 500, "a replay undoes no narrowing");
    client
        .stop_run(authed(
            &alice,
            pb::StopRunRequest {
                run_id: run_id.clone(),
                reason: "done".into(),
            },
        ))
        .await
        .expect("stop");
}

/// Gateway-only programs and budgets move like gateway grants: an amendment adds a program the
/// exec tool may run and raises budgets; a narrowing takes a program away; a program of the
/// receipt's exec list (the kernel's) can be neither added nor taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_only_programs_and_budgets_are_amended_like_grants() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        authority.addr(),
        "amend-programs",
        212_200,
    );
    let mut ceiling = ceiling(&dir.path().display().to_string());
    ceiling.exec.push("/usr/bin/".into());
    let alice = authority.add_operator("alice", ceiling).await;
    let script = "while :; do \
           tollgate-shim tool exec -- /usr/bin/uname -s >/dev/null 2>&1; echo \"uname rc=$?\"; \
           tollgate-shim tool exec -- /usr/bin/id -u >/dev/null 2>&1; echo \"id rc=$?\"; \
           sleep 0.2; \
         done";
    let minted = authority
        .client()
        .await
        .mint_receipt(authed(
            &alice,
            pb::MintReceiptRequest {
                subject: "programs".into(),
                ttl_seconds: 120,
                audience: vec!["workstation".into()],
                agent: Some(pb::AgentSpec {
                    argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
                    ..Default::default()
                }),
                exec: vec!["/bin/sh".into(), "/usr/bin/sleep".into()],
                gateway_exec: vec![pb::GatewayExecGrant {
                    program: "/usr/bin/uname".into(),
                    ask: false,
                }],
                limits: Some(pb::Limits {
                    tool_calls: 10_000,
                    ..Default::default()
                }),
                ..Default::default()
            },
        ))
        .await
        .expect("mint")
        .into_inner();
    let run_id = supervisor
        .start_run_as(&alice, minted.text)
        .await
        .expect("alice starts her run");
    supervisor
        .until_printed(&alice, &run_id, "uname rc=0")
        .await;
    supervisor.until_printed(&alice, &run_id, "id rc=1").await;
    let mut client = supervisor.client().await;
    let amend_receipt = |request: pb::AmendReceiptRequest| {
        let authority = &authority;
        let alice = alice.clone();
        async move {
            authority
                .client()
                .await
                .amend_receipt(authed(&alice, request))
                .await
        }
    };
    // A program of the receipt's exec list is the kernel's: not added through the gateway.
    let refused = amend_receipt(pb::AmendReceiptRequest {
        receipt_id: run_id.clone(),
        add_gateway_exec: vec![pb::GatewayExecGrant {
            program: "/bin/sh".into(),
            ask: false,
        }],
        ..Default::default()
    })
    .await
    .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    let signed = amend_receipt(pb::AmendReceiptRequest {
        receipt_id: run_id.clone(),
        add_gateway_exec: vec![pb::GatewayExecGrant {
            program: "/usr/bin/id".into(),
            ask: false,
        }],
        egress_bytes: 2 << 30,
        output_bytes: 64 << 20,
        ..Default::default()
    })
    .await
    .expect("AmendReceipt")
    .into_inner()
    .signed
    .unwrap();
    let widened = amend(
        &mut client,
        &alice,
        &run_id,
        pb::amend_run_request::Change::Amendment(signed),
    )
    .await
    .expect("widen");
    let programs: Vec<&str> = widened
        .gateway_exec
        .iter()
        .map(|g| g.program.as_str())
        .collect();
    assert_eq!(programs, ["/usr/bin/uname", "/usr/bin/id"]);
    assert_eq!(
        (widened.egress_bytes, widened.output_bytes),
        (2 << 30, 64 << 20)
    );
    supervisor.until_printed(&alice, &run_id, "id rc=0").await;
    // Taken away: the exec tool refuses it from the next call. The kernel's are not the
    // gateway's to take.
    let refused = amend(
        &mut client,
        &alice,
        &run_id,
        pb::amend_run_request::Change::Narrow(pb::Narrowing {
            drop_gateway_exec: vec!["/bin/sh".into()],
            ..Default::default()
        }),
    )
    .await
    .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("exec list"), "{refused:?}");
    let narrowed = amend(
        &mut client,
        &alice,
        &run_id,
        pb::amend_run_request::Change::Narrow(pb::Narrowing {
            drop_gateway_exec: vec!["/usr/bin/uname".into()],
            ..Default::default()
        }),
    )
    .await
    .expect("narrow");
    assert_eq!(narrowed.gateway_exec.len(), 1, "{narrowed:?}");
    supervisor
        .until_printed(&alice, &run_id, "uname rc=1")
        .await;
    client
        .stop_run(authed(
            &alice,
            pb::StopRunRequest {
                run_id: run_id.clone(),
                reason: "done".into(),
            },
        ))
        .await
        .expect("stop");
}

/// The agent's own view (`tollgate-shim receipt`) follows every change to its run: a grant
/// narrowed away and a lowered budget show at once, and so does a grant a signed amendment
/// adds — it is the powers in force, never the receipt the run started with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_view_of_its_powers_follows_every_amendment() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        authority.addr(),
        "amended-view",
        213_760,
    );
    let files = dir.path().join("files");
    let (a, b) = (files.join("a"), files.join("b"));
    for dir in [&a, &b] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let root = files.display().to_string();
    let alice = authority.add_operator("alice", ceiling(&root)).await;
    let (a, b) = (a.display().to_string(), b.display().to_string());
    // Each round, what the agent's view says of a, b and its tool-call budget (the patterns
    // made of variables: the view shows this very script as the agent's argv).
    let script = format!(
        "p=read; n=4321; while :; do \
           r=$(tollgate-shim receipt); \
           case \"$r\" in *\"{a} $p\"*) echo \"a listed\";; *) echo \"a not listed\";; esac; \
           case \"$r\" in *\"{b} $p\"*) echo \"b listed\";; *) echo \"b not listed\";; esac; \
           case \"$r\" in *\" of $n tool calls\"*) echo \"budget lowered\";; esac; \
           sleep 0.2; \
         done"
    );
    let minted = authority
        .client()
        .await
        .mint_receipt(authed(
            &alice,
            pb::MintReceiptRequest {
                subject: "amended-view".into(),
                ttl_seconds: 120,
                audience: vec!["workstation".into()],
                agent: Some(pb::AgentSpec {
                    argv: vec!["/bin/sh".into(), "-c".into(), script],
                    ..Default::default()
                }),
                exec: vec!["/bin/sh".into(), "/usr/bin/sleep".into()],
                fs: vec![pb::FsGrant {
                    path: a.clone(),
                    access: pb::FsAccess::Read as i32,
                    ..Default::default()
                }],
                limits: Some(pb::Limits {
                    tool_calls: 10_000,
                    output_bytes: 16 << 20,
                    ..Default::default()
                }),
                ..Default::default()
            },
        ))
        .await
        .expect("mint")
        .into_inner();
    let run_id = supervisor
        .start_run_as(&alice, minted.text)
        .await
        .expect("alice starts her run");
    supervisor.until_printed(&alice, &run_id, "a listed").await;
    supervisor
        .until_printed(&alice, &run_id, "b not listed")
        .await;
    let mut client = supervisor.client().await;

    // Narrowed: a dropped, the budget lowered.
    amend(
        &mut client,
        &alice,
        &run_id,
        pb::amend_run_request::Change::Narrow(pb::Narrowing {
            drop_fs: vec![a.clone()],
            tool_calls: 4321,
            ..Default::default()
        }),
    )
    .await
    .expect("narrowing");
    supervisor
        .until_printed(&alice, &run_id, "a not listed")
        .await;
    supervisor
        .until_printed(&alice, &run_id, "budget lowered")
        .await;

    // Widened by a signed amendment: b shows.
    let widened = authority
        .client()
        .await
        .amend_receipt(authed(
            &alice,
            pb::AmendReceiptRequest {
                receipt_id: run_id.clone(),
                add_fs: vec![pb::FsGrant {
                    path: b.clone(),
                    access: pb::FsAccess::Read as i32,
                    ..Default::default()
                }],
                ..Default::default()
            },
        ))
        .await
        .expect("AmendReceipt")
        .into_inner();
    amend(
        &mut client,
        &alice,
        &run_id,
        pb::amend_run_request::Change::Amendment(widened.signed.unwrap()),
    )
    .await
    .expect("widening");
    supervisor.until_printed(&alice, &run_id, "b listed").await;

    client
        .stop_run(authed(
            &alice,
            pb::StopRunRequest {
                run_id: run_id.clone(),
                reason: "done".into(),
            },
        ))
        .await
        .expect("stop");
    supervisor
        .wait_ended(&run_id, Duration::from_secs(20))
        .await;
}
