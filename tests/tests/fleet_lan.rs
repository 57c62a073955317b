//! A fleet on one machine: the authority and three supervisors, each on a host of its own (a
//! network namespace on one LAN, `tollgate_tests::lan`), every link mutual TLS with
//! certificates from `tollgate pki`. A run on each host; one revocation request ends all
//! three within a second; a key rotation is accepted by all three at once; a host cut off from
//! the authority keeps its run, refuses new ones after the staleness bound, and once the link
//! is back refuses a receipt revoked meanwhile and admits again.

use std::process::Command;
use std::time::{Duration, Instant};

use tollgate_proto::v1 as pb;
use tollgate_proto::v1::authority_client::AuthorityClient;
use tollgate_proto::v1::supervisor_client::SupervisorClient;
use tollgate_tests::lan::Lan;
use tollgate_tests::{authed, bin_path, require_root, AuthorityProcess, SupervisorProcess};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::Code;

const SUPERVISORS: [&str; 3] = ["host-a", "host-b", "host-c"];

fn pki(dir: &std::path::Path, lan: &Lan) -> std::path::PathBuf {
    let pki = dir.join("pki");
    let d = pki.to_str().unwrap().to_owned();
    let mut steps: Vec<Vec<String>> = vec![
        vec!["pki".into(), "init".into(), "--dir".into(), d.clone()],
        vec![
            "pki".into(),
            "issue".into(),
            "authority".into(),
            "--dir".into(),
            d.clone(),
            "--ip".into(),
            lan.address(0).to_string(),
        ],
        vec![
            "pki".into(),
            "issue".into(),
            "operator".into(),
            "alice".into(),
            "--dir".into(),
            d.clone(),
        ],
    ];
    for (i, id) in SUPERVISORS.iter().enumerate() {
        steps.push(vec![
            "pki".into(),
            "issue".into(),
            "supervisor".into(),
            (*id).into(),
            "--dir".into(),
            d.clone(),
            "--ip".into(),
            lan.address(i as u8 + 1).to_string(),
        ]);
    }
    for args in steps {
        let output = Command::new(bin_path("tollgate"))
            .args(&args)
            .output()
            .unwrap();
        assert!(output.status.success(), "{args:?}: {output:?}");
    }
    pki
}

/// A mutual-TLS channel to `addr` as operator alice.
async fn channel(pki: &std::path::Path, addr: &str) -> Channel {
    let read = |name: &str| std::fs::read(pki.join(name)).unwrap();
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(read("ca.pem")))
                .identity(Identity::from_pem(
                    read("operator-alice.pem"),
                    read("operator-alice.key"),
                )),
        )
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("mutual TLS to {addr}: {e:?}"))
}

fn spec(audience: &str, script: &str) -> pb::MintReceiptRequest {
    pb::MintReceiptRequest {
        subject: "fleet".into(),
        ttl_seconds: 120,
        audience: vec![audience.into()],
        agent: Some(pb::AgentSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            ..Default::default()
        }),
        exec: vec!["/bin/sh".into(), "/usr/bin/sleep".into()],
        ..Default::default()
    }
}

struct Host {
    daemon: SupervisorProcess,
    client: SupervisorClient<Channel>,
}

impl Host {
    async fn start(&mut self, text: &str) -> Result<String, tonic::Status> {
        self.client
            .start_run(authed(
                &self.daemon.token(),
                pb::StartRunRequest {
                    receipt: text.into(),
                    ..Default::default()
                },
            ))
            .await
            .map(|r| r.into_inner().run_id)
    }

    async fn state(&mut self, run_id: &str) -> i32 {
        self.client
            .get_run(authed(
                &self.daemon.token(),
                pb::GetRunRequest {
                    run_id: run_id.into(),
                },
            ))
            .await
            .unwrap()
            .into_inner()
            .state
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_over_mutual_tls_revoke_rotate_and_survive_a_partition() {
    if !require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lan = Lan::create(10, 4);
    let pki = pki(dir.path(), &lan);
    let path = |name: &str| pki.join(name).display().to_string();
    let authority = AuthorityProcess::start_on(
        &lan.on(0),
        &dir.path().join("authority"),
        &format!("{}:7700", lan.address(0)),
        &[
            "--tls-cert",
            &path("authority.pem"),
            "--tls-key",
            &path("authority.key"),
            "--tls-client-ca",
            &path("ca.pem"),
        ],
    )
    .unwrap_or_else(|(status, log)| panic!("authority: {status}: {log}"));
    let mut operator = AuthorityClient::new(channel(&pki, authority.addr()).await);
    let admin = authority.admin_token();
    let mut hosts = Vec::new();
    for (i, id) in SUPERVISORS.iter().enumerate() {
        let host = i as u8 + 1;
        let daemon = SupervisorProcess::start_on(
            &lan.on(host),
            id,
            &format!("{}:7701", lan.address(host)),
            &dir.path().join(id),
            authority.addr(),
            &format!("fleet-lan-{id}"),
            210_300 + 64 * i as u32,
            [
                "--authority-ca",
                &path("ca.pem"),
                "--tls-cert",
                &path(&format!("supervisor-{id}.pem")),
                "--tls-key",
                &path(&format!("supervisor-{id}.key")),
                "--tls-client-ca",
                &path("ca.pem"),
                "--max-staleness",
                "3",
            ]
            .map(String::from)
            .to_vec(),
        );
        let client = SupervisorClient::new(channel(&pki, daemon.addr()).await);
        hosts.push(Host { daemon, client });
    }
    let minter = operator.clone();
    let mint = |id: &str, script: &str| {
        let request = authed(&admin, spec(id, script));
        let mut operator = minter.clone();
        async move {
            let minted = operator.mint_receipt(request).await.unwrap().into_inner();
            (minted.text, minted.receipt.unwrap().receipt_id)
        }
    };

    // A run on each host; one revocation request per run, sent together, ends all three
    // within a second.
    let mut runs = Vec::new();
    for (host, id) in hosts.iter_mut().zip(SUPERVISORS) {
        let (text, receipt_id) = mint(id, "sleep 60").await;
        runs.push((host.start(&text).await.expect("start"), receipt_id));
    }
    let revoked_at = Instant::now();
    for (_, receipt_id) in &runs {
        operator
            .revoke_receipt(authed(
                &admin,
                pb::RevokeReceiptRequest {
                    receipt_id: receipt_id.clone(),
                    reason: "fleet test".into(),
                },
            ))
            .await
            .expect("revoke");
    }
    for (host, (run_id, _)) in hosts.iter_mut().zip(&runs) {
        while host.state(run_id).await != pb::RunState::Revoked as i32 {
            assert!(
                revoked_at.elapsed() < Duration::from_secs(1),
                "{run_id} still running {:?} after the revocation",
                revoked_at.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // A key rotation: receipts signed by the new key start on all three at once.
    operator
        .rotate_key(authed(&admin, pb::RotateKeyRequest {}))
        .await
        .expect("rotate");
    for (host, id) in hosts.iter_mut().zip(SUPERVISORS) {
        let (text, _) = mint(id, "echo rotated").await;
        host.start(&text).await.expect("a receipt of the new key");
    }

    // host-c is cut off from the authority (not from the operator): its live run goes on,
    // new runs wait past the bound, and once the link is back a receipt revoked meanwhile is
    // refused and a fresh one admitted.
    let c = 2;
    let (long, _) = mint(SUPERVISORS[c], "sleep 60").await;
    let live = hosts[c].start(&long).await.expect("start");
    let (revoked, revoked_id) = mint(SUPERVISORS[c], "echo revoked").await;
    let (fresh, _) = mint(SUPERVISORS[c], "echo fresh").await;
    lan.partition(3, 0, true);
    operator
        .revoke_receipt(authed(
            &admin,
            pb::RevokeReceiptRequest {
                receipt_id: revoked_id,
                reason: "partition".into(),
            },
        ))
        .await
        .expect("revoke during the partition");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !hosts[c].daemon.log().contains("revocation stream lost") {
        assert!(Instant::now() < deadline, "{}", hosts[c].daemon.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let stale = hosts[c].start(&fresh).await.unwrap_err();
    assert_eq!(stale.code(), Code::Unavailable, "{stale:?}");
    assert!(stale.message().contains("--max-staleness 3 s"), "{stale:?}");
    assert_eq!(
        hosts[c].state(&live).await,
        pb::RunState::Running as i32,
        "the live run went on"
    );
    lan.partition(3, 0, false);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !hosts[c]
        .daemon
        .log()
        .contains("revocation stream reconnected and caught up")
    {
        assert!(Instant::now() < deadline, "{}", hosts[c].daemon.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refused = hosts[c].start(&revoked).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    hosts[c].start(&fresh).await.expect("admitted again");
}
