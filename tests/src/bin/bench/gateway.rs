//! `tollgate-bench gateway`, in one run:
//! * a 4 KiB `fs.read` through the gateway (gRPC over the run's Unix socket, every check, path
//!   resolution with openat2, the audit entry) beside a direct read of the same file (open,
//!   read, close), and the same gateway with the audit log's I/O taken away (log on tmpfs,
//!   fsync batched) to show what the audit costs a call;
//! * `exec /bin/true` through the gateway of a real sandbox (a client with the run's host id,
//!   the command started inside the sandbox's namespaces, cgroup, Landlock and seccomp) beside
//!   a direct spawn of `/bin/true`.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tollgate_audit::{AuditConfig, AuditLog};
use tollgate_proto::v1 as pb;
use tollgate_supervisor::gateway::{self, FsGrant, RunGateway, RunGatewayConfig};

fn percentiles(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    (at(0.5), at(0.99))
}

/// Runs the benchmark and prints the table.
pub(crate) fn bench(calls: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        nix::unistd::geteuid().is_root(),
        "run as root: the gateway serves only its run's host id, here root"
    );
    let reads = reads(calls)?;
    let (exec_gateway, exec_direct) = execs((calls / 10).max(50))?;
    let n = reads.audited.len();
    let (g50, g99) = percentiles(reads.audited);
    let (u50, u99) = percentiles(reads.unaudited);
    let (d50, d99) = percentiles(reads.direct);
    let (e50, e99) = percentiles(exec_gateway);
    let (s50, s99) = percentiles(exec_direct.clone());
    println!("4 KiB fs.read through the gateway (gRPC over the run's socket, checked, audited)   p50 {g50:>7.1} us   p99 {g99:>7.1} us   (n={n})");
    println!("  baseline: the same round trip and openat2 read, no checks, no audit          p50 {u50:>7.1} us   p99 {u99:>7.1} us   (n={n})");
    println!("peer: direct read of the same file (open, read, close)                         p50 {d50:>7.1} us   p99 {d99:>7.1} us   (n={n})");
    println!(
        "ratio at p50 (gateway / direct)                                               {:>7.1}x",
        g50 / d50
    );
    println!(
        "fs.read calls/s with 4 concurrent clients: audited {:.0}, no audit {:.0} ({:.0}%)",
        reads.audited_rate,
        reads.unaudited_rate,
        reads.audited_rate / reads.unaudited_rate * 100.0
    );
    println!("exec /bin/true through the gateway (inside the run's sandbox, audited)          p50 {e50:>7.1} us   p99 {e99:>7.1} us   (n={})", exec_direct.len());
    println!("peer: direct spawn of /bin/true (fork, exec, wait)                             p50 {s50:>7.1} us   p99 {s99:>7.1} us   (n={})", exec_direct.len());
    println!(
        "ratio at p50 (gateway / direct)                                               {:>7.1}x",
        e50 / s50
    );
    Ok(())
}

/// The baseline the audit's cost is measured against: the same gRPC service over a Unix
/// socket, resolving and reading the file exactly as the gateway does, with no checks and
/// no audit entry. It exists only here; the supervisor has no unaudited path.
#[derive(Debug, Clone)]
struct UnauditedReads {
    grant: String,
    root: Arc<tollgate_supervisor::beneath::GrantRoot>,
}

#[tonic::async_trait]
impl pb::gateway_server::Gateway for UnauditedReads {
    type CompleteStream =
        tokio_stream::wrappers::ReceiverStream<Result<pb::CompleteEvent, tonic::Status>>;

    async fn complete(
        &self,
        _: tonic::Request<pb::CompleteRequest>,
    ) -> Result<tonic::Response<Self::CompleteStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("baseline"))
    }

    async fn count_tokens(
        &self,
        _: tonic::Request<pb::CompleteRequest>,
    ) -> Result<tonic::Response<pb::CountTokensResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("baseline"))
    }

    async fn list_models(
        &self,
        _: tonic::Request<pb::ListModelsRequest>,
    ) -> Result<tonic::Response<pb::ListModelsResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("baseline"))
    }

    async fn record_refused_call(
        &self,
        _: tonic::Request<pb::RecordRefusedCallRequest>,
    ) -> Result<tonic::Response<pb::RecordRefusedCallResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("baseline"))
    }

    type EgressStream =
        tokio_stream::wrappers::ReceiverStream<Result<pb::EgressFrame, tonic::Status>>;

    async fn egress(
        &self,
        _: tonic::Request<tonic::Streaming<pb::EgressFrame>>,
    ) -> Result<tonic::Response<Self::EgressStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("baseline"))
    }

    async fn list_pending_calls(
        &self,
        _: tonic::Request<pb::ListPendingCallsRequest>,
    ) -> Result<tonic::Response<pb::ListPendingCallsResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("baseline"))
    }

    async fn get_run_receipt(
        &self,
        _: tonic::Request<pb::GetRunReceiptRequest>,
    ) -> Result<tonic::Response<pb::GetRunReceiptResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("baseline"))
    }

    async fn delegate(
        &self,
        _: tonic::Request<pb::DelegateRequest>,
    ) -> Result<tonic::Response<pb::DelegateResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("baseline"))
    }

    async fn start_child(
        &self,
        _: tonic::Request<pb::StartChildRequest>,
    ) -> Result<tonic::Response<pb::StartChildResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("baseline"))
    }

    async fn list_children(
        &self,
        _: tonic::Request<pb::ListChildrenRequest>,
    ) -> Result<tonic::Response<pb::RunTree>, tonic::Status> {
        Err(tonic::Status::unimplemented("baseline"))
    }

    type WatchChildStream =
        tokio_stream::wrappers::ReceiverStream<Result<pb::RunEvent, tonic::Status>>;

    async fn watch_child(
        &self,
        _: tonic::Request<pb::WatchChildRequest>,
    ) -> Result<tonic::Response<Self::WatchChildStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("baseline"))
    }

    async fn stop_child(
        &self,
        _: tonic::Request<pb::StopChildRequest>,
    ) -> Result<tonic::Response<pb::StopChildResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("baseline"))
    }

    async fn call_tool(
        &self,
        request: tonic::Request<pb::CallToolRequest>,
    ) -> Result<tonic::Response<pb::CallToolResponse>, tonic::Status> {
        use nix::fcntl::OFlag;
        use tollgate_supervisor::beneath;
        let Some(pb::call_tool_request::Tool::FsRead(read)) = request.into_inner().tool else {
            return Err(tonic::Status::invalid_argument("fs.read only"));
        };
        let rest = read
            .path
            .strip_prefix(&self.grant)
            .unwrap_or_default()
            .trim_start_matches('/')
            .to_owned();
        tokio::task::block_in_place(|| {
            let fail = |e: nix::Error| tonic::Status::internal(e.to_string());
            let path_fd = beneath::open_beneath(&self.root, &rest, OFlag::O_PATH).map_err(fail)?;
            let stat = nix::sys::stat::fstat(&path_fd).map_err(fail)?;
            let fd = beneath::reopen(&path_fd, OFlag::O_RDONLY).map_err(fail)?;
            let mut data = vec![0u8; read.length as usize];
            let n = nix::sys::uio::pread(&fd, &mut data, 0).map_err(fail)?;
            data.truncate(n);
            Ok(tonic::Response::new(pb::CallToolResponse {
                call_id: uuid::Uuid::now_v7().to_string(),
                result: Some(pb::call_tool_response::Result::FsRead(pb::FsReadResponse {
                    data,
                    size: stat.st_size as u64,
                    eof: true,
                })),
            }))
        })
    }
}

/// What the read half measured.
struct Reads {
    audited: Vec<Duration>,
    unaudited: Vec<Duration>,
    direct: Vec<Duration>,
    audited_rate: f64,
    unaudited_rate: f64,
}

/// Timed 4 KiB reads through the gateway (durable audit log on disk, as the supervisor runs
/// it) and through the unaudited baseline, interleaved so machine noise hits both alike, then
/// the call rate of each with 4 concurrent clients, and direct reads of the same file.
fn reads(calls: usize) -> anyhow::Result<Reads> {
    let dir = tempfile::tempdir()?;
    let grant = dir.path().join("grant");
    std::fs::create_dir_all(&grant)?;
    let file = grant.join("page.bin");
    std::fs::write(&file, vec![7u8; 4096])?;
    let key = ed25519_dalek::SigningKey::from_bytes(&[3; 32]);
    let mut config = AuditConfig::new(dir.path().join("audit"), "supervisor", key, "bench");
    let redactor = tollgate_router::SecretRedactor::with_defaults()?;
    config.redactor = Some(Arc::new(move |text: &str| redactor.redact(text)));
    let audit = AuditLog::open(config)?;
    let run = Arc::new(RunGateway::new(RunGatewayConfig {
        run_id: "01900000-0000-7000-8000-00000000beef".into(),
        host_id: 0,
        receipt: pb::Receipt::default(),
        expires_at: tollgate_receipt::unix_now() + 3600,
        grants: vec![FsGrant::open(&grant.display().to_string(), false, false)],
        max_calls: u64::MAX,
        closing: Arc::new(AtomicBool::new(false)),
        is_revoked: Arc::new(|_: &str| false),
        audit: audit.clone(),
        snapshots: tollgate_supervisor::snapshot::SnapshotStore::new(dir.path()),
        exec: None,
        models: None,
        children: Default::default(),
        egress: Default::default(),
        approvals: Default::default(),
        output_limit: Arc::default(),
    }));
    // Each server on its own one-worker runtime, as in the supervisor.
    let server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let mut handle = gateway::serve(server.handle(), dir.path(), run)?;
    let baseline_dir = dir.path().join("baseline");
    std::fs::create_dir_all(&baseline_dir)?;
    let baseline_socket = baseline_dir.join("gateway.sock");
    let baseline_server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let listener = {
        let _entered = baseline_server.enter();
        tokio::net::UnixListener::bind(&baseline_socket)?
    };
    let baseline = UnauditedReads {
        grant: grant.display().to_string(),
        root: Arc::new(tollgate_supervisor::beneath::GrantRoot::open(
            &grant.display().to_string(),
        )?),
    };
    baseline_server.spawn(
        tonic::transport::Server::builder()
            .add_service(pb::gateway_server::GatewayServer::new(baseline))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let targets = [
        format!("unix:{}", handle.socket.display()),
        format!("unix:{}", baseline_socket.display()),
    ];
    let path = file.display().to_string();
    // One client thread, as an agent's tool process has.
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (audited, unaudited, audited_rate, unaudited_rate) = client.block_on(async {
        let mut clients = Vec::new();
        for target in &targets {
            let channel = tonic::transport::Endpoint::from_shared(target.clone())?
                .connect()
                .await?;
            clients.push(pb::gateway_client::GatewayClient::new(channel));
        }
        let request = || pb::CallToolRequest {
            tool: Some(pb::call_tool_request::Tool::FsRead(pb::FsReadRequest {
                path: path.clone(),
                offset: 0,
                length: 4096,
            })),
        };
        // Blocks of calls to each server in turn: each stays warm within a block, and
        // machine noise falls on both.
        const BLOCK: usize = 250;
        let mut samples = [Vec::with_capacity(calls), Vec::with_capacity(calls)];
        let mut done = 0;
        while done < calls + BLOCK {
            for (client, samples) in clients.iter_mut().zip(samples.iter_mut()) {
                for _ in 0..BLOCK {
                    let start = Instant::now();
                    let response = client.call_tool(request()).await?.into_inner();
                    let elapsed = start.elapsed();
                    match response.result {
                        Some(pb::call_tool_response::Result::FsRead(read))
                            if read.data.len() == 4096 => {}
                        other => anyhow::bail!("unexpected response {other:?}"),
                    }
                    // The first block warms up.
                    if done >= BLOCK {
                        samples.push(elapsed);
                    }
                }
            }
            done += BLOCK;
        }
        // Throughput: 4 clients at once, each on its own connection.
        let mut rates = [0.0f64; 2];
        for (target, rate) in targets.iter().zip(rates.iter_mut()) {
            let start = Instant::now();
            let mut tasks = Vec::new();
            for _ in 0..4 {
                let channel = tonic::transport::Endpoint::from_shared(target.clone())?
                    .connect()
                    .await?;
                let mut client = pb::gateway_client::GatewayClient::new(channel);
                let request = request();
                tasks.push(tokio::spawn(async move {
                    for _ in 0..calls / 4 {
                        client.call_tool(request.clone()).await?;
                    }
                    Ok::<_, tonic::Status>(())
                }));
            }
            for task in tasks {
                task.await??;
            }
            *rate = (calls / 4 * 4) as f64 / start.elapsed().as_secs_f64();
        }
        let [audited, unaudited] = samples;
        anyhow::Ok((audited, unaudited, rates[0], rates[1]))
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
    Ok(Reads {
        audited,
        unaudited,
        direct,
        audited_rate,
        unaudited_rate,
    })
}

/// Round trips of `exec /bin/true` through a real sandbox's gateway, and direct spawns.
fn execs(calls: usize) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let tollgate = crate::sandbox::Tollgate::new(1, 2_900_200)?;
    let mut receipt = tollgate.unsigned_receipt("exec /usr/bin/sleep 600");
    receipt.exec.push("/bin/true".into());
    if let Some(limits) = receipt.limits.as_mut() {
        limits.tool_calls = calls as u64 * 2;
    }
    let signed = tollgate.signer.sign(&mut receipt);
    let sink: tollgate_supervisor::runs::OutputSink = Arc::new(|_: &str, _, _: &[u8]| {});
    let run_id = tollgate.manager.start(&signed, None, sink)?;
    let socket = tollgate
        .data_dir()
        .join("runs")
        .join(&run_id)
        .join("gateway.sock");
    // A client with the run's host id (the only peer the gateway serves).
    let client = std::process::Command::new(std::env::current_exe()?)
        .args(["exec-client", "--calls", &calls.to_string(), "--socket"])
        .arg(&socket)
        .output()?;
    tollgate.manager.stop(&run_id, "bench done");
    tollgate.manager.wait(&run_id, Duration::from_secs(10));
    anyhow::ensure!(
        client.status.success(),
        "exec client: {}",
        String::from_utf8_lossy(&client.stderr)
    );
    let through_gateway: Vec<Duration> = String::from_utf8(client.stdout)?
        .lines()
        .map(|line| line.parse().map(Duration::from_nanos))
        .collect::<Result<_, _>>()?;
    let mut direct = Vec::with_capacity(calls);
    for round in 0..calls + calls / 10 {
        let start = Instant::now();
        let status = std::process::Command::new("/bin/true").status()?;
        let elapsed = start.elapsed();
        anyhow::ensure!(status.success());
        if round >= calls / 10 {
            direct.push(elapsed);
        }
    }
    Ok((through_gateway, direct))
}

/// `tollgate-bench exec-client`: becomes the owner of the run's gateway socket (its host id),
/// times `calls` exec calls of /bin/true and prints each round trip in nanoseconds.
pub(crate) fn exec_client(socket: &std::path::Path, calls: usize) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let owner = std::fs::metadata(socket)?.uid();
    // Connected by a relative path from its directory: the parents of a temporary data
    // directory are closed to the run's id.
    std::env::set_current_dir(socket.parent().context("socket directory")?)?;
    let id = nix::unistd::Uid::from_raw(owner);
    let gid = nix::unistd::Gid::from_raw(owner);
    nix::unistd::setgroups(&[])?;
    nix::unistd::setresgid(gid, gid, gid)?;
    nix::unistd::setresuid(id, id, id)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_static("unix:gateway.sock")
            .connect()
            .await?;
        let mut gateway = pb::gateway_client::GatewayClient::new(channel);
        for round in 0..calls + calls / 10 {
            let request = pb::CallToolRequest {
                tool: Some(pb::call_tool_request::Tool::Exec(pb::ExecRequest {
                    argv: vec!["/bin/true".into()],
                    ..Default::default()
                })),
            };
            let start = Instant::now();
            let response = gateway.call_tool(request).await?.into_inner();
            let elapsed = start.elapsed();
            match response.result {
                Some(pb::call_tool_response::Result::Exec(ran)) if ran.exit_code == Some(0) => {}
                other => anyhow::bail!("unexpected response {other:?}"),
            }
            if round >= calls / 10 {
                println!("{}", elapsed.as_nanos());
            }
        }
        anyhow::Ok(())
    })
}
