//! Ask-rules with real daemons and real sandboxes: a change under a grant that asks waits in
//! the agent until an operator decides; approved it happens, denied it fails with the reason,
//! undecided it is denied at the deadline; `remember` lets the identical next call through and
//! no other; an operator who does not own the run neither sees nor decides its calls; a run
//! that expires while a call waits ends cleanly; and a ceiling that asks cannot be minted
//! around. Every wait and decision is in the supervisor's audit.

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use tollgate_audit::{Decision, Entry, EntryKind, MetaValue};
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::supervisor_client::SupervisorClient;
use tollgate_tests::{authed, bin_path, require_root, AuthorityProcess, SupervisorProcess};
use tonic::transport::Channel;
use tonic::Code;

fn ceiling(dir: &str) -> pb::Ceiling {
    pb::Ceiling {
        exec: vec!["/bin/sh".into(), "/usr/bin/sleep".into()],
        max_ttl_seconds: 3600,
        audience: vec!["workstation".into()],
        fs: vec![pb::FsGrant {
            path: dir.into(),
            access: pb::FsAccess::Write as i32,
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn receipt(dir: &str, script: &str, ttl: u64, approval_timeout: u64) -> pb::MintReceiptRequest {
    pb::MintReceiptRequest {
        subject: "asker".into(),
        ttl_seconds: ttl,
        audience: vec!["workstation".into()],
        agent: Some(pb::AgentSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            ..Default::default()
        }),
        exec: vec!["/bin/sh".into(), "/usr/bin/sleep".into()],
        fs: vec![pb::FsGrant {
            path: dir.into(),
            access: pb::FsAccess::Write as i32,
            ask: true,
            ..Default::default()
        }],
        approval_timeout_seconds: approval_timeout,
        ..Default::default()
    }
}

async fn mint(
    authority: &AuthorityProcess,
    token: &str,
    request: pb::MintReceiptRequest,
) -> String {
    authority
        .client()
        .await
        .mint_receipt(authed(token, request))
        .await
        .expect("mint")
        .into_inner()
        .text
}

async fn decide(
    client: &mut SupervisorClient<Channel>,
    token: &str,
    call: &pb::PendingCall,
    approve: bool,
    remember: bool,
    reason: &str,
) -> Result<pb::DecidedCall, tonic::Status> {
    client
        .decide_approval(authed(
            token,
            pb::DecideApprovalRequest {
                run_id: call.run_id.clone(),
                call_id: call.call_id.clone(),
                approve,
                remember,
                reason: reason.into(),
            },
        ))
        .await
        .map(|r| r.into_inner().decided.unwrap_or_default())
}

/// The calls `token` sees waiting now.
async fn waiting(client: &mut SupervisorClient<Channel>, token: &str) -> Vec<pb::PendingCall> {
    let mut stream = client
        .watch_approvals(authed(token, pb::WatchApprovalsRequest::default()))
        .await
        .expect("WatchApprovals")
        .into_inner();
    let mut calls = Vec::new();
    while let Some(event) = stream.message().await.expect("event") {
        match event.event {
            Some(pb::approval_event::Event::Pending(call)) => calls.push(call),
            Some(pb::approval_event::Event::CaughtUp(_)) => break,
            _ => {}
        }
    }
    calls
}

fn text(entry: &Entry, key: &str) -> String {
    match entry.metadata.get(key) {
        Some(MetaValue::Str(text)) => text.clone(),
        _ => String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asked_changes_wait_for_the_owner_and_happen_only_as_decided() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        authority.addr(),
        "approvals",
        211_200,
    );
    let project = dir.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    let p = project.display().to_string();
    let alice = authority.add_operator("alice", ceiling(&p)).await;
    let bob = authority.add_operator("bob", ceiling(&p)).await;
    let admin = supervisor.token();
    let mut client = supervisor.client().await;
    let alice_file = dir.path().join("alice.token");
    std::fs::write(&alice_file, &alice).unwrap();
    let as_alice = |args: &[&str]| {
        let output = Command::new(bin_path("tollgate"))
            .env("RUST_LOG", "off")
            .args(["--supervisor", supervisor.addr(), "--token-file"])
            .arg(&alice_file)
            .args(args)
            .output()
            .expect("run tollgate");
        assert!(output.status.success(), "{args:?}: {output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };

    let script = format!(
        "printf one | tollgate-shim tool write {p}/approved.txt; echo \"approved rc=$?\"\n\
         printf two | tollgate-shim tool write {p}/denied.txt 2>&1; echo \"denied rc=$?\"\n\
         printf three | tollgate-shim tool write {p}/late.txt 2>&1; echo \"late rc=$?\"\n\
         printf four | tollgate-shim tool write {p}/kept.txt; echo \"kept rc=$?\"\n\
         printf five | tollgate-shim tool write {p}/kept.txt --append 2>&1; echo \"again rc=$?\"\n\
         printf six | tollgate-shim tool write {p}/other.txt 2>&1; echo \"other rc=$?\""
    );
    let run_id = supervisor
        .start_run_as(
            &alice,
            mint(&authority, &alice, receipt(&p, &script, 120, 3)).await,
        )
        .await
        .expect("alice starts her receipt");

    // Alice, the owner, follows the board and decides as each call comes.
    let mut events = client
        .watch_approvals(authed(&alice, pb::WatchApprovalsRequest::default()))
        .await
        .expect("alice watches")
        .into_inner();
    let mut decisions: HashMap<String, pb::DecidedCall> = HashMap::new();
    let mut asked: Vec<String> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while decisions.len() < 5 {
        let event = tokio::time::timeout_at(deadline, events.message())
            .await
            .expect("the calls reach the board in time")
            .expect("event")
            .expect("stream open");
        match event.event {
            Some(pb::approval_event::Event::Pending(call)) => {
                assert_eq!(call.run_id, run_id);
                assert_eq!(
                    (call.owner.as_str(), call.subject.as_str()),
                    ("alice", "asker")
                );
                assert_eq!(call.tool, "fs.write");
                let name = call.path.rsplit('/').next().unwrap().to_owned();
                asked.push(name.clone());
                match name.as_str() {
                    "approved.txt" => {
                        assert_eq!(call.bytes, 3, "the operator sees the size, never the data");
                        decide(&mut client, &alice, &call, true, false, "")
                            .await
                            .unwrap();
                    }
                    "denied.txt" => {
                        // From the command line, as an operator would.
                        let said = as_alice(&[
                            "deny",
                            &call.run_id,
                            &call.call_id,
                            "--reason",
                            "not today",
                        ]);
                        assert!(
                            said.contains("denied") && said.contains("by alice"),
                            "{said}"
                        );
                    }
                    "late.txt" => {
                        // Listed while it waits; no one decides: denied at its 3 s deadline.
                        let listed = as_alice(&["approvals", "--json"]);
                        assert!(
                            listed.contains(&call.call_id) && listed.contains("late.txt"),
                            "{listed}"
                        );
                    }
                    "kept.txt" => {
                        decide(&mut client, &alice, &call, true, true, "")
                            .await
                            .unwrap();
                    }
                    "other.txt" => {
                        // Bob does not own the run: he neither sees nor decides its calls.
                        assert!(waiting(&mut client, &bob).await.is_empty());
                        let refused = decide(&mut client, &bob, &call, true, false, "")
                            .await
                            .unwrap_err();
                        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
                        // The supervisor's admin sees it, and denies it.
                        assert_eq!(waiting(&mut client, &admin).await.len(), 1);
                        decide(&mut client, &admin, &call, false, false, "admin says no")
                            .await
                            .unwrap();
                    }
                    other => panic!("unexpected call on {other}"),
                }
            }
            Some(pb::approval_event::Event::Decided(decided)) => {
                decisions.insert(decided.call_id.clone(), decided);
            }
            _ => {}
        }
    }
    // The appended write to kept.txt was remembered: it never reached the board.
    assert_eq!(
        asked,
        [
            "approved.txt",
            "denied.txt",
            "late.txt",
            "kept.txt",
            "other.txt"
        ]
    );
    let outcomes: Vec<i32> = decisions.values().map(|d| d.outcome).collect();
    assert!(outcomes.contains(&(pb::ApprovalOutcome::TimedOut as i32)));

    let output = supervisor.output(&run_id).await;
    for line in [
        "approved rc=0",
        "kept rc=0",
        "again rc=0",
        "denied rc=1",
        "late rc=1",
        "other rc=1",
    ] {
        assert!(output.contains(line), "{line}:\n{output}");
    }
    assert!(
        output.contains("operator \"alice\" denied fs.write"),
        "{output}"
    );
    assert!(output.contains("not today"), "{output}");
    assert!(output.contains("within 3 s"), "{output}");
    assert!(
        output.contains("waiting for an operator to approve"),
        "{output}"
    );
    assert_eq!(
        std::fs::read_to_string(project.join("approved.txt")).unwrap(),
        "one"
    );
    assert_eq!(
        std::fs::read_to_string(project.join("kept.txt")).unwrap(),
        "fourfive"
    );
    for never in ["denied.txt", "late.txt", "other.txt"] {
        assert!(!project.join(never).exists(), "{never} was written");
    }

    // The audit has each wait and its end, with who decided.
    let entries = supervisor.audit();
    let of_run = |kind: EntryKind| -> Vec<&Entry> {
        entries
            .iter()
            .filter(|e| e.kind == kind && e.run_id.as_deref() == Some(run_id.as_str()))
            .collect()
    };
    assert_eq!(of_run(EntryKind::ApprovalPending).len(), 5);
    let ended = of_run(EntryKind::ApprovalDecided);
    let by_outcome = |outcome: &str| {
        ended
            .iter()
            .filter(|e| text(e, "outcome") == outcome)
            .map(|e| text(e, "decided_by"))
            .collect::<Vec<_>>()
    };
    assert_eq!(by_outcome("approved"), ["alice", "alice"]);
    assert_eq!(by_outcome("denied"), ["alice", "admin"]);
    assert_eq!(by_outcome("timed_out").len(), 1);
    // Each wait's question is on disk before its answer, and names the call.
    for end in &ended {
        let question = of_run(EntryKind::ApprovalPending)
            .into_iter()
            .find(|q| q.call_id == end.call_id)
            .expect("a pending entry for every decision");
        assert!(question.seq < end.seq);
    }
    // `tollgate calls` tells the waits beside the calls.
    let calls_text = as_alice(&[
        "calls",
        &run_id,
        supervisor.data_dir().join("audit").to_str().unwrap(),
    ]);
    assert!(calls_text.contains("approval waiting"), "{calls_text}");
    assert!(calls_text.contains("approval timed_out"), "{calls_text}");
    assert!(calls_text.contains("by alice  (not today)"), "{calls_text}");
    // The calls themselves: approved ones say by whom (the remembered one too).
    let calls = of_run(EntryKind::ToolCall);
    let approved_by: Vec<String> = calls
        .iter()
        .filter(|e| e.decision == Some(Decision::Allow))
        .map(|e| text(e, "approved_by"))
        .collect();
    assert_eq!(approved_by, ["alice", "alice", "(remembered)"]);
    assert_eq!(
        calls
            .iter()
            .filter(|e| e.decision == Some(Decision::Deny))
            .count(),
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_expires_while_a_call_waits_ends_cleanly() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        authority.addr(),
        "approvals-expiry",
        211_300,
    );
    let project = dir.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    let p = project.display().to_string();
    let admin = authority.admin_token();
    let script = format!("printf x | tollgate-shim tool write {p}/never.txt; sleep 30");
    // The default wait (5 minutes) is cut to the receipt's 3 s.
    let mut client = supervisor.client().await;
    let run_id = supervisor
        .start_run_as(
            &supervisor.token(),
            mint(&authority, &admin, receipt(&p, &script, 3, 0)).await,
        )
        .await
        .expect("the admin starts it");
    let run = supervisor
        .wait_ended(&run_id, Duration::from_secs(30))
        .await;
    assert_eq!(run.state, pb::RunState::Expired as i32, "{run:?}");
    assert!(!project.join("never.txt").exists());
    assert!(waiting(&mut client, &supervisor.token()).await.is_empty());
    let entries = supervisor.audit();
    let ended = entries
        .iter()
        .find(|e| e.kind == EntryKind::ApprovalDecided && e.run_id.as_deref() == Some(&run_id))
        .expect("the wait's end is audited");
    assert!(
        matches!(text(ended, "outcome").as_str(), "timed_out" | "run_ended"),
        "{ended:?}"
    );
    assert_eq!(
        tollgate_tests::leftovers(
            supervisor.data_dir(),
            &format!("tollgate-test-{}-approvals-expiry", std::process::id())
        ),
        Vec::<String>::new()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ceiling_that_asks_cannot_be_minted_around_and_mounts_cannot_ask() {
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let mut ceiling = ceiling("/srv");
    ceiling.fs[0].ask = true;
    // Any route, but every call on it asks.
    ceiling.routes = vec![pb::RouteGrant {
        name: "*".into(),
        max_sensitivity: pb::Sensitivity::High as i32,
        ask: true,
    }];
    let carol = authority.add_operator("carol", ceiling).await;
    let mut client = authority.client().await;
    let mut request = receipt("/srv/app", "true", 60, 0);
    request.fs[0].ask = false;
    let refused = client
        .mint_receipt(authed(&carol, request.clone()))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("without ask"),
        "names the grant: {refused:?}"
    );
    // A route without ask is refused the same way.
    request.fs[0].ask = true;
    request.routes = vec![pb::RouteGrant {
        name: "cloud".into(),
        max_sensitivity: pb::Sensitivity::Low as i32,
        ask: false,
    }];
    let refused = client
        .mint_receipt(authed(&carol, request.clone()))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("routes[0] = cloud without ask"),
        "{refused:?}"
    );
    request.routes[0].ask = true;
    // With ask it is minted, and the receipt carries the rule and the default wait.
    let minted = client
        .mint_receipt(authed(&carol, request.clone()))
        .await
        .expect("an asking grant under an asking ceiling")
        .into_inner()
        .receipt
        .unwrap();
    assert!(minted.fs[0].ask);
    assert_eq!(
        minted.approval_timeout_seconds, 60,
        "the default wait, cut to the ttl"
    );
    // The kernel cannot ask: a mounted grant that asks is refused, naming the field.
    let mut mounted = request.clone();
    mounted.fs[0].mount = "/app".into();
    let refused = client
        .mint_receipt(authed(&carol, mounted))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("fs[0].ask"), "{refused:?}");

    // A program the ceiling asks about is granted only through the gateway, asking: never in
    // exec (the agent would run it directly), never without ask.
    let mut ceiling = self::ceiling("/srv");
    ceiling.exec_ask = vec!["/usr/bin/id".into()];
    let dave = authority.add_operator("dave", ceiling).await;
    let mut request = receipt("/srv/app", "true", 60, 0);
    request.exec.push("/usr/bin/id".into());
    let refused = client
        .mint_receipt(authed(&dave, request.clone()))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("exec[2] = /usr/bin/id (the ceiling asks"),
        "{refused:?}"
    );
    request.exec.pop();
    request.gateway_exec = vec![pb::GatewayExecGrant {
        program: "/usr/bin/id".into(),
        ask: false,
    }];
    let refused = client
        .mint_receipt(authed(&dave, request.clone()))
        .await
        .unwrap_err();
    assert!(
        refused
            .message()
            .contains("gateway_exec[0] = /usr/bin/id without ask"),
        "{refused:?}"
    );
    request.gateway_exec[0].ask = true;
    client
        .mint_receipt(authed(&dave, request.clone()))
        .await
        .expect("a gateway-only program that asks, under a ceiling that asks");
    // Listed in exec and gateway_exec at once: the agent could skip the gateway.
    request.exec.push("/usr/bin/id".into());
    let refused = client
        .mint_receipt(authed(&carol, request))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("gateway_exec[0].program"),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_only_program_runs_only_through_the_gateway_and_asks_for_each_command() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        authority.addr(),
        "approvals-exec",
        211_900,
    );
    let mut ceiling = ceiling(&dir.path().display().to_string());
    ceiling.exec.push("/usr/bin/".into());
    let alice = authority.add_operator("alice", ceiling).await;
    // The agent tries each program itself (the kernel refuses: Landlock does not let it
    // execute them), then through the gateway: uname does not ask; id asks for each command.
    let script = r#"
/usr/bin/uname -s >/dev/null 2>&1; echo "direct uname rc=$?"
/usr/bin/id -u >/dev/null 2>&1; echo "direct id rc=$?"
/lib64/ld-linux-x86-64.so.2 /usr/bin/id -u >/dev/null 2>&1; echo "loaded id rc=$?"
/bin/sh -c 'cat /usr/bin/uname > /dev/null' 2>/dev/null; echo "read uname rc=$?"
tollgate-shim tool exec -- /usr/bin/uname -s; echo "gateway uname rc=$?"
tollgate-shim tool exec -- /usr/bin/id -u; echo "approved rc=$?"
tollgate-shim tool exec -- /usr/bin/id -u; echo "remembered rc=$?"
tollgate-shim tool exec -- /usr/bin/id -g 2>&1; echo "denied rc=$?"
"#;
    let mut request = receipt(&dir.path().display().to_string(), script, 60, 0);
    request.gateway_exec = vec![
        pb::GatewayExecGrant {
            program: "/usr/bin/uname".into(),
            ask: false,
        },
        pb::GatewayExecGrant {
            program: "/usr/bin/id".into(),
            ask: true,
        },
    ];
    let minted = mint(&authority, &alice, request).await;
    let run_id = supervisor
        .start_run_as(&alice, minted)
        .await
        .expect("alice starts her run");
    let asked = supervisor
        .decide_pending(&alice, &run_id, 2, |call| {
            assert_eq!(
                (call.tool.as_str(), call.path.as_str()),
                ("exec", "/usr/bin/id")
            );
            assert_eq!(call.cwd, "/work", "{call:?}");
            if call.argv == ["/usr/bin/id", "-u"] {
                (true, true, "")
            } else {
                (false, false, "no group ids today")
            }
        })
        .await;
    let argvs: Vec<Vec<String>> = asked.iter().map(|call| call.argv.clone()).collect();
    assert_eq!(
        argvs,
        [["/usr/bin/id", "-u"], ["/usr/bin/id", "-g"]],
        "the remembered command line was not asked about again, a different one was"
    );
    let run = supervisor
        .wait_ended(&run_id, Duration::from_secs(30))
        .await;
    let output = supervisor.output(&run_id).await;
    assert_eq!(run.state, pb::RunState::Exited as i32, "{output}");
    // The kernel refuses the agent itself (126: found, but not executable), and the
    // programs are hidden from it: neither the dynamic loader (which Landlock's execute right
    // does not cover) nor a read reaches their content.
    assert!(output.contains("direct uname rc=126"), "{output}");
    assert!(output.contains("direct id rc=126"), "{output}");
    assert!(
        output.contains("loaded id rc=") && !output.contains("loaded id rc=0"),
        "{output}"
    );
    assert!(output.contains("read uname rc=1"), "{output}");
    assert!(
        output.contains(
            "Linux
gateway uname rc=0"
        ),
        "a gateway-only program that does not ask runs at once: {output}"
    );
    assert!(output.contains("approved rc=0"), "{output}");
    assert!(output.contains("remembered rc=0"), "{output}");
    assert!(
        output.contains("no group ids today") && output.contains("denied rc=1"),
        "{output}"
    );
    // Each command is audited with its argv, the approved ones with who approved them.
    let execs: Vec<Entry> = supervisor
        .audit()
        .into_iter()
        .filter(|e| e.kind == EntryKind::ToolCall && text(e, "tool") == "exec")
        .collect();
    assert_eq!(execs.len(), 4, "{execs:?}");
    let approved: Vec<String> = execs.iter().map(|e| text(e, "approved_by")).collect();
    assert_eq!(approved, ["", "alice", "(remembered)", ""], "{execs:?}");
    assert_eq!(execs[3].decision, Some(Decision::Deny), "{execs:?}");

    // A program the agent would reach all the same is never started as gateway-only: one
    // with another name (a hard link), or one the agent's own executables are or run through.
    for (program, why) in [
        ("/usr/bin/perl", "hard links"),
        ("/usr/bin/dash", "the agent's own executable /bin/sh"),
    ] {
        let mut request = receipt(&dir.path().display().to_string(), "true", 60, 0);
        request.gateway_exec = vec![pb::GatewayExecGrant {
            program: program.into(),
            ask: true,
        }];
        let minted = mint(&authority, &alice, request).await;
        let reason = match supervisor.start_run_as(&alice, minted).await {
            Err(status) => status.message().to_owned(),
            Ok(run_id) => {
                let run = supervisor
                    .wait_ended(&run_id, Duration::from_secs(30))
                    .await;
                run.report.map(|r| r.reason).unwrap_or_default()
            }
        };
        assert!(reason.contains(why), "{program}: {reason}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_under_a_grant_that_asks_before_reads_wait_for_an_operator() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        authority.addr(),
        "approvals-reads",
        211_950,
    );
    let (secret, public) = (dir.path().join("secret"), dir.path().join("public"));
    for (d, name) in [(&secret, "s.txt"), (&public, "p.txt")] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::write(d.join(name), format!("contents of {name}\n")).unwrap();
    }
    let (s, p) = (secret.display(), public.display());
    let alice = authority
        .add_operator("alice", ceiling(&dir.path().display().to_string()))
        .await;
    // A read elsewhere does not ask; under the asking grant a read is approved, a listing
    // denied.
    let script = format!(
        "tollgate-shim tool read {p}/p.txt; echo \"public rc=$?\"\n\
         tollgate-shim tool read {s}/s.txt; echo \"approved rc=$?\"\n\
         tollgate-shim tool list {s} 2>&1; echo \"listed rc=$?\""
    );
    let mut request = receipt(&dir.path().display().to_string(), &script, 60, 0);
    request.fs = vec![
        pb::FsGrant {
            path: secret.display().to_string(),
            access: pb::FsAccess::Read as i32,
            ask_reads: true,
            ..Default::default()
        },
        pb::FsGrant {
            path: public.display().to_string(),
            access: pb::FsAccess::Read as i32,
            ..Default::default()
        },
    ];
    let minted = mint(&authority, &alice, request.clone()).await;
    let run_id = supervisor
        .start_run_as(&alice, minted)
        .await
        .expect("alice starts her run");
    let asked = supervisor
        .decide_pending(&alice, &run_id, 2, |call| match call.tool.as_str() {
            "fs.read" => (true, false, ""),
            _ => (false, false, "not the listing"),
        })
        .await;
    let asked: Vec<(&str, String)> = asked
        .iter()
        .map(|call| (call.tool.as_str(), call.path.clone()))
        .collect();
    assert_eq!(
        asked,
        [
            ("fs.read", format!("{s}/s.txt")),
            ("fs.list", s.to_string())
        ]
    );
    let run = supervisor
        .wait_ended(&run_id, Duration::from_secs(30))
        .await;
    let output = supervisor.output(&run_id).await;
    assert_eq!(run.state, pb::RunState::Exited as i32, "{output}");
    assert!(
        output.contains("contents of p.txt\npublic rc=0"),
        "{output}"
    );
    assert!(
        output.contains("contents of s.txt\napproved rc=0"),
        "{output}"
    );
    assert!(
        output.contains("not the listing") && output.contains("listed rc=1"),
        "{output}"
    );
    // The kernel reads a mounted grant without asking: refused at mint, naming the field.
    request.fs[0].mount = "/secret".into();
    let refused = authority
        .client()
        .await
        .mint_receipt(authed(&alice, request))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("fs[0].ask_reads"), "{refused:?}");
}
