//! The real authority binary, over gRPC: mint, verify, restart, rejections, revocations,
//! rotation, storage failures, health and reflection.

use std::collections::HashSet;

use nix::sys::signal::Signal;
use prost::Message as _;
use tokio_stream::StreamExt as _;
use tollgate_proto::v1 as pb;
use tollgate_receipt::{
    from_text, unix_now, KeySet, NoRevocations, Receipt, ReceiptVerifier, VerifyContext,
    VerifyFailure,
};
use tollgate_tests::{authed, AuthorityProcess};
use tonic::Code;

/// A change to a valid request, and what the refusal must name.
type Mutation = Box<dyn Fn(&mut pb::MintReceiptRequest)>;

fn mint_request(subject: &str) -> pb::MintReceiptRequest {
    pb::MintReceiptRequest {
        subject: subject.into(),
        ttl_seconds: 600,
        audience: vec!["workstation".into()],
        exec: vec!["/usr/bin/python3".into()],
        fs: vec![pb::FsGrant {
            path: "/srv/project".into(),
            access: pb::FsAccess::Read as i32,
            mount: "/project".into(),
            exec: false,
            ask: false,
            ask_reads: false,
        }],
        routes: vec![pb::RouteGrant {
            name: "local".into(),
            max_sensitivity: pb::Sensitivity::High as i32,
            ask: false,
        }],
        ..Default::default()
    }
}

async fn fetch_verifier(
    client: &mut tollgate_proto::v1::authority_client::AuthorityClient<tonic::transport::Channel>,
) -> ReceiptVerifier {
    let set = client
        .get_key_set(pb::GetKeySetRequest {})
        .await
        .unwrap()
        .into_inner();
    ReceiptVerifier::new(KeySet::from_proto(&set).unwrap())
}

fn now_ctx() -> VerifyContext<'static> {
    VerifyContext {
        now: unix_now(),
        audience: Some("workstation"),
        revocations: &NoRevocations,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mint_verify_restart_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("authority");
    let authority = AuthorityProcess::start(&data);
    let token = authority.admin_token();
    let mut client = authority.client().await;

    let minted = client
        .mint_receipt(authed(&token, mint_request("summarizer")))
        .await
        .unwrap()
        .into_inner();
    let signed = minted.signed.clone().unwrap();
    assert_eq!(from_text(&minted.text).unwrap(), signed);
    let receipt = fetch_verifier(&mut client)
        .await
        .verify(&signed, &now_ctx())
        .unwrap();
    assert_eq!(receipt, minted.receipt.clone().unwrap());
    assert_eq!(receipt.owner, "admin");
    assert_eq!(receipt.subject, "summarizer");
    assert_eq!(receipt.depth, 0);
    let ttl = receipt.expires_at.unwrap().seconds - receipt.not_before.unwrap().seconds;
    assert_eq!(ttl, 600);
    let limits = receipt.limits.unwrap();
    assert_eq!(
        limits.memory_bytes,
        512 << 20,
        "unset limits take the defaults"
    );
    assert!(
        uuid::Uuid::parse_str(&receipt.receipt_id)
            .unwrap()
            .get_version_num()
            == 7
    );

    let revoked_id = {
        let second = client
            .mint_receipt(authed(&token, mint_request("second")))
            .await
            .unwrap()
            .into_inner();
        let id = second.receipt.unwrap().receipt_id;
        client
            .revoke_receipt(authed(
                &token,
                pb::RevokeReceiptRequest {
                    receipt_id: id.clone(),
                    reason: "test".into(),
                },
            ))
            .await
            .unwrap();
        id
    };
    let keys_before = client
        .get_key_set(pb::GetKeySetRequest {})
        .await
        .unwrap()
        .into_inner();

    // A clean stop removes the readiness file; a restart reads everything back.
    let status = authority.stop(Signal::SIGTERM);
    assert!(status.success(), "{status}");
    assert!(!data.join("authority.addr").exists());
    let authority = AuthorityProcess::start(&data);
    assert_eq!(
        authority.admin_token(),
        token,
        "the admin token is created once"
    );
    let mut client = authority.client().await;
    let keys_after = client
        .get_key_set(pb::GetKeySetRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(keys_before, keys_after);
    let fetched = client
        .get_receipt(authed(
            &token,
            pb::GetReceiptRequest {
                receipt_id: receipt.receipt_id.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        fetched.signed.unwrap().encode_to_vec(),
        signed.encode_to_vec()
    );
    assert!(fetched.revocation.is_none());
    let revoked = client
        .get_receipt(authed(
            &token,
            pb::GetReceiptRequest {
                receipt_id: revoked_id.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(revoked.revocation.unwrap().reason, "test");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loses_no_acknowledged_receipt_or_revocation() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("authority");
    let authority = AuthorityProcess::start(&data);
    let token = authority.admin_token();
    let mut client = authority.client().await;
    let mut ids = Vec::new();
    for i in 0..20 {
        let minted = client
            .mint_receipt(authed(&token, mint_request(&format!("agent-{i}"))))
            .await
            .unwrap()
            .into_inner();
        ids.push(minted.receipt.unwrap().receipt_id);
    }
    client
        .revoke_receipt(authed(
            &token,
            pb::RevokeReceiptRequest {
                receipt_id: ids[3].clone(),
                reason: "before the crash".into(),
            },
        ))
        .await
        .unwrap();
    authority.stop(Signal::SIGKILL);

    let authority = AuthorityProcess::start(&data);
    let mut client = authority.client().await;
    let listed = client
        .list_receipts(authed(
            &token,
            pb::ListReceiptsRequest {
                limit: 1000,
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let listed_ids: HashSet<_> = listed
        .receipts
        .iter()
        .map(|r| r.receipt_id.clone())
        .collect();
    for id in &ids {
        assert!(listed_ids.contains(id), "receipt {id} lost");
    }
    let revoked: Vec<_> = listed.receipts.iter().filter(|r| r.revoked).collect();
    assert_eq!(revoked.len(), 1);
    assert_eq!(revoked[0].receipt_id, ids[3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rejection_has_its_status_and_names_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let admin = authority.admin_token();
    let mut client = authority.client().await;

    // Missing and wrong tokens.
    let status = client.mint_receipt(mint_request("x")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let status = client
        .mint_receipt(authed("tgt_not-a-real-token", mint_request("x")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");

    // Malformed requests name the field.
    let cases: Vec<(Mutation, &str)> = vec![
        (Box::new(|r| r.subject.clear()), "subject"),
        (Box::new(|r| r.ttl_seconds = 0), "ttl_seconds"),
        (Box::new(|r| r.audience.clear()), "audience"),
        (
            Box::new(|r| r.fs[0].path = "/srv/../etc".into()),
            "fs[0].path",
        ),
        (Box::new(|r| r.fs[0].access = 0), "fs[0].access"),
        (Box::new(|r| r.exec[0] = "python3".into()), "exec[0]"),
        (
            Box::new(|r| r.routes[0].max_sensitivity = 0),
            "routes[0].max_sensitivity",
        ),
        (
            Box::new(|r| {
                r.agent = Some(pb::AgentSpec {
                    argv: vec!["/bin/sh".into()],
                    ..Default::default()
                })
            }),
            "agent.argv[0]",
        ),
    ];
    for (mutate, field) in cases {
        let mut request = mint_request("x");
        mutate(&mut request);
        let status = client
            .mint_receipt(authed(&admin, request))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert!(
            status.message().starts_with(field),
            "{field}: {}",
            status.message()
        );
    }

    // An operator with a narrow ceiling.
    let ceiling = pb::Ceiling {
        fs: vec![pb::FsGrant {
            path: "/srv/project".into(),
            access: pb::FsAccess::Read as i32,
            mount: String::new(),
            exec: false,
            ask: false,
            ask_reads: false,
        }],
        exec: vec!["/usr/bin/".into()],
        routes: vec![pb::RouteGrant {
            name: "local".into(),
            max_sensitivity: pb::Sensitivity::High as i32,
            ask: false,
        }],
        limits: Some(pb::Limits {
            memory_bytes: 1 << 30,
            ..Default::default()
        }),
        max_ttl_seconds: 3600,
        audience: vec!["workstation".into()],
        max_delegate_depth: 0,
        egress: Vec::new(),
        delegate_ask: false,
        exec_ask: Vec::new(),
    };
    let bob = client
        .add_operator(authed(
            &admin,
            pb::AddOperatorRequest {
                name: "bob".into(),
                ceiling: Some(ceiling.clone()),
                admin: false,
            },
        ))
        .await
        .unwrap()
        .into_inner()
        .token;
    let duplicate = client
        .add_operator(authed(
            &admin,
            pb::AddOperatorRequest {
                name: "bob".into(),
                ceiling: Some(ceiling),
                admin: false,
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(duplicate.code(), Code::AlreadyExists);

    let bobs = client
        .mint_receipt(authed(&bob, mint_request("within")))
        .await
        .expect("a request within the ceiling is minted")
        .into_inner();
    assert_eq!(bobs.receipt.as_ref().unwrap().owner, "bob");
    assert_eq!(
        bobs.receipt.as_ref().unwrap().limits.unwrap().memory_bytes,
        512 << 20
    );

    let above: Vec<(Mutation, &str)> = vec![
        (Box::new(|r| r.ttl_seconds = 7200), "ttl_seconds = 7200"),
        (
            Box::new(|r| r.audience.push("laptop".into())),
            "audience[1]",
        ),
        (
            Box::new(|r| r.fs[0].access = pb::FsAccess::Write as i32),
            "fs[0] = /srv/project (write)",
        ),
        (Box::new(|r| r.fs[0].path = "/etc".into()), "fs[0] = /etc"),
        (
            Box::new(|r| r.exec.push("/bin/sh".into())),
            "exec[1] = /bin/sh",
        ),
        (
            Box::new(|r| {
                r.routes.push(pb::RouteGrant {
                    name: "claude".into(),
                    max_sensitivity: pb::Sensitivity::Low as i32,
                    ask: false,
                })
            }),
            "routes[1] = claude",
        ),
        (
            Box::new(|r| {
                r.limits = Some(pb::Limits {
                    memory_bytes: 2 << 30,
                    ..Default::default()
                })
            }),
            "limits.memory_bytes",
        ),
        (
            Box::new(|r| {
                r.delegate = Some(pb::Delegation {
                    max_depth: 1,
                    ask: false,
                })
            }),
            "delegate.max_depth",
        ),
    ];
    for (mutate, grant) in above {
        let mut request = mint_request("x");
        mutate(&mut request);
        let status = client
            .mint_receipt(authed(&bob, request))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::PermissionDenied, "{grant}: {status:?}");
        assert!(
            status.message().contains(grant),
            "{grant}: {}",
            status.message()
        );
        assert!(status.message().contains("bob"), "{}", status.message());
    }

    // Admin-only calls, and other operators' receipts.
    let status = client
        .rotate_key(authed(&bob, pb::RotateKeyRequest {}))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    let status = client
        .add_operator(authed(&bob, pb::AddOperatorRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    let admins = client
        .mint_receipt(authed(&admin, mint_request("admins")))
        .await
        .unwrap()
        .into_inner()
        .receipt
        .unwrap()
        .receipt_id;
    let status = client
        .revoke_receipt(authed(
            &bob,
            pb::RevokeReceiptRequest {
                receipt_id: admins.clone(),
                reason: String::new(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    let listed = client
        .list_receipts(authed(&bob, pb::ListReceiptsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert!(listed.receipts.iter().all(|r| r.owner == "bob"));
    assert_eq!(listed.receipts.len(), 1);

    // Unknown and malformed receipt ids.
    let status = client
        .get_receipt(authed(
            &admin,
            pb::GetReceiptRequest {
                receipt_id: uuid::Uuid::now_v7().to_string(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    let status = client
        .get_receipt(authed(
            &admin,
            pb::GetReceiptRequest {
                receipt_id: "nope".into(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().starts_with("receipt_id"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_watcher_gets_current_revocations_then_live_ones() {
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let token = authority.admin_token();
    let mut client = authority.client().await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            client
                .mint_receipt(authed(&token, mint_request(&format!("a{i}"))))
                .await
                .unwrap()
                .into_inner()
                .receipt
                .unwrap()
                .receipt_id,
        );
    }
    for id in &ids[..2] {
        client
            .revoke_receipt(authed(
                &token,
                pb::RevokeReceiptRequest {
                    receipt_id: id.clone(),
                    reason: "early".into(),
                },
            ))
            .await
            .unwrap();
    }
    // Revoking twice is idempotent.
    let again = client
        .revoke_receipt(authed(
            &token,
            pb::RevokeReceiptRequest {
                receipt_id: ids[0].clone(),
                reason: "again".into(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(again.already_revoked);
    assert_eq!(again.revocation.unwrap().reason, "early");

    // A supervisor connecting late (no token needed) first receives the snapshot.
    let mut watcher = authority.client().await;
    let mut stream = watcher
        .watch_revocations(pb::WatchRevocationsRequest {
            after_seq: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut seen = Vec::new();
    loop {
        match stream.next().await.unwrap().unwrap().event.unwrap() {
            pb::revocation_event::Event::Revoked(r) => seen.push(r.receipt_id),
            pb::revocation_event::Event::CaughtUp(c) => {
                assert_eq!(c.last_seq, 2);
                break;
            }
            pb::revocation_event::Event::KeySetChanged(_) => panic!("no key was rotated"),
        }
    }
    assert_eq!(seen, ids[..2].to_vec());
    client
        .revoke_receipt(authed(
            &token,
            pb::RevokeReceiptRequest {
                receipt_id: ids[2].clone(),
                reason: "live".into(),
            },
        ))
        .await
        .unwrap();
    match stream.next().await.unwrap().unwrap().event.unwrap() {
        pb::revocation_event::Event::Revoked(r) => {
            assert_eq!(r.receipt_id, ids[2]);
            assert_eq!(r.seq, 3);
            assert_eq!(r.reason, "live");
        }
        other => panic!("unexpected {other:?}"),
    }
    // Resuming after a known seq skips what was already seen.
    let mut resumed = watcher
        .watch_revocations(pb::WatchRevocationsRequest {
            after_seq: 2,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    match resumed.next().await.unwrap().unwrap().event.unwrap() {
        pb::revocation_event::Event::Revoked(r) => assert_eq!(r.seq, 3),
        other => panic!("unexpected {other:?}"),
    }
    // Shutdown is not held up by open streams.
    let status = authority.stop(Signal::SIGTERM);
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_keeps_old_receipts_verifiable() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("authority");
    let authority = AuthorityProcess::start(&data);
    let token = authority.admin_token();
    let mut client = authority.client().await;
    let old = client
        .mint_receipt(authed(&token, mint_request("before")))
        .await
        .unwrap()
        .into_inner()
        .signed
        .unwrap();
    let rotated = client
        .rotate_key(authed(&token, pb::RotateKeyRequest {}))
        .await
        .unwrap()
        .into_inner();
    let (active, retired) = (rotated.active.unwrap(), rotated.retired.unwrap());
    assert_eq!(retired.key_id, old.key_id);
    assert!(active.active && !retired.active);
    assert!(
        !data
            .join("keys")
            .join(format!("{}.key", old.key_id))
            .exists(),
        "old private key deleted"
    );
    let new = client
        .mint_receipt(authed(&token, mint_request("after")))
        .await
        .unwrap()
        .into_inner()
        .signed
        .unwrap();
    assert_eq!(new.key_id, active.key_id);
    let set = client
        .get_key_set(pb::GetKeySetRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(set.keys.len(), 2);
    let retired_entry = set.keys.iter().find(|k| k.key_id == old.key_id).unwrap();
    let old_receipt = Receipt::decode(old.receipt.as_slice()).unwrap();
    assert_eq!(retired_entry.verify_until, old_receipt.expires_at);
    let verifier = fetch_verifier(&mut client).await;
    verifier.verify(&old, &now_ctx()).unwrap();
    verifier.verify(&new, &now_ctx()).unwrap();

    // Survives a restart: the new key signs, both verify.
    authority.stop(Signal::SIGTERM);
    let authority = AuthorityProcess::start(&data);
    let mut client = authority.client().await;
    let after_restart = client
        .mint_receipt(authed(&token, mint_request("restart")))
        .await
        .unwrap()
        .into_inner()
        .signed
        .unwrap();
    assert_eq!(after_restart.key_id, active.key_id);
    let verifier = fetch_verifier(&mut client).await;
    verifier.verify(&old, &now_ctx()).unwrap();

    // A receipt signed by a key the authority never had is an unknown key.
    let stranger = tollgate_receipt::ReceiptSigner::generate()
        .sign(&mut Receipt::decode(old.receipt.as_slice()).unwrap());
    assert_eq!(
        verifier
            .verify(&stranger, &now_ctx())
            .unwrap_err()
            .failure(),
        VerifyFailure::UnknownKey
    );
}

#[test]
fn corrupt_database_stops_the_daemon_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("authority");
    tollgate_tests::private_dir(&data);
    let garbage = vec![0x42u8; 16384];
    std::fs::write(data.join("authority.db"), &garbage).unwrap();
    let (status, stderr) = AuthorityProcess::start_with(&data, &[])
        .err()
        .expect("a corrupt database must not start");
    assert!(status.contains("65"), "exit status {status}");
    let line = stderr.lines().last().unwrap();
    assert!(
        line.contains("is corrupt") && line.contains("refusing to start"),
        "{line}"
    );
    assert_eq!(
        std::fs::read(data.join("authority.db")).unwrap(),
        garbage,
        "never reset"
    );

    // A missing private key for the active key is also fatal, and says which file.
    let data = dir.path().join("second");
    let authority = AuthorityProcess::start(&data);
    authority.stop(Signal::SIGTERM);
    for entry in std::fs::read_dir(data.join("keys")).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    let (status, stderr) = AuthorityProcess::start_with(&data, &[]).err().unwrap();
    assert!(status.contains("73"), "exit status {status}");
    assert!(stderr.contains("signing key file"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let channel = tonic::transport::Channel::from_shared(authority.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let reply = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "tollgate.v1.Authority".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        reply.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    let (v1, v1alpha) = tollgate_tests::reflected_services(channel).await;
    for names in [v1, v1alpha] {
        assert_eq!(
            names,
            [
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection",
                "tollgate.v1.Authority",
            ],
            "only what the authority serves"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_revocations_all_reach_a_watcher_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let token = authority.admin_token();
    let mut client = authority.client().await;
    let mut ids = Vec::new();
    for i in 0..150 {
        ids.push(
            client
                .mint_receipt(authed(&token, mint_request(&format!("r{i}"))))
                .await
                .unwrap()
                .into_inner()
                .receipt
                .unwrap()
                .receipt_id,
        );
    }
    let mut watcher = authority.client().await;
    let mut stream = watcher
        .watch_revocations(pb::WatchRevocationsRequest {
            after_seq: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    match stream.next().await.unwrap().unwrap().event.unwrap() {
        pb::revocation_event::Event::CaughtUp(c) => assert_eq!(c.last_seq, 0),
        other => panic!("unexpected {other:?}"),
    }
    // Revoke everything at once from many tasks: commits and broadcasts interleave.
    let mut tasks = Vec::new();
    for id in ids.clone() {
        let mut client = client.clone();
        let token = token.clone();
        tasks.push(tokio::spawn(async move {
            client
                .revoke_receipt(authed(
                    &token,
                    pb::RevokeReceiptRequest {
                        receipt_id: id,
                        reason: "burst".into(),
                    },
                ))
                .await
                .unwrap();
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut seqs = Vec::new();
    let mut seen = HashSet::new();
    while seqs.len() < ids.len() {
        let event = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next())
            .await
            .expect("a revocation went missing")
            .unwrap()
            .unwrap();
        if let Some(pb::revocation_event::Event::Revoked(r)) = event.event {
            seqs.push(r.seq);
            seen.insert(r.receipt_id);
        }
    }
    assert_eq!(
        seqs,
        (1..=ids.len() as u64).collect::<Vec<_>>(),
        "in order, no gaps, no duplicates"
    );
    assert_eq!(seen.len(), ids.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_rejections_operator_input_and_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let admin = authority.admin_token();
    let mut client = authority.client().await;
    let ceiling = pb::Ceiling {
        routes: vec![pb::RouteGrant {
            name: "claude".into(),
            max_sensitivity: pb::Sensitivity::Low as i32,
            ask: false,
        }],
        exec: vec!["/usr/bin/".into()],
        fs: vec![pb::FsGrant {
            path: "/srv".into(),
            access: pb::FsAccess::Read as i32,
            mount: String::new(),
            exec: false,
            ask: false,
            ask_reads: false,
        }],
        max_ttl_seconds: 600,
        ..Default::default()
    };
    let add = |name: &str, ceiling: Option<pb::Ceiling>| {
        authed(
            &admin,
            pb::AddOperatorRequest {
                name: name.into(),
                ceiling,
                admin: false,
            },
        )
    };
    for (request, field) in [
        (add("bad name", Some(ceiling.clone())), "name"),
        (add("dave", None), "ceiling"),
        (
            add(
                "dave",
                Some(pb::Ceiling {
                    max_ttl_seconds: 0,
                    ..ceiling.clone()
                }),
            ),
            "ceiling.max_ttl_seconds",
        ),
    ] {
        let status = client.add_operator(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert!(status.message().starts_with(field), "{}", status.message());
    }
    let dave = client
        .add_operator(add("dave", Some(ceiling)))
        .await
        .unwrap()
        .into_inner()
        .token;
    // Lower-case scheme works too.
    let mut request = tonic::Request::new(pb::MintReceiptRequest {
        routes: vec![pb::RouteGrant {
            name: "claude".into(),
            max_sensitivity: pb::Sensitivity::Low as i32,
            ask: false,
        }],
        ..mint_request("lower")
    });
    request
        .metadata_mut()
        .insert("authorization", format!("bearer {dave}").parse().unwrap());
    client.mint_receipt(request).await.expect("minted");

    // A known route at a higher sensitivity than the ceiling allows.
    let mut too_sensitive = mint_request("x");
    too_sensitive.routes = vec![pb::RouteGrant {
        name: "claude".into(),
        max_sensitivity: pb::Sensitivity::Medium as i32,
        ask: false,
    }];
    let status = client
        .mint_receipt(authed(&dave, too_sensitive))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(
        status.message().contains("routes[0] = claude (medium)"),
        "{}",
        status.message()
    );

    // not_before further ahead than the ceiling's max ttl.
    let mut later = mint_request("x");
    later.routes.clear();
    later.not_before = Some(prost_types::Timestamp {
        seconds: unix_now() + 3600,
        nanos: 0,
    });
    let status = client.mint_receipt(authed(&dave, later)).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(
        status.message().contains("not_before"),
        "{}",
        status.message()
    );

    // Beyond any receipt's lifetime: malformed, not merely above a ceiling.
    let mut forever = mint_request("x");
    forever.ttl_seconds = u64::MAX;
    let status = client
        .mint_receipt(authed(&admin, forever))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().starts_with("ttl_seconds"));
    // Non-canonical receipt ids are malformed.
    let status = client
        .get_receipt(authed(
            &admin,
            pb::GetReceiptRequest {
                receipt_id: uuid::Uuid::now_v7().to_string().to_uppercase(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
}

/// A mount no supervisor would start (at or beneath a system path the sandbox shows from the
/// host, or a path it builds itself) is refused at mint with a one-line reason naming the
/// field and the path, instead of being signed and then refused by every supervisor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounts_every_supervisor_refuses_are_not_signed() {
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let admin = authority.admin_token();
    let mut client = authority.client().await;
    let mut targets = vec![
        "/etc",
        "/etc/ssl",
        "/usr/local/bin",
        "/bin",
        "/lib64/x",
        "/run/x",
    ];
    targets.extend(tollgate_receipt::paths::SYSTEM_PATHS);
    for target in targets {
        let mut request = mint_request("system-mount");
        request.fs[0].mount = target.into();
        let status = client
            .mint_receipt(authed(&admin, request))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{target}: {status:?}");
        let message = status.message();
        assert!(message.starts_with("fs[0].mount: "), "{target}: {message}");
        assert!(message.contains(&format!("{target:?}")), "{message}");
        assert!(!message.contains('\n'), "one line: {message:?}");
    }
    // Whole path components: a target that merely starts with a system path's name is fine.
    let mut request = mint_request("near-miss");
    request.fs[0].mount = "/etcetera".into();
    client
        .mint_receipt(authed(&admin, request))
        .await
        .expect("/etcetera is not /etc");
}

#[test]
fn a_missing_database_or_a_second_daemon_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("authority");
    let first = AuthorityProcess::start(&data);
    let token = first.admin_token();

    // A second daemon on the same directory stops at once and leaves the first one's
    // readiness file alone.
    let second = std::process::Command::new(tollgate_tests::bin_path("tollgate-authority"))
        .arg("--data-dir")
        .arg(&data)
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(75), "{stderr}");
    assert!(
        stderr.contains("in use by another tollgate-authority"),
        "{stderr}"
    );
    assert!(data.join("authority.addr").exists());
    first.stop(Signal::SIGTERM);

    // Losing the database must not silently start a fresh authority.
    for entry in std::fs::read_dir(&data).unwrap().flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("authority.db")
        {
            std::fs::remove_file(entry.path()).unwrap();
        }
    }
    let (status, stderr) = AuthorityProcess::start_with(&data, &[]).err().unwrap();
    assert!(status.contains("66"), "exit status {status}");
    assert!(
        stderr.contains("is missing but this data directory was initialised"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(data.join("admin.token"))
            .unwrap()
            .trim(),
        token,
        "the admin token is untouched"
    );
}

#[test]
fn sigterm_right_after_readiness_stops_cleanly() {
    // The signal handlers must be in place before the readiness file appears: a daemon
    // stopped at once must still shut down cleanly (closing its audit log with a checkpoint),
    // not die of the signal's default action.
    for _ in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        let authority = AuthorityProcess::start(&dir.path().join("authority"));
        let log = authority.data_dir().join("audit");
        let status = authority.stop(Signal::SIGTERM);
        assert!(status.success(), "{status}");
        let entries = std::fs::read_to_string(log.join("log-000001.jsonl")).unwrap();
        assert!(
            entries
                .lines()
                .last()
                .unwrap()
                .contains("\"component_stopped\""),
            "{entries}"
        );
    }
}

/// `--log-format json` writes one JSON object a line (a collector parses every line), and the
/// text format writes no colour codes into a file; a SIGHUP is logged, never fatal.
#[test]
fn logs_are_json_lines_or_plain_text() {
    use std::process::{Command, Stdio};
    for format in ["json", "text"] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("authority");
        let log = dir.path().join("stderr");
        let mut child = Command::new(tollgate_tests::bin_path("tollgate-authority"))
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen", "127.0.0.1:0", "--log-format", format])
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        tollgate_tests::wait_for_file(
            &data.join("authority.addr"),
            &mut child,
            std::time::Duration::from_secs(30),
        )
        .unwrap();
        // A SIGHUP never stops it.
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            Signal::SIGHUP,
        )
        .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !std::fs::read_to_string(&log)
            .unwrap()
            .contains("SIGHUP: nothing to reload")
        {
            assert!(std::time::Instant::now() < deadline, "SIGHUP not handled");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(child.try_wait().unwrap().is_none(), "SIGHUP stopped it");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            Signal::SIGTERM,
        )
        .unwrap();
        assert!(child.wait().unwrap().success());
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(!text.contains('\u{1b}'), "colour codes in a file: {text:?}");
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.len() >= 2, "{text}");
        if format == "json" {
            for line in &lines {
                let event: serde_json::Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                assert!(event["level"].is_string(), "{line}");
                assert!(event["fields"]["message"].is_string(), "{line}");
            }
            assert!(text.contains("authority listening"), "{text}");
        }
    }
}

/// Under systemd (`Type=notify`) the authority says READY=1 once it listens, with its address
/// in STATUS, and STOPPING=1 when it stops.
#[test]
fn systemd_hears_ready_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let data = dir.path().join("authority");
    let mut child = Command::new(tollgate_tests::bin_path("tollgate-authority"))
        .arg("--data-dir")
        .arg(&data)
        .args(["--listen", "127.0.0.1:0"])
        .env("NOTIFY_SOCKET", &socket_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut buffer = [0u8; 512];
    let n = socket.recv(&mut buffer).unwrap();
    let ready = String::from_utf8_lossy(&buffer[..n]).into_owned();
    assert!(ready.contains("READY=1"), "{ready}");
    let addr = std::fs::read_to_string(data.join("authority.addr")).unwrap();
    assert!(
        ready.contains(&format!("STATUS=listening on {}", addr.trim())),
        "{ready}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        Signal::SIGTERM,
    )
    .unwrap();
    let n = socket.recv(&mut buffer).unwrap();
    assert!(String::from_utf8_lossy(&buffer[..n]).contains("STOPPING=1"));
    assert!(child.wait().unwrap().success());
}

/// `--metrics-listen` serves the authority's metrics, which the reference OpenMetrics parser
/// reads: mints by outcome, revocations, the supervisors following the revocation stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authority_metrics_are_scraped_and_parsed() {
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start_with(
        &dir.path().join("authority"),
        &["--metrics-listen", "127.0.0.1:0"],
    )
    .unwrap();
    let token = authority.admin_token();
    let mut client = authority.client().await;
    let minted = client
        .mint_receipt(authed(&token, mint_request("metered")))
        .await
        .unwrap()
        .into_inner();
    client
        .revoke_receipt(authed(
            &token,
            pb::RevokeReceiptRequest {
                receipt_id: minted.receipt.unwrap().receipt_id,
                reason: "r".into(),
            },
        ))
        .await
        .unwrap();
    let _watching = client
        .watch_revocations(pb::WatchRevocationsRequest {
            after_seq: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let samples = tollgate_tests::scrape_metrics(&authority.data_dir().join("metrics.addr"));
    let value = |line_start: &str| tollgate_tests::sample(&samples, line_start);
    assert_eq!(
        value("tollgate_authority_mints_total [('result', 'ok')]"),
        1.0
    );
    assert_eq!(value("tollgate_authority_mint_seconds_count []"), 1.0);
    assert_eq!(value("tollgate_authority_revocations_total []"), 1.0);
    assert!(value("tollgate_authority_revocation_watchers []") >= 1.0);
    // The mint's and the revocation's entries, at least, were appended durably.
    assert!(value("tollgate_authority_audit_append_seconds_count []") >= 2.0);
    // A clean stop removes every readiness file, metrics.addr with authority.addr.
    let data = authority.data_dir().to_owned();
    drop(client);
    drop(_watching);
    assert!(authority.stop(Signal::SIGTERM).success());
    assert!(!data.join("authority.addr").exists());
    assert!(!data.join("metrics.addr").exists(), "metrics.addr left");
}

/// SIGHUP reads the config file's mint policy again: receipts minted after it carry the new
/// policy version and default limits; a file that does not load leaves the policy in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_mint_policy() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("authority.toml");
    let policy = |version: &str, calls: u64| {
        format!("policy_version = \"{version}\"\n[defaults]\ntool_calls = {calls}\n")
    };
    std::fs::write(&config, policy("p1", 5)).unwrap();
    let data = dir.path().join("authority");
    let authority =
        AuthorityProcess::start_with(&data, &["--config", config.to_str().unwrap()]).unwrap();
    let token = authority.admin_token();
    let mint = || async {
        let mut request = mint_request("policy");
        request.limits = None;
        authority
            .client()
            .await
            .mint_receipt(authed(&token, request))
            .await
            .unwrap()
            .into_inner()
            .receipt
            .unwrap()
    };
    let first = mint().await;
    assert_eq!(first.policy_version, "p1");
    assert_eq!(first.limits.unwrap().tool_calls, 5);

    let log = data.with_extension("stderr");
    let hangup_and_wait = |needle: &str| {
        let before = std::fs::read_to_string(&log)
            .unwrap()
            .matches(needle)
            .count();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(authority.pid() as i32),
            Signal::SIGHUP,
        )
        .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_to_string(&log)
            .unwrap()
            .matches(needle)
            .count()
            == before
        {
            assert!(std::time::Instant::now() < deadline, "no {needle:?}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    std::fs::write(&config, policy("p2", 7)).unwrap();
    hangup_and_wait("mint policy reloaded");
    let second = mint().await;
    assert_eq!(second.policy_version, "p2");
    assert_eq!(second.limits.unwrap().tool_calls, 7);

    std::fs::write(&config, "policy_version = \"p3\"\ncolour = \"red\"\n").unwrap();
    hangup_and_wait("config file not reloaded");
    assert_eq!(mint().await.policy_version, "p2");
}
