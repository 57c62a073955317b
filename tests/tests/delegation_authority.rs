//! Delegation at the real authority (no root): `AddSupervisor`, `DelegateReceipt` with every
//! refusal named, the depth and expiry rules, who may call it, and the cascading
//! `RevokeReceipt` on the revocation stream. See docs/plans/delegation.md §3, §4 and §7.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output};

use prost::Message as _;
use tokio_stream::StreamExt as _;
use tollgate_audit::{AuditReader, Decision, Entry, EntryKind, MetaValue};
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::authority_client::AuthorityClient;
use tollgate_receipt::{
    from_text, unix_now, KeySet, NoRevocations, ReceiptVerifier, VerifyContext,
};
use tollgate_tests::{authed, bin_path, stderr_line, AuthorityProcess};
use tonic::transport::Channel;
use tonic::Code;

/// The supervisor id every test enrols.
const SUP: &str = "ws";

fn grant(path: &str, access: pb::FsAccess, mount: &str) -> pb::FsGrant {
    pb::FsGrant {
        path: path.into(),
        access: access as i32,
        mount: mount.into(),
        exec: false,
        ask: false,
        ask_reads: false,
    }
}

fn route(name: &str, sensitivity: pb::Sensitivity) -> pb::RouteGrant {
    pb::RouteGrant {
        name: name.into(),
        max_sensitivity: sensitivity as i32,
        ask: false,
    }
}

fn parent_limits() -> pb::Limits {
    pb::Limits {
        memory_bytes: 512 << 20,
        pids: 64,
        cpu_millicores: 1000,
        output_bytes: 1 << 20,
        tmpfs_bytes: 8 << 20,
        tool_calls: 100,
        tokens: 1000,
        files: 1024,
        ..Default::default()
    }
}

/// A root receipt for `audience` that may delegate `max_depth` levels.
fn parent_request(audience: &str, max_depth: u32, ttl_seconds: u64) -> pb::MintReceiptRequest {
    pb::MintReceiptRequest {
        subject: "orchestrator".into(),
        ttl_seconds,
        audience: vec![audience.into()],
        fs: vec![
            grant("/srv/p", pb::FsAccess::Read, "/project"),
            grant("/srv/p/out", pb::FsAccess::Write, ""),
            grant("/opt/tools", pb::FsAccess::Read, "/opt"),
        ],
        exec: vec!["/bin/sh".into(), "/opt/run".into()],
        routes: vec![
            route("claude", pb::Sensitivity::Low),
            route("local", pb::Sensitivity::High),
        ],
        limits: Some(parent_limits()),
        delegate: Some(pb::Delegation {
            max_depth,
            ask: false,
        }),
        ..Default::default()
    }
}

/// A child well within [`parent_request`].
fn child_spec(max_depth: u32) -> pb::ChildSpec {
    pb::ChildSpec {
        subject: "reader".into(),
        ttl_seconds: 60,
        fs: vec![
            grant("/srv/p/src", pb::FsAccess::Read, "/src"),
            grant("/srv/p/out/c1", pb::FsAccess::Write, ""),
        ],
        exec: vec!["/bin/sh".into()],
        routes: vec![route("claude", pb::Sensitivity::Low)],
        limits: Some(pb::Limits {
            memory_bytes: 256 << 20,
            tool_calls: 10,
            tokens: 100,
            ..Default::default()
        }),
        delegate: (max_depth > 0).then_some(pb::Delegation {
            max_depth,
            ask: false,
        }),
        ..Default::default()
    }
}

/// The authority with `ws` enrolled: (process, admin token, ws's delegation token).
async fn start(dir: &Path) -> (AuthorityProcess, String, String) {
    let authority = AuthorityProcess::start(&dir.join("authority"));
    let admin = authority.admin_token();
    let token = authority.add_supervisor(SUP).await;
    (authority, admin, token)
}

async fn mint(
    client: &mut AuthorityClient<Channel>,
    admin: &str,
    request: pb::MintReceiptRequest,
) -> pb::MintReceiptResponse {
    client
        .mint_receipt(authed(admin, request))
        .await
        .expect("mint the parent")
        .into_inner()
}

async fn delegate(
    client: &mut AuthorityClient<Channel>,
    token: &str,
    parent: &pb::SignedReceipt,
    child: pb::ChildSpec,
) -> Result<pb::MintReceiptResponse, tonic::Status> {
    delegate_amended(client, token, parent, vec![], child).await
}

/// [`delegate`] with the parent's amendments for children.
async fn delegate_amended(
    client: &mut AuthorityClient<Channel>,
    token: &str,
    parent: &pb::SignedReceipt,
    amendments: Vec<pb::SignedAmendment>,
    child: pb::ChildSpec,
) -> Result<pb::MintReceiptResponse, tonic::Status> {
    client
        .delegate_receipt(authed(
            token,
            pb::DelegateReceiptRequest {
                supervisor_id: SUP.into(),
                parent: Some(parent.clone()),
                child: Some(child),
                amendments,
            },
        ))
        .await
        .map(tonic::Response::into_inner)
}

fn signed(minted: &pb::MintReceiptResponse) -> pb::SignedReceipt {
    minted.signed.clone().expect("signed")
}

fn id(minted: &pb::MintReceiptResponse) -> String {
    minted.receipt.as_ref().expect("receipt").receipt_id.clone()
}

/// Every entry of the authority's audit log (each call's entries are on disk before it
/// returns).
fn audit(authority: &AuthorityProcess) -> Vec<Entry> {
    AuditReader::open(&authority.data_dir().join("audit"))
        .expect("open the audit log")
        .collect::<Result<_, _>>()
        .expect("read the audit log")
}

fn meta<'a>(entry: &'a Entry, key: &str) -> Option<&'a MetaValue> {
    entry.metadata.get(key)
}

fn text(value: &str) -> Option<MetaValue> {
    Some(MetaValue::Str(value.into()))
}

async fn all_receipts(
    client: &mut AuthorityClient<Channel>,
    admin: &str,
) -> Vec<pb::ReceiptSummary> {
    client
        .list_receipts(authed(
            admin,
            pb::ListReceiptsRequest {
                include_expired: true,
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner()
        .receipts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delegation_within_scope_is_minted_and_chained() {
    let dir = tempfile::tempdir().unwrap();
    let (authority, admin, token) = start(dir.path()).await;
    let mut client = authority.client().await;
    let parent = mint(&mut client, &admin, parent_request(SUP, 1, 600)).await;
    let parent_receipt = parent.receipt.clone().unwrap();

    let minted = delegate(&mut client, &token, &signed(&parent), child_spec(0))
        .await
        .expect("a child within its parent is minted");
    let child = minted.receipt.clone().unwrap();
    assert_eq!(from_text(&minted.text).unwrap(), signed(&minted));
    assert_eq!(child.parent_receipt_id, parent_receipt.receipt_id);
    assert_eq!(child.depth, 1);
    assert_eq!(child.owner, "admin", "the parent's owner");
    assert_eq!(child.audience, [SUP]);
    assert_eq!(child.subject, "reader");
    assert_eq!(child.policy_version, parent_receipt.policy_version);
    assert!(child.expires_at.unwrap().seconds <= parent_receipt.expires_at.unwrap().seconds);
    assert_eq!(
        child.expires_at.unwrap().seconds - child.not_before.unwrap().seconds,
        60
    );
    assert_eq!(child.delegate, None);
    let limits = child.limits.unwrap();
    assert_eq!(limits.memory_bytes, 256 << 20);
    assert_eq!(
        (limits.pids, limits.cpu_millicores, limits.tmpfs_bytes),
        (64, 1000, 8 << 20),
        "limits left at 0 take the parent's"
    );

    // It verifies against the published key set, for its supervisor only.
    let set = client
        .get_key_set(pb::GetKeySetRequest {})
        .await
        .unwrap()
        .into_inner();
    let verifier = ReceiptVerifier::new(KeySet::from_proto(&set).unwrap());
    let context = |audience| VerifyContext {
        now: unix_now(),
        audience: Some(audience),
        revocations: &NoRevocations,
    };
    assert_eq!(
        verifier.verify(&signed(&minted), &context(SUP)).unwrap(),
        child
    );
    assert!(verifier
        .verify(&signed(&minted), &context("workstation"))
        .is_err());

    // Listed with its parent link; the owner can read it back.
    let listed = all_receipts(&mut client, &admin).await;
    assert_eq!(listed.len(), 2);
    let summary = listed
        .iter()
        .find(|r| r.receipt_id == child.receipt_id)
        .unwrap();
    assert_eq!(
        (summary.parent_receipt_id.as_str(), summary.depth),
        (parent_receipt.receipt_id.as_str(), 1)
    );
    let root = listed
        .iter()
        .find(|r| r.receipt_id == parent_receipt.receipt_id)
        .unwrap();
    assert_eq!((root.parent_receipt_id.as_str(), root.depth), ("", 0));
    let fetched = client
        .get_receipt(authed(
            &admin,
            pb::GetReceiptRequest {
                receipt_id: child.receipt_id.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(fetched.signed, minted.signed);

    // The mint is audited with its chain and who asked for it.
    let entries = audit(&authority);
    let entry = entries
        .iter()
        .find(|e| {
            e.kind == EntryKind::ReceiptMinted
                && e.receipt_id.as_deref() == Some(child.receipt_id.as_str())
        })
        .expect("a receipt_minted entry for the child");
    assert_eq!(entry.decision, Some(Decision::Allow));
    assert_eq!(meta(entry, "delegated_by").cloned(), text(SUP));
    assert_eq!(
        meta(entry, "parent_receipt_id").cloned(),
        text(&parent_receipt.receipt_id)
    );
    assert_eq!(meta(entry, "depth"), Some(&MetaValue::Int(1)));
    assert_eq!(meta(entry, "owner").cloned(), text("admin"));
    let enrolled = entries
        .iter()
        .find(|e| e.kind == EntryKind::SupervisorEnrolled)
        .expect("a supervisor_enrolled entry");
    assert_eq!(enrolled.decision, Some(Decision::Allow));
    assert_eq!(meta(enrolled, "supervisor_id").cloned(), text(SUP));
    assert_eq!(meta(enrolled, "by").cloned(), text("admin"));
    // Neither in the audit log (whose redactor would mask it anyway) nor in the daemon's
    // own log, where nothing masks it.
    let mut log = std::fs::read_dir(authority.data_dir().join("audit"))
        .unwrap()
        .flatten()
        .map(|f| std::fs::read_to_string(f.path()).unwrap_or_default())
        .collect::<String>();
    log += &std::fs::read_to_string(authority.data_dir().with_extension("stderr")).unwrap();
    assert!(
        !log.contains(&token) && !log.contains(&token[4..]),
        "the delegation token is never logged"
    );
}

/// A change that widens [`child_spec`], and the exact refusal (`{P}` is the parent's id).
type Widening = (&'static str, Code, Box<dyn Fn(&mut pb::ChildSpec)>, String);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wider_delegations_are_refused_naming_the_grant() {
    let dir = tempfile::tempdir().unwrap();
    let (authority, admin, token) = start(dir.path()).await;
    let mut client = authority.client().await;
    let parent = mint(&mut client, &admin, parent_request(SUP, 1, 600)).await;
    let p = id(&parent);
    let above = |grant: &str, detail: &str| -> String {
        format!("{grant} is above parent receipt {p}'s grants ({detail})")
    };
    let denied = Code::PermissionDenied;
    let mut table: Vec<Widening> = vec![
        (
            "write beneath a read grant",
            denied,
            Box::new(|c| c.fs[0].access = pb::FsAccess::Write as i32),
            above("fs[0] = /srv/p/src (write)", "/srv/p is granted read"),
        ),
        (
            "a path no grant covers",
            denied,
            Box::new(|c| c.fs[0] = grant("/etc", pb::FsAccess::Read, "")),
            above("fs[0] = /etc (read)", "no parent fs grant covers it"),
        ),
        (
            "a sibling sharing a prefix",
            denied,
            Box::new(|c| c.fs[1] = grant("/srv/pp", pb::FsAccess::Read, "")),
            above("fs[1] = /srv/pp (read)", "no parent fs grant covers it"),
        ),
        (
            "an executable the parent lacks",
            denied,
            Box::new(|c| c.exec.push("/usr/bin/curl".into())),
            above("exec[1] = /usr/bin/curl", "not in its exec list"),
        ),
        (
            "another binary mounted behind an allowed name",
            denied,
            Box::new(|c| {
                c.exec.push("/opt/run".into());
                c.fs.push(grant("/srv/p/src/fake", pb::FsAccess::Read, "/opt"));
            }),
            above(
                "fs[2].mount = /opt",
                "it covers exec /opt/run, which the parent runs from another source",
            ),
        ),
        (
            "a route above its sensitivity",
            denied,
            Box::new(|c| c.routes[0].max_sensitivity = pb::Sensitivity::High as i32),
            above("routes[0] = claude up to high", "claude is granted up to low"),
        ),
        (
            "a route not granted",
            denied,
            Box::new(|c| c.routes.push(route("gpt", pb::Sensitivity::Low))),
            above("routes[1] = gpt", "route not granted"),
        ),
        (
            "one level more than the parent may hand on",
            denied,
            Box::new(|c| c.delegate = Some(pb::Delegation { max_depth: 1, ask: false })),
            above(
                "delegate.max_depth = 1",
                "its children may delegate at most 0 levels",
            ),
        ),
        (
            "a malformed path",
            Code::InvalidArgument,
            Box::new(|c| c.fs[0].path = "/srv/p/../etc".into()),
            "fs[0].path: \"/srv/p/../etc\" must be an absolute path without '.', '..', '//' or a trailing '/'".into(),
        ),
        (
            "an agent whose program is not in exec",
            Code::InvalidArgument,
            Box::new(|c| {
                c.agent = Some(pb::AgentSpec {
                    argv: vec!["/opt/run".into()],
                    ..Default::default()
                })
            }),
            "agent.argv[0]: \"/opt/run\" must also be listed in exec".into(),
        ),
        (
            "no subject",
            Code::InvalidArgument,
            Box::new(|c| c.subject.clear()),
            "subject: must be 1 to 128 characters".into(),
        ),
    ];
    // Each of the seven limits, one above the parent's.
    let parent_values = parent_limits();
    type Setter = fn(&mut pb::Limits, u64);
    let limits: [(&str, u64, Setter); 7] = [
        ("memory_bytes", parent_values.memory_bytes, |l, v| {
            l.memory_bytes = v
        }),
        ("pids", parent_values.pids.into(), |l, v| l.pids = v as u32),
        (
            "cpu_millicores",
            parent_values.cpu_millicores.into(),
            |l, v| l.cpu_millicores = v as u32,
        ),
        ("output_bytes", parent_values.output_bytes, |l, v| {
            l.output_bytes = v
        }),
        ("tmpfs_bytes", parent_values.tmpfs_bytes, |l, v| {
            l.tmpfs_bytes = v
        }),
        ("tool_calls", parent_values.tool_calls, |l, v| {
            l.tool_calls = v
        }),
        ("tokens", parent_values.tokens, |l, v| l.tokens = v),
    ];
    for (name, value, set) in limits {
        table.push((
            name,
            denied,
            Box::new(move |c| set(c.limits.as_mut().unwrap(), value + 1)),
            above(
                &format!("limits.{name} = {}", value + 1),
                &value.to_string(),
            ),
        ));
    }

    for (what, code, widen, message) in &table {
        let mut spec = child_spec(0);
        widen(&mut spec);
        let status = delegate(&mut client, &token, &signed(&parent), spec)
            .await
            .expect_err(what);
        assert_eq!(status.code(), *code, "{what}: {}", status.message());
        assert_eq!(status.message(), message, "{what}");
    }
    // The ttl rule: never past the parent's expiry (its remaining time depends on the clock).
    let mut spec = child_spec(0);
    spec.ttl_seconds = 601;
    let status = delegate(&mut client, &token, &signed(&parent), spec)
        .await
        .unwrap_err();
    assert_eq!(status.code(), denied);
    let prefix = format!("ttl_seconds = 601 is longer than parent receipt {p}'s remaining ");
    assert!(
        status.message().starts_with(&prefix) && status.message().ends_with(" s"),
        "{}",
        status.message()
    );

    // Each refusal is audited with the same reason, and nothing was stored.
    let refusals: Vec<Entry> = audit(&authority)
        .into_iter()
        .filter(|e| e.kind == EntryKind::ReceiptRefused)
        .collect();
    assert_eq!(refusals.len(), table.len() + 1);
    for ((what, code, _, message), entry) in table.iter().zip(&refusals) {
        assert_eq!(entry.reason.as_deref(), Some(message.as_str()), "{what}");
        assert_eq!(entry.decision, Some(Decision::Deny));
        assert_eq!(meta(entry, "operator").cloned(), text("supervisor:ws"));
        assert_eq!(meta(entry, "parent_receipt_id").cloned(), text(&p));
        let code = if *code == denied {
            "permission_denied"
        } else {
            "invalid_argument"
        };
        assert_eq!(meta(entry, "code").cloned(), text(code), "{what}");
    }
    let listed = all_receipts(&mut client, &admin).await;
    assert_eq!(listed.len(), 1, "only the parent exists");
    assert!(!audit(&authority)
        .iter()
        .any(|e| e.kind == EntryKind::ReceiptMinted && e.metadata.contains_key("delegated_by")));
}

/// A signed amendment of `receipt_id` adding a gateway-only read of `path`.
async fn amendment(
    client: &mut AuthorityClient<Channel>,
    admin: &str,
    receipt_id: &str,
    path: &str,
    for_children: bool,
) -> pb::SignedAmendment {
    client
        .amend_receipt(authed(
            admin,
            pb::AmendReceiptRequest {
                receipt_id: receipt_id.into(),
                add_fs: vec![grant(path, pb::FsAccess::Read, "")],
                for_children,
                ..Default::default()
            },
        ))
        .await
        .expect("AmendReceipt")
        .into_inner()
        .signed
        .expect("signed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_parents_own_amendments_for_children_widen_a_child() {
    let dir = tempfile::tempdir().unwrap();
    let (authority, admin, token) = start(dir.path()).await;
    let mut client = authority.client().await;
    let parent = mint(&mut client, &admin, parent_request(SUP, 1, 300)).await;
    let other = mint(&mut client, &admin, parent_request(SUP, 1, 300)).await;
    let not_for_children = amendment(&mut client, &admin, &id(&parent), "/srv/extra", false).await;
    let for_children = amendment(&mut client, &admin, &id(&parent), "/srv/extra", true).await;
    let others = amendment(&mut client, &admin, &id(&other), "/srv/extra", true).await;
    let mut forged = for_children.clone();
    let mut changed = pb::Amendment::decode(forged.amendment.as_slice()).unwrap();
    changed.add_fs[0].path = "/".into();
    forged.amendment = changed.encode_to_vec();
    let child = pb::ChildSpec {
        fs: vec![grant("/srv/extra/data", pb::FsAccess::Read, "")],
        ..child_spec(0)
    };
    for (name, amendments) in [
        ("none", vec![]),
        ("not for children", vec![not_for_children]),
        ("another receipt's", vec![others]),
        ("forged", vec![forged]),
    ] {
        let refused = delegate_amended(
            &mut client,
            &token,
            &signed(&parent),
            amendments,
            child.clone(),
        )
        .await
        .unwrap_err();
        assert_eq!(
            refused.code(),
            Code::PermissionDenied,
            "{name}: {refused:?}"
        );
    }
    let minted = delegate_amended(
        &mut client,
        &token,
        &signed(&parent),
        vec![for_children],
        child,
    )
    .await
    .expect("an amendment for children reaches the child");
    assert_eq!(
        minted.receipt.unwrap().fs[0].path,
        "/srv/extra/data",
        "the child holds what the amendment added"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn depth_limit_is_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let (authority, admin, token) = start(dir.path()).await;
    let mut client = authority.client().await;
    let root = mint(&mut client, &admin, parent_request(SUP, 2, 600)).await;

    let status = delegate(&mut client, &token, &signed(&root), child_spec(2))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(
        status.message(),
        format!(
            "delegate.max_depth = 2 is above parent receipt {}'s grants (its children may delegate at most 1 levels)",
            id(&root)
        )
    );

    let child = delegate(&mut client, &token, &signed(&root), child_spec(1))
        .await
        .expect("depth 1 under max depth 2");
    let child_receipt = child.receipt.clone().unwrap();
    assert_eq!(child_receipt.depth, 1);
    assert_eq!(
        child_receipt.delegate,
        Some(pb::Delegation {
            max_depth: 1,
            ask: false
        })
    );
    let mut narrower = child_spec(0);
    narrower.fs.truncate(1);
    narrower.limits.as_mut().unwrap().memory_bytes = 128 << 20;
    let grandchild = delegate(&mut client, &token, &signed(&child), narrower.clone())
        .await
        .expect("depth 2 under max depth 2");
    let grandchild_receipt = grandchild.receipt.clone().unwrap();
    assert_eq!(grandchild_receipt.depth, 2);
    assert_eq!(
        grandchild_receipt.parent_receipt_id,
        child_receipt.receipt_id
    );
    assert_eq!(grandchild_receipt.owner, "admin");

    let status = delegate(&mut client, &token, &signed(&grandchild), narrower)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(
        status.message(),
        format!(
            "parent receipt {} may not delegate (delegate.max_depth = 0)",
            grandchild_receipt.receipt_id
        )
    );
    assert_eq!(all_receipts(&mut client, &admin).await.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_cannot_outlive_its_parent_at_mint() {
    let dir = tempfile::tempdir().unwrap();
    let (authority, admin, token) = start(dir.path()).await;
    let mut client = authority.client().await;
    let parent = mint(&mut client, &admin, parent_request(SUP, 1, 300)).await;
    let parent_expiry = parent.receipt.as_ref().unwrap().expires_at.unwrap().seconds;

    let mut longer = child_spec(0);
    longer.ttl_seconds = 301;
    let status = delegate(&mut client, &token, &signed(&parent), longer)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(
        status.message().contains("is longer than parent receipt"),
        "{}",
        status.message()
    );

    let mut until_parent = child_spec(0);
    until_parent.ttl_seconds = 0;
    let child = delegate(&mut client, &token, &signed(&parent), until_parent)
        .await
        .expect("ttl 0: until the parent expires");
    assert_eq!(
        child.receipt.unwrap().expires_at.unwrap().seconds,
        parent_expiry,
        "exactly the parent's expiry"
    );

    // A parent that has expired delegates nothing. Its expiry is a clock time, not an event.
    let short = mint(&mut client, &admin, parent_request(SUP, 1, 1)).await;
    let short_expiry = short.receipt.as_ref().unwrap().expires_at.unwrap().seconds;
    while unix_now() < short_expiry {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let status = delegate(&mut client, &token, &signed(&short), child_spec(0))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    let expected = format!("parent receipt {} expired at ", id(&short));
    assert!(
        status.message().starts_with(&expected) && status.message().ends_with('Z'),
        "{}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_enrolled_supervisor_may_delegate_for_its_own_audience() {
    let dir = tempfile::tempdir().unwrap();
    let (authority, admin, token) = start(dir.path()).await;
    let mut client = authority.client().await;
    let parent = mint(&mut client, &admin, parent_request(SUP, 1, 600)).await;
    let p = id(&parent);

    // An operator token is not a delegation token.
    let status = delegate(&mut client, &admin, &signed(&parent), child_spec(0))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(
        status.message(),
        "DelegateReceipt needs a supervisor's delegation token (tollgate supervisor add); operators mint with MintReceipt"
    );
    // Unknown or missing tokens.
    let status = delegate(&mut client, "tgt_nope", &signed(&parent), child_spec(0))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    let status = client
        .delegate_receipt(pb::DelegateReceiptRequest {
            supervisor_id: SUP.into(),
            parent: parent.signed.clone(),
            child: Some(child_spec(0)),
            amendments: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);

    // A delegation token is no operator token.
    let status = client
        .mint_receipt(authed(&token, parent_request(SUP, 1, 600)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(
        status.message().contains(
            "supervisor \"ws\"'s delegation token: it authenticates only DelegateReceipt"
        ),
        "{}",
        status.message()
    );
    let status = client
        .list_receipts(authed(&token, pb::ListReceiptsRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    let status = client
        .add_supervisor(authed(
            &token,
            pb::AddSupervisorRequest {
                supervisor_id: "mine".into(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);

    // The request must name the token's own supervisor.
    authority.add_supervisor("other").await;
    let status = client
        .delegate_receipt(authed(
            &token,
            pb::DelegateReceiptRequest {
                supervisor_id: "other".into(),
                parent: parent.signed.clone(),
                child: Some(child_spec(0)),
                amendments: vec![],
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(
        status.message(),
        "this token is enrolled for supervisor \"ws\", not \"other\""
    );

    // The parent must be for this supervisor.
    let foreign = mint(&mut client, &admin, parent_request("other", 1, 600)).await;
    let status = delegate(&mut client, &token, &signed(&foreign), child_spec(0))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(
        status.message(),
        format!(
            "parent receipt {} is not for supervisor \"ws\"",
            id(&foreign)
        )
    );

    // The parent must be byte for byte what was minted.
    let not_ours = format!("parent receipt {p} is not one this authority minted");
    let mut flipped = signed(&parent);
    flipped.signature[10] ^= 1;
    let mut widened = signed(&parent);
    let mut claimed = pb::Receipt::decode(widened.receipt.as_slice()).unwrap();
    claimed.exec.push("/usr/bin/curl".into());
    widened.receipt = claimed.encode_to_vec();
    let mut forged = signed(&parent);
    let mut unknown = claimed.clone();
    unknown.receipt_id = uuid::Uuid::now_v7().hyphenated().to_string();
    forged.receipt = unknown.encode_to_vec();
    let mut not_an_id = signed(&parent);
    let mut odd = claimed.clone();
    odd.receipt_id = "x\ny".into();
    not_an_id.receipt = odd.encode_to_vec();
    for (what, envelope, message) in [
        (
            "a claimed id that is no receipt id",
            not_an_id,
            "parent receipt \"x\\ny\" is not one this authority minted".to_owned(),
        ),
        ("a flipped signature byte", flipped, not_ours.clone()),
        ("an edited receipt", widened, not_ours.clone()),
        (
            "an id never minted",
            forged,
            format!(
                "parent receipt {} is not one this authority minted",
                unknown.receipt_id
            ),
        ),
    ] {
        let status = delegate(&mut client, &token, &envelope, child_spec(0))
            .await
            .expect_err(what);
        assert_eq!(status.code(), Code::PermissionDenied, "{what}");
        assert_eq!(status.message(), message, "{what}");
    }
    let mut garbage = signed(&parent);
    garbage.receipt = vec![0xff; 8];
    let status = delegate(&mut client, &token, &garbage, child_spec(0))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().starts_with("parent.receipt:"));

    // Enrolment: admins only, once per id, well-formed ids.
    let ceiling = pb::Ceiling {
        max_ttl_seconds: 60,
        ..Default::default()
    };
    let bob = client
        .add_operator(authed(
            &admin,
            pb::AddOperatorRequest {
                name: "bob".into(),
                ceiling: Some(ceiling),
                admin: false,
            },
        ))
        .await
        .unwrap()
        .into_inner()
        .token;
    let enrol = |token: &str, id: &str| {
        authed(
            token,
            pb::AddSupervisorRequest {
                supervisor_id: id.into(),
            },
        )
    };
    let status = client
        .add_supervisor(enrol(&bob, "bobs"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    let status = client.add_supervisor(enrol(&admin, SUP)).await.unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists);
    assert_eq!(status.message(), "supervisor \"ws\" is already enrolled");
    let status = client
        .add_supervisor(enrol(&admin, "has space"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().starts_with("supervisor_id:"));
    // The first token still works; nothing above was minted.
    delegate(&mut client, &token, &signed(&parent), child_spec(0))
        .await
        .expect("the enrolled supervisor delegates");
    let enrolments: Vec<Entry> = audit(&authority)
        .into_iter()
        .filter(|e| e.kind == EntryKind::SupervisorEnrolled)
        .collect();
    let decisions: Vec<_> = enrolments
        .iter()
        .map(|e| (e.decision, meta(e, "supervisor_id").cloned()))
        .collect();
    assert_eq!(
        decisions,
        [
            (Some(Decision::Allow), text(SUP)),
            (Some(Decision::Deny), text("mine")),
            (Some(Decision::Allow), text("other")),
            (Some(Decision::Deny), text("bobs")),
            (Some(Decision::Deny), text(SUP)),
            (Some(Decision::Deny), text("has space")),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_parent_revokes_every_descendant() {
    let dir = tempfile::tempdir().unwrap();
    let (authority, admin, token) = start(dir.path()).await;
    let mut client = authority.client().await;
    let root = mint(&mut client, &admin, parent_request(SUP, 2, 600)).await;
    let bystander = mint(&mut client, &admin, parent_request(SUP, 2, 600)).await;
    let child = delegate(&mut client, &token, &signed(&root), child_spec(1))
        .await
        .unwrap();
    let grandchild = delegate(&mut client, &token, &signed(&child), child_spec(0))
        .await
        .unwrap();
    let (r, c, g) = (id(&root), id(&child), id(&grandchild));

    let mut stream = client
        .watch_revocations(pb::WatchRevocationsRequest {
            after_seq: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    match stream.next().await.unwrap().unwrap().event {
        Some(pb::revocation_event::Event::CaughtUp(up)) => assert_eq!(up.last_seq, 0),
        other => panic!("expected CaughtUp first, got {other:?}"),
    }

    let revoked = client
        .revoke_receipt(authed(
            &admin,
            pb::RevokeReceiptRequest {
                receipt_id: r.clone(),
                reason: "leak".into(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(!revoked.already_revoked);
    assert_eq!(revoked.cascaded, [c.clone(), g.clone()]);
    let root_seq = revoked.revocation.unwrap().seq;

    let cascade = format!("ancestor {r} revoked: leak");
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match stream.next().await.unwrap().unwrap().event {
            Some(pb::revocation_event::Event::Revoked(revocation)) => seen.push(revocation),
            other => panic!("unexpected {other:?}"),
        }
    }
    let got: Vec<(&str, u64, &str)> = seen
        .iter()
        .map(|v| (v.receipt_id.as_str(), v.seq, v.reason.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (r.as_str(), root_seq, "leak"),
            (c.as_str(), root_seq + 1, cascade.as_str()),
            (g.as_str(), root_seq + 2, cascade.as_str()),
        ]
    );

    // A revoked child delegates nothing.
    let status = delegate(&mut client, &token, &signed(&child), child_spec(0))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(status.message(), format!("parent receipt {c} is revoked"));

    // The listing agrees; the bystander is untouched; revoking again changes nothing.
    for summary in all_receipts(&mut client, &admin).await {
        assert_eq!(
            summary.revoked,
            summary.receipt_id != id(&bystander),
            "{}",
            summary.receipt_id
        );
    }
    let again = client
        .revoke_receipt(authed(
            &admin,
            pb::RevokeReceiptRequest {
                receipt_id: r.clone(),
                reason: "again".into(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(again.already_revoked && again.cascaded.is_empty());

    // Audited: the root's entry announces the cascade, each descendant has its own.
    let entries: Vec<Entry> = audit(&authority)
        .into_iter()
        .filter(|e| e.kind == EntryKind::ReceiptRevoked)
        .collect();
    let for_id = |id: &str| {
        entries
            .iter()
            .filter(|e| e.receipt_id.as_deref() == Some(id))
            .collect::<Vec<_>>()
    };
    let root_entries = for_id(&r);
    assert_eq!(root_entries.len(), 2, "the revocation and its repetition");
    assert_eq!(
        meta(root_entries[0], "cascade"),
        Some(&MetaValue::Bool(true))
    );
    for (descendant, offset) in [(&c, 1), (&g, 2)] {
        let own = for_id(descendant);
        assert_eq!(own.len(), 1);
        assert_eq!(own[0].decision, Some(Decision::Allow));
        assert_eq!(own[0].reason.as_deref(), Some(cascade.as_str()));
        assert_eq!(meta(own[0], "cascade_from").cloned(), text(&r));
        assert_eq!(
            meta(own[0], "seq"),
            Some(&MetaValue::Int(root_seq as i64 + offset))
        );
    }
}

fn tollgate(authority: &AuthorityProcess, token: Option<&Path>, args: &[&str]) -> Output {
    let mut command = Command::new(bin_path("tollgate"));
    command
        .env_remove("TOLLGATE_TOKEN")
        .env_remove("TOLLGATE_TOKEN_FILE")
        .env_remove("TOLLGATE_AUTHORITY_TOKEN_FILE")
        .env_remove("TOLLGATE_SUPERVISOR_TOKEN_FILE")
        .args(["--authority", authority.addr()]);
    if let Some(token) = token {
        command.arg("--token-file").arg(token);
    }
    command.args(args).output().expect("run tollgate")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_enrols_supervisors_and_shows_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let admin_file = authority.data_dir().join("admin.token");
    let token_file = dir.path().join("ws.token");

    let added = tollgate(
        &authority,
        Some(&admin_file),
        &[
            "supervisor",
            "add",
            SUP,
            "--token-out",
            token_file.to_str().unwrap(),
        ],
    );
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    assert_eq!(
        std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let token = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_owned();
    assert!(token.starts_with("tgt_") && token.len() == 47, "{token}");
    assert!(!String::from_utf8_lossy(&added.stdout).contains(&token));

    // Without --token-out the token alone is on stdout, once.
    let printed = tollgate(&authority, Some(&admin_file), &["supervisor", "add", "ci"]);
    assert!(printed.status.success());
    let stdout = String::from_utf8_lossy(&printed.stdout);
    assert!(
        stdout.trim().starts_with("tgt_") && stdout.lines().count() == 1,
        "{stdout}"
    );

    // Errors: one line, the CLI's exit codes.
    let again = tollgate(&authority, Some(&admin_file), &["supervisor", "add", SUP]);
    assert_eq!(again.status.code(), Some(73));
    assert!(stderr_line(&again).contains("supervisor \"ws\" is already enrolled"));
    let bad = tollgate(&authority, Some(&admin_file), &["supervisor", "add", "a b"]);
    assert_eq!(bad.status.code(), Some(65));
    stderr_line(&bad);
    let no_token = tollgate(&authority, None, &["supervisor", "add", "x"]);
    assert_eq!(no_token.status.code(), Some(77));
    stderr_line(&no_token);
    let as_supervisor = tollgate(&authority, Some(&token_file), &["supervisor", "add", "x"]);
    assert_eq!(as_supervisor.status.code(), Some(77));
    assert!(stderr_line(&as_supervisor).contains("delegation token"));
    let help = tollgate(&authority, None, &["supervisor", "add", "--help"]);
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("--delegation-token-file") && help.contains("--token-out"),
        "{help}"
    );

    // The listing shows the chain; revoking the parent says what else it revoked.
    let mut client = authority.client().await;
    let admin = authority.admin_token();
    let parent = mint(&mut client, &admin, parent_request(SUP, 1, 600)).await;
    let child = delegate(&mut client, &token, &signed(&parent), child_spec(0))
        .await
        .unwrap();
    let listed = tollgate(&authority, Some(&admin_file), &["receipts", "--json"]);
    assert!(listed.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let child_line = lines
        .iter()
        .find(|l| l["receipt_id"] == id(&child))
        .unwrap();
    assert_eq!(child_line["parent_receipt_id"], id(&parent));
    assert_eq!(child_line["depth"], 1);
    let parent_line = lines
        .iter()
        .find(|l| l["receipt_id"] == id(&parent))
        .unwrap();
    assert_eq!(parent_line["parent_receipt_id"], "");
    assert_eq!(parent_line["depth"], 0);
    let table = tollgate(&authority, Some(&admin_file), &["receipts"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table
            .lines()
            .next()
            .unwrap()
            .split_whitespace()
            .rev()
            .take(2)
            .eq(["PARENT", "DEPTH"]),
        "{table}"
    );
    assert!(
        table.lines().any(|l| l.starts_with(&id(&child))
            && l.split_whitespace()
                .rev()
                .take(2)
                .eq([id(&parent).as_str(), "1"])),
        "{table}"
    );
    let audit_dir = authority.data_dir().join("audit");
    let traced = tollgate(
        &authority,
        None,
        &["trace", &id(&child), audit_dir.to_str().unwrap()],
    );
    let story = String::from_utf8_lossy(&traced.stdout);
    assert!(
        story.contains(&format!(
            "delegated by supervisor ws from parent receipt {} (depth 1)",
            id(&parent)
        )),
        "{story}{}",
        String::from_utf8_lossy(&traced.stderr)
    );
    let revoked = tollgate(&authority, Some(&admin_file), &["revoke", &id(&parent)]);
    assert!(revoked.status.success());
    assert!(
        String::from_utf8_lossy(&revoked.stdout).contains(&format!(
            "also revoked 1 descendant receipt(s): {}",
            id(&child)
        )),
        "{}",
        String::from_utf8_lossy(&revoked.stdout)
    );

    // Removing a supervisor revokes its token at once; adding it again rotates it.
    let parent = mint(&mut client, &admin, parent_request(SUP, 1, 600)).await;
    let removed = tollgate(
        &authority,
        Some(&admin_file),
        &["supervisor", "remove", SUP],
    );
    assert!(removed.status.success(), "{removed:?}");
    let refused = delegate(&mut client, &token, &signed(&parent), child_spec(0))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    let gone = tollgate(
        &authority,
        Some(&admin_file),
        &["supervisor", "remove", SUP],
    );
    assert_eq!(gone.status.code(), Some(66));
    assert!(stderr_line(&gone).contains("no supervisor \"ws\" is enrolled"));
    // A failed enrolment leaves no empty token file behind; a taken id leaves the old one.
    let fresh = dir.path().join("fresh.token");
    let failed = tollgate(
        &authority,
        None,
        &[
            "supervisor",
            "add",
            SUP,
            "--token-out",
            fresh.to_str().unwrap(),
        ],
    );
    assert_eq!(failed.status.code(), Some(77));
    assert!(!fresh.exists());
    let rotated = tollgate(
        &authority,
        Some(&admin_file),
        &[
            "supervisor",
            "add",
            SUP,
            "--token-out",
            token_file.to_str().unwrap(),
        ],
    );
    assert!(rotated.status.success(), "{rotated:?}");
    let new_token = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_owned();
    assert_ne!(new_token, token);
    delegate(&mut client, &new_token, &signed(&parent), child_spec(0))
        .await
        .unwrap();
    let kept = tollgate(
        &authority,
        Some(&admin_file),
        &[
            "supervisor",
            "add",
            SUP,
            "--token-out",
            token_file.to_str().unwrap(),
        ],
    );
    assert_eq!(kept.status.code(), Some(73));
    assert_eq!(
        std::fs::read_to_string(&token_file).unwrap().trim(),
        new_token,
        "a refused enrolment leaves the existing token file as it was"
    );
    let entries = audit(&authority);
    assert!(entries
        .iter()
        .any(|e| e.kind == EntryKind::SupervisorRemoved));
}
