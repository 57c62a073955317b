//! TLS on the daemons' links: certificates from `tollgate pki`, an authority and a supervisor
//! serving mutual TLS, the supervisor following the authority over TLS with its own
//! certificate, the CLI minting and running over TLS; plaintext, a missing client
//! certificate and a public address without TLS are each refused.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use tollgate_proto::v1 as pb;
use tollgate_proto::v1::authority_client::AuthorityClient;
use tollgate_tests::relay::Relay;
use tollgate_tests::{authed, bin_path, require_root, AuthorityProcess, Pki, SupervisorProcess};
use tonic::transport::Endpoint;
use tonic::Code;

fn tollgate(args: &[&str]) -> Output {
    Command::new(bin_path("tollgate"))
        .args(args)
        .env_remove("TOLLGATE_CA")
        .env_remove("TOLLGATE_CERT")
        .env_remove("TOLLGATE_KEY")
        .output()
        .expect("run tollgate")
}

#[test]
fn pki_files_are_private_named_and_never_overwritten() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path());
    for key in [
        "ca.key",
        "authority.key",
        "supervisor-workstation.key",
        "operator-alice.key",
    ] {
        let mode = std::fs::metadata(pki.dir.join(key))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{key}");
    }
    let again = tollgate(&["pki", "issue", "operator", "alice", "--dir", &pki.path("")]);
    assert_eq!(again.status.code(), Some(73), "{again:?}");
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("it exists, and nothing was overwritten"),
        "{again:?}"
    );
    let bad = tollgate(&["pki", "issue", "supervisor", "../x", "--dir", &pki.path("")]);
    assert!(!bad.status.success(), "{bad:?}");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("supervisor id \"../x\""),
        "{bad:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_link_speaks_mutual_tls_and_plaintext_or_no_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path());
    let ca = pki.path("ca.pem");
    let authority = AuthorityProcess::start_tls(&dir.path().join("authority"), &pki);
    let admin = authority.data_dir().join("admin.token");
    let admin = admin.to_str().unwrap();
    let alice = [
        "--ca",
        &ca,
        "--cert",
        &pki.path("operator-alice.pem"),
        "--key",
        &pki.path("operator-alice.key"),
    ];
    let with = |tls: &[&str], rest: &[&str]| {
        let mut args = vec!["--authority", authority.addr(), "--token-file", admin];
        args.extend_from_slice(tls);
        args.extend_from_slice(rest);
        tollgate(&args)
    };
    let keys = with(&alice, &["keys"]);
    assert!(keys.status.success(), "over mutual TLS: {keys:?}");

    // Plaintext to a TLS daemon, and TLS without a client certificate: refused, exit 69.
    let plaintext = with(&[], &["keys"]);
    assert_eq!(plaintext.status.code(), Some(69), "{plaintext:?}");
    let anonymous = with(&["--ca", &ca], &["keys"]);
    assert_eq!(anonymous.status.code(), Some(69), "{anonymous:?}");
    // A CA that did not sign the daemon's certificate: refused.
    let other = Pki::make(&dir.path().join("other"));
    let stranger = with(
        &[
            "--ca",
            &other.path("ca.pem"),
            "--cert",
            &other.path("operator-alice.pem"),
            "--key",
            &other.path("operator-alice.key"),
        ],
        &["keys"],
    );
    assert_eq!(stranger.status.code(), Some(69), "{stranger:?}");

    // A supervisor's certificate is its identity at the authority: its revocation stream and
    // its delegation calls are refused under any other id.
    let as_workstation = pki
        .channel(authority.addr(), "supervisor-workstation")
        .await;
    let mut client = AuthorityClient::new(as_workstation);
    let watch = |supervisor_id: &str| pb::WatchRevocationsRequest {
        after_seq: 0,
        supervisor_id: supervisor_id.into(),
    };
    client
        .watch_revocations(watch("workstation"))
        .await
        .expect("its own id");
    for other in ["laptop", ""] {
        let refused = client.watch_revocations(watch(other)).await.unwrap_err();
        assert_eq!(
            refused.code(),
            Code::PermissionDenied,
            "{other:?}: {refused:?}"
        );
        assert!(
            refused.message().contains("names supervisor workstation"),
            "{refused:?}"
        );
    }
    // Even with laptop's own delegation token: the certificate says workstation.
    let enrolled = with(&alice, &["supervisor", "add", "laptop"]);
    assert!(enrolled.status.success(), "{enrolled:?}");
    let laptop_token = String::from_utf8_lossy(&enrolled.stdout).trim().to_owned();
    let delegated = client
        .delegate_receipt(authed(
            &laptop_token,
            pb::DelegateReceiptRequest {
                supervisor_id: "laptop".into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(delegated.code(), Code::PermissionDenied, "{delegated:?}");
    assert!(
        delegated
            .message()
            .contains("names supervisor workstation, not supervisor \"laptop\""),
        "{delegated:?}"
    );

    if !require_root() {
        return;
    }
    // The supervisor: mutual TLS for its clients, and TLS with its own certificate to the
    // authority (which requires one).
    let supervisor = SupervisorProcess::start_with_flags(
        &dir.path().join("supervisor"),
        authority.addr(),
        "fleet-tls",
        210_000,
        pki.supervisor_flags(),
    );
    let spec = dir.path().join("run.toml");
    std::fs::write(
        &spec,
        "subject = 'tls'\nttl = '1m'\naudience = ['workstation']\n[agent]\nargv = ['/bin/sh', '-c', 'echo over tls']\n[exec]\nallow = ['/bin/sh']\n",
    )
    .unwrap();
    let receipt = dir.path().join("r.tgr");
    let minted = with(
        &alice,
        &[
            "mint",
            "--spec",
            spec.to_str().unwrap(),
            "--out",
            receipt.to_str().unwrap(),
        ],
    );
    assert!(minted.status.success(), "{minted:?}");
    let token = supervisor.token_file();
    let mut args = vec![
        "--supervisor",
        supervisor.addr(),
        "--token-file",
        token.to_str().unwrap(),
    ];
    args.extend_from_slice(&alice);
    args.extend_from_slice(&["run", "--receipt", receipt.to_str().unwrap()]);
    let ran = tollgate(&args);
    assert!(ran.status.success(), "{ran:?}");
    assert_eq!(String::from_utf8_lossy(&ran.stdout), "over tls\n");
    let plaintext = tollgate(&[
        "--supervisor",
        supervisor.addr(),
        "--token-file",
        token.to_str().unwrap(),
        "ps",
    ]);
    assert_eq!(plaintext.status.code(), Some(69), "{plaintext:?}");

    // A supervisor given another supervisor's certificate does not start.
    let impostor = Command::new(bin_path("tollgate-supervisor"))
        .arg("--data-dir")
        .arg(dir.path().join("impostor"))
        .args(["--id", "laptop", "--listen", "127.0.0.1:0"])
        .args(["--authority", authority.addr(), "--authority-ca", &ca])
        .args(["--tls-cert", &pki.path("supervisor-workstation.pem")])
        .args(["--tls-key", &pki.path("supervisor-workstation.key")])
        .args(["--cgroup-parent", "tollgate-test-fleet-impostor"])
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert_eq!(impostor.status.code(), Some(78), "{impostor:?}");
    let said = String::from_utf8_lossy(&impostor.stderr);
    assert!(
        said.contains("names supervisor workstation, but this is supervisor \"laptop\""),
        "{said}"
    );
}

/// Waits for `child` to exit within `limit`; its status code, or `None` when still running.
fn exit_within(child: &mut std::process::Child, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return status.code();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn a_public_address_without_tls_is_refused_unless_plaintext_is_meant() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("authority");
    let start = |extra: &[&str]| {
        Command::new(bin_path("tollgate-authority"))
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen", "0.0.0.0:0"])
            .args(extra)
            .env("RUST_LOG", "off")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tollgate-authority")
    };
    let mut refused = start(&[]);
    assert_eq!(exit_within(&mut refused, Duration::from_secs(30)), Some(78));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut refused.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0:")
            && stderr.contains("--insecure-plaintext"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");

    let mut meant = start(&["--insecure-plaintext"]);
    let addr = data.join("authority.addr");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !addr.exists() {
        assert!(
            Instant::now() < deadline && exit_within(&mut meant, Duration::ZERO).is_none(),
            "the authority with --insecure-plaintext did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = meant.kill();
    let _ = meant.wait();
}

fn sh_receipt(script: &str, ttl: u64) -> pb::MintReceiptRequest {
    pb::MintReceiptRequest {
        subject: "partition".into(),
        ttl_seconds: ttl,
        audience: vec!["workstation".into()],
        agent: Some(pb::AgentSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            ..Default::default()
        }),
        exec: vec!["/bin/sh".into(), "/usr/bin/sleep".into()],
        ..Default::default()
    }
}

/// `StartRun` of the receipt `text` with the supervisor's admin token.
async fn start(
    supervisor: &SupervisorProcess,
    text: String,
) -> Result<tonic::Response<pb::StartRunResponse>, tonic::Status> {
    supervisor
        .client()
        .await
        .start_run(authed(
            &supervisor.token(),
            pb::StartRunRequest {
                receipt: text,
                ..Default::default()
            },
        ))
        .await
}

/// Waits until the supervisor's log has `line`.
async fn log_has(supervisor: &SupervisorProcess, line: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !supervisor.log().contains(line) {
        assert!(
            Instant::now() < deadline,
            "the supervisor never logged {line:?}:\n{}",
            supervisor.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A supervisor cut off from its authority keeps its live run, refuses new ones once the
/// staleness bound has passed, and after the link returns admits again only once it has
/// caught up — refusing a receipt revoked during the partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_supervisor_fails_closed_and_catches_up_before_admitting_again() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let relay = Relay::start(authority.addr()).await;
    let supervisor = SupervisorProcess::start_with_flags(
        &dir.path().join("supervisor"),
        &relay.addr(),
        "fleet-partition",
        210_100,
        vec!["--max-staleness".into(), "3".into()],
    );
    let mut authority_client = authority.client().await;
    let admin = authority.admin_token();
    let mint = |request: pb::MintReceiptRequest| {
        let (mut client, admin) = (authority_client.clone(), admin.clone());
        async move {
            let minted = client
                .mint_receipt(authed(&admin, request))
                .await
                .unwrap()
                .into_inner();
            (minted.text, minted.receipt.unwrap().receipt_id)
        }
    };
    let (long, _) = mint(sh_receipt("sleep 60", 120)).await;
    let (revoked, revoked_id) = mint(sh_receipt("echo revoked", 120)).await;
    let (fresh, _) = mint(sh_receipt("echo fresh", 120)).await;
    let live = supervisor.start_run(long).await;

    relay.cut();
    let cut_at = Instant::now();
    // Revoked at the authority while the supervisor cannot hear it.
    authority_client
        .revoke_receipt(authed(
            &admin,
            pb::RevokeReceiptRequest {
                receipt_id: revoked_id.clone(),
                reason: "partition test".into(),
            },
        ))
        .await
        .expect("revoke");
    log_has(
        &supervisor,
        "revocation stream lost",
        Duration::from_secs(15),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let stale = start(&supervisor, fresh.clone()).await.unwrap_err();
    assert_eq!(stale.code(), Code::Unavailable, "{stale:?}");
    assert!(
        stale.message().contains("--max-staleness 3 s"),
        "{stale:?} ({:?} after the cut)",
        cut_at.elapsed()
    );
    let run = supervisor
        .client()
        .await
        .get_run(authed(
            &supervisor.token(),
            pb::GetRunRequest {
                run_id: live.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        run.state,
        pb::RunState::Running as i32,
        "the live run goes on"
    );

    relay.heal();
    log_has(
        &supervisor,
        "revocation stream reconnected and caught up",
        Duration::from_secs(30),
    )
    .await;
    let refused = start(&supervisor, revoked).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("revoked"), "{refused:?}");
    start(&supervisor, fresh)
        .await
        .expect("admitted again once caught up");
    supervisor
        .client()
        .await
        .stop_run(authed(
            &supervisor.token(),
            pb::StopRunRequest {
                run_id: live,
                ..Default::default()
            },
        ))
        .await
        .expect("stop the live run");
}

async fn mint_sh(authority: &AuthorityProcess, script: &str) -> (String, String) {
    let minted = authority
        .client()
        .await
        .mint_receipt(authed(&authority.admin_token(), sh_receipt(script, 300)))
        .await
        .unwrap()
        .into_inner();
    (minted.text, minted.receipt.unwrap().receipt_id)
}

async fn revoke_id(authority: &AuthorityProcess, receipt_id: String) {
    authority
        .client()
        .await
        .revoke_receipt(authed(
            &authority.admin_token(),
            pb::RevokeReceiptRequest {
                receipt_id,
                reason: "restore test".into(),
            },
        ))
        .await
        .expect("revoke");
}

/// `tollgate-authority backup` while it serves, then `restore` into its data directory: the
/// backup is private and never overwritten, a running authority's directory refuses a
/// restore, and the restored authority withdraws the keys it held (a receipt minted after the
/// backup no longer verifies) and signs with a new one. A supervisor following it across the
/// restore reads its new revocation history from the start: a receipt revoked after the
/// restore (seq 1 again) is refused, where an old position in the stream would have missed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_authority_withdraws_its_keys_and_supervisors_reread_its_revocations() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("authority");
    let authority = AuthorityProcess::start(&data);
    let relay = Relay::start(authority.addr()).await;
    let root = require_root();
    let supervisor = root.then(|| {
        SupervisorProcess::start_with_flags(
            &dir.path().join("supervisor"),
            &relay.addr(),
            "fleet-restore",
            210_200,
            Vec::new(),
        )
    });
    let state = |args: &[&str]| {
        Command::new(bin_path("tollgate-authority"))
            .arg("--data-dir")
            .arg(&data)
            .args(args)
            .env("RUST_LOG", "off")
            .output()
            .unwrap()
    };

    let (_, before) = mint_sh(&authority, "echo before").await;
    let backup = dir.path().join("authority.backup");
    let backed = state(&["backup", "--to", backup.to_str().unwrap()]);
    assert!(backed.status.success(), "{backed:?}");
    let mode = std::fs::metadata(&backup).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let again = state(&["backup", "--to", backup.to_str().unwrap()]);
    assert_eq!(
        again.status.code(),
        Some(73),
        "never overwritten: {again:?}"
    );
    let (after_text, after) = mint_sh(&authority, "echo after").await;
    revoke_id(&authority, before.clone()).await;
    if let Some(supervisor) = &supervisor {
        log_has(supervisor, &before, Duration::from_secs(15)).await;
    }
    let running = state(&["restore", "--from", backup.to_str().unwrap()]);
    assert_eq!(
        running.status.code(),
        Some(75),
        "refused while serving: {running:?}"
    );

    let old_key = {
        let set = authority
            .client()
            .await
            .get_key_set(pb::GetKeySetRequest {})
            .await;
        set.unwrap().into_inner().keys[0].key_id.clone()
    };
    drop(authority);
    let restored = state(&["restore", "--from", backup.to_str().unwrap()]);
    assert!(restored.status.success(), "{restored:?}");
    let said = String::from_utf8_lossy(&restored.stdout);
    assert!(
        said.contains(&format!("withdrawn keys: {old_key}")),
        "{said}"
    );

    let authority = AuthorityProcess::start(&data);
    let keys = authority
        .client()
        .await
        .get_key_set(pb::GetKeySetRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(
        keys.keys.iter().all(|key| key.key_id != old_key),
        "the withdrawn key is out of the key set: {keys:?}"
    );
    let listed = authority
        .client()
        .await
        .list_receipts(authed(
            &authority.admin_token(),
            pb::ListReceiptsRequest {
                include_expired: true,
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<_> = listed
        .receipts
        .iter()
        .map(|r| r.receipt_id.clone())
        .collect();
    assert!(ids.contains(&before) && !ids.contains(&after), "{ids:?}");

    let Some(supervisor) = supervisor else {
        return;
    };
    // The supervisor follows the restored authority (a new port behind the same relay).
    relay.retarget(authority.addr());
    relay.cut();
    relay.heal();
    log_has(
        &supervisor,
        "revocation history changed",
        Duration::from_secs(30),
    )
    .await;
    let (fresh_text, fresh) = mint_sh(&authority, "echo fresh").await;
    revoke_id(&authority, fresh.clone()).await;
    log_has(&supervisor, &fresh, Duration::from_secs(15)).await;
    let revoked = start(&supervisor, fresh_text).await.unwrap_err();
    assert_eq!(revoked.code(), Code::PermissionDenied, "{revoked:?}");
    assert!(revoked.message().contains("revoked"), "{revoked:?}");
    let withdrawn = start(&supervisor, after_text).await.unwrap_err();
    assert_eq!(withdrawn.code(), Code::PermissionDenied, "{withdrawn:?}");
}

/// A daemon serving mutual TLS answers probes (which cannot speak TLS) on its plaintext
/// health port — the standard health service and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_port_answers_probes_in_plaintext_beside_mutual_tls() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path());
    let mut flags = pki.authority_flags();
    flags.extend(["--health-listen".to_owned(), "127.0.0.1:0".to_owned()]);
    let authority = AuthorityProcess::start_with(
        &dir.path().join("authority"),
        &flags.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .unwrap_or_else(|(status, log)| panic!("authority: {status}: {log}"));
    let health = std::fs::read_to_string(authority.data_dir().join("health.addr")).unwrap();
    let channel = Endpoint::from_shared(format!("http://{}", health.trim()))
        .unwrap()
        .connect()
        .await
        .expect("plaintext to the health port");
    let mut probe = HealthClient::new(channel.clone());
    for service in ["", "tollgate.v1.Authority"] {
        let answer = probe
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.status, 1, "{service:?} SERVING");
    }
    // Nothing else is served there.
    let other = AuthorityClient::new(channel)
        .get_key_set(pb::GetKeySetRequest {})
        .await
        .unwrap_err();
    assert_eq!(other.code(), Code::Unimplemented, "{other:?}");
}
