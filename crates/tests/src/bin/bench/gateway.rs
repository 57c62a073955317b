//! `tollgate-bench gateway`: a 4 KiB `fs.read` through the gateway (gRPC over the run's Unix
//! socket, every check, path resolution with openat2, the audit entry) beside a direct read of
//! the same file (open, read, close) in the same run.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate_audit::{AuditConfig, AuditLog};
use tollgate_proto::v1 as pb;
use tollgate_supervisor::gateway::{self, FsGrant, RunGateway};

fn percentiles(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    (at(0.5), at(0.99))
}

/// Runs the benchmark and prints the table.
pub fn bench(calls: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        nix::unistd::geteuid().is_root(),
        "run as root: the gateway serves only its run's host id, here root"
    );
    let dir = tempfile::tempdir()?;
    let grant = dir.path().join("grant");
    std::fs::create_dir_all(&grant)?;
    let file = grant.join("page.bin");
    std::fs::write(&file, vec![7u8; 4096])?;
    let key = ed25519_dalek::SigningKey::from_bytes(&[3; 32]);
    let mut config = AuditConfig::new(dir.path().join("audit"), "supervisor", key, "bench");
    config.redactor = Some(Arc::new(tollgate_router::SecretRedactor::with_defaults()?));
    let audit = AuditLog::open(config)?;
    let run = Arc::new(RunGateway {
        run_id: "01900000-0000-7000-8000-00000000beef".into(),
        host_id: 0,
        receipt: pb::Receipt::default(),
        expires_at: tollgate_receipt::unix_now() + 3600,
        grants: vec![FsGrant {
            path: grant.display().to_string(),
            writable: false,
        }],
        max_calls: u64::MAX,
        closing: Arc::new(AtomicBool::new(false)),
        is_revoked: Arc::new(|_: &str| false),
        audit: audit.clone(),
        calls: AtomicU64::new(0),
        last_call: Mutex::new(None),
        snapshots: tollgate_supervisor::snapshot::SnapshotStore::new(dir.path()),
        exec: None,
    });
    // The server on its own one-worker runtime, as in the supervisor.
    let server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let mut handle = gateway::serve(server.handle(), dir.path(), run)?;
    let target = format!("unix:{}", handle.socket.display());
    let path = file.display().to_string();
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let through_gateway = client.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(target)?
            .connect()
            .await?;
        let mut gateway = pb::gateway_client::GatewayClient::new(channel);
        let mut samples = Vec::with_capacity(calls);
        for round in 0..calls + calls / 10 {
            let request = pb::CallToolRequest {
                tool: Some(pb::call_tool_request::Tool::FsRead(pb::FsReadRequest {
                    path: path.clone(),
                    offset: 0,
                    length: 4096,
                })),
            };
            let start = Instant::now();
            let response = gateway.call_tool(request).await?.into_inner();
            let elapsed = start.elapsed();
            match response.result {
                Some(pb::call_tool_response::Result::FsRead(read)) if read.data.len() == 4096 => {}
                other => anyhow::bail!("unexpected response {other:?}"),
            }
            // The first tenth warms up.
            if round >= calls / 10 {
                samples.push(elapsed);
            }
        }
        anyhow::Ok(samples)
    })?;
    let mut direct = Vec::with_capacity(calls);
    for _ in 0..calls {
        let start = Instant::now();
        let bytes = std::fs::read(&file)?;
        direct.push(start.elapsed());
        anyhow::ensure!(bytes.len() == 4096);
    }
    handle.stop();
    audit.close()?;
    let (g50, g99) = percentiles(through_gateway);
    let (d50, d99) = percentiles(direct);
    println!("4 KiB fs.read through the gateway (gRPC over the run's socket, checked, audited)   p50 {g50:>7.1} us   p99 {g99:>7.1} us   (n={calls})");
    println!("peer: direct read of the same file (open, read, close)                         p50 {d50:>7.1} us   p99 {d99:>7.1} us   (n={calls})");
    println!(
        "ratio at p50                                                                  {:>7.1}x",
        g50 / d50
    );
    Ok(())
}
