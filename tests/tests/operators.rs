//! Operators kept apart on one supervisor: each lists, watches, inspects, copies from and
//! stops only the runs whose receipt it owns; an admin (the supervisor's own token, or an
//! authority admin) touches every run; every operator's call is audited with its name. The
//! credentials: an operator token the authority issued (looked up there), or a client
//! certificate naming the operator (bound to any token sent with it).

use std::process::{Command, Output};
use std::time::Duration;

use tollgate_audit::{Decision, Entry, EntryKind, MetaValue};
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::supervisor_client::SupervisorClient;
use tollgate_tests::{authed, bin_path, require_root, AuthorityProcess, Pki, SupervisorProcess};
use tonic::transport::Channel;
use tonic::Code;

/// What alice and bob may grant: a shell and sleep, on supervisor workstation.
fn ceiling() -> pb::Ceiling {
    pb::Ceiling {
        exec: vec!["/bin/sh".into(), "/usr/bin/sleep".into()],
        max_ttl_seconds: 3600,
        audience: vec!["workstation".into()],
        ..Default::default()
    }
}

fn sleeper(subject: &str) -> pb::MintReceiptRequest {
    pb::MintReceiptRequest {
        subject: subject.into(),
        ttl_seconds: 300,
        audience: vec!["workstation".into()],
        agent: Some(pb::AgentSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), "echo up; sleep 60".into()],
            ..Default::default()
        }),
        exec: vec!["/bin/sh".into(), "/usr/bin/sleep".into()],
        ..Default::default()
    }
}

async fn mint(authority: &AuthorityProcess, token: &str, subject: &str) -> String {
    authority
        .client()
        .await
        .mint_receipt(authed(token, sleeper(subject)))
        .await
        .expect("mint")
        .into_inner()
        .text
}

async fn listed(client: &mut SupervisorClient<Channel>, token: &str) -> Vec<String> {
    let mut ids: Vec<String> = client
        .list_runs(authed(token, pb::ListRunsRequest::default()))
        .await
        .expect("ListRuns")
        .into_inner()
        .runs
        .into_iter()
        .filter(|run| run.report.is_none())
        .map(|run| run.run_id)
        .collect();
    ids.sort();
    ids
}

/// Every call an operator may make about one run, as `token`: each one's code.
async fn touch_all(client: &mut SupervisorClient<Channel>, token: &str, run_id: &str) -> Vec<Code> {
    let id = || run_id.to_owned();
    let code = |result: Result<(), tonic::Status>| result.err().map_or(Code::Ok, |s| s.code());
    vec![
        code(
            client
                .get_run(authed(token, pb::GetRunRequest { run_id: id() }))
                .await
                .map(drop),
        ),
        code(
            client
                .watch_run(authed(token, pb::WatchRunRequest { run_id: id() }))
                .await
                .map(drop),
        ),
        code(
            client
                .get_run_tree(authed(token, pb::GetRunTreeRequest { run_id: id() }))
                .await
                .map(drop),
        ),
        code(
            client
                .copy_out(authed(
                    token,
                    pb::CopyOutRequest {
                        run_id: id(),
                        path: "/work".into(),
                    },
                ))
                .await
                .map(drop),
        ),
        code(
            client
                .attach(authed(
                    token,
                    tokio_stream::iter(vec![pb::AttachRequest {
                        run_id: id(),
                        ..Default::default()
                    }]),
                ))
                .await
                .map(drop),
        ),
        code(
            client
                .copy_in(authed(
                    token,
                    tokio_stream::iter(vec![pb::CopyInRequest {
                        run_id: id(),
                        path: "/work".into(),
                        ..Default::default()
                    }]),
                ))
                .await
                .map(drop),
        ),
        code(
            client
                .remove_workspace(authed(token, pb::RemoveWorkspaceRequest { run_id: id() }))
                .await
                .map(drop),
        ),
    ]
}

async fn stop(
    client: &mut SupervisorClient<Channel>,
    token: &str,
    run_id: &str,
) -> Result<pb::Run, tonic::Status> {
    client
        .stop_run(authed(
            token,
            pb::StopRunRequest {
                run_id: run_id.into(),
                reason: "operators test".into(),
            },
        ))
        .await
        .map(|r| r.into_inner().run.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_watch_and_stop_only_their_own_runs_and_admins_every_run() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let supervisor = SupervisorProcess::start(
        &dir.path().join("supervisor"),
        authority.addr(),
        "operators",
        211_000,
    );
    let alice = authority.add_operator("alice", ceiling()).await;
    let bob = authority.add_operator("bob", ceiling()).await;
    let authority_admin = authority.admin_token();
    let supervisor_admin = supervisor.token();
    let mut client = supervisor.client().await;

    // Each starts its own receipt with its own operator token.
    let alices = supervisor
        .start_run_as(&alice, mint(&authority, &alice, "alices").await)
        .await
        .expect("alice starts her own receipt");
    let bobs = supervisor
        .start_run_as(&bob, mint(&authority, &bob, "bobs").await)
        .await
        .expect("bob starts his own receipt");
    // Not another operator's receipt: the run would be alice's, out of bob's sight.
    let refused = supervisor
        .start_run_as(&bob, mint(&authority, &alice, "alices-2").await)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("operator \"alice\"'s"),
        "{refused:?}"
    );

    // Each sees only its own; both admins see both.
    assert_eq!(listed(&mut client, &alice).await, vec![alices.clone()]);
    assert_eq!(listed(&mut client, &bob).await, vec![bobs.clone()]);
    let mut both = vec![alices.clone(), bobs.clone()];
    both.sort();
    assert_eq!(listed(&mut client, &supervisor_admin).await, both);
    assert_eq!(listed(&mut client, &authority_admin).await, both);

    // Alice can do nothing about bob's run: get, watch, tree, copy out, attach, copy in,
    // remove its workspace, stop.
    for code in touch_all(&mut client, &alice, &bobs).await {
        assert_eq!(code, Code::PermissionDenied);
    }
    let refused = stop(&mut client, &alice, &bobs).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("not operator \"alice\"'s")
            && !refused.message().contains("bob"),
        "refused without saying whose it is: {refused:?}"
    );
    // A run that does not exist is still NOT_FOUND, and a made-up token is no one.
    let none = stop(&mut client, &alice, "0190b5a4-0000-7000-8000-000000000000")
        .await
        .unwrap_err();
    assert_eq!(none.code(), Code::NotFound, "{none:?}");
    let stranger = listed_status(
        &mut client,
        "tgt_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    )
    .await;
    assert_eq!(stranger, Code::Unauthenticated);

    // Her own run: she watches it print, and the calls pass the ownership check.
    let mut watch = client
        .watch_run(authed(
            &alice,
            pb::WatchRunRequest {
                run_id: alices.clone(),
            },
        ))
        .await
        .expect("alice watches her run")
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(20), watch.message())
        .await
        .expect("an event")
        .expect("stream")
        .expect("not ended");
    assert!(
        matches!(first.event, Some(pb::run_event::Event::Output(ref o)) if o.data.starts_with(b"up")),
        "{first:?}"
    );
    let own = client
        .get_run(authed(
            &alice,
            pb::GetRunRequest {
                run_id: alices.clone(),
            },
        ))
        .await
        .expect("alice reads her run")
        .into_inner();
    assert_eq!(own.owner, "alice");

    // Bob's run lives on; the authority's admin stops it, alice stops her own.
    assert!(
        client
            .get_run(authed(
                &bob,
                pb::GetRunRequest {
                    run_id: bobs.clone()
                }
            ))
            .await
            .unwrap()
            .into_inner()
            .report
            .is_none(),
        "alice's refused stop left bob's run running"
    );
    let stopped = stop(&mut client, &authority_admin, &bobs)
        .await
        .expect("admin stops bob's run");
    assert!(stopped.report.is_some());
    stop(&mut client, &alice, &alices)
        .await
        .expect("alice stops her own run");

    // The audit has every operator's call with its name: alice's refusals, the admin's stop.
    let entries: Vec<Entry> = supervisor.audit();
    let calls: Vec<_> = entries
        .iter()
        .filter(|e| e.kind == EntryKind::OperatorCall)
        .collect();
    let meta = |e: &Entry, key: &str| match e.metadata.get(key) {
        Some(MetaValue::Str(text)) => text.clone(),
        _ => String::new(),
    };
    let denied_stop = calls.iter().find(|e| {
        meta(e, "method") == "StopRun"
            && meta(e, "operator") == "alice"
            && e.run_id.as_deref() == Some(bobs.as_str())
    });
    let denied_stop = denied_stop.expect("alice's refused stop is audited");
    assert_eq!(denied_stop.decision, Some(Decision::Deny));
    let admin_stop = calls
        .iter()
        .find(|e| meta(e, "method") == "StopRun" && meta(e, "operator") == "admin")
        .expect("the authority admin's stop is audited");
    assert_eq!(admin_stop.decision, Some(Decision::Allow));
    for method in [
        "GetRun",
        "WatchRun",
        "GetRunTree",
        "CopyOut",
        "Attach",
        "CopyIn",
        "RemoveWorkspace",
        "StartRun",
    ] {
        assert!(
            calls
                .iter()
                .any(|e| meta(e, "method") == method && e.decision == Some(Decision::Deny)),
            "a refused {method} is audited"
        );
    }
}

async fn listed_status(client: &mut SupervisorClient<Channel>, token: &str) -> Code {
    client
        .list_runs(authed(token, pb::ListRunsRequest::default()))
        .await
        .err()
        .map_or(Code::Ok, |s| s.code())
}

fn tollgate(args: &[&str]) -> Output {
    Command::new(bin_path("tollgate"))
        .args(args)
        .env("RUST_LOG", "off")
        .output()
        .expect("run tollgate")
}

/// Over mutual TLS a certificate naming an operator is a credential of its own (no token),
/// and a token sent over another operator's certificate is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_certificate_is_a_credential_and_binds_the_token_sent_with_it() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path());
    let issued = tollgate(&["pki", "issue", "operator", "bob", "--dir", &pki.path("")]);
    assert!(issued.status.success(), "{issued:?}");
    let ca = pki.path("ca.pem");
    let authority = AuthorityProcess::start_tls(&dir.path().join("authority"), &pki);
    let supervisor = SupervisorProcess::start_with_flags(
        &dir.path().join("supervisor"),
        authority.addr(),
        "operators-tls",
        211_100,
        pki.supervisor_flags(),
    );
    let as_operator = |name: &str| {
        vec![
            "--ca".to_owned(),
            ca.clone(),
            "--cert".into(),
            pki.path(&format!("operator-{name}.pem")),
            "--key".into(),
            pki.path(&format!("operator-{name}.key")),
        ]
    };
    let admin_file = authority.data_dir().join("admin.token");
    let admin_file = admin_file.to_str().unwrap();
    // Operators bob and alice at the authority; bob's token in a file.
    let mut add = vec!["--authority", authority.addr(), "--token-file", admin_file];
    let alice_tls = as_operator("alice");
    add.extend(alice_tls.iter().map(String::as_str));
    let ceiling_file = dir.path().join("ceiling.toml");
    std::fs::write(
        &ceiling_file,
        "max_ttl = '1h'\naudience = ['workstation']\nexec = ['/bin/sh', '/usr/bin/sleep']\n",
    )
    .unwrap();
    let mut tokens = Vec::new();
    for name in ["alice", "bob"] {
        let mut args = add.clone();
        args.extend([
            "operator",
            "add",
            name,
            "--ceiling",
            ceiling_file.to_str().unwrap(),
        ]);
        let added = tollgate(&args);
        assert!(added.status.success(), "{added:?}");
        let token = dir.path().join(format!("{name}.token"));
        std::fs::write(&token, String::from_utf8_lossy(&added.stdout).trim()).unwrap();
        tokens.push(token);
    }
    let spec = dir.path().join("run.toml");
    std::fs::write(
        &spec,
        "subject = 'mine'\nttl = '5m'\naudience = ['workstation']\n[agent]\nargv = ['/bin/sh', '-c', 'sleep 60']\n[exec]\nallow = ['/bin/sh', '/usr/bin/sleep']\n",
    )
    .unwrap();
    // Alice mints with her token and starts with her certificate alone.
    let receipt = dir.path().join("alice.tgr");
    let mut mint_args = vec![
        "--authority",
        authority.addr(),
        "--token-file",
        tokens[0].to_str().unwrap(),
    ];
    mint_args.extend(alice_tls.iter().map(String::as_str));
    mint_args.extend([
        "mint",
        "--spec",
        spec.to_str().unwrap(),
        "--out",
        receipt.to_str().unwrap(),
    ]);
    let minted = tollgate(&mint_args);
    assert!(minted.status.success(), "{minted:?}");
    let on_supervisor = |tls: &[String], token: Option<&std::path::Path>, rest: &[&str]| {
        let mut args: Vec<&str> = vec!["--supervisor", supervisor.addr()];
        if let Some(token) = token {
            args.extend(["--token-file", token.to_str().unwrap()]);
        }
        args.extend(tls.iter().map(String::as_str));
        args.extend_from_slice(rest);
        tollgate(&args)
    };
    // Started over a connection that presents alice's certificate and no token.
    let channel = pki.channel(supervisor.addr(), "operator-alice").await;
    let run_id = SupervisorClient::new(channel)
        .start_run(tonic::Request::new(pb::StartRunRequest {
            receipt: std::fs::read_to_string(&receipt).unwrap(),
            ..Default::default()
        }))
        .await
        .expect("alice's certificate alone starts her receipt")
        .into_inner()
        .run_id;

    // Alice's certificate sees it; bob's certificate (alone, or with his token) does not.
    let alices_ps = on_supervisor(&alice_tls, None, &["ps"]);
    assert!(alices_ps.status.success(), "{alices_ps:?}");
    assert!(
        String::from_utf8_lossy(&alices_ps.stdout).contains(&run_id),
        "{alices_ps:?}"
    );
    let bob_tls = as_operator("bob");
    for token in [None, Some(tokens[1].as_path())] {
        let bobs_ps = on_supervisor(&bob_tls, token, &["ps"]);
        assert!(bobs_ps.status.success(), "{bobs_ps:?}");
        assert!(
            !String::from_utf8_lossy(&bobs_ps.stdout).contains(&run_id),
            "{bobs_ps:?}"
        );
        let bobs_stop = on_supervisor(&bob_tls, token, &["stop", &run_id]);
        assert!(!bobs_stop.status.success(), "{bobs_stop:?}");
        assert!(
            String::from_utf8_lossy(&bobs_stop.stderr).contains("not operator \"bob\"'s"),
            "{bobs_stop:?}"
        );
    }
    // Bob's token over alice's certificate: one caller, one identity.
    let mixed = on_supervisor(&alice_tls, Some(&tokens[1]), &["ps"]);
    assert!(!mixed.status.success(), "{mixed:?}");
    assert!(
        String::from_utf8_lossy(&mixed.stderr)
            .contains("the client certificate names operator \"alice\""),
        "{mixed:?}"
    );
    let stopped = on_supervisor(&alice_tls, None, &["stop", &run_id]);
    assert!(stopped.status.success(), "{stopped:?}");
}
