//! `tollgate-bench fleet`: one authority fanning revocations out to many simulated supervisors,
//! each its own connection with one `WatchRevocations` stream, as a fleet's supervisors follow
//! it. For each revocation: the time from `RevokeReceipt` being sent to the last stream
//! receiving it. Measured over mutual TLS (every stream presenting a supervisor certificate)
//! beside the same fan-out in plaintext, in one run.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio_stream::StreamExt as _;
use tollgate_proto::v1 as pb;
use tollgate_proto::v1::authority_client::AuthorityClient;
use tollgate_tests::{authed, AuthorityProcess, Pki};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// What the streams have seen of each revocation: how many got it, and when the last did.
struct Seen {
    index: HashMap<String, usize>,
    counts: Vec<AtomicUsize>,
    last: Mutex<Vec<Option<Instant>>>,
    done: tokio::sync::Notify,
    streams: usize,
}

pub(crate) fn bench(streams: usize, revocations: usize) -> anyhow::Result<()> {
    // A descriptor per simulated supervisor, in this process and in the authority.
    {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).context("raising the open-files limit")?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let dir = tempfile::tempdir()?;
        let pki = Pki::make(dir.path());
        let mut rows = Vec::new();
        for tls in [false, true] {
            let data = dir.path().join(if tls { "authority-tls" } else { "authority" });
            let authority = if tls {
                AuthorityProcess::start_tls(&data, &pki)
            } else {
                AuthorityProcess::start(&data)
            };
            let latencies = fan_out(&authority, &pki, tls, streams, revocations).await?;
            rows.push((tls, latencies));
        }
        println!(
            "{streams} supervisor streams (one connection each) on one authority; {revocations} revocations, one at a time"
        );
        println!("revoke -> last stream has it     p50         p99         max");
        for (tls, latencies) in &rows {
            let ms = |q: f64| crate::stats::percentile(latencies, q).as_secs_f64() * 1e3;
            println!(
                "{:<32} {:>7.2} ms  {:>7.2} ms  {:>7.2} ms",
                if *tls { "mutual TLS" } else { "peer: plaintext" },
                ms(0.5),
                ms(0.99),
                latencies.last().copied().unwrap_or_default().as_secs_f64() * 1e3
            );
        }
        let p99 = crate::stats::percentile(&rows[1].1, 0.99);
        println!(
            "target: p99 < 1 s with mutual TLS: {:.1} ms ({})",
            p99.as_secs_f64() * 1e3,
            if p99 < Duration::from_secs(1) { "met" } else { "missed" }
        );
        Ok(())
    })
}

/// A channel to the authority: over TLS with a supervisor's certificate, or plaintext.
async fn channel(authority: &AuthorityProcess, pki: &Pki, tls: bool) -> anyhow::Result<Channel> {
    if !tls {
        return Ok(Endpoint::from_shared(authority.url())?.connect().await?);
    }
    let read = |name: &str| std::fs::read(pki.dir.join(name)).context(name.to_owned());
    let config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read("ca.pem")?))
        .identity(Identity::from_pem(
            read("supervisor-workstation.pem")?,
            read("supervisor-workstation.key")?,
        ));
    Ok(
        Endpoint::from_shared(format!("https://{}", authority.addr()))?
            .tls_config(config)?
            .connect()
            .await?,
    )
}

async fn fan_out(
    authority: &AuthorityProcess,
    pki: &Pki,
    tls: bool,
    streams: usize,
    revocations: usize,
) -> anyhow::Result<Vec<Duration>> {
    let admin = authority.admin_token();
    let mut client = AuthorityClient::new(channel(authority, pki, tls).await?);
    let mut ids = Vec::new();
    for _ in 0..revocations {
        let minted = client
            .mint_receipt(authed(
                &admin,
                pb::MintReceiptRequest {
                    subject: "fleet bench".into(),
                    ttl_seconds: 600,
                    audience: vec!["workstation".into()],
                    exec: vec!["/bin/true".into()],
                    ..Default::default()
                },
            ))
            .await?
            .into_inner();
        ids.push(minted.receipt.context("receipt")?.receipt_id);
    }
    let seen = Arc::new(Seen {
        index: ids
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, id)| (id, i))
            .collect(),
        counts: (0..revocations).map(|_| AtomicUsize::new(0)).collect(),
        last: Mutex::new(vec![None; revocations]),
        done: tokio::sync::Notify::new(),
        streams,
    });
    // Every stream open and caught up before the first revocation.
    let caught_up = Arc::new(tokio::sync::Semaphore::new(0));
    let mut tasks = Vec::new();
    for _ in 0..streams {
        let mut watcher = AuthorityClient::new(channel(authority, pki, tls).await?);
        let (seen, caught_up) = (seen.clone(), caught_up.clone());
        tasks.push(tokio::spawn(async move {
            let mut stream = watcher
                .watch_revocations(pb::WatchRevocationsRequest {
                    after_seq: 0,
                    supervisor_id: if tls {
                        "workstation".into()
                    } else {
                        String::new()
                    },
                })
                .await?
                .into_inner();
            while let Some(event) = stream.next().await {
                match event?.event {
                    Some(pb::revocation_event::Event::CaughtUp(_)) => caught_up.add_permits(1),
                    Some(pb::revocation_event::Event::Revoked(revocation)) => {
                        let Some(&i) = seen.index.get(&revocation.receipt_id) else {
                            continue;
                        };
                        if seen.counts[i].fetch_add(1, Ordering::SeqCst) + 1 == seen.streams {
                            seen.last.lock().unwrap()[i] = Some(Instant::now());
                            seen.done.notify_waiters();
                        }
                    }
                    _ => {}
                }
            }
            Ok::<(), anyhow::Error>(())
        }));
    }
    let _all = tokio::time::timeout(
        Duration::from_secs(120),
        caught_up.acquire_many(u32::try_from(streams)?),
    )
    .await
    .context("streams catching up")??;
    let mut latencies = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let done = seen.done.notified();
        tokio::pin!(done);
        done.as_mut().enable();
        let sent = Instant::now();
        client
            .revoke_receipt(authed(
                &admin,
                pb::RevokeReceiptRequest {
                    receipt_id: id.clone(),
                    reason: "fleet bench".into(),
                },
            ))
            .await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(last) = seen.last.lock().unwrap()[i] {
                latencies.push(last.duration_since(sent));
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "revocation {i} never reached every stream"
            );
            let _ = tokio::time::timeout(Duration::from_millis(50), done.as_mut()).await;
            done.set(seen.done.notified());
            done.as_mut().enable();
        }
    }
    for task in tasks {
        task.abort();
    }
    latencies.sort();
    Ok(latencies)
}
