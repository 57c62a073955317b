//! `tollgate-bench`: benchmarks with a peer measured in the same run (see docs/benchmarks.md).
//!
//! * `verify`: full receipt verification (text decode, envelope, strict Ed25519, decode,
//!   window, audience, revocation) beside its peer, a bare `verify_strict` over the same bytes.
//! * `mint`: MintReceipt over gRPC against the real daemon, beside its peers: durable SQLite
//!   commits of the same row on the same disk (the floor minting cannot beat) and GetKeySet
//!   over the same gRPC stack (the service without a durable write).
//!
//! * `sandbox`: sandbox start and teardown beside `bwrap --unshare-all` (root).
//! * `scale`: start rate and latency against the number of live runs, with the supervisor's
//!   threads, RSS and host memory per run, beside the same sleepers under bwrap (root).
//! * `audit`: durable audit appends per second beside a plain write + fdatasync per line.
//! * `classify`: the router's classifier on 1 MiB of mixed text beside detect-secrets.
//! * `gateway`: a 4 KiB `fs.read` through the gateway beside a direct read (root).
//! * `egress`: HTTPS through the sandbox's proxy and the gateway beside the same clients
//!   straight from the host: download throughput and added latency per request (root).
//! * `models`: a streamed chat completion with tools from inside a sandbox beside the same
//!   client straight to the same upstream: time to first chunk and per chunk (root).
//! * `fleet`: one authority fanning revocations out to many supervisor streams over mutual
//!   TLS, beside the same fan-out in plaintext.
//!
//! Build with `cargo build --release --workspace --bins` and run from target/release.

#![forbid(unsafe_code)]

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use nix::sys::signal::Signal;
use prost::Message as _;
use tollgate_proto::v1 as pb;
use tollgate_receipt::{
    from_text, signing_message, timestamp_from_unix, to_text, unix_now, KeySet, Receipt,
    ReceiptSigner, ReceiptVerifier, VerifyContext,
};
use tollgate_tests::{authed, AuthorityProcess};

#[derive(Parser)]
#[command(about = "Tollgate benchmarks, each beside a peer measured in the same run")]
struct Flags {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// Verification cost per receipt.
    Verify {
        /// Verifications per sample.
        #[arg(long, default_value_t = 2000)]
        iterations: u32,
        /// Samples (the median is reported).
        #[arg(long, default_value_t = 15)]
        samples: u32,
    },
    /// Sandbox start and teardown beside `bwrap --unshare-all` (root; bwrap on PATH).
    Sandbox {
        /// Runs of each kind.
        #[arg(long, default_value_t = 30)]
        runs: usize,
    },
    /// Start rate and start latency (p50, p99) against the number of live runs, with the
    /// supervisor's threads, RSS and descriptors and the host's memory per run, beside the
    /// same sleeping program under `bwrap --unshare-all` (root; bwrap on PATH).
    Scale {
        /// Live-run counts to time starts at (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "0,1000")]
        at: Vec<usize>,
        /// Starts timed at each count.
        #[arg(long, default_value_t = 100)]
        samples: usize,
        /// Sandboxes the supervisor keeps prepared ahead (its default is 1).
        #[arg(long, default_value_t = 1)]
        warm: usize,
        /// First host id for the runs (one per live run).
        #[arg(long, default_value_t = 405_000)]
        host_id_base: u32,
        /// Leave out the bwrap peer.
        #[arg(long)]
        no_peer: bool,
        /// Run the bwrap peer before Tollgate's side, not after it: whether the order of the
        /// sides, and what the first one leaves the host in, changes either side's numbers.
        #[arg(long, conflicts_with = "no_peer")]
        peer_first: bool,
        /// Once the last count is live, have every live run answer one gateway call, then
        /// time `ps` (ListRuns, live only) and one revocation to its run's end, and check
        /// that nothing is left after the clean stop.
        #[arg(long)]
        gateway_check: bool,
    },
    /// Durable audit appends per second (1, 4 and 16 appenders) beside a plain write +
    /// fdatasync per line on the same disk.
    Audit {
        /// Entries per sample.
        #[arg(long, default_value_t = 2000)]
        count: u64,
        /// Samples (the median is reported).
        #[arg(long, default_value_t = 5)]
        samples: usize,
    },
    /// Classification throughput beside detect-secrets on the same 1 MiB (needs a Python with
    /// `pip install detect-secrets`: TOLLGATE_PYTHON, else target/pyenv).
    Classify {
        /// Input size in bytes.
        #[arg(long, default_value_t = 1 << 20)]
        bytes: usize,
        /// Samples of the classifier (the median is reported).
        #[arg(long, default_value_t = 11)]
        samples: usize,
    },
    /// A 4 KiB fs.read through the gateway beside a direct read of the same file, with the
    /// audit's I/O and without, and exec /bin/true through a real sandbox's gateway beside a
    /// direct spawn (root).
    Gateway {
        /// Reads to time (a tenth as many execs, at least 50).
        #[arg(long, default_value_t = 5000)]
        calls: usize,
    },
    /// Internal to `gateway`: the exec client, run as the sandbox's host id.
    #[command(hide = true)]
    ExecClient {
        /// The run's gateway socket.
        #[arg(long)]
        socket: std::path::PathBuf,
        /// Calls to time.
        #[arg(long)]
        calls: usize,
    },
    /// HTTPS through a sandbox's proxy and the supervisor's gateway beside the same clients
    /// going straight to the same server from the host: an M MiB download's throughput, and
    /// the latency of N small requests over one keep-alive connection and on a new
    /// connection each (root).
    Egress {
        /// Small requests per latency loop.
        #[arg(long, default_value_t = 1000)]
        requests: usize,
        /// Size of the download, in MiB.
        #[arg(long, default_value_t = 10)]
        mebibytes: usize,
        /// Rounds after one of warm-up (the median is reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
    /// A streamed chat completion with tools from inside a sandbox (its model endpoint, the
    /// gateway, the router) beside the same client straight to the same upstream: time to the
    /// first chunk and time per chunk (root).
    Models {
        /// Calls per round (after one warm-up call).
        #[arg(long, default_value_t = 50)]
        calls: usize,
        /// Argument fragments the upstream streams per call.
        #[arg(long, default_value_t = 20)]
        chunks: usize,
        /// Milliseconds between the upstream's events.
        #[arg(long, default_value_t = 2)]
        gap_ms: u64,
        /// Rounds (all calls are pooled for the percentiles).
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// Revocation fan-out: from RevokeReceipt to the last of N supervisor streams having it,
    /// over mutual TLS beside plaintext.
    Fleet {
        /// Simulated supervisors, each its own connection and stream.
        #[arg(long, default_value_t = 1000)]
        streams: usize,
        /// Revocations measured, one at a time.
        #[arg(long, default_value_t = 50)]
        revocations: usize,
    },
    /// Mint throughput over gRPC.
    Mint {
        /// Receipts to mint.
        #[arg(long, default_value_t = 2000)]
        count: usize,
        /// Concurrent clients.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
    },
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn sample_receipt() -> Receipt {
    let now = unix_now();
    Receipt {
        receipt_id: uuid::Uuid::now_v7().to_string(),
        issuer: "bench".into(),
        owner: "admin".into(),
        subject: "summarizer".into(),
        audience: vec!["workstation".into()],
        issued_at: Some(timestamp_from_unix(now)),
        not_before: Some(timestamp_from_unix(now)),
        expires_at: Some(timestamp_from_unix(now + 600)),
        policy_version: "1".into(),
        agent: Some(pb::AgentSpec {
            argv: vec!["/usr/bin/python3".into(), "/work/agent.py".into()],
            ..Default::default()
        }),
        limits: Some(pb::Limits {
            memory_bytes: 512 << 20,
            pids: 64,
            cpu_millicores: 1000,
            output_bytes: 5 << 20,
            tmpfs_bytes: 64 << 20,
            tool_calls: 1000,
            tokens: 200_000,
            files: 1024,
            ..Default::default()
        }),
        fs: vec![pb::FsGrant {
            path: "/home/me/project".into(),
            access: pb::FsAccess::Read as i32,
            mount: "/project".into(),
            exec: false,
            ask: false,
            ask_reads: false,
        }],
        exec: vec!["/usr/bin/python3".into(), "/usr/bin/grep".into()],
        routes: vec![pb::RouteGrant {
            name: "local".into(),
            max_sensitivity: pb::Sensitivity::High as i32,
            ask: false,
        }],
        ..Default::default()
    }
}

fn bench_verify(iterations: u32, samples: u32) {
    let signer = ReceiptSigner::generate();
    let signed = signer.sign(&mut sample_receipt());
    let text = to_text(&signed);
    let mut keys = KeySet::new();
    keys.insert(signer.public_key());
    let verifier = ReceiptVerifier::new(keys);
    let revoked: HashSet<String> = (0..1000)
        .map(|_| uuid::Uuid::now_v7().to_string())
        .collect();
    // The peer gets every advantage: key decompressed and signature parsed once, outside
    // the loop, exactly as the verifier holds its key set.
    let public = signer.public_key();
    let signature = ed25519_dalek::Signature::from_slice(&signed.signature).expect("signature");
    let message = signing_message(&signed.receipt);

    let mut full = Vec::new();
    let mut bare = Vec::new();
    for _ in 0..samples {
        let start = Instant::now();
        for _ in 0..iterations {
            let parsed = from_text(std::hint::black_box(&text)).expect("parse");
            let receipt = verifier
                .verify(
                    &parsed,
                    &VerifyContext {
                        now: unix_now(),
                        audience: Some("workstation"),
                        revocations: &revoked,
                    },
                )
                .expect("valid");
            std::hint::black_box(receipt);
        }
        full.push(start.elapsed().as_secs_f64() * 1e6 / f64::from(iterations));
        let start = Instant::now();
        for _ in 0..iterations {
            assert!(public
                .verify_strict(
                    std::hint::black_box(&message),
                    std::hint::black_box(&signature)
                )
                .is_ok());
        }
        bare.push(start.elapsed().as_secs_f64() * 1e6 / f64::from(iterations));
    }
    let (full, bare) = (median(full), median(bare));
    println!(
        "receipt size: {} bytes (text form {} chars)",
        signed.encode_to_vec().len(),
        text.len()
    );
    println!("full verification (text -> checked receipt): {full:.1} µs/receipt (median of {samples} x {iterations})");
    println!(
        "peer, bare Ed25519 verify_strict (pre-parsed key and signature): {bare:.1} µs/receipt"
    );
    println!(
        "overhead over the bare signature check:      {:.1} µs ({:.2}x)",
        full - bare,
        full / bare
    );
}

async fn bench_mint(count: usize, concurrency: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let authority = AuthorityProcess::start(&dir.path().join("authority"));
    let token = authority.admin_token();
    let request = pb::MintReceiptRequest {
        subject: "bench".into(),
        ttl_seconds: 600,
        audience: vec!["workstation".into()],
        exec: vec!["/usr/bin/python3".into()],
        ..Default::default()
    };
    // Warm up connections.
    let mut clients = Vec::new();
    for _ in 0..concurrency {
        let mut client = authority.client().await;
        client.get_key_set(pb::GetKeySetRequest {}).await?;
        clients.push(client);
    }

    let run = |kind: &'static str| {
        let clients = clients.clone();
        let token = token.clone();
        let request = request.clone();
        async move {
            let start = Instant::now();
            let mut tasks = Vec::new();
            for (i, mut client) in clients.into_iter().enumerate() {
                let token = token.clone();
                let request = request.clone();
                let share = count / concurrency + usize::from(i < count % concurrency);
                tasks.push(tokio::spawn(async move {
                    let mut latencies = Vec::with_capacity(share);
                    for _ in 0..share {
                        let t = Instant::now();
                        if kind == "mint" {
                            client.mint_receipt(authed(&token, request.clone())).await?;
                        } else {
                            client.get_key_set(pb::GetKeySetRequest {}).await?;
                        }
                        latencies.push(t.elapsed());
                    }
                    Ok::<_, tonic::Status>(latencies)
                }));
            }
            let mut latencies = Vec::new();
            for task in tasks {
                latencies.extend(task.await.expect("task")?);
            }
            latencies.sort();
            Ok::<_, anyhow::Error>((start.elapsed(), latencies))
        }
    };
    let (mint_elapsed, mint_lat) = run("mint").await?;
    let (keys_elapsed, keys_lat) = run("keys").await?;
    drop(clients);
    authority.stop(Signal::SIGTERM);

    let row_size = {
        let signer = ReceiptSigner::generate();
        signer.sign(&mut sample_receipt()).encode_to_vec().len()
    };
    let sqlite_rate = sqlite_commit_rate(dir.path(), count.min(1000), row_size)?;

    let rate = |n: usize, d: Duration| n as f64 / d.as_secs_f64();
    println!(
        "{count} calls, {concurrency} concurrent clients, on {}",
        dir.path().display()
    );
    println!(
        "MintReceipt over gRPC:      {:>8.0} receipts/s  p50 {:>7.2} ms  p99 {:>7.2} ms",
        rate(count, mint_elapsed),
        percentile(&mint_lat, 0.5).as_secs_f64() * 1e3,
        percentile(&mint_lat, 0.99).as_secs_f64() * 1e3
    );
    println!(
        "peer, GetKeySet over gRPC:  {:>8.0} calls/s     p50 {:>7.2} ms  p99 {:>7.2} ms",
        rate(count, keys_elapsed),
        percentile(&keys_lat, 0.5).as_secs_f64() * 1e3,
        percentile(&keys_lat, 0.99).as_secs_f64() * 1e3
    );
    println!("peer, durable SQLite commit of a {row_size}-byte row (WAL, synchronous=FULL): {sqlite_rate:>8.0} commits/s");
    Ok(())
}

/// Commits per second for one-row transactions with the authority's durability settings.
fn sqlite_commit_rate(dir: &std::path::Path, rows: usize, row_size: usize) -> anyhow::Result<f64> {
    let conn = rusqlite::Connection::open(dir.join("peer.db"))?;
    conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))?;
    conn.execute_batch(
        "PRAGMA synchronous = FULL;
         CREATE TABLE receipts (receipt_id TEXT PRIMARY KEY, owner TEXT, signed BLOB);",
    )?;
    let blob = vec![0x5au8; row_size];
    let start = Instant::now();
    for _ in 0..rows {
        conn.execute(
            "INSERT INTO receipts VALUES (?1, 'admin', ?2)",
            rusqlite::params![uuid::Uuid::now_v7().to_string(), blob],
        )
        .context("insert")?;
    }
    Ok(rows as f64 / start.elapsed().as_secs_f64())
}

mod audit;
mod classify;
mod egress;
mod fleet;
mod gateway;
mod models;
mod sandbox;
mod scale;
mod stats;

use stats::percentile;

fn main() -> anyhow::Result<()> {
    match Flags::parse().bench {
        Bench::Verify {
            iterations,
            samples,
        } => {
            bench_verify(iterations, samples);
            Ok(())
        }
        Bench::Mint { count, concurrency } => {
            tokio::runtime::Runtime::new()?.block_on(bench_mint(count, concurrency.max(1)))
        }
        Bench::Sandbox { runs } => sandbox::bench(runs.max(3)),
        Bench::Scale {
            at,
            samples,
            warm,
            host_id_base,
            no_peer,
            peer_first,
            gateway_check,
        } => scale::bench(
            at,
            samples.max(2),
            warm,
            host_id_base,
            match (no_peer, peer_first) {
                (true, _) => scale::Peer::None,
                (false, true) => scale::Peer::First,
                (false, false) => scale::Peer::After,
            },
            gateway_check,
        ),
        Bench::Audit { count, samples } => audit::bench(count.max(16), samples.max(1)),
        Bench::Classify { bytes, samples } => classify::bench(bytes.max(1024), samples.max(1)),
        Bench::Gateway { calls } => gateway::bench(calls.max(100)),
        Bench::Fleet {
            streams,
            revocations,
        } => fleet::bench(streams.max(1), revocations.max(1)),
        Bench::ExecClient { socket, calls } => gateway::exec_client(&socket, calls),
        Bench::Egress {
            requests,
            mebibytes,
            runs,
        } => egress::bench(requests.max(1), mebibytes.max(1), runs.max(1)),
        Bench::Models {
            calls,
            chunks,
            gap_ms,
            runs,
        } => models::bench(calls.max(1), chunks.max(2), gap_ms, runs.max(1)),
    }
}
